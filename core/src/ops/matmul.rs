//! Batched matrix product with broadcast batch dims: shape rule and
//! reference evaluation.
//!
//! Float products (f32, and f16/bf16 widened to f32 and rounded once at
//! the end) run on packed GEMM microkernels split across
//! [`crate::exec::cpu_threads`] threads. Their sums over `k` are blocked
//! and may use FMA, so they can differ from a plain i-k-j loop, and between
//! instruction sets, in the last bits; every f32 output stays within
//! [`error_bound`] of the exact product. Integer products wrap and are
//! exact.

use super::batching::Batched;
use super::product::{self, Product, View};
use super::strided::{
    broadcast_shapes, broadcast_strides, eval_dtype_err, for_each_offset, narrow, numel, widen,
    WrappingInt,
};
use super::ShapeCx;
use crate::data::HostData;
use crate::error::{dtype_err, require_same_dtype, shape_err, Error, Result};
use crate::handle::array::Array;
use crate::ops::Op;
use crate::shape::{Aval, Shape};
use crate::DType;

impl Array {
    /// Matrix product with NumPy semantics: rank-1 operands are promoted
    /// (and the added axis removed), batch dims broadcast.
    #[track_caller]
    pub fn matmul(&self, rhs: &Array) -> Array {
        let lhs_vec = self.ndim() == 1;
        let rhs_vec = rhs.ndim() == 1;
        let a = if lhs_vec {
            self.expand_dims(0)
        } else {
            self.clone()
        };
        let b = if rhs_vec {
            rhs.expand_dims(1)
        } else {
            rhs.clone()
        };
        let mut out = Array::apply(Op::Matmul, vec![a, b]);
        if rhs_vec {
            out = out.squeeze(&[-1]);
        }
        if lhs_vec {
            out = out.squeeze(&[-2 + rhs_vec as isize]);
        }
        out
    }
}

const OP: &str = "matmul";

/// The output aval of `[..., m, k] @ [..., k, n]`: the broadcast batch dims
/// followed by `[m, n]`.
pub fn shape_rule(a: &Aval, b: &Aval, cx: &mut ShapeCx) -> Result<Aval> {
    let (ra, rb) = (a.shape.rank(), b.shape.rank());
    if ra < 2 || rb < 2 {
        return Err(shape_err(
            OP,
            &[a, b],
            format!("matmul needs rank >= 2 operands, got ranks {ra} and {rb}"),
        ));
    }
    let dtype = require_same_dtype(OP, a, b)?;
    if dtype == DType::Bool {
        return Err(dtype_err(OP, &[a, b], "expects a numeric dtype, got bool"));
    }
    let (ad, bd) = (a.shape.dims(), b.shape.dims());
    let (ka, kb) = (&ad[ra - 1], &bd[rb - 2]);
    if cx.unify(ka, kb).is_none() {
        return Err(shape_err(
            OP,
            &[a, b],
            format!("inner dims differ: k={ka} vs {kb}"),
        ));
    }
    let batch_a = Aval::new(Shape(ad[..ra - 2].to_vec()), dtype);
    let batch_b = Aval::new(Shape(bd[..rb - 2].to_vec()), dtype);
    let mut dims = broadcast_shapes(OP, &[&batch_a, &batch_b], cx)
        .map_err(|e| match e {
            Error::Shape { detail, .. } => shape_err(OP, &[a, b], format!("batch dims: {detail}")),
            other => other,
        })?
        .0;
    dims.push(ad[ra - 2].clone());
    dims.push(bd[rb - 1].clone());
    Ok(Aval::new(Shape(dims), dtype))
}

/// The output aval of [`crate::Op::TransposedMatmul`]: the product of the
/// operands with the last two axes of each marked one swapped.
pub fn transposed_shape_rule(
    a: &Aval,
    b: &Aval,
    transposed: [bool; 2],
    cx: &mut ShapeCx,
) -> Result<Aval> {
    let logical = |x: &Aval, swap: bool| {
        let mut dims = x.shape.dims().to_vec();
        let rank = dims.len();
        if swap && rank >= 2 {
            dims.swap(rank - 2, rank - 1);
        }
        Aval::new(Shape(dims), x.dtype)
    };
    shape_rule(&logical(a, transposed[0]), &logical(b, transposed[1]), cx)
}

/// Reference evaluation: one product per (broadcast) batch entry; floats
/// on the GEMM microkernels (f16/bf16 accumulate in f32), integers in an
/// i-k-j loop that wraps.
pub fn eval(
    a: &HostData,
    a_shape: &[usize],
    b: &HostData,
    b_shape: &[usize],
    out_shape: &[usize],
) -> Result<HostData> {
    eval_transposed(a, a_shape, b, b_shape, [false, false], out_shape)
}

/// Reference evaluation of [`crate::Op::TransposedMatmul`]: as [`eval`],
/// with operand `i` stored with its last two axes swapped where
/// `transposed[i]` (`a` as `[..., k, m]`, `b` as `[..., n, k]`) and read
/// through strides in place, so no transposed copy is made. Same bits as
/// [`eval`] of the materialized transposes.
pub fn eval_transposed(
    a: &HostData,
    a_shape: &[usize],
    b: &HostData,
    b_shape: &[usize],
    transposed: [bool; 2],
    out_shape: &[usize],
) -> Result<HostData> {
    let dtypes = [a.dtype(), b.dtype()];
    if a.dtype() != b.dtype() {
        return Err(eval_dtype_err(OP, &dtypes, "operand dtypes differ"));
    }
    let Some(geom) = Geometry::new(a_shape, b_shape, transposed, out_shape) else {
        return Err(Error::Shape {
            op: OP.to_string(),
            detail: format!("operands do not fit the output shape {out_shape:?}"),
            operands: format!("{a_shape:?}, {b_shape:?}"),
            at: None,
        });
    };
    Ok(match (a, b) {
        (HostData::F32(x), HostData::F32(y)) => HostData::F32(geom.float(x, y)),
        (HostData::F16(x), HostData::F16(y)) => {
            HostData::F16(narrow(&geom.float(&widen(x), &widen(y))))
        }
        (HostData::BF16(x), HostData::BF16(y)) => {
            HostData::BF16(narrow(&geom.float(&widen(x), &widen(y))))
        }
        (HostData::I32(x), HostData::I32(y)) => HostData::I32(geom.int(x, y)),
        (HostData::U32(x), HostData::U32(y)) => HostData::U32(geom.int(x, y)),
        (HostData::U8(x), HostData::U8(y)) => HostData::U8(geom.int(x, y)),
        _ => return Err(eval_dtype_err(OP, &dtypes, "expects numeric operands")),
    })
}

/// Sizes, batch strides (in matrices) and operand layouts of one
/// evaluation.
struct Geometry {
    m: usize,
    k: usize,
    n: usize,
    batch: Vec<usize>,
    a_batch_strides: Vec<usize>,
    b_batch_strides: Vec<usize>,
    /// Operand `i` is stored with its last two axes swapped.
    transposed: [bool; 2],
}

impl Geometry {
    /// `None` when the concrete shapes (operand `i` stored transposed where
    /// `transposed[i]`) do not fit together.
    fn new(
        a_shape: &[usize],
        b_shape: &[usize],
        transposed: [bool; 2],
        out_shape: &[usize],
    ) -> Option<Geometry> {
        let (ra, rb, ro) = (a_shape.len(), b_shape.len(), out_shape.len());
        if ra < 2 || rb < 2 || ro < 2 {
            return None;
        }
        // (rows, cols) of each operand as the product reads it.
        let logical = |s: &[usize], r: usize, swap: bool| {
            if swap {
                (s[r - 1], s[r - 2])
            } else {
                (s[r - 2], s[r - 1])
            }
        };
        let ((m, k), (kb, n)) = (
            logical(a_shape, ra, transposed[0]),
            logical(b_shape, rb, transposed[1]),
        );
        if k != kb {
            return None;
        }
        if out_shape[ro - 2..] != [m, n] {
            return None;
        }
        let batch = out_shape[..ro - 2].to_vec();
        let fits = |s: &[usize]| {
            s.len() <= batch.len()
                && s.iter()
                    .rev()
                    .zip(batch.iter().rev())
                    .all(|(&d, &o)| d == o || d == 1)
        };
        if !fits(&a_shape[..ra - 2]) || !fits(&b_shape[..rb - 2]) {
            return None;
        }
        Some(Geometry {
            m,
            k,
            n,
            a_batch_strides: broadcast_strides(&a_shape[..ra - 2], &batch),
            b_batch_strides: broadcast_strides(&b_shape[..rb - 2], &batch),
            batch,
            transposed,
        })
    }

    /// The (row, column) element strides of the `rows`×`cols` matrix an
    /// operand holds, stored transposed when `swap`.
    fn strides(rows: usize, cols: usize, swap: bool) -> (usize, usize) {
        if swap {
            (1, rows)
        } else {
            (cols, 1)
        }
    }

    /// The (row, column) element strides of a's and b's matrices.
    fn operand_strides(&self) -> [(usize, usize); 2] {
        [
            Geometry::strides(self.m, self.k, self.transposed[0]),
            Geometry::strides(self.k, self.n, self.transposed[1]),
        ]
    }

    /// The f32 product on the GEMM microkernels, which read transposed
    /// operands through their strides.
    fn float(&self, a: &[f32], b: &[f32]) -> Vec<f32> {
        let (m, k, n) = (self.m, self.k, self.n);
        let [(a_rows, a_cols), (b_rows, b_cols)] = self.operand_strides();
        let view = |data, row_stride, col_stride| View {
            data,
            row_stride,
            col_stride,
        };
        let mut jobs = Vec::with_capacity(numel(&self.batch));
        for_each_offset(
            &self.batch,
            [&self.a_batch_strides, &self.b_batch_strides],
            |[ia, ib]| {
                jobs.push(Product {
                    m,
                    k,
                    n,
                    a: view(&a[ia * m * k..(ia + 1) * m * k], a_rows, a_cols),
                    b: view(&b[ib * k * n..(ib + 1) * k * n], b_rows, b_cols),
                    accumulate: false,
                })
            },
        );
        product::run(&jobs)
    }

    /// The product with `mac(c, a, b) = c + a * b`, in i-k-j order.
    fn run<T: Copy>(&self, a: &[T], b: &[T], zero: T, mac: impl Fn(T, T, T) -> T) -> Vec<T> {
        let (m, k, n) = (self.m, self.k, self.n);
        let [(a_rows, a_cols), (b_rows, b_cols)] = self.operand_strides();
        let mut out = vec![zero; numel(&self.batch) * m * n];
        if out.is_empty() {
            return out;
        }
        let mut c_mats = out.chunks_exact_mut(m * n);
        for_each_offset(
            &self.batch,
            [&self.a_batch_strides, &self.b_batch_strides],
            |[ia, ib]| {
                let Some(c) = c_mats.next() else { return };
                let a = &a[ia * m * k..(ia + 1) * m * k];
                let b = &b[ib * k * n..(ib + 1) * k * n];
                for (i, c_row) in c.chunks_exact_mut(n).enumerate() {
                    for p in 0..k {
                        let x = a[i * a_rows + p * a_cols];
                        for (j, c) in c_row.iter_mut().enumerate() {
                            *c = mac(*c, x, b[p * b_rows + j * b_cols]);
                        }
                    }
                }
            },
        );
        out
    }

    fn int<T: WrappingInt>(&self, a: &[T], b: &[T]) -> Vec<T> {
        self.run(a, b, T::ZERO, |c, p, q| c.add(p.mul(q)))
    }
}

/// The bound on the error of one f32 output of a product with inner size
/// `k` whose terms' magnitudes sum to `abs_sum` (`Σ_p |a_ip·b_pj|`): the
/// classical `γ_k · abs_sum`, `γ_k = k·u / (1 − k·u)`, `u = 2⁻²⁴`, which
/// holds for any order of the sum, with or without FMA. f16/bf16 products
/// add one rounding of the f32 result to the half.
///
/// ```
/// let bound = kiln::ops::matmul::error_bound(1024, 1.0);
/// assert!(bound > 6.1e-5 && bound < 6.2e-5);
/// ```
pub fn error_bound(k: usize, abs_sum: f64) -> f64 {
    let ku = k as f64 * f64::from(f32::EPSILON) / 2.0;
    ku / (1.0 - ku) * abs_sum
}

/// The cotangents of `a @ b` (rank ≥ 2, batch dims broadcast): `g @ bᵀ`
/// and `aᵀ @ g`, each summed over the batch dims it was broadcast along.
/// The transposes are permutes that the `transposed_operands` pass folds
/// into the products on executors that read operands in place.
pub(crate) fn vjp(a: &Array, b: &Array, g: &Array) -> [Option<Array>; 2] {
    let ga = g.matmul(&b.swap_axes(-1, -2));
    let gb = a.swap_axes(-1, -2).matmul(g);
    [
        Some(crate::ops::binary::unbroadcast(&ga, a.shape())),
        Some(crate::ops::binary::unbroadcast(&gb, b.shape())),
    ]
}

/// The tangent of `a @ b`: `ta @ b + a @ tb` (a term dropped where its
/// operand has no tangent), in the product's broadcast shape.
pub(crate) fn jvp(a: &Array, b: &Array, ta: Option<Array>, tb: Option<Array>) -> Option<Array> {
    match (ta.map(|t| t.matmul(b)), tb.map(|t| a.matmul(&t))) {
        (Some(x), Some(y)) => Some(x + y),
        (one, other) => one.or(other),
    }
}

/// The batched product. A batched `a` times a shared matrix `b` folds the
/// examples into the rows of one product (one GEMM, as the hand-batched
/// program has); otherwise batched operands get their batch axis first
/// and the output's per-example rank, and the product's batch dims
/// broadcast.
pub(crate) fn batch(a: &Batched, b: &Batched, output: &Array) -> Batched {
    if a.axis.is_some() && b.axis.is_none() && b.value.ndim() == 2 {
        return a.rows_folded(|rows| rows.matmul(&b.value));
    }
    let rank = output.ndim();
    Batched::along(a.aligned(rank).matmul(&b.aligned(rank)), 0)
}

/// The cotangents of [`crate::Op::TransposedMatmul`]: those of the product
/// of the logical operands, each transposed back to its stored layout.
pub(crate) fn transposed_vjp(
    a: &Array,
    b: &Array,
    transposed: [bool; 2],
    g: &Array,
) -> [Option<Array>; 2] {
    let layout = |x: &Array, swap: bool| {
        if swap {
            x.swap_axes(-1, -2)
        } else {
            x.clone()
        }
    };
    let [ga, gb] = vjp(&layout(a, transposed[0]), &layout(b, transposed[1]), g);
    [
        ga.map(|ga| layout(&ga, transposed[0])),
        gb.map(|gb| layout(&gb, transposed[1])),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::strided::proptest_config;
    use crate::shape::{Dim, Symbol};
    use half::{bf16, f16};
    use proptest::prelude::*;

    fn naive(a: &[i32], b: &[i32], m: usize, k: usize, n: usize) -> Vec<i32> {
        let mut out = vec![0i32; m * n];
        for i in 0..m {
            for j in 0..n {
                for p in 0..k {
                    out[i * n + j] =
                        out[i * n + j].wrapping_add(a[i * k + p].wrapping_mul(b[p * n + j]));
                }
            }
        }
        out
    }

    #[test]
    fn two_by_two_product() {
        let a = HostData::F32(vec![1.0, 2.0, 3.0, 4.0]);
        let b = HostData::F32(vec![5.0, 6.0, 7.0, 8.0]);
        assert_eq!(
            eval(&a, &[2, 2], &b, &[2, 2], &[2, 2]),
            Ok(HostData::F32(vec![19.0, 22.0, 43.0, 50.0]))
        );
    }

    #[test]
    fn batch_dims_broadcast() {
        // a: two 1x2 matrices, b: one 2x1 matrix shared by both.
        let a = HostData::I32(vec![1, 2, 3, 4]);
        let b = HostData::I32(vec![10, 100]);
        assert_eq!(
            eval(&a, &[2, 1, 2], &b, &[2, 1], &[2, 1, 1]),
            Ok(HostData::I32(vec![210, 430]))
        );
        let mut cx = ShapeCx::new();
        let out = shape_rule(
            &Aval::new([2, 1, 3, 4], DType::F32),
            &Aval::new([5, 4, 6], DType::F32),
            &mut cx,
        );
        assert_eq!(out, Ok(Aval::new([2, 5, 3, 6], DType::F32)));
        let err = shape_rule(
            &Aval::new([2, 3, 4], DType::F32),
            &Aval::new([5, 4, 6], DType::F32),
            &mut cx,
        )
        .unwrap_err();
        assert!(format!("{err}").contains("batch dims: cannot broadcast dim 2 with 5 at axis 0"));
    }

    #[test]
    fn integer_products_wrap() {
        let a = HostData::U8(vec![16, 16]);
        let b = HostData::U8(vec![16, 1]);
        assert_eq!(
            eval(&a, &[1, 2], &b, &[2, 1], &[1, 1]),
            Ok(HostData::U8(vec![16]))
        );
    }

    #[test]
    fn halves_accumulate_in_f32_and_round_once() {
        // Every partial sum is exact in f32, so the only rounding is the
        // final one to the half.
        let xs = [0.5f32, 0.75, 1.25, 3.0];
        let h: Vec<f16> = xs.iter().map(|&x| f16::from_f32(x)).collect();
        let got = eval(
            &HostData::F16(h.clone()),
            &[1, 2],
            &HostData::F16(h),
            &[2, 2],
            &[1, 2],
        );
        let want = [0.5 * 0.5 + 0.75 * 1.25, 0.5 * 0.75 + 0.75 * 3.0];
        assert_eq!(got, Ok(HostData::F16(narrow(&want))));
        let b: Vec<bf16> = xs.iter().map(|&x| bf16::from_f32(x)).collect();
        let got = eval(
            &HostData::BF16(b.clone()),
            &[1, 4],
            &HostData::BF16(b),
            &[4, 1],
            &[1, 1],
        );
        let dot: f32 = xs.iter().map(|x| x * x).sum();
        assert_eq!(got, Ok(HostData::BF16(narrow(&[dot]))));
    }

    /// Values in [-1, 1) from `seed`, some of them exactly zero.
    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(6_364_136_223_846_793_005) | 1;
        (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((state >> 40) % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// `got` (the product of `a` `[batch_a.., m, k]` and `b` `[batch_b..,
    /// k, n]`) against an f64 product, output by output, within
    /// [`error_bound`].
    fn check_against_f64(
        a: &[f32],
        a_shape: &[usize],
        b: &[f32],
        b_shape: &[usize],
        got: &[f32],
        out_shape: &[usize],
    ) -> std::result::Result<(), String> {
        let geom =
            Geometry::new(a_shape, b_shape, [false, false], out_shape).ok_or("shapes fit")?;
        let (m, k, n) = (geom.m, geom.k, geom.n);
        let mut checked = 0;
        let mut result = Ok(());
        for_each_offset(
            &geom.batch,
            [&geom.a_batch_strides, &geom.b_batch_strides],
            |[ia, ib]| {
                for i in 0..m {
                    for j in 0..n {
                        let (mut exact, mut abs_sum) = (0.0f64, 0.0f64);
                        for p in 0..k {
                            let t = f64::from(a[(ia * m + i) * k + p])
                                * f64::from(b[(ib * k + p) * n + j]);
                            exact += t;
                            abs_sum += t.abs();
                        }
                        let g = f64::from(got[checked + i * n + j]);
                        if (g - exact).abs() > error_bound(k, abs_sum) && result.is_ok() {
                            result = Err(format!(
                                "output ({i}, {j}) of batch entry {checked}: {g} vs {exact} \
                                 (k = {k}, bound {})",
                                error_bound(k, abs_sum)
                            ));
                        }
                    }
                }
                checked += m * n;
            },
        );
        result
    }

    #[test]
    fn large_products_stay_within_the_per_k_bound() {
        // Big enough for the microkernels' blocking over k and for the
        // split across threads.
        for (m, k, n) in [(67, 1031, 129), (1, 4096, 33), (130, 3, 260)] {
            let (a, b) = (values(m * k, 1), values(k * n, 2));
            let Ok(HostData::F32(got)) = eval(
                &HostData::F32(a.clone()),
                &[m, k],
                &HostData::F32(b.clone()),
                &[k, n],
                &[m, n],
            ) else {
                panic!("f32 product evaluates");
            };
            check_against_f64(&a, &[m, k], &b, &[k, n], &got, &[m, n]).unwrap();
        }
    }

    #[test]
    fn zero_inner_dim_gives_zeros_and_zero_rows_give_empty() {
        let e = HostData::F32(vec![]);
        assert_eq!(
            eval(&e, &[2, 0], &e, &[0, 3], &[2, 3]),
            Ok(HostData::F32(vec![0.0; 6]))
        );
        assert_eq!(
            eval(&e, &[0, 2], &HostData::F32(vec![1.0; 6]), &[2, 3], &[0, 3]),
            Ok(e.clone())
        );
    }

    #[test]
    fn rank_one_operand_is_a_shape_error() {
        let err = shape_rule(
            &Aval::new([3], DType::F32),
            &Aval::new([3, 2], DType::F32),
            &mut ShapeCx::new(),
        )
        .unwrap_err();
        assert!(matches!(err, Error::Shape { .. }));
        let msg = format!("{err}");
        assert!(
            msg.contains("rank >= 2") && msg.contains("f32[3]") && msg.contains("f32[3,2]"),
            "{msg}"
        );
    }

    #[test]
    fn inner_dim_mismatch_names_both_sizes() {
        let err = shape_rule(
            &Aval::new([2, 3], DType::F32),
            &Aval::new([4, 5], DType::F32),
            &mut ShapeCx::new(),
        )
        .unwrap_err();
        let msg = format!("{err}");
        assert!(
            msg.contains("inner dims differ: k=3 vs 4")
                && msg.contains("matmul")
                && msg.contains("f32[4,5]")
        );
    }

    #[test]
    fn bool_and_mixed_dtypes_are_rejected() {
        let t = Aval::new([2, 2], DType::Bool);
        assert!(matches!(
            shape_rule(&t, &t, &mut ShapeCx::new()),
            Err(Error::DType { .. })
        ));
        let f = Aval::new([2, 2], DType::F32);
        let h = Aval::new([2, 2], DType::F16);
        assert!(matches!(
            shape_rule(&f, &h, &mut ShapeCx::new()),
            Err(Error::DType { .. })
        ));
    }

    #[test]
    fn symbolic_outer_dims_pass_through_without_guards() {
        let s0 = Dim::symbol(Symbol(0));
        let s1 = Dim::symbol(Symbol(1));
        let a = Aval::new(Shape(vec![s0.clone(), Dim::Known(3)]), DType::F32);
        let b = Aval::new(Shape(vec![Dim::Known(3), s1.clone()]), DType::F32);
        let mut cx = ShapeCx::new();
        assert_eq!(
            shape_rule(&a, &b, &mut cx),
            Ok(Aval::new(Shape(vec![s0, s1]), DType::F32))
        );
        assert!(cx.guards.is_empty());
    }

    proptest! {
        #![proptest_config(proptest_config())]
        #[test]
        fn matches_naive_triple_loop(m in 0usize..5, k in 0usize..5, n in 0usize..5, batch in 0usize..3, seed in any::<i32>()) {
            let a: Vec<i32> = (0..(batch * m * k) as i32).map(|i| i.wrapping_mul(seed) % 1000).collect();
            let b: Vec<i32> = (0..(k * n) as i32).map(|i| i.wrapping_add(seed) % 1000).collect();
            let got = eval(&HostData::I32(a.clone()), &[batch, m, k], &HostData::I32(b.clone()), &[k, n], &[batch, m, n]).unwrap();
            let want: Vec<i32> = (0..batch)
                .flat_map(|i| naive(&a[i * m * k..(i + 1) * m * k], &b, m, k, n))
                .collect();
            prop_assert_eq!(got, HostData::I32(want));
        }

        #[test]
        fn floats_are_within_the_per_k_bound_of_an_f64_product(
            m in 0usize..40,
            k in 0usize..300,
            n in 0usize..40,
            a_batch in prop::sample::select(vec![vec![], vec![1], vec![3], vec![2, 1]]),
            b_batch in prop::sample::select(vec![vec![], vec![1], vec![3], vec![1, 3]]),
            seed in any::<u64>(),
        ) {
            let a_shape = [a_batch.clone(), vec![m, k]].concat();
            let b_shape = [b_batch.clone(), vec![k, n]].concat();
            let batch = broadcast_known(&a_batch, &b_batch);
            let out_shape = [batch, vec![m, n]].concat();
            let a = values(numel(&a_shape), seed);
            let b = values(numel(&b_shape), seed ^ 0x5555);
            let got = eval(&HostData::F32(a.clone()), &a_shape, &HostData::F32(b.clone()), &b_shape, &out_shape).unwrap();
            let HostData::F32(got) = got else { panic!("f32 in, f32 out") };
            prop_assert_eq!(got.len(), numel(&out_shape));
            let checked = check_against_f64(&a, &a_shape, &b, &b_shape, &got, &out_shape);
            prop_assert!(checked.is_ok(), "{:?}", checked);
        }
    }

    /// The `rows`×`cols` matrices of `x` (`batch` of them), each transposed.
    fn transpose_each<T: Copy>(x: &[T], batch: usize, rows: usize, cols: usize) -> Vec<T> {
        let mut out = x.to_vec();
        for e in 0..batch {
            for r in 0..rows {
                for c in 0..cols {
                    out[(e * cols + c) * rows + r] = x[(e * rows + r) * cols + c];
                }
            }
        }
        out
    }

    proptest! {
        #![proptest_config(proptest_config())]
        #[test]
        fn transposed_operands_read_in_place_equal_the_materialized_product(
            m in 0usize..6,
            k in 0usize..6,
            n in 0usize..6,
            batch in 1usize..3,
            transposed in any::<[bool; 2]>(),
            seed in any::<i32>(),
        ) {
            let a: Vec<i32> = (0..(batch * m * k) as i32).map(|i| i.wrapping_mul(seed) % 1000).collect();
            let b: Vec<i32> = (0..(batch * k * n) as i32).map(|i| i.wrapping_add(seed) % 1000).collect();
            let want = eval(&HostData::I32(a.clone()), &[batch, m, k], &HostData::I32(b.clone()), &[batch, k, n], &[batch, m, n]).unwrap();
            let (a_stored, a_shape) = if transposed[0] { (transpose_each(&a, batch, m, k), [batch, k, m]) } else { (a, [batch, m, k]) };
            let (b_stored, b_shape) = if transposed[1] { (transpose_each(&b, batch, k, n), [batch, n, k]) } else { (b, [batch, k, n]) };
            let got = eval_transposed(&HostData::I32(a_stored), &a_shape, &HostData::I32(b_stored), &b_shape, transposed, &[batch, m, n]).unwrap();
            prop_assert_eq!(got, want);
        }

        #[test]
        fn transposed_float_operands_are_within_the_per_k_bound(
            m in 1usize..40,
            k in 1usize..300,
            n in 1usize..40,
            transposed in any::<[bool; 2]>(),
            seed in any::<u64>(),
        ) {
            let (a, b) = (values(2 * m * k, seed), values(k * n, seed ^ 0x5555));
            let a_stored = if transposed[0] { transpose_each(&a, 2, m, k) } else { a.clone() };
            let b_stored = if transposed[1] { transpose_each(&b, 1, k, n) } else { b.clone() };
            let a_shape = if transposed[0] { [2, k, m] } else { [2, m, k] };
            let b_shape = if transposed[1] { [n, k] } else { [k, n] };
            let got = eval_transposed(&HostData::F32(a_stored), &a_shape, &HostData::F32(b_stored), &b_shape, transposed, &[2, m, n]).unwrap();
            let HostData::F32(got) = got else { panic!("f32 in, f32 out") };
            let checked = check_against_f64(&a, &[2, m, k], &b, &[k, n], &got, &[2, m, n]);
            prop_assert!(checked.is_ok(), "{:?}", checked);
        }
    }

    #[test]
    fn transposed_shape_rule_swaps_the_marked_operands() {
        let a = Aval::new([2, 5, 3], DType::F32);
        let b = Aval::new([4, 5], DType::F32);
        assert_eq!(
            transposed_shape_rule(&a, &b, [true, true], &mut ShapeCx::new()),
            Ok(Aval::new([2, 3, 4], DType::F32))
        );
        assert!(transposed_shape_rule(&a, &b, [false, true], &mut ShapeCx::new()).is_err());
    }

    /// NumPy broadcasting of two batch shapes that fit.
    fn broadcast_known(a: &[usize], b: &[usize]) -> Vec<usize> {
        let rank = a.len().max(b.len());
        let dim = |s: &[usize], i: usize| (i + s.len()).checked_sub(rank).map_or(1, |j| s[j]);
        (0..rank).map(|i| dim(a, i).max(dim(b, i))).collect()
    }

    use crate::compile::rule_checks as rules;

    #[test]
    fn matmul_jvp_matches_a_central_difference_for_vectors_and_batches() {
        let a = rules::normal(13, &[2, 3, 4]);
        let b = rules::normal(14, &[4, 2]);
        rules::assert_jvp_matches_central_difference("matmul", |x| x[0].matmul(&x[1]), &[a, b]);
        let v = rules::normal(15, &[4]);
        let m = rules::normal(16, &[3, 4]);
        rules::assert_jvp_matches_central_difference("matvec", |x| x[0].matmul(&x[1]), &[m, v]);
    }

    #[test]
    fn matmul_batches_both_operands_into_one_batched_product() {
        let xs = rules::normal(17, &[3, 2, 4]);
        let ws = rules::normal(18, &[3, 4, 5]);
        let report =
            rules::assert_batches_like_stacking("matmul", |x| x[0].matmul(&x[1]), &[xs, ws]);
        assert!(
            report.vmap_fallbacks.is_empty(),
            "{:?}",
            report.vmap_fallbacks
        );
    }

    #[test]
    fn a_matmul_of_transposed_operands_has_the_logical_products_jvp_and_batch() {
        let transposed = |x: Vec<Array>| {
            Array::apply(
                Op::TransposedMatmul {
                    transposed: [true, false],
                },
                x,
            )
        };
        let (a, b) = (rules::normal(57, &[4, 2]), rules::normal(58, &[4, 3]));
        rules::assert_jvp_matches_central_difference("matmul(aᵀ @ b)", transposed, &[a, b]);
        let (a, b) = (rules::normal(59, &[3, 4, 2]), rules::normal(60, &[3, 4, 3]));
        let report = rules::assert_batches_like_stacking("matmul(aᵀ @ b)", transposed, &[a, b]);
        assert!(
            report.vmap_fallbacks.is_empty(),
            "{:?}",
            report.vmap_fallbacks
        );
    }
}
