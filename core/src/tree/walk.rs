//! [`Value`]'s flatten and unflatten as explicit-stack walks.
//!
//! Scripts nest values as deep as they like, and an unoptimized build spends
//! kilobytes of stack per level of a recursive walk; so these walks keep
//! their open containers in a `Vec`, not on the call stack. Each open
//! container still holds a [`Level`], so a value nesting deeper than
//! [`MAX_TREE_DEPTH`](super::MAX_TREE_DEPTH) is an `Err` (the def it would
//! make is walked recursively later: equality, hashing, display).
//!
//! An error inside a container gets its path from the open containers: the
//! step into the child being walked in each, innermost first.

use super::depth::Level;
use super::impls::{mismatch, next_leaf};
use super::path::{prefix_error, tree_err, PathEntry};
use super::static_value::StaticValue;
use super::value::{child_name, scalar, NodeType, Registry, ScriptScalar, Value};
use super::{intern_key, MapKey, NodeDef, TreeDef};
use crate::error::{Error, Result};
use crate::handle::array::Array;
use crate::hash::FastHasher;
use std::borrow::Cow;
use std::cell::OnceCell;
use std::collections::{btree_map, BTreeMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::vec::IntoIter;

/// A value to flatten: borrowed from the caller's tree, or made by a
/// registered flatten (then the walk owns it and takes it apart).
enum Item<'v> {
    Borrowed(&'v Value),
    Owned(Value),
}

impl Item<'_> {
    fn value(&self) -> &Value {
        match self {
            Item::Borrowed(value) => value,
            Item::Owned(value) => value,
        }
    }
}

/// The children of an open container still to flatten.
enum Pending<'v> {
    Items(std::slice::Iter<'v, Value>),
    OwnedItems(IntoIter<Value>),
    Entries(btree_map::Iter<'v, String, Value>),
    OwnedEntries(btree_map::IntoIter<String, Value>),
    Inner(Option<Item<'v>>),
}

/// What an open container becomes once its children are flattened.
enum Shape {
    List,
    Tuple,
    /// The keys of the children flattened so far.
    Map(Vec<MapKey>),
    /// An unregistered script object: its payload, wrapped in its class.
    Object(String),
    /// A registered node: its type and aux data.
    Registered(String, StaticValue),
}

/// A container whose children are being flattened.
struct Open<'v> {
    shape: Shape,
    pending: Pending<'v>,
    /// The defs of the children flattened so far.
    defs: Vec<TreeDef>,
    /// For a registered node, the node itself (to recognize a cycle).
    node: Option<Enclosing<'v>>,
    _level: Level,
}

/// A registered node being flattened, kept to find a cycle: a node equal to
/// an enclosing node of its type would flatten into the same children again,
/// forever.
struct Enclosing<'v> {
    node: Item<'v>,
    /// The node's [`fingerprint`], computed once a node of its type is found
    /// inside it (most registered types never nest in themselves).
    fingerprint: OnceCell<u64>,
}

impl Enclosing<'_> {
    fn fingerprint(&self) -> u64 {
        *self
            .fingerprint
            .get_or_init(|| fingerprint(self.node.value()))
    }
}

impl<'v> Open<'v> {
    /// The next child to flatten, noting its key (for a map).
    fn next_child(&mut self) -> Option<Item<'v>> {
        let (key, child) = match &mut self.pending {
            Pending::Items(items) => (None, Item::Borrowed(items.next()?)),
            Pending::OwnedItems(items) => (None, Item::Owned(items.next()?)),
            Pending::Entries(entries) => {
                let (key, child) = entries.next()?;
                (Some(intern_key(key)), Item::Borrowed(child))
            }
            Pending::OwnedEntries(entries) => {
                let (key, child) = entries.next()?;
                (Some(intern_key(&key)), Item::Owned(child))
            }
            Pending::Inner(inner) => (None, inner.take()?),
        };
        if let (Shape::Map(keys), Some(key)) = (&mut self.shape, key) {
            keys.push(key);
        }
        Some(child)
    }

    /// The type of a registered node.
    fn registered_name(&self) -> Option<&String> {
        match &self.shape {
            Shape::Registered(name, _) => Some(name),
            _ => None,
        }
    }

    /// The path step to the child being flattened.
    fn step(&self) -> PathEntry {
        match &self.shape {
            Shape::List | Shape::Tuple => PathEntry::Index(self.defs.len()),
            Shape::Map(keys) => {
                PathEntry::Key(keys.last().map_or_else(String::new, |k| k.to_string()))
            }
            Shape::Object(_) => PathEntry::Field(Cow::Borrowed("")),
            Shape::Registered(..) => PathEntry::Field(child_name(self.defs.len())),
        }
    }

    /// The def of the container, once its children are all flattened;
    /// the emptied container is dropped next, leaving its level.
    fn finish(&mut self) -> TreeDef {
        let defs = std::mem::take(&mut self.defs);
        match std::mem::replace(&mut self.shape, Shape::List) {
            Shape::List => TreeDef::List(defs),
            Shape::Tuple => TreeDef::Tuple(defs),
            Shape::Map(keys) => TreeDef::Map(keys.into_iter().zip(defs).collect()),
            Shape::Object(class) => TreeDef::Node(Arc::new(NodeDef {
                type_name: Cow::Owned(class),
                aux: StaticValue::unit(),
                fields: defs.into_iter().map(|d| (Cow::Borrowed(""), d)).collect(),
            })),
            Shape::Registered(name, aux) => TreeDef::Node(Arc::new(NodeDef {
                type_name: Cow::Owned(name),
                aux,
                fields: defs
                    .into_iter()
                    .enumerate()
                    .map(|(i, d)| (child_name(i), d))
                    .collect(),
            })),
        }
    }
}

/// Puts the path to the child being flattened (or unflattened) in each open
/// container in front of an error's path, innermost first.
fn with_path(error: Error, steps: impl DoubleEndedIterator<Item = Option<PathEntry>>) -> Error {
    steps.rev().flatten().fold(error, prefix_error)
}

/// What starting on a value gives: its def, or a container to walk.
enum Started<'v> {
    Def(TreeDef),
    Open(Open<'v>),
}

/// Flattens `root` with `registry`: registered types first (by
/// [`Value::type_name`]), then the built-in containers.
pub(super) fn flatten(
    root: &Value,
    registry: &Registry,
    leaves: &mut Vec<Array>,
) -> Result<TreeDef> {
    let mut open: Vec<Open<'_>> = Vec::new();
    let mut item = Item::Borrowed(root);
    loop {
        // Go down to the first child without children of its own.
        let mut done = match start(item, registry, leaves, &open) {
            Ok(Started::Def(def)) => def,
            Ok(Started::Open(mut container)) => match container.next_child() {
                Some(child) => {
                    open.push(container);
                    item = child;
                    continue;
                }
                None => container.finish(),
            },
            Err(e) => return Err(with_path(e, open.iter().map(|o| Some(o.step())))),
        };
        // Hand each finished def to its container, closing every container
        // whose children are all done, until one has a child left.
        item = loop {
            let Some(container) = open.last_mut() else {
                return Ok(done);
            };
            container.defs.push(done);
            if let Some(child) = container.next_child() {
                break child;
            }
            done = container.finish();
            open.pop();
        };
    }
}

/// The def of a value without children, or the open container of one with
/// children; `open` are the containers it is inside (to find a cycle).
fn start<'v>(
    item: Item<'v>,
    registry: &Registry,
    leaves: &mut Vec<Array>,
    open: &[Open<'v>],
) -> Result<Started<'v>> {
    let value = item.value();
    if let Some(node_type) = registry.lookup(value.type_name()) {
        return start_registered(&node_type, item, open).map(Started::Open);
    }
    let shape = match value {
        Value::None => return Ok(Started::Def(scalar(ScriptScalar::None))),
        Value::Bool(b) => return Ok(Started::Def(scalar(ScriptScalar::Bool(*b)))),
        Value::Int(i) => return Ok(Started::Def(scalar(ScriptScalar::Int(*i)))),
        Value::Float(x) => return Ok(Started::Def(scalar(ScriptScalar::Float(x.to_bits())))),
        Value::Str(s) => return Ok(Started::Def(scalar(ScriptScalar::Str(s.clone())))),
        Value::Array(a) => {
            leaves.push(a.clone());
            return Ok(Started::Def(TreeDef::Leaf));
        }
        Value::Opaque { type_name } => {
            return Err(tree_err(format!(
                "`{type_name}` is not a tree: register it as a node type or return arrays, \
                 containers and scalars"
            )))
        }
        Value::List(_) => Shape::List,
        Value::Tuple(_) => Shape::Tuple,
        Value::Map(map) => Shape::Map(Vec::with_capacity(map.len())),
        // Unregistered: the payload, wrapped so the class survives a round trip.
        Value::Object { class, .. } => Shape::Object(class.to_string()),
    };
    Ok(Started::Open(Open {
        _level: enter_level(open.iter().rev().find_map(Open::registered_name))?,
        shape,
        pending: Pending::of(item),
        defs: Vec::new(),
        node: None,
    }))
}

impl<'v> Pending<'v> {
    /// The children of a value: borrowed from a borrowed value, moved out
    /// of an owned one.
    fn of(item: Item<'v>) -> Pending<'v> {
        match item {
            Item::Borrowed(value) => match value {
                Value::List(items) | Value::Tuple(items) => Pending::Items(items.iter()),
                Value::Map(map) => Pending::Entries(map.iter()),
                Value::Object { inner, .. } => Pending::Inner(Some(Item::Borrowed(inner))),
                _ => Pending::Inner(None),
            },
            Item::Owned(mut value) => match &mut value {
                Value::List(items) | Value::Tuple(items) => {
                    Pending::OwnedItems(std::mem::take(items).into_iter())
                }
                Value::Map(map) => Pending::OwnedEntries(std::mem::take(map).into_iter()),
                Value::Object { inner, .. } => {
                    Pending::Inner(Some(Item::Owned(std::mem::take(&mut **inner))))
                }
                _ => Pending::Inner(None),
            },
        }
    }
}

/// Enters one more level; past the limit inside a registered node, the
/// error names the innermost node type: a registered flatten that returns
/// ever new values containing its node nests until the limit stops it.
fn enter_level(innermost_registered: Option<&String>) -> Result<Level> {
    Level::enter().map_err(|e| match (e, innermost_registered) {
        (Error::Tree { path, detail }, Some(name)) => Error::Tree {
            path,
            detail: format!(
                "{detail} (inside node type `{name}`: does its flatten return new values \
                 containing the node?)"
            ),
        },
        (e, _) => e,
    })
}

/// Opens a registered node: its registered flatten gives the children and
/// the aux data. A node equal to an enclosing node of its type is a cycle.
fn start_registered<'v>(
    node_type: &NodeType,
    item: Item<'v>,
    open: &[Open<'v>],
) -> Result<Open<'v>> {
    let name = &node_type.name;
    let _level = enter_level(Some(name))?;
    let here = Enclosing {
        node: item,
        fingerprint: OnceCell::new(),
    };
    let value = here.node.value();
    let enclosing = open.iter().rev().filter_map(|o| o.node.as_ref());
    for (levels_up, node) in (1..).zip(enclosing) {
        if node.node.value().type_name() == value.type_name()
            && node.fingerprint() == here.fingerprint()
            && same_value(node.node.value(), value)
        {
            return Err(tree_err(format!(
                "node type `{name}` flattens into itself: this value equals the enclosing \
                 `{name}` {levels_up} registered node(s) up, so flattening would never end \
                 (a registered flatten must return the node's children, not the node)"
            )));
        }
    }
    let (children, aux) = (node_type.flatten)(value)
        .map_err(|e| tree_err(format!("the flatten of node type `{name}` failed: {e}")))?;
    Ok(Open {
        shape: Shape::Registered(name.clone(), aux),
        defs: Vec::with_capacity(children.len()),
        pending: Pending::OwnedItems(children.into_iter()),
        node: Some(here),
        _level,
    })
}

/// Whether two values are the same for a registered flatten: equal
/// scalars (floats by bits), the same array (by identity), and containers
/// of such values. A deterministic flatten given the same value returns the
/// same children. Iterative, so comparing deep values cannot overflow.
fn same_value(a: &Value, b: &Value) -> bool {
    let mut pending = vec![(a, b)];
    while let Some(pair) = pending.pop() {
        match pair {
            (Value::None, Value::None) => {}
            (Value::Bool(x), Value::Bool(y)) if x == y => {}
            (Value::Int(x), Value::Int(y)) if x == y => {}
            (Value::Float(x), Value::Float(y)) if x.to_bits() == y.to_bits() => {}
            (Value::Str(x), Value::Str(y)) if x == y => {}
            (Value::Array(x), Value::Array(y)) if Arc::ptr_eq(&x.node, &y.node) => {}
            (Value::List(x), Value::List(y)) | (Value::Tuple(x), Value::Tuple(y))
                if x.len() == y.len() =>
            {
                pending.extend(x.iter().zip(y));
            }
            (Value::Map(x), Value::Map(y)) if x.len() == y.len() => {
                for ((k, v), (l, w)) in x.iter().zip(y) {
                    if k != l {
                        return false;
                    }
                    pending.push((v, w));
                }
            }
            (Value::Object { class: c, inner: i }, Value::Object { class: d, inner: j })
                if c == d =>
            {
                pending.push((i, j));
            }
            (Value::Opaque { type_name: x }, Value::Opaque { type_name: y }) if x == y => {}
            _ => return false,
        }
    }
    true
}

/// A hash agreeing with [`same_value`]: equal values hash equally, so only
/// values with equal fingerprints need comparing. Iterative.
fn fingerprint(value: &Value) -> u64 {
    let mut state = FastHasher::default();
    let mut pending = vec![value];
    while let Some(value) = pending.pop() {
        std::mem::discriminant(value).hash(&mut state);
        match value {
            Value::None => {}
            Value::Bool(b) => b.hash(&mut state),
            Value::Int(i) => i.hash(&mut state),
            Value::Float(x) => x.to_bits().hash(&mut state),
            Value::Str(s) => s.hash(&mut state),
            Value::Array(a) => Arc::as_ptr(&a.node).hash(&mut state),
            Value::List(items) | Value::Tuple(items) => {
                items.len().hash(&mut state);
                pending.extend(items);
            }
            Value::Map(map) => {
                map.len().hash(&mut state);
                for (k, v) in map {
                    k.hash(&mut state);
                    pending.push(v);
                }
            }
            Value::Object { class, inner } => {
                class.hash(&mut state);
                pending.push(inner);
            }
            Value::Opaque { type_name } => type_name.hash(&mut state),
        }
    }
    state.finish()
}

/// What an open def becomes once its children are rebuilt.
enum Build<'d> {
    List,
    Tuple,
    /// `Option(Some(def))`: the child itself, with no path step.
    Some,
    Map(&'d [(MapKey, TreeDef)]),
    /// An unregistered script object of this class.
    Object(&'d str),
    /// A registered node, rebuilt by its registered unflatten.
    Registered(&'d NodeDef, Arc<NodeType>),
}

/// The child defs of an open def still to rebuild.
enum ChildDefs<'d> {
    Plain(std::slice::Iter<'d, TreeDef>),
    Keyed(std::slice::Iter<'d, (MapKey, TreeDef)>),
    Fields(std::slice::Iter<'d, (Cow<'static, str>, TreeDef)>),
}

impl<'d> Iterator for ChildDefs<'d> {
    type Item = &'d TreeDef;

    fn next(&mut self) -> Option<&'d TreeDef> {
        match self {
            ChildDefs::Plain(defs) => defs.next(),
            ChildDefs::Keyed(defs) => defs.next().map(|(_, d)| d),
            ChildDefs::Fields(defs) => defs.next().map(|(_, d)| d),
        }
    }
}

/// A def whose children are being rebuilt.
struct Rebuilding<'d> {
    build: Build<'d>,
    pending: ChildDefs<'d>,
    /// The children rebuilt so far.
    values: Vec<Value>,
    _level: Level,
}

impl Rebuilding<'_> {
    /// The path step to the child being rebuilt (none into an `Option`).
    fn step(&self) -> Option<PathEntry> {
        let i = self.values.len();
        match &self.build {
            Build::List | Build::Tuple => Some(PathEntry::Index(i)),
            Build::Some => None,
            Build::Map(entries) => entries.get(i).map(|(k, _)| PathEntry::Key(k.to_string())),
            Build::Object(_) => Some(PathEntry::Field(Cow::Borrowed(""))),
            Build::Registered(node, _) => {
                node.fields.get(i).map(|(f, _)| PathEntry::Field(f.clone()))
            }
        }
    }

    /// The rebuilt value, once its children are all rebuilt; the emptied
    /// def is dropped next, leaving its level.
    fn finish(&mut self) -> Result<Value> {
        let mut values = std::mem::take(&mut self.values);
        Ok(match std::mem::replace(&mut self.build, Build::List) {
            Build::List => Value::List(values),
            Build::Tuple => Value::Tuple(values),
            Build::Some => values.pop().unwrap_or_default(),
            Build::Map(entries) => Value::Map(
                entries
                    .iter()
                    .map(|(k, _)| k.to_string())
                    .zip(values)
                    .collect::<BTreeMap<_, _>>(),
            ),
            Build::Object(class) => Value::Object {
                class: Arc::from(class),
                inner: Box::new(values.pop().unwrap_or_default()),
            },
            Build::Registered(node, node_type) => {
                let count = values.len();
                (node_type.unflatten)(&node.aux, values).map_err(|e| {
                    tree_err(format!(
                        "the unflatten of node type `{}` failed with {count} children: {e}",
                        node.type_name
                    ))
                })?
            }
        })
    }
}

/// What starting on a def gives: its value, or a def to rebuild.
enum Begun<'d> {
    Value(Value),
    Open(Rebuilding<'d>),
}

/// Builds a new value from `def` and leaves with `registry`; registered
/// nodes are rebuilt by their registered unflatten.
pub(super) fn unflatten(
    registry: &Registry,
    def: &TreeDef,
    leaves: &mut IntoIter<Array>,
) -> Result<Value> {
    let mut open: Vec<Rebuilding<'_>> = Vec::new();
    let mut def = def;
    let path = |open: &[Rebuilding<'_>], e| with_path(e, open.iter().map(Rebuilding::step));
    loop {
        // Go down to the first child without children of its own.
        let mut done = match begin(registry, def, leaves) {
            Ok(Begun::Value(value)) => value,
            Ok(Begun::Open(mut rebuilding)) => match rebuilding.pending.next() {
                Some(child) => {
                    open.push(rebuilding);
                    def = child;
                    continue;
                }
                None => rebuilding.finish().map_err(|e| path(&open, e))?,
            },
            Err(e) => return Err(path(&open, e)),
        };
        // Hand each rebuilt value to its parent, finishing every parent
        // whose children are all rebuilt, until one has a child left.
        def = loop {
            let Some(rebuilding) = open.last_mut() else {
                return Ok(done);
            };
            rebuilding.values.push(done);
            if let Some(child) = rebuilding.pending.next() {
                break child;
            }
            let finished = rebuilding.finish();
            open.pop();
            done = finished.map_err(|e| path(&open, e))?;
        };
    }
}

/// The value of a def without children, or the def opened for rebuilding.
fn begin<'d>(
    registry: &Registry,
    def: &'d TreeDef,
    leaves: &mut IntoIter<Array>,
) -> Result<Begun<'d>> {
    let (build, pending) = match def {
        TreeDef::Leaf => return Ok(Begun::Value(Value::Array(next_leaf(leaves)?))),
        TreeDef::Static(v) => {
            return match v.downcast_ref::<ScriptScalar>() {
                Some(s) => Ok(Begun::Value(s.to_value())),
                None => Err(mismatch("a script scalar", def)),
            }
        }
        TreeDef::Unit => return Ok(Begun::Value(Value::Tuple(Vec::new()))),
        TreeDef::Option(None) => return Ok(Begun::Value(Value::None)),
        TreeDef::Tuple(items) => (Build::Tuple, ChildDefs::Plain(items.iter())),
        TreeDef::List(items) => (Build::List, ChildDefs::Plain(items.iter())),
        TreeDef::Option(Some(d)) => (
            Build::Some,
            ChildDefs::Plain(std::slice::from_ref(&**d).iter()),
        ),
        TreeDef::Map(entries) => (Build::Map(entries), ChildDefs::Keyed(entries.iter())),
        TreeDef::Node(node) => match node.fields.as_slice() {
            [(name, _)] if name.is_empty() && node.aux.is_unit() => (
                Build::Object(&node.type_name),
                ChildDefs::Fields(node.fields.iter()),
            ),
            _ => (
                Build::Registered(node, registered(registry, node)?),
                ChildDefs::Fields(node.fields.iter()),
            ),
        },
    };
    Ok(Begun::Open(Rebuilding {
        build,
        pending,
        values: Vec::new(),
        _level: Level::enter()?,
    }))
}

/// The registration rebuilding `node`, whose children must be exactly `0`,
/// `1`, ... as flatten made them.
fn registered(registry: &Registry, node: &NodeDef) -> Result<Arc<NodeType>> {
    let name = &node.type_name;
    let node_type = registry
        .lookup(name)
        .ok_or_else(|| tree_err(format!("node type `{name}` is not registered")))?;
    if let Some((i, (field, _))) = node
        .fields
        .iter()
        .enumerate()
        .find(|(i, (field, _))| *field != child_name(*i))
    {
        return Err(tree_err(format!(
            "node type `{name}` expects children named 0..{}, child {i} is named `{field}`",
            node.fields.len()
        )));
    }
    Ok(node_type)
}
/// The walks with an explicit registry, as `Value` methods (here beside
/// the walks, so `value.rs` needs nothing from this file).
impl Value {
    /// Flattens with an explicit registry: registered types first (by
    /// [`Value::type_name`]), then the built-in containers.
    ///
    /// A registered node whose flatten returns (a value equal to) itself,
    /// directly or through other nodes, is an `Err` naming its type and
    /// path; so is nesting deeper than [`MAX_TREE_DEPTH`](super::MAX_TREE_DEPTH).
    pub fn flatten_with(&self, registry: &Registry, leaves: &mut Vec<Array>) -> Result<TreeDef> {
        flatten(self, registry, leaves)
    }

    /// Builds a new value from `def` and leaves with an explicit registry.
    /// Registered nodes are rebuilt by their registered unflatten.
    pub fn unflatten_with(
        registry: &Registry,
        def: &TreeDef,
        leaves: &mut IntoIter<Array>,
    ) -> Result<Value> {
        unflatten(registry, def, leaves)
    }
}
