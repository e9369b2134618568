//! Transformations of lazy and traced graphs: reverse-mode autodiff
//! ([`autodiff`]), forward mode ([`forward`]), batching ([`batching`]), implicit arrays and their lowering ([`implicit`]), and
//! custom ops: their user-facing constructors ([`custom`]) and their
//! runtime ([`custom_runtime`]: the forward traced, optimized and built
//! into a small executable per operand shapes).

pub mod autodiff;
pub mod batching;
pub(crate) mod control;
pub mod custom;
pub mod custom_runtime;
pub mod forward;
pub mod implicit;
