//! `pad_slice`, the transpose of a strided slice: one invocation per output
//! element, reading the operand where the slice lands and zero elsewhere
//! (see `wgsl/pad_slice.wgsl`).

use crate::source::{param, ElementKernel};
use crate::spec::{KernelError, KernelSpec, Target, View};
use kiln::shape::row_major_strides;
use kiln::{DType, SliceAxis};

const PAD_SLICE: &str = include_str!("wgsl/pad_slice.wgsl");

/// Places a contiguous operand of the shape `slice` gives for `axes` on
/// `out_shape` at that slice of zeros of `out_shape`. Starts and lengths
/// resolve with [`SliceAxis::resolve`], as the reference's do.
pub fn pad_slice(
    dtype: DType,
    axes: &[SliceAxis],
    out_shape: &[usize],
    target: Target,
) -> Result<KernelSpec, KernelError> {
    const OP: &str = "pad_slice";
    if axes.len() != out_shape.len() {
        return Err(KernelError::Unsupported {
            op: OP.into(),
            dtypes: format!("{} slices of a rank-{} output", axes.len(), out_shape.len()),
        });
    }
    let resolved: Vec<(usize, usize)> = axes
        .iter()
        .zip(out_shape)
        .map(|(ax, &n)| ax.resolve(n))
        .collect();
    let taken: Vec<usize> = resolved.iter().map(|&(_, len)| len).collect();
    let strides = row_major_strides(&taken);
    let mut params = vec![param(OP, out_shape.len())?];
    for (((ax, &n), &(start, len)), &stride) in
        axes.iter().zip(out_shape).zip(&resolved).zip(&strides)
    {
        // A step only matters between two taken elements, and then it is
        // below the axis size.
        let step = if len > 1 {
            usize::try_from(ax.step).unwrap_or(usize::MAX)
        } else {
            1
        };
        for value in [n, start, step, len, stride] {
            params.push(param(OP, value)?);
        }
    }
    ElementKernel {
        op: OP,
        views: &[View::contiguous(dtype, &taken)],
        out_shape,
        out_dtype: dtype,
        element: PAD_SLICE.to_string(),
        params,
        target,
        status: false,
        lanes: 1,
    }
    .assemble()
}
