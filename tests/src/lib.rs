//! Shared helpers of Kiln's integration tests and the benchmark program.
