//! Key paths naming a position inside a tree, and tree errors carrying them.

use crate::error::Error;
use std::borrow::Cow;
use std::fmt;

/// One step from a node to one of its children.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PathEntry {
    /// A struct field (or a registered node's child, named `0`, `1`, ...).
    /// An empty name is a step that adds nothing to the rendered path (the
    /// payload of an unregistered script object).
    Field(Cow<'static, str>),
    /// A position in a tuple or list.
    Index(usize),
    /// A key of a map.
    Key(String),
}

/// A path from the root of a tree, rendered like `p.layers[2].w`.
///
/// ```
/// use kiln::{KeyPath, PathEntry};
/// let path = KeyPath(vec![
///     PathEntry::Field("p".into()),
///     PathEntry::Field("layers".into()),
///     PathEntry::Index(2),
///     PathEntry::Key("w".into()),
/// ]);
/// assert_eq!(path.to_string(), r#"p.layers[2]["w"]"#);
/// assert_eq!(KeyPath::default().to_string(), "<root>");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct KeyPath(pub Vec<PathEntry>);

impl std::ops::Deref for KeyPath {
    type Target = Vec<PathEntry>;
    fn deref(&self) -> &Vec<PathEntry> {
        &self.0
    }
}

impl std::ops::DerefMut for KeyPath {
    fn deref_mut(&mut self) -> &mut Vec<PathEntry> {
        &mut self.0
    }
}

/// The rendering of the empty path.
pub(crate) const ROOT: &str = "<root>";

impl fmt::Display for KeyPath {
    /// Renders front to back, in time linear in the path's length (a path
    /// into a def nested thousands deep has thousands of steps); the same
    /// text [`prefix_error`] builds back to front.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut empty = true;
        for entry in &self.0 {
            match entry {
                PathEntry::Field(name) if name.is_empty() => continue,
                PathEntry::Field(name) if empty => f.write_str(name)?,
                PathEntry::Field(name) => write!(f, ".{name}")?,
                PathEntry::Index(i) => write!(f, "[{i}]")?,
                PathEntry::Key(k) => write!(f, "[{k:?}]")?,
            }
            empty = false;
        }
        if empty {
            f.write_str(ROOT)?;
        }
        Ok(())
    }
}

/// Renders `entry` in front of an already rendered (possibly empty) path.
fn prefix_rendered(entry: &PathEntry, rest: &str) -> String {
    let rest = if rest == ROOT { "" } else { rest };
    let head = match entry {
        PathEntry::Field(name) => name.to_string(),
        PathEntry::Index(i) => format!("[{i}]"),
        PathEntry::Key(k) => format!("[{k:?}]"),
    };
    if head.is_empty() {
        rest.to_string()
    } else if rest.is_empty() || rest.starts_with('[') {
        head + rest
    } else {
        head + "." + rest
    }
}

/// A tree error at the current node (path `<root>`, to be prefixed by the
/// callers as it propagates).
pub(crate) fn tree_err(detail: impl Into<String>) -> Error {
    Error::Tree {
        path: ROOT.to_string(),
        detail: detail.into(),
    }
}

/// Puts `entry` in front of the path of a tree error coming from a child.
/// Other errors pass through unchanged.
pub fn prefix_error(error: Error, entry: PathEntry) -> Error {
    match error {
        Error::Tree { path, detail } => Error::Tree {
            path: {
                let p = prefix_rendered(&entry, &path);
                if p.is_empty() {
                    ROOT.to_string()
                } else {
                    p
                }
            },
            detail,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(name: &'static str) -> PathEntry {
        PathEntry::Field(Cow::Borrowed(name))
    }

    #[test]
    fn path_renders_fields_indexes_and_keys() {
        let path = KeyPath(vec![
            field("p"),
            field("layers"),
            PathEntry::Index(2),
            field("w"),
        ]);
        assert_eq!(path.to_string(), "p.layers[2].w");
        let path = KeyPath(vec![PathEntry::Index(0), PathEntry::Key("name".into())]);
        assert_eq!(path.to_string(), "[0][\"name\"]");
        let path = KeyPath(vec![PathEntry::Index(1), field("a")]);
        assert_eq!(path.to_string(), "[1].a");
    }

    #[test]
    fn empty_path_renders_as_root_and_empty_fields_are_skipped() {
        assert_eq!(KeyPath::default().to_string(), "<root>");
        assert_eq!(KeyPath(vec![field("")]).to_string(), "<root>");
        assert_eq!(
            KeyPath(vec![field("c"), field(""), PathEntry::Index(3)]).to_string(),
            "c[3]"
        );
    }

    #[test]
    fn display_renders_what_prefixing_builds() {
        let entries = [
            field("p"),
            field(""),
            PathEntry::Index(2),
            field("w"),
            PathEntry::Key("b".into()),
            field(""),
            field("0"),
        ];
        let prefixed = entries
            .iter()
            .rev()
            .fold(tree_err("x"), |e, entry| prefix_error(e, entry.clone()));
        let Error::Tree { path, .. } = prefixed else {
            panic!("a tree error stays one")
        };
        assert_eq!(path, r#"p[2].w["b"].0"#);
        assert_eq!(KeyPath(entries.to_vec()).to_string(), path);
    }

    #[test]
    fn prefixing_an_error_builds_the_path_outwards() {
        let err = tree_err("bad");
        let err = prefix_error(err, field("w"));
        let err = prefix_error(err, PathEntry::Index(2));
        let err = prefix_error(err, field("layers"));
        let err = prefix_error(err, field(""));
        assert_eq!(
            err,
            Error::Tree {
                path: "layers[2].w".into(),
                detail: "bad".into()
            }
        );
    }
}
