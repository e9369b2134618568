//! The graph IR and the passes that rewrite it. The IR holds ops
//! ([`crate::ops::Op`]) and data, never an `Array`: tracing (above it)
//! turns arrays into graphs.

pub mod control;
pub mod graph;
pub mod passes;
