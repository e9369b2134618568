//! Kiln's playground: Rhai scripts over Kiln's API, and the reports a run
//! produces for the page to show.
//!
//! Everything here is plain Rust that compiles and is tested natively; the
//! page (a Web Worker running [`script::Session`]s and a UI rendering
//! [`report::RunReport`]s) is a thin layer over it.
#![warn(missing_docs)]

pub mod backend;
pub mod examples;
pub mod format;
pub mod graph;
pub mod help;
#[cfg(target_arch = "wasm32")]
mod page;
pub mod protocol;
pub mod report;
pub mod script;
pub mod share;
pub mod source;
pub mod timed_cpu;
pub mod view;
