//! Kernels that move elements: strided copies (reshape, permute, broadcast,
//! slice), concatenation and gather (`take`).

use crate::element::value_type;
use crate::source::{param, ElementKernel};
use crate::spec::{KernelError, KernelSpec, Target, View};
use kiln::DType;
use std::fmt::Write;

const GATHER: &str = include_str!("wgsl/gather.wgsl");
const CHECK_INDICES: &str = include_str!("wgsl/check_indices.wgsl");

/// Copies `view` of one operand into a contiguous output of `out_shape`:
/// transpose, broadcast, strided slice and reshape are all this kernel with
/// different views.
pub fn copy(view: &View, out_shape: &[usize], target: Target) -> Result<KernelSpec, KernelError> {
    ElementKernel {
        op: "copy",
        views: std::slice::from_ref(view),
        out_shape,
        out_dtype: view.dtype,
        element: format!(
            "fn element(i: u32) -> {} {{\n    return at_0(i);\n}}\n",
            value_type(view.dtype)
        ),
        params: Vec::new(),
        target,
        status: false,
        lanes: 1,
    }
    .assemble()
}

/// Joins contiguous operands of `shapes` along `axis` into `out_shape`.
pub fn concat(
    dtype: DType,
    shapes: &[&[usize]],
    axis: usize,
    out_shape: &[usize],
    target: Target,
) -> Result<KernelSpec, KernelError> {
    let inner: usize = out_shape.iter().skip(axis + 1).product();
    let total = out_shape.get(axis).copied().unwrap_or(1);
    let mut params = vec![param("concat", inner)?, param("concat", total)?];
    let mut element = format!(
        "fn element(i: u32) -> {} {{\n    let inner = params[1];\n    let total = params[2];\n    \
         let r = i % inner;\n    let c = (i / inner) % total;\n    let o = i / (inner * total);\n",
        value_type(dtype)
    );
    let mut start = 0usize;
    for (k, shape) in shapes.iter().enumerate() {
        let len = shape.get(axis).copied().unwrap_or(1);
        let at = params.len() + 1;
        params.push(param("concat", start)?);
        params.push(param("concat", len)?);
        let read = format!(
            "load_{k}((o * params[{}] + c - params[{at}]) * inner + r)",
            at + 1
        );
        if k + 1 == shapes.len() {
            let _ = writeln!(element, "    return {read};");
        } else {
            let _ = writeln!(
                element,
                "    if (c < params[{at}] + params[{}]) {{\n        return {read};\n    }}",
                at + 1
            );
        }
        start += len;
    }
    element.push_str("}\n");
    let views: Vec<View> = shapes
        .iter()
        .map(|shape| View::contiguous(dtype, shape))
        .collect();
    ElementKernel {
        op: "concat",
        views: &views,
        out_shape,
        out_dtype: dtype,
        element,
        params,
        target,
        status: false,
        lanes: 1,
    }
    .assemble()
}

/// NumPy `take` of contiguous `data` along `axis` by contiguous `indices`
/// (i32 or u32; negative i32 indices count from the end). An index still
/// out of range is reported through the status word (the first offending
/// position) and read clamped.
pub fn take(
    dtype: DType,
    data_shape: &[usize],
    index_dtype: DType,
    index_count: usize,
    axis: usize,
    out_shape: &[usize],
    target: Target,
) -> Result<KernelSpec, KernelError> {
    let inner: usize = data_shape.iter().skip(axis + 1).product();
    let n = data_shape.get(axis).copied().unwrap_or(0);
    let element = format!(
        "{}{GATHER}",
        load_index("take", dtype, index_dtype, "in_1")?
    );
    let views = [
        View::contiguous(dtype, data_shape),
        View::contiguous(index_dtype, &[index_count]),
    ];
    ElementKernel {
        op: "take",
        views: &views,
        out_shape,
        out_dtype: dtype,
        element,
        params: vec![
            param("take", inner)?,
            param("take", index_count)?,
            param("take", n)?,
        ],
        target,
        status: true,
        lanes: 1,
    }
    .assemble()
}

/// Checks `index_count` contiguous indices (i32 or u32) against an axis of
/// size `n` (negative i32 indices count from the end), reporting the first
/// out of range through the status word, and writes `index_count` scratch
/// words: for `take` or `scatter_add` results with no elements, whose own
/// kernel never runs but whose indices the reference still checks.
/// `None` for an axis longer than `i32::MAX`, which the kernels' i32
/// arithmetic cannot hold: every i32 index fits it after wrapping, and a
/// u32 index beyond it goes unreported there.
pub fn check_indices(
    op: &str,
    index_dtype: DType,
    index_count: usize,
    n: usize,
    target: Target,
) -> Result<Option<KernelSpec>, KernelError> {
    if i32::try_from(n).is_err() {
        return Ok(None);
    }
    let element = format!(
        "{}{CHECK_INDICES}",
        load_index(op, DType::U32, index_dtype, "in_0")?
    );
    ElementKernel {
        op,
        views: &[View::contiguous(index_dtype, &[index_count])],
        out_shape: &[index_count],
        out_dtype: DType::U32,
        element,
        params: vec![param(op, n)?],
        target,
        status: true,
        lanes: 1,
    }
    .assemble()
    .map(Some)
}

/// `fn load_index(j: u32) -> i32` reading index `j` of the word array
/// `buffer` (i32, or u32 saturated to the i32 range: no axis is that long,
/// so it stays out of range). `Unsupported` for other index dtypes of `op`
/// on `dtype` data.
pub(crate) fn load_index(
    op: &str,
    dtype: DType,
    index_dtype: DType,
    buffer: &str,
) -> Result<String, KernelError> {
    let read = match index_dtype {
        DType::I32 => format!("bitcast<i32>({buffer}[j])"),
        DType::U32 => format!("i32(min({buffer}[j], 2147483647u))"),
        other => {
            return Err(KernelError::Unsupported {
                op: op.into(),
                dtypes: format!("{dtype}, {other}"),
            })
        }
    };
    Ok(format!(
        "fn load_index(j: u32) -> i32 {{\n    return {read};\n}}\n"
    ))
}
