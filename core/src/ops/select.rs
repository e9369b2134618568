//! `where(cond, a, b)` with NumPy broadcasting of all three operands:
//! shape rule and reference evaluation.

use super::strided::{broadcast_shapes, broadcast_strides, eval_dtype_err, for_each_offset, numel};
use super::ShapeCx;
use crate::data::{HostData, HostElement};
use crate::error::{arg_err, dtype_err, require_same_dtype, shape_err, Result};
use crate::handle::array::Array;
use crate::location::in_composition;
use crate::ops::binary::Operand;
use crate::ops::Op;
use crate::shape::Aval;
use crate::DType;

impl Array {
    /// `where(self, on_true, on_false)` with `self` a bool condition.
    #[track_caller]
    pub fn select(&self, on_true: impl Operand, on_false: impl Operand) -> Array {
        // Numbers take the dtype of the array branch (f32 if both are numbers).
        let dtype = on_true.dtype().or(on_false.dtype()).unwrap_or(DType::F32);
        Array::apply(
            Op::Select,
            vec![
                self.clone(),
                on_true.into_array(dtype),
                on_false.into_array(dtype),
            ],
        )
    }
}

impl Array {
    /// The lower triangle of the matrices in the last two axes: entry
    /// `[.., i, j]` is kept where `j - i <= k` and zero elsewhere (`k = 0`
    /// the main diagonal, `k > 0` above it, `k < 0` below), as
    /// `jax.numpy.tril`. Built from `iota`, a comparison and `select`, so
    /// it differentiates, batches and runs on every backend, and its dims
    /// may be symbolic (shapeless compile). Rank below 2 fails.
    ///
    /// ```
    /// use kiln::{Array, DType};
    /// let causal = Array::ones(&[3, 3], DType::F32).tril(0);
    /// assert_eq!(causal.to_vec::<f32>()?, [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn tril(&self, k: i64) -> Array {
        in_composition("tril", || self.keep_triangle("tril", k, Triangle::Lower))
    }

    /// The upper triangle of the matrices in the last two axes: entry
    /// `[.., i, j]` is kept where `j - i >= k` and zero elsewhere, as
    /// `jax.numpy.triu`; see [`Array::tril`].
    ///
    /// ```
    /// use kiln::{Array, DType};
    /// let above = Array::ones(&[2, 3], DType::I32).triu(1);
    /// assert_eq!(above.to_vec::<i32>()?, [0, 1, 1, 0, 0, 1]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn triu(&self, k: i64) -> Array {
        in_composition("triu", || self.keep_triangle("triu", k, Triangle::Upper))
    }

    #[track_caller]
    fn keep_triangle(&self, op: &str, k: i64, triangle: Triangle) -> Array {
        if let Err(e) = self.first_error() {
            return Array::failed(e);
        }
        if self.ndim() < 2 {
            return Array::failed(shape_err(
                op,
                &[self.aval()],
                format!(
                    "needs at least 2 dims (the last two hold the matrices), got rank {}",
                    self.ndim()
                ),
            ));
        }
        let rows = self.iota(-2, DType::I32).expand_dims(-1);
        let cols = self.iota(-1, DType::I32);
        // `j - i` lies in (-2^31, 2^31) for any dims an i32 iota holds, and
        // a `k` beyond i32 keeps all or nothing just as the clamped one.
        let offset = cols - rows;
        let k = k.clamp(i32::MIN.into(), i32::MAX.into());
        let keep = match triangle {
            Triangle::Lower => offset.less_equal(k),
            Triangle::Upper => offset.greater_equal(k),
        };
        keep.select(self, 0)
    }
}

/// Which triangle [`Array::tril`] and [`Array::triu`] keep.
#[derive(Clone, Copy)]
enum Triangle {
    Lower,
    Upper,
}

/// `where(cond, on_true, on_false)`.
#[track_caller]
pub fn select(cond: &Array, on_true: impl Operand, on_false: impl Operand) -> Array {
    cond.select(on_true, on_false)
}

const OP: &str = "where";

/// The output aval: the broadcast shape of all three operands with the
/// dtype of `a` and `b`; `cond` must be bool.
pub fn shape_rule(cond: &Aval, a: &Aval, b: &Aval, cx: &mut ShapeCx) -> Result<Aval> {
    if cond.dtype != DType::Bool {
        return Err(dtype_err(
            OP,
            &[cond, a, b],
            format!("condition must be bool, got {}", cond.dtype),
        ));
    }
    let dtype = require_same_dtype(OP, a, b)?;
    let shape = broadcast_shapes(OP, &[cond, a, b], cx)?;
    Ok(Aval::new(shape, dtype))
}

/// Reference evaluation: `a` where `cond` holds, else `b`, broadcast.
pub fn eval(inputs: &[&HostData], in_shapes: &[&[usize]], out_shape: &[usize]) -> Result<HostData> {
    let ([cond, a, b], [cs, a_shape, b_shape]) = (inputs, in_shapes) else {
        return Err(arg_err(OP, "expects 3 operands"));
    };
    let HostData::Bool(c) = cond else {
        return Err(eval_dtype_err(
            OP,
            &[cond.dtype()],
            "condition must be bool",
        ));
    };
    let shapes = Shapes {
        cond: cs,
        a: a_shape,
        b: b_shape,
        out: out_shape,
    };
    let mismatch = || eval_dtype_err(OP, &[a.dtype(), b.dtype()], "operand dtypes differ");
    Ok(match (a, b) {
        (HostData::F32(x), HostData::F32(y)) => select_typed(c, x, y, &shapes),
        (HostData::F16(x), HostData::F16(y)) => select_typed(c, x, y, &shapes),
        (HostData::BF16(x), HostData::BF16(y)) => select_typed(c, x, y, &shapes),
        (HostData::I32(x), HostData::I32(y)) => select_typed(c, x, y, &shapes),
        (HostData::U32(x), HostData::U32(y)) => select_typed(c, x, y, &shapes),
        (HostData::U8(x), HostData::U8(y)) => select_typed(c, x, y, &shapes),
        (HostData::Bool(x), HostData::Bool(y)) => select_typed(c, x, y, &shapes),
        _ => return Err(mismatch()),
    })
}

struct Shapes<'s> {
    cond: &'s [usize],
    a: &'s [usize],
    b: &'s [usize],
    out: &'s [usize],
}

fn select_typed<T: HostElement>(c: &[bool], a: &[T], b: &[T], shapes: &Shapes<'_>) -> HostData {
    let n = numel(shapes.out);
    if c.len() == n && a.len() == n && b.len() == n {
        return T::wrap(
            c.iter()
                .zip(a)
                .zip(b)
                .map(|((&c, &x), &y)| if c { x } else { y })
                .collect(),
        );
    }
    let sc = broadcast_strides(shapes.cond, shapes.out);
    let sa = broadcast_strides(shapes.a, shapes.out);
    let sb = broadcast_strides(shapes.b, shapes.out);
    let mut out = Vec::with_capacity(n);
    for_each_offset(shapes.out, [&sc, &sa, &sb], |[i, j, k]| {
        out.push(if c[i] { a[j] } else { b[k] })
    });
    T::wrap(out)
}

/// The cotangents of `where(cond, a, b)`: none for the condition, and `g`
/// where each branch was taken, summed over its broadcast axes.
pub(crate) fn vjp(cond: &Array, a: &Array, b: &Array, g: &Array) -> [Option<Array>; 3] {
    let zero = Array::scalar(0.0, g.dtype());
    let on_true = cond.select(g, &zero);
    let on_false = cond.select(&zero, g);
    [
        None,
        Some(crate::ops::binary::unbroadcast(&on_true, a.shape())),
        Some(crate::ops::binary::unbroadcast(&on_false, b.shape())),
    ]
}

/// The tangent of `y = where(cond, a, b)`: `ta` where the condition holds,
/// `tb` elsewhere (zero for a branch without one), in `y`'s shape.
pub(crate) fn jvp(cond: &Array, y: &Array, ta: Option<Array>, tb: Option<Array>) -> Option<Array> {
    if ta.is_none() && tb.is_none() {
        return None;
    }
    let zero = || Array::scalar(0.0, y.dtype());
    let picked = cond.select(ta.unwrap_or_else(zero), tb.unwrap_or_else(zero));
    Some(crate::ops::binary::broadcast_like(picked, y))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::shape::{Dim, Shape, Symbol};

    #[test]
    fn picks_a_where_true_with_broadcasting() {
        let cond = HostData::Bool(vec![true, false]);
        let a = HostData::F32(vec![1.0, 2.0, 3.0]);
        let b = HostData::F32(vec![-1.0]);
        let out = eval(&[&cond, &a, &b], &[&[2, 1], &[3], &[]], &[2, 3]);
        assert_eq!(
            out,
            Ok(HostData::F32(vec![1.0, 2.0, 3.0, -1.0, -1.0, -1.0]))
        );
    }

    #[test]
    fn equal_shapes_take_the_fast_path() {
        let cond = HostData::Bool(vec![false, true]);
        let a = HostData::I32(vec![1, 2]);
        let b = HostData::I32(vec![3, 4]);
        assert_eq!(
            eval(&[&cond, &a, &b], &[&[2], &[2], &[2]], &[2]),
            Ok(HostData::I32(vec![3, 2]))
        );
    }

    #[test]
    fn size_zero_output_is_empty() {
        let cond = HostData::Bool(vec![]);
        let a = HostData::U8(vec![1]);
        let out = eval(&[&cond, &a, &a], &[&[0], &[1], &[1]], &[0]);
        assert_eq!(out, Ok(HostData::U8(vec![])));
    }

    #[test]
    fn shape_rule_broadcasts_all_three() {
        let mut cx = ShapeCx::new();
        let out = shape_rule(
            &Aval::new([2, 1], DType::Bool),
            &Aval::new([3], DType::F16),
            &Aval::new([], DType::F16),
            &mut cx,
        );
        assert_eq!(out, Ok(Aval::new([2, 3], DType::F16)));
    }

    #[test]
    fn condition_must_be_bool() {
        let f = Aval::new([2], DType::F32);
        let err = shape_rule(&f, &f, &f, &mut ShapeCx::new()).unwrap_err();
        assert!(matches!(err, Error::DType { .. }));
        assert!(format!("{err}").contains("where"));
    }

    #[test]
    fn incompatible_shapes_name_every_operand() {
        let err = shape_rule(
            &Aval::new([2], DType::Bool),
            &Aval::new([3], DType::F32),
            &Aval::new([3], DType::F32),
            &mut ShapeCx::new(),
        )
        .unwrap_err();
        assert!(matches!(err, Error::Shape { .. }));
        let msg = format!("{err}");
        assert!(
            msg.contains("where") && msg.contains("bool[2]") && msg.contains("f32[3]"),
            "{msg}"
        );
    }

    #[test]
    fn symbolic_condition_broadcasts_against_known_one() {
        let s0 = Dim::symbol(Symbol(0));
        let mut cx = ShapeCx::new();
        let out = shape_rule(
            &Aval::new(Shape(vec![s0.clone(), Dim::Known(1)]), DType::Bool),
            &Aval::new([5], DType::F32),
            &Aval::new([1], DType::F32),
            &mut cx,
        );
        assert_eq!(
            out,
            Ok(Aval::new(Shape(vec![s0, Dim::Known(5)]), DType::F32))
        );
        assert!(cx.guards.is_empty());
    }

    use crate::compile::rule_checks as rules;

    #[test]
    fn select_jvp_takes_the_chosen_branchs_tangent() {
        let cond = Array::from_vec(vec![true, false, true], &[3]).unwrap();
        let f = move |x: (Array, Array)| cond.select(&x.0, &x.1);
        let primals = (
            rules::array(&[1.0, 2.0, 3.0], &[3]),
            rules::array(&[4.0, 5.0, 6.0], &[3]),
        );
        let tangents = (
            rules::array(&[10.0, 20.0, 30.0], &[3]),
            rules::array(&[40.0, 50.0, 60.0], &[3]),
        );
        let (_, t) = crate::jvp(f, &primals, &tangents).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), [10.0, 50.0, 30.0]);
    }

    #[test]
    fn select_batches_a_batched_condition_against_batched_branches() {
        let xs = rules::normal(7, &[3, 2, 4]);
        let ys = rules::normal(8, &[3, 4]);
        let f = |x: Vec<Array>| x[0].greater(&x[1]).select(&x[0], &x[1]);
        let report = rules::assert_batches_like_stacking("where", f, &[xs, ys]);
        assert!(
            report.vmap_fallbacks.is_empty(),
            "{:?}",
            report.vmap_fallbacks
        );
    }
    /// `x` (f32, shape `[.., m, n]`) with entries failing `keep(j - i)` zeroed, by loops.
    fn triangle_reference(x: &[f32], m: usize, n: usize, keep: impl Fn(i64) -> bool) -> Vec<f32> {
        let mut out = x.to_vec();
        for (at, value) in out.iter_mut().enumerate() {
            let (i, j) = ((at / n) % m, at % n);
            if !keep(j as i64 - i as i64) {
                *value = 0.0;
            }
        }
        out
    }

    fn counting(shape: &[usize]) -> (Vec<f32>, Array) {
        let len = shape.iter().product::<usize>();
        let values: Vec<f32> = (1..=len).map(|v| v as f32).collect();
        let array = Array::from_vec(values.clone(), shape).unwrap();
        (values, array)
    }

    #[test]
    fn tril_keeps_entries_on_and_below_diagonal_k_of_each_matrix() {
        let (values, x) = counting(&[2, 3, 4]);
        for k in [-4, -1, 0, 2, 9] {
            let got = x.tril(k).to_vec::<f32>().unwrap();
            assert_eq!(
                got,
                triangle_reference(&values, 3, 4, |d| d <= k),
                "k = {k}"
            );
        }
    }

    #[test]
    fn triu_keeps_entries_on_and_above_diagonal_k_of_each_matrix() {
        let (values, x) = counting(&[2, 4, 3]);
        for k in [-5, -1, 0, 1, 3] {
            let got = x.triu(k).to_vec::<f32>().unwrap();
            assert_eq!(
                got,
                triangle_reference(&values, 4, 3, |d| d >= k),
                "k = {k}"
            );
        }
        let huge = x.triu(i64::MIN).to_vec::<f32>().unwrap();
        assert_eq!(huge, values);
    }

    #[test]
    fn triangles_are_named_compositions_and_reject_vectors() {
        let (_, x) = counting(&[3, 3]);
        assert_eq!(x.tril(0).composition(), Some("tril"));
        let err = counting(&[4]).1.triu(0).check().unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("triu") && msg.contains("rank 1"), "{msg}");
    }

    #[test]
    fn tril_under_shapeless_compile_follows_each_calls_sizes() {
        let causal = crate::compile(|x: Array| x.tril(0)).shapeless();
        for (m, n) in [(2, 3), (4, 4)] {
            let (values, x) = counting(&[m, n]);
            let got = causal.call(&x).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(got, triangle_reference(&values, m, n, |d| d <= 0));
        }
        assert_eq!(causal.cache().entries, 1);
    }

    #[test]
    fn tril_batches_like_stacking() {
        let xs = crate::compile::rule_checks::normal(31, &[3, 4, 4]);
        let f = |x: Vec<Array>| x[0].tril(-1);
        crate::compile::rule_checks::assert_batches_like_stacking("tril", f, &[xs]);
    }
}
