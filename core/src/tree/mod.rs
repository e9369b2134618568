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

/// A new value of the structure of `trees[0]` whose every leaf is
/// `f(leaves)`, `leaves` holding the leaf at that position of each tree, in
/// the order of `trees`: how an optimizer combines parameters, gradients
/// and moments. The trees are left untouched.
///
/// The trees must have one structure (statics and aux data included):
/// otherwise the `Err` names the path of the first difference and which
/// tree differs. A [`Error::Tree`](crate::Error::Tree) that `f` returns at
/// `<root>` gets the leaf's path.
///
/// ```
/// use kiln::{tree_map_n, Array};
/// let p = (Array::from_vec(vec![1.0f32, 2.0], &[2])?, Array::scalar(3.0, kiln::DType::F32));
/// let g = (Array::from_vec(vec![0.5f32, 0.5], &[2])?, Array::scalar(1.0, kiln::DType::F32));
/// let (a, b): (Array, Array) = tree_map_n(&[&p, &g], |x| Ok(x[0] - x[1]))?;
/// assert_eq!(a.to_vec::<f32>()?, [0.5, 1.5]);
/// assert_eq!(b.item::<f32>()?, 2.0);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn tree_map_n<T: Tree>(
    trees: &[&T],
    mut f: impl FnMut(&[&Array]) -> Result<Array>,
) -> Result<T> {
    let Some((first, rest)) = trees.split_first() else {
        return Err(tree_err(
            "tree_map_n needs at least one tree, none was given",
        ));
    };
    let (first_leaves, def) = tree_flatten(*first)?;
    let mut columns = vec![first_leaves];
    for (k, tree) in rest.iter().enumerate() {
        let (leaves, other) = tree_flatten(*tree)?;
        if let Some(difference) = def.first_difference(&other) {
            return Err(mismatch_error(k + 1, difference));
        }
        columns.push(leaves);
    }
    let paths = def.leaf_paths();
    let mapped = (0..def.num_leaves())
        .map(|i| {
            let row: Vec<&Array> = columns.iter().map(|c| &c[i]).collect();
            f(&row).map_err(|e| with_path(e, &paths[i]))
        })
        .collect::<Result<Vec<_>>>()?;
    tree_unflatten(&def, mapped)
}

/// [`tree_map_n`] over two trees: `f(a_leaf, b_leaf)` for every leaf.
///
/// ```
/// use kiln::{tree_map2, Array};
/// let p = vec![Array::from_vec(vec![1.0f32, 2.0], &[2])?];
/// let g = vec![Array::from_vec(vec![0.5f32, 0.5], &[2])?];
/// let q: Vec<Array> = tree_map2(&p, &g, |w, dw| Ok(w - dw))?;
/// assert_eq!(q[0].to_vec::<f32>()?, [0.5, 1.5]);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn tree_map2<T: Tree>(
    a: &T,
    b: &T,
    mut f: impl FnMut(&Array, &Array) -> Result<Array>,
) -> Result<T> {
    tree_map_n(&[a, b], |x| f(x[0], x[1]))
}

/// The error for tree `index` of a [`tree_map_n`] call whose structure
/// differs from the first tree's.
fn mismatch_error(index: usize, difference: TreeDifference) -> crate::error::Error {
    let detail = match difference.kind {
        DifferenceKind::Structure { before, now } => format!(
            "the trees differ in structure: tree {index} has {now} where tree 0 has {before}"
        ),
        DifferenceKind::Static { before, now } => format!(
            "the trees differ in a static value: tree {index} has {now} where tree 0 has {before}"
        ),
    };
    crate::error::Error::Tree {
        path: difference.path.to_string(),
        detail,
    }
}

/// `error` with `path` in front of its tree path (other errors unchanged).
fn with_path(error: crate::error::Error, path: &KeyPath) -> crate::error::Error {
    path.iter()
        .rev()
        .fold(error, |e, entry| prefix_error(e, entry.clone()))
}

/// The number of elements of all leaves of `tree` together: a model's
/// parameter count. A leaf with a symbolic dim is an `Err` naming its path.
///
/// ```
/// use kiln::{parameter_count, Array, DType};
/// let params = (Array::zeros(&[3, 4], DType::F32), Array::zeros(&[4], DType::F32));
/// assert_eq!(parameter_count(&params)?, 16);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn parameter_count<T: Tree>(tree: &T) -> Result<usize> {
    let mut total = 0usize;
    for (path, leaf) in tree_flatten_with_path(tree)? {
        let known = leaf
            .shape()
            .numel_known()
            .ok_or_else(|| crate::error::Error::Tree {
                path: path.to_string(),
                detail: format!(
                    "the leaf is {} with a symbolic dim, so its element count is unknown",
                    leaf.aval()
                ),
            })?;
        total = total
            .checked_add(known)
            .ok_or_else(|| crate::error::Error::Tree {
                path: path.to_string(),
                detail: "the parameter count overflows usize".to_string(),
            })?;
    }
    Ok(total)
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

    #[derive(crate::Tree)]
    struct Layer {
        w: Array,
        b: Array,
    }

    fn vector(values: &[f32]) -> Array {
        Array::from_vec(values.to_vec(), &[values.len()]).unwrap()
    }

    fn layer(w: &[f32], b: &[f32]) -> Layer {
        Layer {
            w: vector(w),
            b: vector(b),
        }
    }

    #[test]
    fn tree_map_n_combines_the_leaves_at_each_position() {
        let (p, g, m) = (
            layer(&[1.0, 2.0], &[3.0]),
            layer(&[0.5, 1.0], &[1.0]),
            layer(&[10.0, 20.0], &[30.0]),
        );
        let out: Layer = tree_map_n(&[&p, &g, &m], |x| Ok(x[0] - x[1] + x[2])).unwrap();
        assert_eq!(out.w.to_vec::<f32>().unwrap(), [10.5, 21.0]);
        assert_eq!(out.b.to_vec::<f32>().unwrap(), [32.0]);
        assert_eq!(p.w.to_vec::<f32>().unwrap(), [1.0, 2.0], "inputs untouched");
    }

    #[test]
    fn tree_map2_maps_pairs_of_leaves() {
        let out: Layer = tree_map2(&layer(&[1.0], &[2.0]), &layer(&[3.0], &[4.0]), |a, b| {
            Ok(a * b)
        })
        .unwrap();
        assert_eq!(out.w.to_vec::<f32>().unwrap(), [3.0]);
        assert_eq!(out.b.to_vec::<f32>().unwrap(), [8.0]);
    }

    #[test]
    fn tree_map_n_names_the_path_of_the_first_structural_difference() {
        let a = vec![layer(&[1.0], &[1.0]), layer(&[1.0], &[1.0])];
        let b = vec![
            layer(&[1.0], &[1.0]),
            layer(&[1.0], &[1.0]),
            layer(&[1.0], &[1.0]),
        ];
        let Err(crate::Error::Tree { path, detail }) =
            tree_map_n(&[&a, &a, &b], |x| Ok(x[0].clone()))
        else {
            panic!("expected a tree error")
        };
        assert_eq!(path, "<root>");
        assert!(detail.contains("tree 2"), "{detail}");
        let inner = vec![Some(vector(&[1.0])), None];
        let other = vec![Some(vector(&[1.0])), Some(vector(&[2.0]))];
        let Err(crate::Error::Tree { path, detail }) =
            tree_map_n(&[&inner, &other], |x| Ok(x[0].clone()))
        else {
            panic!("expected a tree error")
        };
        assert_eq!(path, "[1]");
        assert!(detail.contains("tree 1"), "{detail}");
    }

    #[test]
    fn tree_map_n_differing_statics_are_an_error_naming_the_field() {
        let a = Inside {
            x: vector(&[1.0]),
            n: 1,
        };
        let b = Inside {
            x: vector(&[1.0]),
            n: 2,
        };
        let Err(crate::Error::Tree { path, detail }) = tree_map_n(&[&a, &b], |x| Ok(x[0].clone()))
        else {
            panic!("expected a tree error")
        };
        assert_eq!(path, "n");
        assert!(detail.contains("static"), "{detail}");
    }

    #[test]
    fn tree_map_n_puts_the_leaf_path_on_a_tree_error_from_f() {
        let p = vec![layer(&[1.0], &[1.0])];
        // The first leaf visited is `[0].w`; mapping stops at its error.
        let result: Result<Vec<Layer>> = tree_map_n(&[&p], |_| Err(tree_err("refused")));
        let Err(crate::Error::Tree { path, detail }) = result else {
            panic!("expected a tree error")
        };
        assert_eq!(path, "[0].w");
        assert_eq!(detail, "refused");
    }

    #[test]
    fn tree_map_n_of_no_trees_is_an_error() {
        let result: Result<Array> = tree_map_n::<Array>(&[], |x| Ok(x[0].clone()));
        assert!(matches!(result, Err(crate::Error::Tree { .. })));
    }

    #[test]
    fn parameter_count_sums_the_elements_of_every_leaf() {
        let params = vec![
            Layer {
                w: Array::zeros(&[3, 4], crate::DType::F32),
                b: Array::zeros(&[4], crate::DType::F32),
            },
            Layer {
                w: Array::zeros(&[4, 1], crate::DType::F16),
                b: Array::scalar(0.0, crate::DType::F32),
            },
        ];
        assert_eq!(parameter_count(&params).unwrap(), 12 + 4 + 4 + 1);
        assert_eq!(parameter_count(&Vec::<Array>::new()).unwrap(), 0);
    }

    #[test]
    fn parameter_count_of_a_symbolic_leaf_is_an_error_naming_it() {
        use crate::shape::{Dim, Shape, Symbol};
        let symbolic = Array::scalar(0.0, crate::DType::F32)
            .broadcast_to(Shape::from(vec![Dim::symbol(Symbol(0)), Dim::Known(2)]));
        let params = Layer {
            w: Array::zeros(&[2], crate::DType::F32),
            b: symbolic,
        };
        let Err(crate::Error::Tree { path, detail }) = parameter_count(&params) else {
            panic!("expected a tree error")
        };
        assert_eq!(path, "b");
        assert!(detail.contains("symbolic"), "{detail}");
    }
}
