//! `dynamic_slice` and `dynamic_update_slice`: a window of an array at
//! start indices computed at run time (traced values, one integer scalar
//! per axis). The user methods, shape rules, reference evaluation and the
//! vjp, jvp and batching rules.
//!
//! Starts are clamped as in JAX, so every window lies inside the array: a
//! start below 0 reads from 0, and one past `dim - size` reads from
//! `dim - size`. An out-of-range start is therefore never an error; the
//! window just moves. Sizes are static (a window's shape is part of the
//! aval); under shapeless compile the array's dims may be symbolic, and
//! the shape rule records the guard `dim >= size` it relies on.
//!
//! `dynamic_update_slice` may write its output over its first operand: the
//! reinplace pass lets it take that buffer when nothing reads the old value
//! later, which is what makes a decoding loop's cache update in place.

use super::batching::{per_example, Batched};
use super::strided::{gather, numel, row_major_strides, scatter};
use super::{Op, ShapeCx};
use crate::data::HostData;
use crate::error::{arg_err, shape_err, Result};
use crate::handle::array::Array;
use crate::shape::{Aval, Dim, Shape};
use crate::DType;

const SLICE: &str = "dynamic_slice";
const UPDATE: &str = "dynamic_update_slice";

impl Array {
    /// The window of `sizes` starting at `starts` (one integer scalar per
    /// axis, traced values allowed), each start clamped to
    /// `0..=dim - size` as in JAX.
    ///
    /// ```
    /// use kiln::Array;
    /// let x = Array::from_vec((0..6).collect::<Vec<i32>>(), &[2, 3])?;
    /// let i = Array::from_vec(vec![1i32], &[])?;
    /// let j = Array::from_vec(vec![5i32], &[])?; // clamped to 3 - 2 = 1
    /// assert_eq!(x.dynamic_slice(&[i, j], &[1, 2]).to_vec::<i32>()?, vec![4, 5]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn dynamic_slice(&self, starts: &[Array], sizes: &[usize]) -> Array {
        let mut operands = vec![self.clone()];
        operands.extend(starts.iter().cloned());
        Array::apply(
            Op::DynamicSlice {
                sizes: Shape::known(sizes),
            },
            operands,
        )
    }

    /// `self` with `update` written at `starts` (one integer scalar per
    /// axis, clamped to `0..=dim - update_dim` as in JAX). The result may
    /// take `self`'s buffer when nothing reads `self` afterwards.
    ///
    /// ```
    /// use kiln::Array;
    /// let cache = Array::zeros(&[3, 2], kiln::DType::F32);
    /// let row = Array::from_vec(vec![1.0f32, 2.0], &[1, 2])?;
    /// let t = Array::from_vec(vec![2i32], &[])?;
    /// let zero = Array::from_vec(vec![0i32], &[])?;
    /// let out = cache.dynamic_update_slice(&row, &[t, zero]);
    /// assert_eq!(out.to_vec::<f32>()?, vec![0.0, 0.0, 0.0, 0.0, 1.0, 2.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn dynamic_update_slice(&self, update: &Array, starts: &[Array]) -> Array {
        let mut operands = vec![self.clone(), update.clone()];
        operands.extend(starts.iter().cloned());
        Array::apply(Op::DynamicUpdateSlice, operands)
    }
}

/// `Err` unless `starts` are one integer scalar per axis of `x`.
fn check_starts(op: &str, x: &Aval, starts: &[&Aval]) -> Result<()> {
    if starts.len() != x.shape.rank() {
        return Err(arg_err(
            op,
            format!("takes one start per axis of {x}: {} given", starts.len()),
        ));
    }
    for (axis, start) in starts.iter().enumerate() {
        if start.shape.rank() != 0 || !start.dtype.is_integer() {
            return Err(arg_err(
                op,
                format!("start {axis} must be an integer scalar, got {start}"),
            ));
        }
    }
    Ok(())
}

/// Records that a window of `size` fits in `dim`: proven when equal, a
/// guard `dim >= size` for a symbolic dim and a known size, else `Err`.
fn check_fits(
    op: &str,
    avals: &[&Aval],
    axis: usize,
    dim: &Dim,
    size: &Dim,
    cx: &mut ShapeCx,
) -> Result<()> {
    if size.provably_eq(dim) {
        return Ok(());
    }
    match (size.known(), dim.known()) {
        (Some(s), Some(d)) if s <= d => Ok(()),
        (Some(s), None) => {
            cx.require_at_least(dim, s);
            Ok(())
        }
        _ => Err(shape_err(
            op,
            avals,
            format!("the window's size {size} along axis {axis} is not provably at most {dim}"),
        )),
    }
}

/// The aval of `dynamic_slice(x, starts, sizes)`.
pub fn dynamic_slice_shape_rule(sizes: &Shape, inputs: &[&Aval], cx: &mut ShapeCx) -> Result<Aval> {
    let Some((&x, starts)) = inputs.split_first() else {
        return Err(arg_err(
            SLICE,
            "takes an array and its starts, got no operand",
        ));
    };
    check_starts(SLICE, x, starts)?;
    if sizes.rank() != x.shape.rank() {
        return Err(arg_err(
            SLICE,
            format!("takes one size per axis of {x}: {} given", sizes.rank()),
        ));
    }
    for (axis, (dim, size)) in x.shape.dims().iter().zip(sizes.dims()).enumerate() {
        check_fits(SLICE, &[x], axis, dim, size, cx)?;
    }
    Ok(Aval::new(sizes.clone(), x.dtype))
}

/// The aval of `dynamic_update_slice(x, update, starts)`: `x`'s.
pub fn dynamic_update_slice_shape_rule(inputs: &[&Aval], cx: &mut ShapeCx) -> Result<Aval> {
    let [x, update, starts @ ..] = inputs else {
        return Err(arg_err(
            UPDATE,
            format!(
                "takes an array, an update and starts, got {} operands",
                inputs.len()
            ),
        ));
    };
    check_starts(UPDATE, x, starts)?;
    if update.dtype != x.dtype || update.shape.rank() != x.shape.rank() {
        return Err(shape_err(
            UPDATE,
            &[x, update],
            "the update must have the array's dtype and rank",
        ));
    }
    for (axis, (dim, size)) in x.shape.dims().iter().zip(update.shape.dims()).enumerate() {
        check_fits(UPDATE, &[x, update], axis, dim, size, cx)?;
    }
    Ok((*x).clone())
}

/// The clamped starts of a window of `sizes` in an array of `shape`, read
/// from the start operands.
fn clamped_starts(starts: &[&HostData], shape: &[usize], sizes: &[usize]) -> Vec<usize> {
    starts
        .iter()
        .zip(shape.iter().zip(sizes))
        .map(|(start, (&dim, &size))| {
            let highest = dim.saturating_sub(size) as f64;
            start.get_f64(0).clamp(0.0, highest) as usize
        })
        .collect()
}

/// The flat offset of the window's first element and the array's strides.
fn window(starts: &[usize], shape: &[usize]) -> (usize, Vec<usize>) {
    let strides = row_major_strides(shape);
    let offset = starts.iter().zip(&strides).map(|(s, st)| s * st).sum();
    (offset, strides)
}

/// `Err` unless an array of `shape` holding `x`, scalar starts of
/// `start_shapes` (one per axis) and a window of `sizes` fit together.
fn check_operands(
    op: &str,
    x: &HostData,
    shape: &[usize],
    start_shapes: &[&[usize]],
    sizes: &[usize],
) -> Result<()> {
    let fits = x.len() == numel(shape)
        && sizes.len() == shape.len()
        && start_shapes.len() == shape.len()
        && sizes.iter().zip(shape).all(|(s, d)| s <= d)
        && start_shapes.iter().all(|s| s.is_empty());
    if fits {
        Ok(())
    } else {
        Err(arg_err(
            op,
            format!(
                "a window of {sizes:?} with {} starts does not fit an array of {shape:?}",
                start_shapes.len()
            ),
        ))
    }
}

/// Reference dynamic_slice.
pub fn dynamic_slice_eval(
    inputs: &[&HostData],
    in_shapes: &[&[usize]],
    out_shape: &[usize],
) -> Result<HostData> {
    check_operands(SLICE, inputs[0], in_shapes[0], &in_shapes[1..], out_shape)?;
    let starts = clamped_starts(&inputs[1..], in_shapes[0], out_shape);
    let (offset, strides) = window(&starts, in_shapes[0]);
    Ok(crate::with_host_data!(inputs[0], v => {
        crate::data::HostElement::wrap(gather(v, offset, out_shape, &strides))
    }))
}

/// Writes `update` into `target` (an array of `shape`) at the clamped
/// `starts`.
fn write_window(
    target: &mut HostData,
    shape: &[usize],
    update: &HostData,
    update_shape: &[usize],
    starts: &[&HostData],
) -> Result<()> {
    let starts = clamped_starts(starts, shape, update_shape);
    let (offset, strides) = window(&starts, shape);
    macro_rules! write {
        ($($variant:ident),*) => {
            match (target, update) {
                $((HostData::$variant(d), HostData::$variant(s)) => {
                    scatter(d, offset, update_shape, &strides, s);
                    Ok(())
                })*
                (target, update) => Err(arg_err(
                    UPDATE,
                    format!("cannot write {} elements into {}", update.dtype(), target.dtype()),
                )),
            }
        };
    }
    write!(F32, F16, BF16, I32, U32, Bool, U8)
}

/// Reference dynamic_update_slice.
pub fn dynamic_update_slice_eval(inputs: &[&HostData], in_shapes: &[&[usize]]) -> Result<HostData> {
    check_operands(
        UPDATE,
        inputs[0],
        in_shapes[0],
        &in_shapes[2..],
        in_shapes[1],
    )?;
    let mut out = inputs[0].clone();
    write_window(
        &mut out,
        in_shapes[0],
        inputs[1],
        in_shapes[1],
        &inputs[2..],
    )?;
    Ok(out)
}

/// dynamic_update_slice into `target`, which holds the array (operand 0)
/// already: only the window is written.
pub fn dynamic_update_slice_in_place(
    inputs: &[Option<&HostData>],
    in_shapes: &[&[usize]],
    target: &mut HostData,
) -> Result<()> {
    let update = inputs[1].ok_or_else(|| arg_err(UPDATE, "writes in place only over its array"))?;
    let starts = inputs[2..]
        .iter()
        .map(|s| s.ok_or_else(|| arg_err(UPDATE, "writes in place only over its array")))
        .collect::<Result<Vec<_>>>()?;
    check_operands(UPDATE, target, in_shapes[0], &in_shapes[2..], in_shapes[1])?;
    write_window(target, in_shapes[0], update, in_shapes[1], &starts)
}

/// The cotangents of `dynamic_slice(x, starts)`: `g` placed in zeros at the
/// same (clamped) window; none for the starts.
pub(crate) fn slice_vjp(inputs: &[Array], g: &Array) -> Vec<Option<Array>> {
    let mut grads = vec![Some(
        inputs[0].zeros_like().dynamic_update_slice(g, &inputs[1..]),
    )];
    grads.resize(inputs.len(), None);
    grads
}

/// The cotangents of `dynamic_update_slice(x, update, starts)`: `g` with
/// the window zeroed for `x`, the window of `g` for `update`.
pub(crate) fn update_vjp(inputs: &[Array], g: &Array) -> Vec<Option<Array>> {
    let (update, starts) = (&inputs[1], &inputs[2..]);
    let sizes = update.shape().clone();
    let mut grads = vec![
        Some(g.dynamic_update_slice(&update.zeros_like(), starts)),
        Some(Array::apply(
            Op::DynamicSlice { sizes },
            [g.clone()]
                .into_iter()
                .chain(starts.iter().cloned())
                .collect(),
        )),
    ];
    grads.resize(inputs.len(), None);
    grads
}

/// The tangent of either op: it is linear in its array operands, so it
/// applies itself to their tangents (zeros where one has none).
pub(crate) fn jvp(op: &Op, inputs: &[Array], tangents: &[Option<Array>]) -> Option<Array> {
    let arrays = match op {
        Op::DynamicUpdateSlice => 2,
        _ => 1,
    };
    if tangents[..arrays].iter().all(Option::is_none) {
        return None;
    }
    let mut operands: Vec<Array> = inputs[..arrays]
        .iter()
        .zip(tangents)
        .map(|(x, t)| t.clone().unwrap_or_else(|| x.zeros_like()))
        .collect();
    operands.extend(inputs[arrays..].iter().cloned());
    Some(Array::apply(op.clone(), operands))
}

/// The batched op: with starts shared by every example, the batch axis is
/// moved to the front of the arrays and gets a window of its whole size
/// starting at 0. Starts that differ per example become, per axis, the
/// positions each example's window covers (clamped as the op clamps
/// them), and the window is gathered with one batched `take` per axis
/// (an update placed with one batched `scatter_add` per axis, then
/// selected over the array): no loop over the examples. A window of a
/// symbolic size runs once per example.
pub(crate) fn batch(op: &Op, operands: &[Batched], output: &Array, size: &Dim) -> Result<Batched> {
    let arrays = match op {
        Op::DynamicUpdateSlice => 2,
        _ => 1,
    };
    if operands[arrays..].iter().any(|s| s.axis.is_some()) {
        let batched = match op {
            Op::DynamicSlice { sizes } => gathered_window(operands, sizes, size)?,
            _ => placed_update(operands, size)?,
        };
        return match batched {
            Some(batched) => Ok(batched),
            None => per_example(
                op,
                operands,
                output,
                size,
                "the start indices differ per example and the window's size is symbolic",
            ),
        };
    }
    let zero = Array::scalar(0.0, DType::I32);
    let mut values: Vec<Array> = operands[..arrays]
        .iter()
        .map(|b| b.materialized(size))
        .collect();
    values.push(zero);
    values.extend(operands[arrays..].iter().map(|s| s.value.clone()));
    let batched = match op {
        Op::DynamicSlice { sizes } => {
            let mut dims = vec![size.clone()];
            dims.extend(sizes.dims().iter().cloned());
            Array::apply(Op::DynamicSlice { sizes: Shape(dims) }, values)
        }
        _ => Array::apply(Op::DynamicUpdateSlice, values),
    };
    Ok(Batched::along(batched, 0))
}

/// Per example, the positions along `axis` of `x` (batch axis first)
/// that a window of `window` elements at that example's `start` covers,
/// the start clamped to `0..=dim - window` as the op clamps it: `[B,
/// window]`, i32 (u32 for u32 starts).
fn window_positions(
    x: &Array,
    axis: usize,
    start: &Batched,
    window: usize,
    size: &Dim,
) -> Result<Array> {
    let dtype = match start.value.dtype() {
        DType::U32 => DType::U32,
        _ => DType::I32,
    };
    let start = start.materialized(size).cast(dtype);
    let dim = Array::apply(
        Op::DimSize {
            axes: vec![axis + 1],
            dtype,
        },
        vec![x.clone()],
    );
    let clamped = start.minimum(dim - window as f64);
    let clamped = match dtype {
        DType::I32 => clamped.maximum(0.0),
        _ => clamped,
    };
    let offsets = Array::arange(0.0, window as f64, 1.0, dtype)?;
    Ok(clamped.expand_dims(1) + offsets)
}

/// The per-example windows of `sizes` of operand 0 at per-example
/// starts (operands 1..): one batched take per axis whose window is not
/// the whole axis. `None` when a window's size is symbolic.
fn gathered_window(operands: &[Batched], sizes: &Shape, size: &Dim) -> Result<Option<Batched>> {
    let mut x = Batched::along(operands[0].materialized(size), 0);
    for (axis, window) in sizes.dims().iter().enumerate() {
        let Some(window) = window.known() else {
            return Ok(None);
        };
        if Dim::Known(window).provably_eq(&x.value.shape().dims()[axis + 1]) {
            continue;
        }
        let positions = window_positions(&x.value, axis, &operands[1 + axis], window, size)?;
        x = super::index::batch(axis, &x, &Batched::along(positions, 0), size);
    }
    Ok(Some(x))
}

/// Operand 0 with operand 1 written at per-example starts (operands 2..):
/// the update placed into zeros with one batched scatter_add per axis
/// (its positions are distinct, so nothing accumulates), a mask placed
/// alike, and the placed values selected where the mask is set. `None`
/// when the update's size is symbolic.
fn placed_update(operands: &[Batched], size: &Dim) -> Result<Option<Batched>> {
    let x = operands[0].materialized(size);
    let dtype = x.dtype();
    // scatter_add adds, which bool values cannot: they travel as u8.
    let carried = match dtype {
        DType::Bool => DType::U8,
        other => other,
    };
    let mut placed = operands[1].materialized(size).cast(carried);
    let mut mask = Array::scalar(1.0, DType::U8).broadcast_to(placed.shape().clone());
    for axis in 0..x.ndim() - 1 {
        let Some(window) = placed.shape().dims()[axis + 1].known() else {
            return Ok(None);
        };
        let dim = x.shape().dims()[axis + 1].clone();
        if Dim::Known(window).provably_eq(&dim) {
            continue;
        }
        let positions = Batched::along(
            window_positions(&x, axis, &operands[2 + axis], window, size)?,
            0,
        );
        let place = |values: Array| {
            super::scatter::batch(axis, &dim, &Batched::along(values, 0), &positions, size).value
        };
        placed = place(placed);
        mask = place(mask);
    }
    Ok(Some(Batched::along(
        mask.not_equal(0.0).select(placed.cast(dtype), &x),
        0,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar(v: i32) -> HostData {
        HostData::I32(vec![v])
    }

    #[test]
    fn a_window_reads_at_its_starts_and_out_of_range_starts_are_clamped() {
        let x = HostData::I32((0..12).collect());
        let (i, j) = (scalar(1), scalar(1));
        let out = dynamic_slice_eval(&[&x, &i, &j], &[&[3, 4], &[], &[]], &[2, 2]).unwrap();
        assert_eq!(out, HostData::I32(vec![5, 6, 9, 10]));
        let (low, high) = (scalar(-7), scalar(99));
        let out = dynamic_slice_eval(&[&x, &low, &high], &[&[3, 4], &[], &[]], &[2, 2]).unwrap();
        assert_eq!(out, HostData::I32(vec![2, 3, 6, 7]));
    }

    #[test]
    fn an_update_is_written_at_its_clamped_window_and_the_rest_is_kept() {
        let x = HostData::F32(vec![0.0; 6]);
        let u = HostData::F32(vec![1.0, 2.0]);
        let (i, j) = (scalar(5), scalar(-1));
        let out =
            dynamic_update_slice_eval(&[&x, &u, &i, &j], &[&[3, 2], &[1, 2], &[], &[]]).unwrap();
        assert_eq!(out, HostData::F32(vec![0.0, 0.0, 0.0, 0.0, 1.0, 2.0]));
        let mut target = x.clone();
        dynamic_update_slice_in_place(
            &[None, Some(&u), Some(&i), Some(&j)],
            &[&[3, 2], &[1, 2], &[], &[]],
            &mut target,
        )
        .unwrap();
        assert_eq!(target, out);
    }

    #[test]
    fn shape_rules_check_starts_sizes_and_dtypes_and_name_the_op() {
        let x = Aval::new([3, 4], DType::F32);
        let s = Aval::new(Shape::scalar(), DType::I32);
        let f = Aval::new(Shape::scalar(), DType::F32);
        let mut cx = ShapeCx::new();
        assert_eq!(
            dynamic_slice_shape_rule(&Shape::known(&[2, 4]), &[&x, &s, &s], &mut cx),
            Ok(Aval::new([2, 4], DType::F32))
        );
        let err =
            dynamic_slice_shape_rule(&Shape::known(&[2, 5]), &[&x, &s, &s], &mut cx).unwrap_err();
        assert!(
            err.to_string().contains("dynamic_slice") && err.to_string().contains("axis 1"),
            "{err}"
        );
        let err =
            dynamic_slice_shape_rule(&Shape::known(&[2, 4]), &[&x, &s, &f], &mut cx).unwrap_err();
        assert!(
            err.to_string()
                .contains("start 1 must be an integer scalar"),
            "{err}"
        );
        let u = Aval::new([1, 4], DType::F16);
        let err = dynamic_update_slice_shape_rule(&[&x, &u, &s, &s], &mut cx).unwrap_err();
        assert!(
            err.to_string().contains("dynamic_update_slice")
                && err.to_string().contains("f16[1,4]"),
            "{err}"
        );
    }

    #[test]
    fn a_symbolic_dim_gets_a_guard_that_the_window_fits() {
        use crate::ops::Condition;
        use crate::shape::Symbol;
        let n = Dim::symbol(Symbol(0));
        let x = Aval::new(Shape(vec![n.clone(), Dim::Known(4)]), DType::F32);
        let s = Aval::new(Shape::scalar(), DType::I32);
        let mut cx = ShapeCx::new();
        let out = dynamic_slice_shape_rule(&Shape::known(&[2, 4]), &[&x, &s, &s], &mut cx).unwrap();
        assert_eq!(out.shape, Shape::known(&[2, 4]));
        assert!(cx
            .guards
            .iter()
            .any(|g| g.condition == Condition::AtLeast(n.clone(), 2)));
        // The whole symbolic dim always fits, without a guard.
        let mut cx = ShapeCx::new();
        dynamic_slice_shape_rule(&x.shape, &[&x, &s, &s], &mut cx).unwrap();
        assert!(cx.guards.is_empty());
    }

    #[test]
    fn per_example_starts_gather_and_place_windows_without_a_loop() {
        use crate::compile::rule_checks as rules;
        // Starts per example, some out of range (clamped), i32 and u32.
        let x = rules::normal(61, &[4, 5, 3]);
        let rows = Array::from_vec(vec![0i32, 4, -2, 2], &[4]).unwrap();
        let cols = Array::from_vec(vec![2u32, 0, 7, 1], &[4]).unwrap();
        let slice = |a: Vec<Array>| {
            let starts = [a[1].cast(DType::I32), a[2].cast(DType::U32)];
            a[0].dynamic_slice(&starts, &[2, 2])
        };
        let args = [x.clone(), rows.cast(DType::F32), cols.cast(DType::F32)];
        let report = rules::assert_batches_like_stacking("dynamic_slice", slice, &args);
        assert!(
            report.vmap_fallbacks.is_empty(),
            "{:?}",
            report.vmap_fallbacks
        );
        let update = rules::normal(62, &[4, 2, 2]);
        let write = |a: Vec<Array>| {
            let starts = [a[2].cast(DType::I32), a[3].cast(DType::U32)];
            a[0].dynamic_update_slice(&a[1], &starts)
        };
        let args = [x, update, rows.cast(DType::F32), cols.cast(DType::F32)];
        let report = rules::assert_batches_like_stacking("dynamic_update_slice", write, &args);
        assert!(
            report.vmap_fallbacks.is_empty(),
            "{:?}",
            report.vmap_fallbacks
        );
    }
}
