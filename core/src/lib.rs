//! Kiln core: arrays, ops with shape rules, trees, tracing, the compile cache
//! with explained misses, and the CPU executor.

// Lets `#[derive(Tree)]`'s `::kiln::` paths resolve inside this crate too.
extern crate self as kiln;

pub mod array;
pub mod data;
pub mod dtype;
pub mod error;
pub mod shape;
pub mod tree;

pub use array::Array;
pub use data::{HostData, HostElement};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use kiln_derive::Tree;
pub use shape::{Atom, Aval, Dim, Shape, SymExpr, Symbol};
pub use tree::{
    tree_flatten, tree_flatten_with_path, tree_leaves, tree_map, tree_unflatten, DifferenceKind,
    KeyPath, NodeDef, NodeType, PathEntry, Registry, StaticValue, Tree, TreeDef, TreeDifference,
    Value,
};
