//! The shape of a Jacobian over trees ([`JacobianOutput`]): the output
//! tree of a function with each output leaf replaced by the input tree of
//! `∂out_leaf/∂in_leaf` arrays, as JAX's `jacfwd`/`jacrev` return it.

use super::path::tree_err;
use super::Tree;
use crate::error::Result;
use crate::handle::array::Array;
use std::collections::BTreeMap;
use std::vec::IntoIter;

/// An output tree of a function whose Jacobian [`crate::jacfwd`],
/// [`crate::jacrev`] and [`crate::hessian`] compute: `Jacobian` is this
/// tree's type with every array leaf replaced by the argument tree `In`
/// (each of its leaves `∂out_leaf/∂in_leaf`, shape `out_leaf.shape ++
/// in_leaf.shape`).
///
/// * an [`Array`] output: `In` itself (the single-array Jacobian);
/// * tuples, `Vec`, `Option` and string-keyed `BTreeMap`s: the same
///   container of their elements' Jacobians, so `(Array, Array)` gives
///   `(In, In)`;
/// * a `#[derive(Tree)]` struct: Rust cannot name the struct with other
///   leaf types, so it gives `Vec<In>`, one entry per array leaf in
///   flatten (field) order. A Hessian over a struct argument is such a
///   `Vec`: entry `i` is the argument tree of `∂²f/∂leaf_i∂leaf_j`.
///
/// ```
/// use kiln::{jacfwd, Array};
/// let x = Array::from_vec(vec![2.0f32], &[1])?;
/// let (square, cube) = jacfwd(|x: Array| (&x * &x, &x * &x * &x)).call(&x)?;
/// assert_eq!(square.to_vec::<f32>()?, [4.0]);
/// assert_eq!(cube.to_vec::<f32>()?, [12.0]);
/// # Ok::<(), kiln::Error>(())
/// ```
pub trait JacobianOutput<In: Tree>: Tree {
    /// This tree with each array leaf replaced by an `In`.
    type Jacobian: Tree;

    /// The Jacobian from one `In` per array leaf of `self`, taken from
    /// `per_leaf` in flatten order; an `Err` when `per_leaf` runs out.
    fn jacobian_from(&self, per_leaf: &mut IntoIter<In>) -> Result<Self::Jacobian>;
}

impl<In: Tree> JacobianOutput<In> for Array {
    type Jacobian = In;

    fn jacobian_from(&self, per_leaf: &mut IntoIter<In>) -> Result<In> {
        per_leaf
            .next()
            .ok_or_else(|| tree_err("a Jacobian has fewer entries than the output has leaves"))
    }
}

macro_rules! tuple_jacobian {
    ($($t:ident $i:tt),+) => {
        impl<In: Tree, $($t: JacobianOutput<In>),+> JacobianOutput<In> for ($($t,)+) {
            type Jacobian = ($($t::Jacobian,)+);

            fn jacobian_from(&self, per_leaf: &mut IntoIter<In>) -> Result<Self::Jacobian> {
                Ok(($(self.$i.jacobian_from(per_leaf)?,)+))
            }
        }
    };
}

tuple_jacobian!(A 0);
tuple_jacobian!(A 0, B 1);
tuple_jacobian!(A 0, B 1, C 2);
tuple_jacobian!(A 0, B 1, C 2, D 3);

impl<In: Tree, T: JacobianOutput<In>> JacobianOutput<In> for Vec<T> {
    type Jacobian = Vec<T::Jacobian>;

    fn jacobian_from(&self, per_leaf: &mut IntoIter<In>) -> Result<Self::Jacobian> {
        self.iter().map(|t| t.jacobian_from(per_leaf)).collect()
    }
}

impl<In: Tree, T: JacobianOutput<In>> JacobianOutput<In> for Option<T> {
    type Jacobian = Option<T::Jacobian>;

    fn jacobian_from(&self, per_leaf: &mut IntoIter<In>) -> Result<Self::Jacobian> {
        self.as_ref().map(|t| t.jacobian_from(per_leaf)).transpose()
    }
}

impl<In: Tree, T: JacobianOutput<In>> JacobianOutput<In> for BTreeMap<String, T> {
    type Jacobian = BTreeMap<String, T::Jacobian>;

    fn jacobian_from(&self, per_leaf: &mut IntoIter<In>) -> Result<Self::Jacobian> {
        self.iter()
            .map(|(k, t)| Ok((k.clone(), t.jacobian_from(per_leaf)?)))
            .collect()
    }
}
