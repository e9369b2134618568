//! `pad_slice`, the transpose of `slice`: places an array at a strided
//! slice of zeros. The user method, shape rule and reference evaluation.

use super::layout::{slice_shape_rule, slice_view, SliceAxis};
use super::strided::numel;
use super::{Op, ShapeCx};
use crate::data::{HostData, HostElement};
use crate::dtype::Element;
use crate::error::{arg_err, shape_err, Error, Result};
use crate::handle::array::Array;
use crate::shape::{Aval, Shape};

const OP: &str = "pad_slice";

impl Array {
    /// Places `self` at the strided slice `axes` (one [`SliceAxis`] per dim)
    /// of zeros of `shape`: the transpose of [`Array::slice`], so
    /// `x.slice(axes).pad_slice(axes, x.shape())` keeps the sliced elements
    /// of `x` in place and zeros the rest. `self` must have the shape
    /// `slice` gives for `shape`.
    ///
    /// ```
    /// use kiln::{Array, SliceAxis};
    /// let x = Array::from_vec(vec![1i32, 2], &[2]).unwrap();
    /// let odd = [SliceAxis { start: 1, stop: None, step: 2 }];
    /// assert_eq!(x.pad_slice(&odd, [5]).to_vec::<i32>().unwrap(), [0, 1, 0, 2, 0]);
    /// ```
    #[track_caller]
    pub fn pad_slice(&self, axes: &[SliceAxis], shape: impl Into<Shape>) -> Array {
        Array::apply(
            Op::PadSlice {
                axes: axes.to_vec(),
                shape: shape.into(),
            },
            vec![self.clone()],
        )
    }
}

/// The aval of padding `x` into `shape`: `x` must have the shape that
/// [`slice_shape_rule`] gives for `axes` on `shape` (its guards, and one
/// per dim that cannot be proven equal, are recorded in `cx`).
pub fn pad_slice_shape_rule(
    axes: &[SliceAxis],
    shape: &Shape,
    x: &Aval,
    cx: &mut ShapeCx,
) -> Result<Aval> {
    let padded = Aval::new(shape.clone(), x.dtype);
    let sliced = slice_shape_rule(axes, &padded, cx).map_err(|e| match e {
        // The slice rule names `slice`; the mistake was made in this op.
        Error::InvalidArgument { detail, .. } => arg_err(OP, detail),
        other => other,
    })?;
    let mismatch = || {
        shape_err(
            OP,
            &[x],
            format!(
                "the operand must have the shape {} of the slice of {shape}",
                sliced.shape
            ),
        )
    };
    if x.shape.rank() != sliced.shape.rank() {
        return Err(mismatch());
    }
    for (d, s) in x.shape.dims().iter().zip(sliced.shape.dims()) {
        cx.unify(d, s).ok_or_else(mismatch)?;
    }
    Ok(padded)
}

/// Reference pad_slice: zeros of `out_shape`, with the operand written
/// through the strided view [`slice_view`] reads a slice of `out_shape`
/// from, so the two ops agree on every resolved start and step.
pub fn pad_slice_eval(
    axes: &[SliceAxis],
    data: &HostData,
    in_shape: &[usize],
    out_shape: &[usize],
) -> Result<HostData> {
    let fits = axes.len() == out_shape.len()
        && in_shape.len() == out_shape.len()
        && axes
            .iter()
            .zip(out_shape)
            .zip(in_shape)
            .all(|((ax, &n), &len)| ax.resolve(n).1 == len)
        && data.len() == numel(in_shape);
    if !fits {
        return Err(arg_err(
            OP,
            format!("an operand of shape {in_shape:?} is not the slice of {out_shape:?}"),
        ));
    }
    let (offset, strides) = slice_view(axes, out_shape);
    Ok(crate::with_host_data!(data, v => HostElement::wrap(
        place(v, numel(out_shape), offset, in_shape, &strides)
    )))
}

/// Zeros of `len` with `src` (row-major over `shape`) written at `offset`
/// with `strides`.
fn place<T: Element>(
    src: &[T],
    len: usize,
    offset: usize,
    shape: &[usize],
    strides: &[usize],
) -> Vec<T> {
    let mut out = vec![T::from_f64(0.0); len];
    super::strided::scatter(&mut out, offset, shape, strides, src);
    out
}

/// The cotangent of `pad_slice(x)`: the slice of `g` where `x` was placed.
#[track_caller]
pub(crate) fn vjp(axes: &[SliceAxis], g: &Array) -> Array {
    g.slice(axes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::layout::slice_eval;
    use crate::ops::strided::proptest_config;
    use crate::ops::{Condition, Guard};
    use crate::shape::{Dim, Symbol};
    use crate::DType;
    use proptest::prelude::*;

    fn sl(start: i64, stop: Option<i64>, step: i64) -> SliceAxis {
        SliceAxis { start, stop, step }
    }

    fn sym(i: u32) -> Dim {
        Dim::symbol(Symbol(i))
    }

    #[test]
    fn places_a_strided_two_axis_slice_among_zeros() {
        let x = HostData::I32(vec![1, 2, 3, 4]);
        let axes = [sl(1, None, 1), sl(0, None, 2)];
        let out = pad_slice_eval(&axes, &x, &[2, 2], &[3, 4]).unwrap();
        assert_eq!(out, HostData::I32(vec![0, 0, 0, 0, 1, 0, 2, 0, 3, 0, 4, 0]));
    }

    #[test]
    fn negative_bounds_and_empty_slices_resolve_like_slice() {
        let out = pad_slice_eval(
            &[sl(-3, Some(-1), 1)],
            &HostData::F32(vec![7.0, 8.0]),
            &[2],
            &[5],
        );
        assert_eq!(out, Ok(HostData::F32(vec![0.0, 0.0, 7.0, 8.0, 0.0])));
        let out = pad_slice_eval(&[sl(4, Some(2), 1)], &HostData::Bool(vec![]), &[0], &[3]);
        assert_eq!(out, Ok(HostData::Bool(vec![false; 3])));
    }

    #[test]
    fn eval_rejects_an_operand_of_another_shape() {
        let err =
            pad_slice_eval(&[sl(0, None, 2)], &HostData::F32(vec![1.0]), &[1], &[5]).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }));
        assert!(err.to_string().contains("pad_slice"), "{err}");
    }

    #[test]
    fn shape_rule_checks_the_operand_against_the_slice_shape() {
        let x = Aval::new([2, 2], DType::F16);
        let axes = [sl(1, None, 1), sl(0, None, 2)];
        let out = pad_slice_shape_rule(&axes, &Shape::known(&[3, 4]), &x, &mut ShapeCx::new());
        assert_eq!(out, Ok(Aval::new([3, 4], DType::F16)));
        let err = pad_slice_shape_rule(&axes, &Shape::known(&[3, 5]), &x, &mut ShapeCx::new())
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, Error::Shape { .. })
                && msg.contains("pad_slice")
                && msg.contains("f16[2,2]")
                && msg.contains("[2,3]"),
            "{msg}"
        );
        let err = pad_slice_shape_rule(&axes[..1], &Shape::known(&[3, 4]), &x, &mut ShapeCx::new())
            .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidArgument { op, .. } if op == "pad_slice"),
            "{err}"
        );
    }

    #[test]
    fn shape_rule_on_a_symbolic_shape_proves_the_slice_of_itself() {
        // Slicing `[s0]` by `1::2` and padding back needs no equality guard:
        // the operand's dim is the slice rule's own expression.
        let shape = Shape(vec![sym(0)]);
        let axes = [sl(1, None, 2)];
        let mut cx = ShapeCx::new();
        let sliced =
            slice_shape_rule(&axes, &Aval::new(shape.clone(), DType::F32), &mut cx).unwrap();
        let mut cx = ShapeCx::new();
        let out = pad_slice_shape_rule(&axes, &shape, &sliced, &mut cx).unwrap();
        assert_eq!(out, Aval::new(shape, DType::F32));
        assert_eq!(
            cx.guards,
            vec![Guard {
                op: String::new(),
                condition: Condition::AtLeast(sym(0), 1)
            }]
        );
    }

    #[test]
    fn shape_rule_guards_dims_it_cannot_prove_equal() {
        let x = Aval::new(Shape(vec![sym(1)]), DType::F32);
        let mut cx = ShapeCx::new();
        let out = pad_slice_shape_rule(&[sl(0, None, 1)], &Shape(vec![sym(0)]), &x, &mut cx);
        assert_eq!(out, Ok(Aval::new(Shape(vec![sym(0)]), DType::F32)));
        assert_eq!(
            cx.guards,
            vec![Guard {
                op: String::new(),
                condition: Condition::Equal(sym(1), sym(0))
            }]
        );
    }

    fn iota(n: usize) -> HostData {
        HostData::I32((1..=n as i32).collect())
    }

    /// A shape of rank 0 to 3 and one slice per axis.
    fn shape_and_axes() -> impl Strategy<Value = (Vec<usize>, Vec<SliceAxis>)> {
        prop::collection::vec(
            (0usize..6, -8i64..8, proptest::option::of(-8i64..8), 1i64..4),
            0..4,
        )
        .prop_map(|axes| {
            axes.into_iter()
                .map(|(n, start, stop, step)| (n, sl(start, stop, step)))
                .unzip()
        })
    }

    fn sliced_shape(axes: &[SliceAxis], shape: &[usize]) -> Vec<usize> {
        axes.iter()
            .zip(shape)
            .map(|(a, &n)| a.resolve(n).1)
            .collect()
    }

    proptest! {
        #![proptest_config(proptest_config())]
        /// `pad_slice(slice(x))` is `x` times the mask of sliced positions,
        /// the mask built by a naive walk of NumPy's indices.
        #[test]
        fn pad_of_slice_is_x_masked((shape, axes) in shape_and_axes()) {
            let x = iota(numel(&shape));
            let small = sliced_shape(&axes, &shape);
            let sliced = slice_eval(&axes, &x, &shape, &small);
            let out = pad_slice_eval(&axes, &sliced, &small, &shape).unwrap();
            let taken = |d: usize, i: usize| {
                let (start, len) = axes[d].resolve(shape[d]);
                let step = axes[d].step as usize;
                i >= start && (i - start).is_multiple_of(step) && (i - start) / step < len
            };
            let strides = crate::ops::strided::row_major_strides(&shape);
            let want: Vec<i32> = x.to_vec::<i32>().iter().enumerate().map(|(flat, &v)| {
                let kept = (0..shape.len()).all(|d| taken(d, flat / strides[d] % shape[d]));
                if kept { v } else { 0 }
            }).collect();
            prop_assert_eq!(out, HostData::I32(want));
        }

        /// `<slice(x), g> == <x, pad_slice(g)>` with integer data.
        #[test]
        fn pad_slice_is_the_transpose_of_slice((shape, axes) in shape_and_axes()) {
            let x = iota(numel(&shape));
            let small = sliced_shape(&axes, &shape);
            let g = HostData::I32((0..numel(&small) as i32).map(|i| i * 3 - 7).collect());
            let sliced = slice_eval(&axes, &x, &shape, &small);
            let padded = pad_slice_eval(&axes, &g, &small, &shape).unwrap();
            let dot = |a: &HostData, b: &HostData| a.to_f64_vec().iter().zip(b.to_f64_vec()).map(|(x, y)| x * y).sum::<f64>();
            prop_assert_eq!(dot(&sliced, &g), dot(&x, &padded));
        }

        /// The shape rule accepts exactly the shape `slice` gives.
        #[test]
        fn shape_rule_accepts_the_slice_shape((shape, axes) in shape_and_axes()) {
            let full = Shape::known(&shape);
            let small = Aval::new(sliced_shape(&axes, &shape), DType::U8);
            let out = pad_slice_shape_rule(&axes, &full, &small, &mut ShapeCx::new());
            prop_assert_eq!(out, Ok(Aval::new(full, DType::U8)));
        }
    }

    use crate::compile::rule_checks as rules;

    #[test]
    fn pad_slice_jvp_pads_the_tangent() {
        let axes = [sl(1, Some(6), 2), sl(0, None, 1)];
        let f = move |x: Vec<Array>| x[0].pad_slice(&axes, [7, 2]);
        rules::assert_jvp_matches_central_difference("pad_slice", f, &[rules::normal(29, &[3, 2])]);
    }

    #[test]
    fn pad_slice_batches_with_the_batch_axis_first() {
        let axes = [sl(1, Some(6), 2), sl(0, None, 1)];
        let f = move |x: Vec<Array>| x[0].pad_slice(&axes, [7, 2]);
        let report =
            rules::assert_batches_like_stacking("pad_slice", f, &[rules::normal(30, &[4, 3, 2])]);
        assert!(
            report.vmap_fallbacks.is_empty(),
            "{:?}",
            report.vmap_fallbacks
        );
    }
}
