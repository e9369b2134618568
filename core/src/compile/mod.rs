//! Compiling functions of trees: the cache ([`cache`]) keyed by
//! [`CacheKey`] with explained misses, the [`report`] of what the compiler
//! did, eager evaluation through the same pipeline ([`eval`]), and the
//! transformations built on `compile`: reverse mode ([`grad`]), forward
//! mode and Jacobians ([`forward`]), batching ([`vmap`]).

pub mod cache;
pub mod diff;
pub mod eval;
pub mod forward;
pub mod grad;
pub mod key;
pub mod report;
#[cfg(test)]
pub(crate) mod rule_checks;
pub mod vmap;

pub use cache::{compile, Compiled, Function, FunctionOutput, MISS_LOG_CAPACITY};
pub use key::{CacheKey, LeafSignature};
