//! Ops that move elements without computing on them: reshape, permute,
//! broadcast, slice, concat, and the two ops that read only their
//! operand's shape (the dim-size scalar and iota). Shape rules and
//! reference evaluation.

use super::batching::Batched;
use super::strided::{broadcast_strides, gather, numel, row_major_strides};
use super::ShapeCx;
use crate::data::{HostData, HostElement};
use crate::error::{arg_err, dtype_err, shape_err, Result};
use crate::handle::array::{normalize_axis, Array};
use crate::ops::Op;
use crate::shape::{Aval, Dim, Shape, SymExpr};
use crate::DType;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fmt;

impl Array {
    /// Same elements in a new shape; one entry may be `-1` (inferred).
    #[track_caller]
    pub fn reshape(&self, shape: &[i64]) -> Array {
        match self.infer_reshape(shape) {
            Ok(target) => self.reshape_to(target),
            Err(e) => Array::failed(e),
        }
    }

    fn infer_reshape(&self, shape: &[i64]) -> Result<Shape> {
        self.first_error()?;
        let infer: Vec<usize> = (0..shape.len()).filter(|&i| shape[i] == -1).collect();
        if infer.len() > 1 || shape.iter().any(|&d| d < -1) {
            return Err(arg_err(
                "reshape",
                format!("target {shape:?} may hold one -1 and otherwise sizes ≥ 0"),
            ));
        }
        // Saturating: the result's size check rejects an absurd target.
        let known = shape
            .iter()
            .filter(|&&d| d >= 0)
            .fold(1usize, |acc, &d| acc.saturating_mul(d as usize));
        let mut dims: Vec<Dim> = shape
            .iter()
            .map(|&d| Dim::Known(d.max(0) as usize))
            .collect();
        if let Some(&i) = infer.first() {
            let numel = self.shape().numel();
            dims[i] = match numel {
                Dim::Known(n) if known == 0 || n % known != 0 => {
                    return Err(crate::error::shape_err(
                        "reshape",
                        &[self.aval()],
                        format!("cannot infer -1 in {shape:?}: {n} elements are not a multiple of {known}"),
                    ))
                }
                Dim::Known(n) => Dim::Known(n / known),
                // Eager refuses whatever the element count; so must a
                // shapeless trace, whose count is only known per call.
                Dim::Sym(_) if known == 0 => {
                    return Err(crate::error::shape_err(
                        "reshape",
                        &[self.aval()],
                        format!("cannot infer -1 in {shape:?}: the other sizes hold no elements"),
                    ))
                }
                Dim::Sym(e) => Dim::from_expr(e.floor_div(known as u64)),
            };
        }
        Ok(Shape(dims))
    }

    /// Same elements in the given shape (dims may be symbolic).
    #[track_caller]
    pub fn reshape_to(&self, shape: impl Into<Shape>) -> Array {
        let shape = shape.into();
        if *self.shape() == shape {
            return self.clone();
        }
        Array::apply(Op::Reshape(shape), vec![self.clone()])
    }

    /// Permutes the axes: output axis `i` is input axis `perm[i]`.
    #[track_caller]
    pub fn permute(&self, perm: &[usize]) -> Array {
        Array::apply(Op::Permute(perm.to_vec()), vec![self.clone()])
    }

    /// Reverses the axes (matrix transpose for rank 2).
    #[track_caller]
    pub fn transpose(&self) -> Array {
        let perm: Vec<usize> = (0..self.ndim()).rev().collect();
        self.permute(&perm)
    }

    /// Swaps two axes.
    #[track_caller]
    pub fn swap_axes(&self, a: isize, b: isize) -> Array {
        let rank = self.ndim();
        match (
            self.normalize_axis("swap_axes", a),
            self.normalize_axis("swap_axes", b),
        ) {
            (Ok(a), Ok(b)) => {
                let mut perm: Vec<usize> = (0..rank).collect();
                perm.swap(a, b);
                self.permute(&perm)
            }
            (Err(e), _) | (_, Err(e)) => Array::failed(e),
        }
    }

    /// NumPy broadcast to `shape`.
    #[track_caller]
    pub fn broadcast_to(&self, shape: impl Into<Shape>) -> Array {
        let shape = shape.into();
        if *self.shape() == shape {
            return self.clone();
        }
        Array::apply(Op::BroadcastTo(shape), vec![self.clone()])
    }

    /// Strided slice with one [`SliceAxis`] per dim.
    #[track_caller]
    pub fn slice(&self, axes: &[SliceAxis]) -> Array {
        Array::apply(Op::Slice(axes.to_vec()), vec![self.clone()])
    }

    /// Slice of one axis: `start..stop` by `step`, other axes whole.
    #[track_caller]
    pub fn slice_axis(&self, axis: isize, start: i64, stop: Option<i64>, step: i64) -> Array {
        match self.normalize_axis("slice", axis) {
            Ok(axis) => {
                let mut axes = vec![SliceAxis::full(); self.ndim()];
                axes[axis] = SliceAxis { start, stop, step };
                self.slice(&axes)
            }
            Err(e) => Array::failed(e),
        }
    }

    /// Inserts a size-1 axis at `axis` (negative counts from the end of the result).
    #[track_caller]
    pub fn expand_dims(&self, axis: isize) -> Array {
        let axis = self
            .first_error()
            .and_then(|()| normalize_axis("expand_dims", axis, self.ndim() + 1));
        match axis {
            Ok(axis) => {
                let mut dims = self.shape().0.clone();
                dims.insert(axis, Dim::Known(1));
                Array::apply(Op::Reshape(Shape(dims)), vec![self.clone()])
            }
            Err(e) => Array::failed(e),
        }
    }

    /// Removes the given size-1 axes (all size-1 axes when empty).
    #[track_caller]
    pub fn squeeze(&self, axes: &[isize]) -> Array {
        if self.error().is_some() {
            return self.clone();
        }
        let dims = &self.shape().0;
        let axes = if axes.is_empty() {
            (0..dims.len())
                .filter(|&i| dims[i] == Dim::Known(1))
                .collect()
        } else {
            match self.normalize_axes("squeeze", axes) {
                Ok(a) => a,
                Err(e) => return Array::failed(e),
            }
        };
        if let Some(&bad) = axes.iter().find(|&&i| dims[i] != Dim::Known(1)) {
            return Array::failed(crate::error::shape_err(
                "squeeze",
                &[self.aval()],
                format!("axis {bad} has size {}, not 1", dims[bad]),
            ));
        }
        let kept: Vec<Dim> = (0..dims.len())
            .filter(|i| !axes.contains(i))
            .map(|i| dims[i].clone())
            .collect();
        Array::apply(Op::Reshape(Shape(kept)), vec![self.clone()])
    }
}

impl Array {
    /// The positions `0, 1, …, n-1` along `axis` (`n` its size there) as a
    /// vector of `dtype`. Only the shape is read, so the range's length may
    /// be a symbolic dim of a shapeless compile (it is known per call).
    ///
    /// ```
    /// use kiln::{Array, DType};
    /// let x = Array::zeros(&[2, 4], DType::F32);
    /// assert_eq!(x.iota(1, DType::I32).to_vec::<i32>().unwrap(), [0, 1, 2, 3]);
    /// ```
    #[track_caller]
    pub fn iota(&self, axis: isize, dtype: DType) -> Array {
        match self.normalize_axis("iota", axis) {
            Ok(axis) => Array::apply(Op::Iota { axis, dtype }, vec![self.clone()]),
            Err(e) => Array::failed(e),
        }
    }
}

/// Concatenates arrays along `axis`.
#[track_caller]
pub fn concat(arrays: &[Array], axis: isize) -> Array {
    if let Some(failed) = arrays.iter().find(|a| a.error().is_some()) {
        return failed.clone();
    }
    let rank = arrays.first().map_or(0, Array::ndim);
    match normalize_axis("concat", axis, rank) {
        Ok(axis) => Array::apply(Op::Concat { axis }, arrays.to_vec()),
        Err(e) => Array::failed(e),
    }
}

/// One axis of a strided slice, NumPy style `start:stop:step` with a
/// positive step. Negative `start`/`stop` count from the end.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SliceAxis {
    /// First index (negative counts from the end).
    pub start: i64,
    /// One past the last index; `None` is the end of the axis.
    pub stop: Option<i64>,
    /// Distance between taken indices (at least 1).
    pub step: i64,
}

impl SliceAxis {
    /// The whole axis, `::`.
    ///
    /// ```
    /// assert_eq!(kiln::SliceAxis::full().to_string(), "::");
    /// ```
    pub fn full() -> SliceAxis {
        SliceAxis {
            start: 0,
            stop: None,
            step: 1,
        }
    }

    /// The concrete start and length on an axis of size `n` (NumPy
    /// normalisation; `step` must be at least 1).
    ///
    /// ```
    /// let axis = kiln::SliceAxis { start: -3, stop: None, step: 2 };
    /// assert_eq!(axis.resolve(5), (2, 2));
    /// ```
    pub fn resolve(&self, n: usize) -> (usize, usize) {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let clamp = |i: i64| if i < 0 { i.saturating_add(n) } else { i }.clamp(0, n);
        let start = clamp(self.start);
        let stop = self.stop.map_or(n, clamp);
        let len = if stop > start {
            (stop - start - 1) / self.step.max(1) + 1
        } else {
            0
        };
        (start as usize, len as usize)
    }
}

/// Renders like `1:5:2`; a zero start, missing stop and unit step are left
/// out, so the full axis is `::`.
impl fmt::Display for SliceAxis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.start != 0 {
            write!(f, "{}", self.start)?;
        }
        f.write_str(":")?;
        if let Some(stop) = self.stop {
            write!(f, "{stop}")?;
        }
        f.write_str(":")?;
        if self.step != 1 {
            write!(f, "{}", self.step)?;
        }
        Ok(())
    }
}

/// The aval of reshaping to `target` (already fully specified). Known
/// element counts must match; otherwise an equality guard is recorded
/// unless the counts are provably equal.
pub fn reshape_shape_rule(target: &Shape, aval: &Aval, cx: &mut ShapeCx) -> Result<Aval> {
    let (from, to) = (aval.shape.numel(), target.numel());
    match (from.known(), to.known()) {
        (Some(x), Some(y)) if x != y => {
            return Err(shape_err(
                "reshape",
                &[aval],
                format!(
                    "cannot reshape {} ({x} elements) to {target} ({y} elements)",
                    aval.shape
                ),
            ));
        }
        (Some(_), Some(_)) => {}
        _ if crate::symbolic::dims_equal(&from, &to) => {}
        _ => {
            cx.unify(&from, &to);
        }
    }
    Ok(Aval::new(target.clone(), aval.dtype))
}

/// The aval of permuting axes: output axis `i` is input axis `perm[i]`.
pub fn permute_shape_rule(perm: &[usize], aval: &Aval) -> Result<Aval> {
    let rank = aval.shape.rank();
    let mut seen = vec![false; rank];
    let valid = perm.len() == rank
        && perm
            .iter()
            .all(|&p| p < rank && !std::mem::replace(&mut seen[p], true));
    if !valid {
        return Err(arg_err(
            "permute",
            format!("{perm:?} is not a permutation of the {rank} axes of {aval}"),
        ));
    }
    let dims = perm.iter().map(|&p| aval.shape.dims()[p].clone()).collect();
    Ok(Aval::new(Shape(dims), aval.dtype))
}

/// Reference permute: a strided gather of the input.
pub fn permute_eval(perm: &[usize], data: &HostData, shape: &[usize]) -> HostData {
    let strides = row_major_strides(shape);
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let out_strides: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
    crate::with_host_data!(data, v => HostElement::wrap(gather(v, 0, &out_shape, &out_strides)))
}

/// The aval of NumPy-broadcasting to `target`: the rank may grow on the
/// left, and each operand dim must be a known 1 or equal the target dim.
pub fn broadcast_shape_rule(target: &Shape, aval: &Aval, cx: &mut ShapeCx) -> Result<Aval> {
    let (rank, target_rank) = (aval.shape.rank(), target.rank());
    if rank > target_rank {
        return Err(shape_err(
            "broadcast_to",
            &[aval],
            format!("cannot broadcast rank {rank} to the lower rank of {target}"),
        ));
    }
    let lead = target_rank - rank;
    for (i, d) in aval.shape.dims().iter().enumerate() {
        let t = &target.dims()[lead + i];
        if *d != Dim::Known(1) && cx.unify(d, t).is_none() {
            return Err(shape_err(
                "broadcast_to",
                &[aval],
                format!(
                    "cannot broadcast dim {d} to {t} at axis {} of {target}",
                    lead + i
                ),
            ));
        }
    }
    Ok(Aval::new(target.clone(), aval.dtype))
}

/// Reference broadcast: a gather with stride 0 on broadcast dims.
pub fn broadcast_eval(data: &HostData, in_shape: &[usize], out_shape: &[usize]) -> HostData {
    let strides = broadcast_strides(in_shape, out_shape);
    // A scalar (a mean's cotangent) is a fill, not a strided walk.
    crate::with_host_data!(data, v => HostElement::wrap(match v.as_slice() {
        [x] => vec![*x; out_shape.iter().product()],
        _ => gather(v, 0, out_shape, &strides),
    }))
}

/// The aval of a strided slice with one [`SliceAxis`] per dim.
///
/// Known dims follow NumPy. A symbolic dim `n` supports `start:` with
/// `start >= 0` (size `(n - start + step - 1) / step`, guard `n >= start`),
/// `start:stop` with `0 <= start <= stop` (known size, guard `n >= stop`)
/// and `-k:` (known size, guard `n >= k`).
pub fn slice_shape_rule(axes: &[SliceAxis], aval: &Aval, cx: &mut ShapeCx) -> Result<Aval> {
    let rank = aval.shape.rank();
    if axes.len() != rank {
        return Err(arg_err(
            "slice",
            format!("needs one slice per axis: got {} for {aval}", axes.len()),
        ));
    }
    let mut dims = Vec::with_capacity(rank);
    for (axis, (ax, d)) in axes.iter().zip(aval.shape.dims()).enumerate() {
        if ax.step < 1 {
            return Err(arg_err(
                "slice",
                format!("step must be at least 1, got {} at axis {axis}", ax.step),
            ));
        }
        let ceil_div = |len: u64| index_usize(len.div_ceil(ax.step as u64), axis);
        let dim = match (d, ax.start, ax.stop) {
            (Dim::Known(n), ..) => Dim::Known(ax.resolve(*n).1),
            (Dim::Sym(_), start, None) if start >= 0 => {
                cx.require_at_least(d, index_usize(start.unsigned_abs(), axis)?);
                let offset = (ax.step - 1).checked_sub(start).ok_or_else(|| {
                    arg_err(
                        "slice",
                        format!("start {start} is too large at axis {axis}"),
                    )
                })?;
                let size = d
                    .to_expr()
                    .add(&SymExpr::constant(offset))
                    .floor_div(ax.step as u64);
                Dim::from_expr(size)
            }
            (Dim::Sym(_), start, Some(stop)) if 0 <= start && start <= stop => {
                cx.require_at_least(d, index_usize(stop.unsigned_abs(), axis)?);
                Dim::Known(ceil_div((stop - start).unsigned_abs())?)
            }
            (Dim::Sym(_), start, None) => {
                cx.require_at_least(d, index_usize(start.unsigned_abs(), axis)?);
                Dim::Known(ceil_div(start.unsigned_abs())?)
            }
            (Dim::Sym(_), ..) => {
                return Err(arg_err(
                    "slice",
                    format!(
                        "`{ax}` on symbolic dim {d} (axis {axis}) is not supported; use `start:` with \
                         start >= 0, `start:stop` with 0 <= start <= stop, or `-k:`"
                    ),
                ));
            }
        };
        dims.push(dim);
    }
    Ok(Aval::new(Shape(dims), aval.dtype))
}

/// A slice bound as a size, or an error where it does not fit `usize`.
fn index_usize(v: u64, axis: usize) -> Result<usize> {
    usize::try_from(v)
        .map_err(|_| arg_err("slice", format!("bound {v} at axis {axis} is too large")))
}

/// Reference slice: starts and lengths are resolved from the concrete
/// `in_shape` with the same normalisation as the shape rule.
pub fn slice_eval(
    axes: &[SliceAxis],
    data: &HostData,
    in_shape: &[usize],
    out_shape: &[usize],
) -> HostData {
    let (offset, out_strides) = slice_view(axes, in_shape);
    crate::with_host_data!(data, v => HostElement::wrap(gather(v, offset, out_shape, &out_strides)))
}

/// A slice of a contiguous array of `in_shape` as a strided view: the
/// offset of its first element and, per axis, the input stride between
/// taken elements. Every backend reads slices through it.
///
/// An axis taking fewer than two elements never steps, so its stride is 0:
/// `step` may be as large as `i64::MAX`, and only a step below the axis
/// size (so a stride within the array) is ever multiplied out. An empty
/// slice reads nothing and has offset 0.
///
/// ```
/// use kiln::ops::layout::slice_view;
/// use kiln::SliceAxis;
/// let every_other = SliceAxis { start: 1, stop: None, step: 2 };
/// assert_eq!(slice_view(&[SliceAxis::full(), every_other], &[2, 5]), (1, vec![5, 2]));
/// let huge_step = SliceAxis { start: 0, stop: None, step: i64::MAX };
/// assert_eq!(slice_view(&[huge_step], &[3]), (0, vec![0]));
/// ```
pub fn slice_view(axes: &[SliceAxis], in_shape: &[usize]) -> (usize, Vec<usize>) {
    let strides = row_major_strides(in_shape);
    let mut offset = 0;
    let mut empty = false;
    let mut out_strides = Vec::with_capacity(in_shape.len());
    for ((ax, &n), &s) in axes.iter().zip(in_shape).zip(&strides) {
        let (start, len) = ax.resolve(n);
        offset += start * s;
        empty |= len == 0;
        out_strides.push(if len > 1 { s * ax.step as usize } else { 0 });
    }
    (if empty { 0 } else { offset }, out_strides)
}

/// The aval of concatenating along `axis`: same rank and dtype, equal
/// non-axis dims, and the axis dims summed.
pub fn concat_shape_rule(axis: usize, inputs: &[&Aval], cx: &mut ShapeCx) -> Result<Aval> {
    let Some(first) = inputs.first() else {
        return Err(arg_err("concat", "needs at least one operand"));
    };
    let rank = first.shape.rank();
    if let Some(other) = inputs.iter().find(|a| a.shape.rank() != rank) {
        return Err(shape_err(
            "concat",
            inputs,
            format!(
                "ranks differ: {rank} vs {} (axis {axis})",
                other.shape.rank()
            ),
        ));
    }
    if let Some(other) = inputs.iter().find(|a| a.dtype != first.dtype) {
        return Err(dtype_err(
            "concat",
            inputs,
            format!("operand dtypes differ: {} vs {}", first.dtype, other.dtype),
        ));
    }
    if axis >= rank {
        return Err(arg_err(
            "concat",
            format!("axis {axis} is out of range for rank {rank}"),
        ));
    }
    let mut dims = first.shape.dims().to_vec();
    for aval in &inputs[1..] {
        for (i, (acc, d)) in dims.iter_mut().zip(aval.shape.dims()).enumerate() {
            if i == axis {
                *acc = acc.add(d);
            } else {
                *acc = cx.unify(acc, d).ok_or_else(|| {
                    shape_err(
                        "concat",
                        inputs,
                        format!("dim {acc} vs {d} at axis {i} (joining along axis {axis})"),
                    )
                })?;
            }
        }
    }
    Ok(Aval::new(Shape(dims), first.dtype))
}

/// Reference concat: for each index before `axis`, copies each operand's
/// contiguous block in turn. Operands of another dtype than the first are
/// cast to it (the shape rule never lets that happen).
pub fn concat_eval(
    axis: usize,
    inputs: &[&HostData],
    in_shapes: &[&[usize]],
    out_shape: &[usize],
) -> HostData {
    let Some(first) = inputs.first() else {
        return HostData::zeros(DType::F32, 0);
    };
    crate::with_host_data!(first, v => HostElement::wrap(concat_typed(v, axis, inputs, in_shapes, out_shape)))
}

/// `_first` only fixes `T` to the first operand's element type.
fn concat_typed<T: HostElement>(
    _first: &[T],
    axis: usize,
    inputs: &[&HostData],
    in_shapes: &[&[usize]],
    out_shape: &[usize],
) -> Vec<T> {
    let outer = numel(&out_shape[..axis.min(out_shape.len())]);
    let parts: Vec<(Cow<'_, [T]>, usize)> = inputs
        .iter()
        .zip(in_shapes)
        .map(|(data, shape)| {
            let block = numel(shape.get(axis..).unwrap_or(&[]));
            let values = T::slice(data).map_or_else(|| Cow::Owned(data.to_vec()), Cow::Borrowed);
            (values, block)
        })
        .collect();
    let mut out = Vec::with_capacity(numel(out_shape));
    for o in 0..outer {
        for (values, block) in &parts {
            out.extend_from_slice(values.get(o * block..(o + 1) * block).unwrap_or(&[]));
        }
    }
    out
}

/// The aval of [`dim_size_eval`]: a scalar of `dtype`.
pub fn dim_size_shape_rule(axes: &[usize], dtype: DType, aval: &Aval) -> Result<Aval> {
    super::strided::check_axes("dim_size", axes, aval.shape.rank())?;
    Ok(Aval::new(Shape::scalar(), dtype))
}

/// One element: the product of `in_shape` over `axes`, as `dtype`.
pub fn dim_size_eval(axes: &[usize], dtype: DType, in_shape: &[usize]) -> HostData {
    let count: f64 = axes
        .iter()
        .filter_map(|&a| in_shape.get(a))
        .map(|&d| d as f64)
        .product();
    HostData::filled(dtype, 1, count)
}

/// The aval of [`iota_eval`]: a vector of `dtype` as long as `aval`'s
/// axis `axis` (which may be symbolic); bool has no positions.
pub fn iota_shape_rule(axis: usize, dtype: DType, aval: &Aval) -> Result<Aval> {
    let Some(n) = aval.shape.dims().get(axis) else {
        return Err(arg_err(
            "iota",
            format!("axis {axis} is out of range for {aval}"),
        ));
    };
    if dtype == DType::Bool {
        return Err(dtype_err("iota", &[aval], "positions cannot be bool"));
    }
    Ok(Aval::new(Shape(vec![n.clone()]), dtype))
}

/// `0, 1, …, in_shape[axis] - 1` as `dtype` (positions past a narrow
/// dtype's range convert as a cast would).
pub fn iota_eval(axis: usize, dtype: DType, in_shape: &[usize]) -> HostData {
    let n = in_shape.get(axis).copied().unwrap_or(0);
    HostData::from_f64s(dtype, (0..n).map(|i| i as f64))
}

/// The cotangent of `x` for a layout op's cotangent `g`: reshaped back,
/// permuted back, summed over broadcast axes, or (concat) the slice of `g`
/// each operand became; `None` for the dim-size scalar and iota, which
/// read only the operand's shape.
pub(crate) fn vjp(op: &Op, inputs: &[Array], g: &Array) -> Result<Vec<Option<Array>>> {
    let x = &inputs[0];
    Ok(match op {
        Op::Reshape(_) => vec![Some(g.reshape_to(x.shape().clone()))],
        Op::Permute(perm) => {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            vec![Some(g.permute(&inverse))]
        }
        Op::BroadcastTo(_) => vec![Some(crate::ops::binary::unbroadcast(g, x.shape()))],
        Op::Concat { axis } => {
            let mut start = 0usize;
            let mut grads = Vec::with_capacity(inputs.len());
            for input in inputs {
                let Some(size) = input.shape().dims()[*axis].known() else {
                    return Err(arg_err(
                        "concat",
                        format!(
                            "its gradient needs the sizes along axis {axis}, but {} is symbolic",
                            input.aval()
                        ),
                    ));
                };
                let stop = start + size;
                grads.push(Some(g.slice_axis(
                    *axis as isize,
                    start as i64,
                    Some(stop as i64),
                    1,
                )));
                start = stop;
            }
            grads
        }
        _ => vec![None; inputs.len()],
    })
}

/// The batched layout op, with the batch axis first: the op's axes shift
/// by one and its shapes gain the batch dim; concat broadcasts shared
/// operands to every example; `dim_size` and `iota` read the per-example
/// axes and are shared.
pub(crate) fn batch(op: &Op, operands: &[Batched], size: &Dim) -> Batched {
    let x = &operands[0];
    let with_batch = |shape: &Shape| {
        let mut dims = vec![size.clone()];
        dims.extend(shape.dims().iter().cloned());
        Shape(dims)
    };
    let batched = |op: Op, inputs: Vec<Array>| Batched::along(Array::apply(op, inputs), 0);
    match op {
        Op::Reshape(shape) => batched(Op::Reshape(with_batch(shape)), vec![x.front()]),
        Op::Permute(perm) => {
            let mut shifted = vec![0];
            shifted.extend(perm.iter().map(|p| p + 1));
            batched(Op::Permute(shifted), vec![x.front()])
        }
        Op::BroadcastTo(shape) => batched(
            Op::BroadcastTo(with_batch(shape)),
            vec![x.aligned(shape.rank())],
        ),
        Op::Slice(axes) => {
            let mut shifted = vec![SliceAxis::full()];
            shifted.extend(axes.iter().cloned());
            batched(Op::Slice(shifted), vec![x.front()])
        }
        Op::PadSlice { axes, shape } => {
            let mut shifted = vec![SliceAxis::full()];
            shifted.extend(axes.iter().cloned());
            batched(
                Op::PadSlice {
                    axes: shifted,
                    shape: with_batch(shape),
                },
                vec![x.front()],
            )
        }
        Op::Concat { axis } => batched(
            Op::Concat { axis: axis + 1 },
            operands.iter().map(|b| b.materialized(size)).collect(),
        ),
        Op::DimSize { axes, dtype } => {
            let axes = axes.iter().map(|&a| x.operand_axis(a)).collect();
            Batched::shared(Array::apply(
                Op::DimSize {
                    axes,
                    dtype: *dtype,
                },
                vec![x.value.clone()],
            ))
        }
        Op::Iota { axis, dtype } => Batched::shared(Array::apply(
            Op::Iota {
                axis: x.operand_axis(*axis),
                dtype: *dtype,
            },
            vec![x.value.clone()],
        )),
        other => unreachable!("{} is not a layout op", other.name()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::ops::strided::proptest_config;
    use crate::ops::{Condition, Guard};
    use crate::shape::Symbol;
    use proptest::prelude::*;

    fn sym(i: u32) -> Dim {
        Dim::symbol(Symbol(i))
    }

    fn sl(start: i64, stop: Option<i64>, step: i64) -> SliceAxis {
        SliceAxis { start, stop, step }
    }

    fn iota(n: usize) -> HostData {
        HostData::I32((0..n as i32).collect())
    }

    #[test]
    fn slice_axis_renders_like_numpy() {
        assert_eq!(sl(1, Some(5), 2).to_string(), "1:5:2");
        assert_eq!(SliceAxis::full().to_string(), "::");
        assert_eq!(sl(-3, None, 1).to_string(), "-3::");
    }

    #[test]
    fn reshape_checks_known_counts() {
        let a = Aval::new([2, 3], DType::F32);
        assert_eq!(
            reshape_shape_rule(&Shape::known(&[3, 2]), &a, &mut ShapeCx::new()),
            Ok(Aval::new([3, 2], DType::F32))
        );
        let err = reshape_shape_rule(&Shape::known(&[4]), &a, &mut ShapeCx::new()).unwrap_err();
        assert!(matches!(err, Error::Shape { .. }));
        let msg = format!("{err}");
        assert!(
            msg.contains("reshape") && msg.contains("[2,3]") && msg.contains("[4]"),
            "{msg}"
        );
    }

    #[test]
    fn reshape_of_symbolic_rows_to_flat_needs_no_guard() {
        let a = Aval::new(Shape(vec![sym(0), Dim::Known(4)]), DType::F32);
        let flat = Dim::from_expr(SymExpr::symbol(Symbol(0)).scale(4));
        let mut cx = ShapeCx::new();
        let out = reshape_shape_rule(&Shape(vec![flat.clone()]), &a, &mut cx);
        assert_eq!(out, Ok(Aval::new(Shape(vec![flat]), DType::F32)));
        assert!(cx.guards.is_empty());
    }

    #[test]
    fn reshape_to_unrelated_symbol_records_guard() {
        let a = Aval::new(Shape(vec![sym(0)]), DType::F32);
        let mut cx = ShapeCx::new();
        reshape_shape_rule(&Shape(vec![sym(1)]), &a, &mut cx).unwrap();
        assert_eq!(
            cx.guards,
            vec![Guard {
                op: String::new(),
                condition: Condition::Equal(sym(0), sym(1))
            }]
        );
    }

    #[test]
    fn permute_transposes() {
        let out = permute_eval(&[1, 0], &iota(6), &[2, 3]);
        assert_eq!(out, HostData::I32(vec![0, 3, 1, 4, 2, 5]));
        let a = Aval::new(Shape(vec![sym(0), Dim::Known(3)]), DType::U8);
        assert_eq!(
            permute_shape_rule(&[1, 0], &a),
            Ok(Aval::new(Shape(vec![Dim::Known(3), sym(0)]), DType::U8))
        );
    }

    #[test]
    fn permute_rejects_non_permutations() {
        let a = Aval::new([2, 3], DType::F32);
        for perm in [vec![0], vec![0, 0], vec![0, 2]] {
            let err = permute_shape_rule(&perm, &a).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument { .. }));
            assert!(format!("{err}").contains("permute"));
        }
    }

    #[test]
    fn broadcast_to_grows_rank_and_repeats() {
        let out = broadcast_eval(&iota(3), &[3, 1], &[2, 3, 2]);
        assert_eq!(out, HostData::I32(vec![0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2]));
        let mut cx = ShapeCx::new();
        let target = Shape(vec![Dim::Known(2), sym(0), Dim::Known(4)]);
        let a = Aval::new(Shape(vec![sym(0), Dim::Known(1)]), DType::F32);
        assert_eq!(
            broadcast_shape_rule(&target, &a, &mut cx),
            Ok(Aval::new(target.clone(), DType::F32))
        );
        assert!(cx.guards.is_empty());
    }

    #[test]
    fn broadcast_to_rejects_mismatch() {
        let a = Aval::new([3], DType::F32);
        let err =
            broadcast_shape_rule(&Shape::known(&[2, 4]), &a, &mut ShapeCx::new()).unwrap_err();
        assert!(matches!(err, Error::Shape { .. }));
        let msg = format!("{err}");
        assert!(
            msg.contains("broadcast_to") && msg.contains("f32[3]") && msg.contains("[2,4]"),
            "{msg}"
        );
        assert!(broadcast_shape_rule(
            &Shape::known(&[3]),
            &Aval::new([1, 3], DType::F32),
            &mut ShapeCx::new()
        )
        .is_err());
    }

    #[test]
    fn slice_known_dims_follow_numpy() {
        let a = Aval::new([10], DType::I32);
        let size =
            |ax: SliceAxis| slice_shape_rule(&[ax], &a, &mut ShapeCx::new()).map(|o| o.shape);
        assert_eq!(size(sl(1, Some(5), 2)), Ok(Shape::known(&[2])));
        assert_eq!(size(sl(-3, None, 1)), Ok(Shape::known(&[3])));
        assert_eq!(size(sl(2, Some(-2), 3)), Ok(Shape::known(&[2])));
        assert_eq!(size(sl(8, Some(2), 1)), Ok(Shape::known(&[0])));
        assert_eq!(size(sl(-20, Some(20), 4)), Ok(Shape::known(&[3])));
        assert_eq!(size(sl(0, None, i64::MAX)), Ok(Shape::known(&[1])));
        let out = slice_eval(&[sl(2, Some(-2), 3)], &iota(10), &[10], &[2]);
        assert_eq!(out, HostData::I32(vec![2, 5]));
    }

    #[test]
    fn slice_two_dims_with_steps() {
        let out = slice_eval(
            &[sl(1, None, 1), sl(0, None, 2)],
            &iota(12),
            &[3, 4],
            &[2, 2],
        );
        assert_eq!(out, HostData::I32(vec![4, 6, 8, 10]));
        let empty = slice_eval(
            &[sl(3, None, 1), SliceAxis::full()],
            &iota(12),
            &[3, 4],
            &[0, 4],
        );
        assert_eq!(empty, HostData::I32(vec![]));
    }

    #[test]
    fn slice_rejects_bad_step_and_wrong_count() {
        let a = Aval::new([4], DType::F32);
        for step in [0, -1] {
            let err = slice_shape_rule(&[sl(0, None, step)], &a, &mut ShapeCx::new()).unwrap_err();
            assert!(
                matches!(err, Error::InvalidArgument { .. }) && format!("{err}").contains("step")
            );
        }
        let err = slice_shape_rule(&[], &a, &mut ShapeCx::new()).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }));
    }

    #[test]
    fn slice_symbolic_open_end_form() {
        let a = Aval::new(Shape(vec![sym(0)]), DType::F32);
        let mut cx = ShapeCx::new();
        let out = slice_shape_rule(&[sl(1, None, 2)], &a, &mut cx).unwrap();
        let want = Dim::from_expr(
            SymExpr::symbol(Symbol(0))
                .add(&SymExpr::constant(0))
                .floor_div(2),
        );
        assert_eq!(out.shape, Shape(vec![want.clone()]));
        assert_eq!(want.eval(&|_| Some(7)), Some(3));
        assert_eq!(cx.guards[0].condition, Condition::AtLeast(sym(0), 1));
        let eval = slice_eval(&[sl(1, None, 2)], &iota(7), &[7], &[3]);
        assert_eq!(eval, HostData::I32(vec![1, 3, 5]));
    }

    #[test]
    fn slice_symbolic_bounded_form() {
        let a = Aval::new(Shape(vec![sym(0)]), DType::F32);
        let mut cx = ShapeCx::new();
        let out = slice_shape_rule(&[sl(2, Some(7), 2)], &a, &mut cx).unwrap();
        assert_eq!(out.shape, Shape::known(&[3]));
        assert_eq!(cx.guards[0].condition, Condition::AtLeast(sym(0), 7));
    }

    #[test]
    fn slice_symbolic_tail_form() {
        let a = Aval::new(Shape(vec![sym(0)]), DType::F32);
        let mut cx = ShapeCx::new();
        let out = slice_shape_rule(&[sl(-3, None, 1)], &a, &mut cx).unwrap();
        assert_eq!(out.shape, Shape::known(&[3]));
        assert_eq!(cx.guards[0].condition, Condition::AtLeast(sym(0), 3));
        assert_eq!(
            slice_eval(&[sl(-3, None, 1)], &iota(5), &[5], &[3]),
            HostData::I32(vec![2, 3, 4])
        );
    }

    #[test]
    fn slice_symbolic_negative_stop_is_rejected() {
        let a = Aval::new(Shape(vec![sym(0)]), DType::F32);
        let err = slice_shape_rule(&[sl(0, Some(-1), 1)], &a, &mut ShapeCx::new()).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }));
        assert!(format!("{err}").contains("symbolic dim s0"));
    }

    #[test]
    fn concat_joins_along_axis() {
        let a = HostData::F32(vec![1.0, 2.0, 3.0, 4.0]);
        let b = HostData::F32(vec![5.0, 6.0]);
        let out = concat_eval(1, &[&a, &b], &[&[2, 2], &[2, 1]], &[2, 3]);
        assert_eq!(out, HostData::F32(vec![1.0, 2.0, 5.0, 3.0, 4.0, 6.0]));
        let out = concat_eval(0, &[&a, &b], &[&[2, 2], &[1, 2]], &[3, 2]);
        assert_eq!(out, HostData::F32(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
    }

    #[test]
    fn concat_shape_rule_sums_axis_and_unifies_others() {
        let a = Aval::new(Shape(vec![sym(0), Dim::Known(2)]), DType::F32);
        let b = Aval::new(Shape(vec![sym(1), Dim::Known(2)]), DType::F32);
        let mut cx = ShapeCx::new();
        let out = concat_shape_rule(0, &[&a, &b], &mut cx).unwrap();
        assert_eq!(out.shape.dims()[0], sym(0).add(&sym(1)));
        assert!(cx.guards.is_empty());
        let err = concat_shape_rule(
            0,
            &[
                &Aval::new([1, 2], DType::F32),
                &Aval::new([1, 3], DType::F32),
            ],
            &mut cx,
        )
        .unwrap_err();
        assert!(matches!(err, Error::Shape { .. }));
        let msg = format!("{err}");
        assert!(
            msg.contains("concat") && msg.contains("axis 0") && msg.contains("f32[1,2], f32[1,3]"),
            "{msg}"
        );
        assert!(matches!(
            concat_shape_rule(0, &[], &mut cx),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            concat_shape_rule(2, &[&a], &mut cx),
            Err(Error::InvalidArgument { .. })
        ));
    }

    #[test]
    fn dim_size_multiplies_axes() {
        assert_eq!(
            dim_size_eval(&[0, 2], DType::F32, &[2, 3, 4]),
            HostData::F32(vec![8.0])
        );
        let a = Aval::new(Shape(vec![sym(0), Dim::Known(3)]), DType::F32);
        assert_eq!(
            dim_size_shape_rule(&[0], DType::I32, &a),
            Ok(Aval::new([], DType::I32))
        );
        assert!(dim_size_shape_rule(&[2], DType::I32, &a).is_err());
    }

    fn shape_and_perm() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
        prop::collection::vec(0usize..4, 0..5).prop_flat_map(|shape| {
            let perm = Just((0..shape.len()).collect::<Vec<_>>()).prop_shuffle();
            (Just(shape), perm)
        })
    }

    proptest! {
        #![proptest_config(proptest_config())]
        #[test]
        fn permute_then_inverse_is_identity((shape, perm) in shape_and_perm()) {
            let data = iota(shape.iter().product());
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            let permuted_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let back = permute_eval(&inverse, &permute_eval(&perm, &data, &shape), &permuted_shape);
            prop_assert_eq!(back, data);
        }

        #[test]
        fn broadcast_eval_equals_adding_zeros_of_the_target_shape(
            out in prop::collection::vec(0usize..4, 0..4),
            mask in any::<u8>(),
            drop in 0usize..4,
        ) {
            let in_shape: Vec<usize> = out
                .iter()
                .enumerate()
                .skip(drop.min(out.len()))
                .map(|(i, &d)| if mask & (1 << i) != 0 { 1 } else { d })
                .collect();
            let data = iota(in_shape.iter().product());
            let zeros = HostData::I32(vec![0; out.iter().product()]);
            let add = crate::ops::binary::eval(crate::ops::BinaryOp::Add, &data, &in_shape, &zeros, &out, &out);
            prop_assert_eq!(Ok(broadcast_eval(&data, &in_shape, &out)), add);
        }

        #[test]
        fn slice_matches_naive_indexing(n in 0usize..12, start in -15i64..15, stop in proptest::option::of(-15i64..15), step in 1i64..5) {
            let ax = sl(start, stop, step);
            let aval = Aval::new([n], DType::I32);
            let size = slice_shape_rule(std::slice::from_ref(&ax), &aval, &mut ShapeCx::new()).unwrap().shape;
            let out = slice_eval(std::slice::from_ref(&ax), &iota(n), &[n], &size.as_known().unwrap());
            // NumPy: normalise, clamp, then walk.
            let ni = n as i64;
            let norm = |i: i64| if i < 0 { (i + ni).max(0) } else { i.min(ni) };
            let (s, e) = (norm(start), stop.map_or(ni, norm));
            let want: Vec<i32> = (s..e).step_by(step as usize).map(|i| i as i32).collect();
            prop_assert_eq!(out, HostData::I32(want));
        }
    }

    use crate::compile::rule_checks as rules;

    #[test]
    fn layout_jvps_apply_the_op_to_the_tangent() {
        let x = rules::normal(19, &[2, 3, 4]);
        let y = rules::normal(20, &[2, 1, 4]);
        let f = |x: Vec<Array>| {
            let moved = x[0]
                .reshape(&[6, 4])
                .transpose()
                .slice_axis(1, 1, Some(5), 2);
            let joined = concat(&[x[0].clone(), x[1].broadcast_to([2, 2, 4])], 1);
            moved.sum_all() * joined.sum(&[1], false)
        };
        rules::assert_jvp_matches_central_difference("layout", f, &[x, y]);
    }

    #[test]
    fn layout_ops_batch_with_the_batch_axis_first() {
        let xs = rules::normal(21, &[3, 2, 3, 4]);
        let ys = rules::normal(22, &[3, 1, 3, 4]);
        let f = |x: Vec<Array>| {
            let reshaped = x[0].reshape(&[6, 4]).permute(&[1, 0]).expand_dims(0);
            let sliced = x[0].slice_axis(2, 1, None, 2).broadcast_to([2, 2, 3, 2]);
            let joined = concat(&[x[0].clone(), x[1].clone()], 0);
            reshaped.sum_all()
                + sliced.sum(&[0, 1], false).sum_all()
                + joined.sum(&[0, 2], false).sum_all()
        };
        let report = rules::assert_batches_like_stacking("layout", f, &[xs, ys]);
        assert!(
            report.vmap_fallbacks.is_empty(),
            "{:?}",
            report.vmap_fallbacks
        );
    }

    #[test]
    fn iota_counts_the_positions_of_an_axis_and_has_no_tangent() {
        let x = rules::normal(23, &[2, 3]);
        assert_eq!(x.iota(1, DType::I32).to_vec::<i32>().unwrap(), [0, 1, 2]);
        assert_eq!(x.iota(-2, DType::F32).to_vec::<f32>().unwrap(), [0.0, 1.0]);
        let (_, t) = crate::jvp(|x: Array| x.iota(0, DType::F32) * 2.0, &x, &x).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), [0.0, 0.0]);
    }

    #[test]
    fn iota_batches_to_the_one_range_every_example_shares() {
        let xs = rules::normal(24, &[3, 2, 5]);
        let f = |x: Vec<Array>| &x[0] + &x[0].iota(1, DType::F32);
        let report = rules::assert_batches_like_stacking("iota", f, &[xs]);
        assert!(
            report.vmap_fallbacks.is_empty(),
            "{:?}",
            report.vmap_fallbacks
        );
    }

    #[test]
    fn iota_shape_rule_takes_a_symbolic_length_and_rejects_bool_and_bad_axes() {
        let aval = Aval::new(Shape(vec![Dim::Known(2), sym(0)]), DType::F32);
        assert_eq!(
            iota_shape_rule(1, DType::U32, &aval).unwrap(),
            Aval::new(Shape(vec![sym(0)]), DType::U32)
        );
        rules::assert_err_names(iota_shape_rule(2, DType::I32, &aval), "iota", "axis 2");
        rules::assert_err_names(iota_shape_rule(0, DType::Bool, &aval), "iota", "bool");
        assert_eq!(
            iota_eval(0, DType::U8, &[3, 9]),
            HostData::U8(vec![0, 1, 2])
        );
    }
}
