//! `scatter_add`, the transpose of `take`: one invocation per output
//! element summing the update rows its index names (see
//! `wgsl/scatter_add.wgsl`).

use crate::layout::load_index;
use crate::source::{param, ElementKernel};
use crate::spec::{KernelError, KernelSpec, Target, View};
use kiln::DType;

const SCATTER_ADD: &str = include_str!("wgsl/scatter_add.wgsl");

/// Adds contiguous updates into zeros of contiguous `out_shape` along
/// `axis` at `index_count` contiguous indices (i32 or u32; negative i32
/// indices count from the end). Every output element sums its updates in
/// index order, as the reference does; f16 and bf16 sum in f32 and round
/// once, integers wrap. An index out of range is reported through the
/// status word (the first offending position) and adds nowhere.
pub fn scatter_add(
    dtype: DType,
    index_dtype: DType,
    index_count: usize,
    axis: usize,
    out_shape: &[usize],
    target: Target,
) -> Result<KernelSpec, KernelError> {
    const OP: &str = "scatter_add";
    let round = match dtype {
        DType::Bool => {
            return Err(KernelError::Unsupported {
                op: OP.into(),
                dtypes: format!("{dtype}, {index_dtype}"),
            })
        }
        DType::F16 => "round_f16(v)",
        DType::BF16 => "round_bf16(v)",
        _ => "v",
    };
    let outer: usize = out_shape.iter().take(axis).product();
    let inner: usize = out_shape.iter().skip(axis + 1).product();
    let n = out_shape.get(axis).copied().unwrap_or(0);
    // Every update must be addressable with 32-bit indices.
    let updates = outer
        .checked_mul(index_count)
        .and_then(|x| x.checked_mul(inner))
        .ok_or(KernelError::TooLarge {
            op: OP.into(),
            elements: usize::MAX,
        })?;
    param(OP, updates)?;
    let element = format!(
        "{}fn round_sum(v: T) -> T {{\n    return {round};\n}}\n{SCATTER_ADD}",
        load_index(OP, dtype, index_dtype, "in_1")?
    );
    let views = [
        View::contiguous(dtype, &[updates]),
        View::contiguous(index_dtype, &[index_count]),
    ];
    ElementKernel {
        op: OP,
        views: &views,
        out_shape,
        out_dtype: dtype,
        element,
        params: vec![param(OP, inner)?, param(OP, index_count)?, param(OP, n)?],
        target,
        status: true,
        lanes: 1,
    }
    .assemble()
}
