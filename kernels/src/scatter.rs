//! `scatter_add`, the transpose of `take`: one workgroup per few output
//! rows scanning the indices together and adding the update rows that
//! name them (see `wgsl/scatter_add.wgsl`).

use crate::abi::{bindings, status_binding};
use crate::element::{buffer_type, load_fn};
use crate::family::{accumulator, store_accumulator};
use crate::layout::load_index;
use crate::source::{param, prelude};
use crate::spec::{KernelError, KernelSpec, Target};
use kiln::DType;
use std::fmt::Write;

const SCATTER_ADD: &str = include_str!("wgsl/scatter_add.wgsl");
/// Output rows per workgroup of `scatter_add`: each index read serves all
/// of them. Defined here once; the kernel gets it as the constant `ROWS`.
const ROWS: usize = 8;

/// Adds contiguous updates into zeros of contiguous `out_shape` along
/// `axis` at `index_count` contiguous indices (i32 or u32; negative i32
/// indices count from the end). Every output element sums its updates in
/// index order, as the reference does; f16 and bf16 sum in f32 words
/// (see [`crate::stores_f32`]) and round once when packed, integers wrap.
/// An index out of range is reported through the status word (the first
/// offending position) and adds nowhere.
pub fn scatter_add(
    dtype: DType,
    index_dtype: DType,
    index_count: usize,
    axis: usize,
    out_shape: &[usize],
    target: Target,
) -> Result<KernelSpec, KernelError> {
    const OP: &str = "scatter_add";
    if dtype == DType::Bool {
        return Err(KernelError::Unsupported {
            op: OP.into(),
            dtypes: format!("{dtype}, {index_dtype}"),
        });
    }
    let outer: usize = out_shape.iter().take(axis).product();
    let inner: usize = out_shape.iter().skip(axis + 1).product();
    let n = out_shape.get(axis).copied().unwrap_or(0);
    // Every update and every output must be addressable with 32-bit indices.
    let updates = outer
        .checked_mul(index_count)
        .and_then(|x| x.checked_mul(inner))
        .ok_or(KernelError::TooLarge {
            op: OP.into(),
            elements: usize::MAX,
        })?;
    param(OP, updates)?;
    param(OP, outer * n * inner)?;
    let workgroups = outer * n.div_ceil(ROWS);
    // The output words: f32 for f16 and bf16, which are packed afterwards.
    let word = if crate::stores_f32(dtype) {
        DType::F32
    } else {
        dtype
    };
    let mut source = prelude(target);
    source.push_str(&bindings(
        &[
            (0, buffer_type(dtype, target)),
            (1, buffer_type(index_dtype, target)),
        ],
        "u32",
    ));
    source.push_str(&status_binding(4));
    let _ = writeln!(source, "alias T = {};", accumulator(dtype));
    let _ = writeln!(source, "const ROWS: u32 = {ROWS}u;");
    source.push_str(&load_fn("load_0", "in_0", dtype, target, 1));
    source.push_str(&load_fn("load_out", "out", word, Target::default(), 1));
    source.push_str(&load_index(OP, dtype, index_dtype, "in_1")?);
    source.push_str(store_accumulator(dtype));
    source.push_str(SCATTER_ADD);
    Ok(KernelSpec {
        source,
        params: vec![
            param(OP, workgroups)?,
            param(OP, inner)?,
            param(OP, index_count)?,
            param(OP, n)?,
        ],
        workgroups: u64::from(param(OP, workgroups)?),
        bound: vec![0, 1],
        status: true,
        launch: None,
    })
}
