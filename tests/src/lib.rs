//! Shared helpers of Kiln's integration tests (in `tests/tests/`) and the
//! benchmark program.

pub mod bench;
pub mod conformance;
pub mod gpu;
pub mod programs;
