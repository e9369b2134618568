//! Shared helpers of Kiln's integration tests (in `tests/tests/`) and the
//! benchmark program.

pub mod arrays;
pub mod bench;
pub mod conformance;
pub mod decoding;
pub mod gpu;
pub mod isolate;
pub mod programs;
pub mod rss;
pub mod xla;

use kiln::ops::kernel::{Kernel, KernelBuilder};
use kiln::{Array, Executable, HostData};

/// A user kernel named `name` that doubles its one input `x`: a shape
/// rule and a CPU reference, no WGSL, no gradient or batching rule (add
/// what a test needs, then `build`).
pub fn doubling_kernel(name: &str) -> KernelBuilder {
    Kernel::builder(name, ["x"])
        .shape_rule(|inputs, _| Ok(inputs[0].clone()))
        .reference(|call| {
            Ok(HostData::from_f64s(
                call.out_dtype,
                call.inputs[0].to_f64_vec().into_iter().map(|v| 2.0 * v),
            ))
        })
}

/// The shape of every value of `exe` when called with argument leaves
/// `leaves` (all of known shape).
///
/// # Panics
/// When a leaf's shape is symbolic or the shapes do not fit `exe`.
pub fn value_shapes(exe: &Executable, leaves: &[Array]) -> Vec<Vec<usize>> {
    let leaf_shapes: Vec<Vec<usize>> = leaves
        .iter()
        .map(|a| a.shape().as_known().expect("argument shapes are known"))
        .collect();
    let refs: Vec<&[usize]> = leaf_shapes.iter().map(Vec::as_slice).collect();
    exe.resolve_shapes(&refs)
        .expect("the arguments fit the executable")
        .into_owned()
}
