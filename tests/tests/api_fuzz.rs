//! A randomized API fuzzer: random sequences of constructors and ops with
//! random, often invalid, arguments (huge and zero dims, out-of-range and
//! negative axes, mismatched shapes and dtypes, absurd slices, arguments
//! nested in script values up to 400 deep), run eagerly, compiled, compiled
//! shapeless, and on wgpu. Every outcome must be a value
//! or an `Err` — never a panic or an abort — compiled results must equal the
//! eager ones, a failed call leaves no cache entry, and a valid call still
//! gives the right answer afterwards.
//!
//! The whole run happens in a child process, so an abort fails the test
//! with its output instead of killing the test binary. Case count:
//! `KILN_CASES` (CI default 1000, about 20 s); wgpu runs every fourth valid case.

use kiln::{
    compile, Array, BinaryOp, DType, Error, HostData, Limits, SliceAxis, UnaryOp, Value,
    MAX_TREE_DEPTH,
};
use kiln_tests::conformance::compare;
use kiln_tests::isolate::in_child_process;
use kiln_tests::programs::cases;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRng, TestRunner};
use std::collections::BTreeMap;
use std::sync::Arc;

/// One call of the API; operands index the arrays made so far (modulo
/// their count), the argument being array 0.
#[derive(Clone, Debug)]
enum Step {
    Full(Vec<usize>, f64, DType),
    Arange(f64, f64, f64, DType),
    Normal(Vec<usize>, DType),
    Unary(UnaryOp, usize),
    Binary(BinaryOp, usize, usize),
    BinaryScalar(BinaryOp, usize, f64),
    Reduce(u8, usize, Vec<isize>, bool),
    ArgMax(usize, isize, bool),
    Reshape(usize, Vec<i64>),
    Permute(usize, Vec<usize>),
    BroadcastTo(usize, Vec<usize>),
    Slice(usize, isize, i64, Option<i64>, i64),
    Concat(Vec<usize>, isize),
    Take(usize, usize, isize),
    /// Updates, indices, axis, size; with `true`, the updates are a `take`
    /// of the operand and the size its axis (the transpose's usual use).
    ScatterAdd(usize, usize, usize, usize, bool),
    /// Operand, slices, shape; with `true`, pads a slice of the operand
    /// back into its shape (one slice per axis, cycling the list).
    PadSlice(usize, Vec<(i64, Option<i64>, i64)>, Vec<usize>, bool),
    Matmul(usize, usize),
    Squeeze(usize, Vec<isize>),
    ExpandDims(usize, isize),
    SwapAxes(usize, isize, isize),
    Cast(usize, DType),
    Select(usize, usize, usize),
    Argsort(usize, isize, bool),
    Cumsum(usize, isize),
    /// Operand, k: the values of `top_k`.
    TopK(usize, usize),
    Pad(usize, Vec<(usize, usize)>, f64),
}

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![
        12 => 1usize..5,
        2 => Just(0usize),
        1 => prop::sample::select(vec![1 << 20, 1 << 31, 1 << 40, usize::MAX / 3, usize::MAX]),
    ]
}

fn dims() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(dim(), 0..4)
}

fn axis() -> impl Strategy<Value = isize> {
    prop_oneof![
        10 => -4isize..4,
        1 => prop::sample::select(vec![isize::MIN, isize::MAX, 64, -64]),
    ]
}

fn index() -> impl Strategy<Value = i64> {
    prop_oneof![
        10 => -6i64..7,
        1 => prop::sample::select(vec![i64::MIN, i64::MAX, i64::MIN + 1]),
    ]
}

fn number() -> impl Strategy<Value = f64> {
    prop_oneof![
        6 => -3.0f64..3.0,
        1 => prop::sample::select(vec![
            0.0,
            -0.0,
            1e30,
            -1e30,
            1e-40,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            16842753.0,
            1e300,
        ]),
    ]
}

fn dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(DType::ALL.to_vec())
}

fn operand() -> impl Strategy<Value = usize> {
    0usize..16
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (dims(), number(), dtype()).prop_map(|(d, v, t)| Step::Full(d, v, t)),
        (number(), number(), number(), dtype()).prop_map(|(a, b, c, t)| Step::Arange(a, b, c, t)),
        (dims(), dtype()).prop_map(|(d, t)| Step::Normal(d, t)),
        (prop::sample::select(UnaryOp::ALL.to_vec()), operand())
            .prop_map(|(op, x)| Step::Unary(op, x)),
        (
            prop::sample::select(BinaryOp::ALL.to_vec()),
            operand(),
            operand()
        )
            .prop_map(|(op, a, b)| Step::Binary(op, a, b)),
        (
            prop::sample::select(BinaryOp::ALL.to_vec()),
            operand(),
            number()
        )
            .prop_map(|(op, a, v)| Step::BinaryScalar(op, a, v)),
        (
            0u8..4,
            operand(),
            prop::collection::vec(axis(), 0..3),
            any::<bool>()
        )
            .prop_map(|(k, x, a, keep)| Step::Reduce(k, x, a, keep)),
        (operand(), axis(), any::<bool>()).prop_map(|(x, a, k)| Step::ArgMax(x, a, k)),
        (operand(), prop::collection::vec(index(), 0..4)).prop_map(|(x, d)| Step::Reshape(x, d)),
        (operand(), prop::collection::vec(0usize..5, 0..4)).prop_map(|(x, p)| Step::Permute(x, p)),
        (operand(), dims()).prop_map(|(x, d)| Step::BroadcastTo(x, d)),
        (
            operand(),
            axis(),
            index(),
            prop::option::of(index()),
            index()
        )
            .prop_map(|(x, a, s, e, k)| Step::Slice(x, a, s, e, k)),
        (prop::collection::vec(operand(), 0..4), axis()).prop_map(|(xs, a)| Step::Concat(xs, a)),
        (operand(), operand(), axis()).prop_map(|(x, i, a)| Step::Take(x, i, a)),
        (operand(), operand(), 0usize..4, dim(), any::<bool>())
            .prop_map(|(x, i, a, n, t)| Step::ScatterAdd(x, i, a, n, t)),
        (
            operand(),
            prop::collection::vec((index(), prop::option::of(index()), index()), 0..4),
            dims(),
            any::<bool>()
        )
            .prop_map(|(x, a, d, back)| Step::PadSlice(x, a, d, back)),
        (operand(), operand()).prop_map(|(a, b)| Step::Matmul(a, b)),
        (operand(), prop::collection::vec(axis(), 0..3)).prop_map(|(x, a)| Step::Squeeze(x, a)),
        (operand(), axis()).prop_map(|(x, a)| Step::ExpandDims(x, a)),
        (operand(), axis(), axis()).prop_map(|(x, a, b)| Step::SwapAxes(x, a, b)),
        (operand(), dtype()).prop_map(|(x, t)| Step::Cast(x, t)),
        (operand(), operand(), operand()).prop_map(|(c, a, b)| Step::Select(c, a, b)),
        (operand(), axis(), any::<bool>()).prop_map(|(x, a, d)| Step::Argsort(x, a, d)),
        (operand(), axis()).prop_map(|(x, a)| Step::Cumsum(x, a)),
        (operand(), dim()).prop_map(|(x, k)| Step::TopK(x, k)),
        (
            operand(),
            prop::collection::vec((0usize..3, 0usize..3), 0..4),
            number()
        )
            .prop_map(|(x, w, v)| Step::Pad(x, w, v)),
    ]
}

/// At most the first 64 elements of `x`, in one axis: the argsort kernel
/// compares every pair of a row, so the fuzzer's rows of a million would
/// take hours on lavapipe, and a symbolic axis (shapeless) takes cumsum's
/// one `n × n` mask where a known one sums in blocks, so the same long row
/// would be refused by the trace alone. The same cut in every replay.
fn row(x: Array) -> Array {
    x.flatten().slice_axis(0, 0, Some(64), 1)
}

/// Replays `steps` on `x`; returns the arrays made (not `x` itself) at the
/// positions `keep` marks: those whose ops eager replay accepted. A rejected
/// op carries its error and is tallied, so one bad step does not hide the
/// rest of the program, while an op that only a trace rejects still fails
/// the traced call.
fn replay(steps: &[Step], x: Array, keep: &[bool]) -> Vec<Array> {
    replay_all(steps, x)
        .into_iter()
        .zip(keep)
        .filter_map(|(a, &k)| k.then_some(a))
        .collect()
}

/// Replays `steps` on `x`; returns every array made (not `x` itself).
fn replay_all(steps: &[Step], x: Array) -> Vec<Array> {
    let mut made = vec![x];
    for step in steps {
        let at = |i: usize| made[i % made.len()].clone();
        let array = match step {
            Step::Full(d, v, t) => Array::full(d, *v, *t),
            Step::Arange(a, b, c, t) => Array::arange(*a, *b, *c, *t).unwrap_or_else(|_| at(0)),
            Step::Normal(d, t) => {
                Array::random_normal(kiln::random::Key::new(7), d, *t).unwrap_or_else(|_| at(0))
            }
            Step::Unary(op, x) => match op {
                UnaryOp::Neg => at(*x).neg(),
                UnaryOp::Abs => at(*x).abs(),
                UnaryOp::Exp => at(*x).exp(),
                UnaryOp::Log => at(*x).log(),
                UnaryOp::Sin => at(*x).sin(),
                UnaryOp::Cos => at(*x).cos(),
                UnaryOp::Tanh => at(*x).tanh(),
                UnaryOp::Sqrt => at(*x).sqrt(),
                UnaryOp::Rsqrt => at(*x).rsqrt(),
                UnaryOp::Sigmoid => at(*x).sigmoid(),
                UnaryOp::Relu => at(*x).relu(),
                UnaryOp::Erf => at(*x).erf(),
            },
            Step::Binary(op, a, b) => binary(*op, &at(*a), &at(*b)),
            Step::BinaryScalar(op, a, v) => {
                let a = at(*a);
                binary(*op, &a, &Array::scalar(*v, a.dtype()))
            }
            Step::Reduce(kind, x, axes, keep) => match kind {
                0 => at(*x).sum(axes, *keep),
                1 => at(*x).max(axes, *keep),
                2 => at(*x).min(axes, *keep),
                _ => at(*x).mean(axes, *keep),
            },
            Step::ArgMax(x, axis, keep) => at(*x).argmax(*axis, *keep),
            Step::Reshape(x, d) => at(*x).reshape(d),
            Step::Permute(x, p) => at(*x).permute(p),
            Step::BroadcastTo(x, d) => at(*x).broadcast_to(d.clone()),
            Step::Slice(x, axis, start, stop, step) => {
                let x = at(*x);
                let whole = vec![SliceAxis::full(); x.ndim()];
                if whole.is_empty() {
                    x.slice(&[SliceAxis {
                        start: *start,
                        stop: *stop,
                        step: *step,
                    }])
                } else {
                    x.slice_axis(*axis, *start, *stop, *step)
                }
            }
            Step::Concat(xs, axis) => {
                let xs: Vec<Array> = xs.iter().map(|&i| at(i)).collect();
                kiln::concat(&xs, *axis)
            }
            Step::Take(x, i, axis) => at(*x).take(&at(*i), *axis),
            Step::ScatterAdd(x, i, axis, size, via_take) => {
                let (x, i) = (at(*x), at(*i));
                match x.shape().0.get(*axis) {
                    Some(n) if *via_take => {
                        x.take(&i, *axis as isize).scatter_add(&i, *axis, n.clone())
                    }
                    _ => x.scatter_add(&i, *axis, *size),
                }
            }
            Step::PadSlice(x, slices, shape, back) => {
                let x = at(*x);
                let axes: Vec<SliceAxis> = slices
                    .iter()
                    .map(|&(start, stop, step)| SliceAxis { start, stop, step })
                    .collect();
                if *back && !axes.is_empty() {
                    let axes: Vec<SliceAxis> =
                        axes.iter().cycle().take(x.ndim()).cloned().collect();
                    x.slice(&axes).pad_slice(&axes, x.shape())
                } else {
                    x.pad_slice(&axes, shape.clone())
                }
            }
            Step::Matmul(a, b) => at(*a).matmul(&at(*b)),
            Step::Squeeze(x, axes) => at(*x).squeeze(axes),
            Step::ExpandDims(x, axis) => at(*x).expand_dims(*axis),
            Step::SwapAxes(x, a, b) => at(*x).swap_axes(*a, *b),
            Step::Cast(x, t) => at(*x).cast(*t),
            Step::Select(c, a, b) => at(*c).select(at(*a), at(*b)),
            Step::Argsort(x, axis, descending) => row(at(*x)).argsort(*axis, *descending),
            Step::Cumsum(x, axis) => row(at(*x)).cumsum(*axis),
            Step::TopK(x, k) => row(at(*x)).top_k(*k).0,
            Step::Pad(x, widths, value) => at(*x).pad(widths, *value),
        };
        made.push(array);
    }
    made.split_off(1)
}

fn binary(op: BinaryOp, a: &Array, b: &Array) -> Array {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Pow => a.pow(b),
        BinaryOp::Maximum => a.maximum(b),
        BinaryOp::Minimum => a.minimum(b),
        BinaryOp::Eq => a.equal(b),
        BinaryOp::Ne => a.not_equal(b),
        BinaryOp::Lt => a.less(b),
        BinaryOp::Le => a.less_equal(b),
        BinaryOp::Gt => a.greater(b),
        BinaryOp::Ge => a.greater_equal(b),
    }
}

/// The values of `arrays`, or the first error.
fn values(arrays: &[Array]) -> kiln::Result<Vec<Arc<HostData>>> {
    kiln::eval(arrays)?;
    arrays.iter().map(Array::data).collect()
}

/// Compares `got` with the eager `want`, output by output.
fn same_values(
    what: &str,
    got: &[Arc<HostData>],
    want: &[Arc<HostData>],
) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len(), "{}: output count", what);
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        if let Err(e) = compare(g, w) {
            return Err(TestCaseError::fail(format!("{what}: output {k}: {e}")));
        }
    }
    Ok(())
}

/// What the run saw, printed at the end.
#[derive(Default, Debug)]
struct Tally {
    cases: usize,
    /// Cases whose accepted arrays all evaluated.
    eager_ok: usize,
    wgpu_runs: usize,
    /// Errors by kind: of rejected ops and of failed evaluations.
    errors: BTreeMap<String, usize>,
}

fn error_kind(e: &Error) -> String {
    let text = format!("{e:?}");
    text.split([' ', '{', '(']).next().unwrap_or("").to_string()
}

/// Above this many elements an output is not sent to wgpu (lavapipe is slow).
const WGPU_MAX_ELEMENTS: usize = 4096;

/// `x` nested `depth` levels deep in lists, maps and tuples, in turn.
fn nest(x: &Array, depth: usize) -> Value {
    (0..depth).fold(Value::Array(x.clone()), |inner, level| match level % 3 {
        0 => Value::List(vec![inner]),
        1 => Value::Map(BTreeMap::from([("k".to_string(), inner)])),
        _ => Value::Tuple(vec![Value::None, inner]),
    })
}

/// The array [`nest`] put at the bottom of `value` (NaN if there is none).
fn unnest(mut value: &Value) -> Array {
    loop {
        let inner = match value {
            Value::Array(a) => return a.clone(),
            Value::List(items) | Value::Tuple(items) => items.last(),
            Value::Map(map) => map.get("k"),
            _ => None,
        };
        match inner {
            Some(inner) => value = inner,
            None => return Array::scalar(f64::NAN, DType::F32),
        }
    }
}

fn fuzz_case(
    steps: Vec<Step>,
    x: Array,
    depth: usize,
    tally: &mut Tally,
    gpu: Option<&kiln_wgpu::WgpuBackend>,
) -> Result<(), TestCaseError> {
    tally.cases += 1;
    let steps: Arc<[Step]> = steps.into();
    let made = replay_all(&steps, x.clone());
    for e in made.iter().filter_map(Array::error) {
        *tally.errors.entry(error_kind(e)).or_default() += 1;
    }
    let keep: Arc<[bool]> = made.iter().map(|a| a.error().is_none()).collect();
    let accepted: Vec<Array> = made.into_iter().filter(|a| a.error().is_none()).collect();
    let eager = values(&accepted);
    let program = |steps: &Arc<[Step]>, keep: &Arc<[bool]>| {
        let (steps, keep) = (steps.clone(), keep.clone());
        move |x: Array| replay(&steps, x, &keep)
    };
    let compiled = compile(program(&steps, &keep));
    let result = compiled.call(&x).and_then(|out| values(&out));
    match (&eager, &result) {
        (Ok(want), Ok(got)) => {
            tally.eager_ok += 1;
            same_values("compiled", got, want)?;
            prop_assert_eq!(compiled.cache().entries, 1);
        }
        (Err(e), Err(compiled_error)) => {
            *tally.errors.entry(error_kind(e)).or_default() += 1;
            // A data-dependent runtime error (an index out of range) comes
            // from a sound executable, which stays cached; any other
            // failure must leave the cache empty.
            let runtime = matches!(compiled_error, Error::Runtime { .. });
            prop_assert!(
                compiled.cache().entries <= usize::from(runtime),
                "a failed call ({}) cached an entry",
                compiled_error
            );
        }
        (eager, compiled) => {
            return Err(TestCaseError::fail(format!(
                "eager and compiled disagree: eager {:?}, compiled {:?}",
                eager.as_ref().err(),
                compiled.as_ref().err()
            )))
        }
    }
    let shapeless = compile(program(&steps, &keep)).shapeless();
    if let (Ok(want), Ok(out)) = (&eager, shapeless.call(&x)) {
        same_values(
            "shapeless",
            &values(&out).map_err(|e| TestCaseError::fail(e.to_string()))?,
            want,
        )?;
    }
    let small = eager
        .as_ref()
        .is_ok_and(|want| want.iter().all(|d| d.len() <= WGPU_MAX_ELEMENTS));
    if let (Some(gpu), true, Ok(want)) = (gpu, small && tally.cases.is_multiple_of(4), &eager) {
        tally.wgpu_runs += 1;
        let on_gpu = compile(program(&steps, &keep)).with_backend(gpu.clone());
        let got = on_gpu
            .call(&x)
            .and_then(|out| values(&out))
            .map_err(|e| TestCaseError::fail(format!("wgpu: {e}")))?;
        same_values("wgpu", &flush_subnormals(&got), &flush_subnormals(want))?;
    }
    // The same program over the argument nested `depth` deep: the values
    // within the depth limit, an error naming the path beyond it.
    let nested = nest(&x, depth);
    let (steps_in, keep_in) = (steps.clone(), keep.clone());
    let deep = compile(move |v: Value| replay(&steps_in, unnest(&v), &keep_in));
    match (deep.call(&nested), &eager) {
        (Ok(out), Ok(want)) if depth <= MAX_TREE_DEPTH => {
            let got = values(&out).map_err(|e| TestCaseError::fail(e.to_string()))?;
            same_values("nested", &got, want)?;
        }
        (Err(Error::Tree { path, detail }), _) if depth > MAX_TREE_DEPTH => {
            *tally.errors.entry("Tree".to_string()).or_default() += 1;
            prop_assert!(detail.contains("nesting deeper"), "{}", detail);
            prop_assert!(
                path.starts_with("[1][\"k\"][0]")
                    || path.starts_with("[\"k\"][0][1]")
                    || path.starts_with("[0][1][\"k\"]"),
                "{}",
                path
            );
            prop_assert_eq!(deep.cache().entries, 0);
        }
        (Err(_), Err(_)) => {}
        (got, _) => {
            return Err(TestCaseError::fail(format!(
                "nested {depth} deep: {:?}",
                got.map(|_| "a value")
            )))
        }
    }
    // The failure left nothing behind: a valid call is still right.
    let probe = compile(|x: Array| x.exp().sum_all());
    let e3 = probe
        .call(&Array::ones(&[3], DType::F32))
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert!((e3.item::<f32>().unwrap_or(0.0) - 3.0 * 1f32.exp()).abs() < 1e-4);
    Ok(())
}

/// Values with subnormal f32 magnitudes set to zero: WGSL lets a device
/// flush them, and lavapipe does.
fn flush_subnormals(data: &[Arc<HostData>]) -> Vec<Arc<HostData>> {
    data.iter()
        .map(|d| {
            if !d.dtype().is_float() {
                return d.clone();
            }
            let flushed = d.to_f64_vec().into_iter().map(|v| {
                if v != 0.0 && v.abs() < f32::MIN_POSITIVE as f64 {
                    0.0
                } else {
                    v
                }
            });
            Arc::new(HostData::from_f64s(d.dtype(), flushed))
        })
        .collect()
}

#[test]
fn random_api_sequences_give_values_or_errors_never_panics() {
    in_child_process(
        "random_api_sequences_give_values_or_errors_never_panics",
        || {
            // Tight limits keep the valid huge cases from taking the
            // machine's memory; the call limit stays above anything the
            // array limit lets a program build, so eager (whose data are
            // inputs) and compiled (where they are folded constants) agree.
            Limits::set(Limits {
                max_array_bytes: 64 << 20,
                max_call_bytes: 2 << 30,
            });
            let gpu = kiln_tests::gpu::backend();
            let tally = std::cell::RefCell::new(Tally::default());
            // A fixed seed: CI must be reproducible; `KILN_CASES` explores further.
            let config = Config {
                cases: cases(1000),
                failure_persistence: None,
                ..Config::default()
            };
            let rng = TestRng::deterministic_rng(config.rng_algorithm);
            let mut runner = TestRunner::new_with_rng(config, rng);
            let argument = (prop::collection::vec(1usize..4, 0..3), dtype()).prop_map(|(d, t)| {
                let n = d.iter().product::<usize>();
                Array::arange(0.0, n as f64, 1.0, DType::F32)
                    .map(|a| {
                        a.reshape(&d.iter().map(|&k| k as i64).collect::<Vec<_>>())
                            .cast(t)
                    })
                    .unwrap_or_else(|_| Array::zeros(&d, t))
            });
            let depth = prop_oneof![6 => 0usize..6, 1 => 300usize..400];
            let result = runner.run(
                &(prop::collection::vec(step(), 1..12), argument, depth),
                |(steps, x, depth)| {
                    fuzz_case(steps, x, depth, &mut tally.borrow_mut(), gpu.as_ref())
                },
            );
            println!("fuzz: {:?}", tally.borrow());
            if let Err(e) = result {
                panic!("{e}");
            }
        },
    );
}
