//! NumPy `take` along one axis: shape rule and reference evaluation; and
//! the index compositions built from other ops, `one_hot` and
//! `take_along_axis`.

use super::batching::{folded_indices, Batched};
use super::strided::numel;
use crate::data::{HostData, HostElement};
use crate::error::{arg_err, dtype_err, shape_err, Error, Result};
use crate::handle::array::Array;
use crate::location::in_composition;
use crate::ops::Op;
use crate::shape::{Aval, Dim, Shape};
use crate::DType;

impl Array {
    /// NumPy `take`: entries along `axis` picked by integer `indices`.
    #[track_caller]
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

impl Array {
    /// One-hot rows of integer indices: an array of shape
    /// `self.shape ++ [num_classes]` and `dtype`, 1 at each index's class
    /// and 0 elsewhere. An index outside `[0, num_classes)` (negative ones
    /// included) gives an all-zero row, as `jax.nn.one_hot`. Built from a
    /// comparison with a range and a cast.
    ///
    /// ```
    /// use kiln::{Array, DType};
    /// let tokens = Array::from_vec(vec![2i32, 0, 5], &[3])?;
    /// let rows = tokens.one_hot(3, DType::F32).to_vec::<f32>()?;
    /// assert_eq!(rows, [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn one_hot(&self, num_classes: usize, dtype: DType) -> Array {
        in_composition("one_hot", || {
            self.one_hot_checked(num_classes, dtype)
                .unwrap_or_else(Array::failed)
        })
    }

    fn one_hot_checked(&self, num_classes: usize, dtype: DType) -> Result<Array> {
        const OP: &str = "one_hot";
        self.first_error()?;
        let indices = comparable_indices(OP, self)?;
        let class_dtype = indices.dtype();
        let fits = class_dtype
            .integer_range()
            .is_some_and(|range| num_classes as i128 <= range.end() + 1);
        if !fits {
            return Err(arg_err(
                OP,
                format!("{num_classes} classes do not fit the {class_dtype} indices"),
            ));
        }
        let classes = Array::arange(0.0, num_classes as f64, 1.0, class_dtype)?;
        Ok(indices.expand_dims(-1).equal(&classes).cast(dtype))
    }

    /// `jax.numpy.take_along_axis`: `out[.., j, ..] = self[.., indices[.., j, ..], ..]`
    /// with `j` at `axis`. `indices` has the rank of `self`; their other
    /// dims broadcast against each other, and the output has the
    /// broadcast shape with `indices`' size at `axis`. Indices in
    /// `[-n, n)` pick as in JAX (negative ones count from the end); one
    /// outside it gives 0 (JAX fills NaN for floats).
    ///
    /// Built as a one-hot selection rather than a gather: a mask
    /// `indices == position` over a new axis picks with `select` and a sum
    /// takes the one picked entry. It therefore differentiates through
    /// `select`'s and `sum`'s rules, batches, runs on every backend, works
    /// with symbolic dims, and a NaN or infinity elsewhere along `axis`
    /// does not leak into the result. The price is memory and work of the
    /// broadcast shape times `n` (the size of `axis`): cheap for picking a
    /// few entries per row (a loss's targets), quadratic for a full
    /// permutation of a long axis.
    ///
    /// ```
    /// use kiln::{Array, DType};
    /// let logits = Array::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    /// let targets = Array::from_vec(vec![2i32, -3], &[2, 1])?;
    /// let picked = logits.take_along_axis(&targets, -1);
    /// assert_eq!(picked.to_vec::<f32>()?, [3.0, 4.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn take_along_axis(&self, indices: &Array, axis: isize) -> Array {
        in_composition("take_along_axis", || {
            self.take_along_axis_checked(indices, axis)
                .unwrap_or_else(Array::failed)
        })
    }

    fn take_along_axis_checked(&self, indices: &Array, axis: isize) -> Result<Array> {
        const OP: &str = "take_along_axis";
        self.first_error()?;
        indices.first_error()?;
        let rank = self.ndim();
        if indices.ndim() != rank {
            return Err(shape_err(
                OP,
                &[self.aval(), indices.aval()],
                format!(
                    "indices need the array's rank {rank}, got rank {}",
                    indices.ndim()
                ),
            ));
        }
        let axis = self.normalize_axis(OP, axis)?;
        let mut indices = comparable_indices(OP, indices)?;
        if indices.dtype() == DType::I32 {
            let size = Array::apply(
                Op::DimSize {
                    axes: vec![axis],
                    dtype: DType::I32,
                },
                vec![self.clone()],
            );
            indices = indices.less(0).select(&indices + &size, &indices);
        }
        // Positions along `axis`, placed at the new axis `axis + 1` of the
        // mask `[.., j, p, ..]`.
        let mut positions = self.iota(axis as isize, indices.dtype());
        for _ in axis + 1..rank {
            positions = positions.expand_dims(-1);
        }
        let hit = indices.expand_dims(axis as isize + 1).equal(&positions);
        // `sum` takes no bools; a bool array picks through u8.
        let values = match self.dtype() {
            DType::Bool => self.cast(DType::U8),
            _ => self.clone(),
        };
        let picked = hit
            .select(values.expand_dims(axis as isize), 0)
            .sum(&[axis as isize + 1], false);
        Ok(match self.dtype() {
            DType::Bool => picked.cast(DType::Bool),
            _ => picked,
        })
    }
}

/// Integer `indices` in a dtype that holds every position an iota of a
/// dim makes: u32 stays, i32 stays, u8 widens to i32; others fail.
fn comparable_indices(op: &str, indices: &Array) -> Result<Array> {
    match indices.dtype() {
        DType::I32 | DType::U32 => Ok(indices.clone()),
        DType::U8 => Ok(indices.cast(DType::I32)),
        other => Err(dtype_err(
            op,
            &[indices.aval()],
            format!("indices must be an integer dtype (i32, u32, u8), got {other}"),
        )),
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
            at: None,
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
    /// `one_hot` by loops: row `r` has a 1 at `indices[r]` when in range.
    fn one_hot_reference(indices: &[i64], classes: usize) -> Vec<f32> {
        let mut out = vec![0.0; indices.len() * classes];
        for (row, &index) in indices.iter().enumerate() {
            if (0..classes as i64).contains(&index) {
                out[row * classes + index as usize] = 1.0;
            }
        }
        out
    }

    #[test]
    fn one_hot_marks_each_class_and_zeroes_out_of_range_rows() {
        let raw = [3i32, 0, -1, 4, 2, 7];
        let indices = Array::from_vec(raw.to_vec(), &[2, 3]).unwrap();
        let got = indices.one_hot(4, DType::F32);
        assert_eq!(got.dims(), Some(vec![2, 3, 4]));
        let want = one_hot_reference(&raw.map(i64::from), 4);
        assert_eq!(got.to_vec::<f32>().unwrap(), want);
        assert_eq!(got.composition(), Some("one_hot"));
    }

    #[test]
    fn one_hot_takes_unsigned_indices_and_any_output_dtype() {
        let bytes = Array::from_vec(vec![1u8, 255, 0], &[3]).unwrap();
        let got = bytes.one_hot(300, DType::I32).to_vec::<i32>().unwrap();
        let want = one_hot_reference(&[1, 255, 0], 300);
        assert_eq!(got, want.iter().map(|&v| v as i32).collect::<Vec<_>>());
        let wide = Array::from_vec(vec![2u32], &[1]).unwrap();
        let got = wide.one_hot(3, DType::Bool).to_vec::<bool>().unwrap();
        assert_eq!(got, [false, false, true]);
    }

    #[test]
    fn one_hot_rejects_float_indices() {
        let x = Array::from_vec(vec![1.0f32], &[1]).unwrap();
        let err = x.one_hot(2, DType::F32).check().unwrap_err();
        assert!(
            matches!(&err, Error::DType { op, .. } if op == "one_hot"),
            "{err}"
        );
    }

    /// `take_along_axis` by loops over `x` of shape `[a, b]` and indices
    /// of shape `[c, d]` (broadcast with `x` off `axis`), wrapping
    /// negative indices once and giving 0 outside `[-n, n)`.
    fn take_along_reference(
        x: &[f32],
        x_dims: [usize; 2],
        indices: &[i32],
        i_dims: [usize; 2],
        axis: usize,
    ) -> Vec<f32> {
        let other = 1 - axis;
        let n = x_dims[axis] as i32;
        let out_other = x_dims[other].max(i_dims[other]);
        let mut out_dims = [0; 2];
        out_dims[axis] = i_dims[axis];
        out_dims[other] = out_other;
        let mut out = Vec::new();
        for r in 0..out_dims[0] {
            for c in 0..out_dims[1] {
                let at =
                    |dims: [usize; 2], p: [usize; 2]| (p[0] % dims[0]) * dims[1] + (p[1] % dims[1]);
                let index = indices[at(i_dims, [r, c])];
                let wrapped = if index < 0 { index + n } else { index };
                let mut source = [r, c];
                if (0..n).contains(&wrapped) {
                    source[axis] = wrapped as usize;
                    out.push(x[at(x_dims, source)]);
                } else {
                    out.push(0.0);
                }
            }
        }
        out
    }

    #[test]
    fn take_along_axis_picks_per_row_entries_on_either_axis() {
        let x: Vec<f32> = (0..12).map(|v| v as f32 * 1.5 - 4.0).collect();
        let xa = Array::from_vec(x.clone(), &[3, 4]).unwrap();
        let rows = [3i32, -1, 0, 1, 2, -4];
        let last = Array::from_vec(rows.to_vec(), &[3, 2]).unwrap();
        let got = xa.take_along_axis(&last, -1).to_vec::<f32>().unwrap();
        assert_eq!(got, take_along_reference(&x, [3, 4], &rows, [3, 2], 1));
        let cols = [2i32, 0, 1, -3];
        let first = Array::from_vec(cols.to_vec(), &[1, 4]).unwrap();
        let got = xa.take_along_axis(&first, 0).to_vec::<f32>().unwrap();
        assert_eq!(got, take_along_reference(&x, [3, 4], &cols, [1, 4], 0));
    }

    #[test]
    fn take_along_axis_broadcasts_other_dims_and_zeroes_out_of_range() {
        let x = vec![1.0f32, 2.0, 3.0];
        let xa = Array::from_vec(x.clone(), &[1, 3]).unwrap();
        let raw = [2i32, 3, -4, 0];
        let indices = Array::from_vec(raw.to_vec(), &[4, 1]).unwrap();
        let got = xa.take_along_axis(&indices, 1);
        assert_eq!(got.dims(), Some(vec![4, 1]));
        let want = take_along_reference(&x, [1, 3], &raw, [4, 1], 1);
        assert_eq!(got.to_vec::<f32>().unwrap(), want);
        assert_eq!(want, [3.0, 0.0, 0.0, 1.0]);
    }

    #[test]
    fn take_along_axis_keeps_non_finite_values_out_of_other_picks() {
        let x = Array::from_vec(vec![f32::NEG_INFINITY, 2.0, f32::NAN, 4.0], &[2, 2]).unwrap();
        let indices = Array::from_vec(vec![1i32, 1], &[2, 1]).unwrap();
        let got = x.take_along_axis(&indices, 1).to_vec::<f32>().unwrap();
        assert_eq!(got, [2.0, 4.0]);
    }

    #[test]
    fn take_along_axis_works_for_integer_and_bool_arrays() {
        let ints = Array::from_vec(vec![5u8, 6, 7, 8], &[2, 2]).unwrap();
        let idx = Array::from_vec(vec![1u32, 0], &[2, 1]).unwrap();
        let got = ints.take_along_axis(&idx, 1).to_vec::<u8>().unwrap();
        assert_eq!(got, [6, 7]);
        let flags = Array::from_vec(vec![true, false, false, true], &[2, 2]).unwrap();
        let got = flags.take_along_axis(&idx, 1);
        assert_eq!(got.dtype(), DType::Bool);
        assert_eq!(got.to_vec::<bool>().unwrap(), [false, false]);
    }

    #[test]
    fn take_along_axis_rejects_rank_mismatch_and_float_indices() {
        let x = Array::zeros(&[2, 3], DType::F32);
        let flat = Array::from_vec(vec![0i32, 1], &[2]).unwrap();
        let err = x.take_along_axis(&flat, 1).check().unwrap_err().to_string();
        assert!(
            err.contains("take_along_axis") && err.contains("rank 1"),
            "{err}"
        );
        let floats = Array::zeros(&[2, 1], DType::F32);
        let err = x.take_along_axis(&floats, 1).check().unwrap_err();
        assert!(matches!(err, Error::DType { .. }), "{err}");
        let err = x
            .take_along_axis(&flat.reshape(&[2, 1]), 2)
            .check()
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    }

    #[test]
    fn take_along_axis_jvp_matches_central_difference() {
        let idx = Array::from_vec(vec![2i32, 0, -1, 1, 1, 0], &[2, 3]).unwrap();
        let f = move |x: Vec<Array>| x[0].take_along_axis(&idx, 1);
        let x = rules::normal(27, &[2, 4]);
        rules::assert_jvp_matches_central_difference("take_along_axis", f, &[x]);
    }

    #[test]
    fn take_along_axis_batches_values_and_indices_like_stacking() {
        let xs = rules::normal(28, &[3, 2, 5]);
        let idx = Array::from_vec(vec![0i32, 4, -1, 2, 3, -5, 1, 1, 0, 2, 4, -2], &[3, 2, 2]);
        let idx = idx.unwrap();
        let f = |x: Vec<Array>| x[0].take_along_axis(&x[1].cast(DType::I32), 1);
        rules::assert_batches_like_stacking("take_along_axis", f, &[xs, idx.cast(DType::F32)]);
    }
}
