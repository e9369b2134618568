//! Random array programs for property tests: a small instruction set over a
//! pool of values that stay mutually broadcastable, so any instruction can
//! read any earlier value. Every decision depends only on ranks and on
//! which dims are a known 1, so eager, static and shapeless runs of one
//! program build the same graph.

use kiln::{concat, nn, Array, DType, Dim};
use proptest::prelude::*;

/// One instruction of a random program; operands index the value pool
/// (taken modulo its current size).
#[derive(Clone, Debug)]
pub enum Instr {
    /// A unary op (or a short safe composition).
    Unary(u8, usize),
    /// A binary op, broadcasting.
    Binary(u8, usize, usize),
    /// A binary op with one value as both operands (`x + x`).
    Repeat(u8, usize),
    /// One value read by several consumers.
    Fan(usize),
    /// A reduction keeping dims.
    Reduce(u8, usize, bool),
    /// Swaps the last two axes.
    Transpose(usize),
    /// A matmul of square operands (else an add).
    Matmul(usize, usize),
    /// `where(c > 0, a, b)`.
    Select(usize, usize, usize),
    /// A layout round trip: concat+slice, reshape, take, a row slice, or
    /// a take or strided slice and its transpose (scatter_add, pad_slice).
    Layout(u8, usize),
    /// Softmax over the last axis.
    Softmax(usize),
    /// Layer norm over the last axis.
    LayerNorm(usize),
}

/// A random instruction.
pub fn instr() -> impl Strategy<Value = Instr> {
    let i = 0usize..64;
    prop_oneof![
        4 => (0u8..12, i.clone()).prop_map(|(o, a)| Instr::Unary(o, a)),
        5 => (0u8..6, i.clone(), i.clone()).prop_map(|(o, a, b)| Instr::Binary(o, a, b)),
        1 => (0u8..3, i.clone()).prop_map(|(o, a)| Instr::Repeat(o, a)),
        1 => i.clone().prop_map(Instr::Fan),
        2 => (0u8..3, i.clone(), any::<bool>()).prop_map(|(o, a, ax)| Instr::Reduce(o, a, ax)),
        1 => i.clone().prop_map(Instr::Transpose),
        1 => (i.clone(), i.clone()).prop_map(|(a, b)| Instr::Matmul(a, b)),
        1 => (i.clone(), i.clone(), i.clone()).prop_map(|(c, a, b)| Instr::Select(c, a, b)),
        1 => (0u8..6, i.clone()).prop_map(|(o, a)| Instr::Layout(o, a)),
        1 => i.clone().prop_map(Instr::Softmax),
        1 => i.prop_map(Instr::LayerNorm),
    ]
}

/// Runs a program on `inputs`; returns the last value and the middle one.
pub fn run(program: &[Instr], inputs: Vec<Array>) -> Vec<Array> {
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
                    8 => x.minimum(3.0).exp(),
                    9 => x.erf(),
                    // Runs of scalar ops, which the fused executor folds
                    // into epilogues.
                    10 => x * 0.75 + 0.25,
                    _ => (0.5 + x * -1.5).tanh() - 0.125,
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
            Instr::Repeat(op, a) => {
                let x = pick(*a);
                match op {
                    0 => &x + &x,
                    1 => &x * &x,
                    _ => x.maximum(&x),
                }
            }
            Instr::Fan(a) => {
                let y = pick(*a) * 0.5;
                (&y + 1.0) * (&y - 1.0) + &y
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
            Instr::Layout(kind, a) => {
                let x = pick(*a);
                if x.ndim() == 0 {
                    x.exp()
                } else {
                    match kind {
                        // Stack with a scaled copy, then keep the copy.
                        0 => {
                            let half = &x * 0.5;
                            concat(&[x.expand_dims(0), half.expand_dims(0)], 0)
                                .slice_axis(0, 1, Some(2), 1)
                                .squeeze(&[0])
                        }
                        1 => x.reshape(&[-1]).reshape_to(x.shape().clone()).tanh(),
                        // The first row: a size-1 dim, which broadcasts.
                        2 => x.slice_axis(0, 0, Some(1), 1),
                        3 => {
                            let first = Array::from_vec(vec![0i32], &[1]).expect("index");
                            x.take(&first, 0)
                        }
                        // The first and last rows back in place (doubled where they
                        // are one row), zeros elsewhere.
                        4 => {
                            let first = Array::from_vec(vec![0i32, -1], &[2]).expect("indices");
                            let rows = x.shape().0[0].clone();
                            x.take(&first, 0).scatter_add(&first, 0, rows)
                        }
                        // Even rows kept in place, odd rows zeroed.
                        _ => {
                            let mut axes = vec![kiln::SliceAxis::full(); x.ndim()];
                            axes[0].step = 2;
                            x.slice(&axes).pad_slice(&axes, x.shape())
                        }
                    }
                }
            }
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
pub fn input_shapes(n: usize) -> Vec<Vec<usize>> {
    vec![vec![n, n], vec![1, n], vec![n, 1], vec![n]]
}

/// Normal random inputs of `input_shapes(n)`, cast to `dtype`.
pub fn make_inputs(n: usize, seed: u64, dtype: DType) -> Vec<Array> {
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

/// The property-test case count: `KILN_CASES`, else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("KILN_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
