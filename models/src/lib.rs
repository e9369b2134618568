//! Models built from [`kiln::nn`]: a GPT-2-style decoder ([`gpt`]), the
//! byte-level data it trains on ([`data`]), and its training step
//! ([`train`]). The `gpt` example trains and decodes it from the command
//! line (`cargo run --release --example gpt -- train`).
//!
//! The models live in a crate of their own, above `kiln`, because they are
//! what a user writes: they use only Kiln's public API, the example can
//! take a GPU backend (`kiln-wgpu`) without `kiln` depending on one, and the
//! benchmarks and tests (`kiln-tests`) measure the same model the example
//! trains.
#![warn(missing_docs)]

pub mod data;
pub mod gpt;
pub mod train;

pub use gpt::{decode, pick_tokens, Block, Gpt, GptConfig, Sampling};
