//! Batched matrix product with broadcast batch dims: shape rule and
//! reference evaluation.

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

/// Reference evaluation: one i-k-j product per (broadcast) batch entry;
/// f16/bf16 accumulate in f32, integers wrap.
pub fn eval(
    a: &HostData,
    a_shape: &[usize],
    b: &HostData,
    b_shape: &[usize],
    out_shape: &[usize],
) -> Result<HostData> {
    let dtypes = [a.dtype(), b.dtype()];
    if a.dtype() != b.dtype() {
        return Err(eval_dtype_err(OP, &dtypes, "operand dtypes differ"));
    }
    let Some(geom) = Geometry::new(a_shape, b_shape, out_shape) else {
        return Err(Error::Shape {
            op: OP.to_string(),
            detail: format!("operands do not fit the output shape {out_shape:?}"),
            operands: format!("{a_shape:?}, {b_shape:?}"),
        });
    };
    Ok(match (a, b) {
        (HostData::F32(x), HostData::F32(y)) => {
            HostData::F32(geom.run(x, y, 0.0, |c, p, q| c + p * q))
        }
        (HostData::F16(x), HostData::F16(y)) => {
            HostData::F16(narrow(
                &geom.run(&widen(x), &widen(y), 0.0, |c, p, q| c + p * q),
            ))
        }
        (HostData::BF16(x), HostData::BF16(y)) => {
            HostData::BF16(narrow(
                &geom.run(&widen(x), &widen(y), 0.0, |c, p, q| c + p * q),
            ))
        }
        (HostData::I32(x), HostData::I32(y)) => HostData::I32(geom.int(x, y)),
        (HostData::U32(x), HostData::U32(y)) => HostData::U32(geom.int(x, y)),
        (HostData::U8(x), HostData::U8(y)) => HostData::U8(geom.int(x, y)),
        _ => return Err(eval_dtype_err(OP, &dtypes, "expects numeric operands")),
    })
}

/// Sizes and batch strides (in matrices) of one evaluation.
struct Geometry {
    m: usize,
    k: usize,
    n: usize,
    batch: Vec<usize>,
    a_batch_strides: Vec<usize>,
    b_batch_strides: Vec<usize>,
}

impl Geometry {
    /// `None` when the concrete shapes do not fit together.
    fn new(a_shape: &[usize], b_shape: &[usize], out_shape: &[usize]) -> Option<Geometry> {
        let (ra, rb, ro) = (a_shape.len(), b_shape.len(), out_shape.len());
        if ra < 2 || rb < 2 || ro < 2 || a_shape[ra - 1] != b_shape[rb - 2] {
            return None;
        }
        let (m, k, n) = (a_shape[ra - 2], a_shape[ra - 1], b_shape[rb - 1]);
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
        })
    }

    /// The product with `mac(c, a, b) = c + a * b`.
    fn run<T: Copy>(&self, a: &[T], b: &[T], zero: T, mac: impl Fn(T, T, T) -> T) -> Vec<T> {
        let (m, k, n) = (self.m, self.k, self.n);
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
                for (c_row, a_row) in c.chunks_exact_mut(n).zip(a.chunks_exact(k.max(1))) {
                    for (&p, b_row) in a_row.iter().zip(b.chunks_exact(n)) {
                        for (c, &q) in c_row.iter_mut().zip(b_row) {
                            *c = mac(*c, p, q);
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

/// The cotangents of `a @ b` (rank ≥ 2, batch dims broadcast): `g @ bᵀ`
/// and `aᵀ @ g`, each summed over the batch dims it was broadcast along.
pub(crate) fn vjp(a: &Array, b: &Array, g: &Array) -> [Option<Array>; 2] {
    let ga = g.matmul(&b.swap_axes(-1, -2));
    let gb = a.swap_axes(-1, -2).matmul(g);
    [
        Some(crate::ops::binary::unbroadcast(&ga, a.shape())),
        Some(crate::ops::binary::unbroadcast(&gb, b.shape())),
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
    fn halves_accumulate_in_f32() {
        let xs = [0.1f32, 0.7, 1.3, 2.9];
        let h: Vec<f16> = xs.iter().map(|&x| f16::from_f32(x)).collect();
        let w = widen(&h);
        let want = w[0] * w[0] + w[1] * w[2];
        let want2 = w[0] * w[1] + w[1] * w[3];
        let got = eval(
            &HostData::F16(h.clone()),
            &[1, 2],
            &HostData::F16(h),
            &[2, 2],
            &[1, 2],
        );
        assert_eq!(got, Ok(HostData::F16(narrow(&[want, want2]))));
        let b: Vec<bf16> = xs.iter().map(|&x| bf16::from_f32(x)).collect();
        let w = widen(&b);
        let got = eval(
            &HostData::BF16(b.clone()),
            &[1, 4],
            &HostData::BF16(b),
            &[4, 1],
            &[1, 1],
        );
        let dot = w.iter().map(|x| x * x).fold(0.0f32, |a, b| a + b);
        assert_eq!(got, Ok(HostData::BF16(narrow(&[dot]))));
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
    }
}
