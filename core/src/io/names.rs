//! The names a tree's leaves take in a weight file.

use crate::error::{Error, Result};
use crate::implicit::{AffineQuantized, Int8, Nf4};
use crate::tree::{KeyPath, PathEntry, TreeDef};
use std::collections::BTreeSet;

/// The name the leaf at `path` takes in a weight file: the path's steps
/// joined by `.`, a struct field by its name, a list or tuple position by
/// its number and a map key by its text, so the path `layers[0].attn.w`
/// (as [`KeyPath`] displays it) is the tensor `layers.0.attn.w`, and
/// `experts["up"][1]` is `experts.up.1`. Unnamed steps add nothing.
///
/// The fields of a quantized weight are renamed on top of this (see
/// [`tensor_names`](super::tensor_names)); this function sees a path
/// only and renames nothing.
///
/// ```
/// use kiln::io::tensor_name;
/// use kiln::{KeyPath, PathEntry};
///
/// let path = KeyPath(vec![
///     PathEntry::Field("layers".into()),
///     PathEntry::Index(0),
///     PathEntry::Field("attn".into()),
///     PathEntry::Field("w".into()),
/// ]);
/// assert_eq!(path.to_string(), "layers[0].attn.w");
/// assert_eq!(tensor_name(&path), "layers.0.attn.w");
/// ```
pub fn tensor_name(path: &KeyPath) -> String {
    let mut name = String::new();
    for entry in path.iter() {
        push_step(&mut name, &step_text(entry));
    }
    name
}

/// The text one path step adds to a tensor name.
fn step_text(entry: &PathEntry) -> String {
    match entry {
        PathEntry::Field(field) => field.to_string(),
        PathEntry::Index(i) => i.to_string(),
        PathEntry::Key(key) => key.clone(),
    }
}

/// Appends `step` to `name` after a `.` (none before the first step, and
/// nothing for an unnamed step).
fn push_step(name: &mut String, step: &str) {
    if step.is_empty() {
        return;
    }
    if !name.is_empty() {
        name.push('.');
    }
    name.push_str(step);
}

/// Whether a struct node is one of Kiln's quantized weights, whose packed
/// codes a file names `weight` (as MLX's quantized layers do).
fn is_quantized_weight(type_name: &str) -> bool {
    [
        std::any::type_name::<AffineQuantized>(),
        std::any::type_name::<Nf4>(),
        std::any::type_name::<Int8>(),
    ]
    .contains(&type_name)
}

/// The field of a quantized weight holding its packed codes.
const PACKED_FIELD: &str = "packed";
/// The name MLX gives the packed codes of a quantized layer.
const PACKED_TENSOR: &str = "weight";

/// The tensor name of every leaf of `def`, in leaf order; `Err` when a
/// leaf has no name (the tree is a bare array) or two leaves share one
/// (map keys holding `.` can collide with deeper paths).
pub(super) fn leaf_names(def: &TreeDef) -> Result<Vec<String>> {
    let mut names = Vec::with_capacity(def.num_leaves());
    // Depth first with an explicit stack (a def may nest deep): each
    // pending def with the name of its position.
    let mut pending: Vec<(String, &TreeDef)> = vec![(String::new(), def)];
    while let Some((name, def)) = pending.pop() {
        let children: Vec<(String, &TreeDef)> = match def {
            TreeDef::Leaf => {
                names.push(name);
                continue;
            }
            TreeDef::Static(_) | TreeDef::Unit | TreeDef::Option(None) => continue,
            TreeDef::Option(Some(inner)) => vec![(String::new(), &**inner)],
            TreeDef::Tuple(c) | TreeDef::List(c) => c
                .iter()
                .enumerate()
                .map(|(i, d)| (i.to_string(), d))
                .collect(),
            TreeDef::Map(c) => c.iter().map(|(k, d)| (k.to_string(), d)).collect(),
            TreeDef::Node(node) => {
                let quantized = is_quantized_weight(&node.type_name);
                let field_name = |field: &str| match field {
                    PACKED_FIELD if quantized => PACKED_TENSOR.to_string(),
                    other => other.to_string(),
                };
                node.fields
                    .iter()
                    .map(|(f, d)| (field_name(f), d))
                    .collect()
            }
        };
        pending.extend(children.into_iter().rev().map(|(step, child)| {
            let mut child_name = name.clone();
            push_step(&mut child_name, &step);
            (child_name, child)
        }));
    }
    check_distinct(&names)?;
    Ok(names)
}

/// `Err` naming the first empty or repeated name.
fn check_distinct(names: &[String]) -> Result<()> {
    let mut seen = BTreeSet::new();
    for name in names {
        if name.is_empty() {
            return Err(Error::Weights {
                tensor: String::new(),
                detail: "a leaf at the root of the tree has no name in a file; put the array \
                         in a struct or a map"
                    .into(),
            });
        }
        if !seen.insert(name.as_str()) {
            return Err(Error::Weights {
                tensor: name.clone(),
                detail: "two leaves of the tree take this name (a map key holding `.` \
                         spells the same name as a nested path)"
                    .into(),
            });
        }
    }
    Ok(())
}
