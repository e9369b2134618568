//! Kiln core: arrays, ops with shape rules, trees, tracing, the compile cache
//! with explained misses, and the CPU executor.

#![warn(missing_docs)]

pub mod array;
pub mod data;
pub mod dtype;
pub mod error;
pub mod ops;
pub mod random;
pub mod shape;

pub use array::Array;
pub use data::{HostData, HostElement};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use ops::{
    BinaryOp, Condition, CustomKernel, CustomOp, Guard, Op, ReduceOp, ShapeCx, SliceAxis, UnaryOp,
};
pub use shape::{Atom, Aval, Dim, Shape, SymExpr, Symbol};
