//! `TreeDef`: the structure of a flattened tree.

use super::path::{KeyPath, PathEntry};
use super::static_value::StaticValue;
use crate::hash::FastHasher;
use smallvec::SmallVec;
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;
use std::hash::BuildHasherDefault;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

/// The structure of a flattened tree: everything but the array leaves.
///
/// Two defs are equal when the structures, the type names and every static
/// value (by equality) are equal; this is what the compile cache keys on.
///
/// Flatten never builds a def nesting deeper than
/// [`MAX_TREE_DEPTH`](super::MAX_TREE_DEPTH), and unflatten refuses one.
/// Equality, hashing, cloning, display and [`TreeDef::first_difference`]
/// recurse once per level, which the limit keeps within any stack; a def
/// built by hand should stay within it too. Dropping a def, counting its
/// leaves and listing their paths never recurse, whatever its depth.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TreeDef {
    /// An array leaf.
    Leaf,
    /// A non-array value, part of the structure (and of the cache key).
    Static(StaticValue),
    /// `()`.
    Unit,
    /// A tuple of children.
    Tuple(Vec<TreeDef>),
    /// A list (`Vec<T>`) of children.
    List(Vec<TreeDef>),
    /// An `Option`.
    Option(Option<Box<TreeDef>>),
    /// A map with string keys, in key order. Keys are interned
    /// ([`intern_key`]): flattening a map on every call copies none.
    Map(Vec<(MapKey, TreeDef)>),
    /// A struct or a registered node type.
    Node(Arc<NodeDef>),
}

/// A map key of a [`TreeDef`]: an interned `&'static str` shared by every
/// flatten of an equal key (no allocation, no reference counting, equality
/// by pointer first), or an owned string once the interner is full.
#[derive(Clone, Eq, PartialOrd, Ord)]
pub struct MapKey(Cow<'static, str>);

impl fmt::Debug for MapKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl MapKey {
    /// The key text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl PartialEq for MapKey {
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (self.as_str(), other.as_str());
        std::ptr::eq(a, b) || a == b
    }
}

impl std::hash::Hash for MapKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl std::ops::Deref for MapKey {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Display for MapKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<&str> for MapKey {
    fn from(key: &str) -> MapKey {
        intern_key(key)
    }
}

/// Distinct keys the interner keeps (and the bytes they may take); interned
/// keys live for the whole process, so the interner is bounded and later
/// keys are simply owned.
const INTERNED_KEYS_LIMIT: usize = 1 << 16;
const INTERNED_BYTES_LIMIT: usize = 1 << 20;
/// Keys each thread remembers it has interned (pointers only, freed with
/// the thread); keys past them are found in the shared interner.
const CACHED_KEYS_PER_THREAD: usize = 1 << 12;

/// The process-wide set of interned keys.
#[derive(Default)]
struct Interner {
    keys: HashSet<&'static str, BuildHasherDefault<FastHasher>>,
    bytes: usize,
}

/// The map key for `key`: interned (the same `&'static str` for equal keys
/// on every thread) while the interner has room, owned after that.
///
/// The interner is one per process, not one per thread: a per-thread set
/// leaked its own copy of every key on every thread, so a program flattening
/// maps from many short-lived threads grew without bound. Each thread keeps
/// only a cache of the keys it has looked up (pointers to the shared copies,
/// freed when the thread ends), so a hot loop takes no lock.
pub fn intern_key(key: &str) -> MapKey {
    type KeySet = HashSet<&'static str, BuildHasherDefault<FastHasher>>;
    thread_local! {
        static SEEN: RefCell<KeySet> = const { RefCell::new(HashSet::with_hasher(BuildHasherDefault::new())) };
    }
    let cached = |key: &str| {
        SEEN.try_with(|seen| seen.try_borrow().ok()?.get(key).copied())
            .ok()
            .flatten()
    };
    if let Some(shared) = cached(key) {
        return MapKey(Cow::Borrowed(shared));
    }
    let Some(shared) = intern_shared(key) else {
        return MapKey(Cow::Owned(key.to_string()));
    };
    // A thread being torn down, or a re-entrant call, just skips the cache;
    // so does a thread that has cached its share of keys (a model's
    // parameter names fit many times over).
    let _ = SEEN.try_with(|seen| {
        seen.try_borrow_mut().map(|mut seen| {
            if seen.len() < CACHED_KEYS_PER_THREAD {
                seen.insert(shared);
            }
        })
    });
    MapKey(Cow::Borrowed(shared))
}

/// The process-wide copy of `key`, made on first use; `None` once the
/// interner is full.
fn intern_shared(key: &str) -> Option<&'static str> {
    static INTERNER: OnceLock<RwLock<Interner>> = OnceLock::new();
    let interner = INTERNER.get_or_init(RwLock::default);
    // The lock is never held while user code runs, so a poisoned lock still
    // guards a consistent set.
    if let Some(&shared) = interner
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .keys
        .get(key)
    {
        return Some(shared);
    }
    let mut interner = interner.write().unwrap_or_else(PoisonError::into_inner);
    // Another thread may have interned it between the two locks.
    if let Some(&shared) = interner.keys.get(key) {
        return Some(shared);
    }
    if interner.keys.len() >= INTERNED_KEYS_LIMIT
        || interner.bytes + key.len() > INTERNED_BYTES_LIMIT
    {
        return None;
    }
    let shared: &'static str = Box::leak(key.into());
    interner.bytes += key.len();
    interner.keys.insert(shared);
    Some(shared)
}

/// A struct (derived) or registered node type inside a [`TreeDef`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeDef {
    /// The full Rust type path (`std::any::type_name`) for derived structs;
    /// the registered name (or the script class) for dynamic values.
    pub type_name: Cow<'static, str>,
    /// Aux data (unit for derived structs).
    pub aux: StaticValue,
    /// The children: field names for named structs, `0`, `1`, ... for tuple
    /// structs and registered types.
    pub fields: Vec<(Cow<'static, str>, TreeDef)>,
}

impl std::hash::Hash for NodeDef {
    /// Hashes the type, aux data and children but not the field names: the
    /// type fixes them for derived structs, and equality still compares them,
    /// so equal defs hash equally. Cache keys are hashed on every call.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.type_name.hash(state);
        self.aux.hash(state);
        state.write_usize(self.fields.len());
        for (_, child) in &self.fields {
            child.hash(state);
        }
    }
}

/// Where two defs first differ, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeDifference {
    /// The path of the differing node.
    pub path: KeyPath,
    /// What differs.
    pub kind: DifferenceKind,
}

/// How two defs differ at a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DifferenceKind {
    /// The shape of the tree differs (`Pair{a,b}` before, `list[3]` now).
    Structure {
        /// A summary of the node in the first def.
        before: String,
        /// A summary of the node in the second def.
        now: String,
    },
    /// A static value or aux data differs (rendered with `Debug`).
    Static {
        /// The value in the first def.
        before: String,
        /// The value in the second def.
        now: String,
    },
}

impl fmt::Display for TreeDifference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            DifferenceKind::Structure { before, now } => write!(
                f,
                "at `{}` the structure changed from {before} to {now}",
                self.path
            ),
            DifferenceKind::Static { before, now } => write!(
                f,
                "at `{}` the static value changed from {before} to {now}",
                self.path
            ),
        }
    }
}

impl TreeDef {
    /// The number of array leaves.
    pub fn num_leaves(&self) -> usize {
        let mut count = 0;
        let mut pending: SmallVec<[&TreeDef; 16]> = SmallVec::new();
        pending.push(self);
        while let Some(def) = pending.pop() {
            match def {
                TreeDef::Leaf => count += 1,
                TreeDef::Static(_) | TreeDef::Unit | TreeDef::Option(None) => {}
                TreeDef::Option(Some(c)) => pending.push(c),
                TreeDef::Tuple(c) | TreeDef::List(c) => pending.extend(c.iter()),
                TreeDef::Map(c) => pending.extend(c.iter().map(|(_, d)| d)),
                TreeDef::Node(n) => pending.extend(n.fields.iter().map(|(_, d)| d)),
            }
        }
        count
    }

    /// The path of every leaf, in leaf order.
    pub fn leaf_paths(&self) -> Vec<KeyPath> {
        let mut out = Vec::with_capacity(self.num_leaves());
        let mut path = KeyPath::default();
        // Depth-first with an explicit stack: each pending def with the
        // length of its parent's path and the step from the parent to it
        // (none for an `Option`'s content, which adds no step).
        let mut pending: Vec<(usize, Option<PathEntry>, &TreeDef)> = vec![(0, None, self)];
        while let Some((parent_len, step, def)) = pending.pop() {
            path.truncate(parent_len);
            path.extend(step);
            match def {
                TreeDef::Leaf => out.push(path.clone()),
                TreeDef::Option(Some(c)) => pending.push((path.len(), None, c)),
                _ => {
                    let len = path.len();
                    let children = def.children().into_iter().rev();
                    pending.extend(children.map(|(entry, child)| (len, Some(entry), child)));
                }
            }
        }
        out
    }

    /// The children of a tuple, list, map or node with the path step to each.
    pub(crate) fn children(&self) -> Vec<(PathEntry, &TreeDef)> {
        match self {
            TreeDef::Tuple(c) | TreeDef::List(c) => c
                .iter()
                .enumerate()
                .map(|(i, d)| (PathEntry::Index(i), d))
                .collect(),
            TreeDef::Map(c) => c
                .iter()
                .map(|(k, d)| (PathEntry::Key(k.to_string()), d))
                .collect(),
            TreeDef::Node(n) => n
                .fields
                .iter()
                .map(|(name, d)| (PathEntry::Field(name.clone()), d))
                .collect(),
            TreeDef::Leaf | TreeDef::Static(_) | TreeDef::Unit | TreeDef::Option(_) => Vec::new(),
        }
    }

    /// The variant name, for error messages (`Tuple`, `Leaf`, ...).
    pub(crate) fn variant_name(&self) -> &'static str {
        match self {
            TreeDef::Leaf => "Leaf",
            TreeDef::Static(_) => "Static",
            TreeDef::Unit => "Unit",
            TreeDef::Tuple(_) => "Tuple",
            TreeDef::List(_) => "List",
            TreeDef::Option(_) => "Option",
            TreeDef::Map(_) => "Map",
            TreeDef::Node(_) => "Node",
        }
    }

    /// [`Self::summary`] with short type names, for error messages.
    pub(crate) fn brief(&self) -> String {
        self.summary(&|n| short_type_name(&n.type_name))
    }

    /// A one-line summary of this node (not its descendants): `array`,
    /// `list[3]`, `Pair{a,b}`, ...
    fn summary(&self, name: &dyn Fn(&NodeDef) -> String) -> String {
        match self {
            TreeDef::Leaf => "array".into(),
            TreeDef::Static(v) => format!("static {v:?}"),
            TreeDef::Unit => "()".into(),
            TreeDef::Tuple(c) => format!("tuple[{}]", c.len()),
            TreeDef::List(c) => format!("list[{}]", c.len()),
            TreeDef::Option(None) => "None".into(),
            TreeDef::Option(Some(_)) => "Some".into(),
            TreeDef::Map(c) => {
                let keys: Vec<&str> = c.iter().map(|(k, _)| k.as_ref()).collect();
                format!("map{{{}}}", keys.join(","))
            }
            TreeDef::Node(n) => {
                let fields: Vec<&str> = n.fields.iter().map(|(f, _)| f.as_ref()).collect();
                format!("{}{{{}}}", name(n), fields.join(","))
            }
        }
    }

    /// The first place (in leaf order) where `other` differs from `self` in
    /// structure or in a static value; `None` when the defs are equal.
    ///
    /// ```
    /// use kiln::{DifferenceKind, StaticValue, TreeDef};
    /// let before = TreeDef::Tuple(vec![TreeDef::Leaf, TreeDef::Static(StaticValue::new(1_i64))]);
    /// let now = TreeDef::Tuple(vec![TreeDef::Leaf, TreeDef::Static(StaticValue::new(2_i64))]);
    /// let diff = before.first_difference(&now).unwrap();
    /// assert_eq!(diff.path.to_string(), "[1]");
    /// assert_eq!(diff.kind, DifferenceKind::Static { before: "1".into(), now: "2".into() });
    /// ```
    pub fn first_difference(&self, other: &TreeDef) -> Option<TreeDifference> {
        let mut path = KeyPath::default();
        let kind = self.difference_at(other, &mut path)?;
        Some(TreeDifference { path, kind })
    }

    fn difference_at(&self, other: &TreeDef, path: &mut KeyPath) -> Option<DifferenceKind> {
        if self == other {
            return None;
        }
        let same_shape = match (self, other) {
            (TreeDef::Static(a), TreeDef::Static(b)) => {
                return Some(DifferenceKind::Static {
                    before: format!("{a:?}"),
                    now: format!("{b:?}"),
                });
            }
            (TreeDef::Tuple(a), TreeDef::Tuple(b)) | (TreeDef::List(a), TreeDef::List(b)) => {
                a.len() == b.len()
            }
            (TreeDef::Option(Some(_)), TreeDef::Option(Some(_))) => true,
            (TreeDef::Map(a), TreeDef::Map(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|((x, _), (y, _))| x == y)
            }
            (TreeDef::Node(a), TreeDef::Node(b)) => {
                a.type_name == b.type_name
                    && a.fields.len() == b.fields.len()
                    && a.fields
                        .iter()
                        .zip(&b.fields)
                        .all(|((x, _), (y, _))| x == y)
            }
            _ => false,
        };
        if !same_shape {
            return Some(self.structure_difference(other));
        }
        if let (TreeDef::Option(Some(a)), TreeDef::Option(Some(b))) = (self, other) {
            return a.difference_at(b, path);
        }
        if let (TreeDef::Node(a), TreeDef::Node(b)) = (self, other) {
            if a.aux != b.aux {
                return Some(DifferenceKind::Static {
                    before: format!("{:?}", a.aux),
                    now: format!("{:?}", b.aux),
                });
            }
        }
        for ((entry, x), (_, y)) in self.children().into_iter().zip(other.children()) {
            path.push(entry);
            if let Some(kind) = x.difference_at(y, path) {
                return Some(kind);
            }
            path.pop();
        }
        None
    }

    fn structure_difference(&self, other: &TreeDef) -> DifferenceKind {
        // Short type names read best; fall back to full paths when the short
        // names would hide the difference (same name, different modules).
        let short_clash = matches!((self, other), (TreeDef::Node(a), TreeDef::Node(b))
            if a.type_name != b.type_name && short_type_name(&a.type_name) == short_type_name(&b.type_name));
        let name = |n: &NodeDef| {
            if short_clash {
                n.type_name.to_string()
            } else {
                short_type_name(&n.type_name)
            }
        };
        DifferenceKind::Structure {
            before: self.summary(&name),
            now: other.summary(&name),
        }
    }
}

impl Drop for TreeDef {
    /// Drops nested children with an explicit stack: the derived drop
    /// recursed once per level, and a def nested ten thousand deep (built by
    /// hand; flatten builds none deeper than `MAX_TREE_DEPTH`) overflowed the
    /// stack. A def whose children hold no children of their own, the
    /// common case, is dropped by the fields' own drops without allocating.
    fn drop(&mut self) {
        if !self.children_have_children() {
            return;
        }
        let mut pending = Vec::new();
        self.move_children_into(&mut pending);
        while let Some(mut def) = pending.pop() {
            def.move_children_into(&mut pending);
        }
    }
}

impl TreeDef {
    /// Whether this def holds children at all.
    fn has_children(&self) -> bool {
        match self {
            TreeDef::Leaf | TreeDef::Static(_) | TreeDef::Unit | TreeDef::Option(None) => false,
            TreeDef::Option(Some(_)) => true,
            TreeDef::Tuple(c) | TreeDef::List(c) => !c.is_empty(),
            TreeDef::Map(c) => !c.is_empty(),
            TreeDef::Node(n) => !n.fields.is_empty(),
        }
    }

    /// Whether dropping this def would recurse more than one level.
    fn children_have_children(&self) -> bool {
        match self {
            TreeDef::Leaf | TreeDef::Static(_) | TreeDef::Unit | TreeDef::Option(None) => false,
            TreeDef::Option(Some(c)) => c.has_children(),
            TreeDef::Tuple(c) | TreeDef::List(c) => c.iter().any(TreeDef::has_children),
            TreeDef::Map(c) => c.iter().any(|(_, d)| d.has_children()),
            TreeDef::Node(n) => n.fields.iter().any(|(_, d)| d.has_children()),
        }
    }

    /// Moves the children out (a shared node keeps its own: it is dropped
    /// by its last owner, iteratively again) and onto `pending`.
    fn move_children_into(&mut self, pending: &mut Vec<TreeDef>) {
        match self {
            TreeDef::Leaf | TreeDef::Static(_) | TreeDef::Unit | TreeDef::Option(None) => {}
            TreeDef::Option(c) => pending.extend(c.take().map(|c| *c)),
            TreeDef::Tuple(c) | TreeDef::List(c) => pending.append(c),
            TreeDef::Map(c) => pending.extend(c.drain(..).map(|(_, d)| d)),
            TreeDef::Node(n) => {
                if let Some(node) = Arc::get_mut(n) {
                    pending.extend(node.fields.drain(..).map(|(_, d)| d));
                }
            }
        }
    }
}

/// `a::b::Pair<c::D>` → `Pair<D>`.
pub(crate) fn short_type_name(full: &str) -> String {
    let mut out = String::with_capacity(full.len());
    let mut segment = String::new();
    let mut chars = full.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_alphanumeric() || c == '_' {
            segment.push(c);
        } else if c == ':' && chars.peek() == Some(&':') {
            chars.next();
            segment.clear();
        } else {
            out.push_str(&segment);
            segment.clear();
            out.push(c);
        }
    }
    out.push_str(&segment);
    out
}

fn is_tuple_like(fields: &[(Cow<'static, str>, TreeDef)]) -> bool {
    fields
        .iter()
        .enumerate()
        .all(|(i, (name, _))| name.parse::<usize>() == Ok(i))
}

fn write_seq<'a>(
    f: &mut fmt::Formatter<'_>,
    items: impl IntoIterator<Item = &'a TreeDef>,
) -> fmt::Result {
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{item}")?;
    }
    Ok(())
}

impl fmt::Display for TreeDef {
    /// Compact: `*` for a leaf, statics by `Debug`, `Pair { a: *, b: * }`,
    /// `(*, [*, *])`, `{"k": *}`, `Some(*)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TreeDef::Leaf => f.write_str("*"),
            TreeDef::Static(v) => write!(f, "{v:?}"),
            TreeDef::Unit => f.write_str("()"),
            TreeDef::Tuple(c) => {
                f.write_str("(")?;
                write_seq(f, c)?;
                f.write_str(if c.len() == 1 { ",)" } else { ")" })
            }
            TreeDef::List(c) => {
                f.write_str("[")?;
                write_seq(f, c)?;
                f.write_str("]")
            }
            TreeDef::Option(None) => f.write_str("None"),
            TreeDef::Option(Some(c)) => write!(f, "Some({c})"),
            TreeDef::Map(c) => {
                f.write_str("{")?;
                for (i, (k, d)) in c.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{k:?}: {d}")?;
                }
                f.write_str("}")
            }
            TreeDef::Node(n) => {
                f.write_str(&short_type_name(&n.type_name))?;
                if !n.aux.is_unit() {
                    write!(f, "[{:?}]", n.aux)?;
                }
                if n.fields.is_empty() {
                    Ok(())
                } else if is_tuple_like(&n.fields)
                    || n.fields.len() == 1 && n.fields[0].0.is_empty()
                {
                    f.write_str("(")?;
                    write_seq(f, n.fields.iter().map(|(_, d)| d))?;
                    f.write_str(")")
                } else {
                    f.write_str(" { ")?;
                    for (i, (name, d)) in n.fields.iter().enumerate() {
                        if i > 0 {
                            f.write_str(", ")?;
                        }
                        write!(f, "{name}: {d}")?;
                    }
                    f.write_str(" }")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &'static str, fields: Vec<(&'static str, TreeDef)>) -> TreeDef {
        TreeDef::Node(Arc::new(NodeDef {
            type_name: Cow::Borrowed(name),
            aux: StaticValue::unit(),
            fields: fields
                .into_iter()
                .map(|(n, d)| (Cow::Borrowed(n), d))
                .collect(),
        }))
    }

    fn st<T: super::super::StaticBound>(v: T) -> TreeDef {
        TreeDef::Static(StaticValue::new(v))
    }

    #[test]
    fn short_type_name_strips_module_paths() {
        assert_eq!(short_type_name("a::b::Pair"), "Pair");
        assert_eq!(short_type_name("a::Wrap<c::D, f32>"), "Wrap<D, f32>");
        assert_eq!(short_type_name("Cache"), "Cache");
    }

    #[test]
    fn display_is_compact() {
        let pair = node("m::Pair", vec![("a", TreeDef::Leaf), ("b", TreeDef::Leaf)]);
        assert_eq!(pair.to_string(), "Pair { a: *, b: * }");
        let t = TreeDef::Tuple(vec![
            TreeDef::Leaf,
            TreeDef::List(vec![TreeDef::Leaf, TreeDef::Leaf]),
        ]);
        assert_eq!(t.to_string(), "(*, [*, *])");
        assert_eq!(TreeDef::Tuple(vec![TreeDef::Leaf]).to_string(), "(*,)");
        let m = TreeDef::Map(vec![("k".into(), st(String::from("v")))]);
        assert_eq!(m.to_string(), r#"{"k": "v"}"#);
        let ts = node("m::T", vec![("0", TreeDef::Leaf), ("1", st(3_i32))]);
        assert_eq!(ts.to_string(), "T(*, 3)");
        assert_eq!(node("m::U", vec![]).to_string(), "U");
        let o = TreeDef::Option(Some(Box::new(TreeDef::Unit)));
        assert_eq!(o.to_string(), "Some(())");
    }

    #[test]
    fn num_leaves_and_leaf_paths_follow_leaf_order() {
        let def = node(
            "m::Model",
            vec![
                ("layers", TreeDef::List(vec![TreeDef::Leaf, TreeDef::Leaf])),
                ("cfg", st(1_u32)),
                (
                    "extra",
                    TreeDef::Option(Some(Box::new(TreeDef::Map(vec![(
                        "bias".into(),
                        TreeDef::Leaf,
                    )])))),
                ),
            ],
        );
        assert_eq!(def.num_leaves(), 3);
        let paths: Vec<String> = def.leaf_paths().iter().map(|p| p.to_string()).collect();
        assert_eq!(paths, ["layers[0]", "layers[1]", r#"extra["bias"]"#]);
    }

    #[test]
    fn equal_defs_have_no_difference() {
        let a = node("m::Pair", vec![("a", TreeDef::Leaf), ("b", st(1_i64))]);
        assert_eq!(a.first_difference(&a.clone()), None);
    }

    #[test]
    fn first_difference_reports_a_structure_change_with_short_names() {
        let before = node("m::Pair", vec![("a", TreeDef::Leaf), ("b", TreeDef::Leaf)]);
        let now = TreeDef::List(vec![TreeDef::Leaf; 3]);
        let diff = before.first_difference(&now).unwrap();
        assert_eq!(diff.path, KeyPath::default());
        assert_eq!(
            diff.kind,
            DifferenceKind::Structure {
                before: "Pair{a,b}".into(),
                now: "list[3]".into()
            }
        );
    }

    #[test]
    fn first_difference_uses_full_names_when_short_names_clash() {
        let before = node("m1::Pair", vec![]);
        let now = node("m2::Pair", vec![]);
        let diff = before.first_difference(&now).unwrap();
        assert_eq!(
            diff.kind,
            DifferenceKind::Structure {
                before: "m1::Pair{}".into(),
                now: "m2::Pair{}".into()
            }
        );
    }

    #[test]
    fn first_difference_finds_a_nested_static_change() {
        let make = |act: &str| {
            node(
                "m::Model",
                vec![
                    ("w", TreeDef::Leaf),
                    (
                        "layers",
                        TreeDef::List(vec![
                            node("m::Layer", vec![("act", st(act.to_string()))]),
                            node("m::Layer", vec![("act", st("b".to_string()))]),
                        ]),
                    ),
                ],
            )
        };
        let diff = make("a").first_difference(&make("b")).unwrap();
        assert_eq!(diff.path.to_string(), "layers[0].act");
        assert_eq!(
            diff.kind,
            DifferenceKind::Static {
                before: "\"a\"".into(),
                now: "\"b\"".into()
            }
        );
        assert_eq!(
            diff.to_string(),
            "at `layers[0].act` the static value changed from \"a\" to \"b\""
        );
    }

    #[test]
    fn first_difference_reports_aux_changes_as_static() {
        let make = |aux: i64| {
            TreeDef::Node(Arc::new(NodeDef {
                type_name: "Cache".into(),
                aux: StaticValue::new(aux),
                fields: vec![("0".into(), TreeDef::Leaf)],
            }))
        };
        let diff = TreeDef::Tuple(vec![make(1)])
            .first_difference(&TreeDef::Tuple(vec![make(2)]))
            .unwrap();
        assert_eq!(diff.path.to_string(), "[0]");
        assert_eq!(
            diff.kind,
            DifferenceKind::Static {
                before: "1".into(),
                now: "2".into()
            }
        );
    }

    #[test]
    fn first_difference_finds_a_nested_structure_change() {
        let before = TreeDef::Map(vec![(
            "x".into(),
            TreeDef::Tuple(vec![TreeDef::Leaf, TreeDef::Leaf]),
        )]);
        let now = TreeDef::Map(vec![(
            "x".into(),
            TreeDef::Tuple(vec![TreeDef::Leaf, TreeDef::Unit]),
        )]);
        let diff = before.first_difference(&now).unwrap();
        assert_eq!(diff.path.to_string(), r#"["x"][1]"#);
        assert_eq!(
            diff.kind,
            DifferenceKind::Structure {
                before: "array".into(),
                now: "()".into()
            }
        );
    }
}
