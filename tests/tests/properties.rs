//! Property tests over random op DAGs: compiled == eager, shapeless ==
//! static, and fused == op by op, for f32 and f16. Case count: `KILN_CASES` (CI default 500).

use kiln::{compile, nn, Array, DType, Dim};
use proptest::prelude::*;

/// One instruction of a random program; operands index the value pool
/// (taken modulo its current size).
#[derive(Clone, Debug)]
enum Instr {
    Unary(u8, usize),
    Binary(u8, usize, usize),
    Reduce(u8, usize, bool),
    Transpose(usize),
    Matmul(usize, usize),
    Select(usize, usize, usize),
    Softmax(usize),
    LayerNorm(usize),
}

fn instr() -> impl Strategy<Value = Instr> {
    let i = 0usize..64;
    prop_oneof![
        4 => (0u8..9, i.clone()).prop_map(|(o, a)| Instr::Unary(o, a)),
        5 => (0u8..6, i.clone(), i.clone()).prop_map(|(o, a, b)| Instr::Binary(o, a, b)),
        2 => (0u8..3, i.clone(), any::<bool>()).prop_map(|(o, a, ax)| Instr::Reduce(o, a, ax)),
        1 => i.clone().prop_map(Instr::Transpose),
        1 => (i.clone(), i.clone()).prop_map(|(a, b)| Instr::Matmul(a, b)),
        1 => (i.clone(), i.clone(), i.clone()).prop_map(|(c, a, b)| Instr::Select(c, a, b)),
        1 => i.clone().prop_map(Instr::Softmax),
        1 => i.prop_map(Instr::LayerNorm),
    ]
}

/// Runs a program. Every decision depends only on ranks and on which dims
/// are a known 1, so eager, static and shapeless runs build the same graph.
fn run(program: &[Instr], inputs: Vec<Array>) -> Vec<Array> {
    let mut pool = inputs;
    let is_one = |d: &Dim| *d == Dim::Known(1);
    for ins in program {
        let pick = |k: usize| pool[k % pool.len()].clone();
        let value = match ins {
            Instr::Unary(op, a) => {
                let x = pick(*a);
                match op {
                    0 => x.neg(),
                    1 => x.abs(),
                    2 => x.tanh(),
                    3 => x.sigmoid(),
                    4 => x.sin(),
                    5 => x.cos(),
                    6 => x.relu(),
                    7 => (x.abs() + 1.0).log(),
                    _ => x.minimum(3.0).exp(),
                }
            }
            Instr::Binary(op, a, b) => {
                let (x, y) = (pick(*a), pick(*b));
                match op {
                    0 => x + y,
                    1 => x - y,
                    2 => x * y,
                    3 => x / (y.abs() + 1.0),
                    4 => x.maximum(&y),
                    _ => x.minimum(&y),
                }
            }
            Instr::Reduce(op, a, second_axis) => {
                let x = pick(*a);
                if x.ndim() == 0 {
                    x
                } else {
                    let axis = if *second_axis && x.ndim() > 1 { 1 } else { 0 };
                    match op {
                        0 => x.sum(&[axis], true),
                        1 => x.max(&[axis], true),
                        _ => x.mean(&[axis], true),
                    }
                }
            }
            Instr::Transpose(a) => pick(*a).transpose(),
            Instr::Matmul(a, b) => {
                let (x, y) = (pick(*a), pick(*b));
                let square = |v: &Array| {
                    v.ndim() == 2 && !is_one(&v.shape().0[0]) && !is_one(&v.shape().0[1])
                };
                if square(&x) && square(&y) {
                    x.matmul(&y) * 0.25
                } else {
                    x + y
                }
            }
            Instr::Select(c, a, b) => pick(*c).greater(0.0).select(pick(*a), pick(*b)),
            Instr::Softmax(a) => {
                let x = pick(*a);
                if x.ndim() == 0 {
                    x
                } else {
                    nn::softmax(&x, -1)
                }
            }
            Instr::LayerNorm(a) => {
                let x = pick(*a);
                if x.ndim() == 0 {
                    x
                } else {
                    nn::layer_norm(&x, None, None, 1e-3)
                }
            }
        };
        pool.push(value);
    }
    let n = pool.len();
    vec![pool[n - 1].clone(), pool[n / 2].clone()]
}

/// Input shapes: all mutually broadcastable, with `n` the varying size.
fn input_shapes(n: usize) -> Vec<Vec<usize>> {
    vec![vec![n, n], vec![1, n], vec![n, 1], vec![n]]
}

fn make_inputs(n: usize, seed: u64, dtype: DType) -> Vec<Array> {
    input_shapes(n)
        .iter()
        .enumerate()
        .map(|(i, s)| {
            Array::random_normal(
                kiln::random::Key::new(seed).fold_in(i as u64),
                s,
                DType::F32,
            )
            .expect("f32 normal")
            .cast(dtype)
        })
        .collect()
}

fn bits(a: &Array) -> (String, Vec<u64>) {
    let data = a.data().expect("evaluates");
    (
        a.aval().to_string(),
        data.to_f64_vec()
            .into_iter()
            .map(|v| if v.is_nan() { u64::MAX } else { v.to_bits() })
            .collect(),
    )
}

fn cases() -> u32 {
    std::env::var("KILN_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500)
}

fn check(program: Vec<Instr>, seed: u64, dtype: DType) -> Result<(), TestCaseError> {
    let p1 = program.clone();
    let p2 = program.clone();
    let p3 = program.clone();
    let compiled = compile(move |xs: Vec<Array>| run(&p1, xs));
    let shapeless = compile(move |xs: Vec<Array>| run(&p2, xs)).shapeless();
    // Op by op, no fusion: the oracle for fused execution (eager fuses too).
    let unfused = compile(move |xs: Vec<Array>| run(&p3, xs)).fusion(false);
    for n in [3, 5, 37] {
        let inputs = make_inputs(n, seed, dtype);
        let eager: Vec<_> = run(&program, inputs.clone()).iter().map(bits).collect();
        let reference: Vec<_> = unfused
            .call(&inputs)
            .expect("unfused call")
            .iter()
            .map(bits)
            .collect();
        prop_assert_eq!(&reference, &eager, "fused eager != op-by-op at n={}", n);
        let got: Vec<_> = compiled
            .call(&inputs)
            .expect("compiled call")
            .iter()
            .map(bits)
            .collect();
        prop_assert_eq!(&got, &eager, "compiled != eager at n={}", n);
        let got: Vec<_> = shapeless
            .call(&inputs)
            .expect("shapeless call")
            .iter()
            .map(bits)
            .collect();
        prop_assert_eq!(&got, &eager, "shapeless != eager at n={}", n);
    }
    prop_assert_eq!(shapeless.cache().entries, 1, "shapeless retraced");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn compiled_and_shapeless_equal_eager_f32(program in prop::collection::vec(instr(), 1..14), seed in any::<u64>()) {
        check(program, seed, DType::F32)?;
    }

    #[test]
    fn compiled_and_shapeless_equal_eager_f16(program in prop::collection::vec(instr(), 1..14), seed in any::<u64>()) {
        check(program, seed, DType::F16)?;
    }
}
