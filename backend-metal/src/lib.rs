//! Kiln's native Metal backend: a thin executor of the programs
//! `kiln-kernels` lowers, with the Metal Shading Language translated by
//! naga from the same WGSL that wgpu runs.
//!
//! * [`msl`] (every platform): the WGSL → MSL translation with the binding
//!   map the executor relies on; tested on Linux against every kernel the
//!   conformance suite lowers to.
//! * `MetalBackend` (Apple targets only): device, shared-memory buffers,
//!   one command buffer per call, pipelines and programs cached. On other
//!   targets the crate builds with the translation alone.
//!
//! ```no_run
//! # #[cfg(target_vendor = "apple")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use kiln::Array;
//! let metal = kiln_metal::MetalBackend::new()?;
//! let f = kiln::compile(|x: Array| x.exp()).with_backend(metal);
//! # Ok(()) }
//! # #[cfg(not(target_vendor = "apple"))]
//! # fn main() {}
//! ```
#![warn(missing_docs)]

pub mod msl;
#[cfg(target_vendor = "apple")]
mod runtime;

#[cfg(target_vendor = "apple")]
pub use runtime::{Counters, DeviceError, MetalBackend, MetalBuffer};
