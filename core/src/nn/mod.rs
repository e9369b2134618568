//! Neural networks: the functions models are written with (softmax, GELU,
//! normalization, attention, losses, dropout) and the layers built from
//! them ([`Linear`], [`Embedding`], [`LayerNorm`], [`RmsNorm`],
//! [`Dropout`], [`Attention`] with its [`KvCache`], [`Mlp`]).
//!
//! Everything here is a composition of Kiln's public ops, recorded under its
//! own name (see [`crate::in_composition`]) so that reports and the
//! playground group a whole layer. It sits above `compile/` and uses only
//! the public API, as `mlx.nn` and flax do. A layer is a `#[derive(Tree)]`
//! struct: it is a compiled function's argument as it is, its parameters
//! are the tree's leaves (for gradients, optimizers and weight files), and
//! its sizes are static fields, part of the cache key.
//!
//! ```
//! use kiln::nn::{Attention, LayerNorm};
//! use kiln::{random::Key, Array, DType};
//! let attention = Attention::new(Key::new(0), 8, 2, 0.02)?;
//! let norm = LayerNorm::new(8, 1e-5);
//! let x = Array::random_normal(Key::new(1), &[1, 3, 8], DType::F32)?;
//! let y = &x + attention.forward(&norm.forward(&x));
//! assert_eq!(y.shape().as_known(), Some(vec![1, 3, 8]));
//! # Ok::<(), kiln::Error>(())
//! ```

mod attention;
mod functions;
mod layers;

pub use crate::ops::nn::{gelu, gelu_tanh, layer_norm, log_softmax, softmax};
pub use attention::{Attention, KvCache};
pub use functions::{
    causal_mask, cross_entropy, dropout, key_array, random_uniform, rope,
    scaled_dot_product_attention, silu,
};
pub use layers::{Activation, Dropout, Embedding, LayerNorm, Linear, Mlp, RmsNorm};

#[cfg(test)]
mod tests;
