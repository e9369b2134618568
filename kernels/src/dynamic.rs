//! `dynamic_slice` and `dynamic_update_slice`: windows at start indices
//! read from device memory (one integer scalar operand per axis), clamped
//! as the reference clamps them, and control flow's `switch` result
//! selection (the branch an index names). One invocation per output
//! element; the start operands and the index are read by every invocation.
//!
//! An in-place `dynamic_update_slice` (the plan let it take its array's
//! buffer) of a one-word-per-element dtype writes only its window: one
//! invocation per update element, so a decoding step writing one row of a
//! cache costs a row, not the cache. Packed dtypes (two f16 or four u8 per
//! word) visit the whole array, as neighbours in one word would race.

use crate::abi::bindings;
use crate::element::{buffer_type, load_fn};
use crate::source::{param, prelude, ElementKernel};
use crate::spec::{KernelError, KernelSpec, Target, View};
use kiln::shape::row_major_strides;
use kiln::DType;
use std::fmt::Write;

/// WGSL reading start `k` (operand `first + k`, of `dtypes[k]`) clamped to
/// `0..=params[hi_at + stride * k]`: `fn start(k: u32) -> u32`.
fn start_fn(
    op: &str,
    first: usize,
    dtypes: &[DType],
    hi_at: usize,
    stride: usize,
) -> Result<String, KernelError> {
    let mut source = String::from("fn start(k: u32) -> u32 {\n    switch k {\n");
    for (k, dtype) in dtypes.iter().enumerate() {
        let hi = format!("params[{}u]", hi_at + stride * k);
        let read = format!("load_{}(0u)", first + k);
        let clamped = match dtype {
            DType::I32 => format!("u32(clamp({read}, 0i, i32({hi})))"),
            DType::U32 => format!("min({read}, {hi})"),
            other => {
                return Err(KernelError::Unsupported {
                    op: op.to_string(),
                    dtypes: format!("{other} start indices"),
                })
            }
        };
        let _ = writeln!(source, "        case {k}u: {{ return {clamped}; }}");
    }
    source.push_str("        default: { return 0u; }\n    }\n}\n");
    Ok(source)
}

/// The window of `sizes` of a contiguous `x` of `shape` at the clamped
/// starts (operands 1.., of `start_dtypes`).
pub fn dynamic_slice(
    dtype: DType,
    shape: &[usize],
    start_dtypes: &[DType],
    sizes: &[usize],
    target: Target,
) -> Result<KernelSpec, KernelError> {
    const OP: &str = "dynamic_slice";
    let strides = row_major_strides(shape);
    // params: [count, rank, per axis: window size, highest start, stride]
    let mut params = vec![param(OP, shape.len())?];
    for ((&n, &size), &stride) in shape.iter().zip(sizes).zip(&strides) {
        for value in [size, n.saturating_sub(size), stride] {
            params.push(param(OP, value)?);
        }
    }
    let mut element = start_fn(OP, 1, start_dtypes, 3, 3)?;
    element.push_str(
        "fn element(i: u32) -> T {
    let rank = params[1];
    var rem = i;
    var src = 0u;
    for (var e = 0u; e < rank; e++) {
        let axis = rank - 1u - e;
        let at = 2u + 3u * axis;
        let c = rem % params[at];
        rem /= params[at];
        src += (start(axis) + c) * params[at + 2u];
    }
    return load_0(src);
}
",
    );
    let mut views = vec![View::contiguous(dtype, shape)];
    views.extend(start_dtypes.iter().map(|&d| View::contiguous(d, &[])));
    ElementKernel {
        op: OP,
        views: &views,
        out_shape: sizes,
        out_dtype: dtype,
        element,
        params,
        target,
        status: false,
        lanes: 1,
    }
    .assemble()
}

/// A contiguous `x` of `shape` with a contiguous `update` of
/// `update_shape` written at the clamped starts (operands 2.., of
/// `start_dtypes`); `in_place` reads `x` through the output binding.
pub fn dynamic_update_slice(
    dtype: DType,
    shape: &[usize],
    update_shape: &[usize],
    start_dtypes: &[DType],
    in_place: bool,
    target: Target,
) -> Result<KernelSpec, KernelError> {
    const OP: &str = "dynamic_update_slice";
    let update_strides = row_major_strides(update_shape);
    // params: [count, rank, per axis: size, update size, highest start, update stride]
    let mut params = vec![param(OP, shape.len())?];
    for ((&n, &size), &stride) in shape.iter().zip(update_shape).zip(&update_strides) {
        for value in [n, size, n.saturating_sub(size), stride] {
            params.push(param(OP, value)?);
        }
    }
    let mut element = start_fn(OP, 2, start_dtypes, 4, 4)?;
    element.push_str(
        "fn element(i: u32) -> T {
    let rank = params[1];
    var rem = i;
    var src = 0u;
    var inside = true;
    for (var e = 0u; e < rank; e++) {
        let axis = rank - 1u - e;
        let at = 2u + 4u * axis;
        let c = rem % params[at];
        rem /= params[at];
        let s = start(axis);
        if (c < s || c >= s + params[at + 1u]) {
            inside = false;
        } else {
            src += (c - s) * params[at + 3u];
        }
    }
    if (inside) {
        return load_1(src);
    }
    return load_0(i);
}
",
    );
    let mut views = vec![
        View {
            aliases_output: in_place,
            ..View::contiguous(dtype, shape)
        },
        View::contiguous(dtype, update_shape),
    ];
    views.extend(start_dtypes.iter().map(|&d| View::contiguous(d, &[])));
    ElementKernel {
        op: OP,
        views: &views,
        out_shape: shape,
        out_dtype: dtype,
        element,
        params,
        target,
        status: false,
        lanes: 1,
    }
    .assemble()
}

/// The update's elements written into the window of an array it updates
/// in place (the output binding holds the array): one invocation per
/// update element. `None` for a dtype packed several to a word, whose
/// window writes would race with their neighbours.
pub fn dynamic_update_window(
    dtype: DType,
    shape: &[usize],
    update_shape: &[usize],
    start_dtypes: &[DType],
    target: Target,
) -> Result<Option<KernelSpec>, KernelError> {
    const OP: &str = "dynamic_update_slice";
    if crate::abi::element_bytes(dtype) != 4 {
        return Ok(None);
    }
    let count: usize = update_shape.iter().product();
    let strides = row_major_strides(shape);
    // params: [count, rank, per axis: update size, highest start, array stride]
    let mut params = vec![param(OP, count)?, param(OP, shape.len())?];
    for ((&n, &size), &stride) in shape.iter().zip(update_shape).zip(&strides) {
        for value in [size, n.saturating_sub(size), stride] {
            params.push(param(OP, value)?);
        }
    }
    let element = buffer_type(dtype, target);
    let mut bound: Vec<(usize, &str)> = vec![(1, element)];
    bound.extend(
        start_dtypes
            .iter()
            .enumerate()
            .map(|(k, &d)| (k + 2, buffer_type(d, target))),
    );
    let mut source = prelude(target);
    source.push_str(&bindings(&bound, element));
    for (k, &d) in start_dtypes.iter().enumerate() {
        source.push_str(&load_fn(
            &format!("load_{}", k + 2),
            &format!("in_{}", k + 2),
            d,
            target,
            1,
        ));
    }
    source.push_str(&start_fn(OP, 2, start_dtypes, 3, 3)?);
    source.push_str(
        "@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = flat_index(wid, nwg, lid, 256u);
    if (i >= params[0]) {
        return;
    }
    let rank = params[1];
    var rem = i;
    var dest = 0u;
    for (var e = 0u; e < rank; e++) {
        let axis = rank - 1u - e;
        let at = 2u + 3u * axis;
        let c = rem % params[at];
        rem /= params[at];
        dest += (start(axis) + c) * params[at + 2u];
    }
    // One word per element in both: the update's word, as it is.
    out[dest] = in_1[i];
}
",
    );
    Ok(Some(KernelSpec {
        source,
        params,
        workgroups: (count as u64).div_ceil(256),
        bound: (1..2 + start_dtypes.len()).collect(),
        status: false,
        launch: None,
    }))
}

/// Result element `i` of the branch the index (operand 0, of
/// `index_dtype`, clamped to the branches) names: operands 1.. hold each
/// branch's result, contiguous, of `shape`.
pub fn select_branch(
    dtype: DType,
    index_dtype: DType,
    branches: usize,
    shape: &[usize],
    target: Target,
) -> Result<KernelSpec, KernelError> {
    const OP: &str = "switch";
    // params: [count, highest branch]
    let params = vec![param(OP, branches.saturating_sub(1))?];
    let mut element = start_fn(OP, 0, &[index_dtype], 1, 0)?;
    element.push_str("fn element(i: u32) -> T {\n    switch start(0u) {\n");
    for b in 0..branches {
        let _ = writeln!(
            element,
            "        case {b}u: {{ return load_{}(i); }}",
            b + 1
        );
    }
    element.push_str("        default: { return load_1(i); }\n    }\n}\n");
    let mut views = vec![View::contiguous(index_dtype, &[])];
    views.extend((0..branches).map(|_| View::contiguous(dtype, shape)));
    ElementKernel {
        op: OP,
        views: &views,
        out_shape: shape,
        out_dtype: dtype,
        element,
        params,
        target,
        status: false,
        lanes: 1,
    }
    .assemble()
}
