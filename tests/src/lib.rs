//! Shared helpers of Kiln's integration tests (in `tests/tests/`) and the
//! benchmark program.

pub mod bench;
pub mod conformance;
pub mod gpu;
pub mod isolate;
pub mod programs;
pub mod rss;

use kiln::{Array, Executable};

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
