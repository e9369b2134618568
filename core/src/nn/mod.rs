//! Neural networks: the functions models are written with (softmax, GELU,
//! layer norm, attention, losses) and the layers built from them.
//!
//! Everything here is a composition of Kiln's public ops, recorded under its
//! own name (see [`crate::in_composition`]) so that reports and the
//! playground group a whole layer. It sits above `compile/` and imports only
//! the public API, as `mlx.nn` and flax do.

pub use crate::ops::nn::{gelu, gelu_tanh, layer_norm, log_softmax, softmax};
