//! Trees: values made of arrays, containers, structs and static values,
//! flattened into array leaves plus a [`TreeDef`] and rebuilt from them.
//!
//! The `TreeDef` is part of the compile cache key: statics and aux data count
//! by equality. Unflattening always builds a new value; it never mutates the
//! caller's.
//!
//! Trees nest at most [`MAX_TREE_DEPTH`] containers: flattening or
//! unflattening a deeper one is an `Err` naming the path where the limit was
//! reached, never a stack overflow, and so is a registered node type whose
//! flatten returns the node itself. [`Value`]s themselves (what scripts
//! build) can nest any depth: they drop and clone without deep recursion,
//! and `Debug` prints the first `MAX_TREE_DEPTH` levels.
//!
//! ```
//! use kiln::{tree_flatten, tree_unflatten, Array, Tree};
//!
//! #[derive(Tree, Debug)]
//! struct Pair {
//!     a: Array,
//!     b: Array,
//!     #[tree(static)]
//!     name: String,
//! }
//!
//! let p = Pair {
//!     a: Array::from_vec(vec![1.0_f32], &[1])?,
//!     b: Array::from_vec(vec![2.0_f32], &[1])?,
//!     name: "pair".into(),
//! };
//! let (leaves, def) = tree_flatten(&p)?;
//! assert_eq!(leaves.len(), 2);
//! assert_eq!(def.to_string(), r#"Pair { a: *, b: *, name: "pair" }"#);
//! let q: Pair = tree_unflatten(&def, leaves)?;
//! assert_eq!(q.name, "pair");
//! # Ok::<(), kiln::Error>(())
//! ```

pub(crate) mod def;
pub(crate) mod depth;
pub mod derive_support;
mod impls;
mod jacobian;
pub(crate) mod path;
pub(crate) mod static_value;
mod value;
mod walk;

pub use def::{intern_key, DifferenceKind, MapKey, NodeDef, TreeDef, TreeDifference};
pub use depth::MAX_TREE_DEPTH;
pub use jacobian::JacobianOutput;
pub use path::{prefix_error, KeyPath, PathEntry};
pub use static_value::{StaticBound, StaticValue};
pub use value::{FlattenFn, NodeType, Registry, UnflattenFn, Value, ValueParts};

use crate::error::Result;
use crate::handle::array::Array;
use path::tree_err;

/// A value that can be flattened into array leaves and a [`TreeDef`], and
/// rebuilt from them. Derive it for structs with `#[derive(Tree)]`.
pub trait Tree: Sized {
    /// Appends this value's array leaves to `leaves` (in order) and returns its structure.
    fn flatten(&self, leaves: &mut Vec<Array>) -> Result<TreeDef>;
    /// Builds a NEW value from a structure and the leaves (consumed in order).
    fn unflatten(def: &TreeDef, leaves: &mut std::vec::IntoIter<Array>) -> Result<Self>;
}

/// The leaves of `value` and its structure.
pub fn tree_flatten<T: Tree>(value: &T) -> Result<(Vec<Array>, TreeDef)> {
    let mut leaves = Vec::new();
    let def = value.flatten(&mut leaves)?;
    Ok((leaves, def))
}

/// Builds a new `T` from `def` and exactly `def.num_leaves()` leaves.
pub fn tree_unflatten<T: Tree>(def: &TreeDef, leaves: Vec<Array>) -> Result<T> {
    let needed = def.num_leaves();
    let given = leaves.len();
    if given < needed {
        return Err(tree_err(format!(
            "ran out of leaves: the structure needs {needed} leaves, {given} were given"
        )));
    }
    if given > needed {
        return Err(tree_err(format!(
            "{given} leaves given, the structure takes {needed}"
        )));
    }
    let mut iter = leaves.into_iter();
    T::unflatten(def, &mut iter)
}

/// The array leaves of `value`, in order.
pub fn tree_leaves<T: Tree>(value: &T) -> Result<Vec<Array>> {
    let mut leaves = Vec::new();
    value.flatten(&mut leaves)?;
    Ok(leaves)
}

/// A new value of the same structure with every leaf replaced by `f(leaf)`.
/// `value` is left untouched.
pub fn tree_map<T: Tree>(value: &T, mut f: impl FnMut(&Array) -> Result<Array>) -> Result<T> {
    let (leaves, def) = tree_flatten(value)?;
    let mapped = leaves.iter().map(&mut f).collect::<Result<Vec<_>>>()?;
    tree_unflatten(&def, mapped)
}

/// Every leaf of `value` with its path, like `p.layers[2].w`.
pub fn tree_flatten_with_path<T: Tree>(value: &T) -> Result<Vec<(KeyPath, Array)>> {
    let (leaves, def) = tree_flatten(value)?;
    Ok(def.leaf_paths().into_iter().zip(leaves).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    // `extern crate self as kiln` lets the derive's `::kiln::` paths resolve here.
    #[derive(crate::Tree)]
    struct Inside {
        x: Array,
        #[tree(static)]
        n: i64,
    }

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn tree_types_are_send_and_sync() {
        assert_send_sync::<TreeDef>();
        assert_send_sync::<StaticValue>();
        assert_send_sync::<Value>();
        assert_send_sync::<Registry>();
        assert_send_sync::<NodeType>();
    }

    #[test]
    fn derive_works_inside_the_crate() {
        let value = Inside {
            x: Array::from_vec(vec![1.0_f32, 2.0], &[2]).unwrap(),
            n: 4,
        };
        let (leaves, def) = tree_flatten(&value).unwrap();
        assert_eq!(def.to_string(), "Inside { x: *, n: 4 }");
        let back: Inside = tree_unflatten(&def, leaves).unwrap();
        assert_eq!(back.x.to_vec::<f32>().unwrap(), [1.0, 2.0]);
        assert_eq!(back.n, 4);
    }

    #[test]
    fn flattening_a_derived_struct_borrows_its_field_names() {
        let value = Inside {
            x: Array::from_vec(vec![1.0_f32], &[1]).unwrap(),
            n: 0,
        };
        let (_, def) = tree_flatten(&value).unwrap();
        let TreeDef::Node(node) = &def else {
            panic!("expected a node")
        };
        assert!(matches!(node.type_name, std::borrow::Cow::Borrowed(_)));
        assert!(node
            .fields
            .iter()
            .all(|(name, _)| matches!(name, std::borrow::Cow::Borrowed(_))));
    }
}
