//! Shapeless compile: symbolic dims flow through every op family; new sizes
//! of a symbolic dim reuse the one trace and match eager results.

use kiln::{compile, concat, nn, Array, DType, MissReason, SliceAxis};

/// Uses every op family on `x: [n, 4]` and `idx: [m]`.
fn every_family((x, idx): (Array, Array)) -> Vec<Array> {
    let w = Array::from_vec((0..12).map(|i| i as f32 * 0.1 - 0.5).collect(), &[4, 3])
        .expect("12 weights");
    let bias = Array::from_vec(vec![0.5f32, -1.0, 2.0, 0.0], &[4]).expect("4 biases");
    let unary = x
        .tanh()
        .exp()
        .log()
        .sin()
        .cos()
        .abs()
        .neg()
        .relu()
        .sigmoid()
        .erf()
        + (x.abs() + 1.0).sqrt()
        + (x.abs() + 1.0).rsqrt();
    let binary = (&x + &bias) * (&x - 1.0) / (x.abs() + 1.0) + x.abs().pow(1.5) + x.maximum(&bias)
        - x.minimum(0.25);
    let cond = x.greater(&bias);
    let selected = cond.select(&x, bias.broadcast_to(x.shape().clone()));
    let compared = x.less_equal(0.0).cast(DType::F32)
        + x.equal(&x).cast(DType::F32)
        + x.not_equal(1.0).cast(DType::F32)
        + x.less(1.0).cast(DType::F32)
        + x.greater_equal(0.0).cast(DType::F32);
    let reduced =
        x.sum(&[0], false) + x.max(&[0], false) + x.min(&[0], false) + x.mean(&[0], false);
    let arg = x.argmax(0, false).cast(DType::F32);
    let product = x.matmul(&w);
    let flat = x.reshape(&[-1]).reshape(&[-1, 4]);
    let moved = x.transpose().transpose() + x.expand_dims(0).squeeze(&[0]);
    let sliced = x.slice(&[
        SliceAxis {
            start: 1,
            stop: None,
            step: 1,
        },
        SliceAxis::full(),
    ]);
    let joined = concat(&[x.clone(), sliced.clone()], 0);
    let taken = x.take(&idx, 0);
    let normed = nn::layer_norm(&x, None, Some(&bias), 1e-5)
        + nn::softmax(&x, -1)
        + nn::log_softmax(&x, 0)
        + nn::gelu(&x);
    vec![
        unary,
        binary,
        selected,
        compared,
        reduced,
        arg,
        product,
        flat + moved,
        sliced,
        joined,
        taken,
        normed,
    ]
}

fn inputs(n: usize, m: usize) -> (Array, Array) {
    let x = Array::from_vec(
        (0..n * 4)
            .map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.3)
            .collect(),
        &[n, 4],
    )
    .expect("x");
    let idx = Array::from_vec((0..m).map(|i| ((i * 3) % n) as i32).collect(), &[m]).expect("idx");
    (x, idx)
}

#[test]
fn every_op_family_traces_once_for_three_sizes_and_matches_eager() {
    let f = compile(every_family).shapeless();
    for (n, m) in [(3, 2), (5, 7), (9, 4)] {
        let args = inputs(n, m);
        let compiled = f.call(&args).unwrap();
        let eager = every_family(args.clone());
        assert_eq!(compiled.len(), eager.len());
        for (i, (c, e)) in compiled.iter().zip(&eager).enumerate() {
            assert_eq!(c.aval(), e.aval(), "output {i} at n={n}");
            let (c, e) = (c.to_vec::<f32>().unwrap(), e.to_vec::<f32>().unwrap());
            for (a, b) in c.iter().zip(&e) {
                assert!(
                    a == b
                        || (a - b).abs() <= 1e-5 * b.abs().max(1.0)
                        || (a.is_nan() && b.is_nan()),
                    "output {i} at n={n}: {c:?} vs {e:?}"
                );
            }
        }
    }
    let cache = f.cache();
    assert_eq!((cache.entries, cache.misses, cache.hits), (1, 1, 2));
    let report = &cache.reports[0];
    assert!(report.shapeless);
    assert!(
        report.symbols.iter().any(|s| s == "s0 = args[0].shape[0]"),
        "{:?}",
        report.symbols
    );
}

#[test]
fn shapeless_key_ignores_sizes_but_not_rank() {
    let f = compile(|x: Array| x.sum_all()).shapeless();
    f.call(&Array::ones(&[3, 2], DType::F32)).unwrap();
    assert_eq!(
        f.call(&Array::ones(&[6, 5], DType::F32))
            .unwrap()
            .item::<f32>()
            .unwrap(),
        30.0
    );
    f.call(&Array::ones(&[6], DType::F32)).unwrap();
    let cache = f.cache();
    assert_eq!((cache.entries, cache.hits), (2, 1));
    assert!(
        matches!(&cache.miss_log[1].reasons[0], MissReason::Aval { before, now, .. } if before == "f32 rank 2" && now == "f32 rank 1")
    );
}

#[test]
fn broken_size_one_assumption_retraces_with_explanation() {
    let f = compile(|(x, y): (Array, Array)| &x + &y).shapeless();
    let a = f
        .call(&(
            Array::ones(&[1, 3], DType::F32),
            Array::ones(&[4, 3], DType::F32),
        ))
        .unwrap();
    assert_eq!(a.dims(), Some(vec![4, 3]));
    let b = f
        .call(&(
            Array::ones(&[2, 3], DType::F32),
            Array::ones(&[2, 3], DType::F32),
        ))
        .unwrap();
    assert_eq!(b.to_vec::<f32>().unwrap(), vec![2.0; 6]);
    let cache = f.cache();
    assert_eq!(cache.entries, 2);
    assert!(
        matches!(&cache.miss_log[1].reasons[0], MissReason::ShapeGuard { .. }),
        "{:?}",
        cache.miss_log
    );
}

#[test]
fn symbolic_equality_guard_is_checked_per_call() {
    // Tracing assumed the two symbolic dims equal; a call breaking that
    // retraces, and the retrace reports the real shape error.
    let f = compile(|(x, y): (Array, Array)| &x * &y).shapeless();
    f.call(&(Array::ones(&[3], DType::F32), Array::ones(&[3], DType::F32)))
        .unwrap();
    let err = f
        .call(&(Array::ones(&[3], DType::F32), Array::ones(&[4], DType::F32)))
        .unwrap_err();
    assert!(err.to_string().contains("mul"), "{err}");
    assert_eq!(f.cache().entries, 1);
    assert_eq!(
        f.call(&(Array::ones(&[5], DType::F32), Array::ones(&[5], DType::F32)))
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![1.0; 5]
    );
    assert_eq!(f.cache().entries, 1);
}

/// The mean over axis 1 of `x`, NaN where the axis is empty.
fn mean_of_rows(x: Array) -> Array {
    x.mean(&[1], false)
}

/// Calls `call` on f16 ones of [2, 3] and then of [2, 0].
fn check_row_means(call: impl Fn(&Array) -> kiln::Result<Array>) {
    let ones = call(&Array::ones(&[2, 3], DType::F16)).unwrap();
    assert_eq!(ones.data().unwrap().to_f64_vec(), [1.0, 1.0]);
    let empty = call(&Array::ones(&[2, 0], DType::F16)).unwrap();
    assert_eq!(empty.dtype(), DType::F16);
    let means = empty.data().unwrap().to_f64_vec();
    assert!(
        means.len() == 2 && means.iter().all(|m| m.is_nan()),
        "{means:?}"
    );
}

#[test]
fn mean_over_an_axis_empty_only_at_run_time_is_nan_on_every_backend() {
    // Traced for a nonempty axis, so the count is read per call, not folded.
    let cpu = compile(mean_of_rows).shapeless();
    check_row_means(|x| cpu.call(x));
    if let Some(gpu) = kiln_tests::gpu::backend() {
        let gpu = compile(mean_of_rows).shapeless().with_backend(gpu);
        check_row_means(|x| gpu.call(x));
    }
}

#[test]
fn reshaping_with_minus_one_beside_a_zero_size_is_refused_shapeless_as_eagerly() {
    let empty = Array::ones(&[0, 4], DType::F32);
    let reshape = |x: Array| x.reshape(&[0, -1]);
    let eager = reshape(empty.clone()).check().unwrap_err().to_string();
    assert!(eager.contains("cannot infer -1"), "{eager}");
    for f in [compile(reshape), compile(reshape).shapeless()] {
        let err = f.call(&empty).unwrap_err().to_string();
        assert!(err.contains("cannot infer -1"), "{err}");
        assert_eq!(f.cache().entries, 0);
    }
    // Sizes that hold elements still infer, under shapeless compile too.
    let f = compile(|x: Array| x.reshape(&[2, -1])).shapeless();
    assert_eq!(
        f.call(&Array::ones(&[3, 4], DType::F32))
            .unwrap()
            .dims()
            .unwrap(),
        vec![2, 6]
    );
}

/// The `jax.numpy` compositions on `x: [n, 4]`, both dims symbolic (`prod`
/// and `split` into equal parts need known sizes: they have tests of their
/// own).
fn array_api((x, idx): (Array, Array)) -> Vec<Array> {
    let (top, top_indices) = x.top_k(2);
    let parts = x.split_at(&[1], 1).expect("a valid axis");
    vec![
        x.round() + x.floor() + x.sign() + x.tan() + x.abs().log1p() + x.square(),
        x.clip(Some(-0.5), Some(0.5)) + x.ones_like(),
        x.var(&[0], 1, false) + x.std(&[0], 0, false) + x.logsumexp(&[0], false),
        x.argmin(1, false).cast(DType::F32),
        x.cumsum(0).sum(&[1], false),
        x.sort(0).sum(&[1], false) + x.argsort(0, true).cast(DType::F32).sum(&[1], false),
        top.sum(&[1], false) + top_indices.cast(DType::F32).sum(&[1], false),
        kiln::stack(&[parts[0].clone(), x.slice_axis(1, 0, Some(1), 1)], 0).sum(&[0, 2], false)
            + parts[1].sum(&[1], false),
        x.tile(&[1, 2])
            .repeat(2, 1)
            .pad(&[(1, 1), (0, 2)], 1.0)
            .sum(&[1], false),
        x.flatten().reshape(&[-1, 4]).sum(&[1], false),
        kiln::einsum("ni,nj->ij", &[&x, &x]).sum(&[0], false),
        x.take(&idx, 0).sum(&[1], false),
    ]
}

#[test]
fn array_api_compositions_trace_once_for_three_sizes_and_match_eager() {
    let f = compile(array_api).shapeless();
    for (n, m) in [(3, 2), (5, 7), (9, 4)] {
        let args = inputs(n, m);
        let compiled = f.call(&args).unwrap();
        let eager = array_api(args.clone());
        for (i, (c, e)) in compiled.iter().zip(&eager).enumerate() {
            assert_eq!(c.aval(), e.aval(), "output {i} at n={n}");
            let (c, e) = (c.to_vec::<f32>().unwrap(), e.to_vec::<f32>().unwrap());
            for (a, b) in c.iter().zip(&e) {
                assert!(
                    (a - b).abs() <= 1e-5 * b.abs().max(1.0) || (a.is_nan() && b.is_nan()),
                    "output {i} at n={n}: {c:?} vs {e:?}"
                );
            }
        }
    }
    let cache = f.cache();
    assert_eq!((cache.entries, cache.misses, cache.hits), (1, 1, 2));
}

#[test]
fn prod_over_a_symbolic_axis_is_an_error_naming_it() {
    let f = compile(|x: Array| x.prod(&[0], false)).shapeless();
    let err = f.call(&inputs(3, 1).0).unwrap_err();
    assert!(
        err.to_string().contains("prod") && err.to_string().contains("symbolic"),
        "{err}"
    );
}
