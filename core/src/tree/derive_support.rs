//! Helpers called by the code `#[derive(Tree)]` generates. Not meant to be
//! called by hand; they are public only so generated code can reach them.

use super::depth::Level;
use super::impls::{mismatch, static_of};
use super::path::{prefix_error, tree_err, PathEntry};
use super::static_value::{StaticBound, StaticValue};
use super::{NodeDef, Tree, TreeDef};
use crate::error::Result;
use crate::handle::array::Array;
use std::borrow::Cow;
use std::marker::PhantomData;
use std::sync::Arc;
use std::vec::IntoIter;

/// The Jacobian of a derived struct: one `In` per array leaf, in flatten
/// order (see [`JacobianOutput`](super::JacobianOutput)).
pub fn jacobian_per_leaf<T: Tree, In>(value: &T, per_leaf: &mut IntoIter<In>) -> Result<Vec<In>> {
    let (leaves, _) = super::tree_flatten(value)?;
    let taken: Vec<In> = per_leaf.take(leaves.len()).collect();
    if taken.len() < leaves.len() {
        return Err(tree_err(
            "a Jacobian has fewer entries than the output has leaves",
        ));
    }
    Ok(taken)
}

/// The def of a derived struct: `type_name` with unit aux and `fields`.
pub fn node(type_name: &'static str, fields: Vec<(Cow<'static, str>, TreeDef)>) -> TreeDef {
    TreeDef::Node(Arc::new(NodeDef {
        type_name: Cow::Borrowed(type_name),
        aux: StaticValue::unit(),
        fields,
    }))
}

/// Flattens a field, prefixing errors with its name. The struct is one
/// level of nesting ([`MAX_TREE_DEPTH`](super::MAX_TREE_DEPTH)).
pub fn flatten_field<T: Tree>(
    value: &T,
    name: &'static str,
    leaves: &mut Vec<Array>,
) -> Result<(Cow<'static, str>, TreeDef)> {
    let _level = Level::enter()?;
    match value.flatten(leaves) {
        Ok(def) => Ok((Cow::Borrowed(name), def)),
        Err(e) => Err(prefix_error(e, PathEntry::Field(Cow::Borrowed(name)))),
    }
}

/// A `#[tree(static)]` field, or (through [`StaticProbe::target`]) its
/// type. Generated code calls `static_def` and `read_static` on a reference
/// to a probe: method resolution picks the float traits for `f32` and `f64`
/// (statics by their bits, since floats are neither `Eq` nor `Hash`) and the
/// value traits for every other [`StaticBound`] type.
pub struct StaticProbe<'a, T>(pub &'a T);

impl<T> StaticProbe<'static, PhantomData<T>> {
    /// A probe for reading a `T` back.
    pub fn target() -> Self {
        StaticProbe(&PhantomData)
    }
}

/// `f32` and `f64`, the statics stored by their bits.
pub trait FloatStatic: Tree {}
impl FloatStatic for f32 {}
impl FloatStatic for f64 {}

/// Writes a float static field.
pub trait StaticFloatField {
    /// The field's def.
    fn static_def(&self, name: &'static str) -> (Cow<'static, str>, TreeDef);
}

impl<F: FloatStatic> StaticFloatField for StaticProbe<'_, F> {
    fn static_def(&self, name: &'static str) -> (Cow<'static, str>, TreeDef) {
        // A float's flatten only wraps its bits; it cannot fail.
        let def = self.0.flatten(&mut Vec::new()).unwrap_or(TreeDef::Unit);
        (Cow::Borrowed(name), def)
    }
}

/// Writes a static field compared by its own `Eq`. An array (or anything
/// else without `Eq` and `Hash`) is rejected where the struct is defined,
/// at the field:
///
/// ```compile_fail
/// #[derive(kiln::Tree)]
/// struct Cfg {
///     #[tree(static)]
///     weights: kiln::Array,
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot hold a `#[tree(static)]` field",
    label = "a static field must be a plain value compared by equality (a number, bool, \
             string, or an enum deriving Clone, Debug, PartialEq, Eq and Hash), not an array"
)]
pub trait StaticValueField {
    /// The field's def.
    fn static_def(&self, name: &'static str) -> (Cow<'static, str>, TreeDef);
}

impl<T: StaticBound> StaticValueField for &StaticProbe<'_, T> {
    fn static_def(&self, name: &'static str) -> (Cow<'static, str>, TreeDef) {
        (
            Cow::Borrowed(name),
            TreeDef::Static(StaticValue::new(self.0.clone())),
        )
    }
}

/// Reads a float static field back.
pub trait StaticFloatRead<F> {
    /// The value stored in `def`.
    fn read_static(&self, def: &TreeDef, name: &'static str) -> Result<F>;
}

impl<F: FloatStatic> StaticFloatRead<F> for StaticProbe<'_, PhantomData<F>> {
    fn read_static(&self, def: &TreeDef, name: &'static str) -> Result<F> {
        F::unflatten(def, &mut Vec::new().into_iter())
            .map_err(|e| prefix_error(e, PathEntry::Field(Cow::Borrowed(name))))
    }
}

/// Reads a static field compared by its own `Eq` back.
pub trait StaticValueRead<T> {
    /// The value stored in `def`.
    fn read_static(&self, def: &TreeDef, name: &'static str) -> Result<T>;
}

impl<T: StaticBound> StaticValueRead<T> for &StaticProbe<'_, PhantomData<T>> {
    fn read_static(&self, def: &TreeDef, name: &'static str) -> Result<T> {
        static_of::<T>(def, std::any::type_name::<T>())
            .map_err(|e| prefix_error(e, PathEntry::Field(Cow::Borrowed(name))))
    }
}

/// Checks that `def` is the node of `type_name` with exactly `field_names`,
/// and returns its field defs.
pub fn expect_node<'a>(
    def: &'a TreeDef,
    type_name: &'static str,
    field_names: &[&'static str],
) -> Result<&'a [(Cow<'static, str>, TreeDef)]> {
    let node = match def {
        TreeDef::Node(node) => node,
        other => return Err(mismatch(format_args!("a `{type_name}`"), other)),
    };
    if node.type_name != type_name {
        return Err(tree_err(format!(
            "expected a `{type_name}`, found Node `{}`",
            node.type_name
        )));
    }
    let names_match = node.fields.len() == field_names.len()
        && node
            .fields
            .iter()
            .zip(field_names)
            .all(|((have, _), want)| have == want);
    if !names_match {
        let have: Vec<&str> = node.fields.iter().map(|(n, _)| n.as_ref()).collect();
        return Err(tree_err(format!(
            "`{type_name}` has fields [{}], the structure has [{}]",
            field_names.join(", "),
            have.join(", ")
        )));
    }
    Ok(&node.fields)
}

/// Unflattens a field, prefixing errors with its name. The struct is one
/// level of nesting ([`MAX_TREE_DEPTH`](super::MAX_TREE_DEPTH)).
pub fn unflatten_field<T: Tree>(
    def: &TreeDef,
    name: &'static str,
    leaves: &mut IntoIter<Array>,
) -> Result<T> {
    let _level = Level::enter()?;
    T::unflatten(def, leaves).map_err(|e| prefix_error(e, PathEntry::Field(Cow::Borrowed(name))))
}
