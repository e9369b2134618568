//! NumPy `take` along one axis: shape rule and reference evaluation.

use super::batching::{folded_indices, Batched};
use super::strided::numel;
use crate::data::{HostData, HostElement};
use crate::error::{arg_err, dtype_err, Error, Result};
use crate::handle::array::Array;
use crate::ops::Op;
use crate::shape::{Aval, Dim, Shape};
use crate::DType;

impl Array {
    /// NumPy `take`: entries along `axis` picked by integer `indices`.
    pub fn take(&self, indices: &Array, axis: isize) -> Array {
        if indices.error().is_some() && self.error().is_none() {
            return indices.clone();
        }
        match self.normalize_axis("take", axis) {
            Ok(axis) => Array::apply(Op::Take { axis }, vec![self.clone(), indices.clone()]),
            Err(e) => Array::failed(e),
        }
    }
}

const OP: &str = "take";

/// The output aval: `x.shape[..axis] ++ indices.shape ++ x.shape[axis+1..]`
/// with the dtype of `x`; indices must be i32 or u32.
pub fn take_shape_rule(axis: usize, x: &Aval, indices: &Aval) -> Result<Aval> {
    let rank = x.shape.rank();
    if axis >= rank {
        return Err(arg_err(OP, format!("axis {axis} is out of range for {x}")));
    }
    if !matches!(indices.dtype, DType::I32 | DType::U32) {
        return Err(dtype_err(
            OP,
            &[x, indices],
            format!("indices must be i32 or u32, got {}", indices.dtype),
        ));
    }
    let dims = x.shape.dims();
    let out = dims[..axis]
        .iter()
        .chain(indices.shape.dims())
        .chain(&dims[axis + 1..])
        .cloned()
        .collect();
    Ok(Aval::new(Shape(out), x.dtype))
}

/// Reference take: negative i32 indices wrap once (NumPy); anything still
/// outside `[0, n)` is a runtime error.
pub fn take_eval(
    axis: usize,
    x: &HostData,
    x_shape: &[usize],
    indices: &HostData,
    out_shape: &[usize],
) -> Result<HostData> {
    let Some(&n) = x_shape.get(axis) else {
        return Err(arg_err(
            OP,
            format!("axis {axis} is out of range for shape {x_shape:?}"),
        ));
    };
    let positions = resolve_indices(OP, axis, n, x.dtype(), indices)?;
    let outer = numel(&x_shape[..axis]);
    let inner = numel(&x_shape[axis + 1..]);
    let out = crate::with_host_data!(x, v => HostElement::wrap(take_typed(v, &positions, outer, n, inner)));
    debug_assert_eq!(out.len(), numel(out_shape), "take output size");
    Ok(out)
}

/// The positions along an axis of size `n` that `indices` (i32 or u32)
/// name: negative i32 indices wrap once (NumPy); anything still outside
/// `[0, n)` is a runtime error of `op`. `take` and its transpose
/// `scatter_add` share it so both read indices alike.
pub(crate) fn resolve_indices(
    op: &str,
    axis: usize,
    n: usize,
    data_dtype: DType,
    indices: &HostData,
) -> Result<Vec<usize>> {
    let out_of_range = |i: i64| Error::Runtime {
        op: op.to_string(),
        detail: format!("index {i} out of range for axis {axis} of size {n}"),
    };
    let resolve = |i: i64| {
        let j = if i < 0 { i + n as i64 } else { i };
        usize::try_from(j)
            .ok()
            .filter(|&j| j < n)
            .ok_or_else(|| out_of_range(i))
    };
    match indices {
        HostData::I32(v) => v.iter().map(|&i| resolve(i64::from(i))).collect(),
        HostData::U32(v) => v.iter().map(|&i| resolve(i64::from(i))).collect(),
        other => Err(Error::DType {
            op: op.to_string(),
            detail: format!("indices must be i32 or u32, got {}", other.dtype()),
            operands: format!("{}, {}", data_dtype, other.dtype()),
        }),
    }
}

/// Copies the `inner`-long rows at `positions` from each of the `outer`
/// blocks of a `[outer, n, inner]` view.
fn take_typed<T: Copy>(
    v: &[T],
    positions: &[usize],
    outer: usize,
    n: usize,
    inner: usize,
) -> Vec<T> {
    let mut out = Vec::with_capacity(outer * positions.len() * inner);
    for o in 0..outer {
        for &p in positions {
            let start = (o * n + p) * inner;
            out.extend_from_slice(&v[start..start + inner]);
        }
    }
    out
}

/// The cotangents of `take(x, indices)`: `g` added back at the taken
/// positions (repeated indices accumulate), none for the indices.
pub(crate) fn vjp(axis: usize, x: &Array, indices: &Array, g: &Array) -> [Option<Array>; 2] {
    let size = x.shape().dims()[axis].clone();
    [Some(g.scatter_add(indices, axis, size)), None]
}

/// The batched take: batched values with shared indices take along the
/// shifted axis; shared values with batched indices take as they are (the
/// batch axis lands inside the index dims). When both are batched, the
/// examples fold into the indexed axis (`[B·n, ...]`, the indexed axis
/// moved next to the batch first) and each example's indices are offset
/// to its own rows ([`folded_indices`]): one take for every example.
pub(crate) fn batch(axis: usize, x: &Batched, indices: &Batched, size: &Dim) -> Batched {
    match (x.axis, indices.axis) {
        (Some(_), None) => Batched::along(
            Array::apply(
                Op::Take { axis: axis + 1 },
                vec![x.front(), indices.value.clone()],
            ),
            0,
        ),
        (None, Some(i)) => Batched::along(
            Array::apply(
                Op::Take { axis },
                vec![x.value.clone(), indices.value.clone()],
            ),
            axis + i,
        ),
        _ => {
            let front = x.front();
            let rank = front.ndim();
            // [B, pre.., n, rest..] → [B, n, pre.., rest..] → [B·n, pre.., rest..]
            let mut perm = vec![0, axis + 1];
            perm.extend(1..=axis);
            perm.extend(axis + 2..rank);
            let moved = front.permute(&perm);
            let dims = moved.shape().dims();
            let mut folded = vec![dims[0].mul(&dims[1])];
            folded.extend(dims[2..].iter().cloned());
            let count = Array::apply(
                Op::DimSize {
                    axes: vec![axis + 1],
                    dtype: indices.value.dtype(),
                },
                vec![front.clone()],
            );
            let offsets = folded_indices(indices, &count, size, true);
            let index_rank = indices.rank();
            // [B, k.., pre.., rest..] → [B, pre.., k.., rest..]
            let taken = Array::apply(
                Op::Take { axis: 0 },
                vec![moved.reshape_to(Shape(folded)), offsets],
            );
            let mut back = vec![0];
            back.extend(1 + index_rank..1 + index_rank + axis);
            back.extend(1..1 + index_rank);
            back.extend(1 + index_rank + axis..taken.ndim());
            Batched::along(taken.permute(&back), 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::Symbol;

    #[test]
    fn takes_rows_along_axis_zero() {
        let x = HostData::F32(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let idx = HostData::I32(vec![2, 0, 2]);
        let out = take_eval(0, &x, &[3, 2], &idx, &[3, 2]);
        assert_eq!(out, Ok(HostData::F32(vec![5.0, 6.0, 1.0, 2.0, 5.0, 6.0])));
    }

    #[test]
    fn takes_columns_along_last_axis_with_negative_index() {
        let x = HostData::I32(vec![1, 2, 3, 4, 5, 6]);
        let idx = HostData::I32(vec![-1, 0]);
        assert_eq!(
            take_eval(1, &x, &[2, 3], &idx, &[2, 2]),
            Ok(HostData::I32(vec![3, 1, 6, 4]))
        );
    }

    #[test]
    fn out_of_range_index_is_a_runtime_error() {
        let x = HostData::F32(vec![0.0; 5]);
        let err = take_eval(0, &x, &[5], &HostData::U32(vec![7]), &[1]).unwrap_err();
        assert_eq!(
            err,
            Error::Runtime {
                op: "take".into(),
                detail: "index 7 out of range for axis 0 of size 5".into()
            }
        );
        assert!(take_eval(0, &x, &[5], &HostData::I32(vec![-6]), &[1]).is_err());
        let empty = HostData::F32(vec![]);
        assert!(take_eval(0, &empty, &[0], &HostData::I32(vec![0]), &[1]).is_err());
    }

    #[test]
    fn empty_indices_give_empty_output() {
        let x = HostData::U8(vec![1, 2, 3]);
        assert_eq!(
            take_eval(0, &x, &[3], &HostData::I32(vec![]), &[0]),
            Ok(HostData::U8(vec![]))
        );
    }

    #[test]
    fn shape_rule_splices_index_shape() {
        let x = Aval::new(
            Shape(vec![Dim::Known(4), Dim::symbol(Symbol(0)), Dim::Known(5)]),
            DType::F16,
        );
        let idx = Aval::new([2, 3], DType::U32);
        let out = take_shape_rule(1, &x, &idx).unwrap();
        assert_eq!(out, Aval::new([4, 2, 3, 5], DType::F16));
    }

    #[test]
    fn shape_rule_rejects_float_indices_and_bad_axis() {
        let x = Aval::new([4], DType::F32);
        let err = take_shape_rule(0, &x, &Aval::new([2], DType::F32)).unwrap_err();
        assert!(matches!(err, Error::DType { .. }));
        let msg = format!("{err}");
        assert!(
            msg.contains("take") && msg.contains("f32[4]") && msg.contains("f32[2]"),
            "{msg}"
        );
        assert!(matches!(
            take_shape_rule(1, &x, &Aval::new([2], DType::I32)),
            Err(Error::InvalidArgument { .. })
        ));
    }

    use crate::compile::rule_checks as rules;

    #[test]
    fn take_jvp_takes_the_tangent_at_the_same_indices() {
        let idx = Array::from_vec(vec![2i32, 0, -1], &[3]).unwrap();
        let f = move |x: Vec<Array>| x[0].take(&idx, 1);
        rules::assert_jvp_matches_central_difference("take", f, &[rules::normal(25, &[2, 3])]);
    }

    #[test]
    fn take_batches_per_example_values_and_indices_without_a_loop() {
        let xs = rules::normal(26, &[3, 4, 5]);
        let idx = Array::from_vec(vec![0i32, 4, -1, 2, 3, -5], &[3, 2]).unwrap();
        let f = |x: Vec<Array>| x[0].cast(DType::F32).take(&x[1].cast(DType::I32), 1);
        let report = rules::assert_batches_like_stacking("take", f, &[xs, idx.cast(DType::F32)]);
        assert!(
            report.vmap_fallbacks.is_empty(),
            "{:?}",
            report.vmap_fallbacks
        );
    }
}
