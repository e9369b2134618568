//! User kernels ([`kiln::Kernel`]): their WGSL as the kernel wrote it, with
//! this call's template constants, parameter words and grid.

use crate::spec::{KernelError, KernelSpec, Launch};
use kiln::ops::kernel::{kernel_params, GridArgs};
use kiln::{DType, KernelCall};

/// The dispatch of one call of a user kernel over inputs of `in_dtypes` and
/// `in_shapes` into an output of `out_dtype` and `out_shape`: a kernel
/// without WGSL, dtypes its bindings do not declare, or sizes beyond
/// 32-bit parameters are `Err`s. The output binding holds the in-place
/// input (if the kernel has one); the other inputs are bound in order.
pub fn user_kernel(
    call: &KernelCall,
    in_dtypes: &[DType],
    in_shapes: &[&[usize]],
    out_shape: &[usize],
    out_dtype: DType,
) -> Result<KernelSpec, KernelError> {
    let kernel = &call.kernel;
    let unsupported = |detail: String| KernelError::Unsupported {
        op: kernel.name().to_string(),
        dtypes: detail,
    };
    let wgsl = kernel.wgsl().ok_or_else(|| {
        unsupported("any dtype: it has no WGSL, so it runs on the CPU only".into())
    })?;
    wgsl.check_dtypes(kernel.name(), in_dtypes, out_dtype)
        .map_err(|e| unsupported(e.to_string()))?;
    let params = kernel_params(in_shapes, out_shape).ok_or_else(|| KernelError::TooLarge {
        op: kernel.name().to_string(),
        elements: out_shape.iter().product(),
    })?;
    let grid = wgsl.grid(&GridArgs {
        inputs: in_shapes,
        output: out_shape,
        workgroup_size: wgsl.workgroup_size(),
    });
    let bound = (0..in_shapes.len())
        .filter(|&k| Some(k) != kernel.in_place())
        .collect();
    Ok(KernelSpec {
        source: crate::abi::writable_bindings(&wgsl.instantiate(&call.templates)),
        params,
        workgroups: grid.iter().map(|&g| u64::from(g)).product(),
        bound,
        status: false,
        launch: Some(Launch {
            entry_point: wgsl.entry_point().to_string(),
            grid,
            workgroup_size: wgsl.workgroup_size(),
        }),
    })
}
