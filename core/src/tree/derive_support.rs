//! Helpers called by the code `#[derive(Tree)]` generates. Not meant to be
//! called by hand; they are public only so generated code can reach them.

use super::depth::Level;
use super::impls::{mismatch, static_of};
use super::path::{prefix_error, tree_err, PathEntry};
use super::static_value::{StaticBound, StaticValue};
use super::{NodeDef, Tree, TreeDef};
use crate::array::Array;
use crate::error::Result;
use std::borrow::Cow;
use std::sync::Arc;
use std::vec::IntoIter;

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

/// The def of a `#[tree(static)]` field.
pub fn static_field<T: StaticBound>(value: &T, name: &'static str) -> (Cow<'static, str>, TreeDef) {
    (
        Cow::Borrowed(name),
        TreeDef::Static(StaticValue::new(value.clone())),
    )
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

/// Reads a `#[tree(static)]` field back from its def.
pub fn unflatten_static_field<T: StaticBound>(def: &TreeDef, name: &'static str) -> Result<T> {
    static_of::<T>(def, std::any::type_name::<T>())
        .map_err(|e| prefix_error(e, PathEntry::Field(Cow::Borrowed(name))))
}
