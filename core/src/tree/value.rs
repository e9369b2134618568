//! Dynamic values (the playground's script values) and the runtime registry
//! of node types.

use super::depth::MAX_TREE_DEPTH;
use super::path::tree_err;
use super::static_value::StaticValue;
use super::{Tree, TreeDef};
use crate::error::Result;
use crate::handle::array::Array;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::vec::IntoIter;

/// A dynamically typed value, as scripts produce them.
///
/// Scripts can nest values arbitrarily deep, so dropping and cloning one
/// recurse a few levels at most (a list nested ten thousand deep drops like
/// a flat one), and `Debug` prints levels beyond [`MAX_TREE_DEPTH`] as `..`. Because
/// `Value` implements `Drop`, a pattern cannot move a payload out of it:
/// take a value apart with [`Value::into_parts`] (or [`Value::into_list`],
/// [`Value::into_map`]), or take one payload by `std::mem::take` (the
/// default value is [`Value::None`]). Flattening a value nested deeper
/// than [`MAX_TREE_DEPTH`] is an `Err` naming the path.
///
/// ```
/// use kiln::Value;
/// let mut deep = Value::Int(1);
/// for _ in 0..10_000 {
///     deep = Value::List(vec![deep]);
/// }
/// let mut copy = deep.clone();
/// drop(deep);
/// let Value::List(items) = &mut copy else { unreachable!() };
/// let inner = std::mem::take(&mut items[0]);
/// assert_eq!((inner.type_name(), items[0].type_name()), ("list", "none"));
/// ```
#[derive(Default)]
pub enum Value {
    /// No value.
    #[default]
    None,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// An array (a leaf).
    Array(Array),
    /// A list.
    List(Vec<Value>),
    /// A tuple.
    Tuple(Vec<Value>),
    /// A map with string keys.
    Map(BTreeMap<String, Value>),
    /// An object of a user class whose payload is `inner` (a class
    /// subclassing list has an inner `List`).
    Object {
        /// The class name.
        class: Arc<str>,
        /// The payload.
        inner: Box<Value>,
    },
    /// Something that is not a tree at all (a function, a handle).
    Opaque {
        /// Its type, for error messages.
        type_name: String,
    },
}

impl Value {
    /// `none`, `bool`, `int`, `float`, `str`, `array`, `list`, `tuple`,
    /// `map`, the class of an object, the type name of an opaque value.
    pub fn type_name(&self) -> &str {
        match self {
            Value::None => "none",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Array(_) => "array",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Map(_) => "map",
            Value::Object { class, .. } => class,
            Value::Opaque { type_name } => type_name,
        }
    }
}

/// A [`Value`] taken apart by value ([`Value::into_parts`]): the same
/// variants, without `Value`'s `Drop`, so a `match` can move the payloads
/// out. `Value::from` puts one back together.
///
/// ```
/// use kiln::{Value, ValueParts};
/// let rename = |v: Value| match v.into_parts() {
///     ValueParts::Map(mut map) => {
///         let w = map.remove("weight").unwrap_or_default();
///         map.insert("w".into(), w);
///         Value::Map(map)
///     }
///     other => Value::from(other),
/// };
/// let v = Value::Map([("weight".to_string(), Value::Int(3))].into());
/// let Value::Map(map) = &rename(v) else { unreachable!() };
/// assert_eq!(map["w"].type_name(), "int");
/// assert_eq!(rename(Value::Int(1)).type_name(), "int");
/// ```
#[derive(Debug)]
pub enum ValueParts {
    /// [`Value::None`].
    None,
    /// [`Value::Bool`].
    Bool(bool),
    /// [`Value::Int`].
    Int(i64),
    /// [`Value::Float`].
    Float(f64),
    /// [`Value::Str`].
    Str(String),
    /// [`Value::Array`].
    Array(Array),
    /// [`Value::List`].
    List(Vec<Value>),
    /// [`Value::Tuple`].
    Tuple(Vec<Value>),
    /// [`Value::Map`].
    Map(BTreeMap<String, Value>),
    /// [`Value::Object`].
    Object {
        /// The class name.
        class: Arc<str>,
        /// The payload.
        inner: Box<Value>,
    },
    /// [`Value::Opaque`].
    Opaque {
        /// Its type, for error messages.
        type_name: String,
    },
}

impl Value {
    /// The value taken apart, its payload moved out (no copy of nested
    /// values, which keep their own iterative drop).
    pub fn into_parts(mut self) -> ValueParts {
        match &mut self {
            Value::None => ValueParts::None,
            Value::Bool(b) => ValueParts::Bool(*b),
            Value::Int(i) => ValueParts::Int(*i),
            Value::Float(x) => ValueParts::Float(*x),
            Value::Str(s) => ValueParts::Str(std::mem::take(s)),
            Value::Array(a) => ValueParts::Array(a.clone()),
            Value::List(items) => ValueParts::List(std::mem::take(items)),
            Value::Tuple(items) => ValueParts::Tuple(std::mem::take(items)),
            Value::Map(map) => ValueParts::Map(std::mem::take(map)),
            Value::Object { class, inner } => ValueParts::Object {
                class: class.clone(),
                inner: std::mem::take(inner),
            },
            Value::Opaque { type_name } => ValueParts::Opaque {
                type_name: std::mem::take(type_name),
            },
        }
    }

    /// The items of a list; any other value is given back as the `Err`.
    pub fn into_list(self) -> std::result::Result<Vec<Value>, Value> {
        match self.into_parts() {
            ValueParts::List(items) => Ok(items),
            other => Err(Value::from(other)),
        }
    }

    /// The entries of a map; any other value is given back as the `Err`.
    pub fn into_map(self) -> std::result::Result<BTreeMap<String, Value>, Value> {
        match self.into_parts() {
            ValueParts::Map(map) => Ok(map),
            other => Err(Value::from(other)),
        }
    }
}

impl From<ValueParts> for Value {
    fn from(parts: ValueParts) -> Value {
        match parts {
            ValueParts::None => Value::None,
            ValueParts::Bool(b) => Value::Bool(b),
            ValueParts::Int(i) => Value::Int(i),
            ValueParts::Float(x) => Value::Float(x),
            ValueParts::Str(s) => Value::Str(s),
            ValueParts::Array(a) => Value::Array(a),
            ValueParts::List(items) => Value::List(items),
            ValueParts::Tuple(items) => Value::Tuple(items),
            ValueParts::Map(map) => Value::Map(map),
            ValueParts::Object { class, inner } => Value::Object { class, inner },
            ValueParts::Opaque { type_name } => Value::Opaque { type_name },
        }
    }
}

impl Value {
    /// Whether this value holds other values (and is a level of nesting).
    fn is_container(&self) -> bool {
        matches!(
            self,
            Value::List(_) | Value::Tuple(_) | Value::Map(_) | Value::Object { .. }
        )
    }

    /// Whether this value holds values that hold values: dropping or
    /// cloning it by recursion would go more than one level down.
    fn children_are_containers(&self) -> bool {
        match self {
            Value::List(items) | Value::Tuple(items) => items.iter().any(Value::is_container),
            Value::Map(map) => map.values().any(Value::is_container),
            Value::Object { inner, .. } => inner.is_container(),
            _ => false,
        }
    }

    /// Moves the children out, leaving empty containers, onto `pending`.
    fn move_children_into(&mut self, pending: &mut Vec<Value>) {
        match self {
            Value::List(items) | Value::Tuple(items) => pending.append(items),
            Value::Map(map) => pending.extend(std::mem::take(map).into_values()),
            Value::Object { inner, .. } => pending.push(std::mem::take(&mut **inner)),
            _ => {}
        }
    }

    /// A copy of this value whose containers are empty: the node itself,
    /// without its children (which [`attach`] puts back).
    fn clone_node(&self) -> Value {
        match self {
            Value::None => Value::None,
            Value::Bool(b) => Value::Bool(*b),
            Value::Int(i) => Value::Int(*i),
            Value::Float(x) => Value::Float(*x),
            Value::Str(s) => Value::Str(s.clone()),
            Value::Array(a) => Value::Array(a.clone()),
            Value::List(items) => Value::List(Vec::with_capacity(items.len())),
            Value::Tuple(items) => Value::Tuple(Vec::with_capacity(items.len())),
            Value::Map(_) => Value::Map(BTreeMap::new()),
            Value::Object { class, .. } => Value::Object {
                class: class.clone(),
                inner: Box::default(),
            },
            Value::Opaque { type_name } => Value::Opaque {
                type_name: type_name.clone(),
            },
        }
    }
}

impl Drop for Value {
    /// Drops nested values with an explicit stack: the derived drop
    /// recursed once per level, and a script's list nested ten thousand
    /// deep overflowed the stack. A value whose children hold nothing, the
    /// common case, is dropped by the fields' own drops without allocating.
    fn drop(&mut self) {
        if !self.children_are_containers() {
            return;
        }
        let mut pending = Vec::new();
        self.move_children_into(&mut pending);
        while let Some(mut value) = pending.pop() {
            value.move_children_into(&mut pending);
        }
    }
}

/// The children of a value, with their map keys.
enum Children<'a> {
    Items(std::slice::Iter<'a, Value>),
    Entries(std::collections::btree_map::Iter<'a, String, Value>),
    Inner(Option<&'a Value>),
}

impl<'a> Children<'a> {
    fn of(value: &'a Value) -> Children<'a> {
        match value {
            Value::List(items) | Value::Tuple(items) => Children::Items(items.iter()),
            Value::Map(map) => Children::Entries(map.iter()),
            Value::Object { inner, .. } => Children::Inner(Some(inner)),
            _ => Children::Inner(None),
        }
    }
}

impl<'a> Iterator for Children<'a> {
    type Item = (Option<&'a String>, &'a Value);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Children::Items(items) => items.next().map(|v| (None, v)),
            Children::Entries(entries) => entries.next().map(|(k, v)| (Some(k), v)),
            Children::Inner(inner) => inner.take().map(|v| (None, v)),
        }
    }
}

/// Puts a copied child into its parent's copy (see [`Value::clone_node`]).
fn attach(parent: &mut Value, key: Option<&String>, child: Value) {
    match (parent, key) {
        (Value::List(items) | Value::Tuple(items), _) => items.push(child),
        (Value::Map(map), Some(key)) => {
            map.insert(key.clone(), child);
        }
        (Value::Object { inner, .. }, _) => **inner = child,
        _ => {}
    }
}

/// Levels [`Value::clone`] copies by recursion, which is fastest (maps are
/// built in bulk) and costs little stack this shallow; deeper levels are
/// copied with an explicit stack.
const CLONE_RECURSION_LEVELS: usize = 16;

impl Clone for Value {
    /// Copies the value; never recurses more than a few levels, so a value
    /// nested any depth clones (see [`Value`]).
    fn clone(&self) -> Value {
        clone_within(self, CLONE_RECURSION_LEVELS)
    }
}

/// Copies `value` by recursion for `levels` levels, then with a stack.
fn clone_within(value: &Value, levels: usize) -> Value {
    let Some(below) = levels.checked_sub(1) else {
        return clone_with_stack(value);
    };
    match value {
        Value::List(items) => Value::List(items.iter().map(|v| clone_within(v, below)).collect()),
        Value::Tuple(items) => Value::Tuple(items.iter().map(|v| clone_within(v, below)).collect()),
        Value::Map(map) => Value::Map(
            map.iter()
                .map(|(k, v)| (k.clone(), clone_within(v, below)))
                .collect(),
        ),
        Value::Object { class, inner } => Value::Object {
            class: class.clone(),
            inner: Box::new(clone_within(inner, below)),
        },
        other => other.clone_node(),
    }
}

/// Copies `root` depth-first with an explicit stack of the copies being
/// built, each with its source's children still to copy and its key in
/// its parent.
fn clone_with_stack(root: &Value) -> Value {
    let mut open: Vec<(Value, Children<'_>, Option<&String>)> = Vec::new();
    let (mut source, mut key) = (root, None);
    loop {
        // Go down to the first value without children.
        let mut children = Children::of(source);
        let mut done = match children.next() {
            Some((child_key, child)) => {
                open.push((source.clone_node(), children, key));
                (source, key) = (child, child_key);
                continue;
            }
            None => (source.clone_node(), key),
        };
        // Hand each copy to its parent, closing every parent whose children
        // are all copied, until one has a child left.
        (source, key) = loop {
            let Some((parent, children, parent_key)) = open.last_mut() else {
                return done.0;
            };
            attach(parent, done.1, done.0);
            if let Some((child_key, child)) = children.next() {
                break (child, child_key);
            }
            done = (std::mem::take(parent), *parent_key);
            open.pop();
        };
    }
}

impl fmt::Debug for Value {
    /// Like a derived `Debug`; values nested deeper than
    /// [`MAX_TREE_DEPTH`] print as `..` so that printing cannot overflow the
    /// stack.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&DebugAt(self, 0), f)
    }
}

/// A value at a depth, printed as `Value`'s `Debug` prints it there.
struct DebugAt<'a>(&'a Value, usize);

/// The items of a list or tuple at a depth.
struct DebugItems<'a>(&'a [Value], usize);

/// The entries of a map at a depth.
struct DebugEntries<'a>(&'a BTreeMap<String, Value>, usize);

impl fmt::Debug for DebugItems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|v| DebugAt(v, self.1)))
            .finish()
    }
}

impl fmt::Debug for DebugEntries<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| (k, DebugAt(v, self.1))))
            .finish()
    }
}

impl fmt::Debug for DebugAt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let DebugAt(value, depth) = *self;
        if depth > MAX_TREE_DEPTH {
            return f.write_str("..");
        }
        let below = depth + 1;
        match value {
            Value::None => f.write_str("None"),
            Value::Bool(b) => f.debug_tuple("Bool").field(b).finish(),
            Value::Int(i) => f.debug_tuple("Int").field(i).finish(),
            Value::Float(x) => f.debug_tuple("Float").field(x).finish(),
            Value::Str(s) => f.debug_tuple("Str").field(s).finish(),
            Value::Array(a) => f.debug_tuple("Array").field(a).finish(),
            Value::List(items) => f
                .debug_tuple("List")
                .field(&DebugItems(items, below))
                .finish(),
            Value::Tuple(items) => f
                .debug_tuple("Tuple")
                .field(&DebugItems(items, below))
                .finish(),
            Value::Map(map) => f
                .debug_tuple("Map")
                .field(&DebugEntries(map, below))
                .finish(),
            Value::Object { class, inner } => f
                .debug_struct("Object")
                .field("class", class)
                .field("inner", &DebugAt(inner, below))
                .finish(),
            Value::Opaque { type_name } => f
                .debug_struct("Opaque")
                .field("type_name", type_name)
                .finish(),
        }
    }
}

impl Tree for Value {
    /// Flattens with [`Registry::global`].
    fn flatten(&self, leaves: &mut Vec<Array>) -> Result<TreeDef> {
        self.flatten_with(Registry::global(), leaves)
    }

    /// Unflattens with [`Registry::global`].
    fn unflatten(def: &TreeDef, leaves: &mut IntoIter<Array>) -> Result<Self> {
        Value::unflatten_with(Registry::global(), def, leaves)
    }
}

/// A script scalar as a static value (floats by bits).
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) enum ScriptScalar {
    None,
    Bool(bool),
    Int(i64),
    Float(u64),
    Str(String),
}

impl ScriptScalar {
    pub(super) fn to_value(&self) -> Value {
        match self {
            ScriptScalar::None => Value::None,
            ScriptScalar::Bool(b) => Value::Bool(*b),
            ScriptScalar::Int(i) => Value::Int(*i),
            ScriptScalar::Float(bits) => Value::Float(f64::from_bits(*bits)),
            ScriptScalar::Str(s) => Value::Str(s.clone()),
        }
    }
}

impl fmt::Debug for ScriptScalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScriptScalar::None => f.write_str("None"),
            ScriptScalar::Bool(b) => write!(f, "{b:?}"),
            ScriptScalar::Int(i) => write!(f, "{i:?}"),
            ScriptScalar::Float(bits) => write!(f, "{:?}", f64::from_bits(*bits)),
            ScriptScalar::Str(s) => write!(f, "{s:?}"),
        }
    }
}

pub(super) fn scalar(s: ScriptScalar) -> TreeDef {
    TreeDef::Static(StaticValue::new(s))
}

/// Names of registered children `0`, `1`, ... without allocating for the
/// common small counts.
pub(super) fn child_name(i: usize) -> Cow<'static, str> {
    const NAMES: [&str; 16] = [
        "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15",
    ];
    match NAMES.get(i) {
        Some(name) => Cow::Borrowed(name),
        None => Cow::Owned(i.to_string()),
    }
}

/// A registered flatten: the children of a value and its aux data.
pub type FlattenFn = Arc<dyn Fn(&Value) -> Result<(Vec<Value>, StaticValue)> + Send + Sync>;

/// A registered unflatten: builds a new value from aux data and children.
pub type UnflattenFn = Arc<dyn Fn(&StaticValue, Vec<Value>) -> Result<Value> + Send + Sync>;

/// A node type for dynamic values: how to flatten a value of class `name`
/// into children and aux data, and how to build a new one back.
#[derive(Clone)]
pub struct NodeType {
    /// The class name ([`Value::type_name`]) this type handles.
    pub name: String,
    /// Splits a value into children (flattened further) and aux data (part
    /// of the cache key).
    pub flatten: FlattenFn,
    /// Builds a new value from the aux data and the rebuilt children; it must
    /// not mutate anything it did not create.
    pub unflatten: UnflattenFn,
}

impl NodeType {
    /// A node type for class `name` from its flatten and unflatten closures.
    pub fn new(
        name: impl Into<String>,
        flatten: impl Fn(&Value) -> Result<(Vec<Value>, StaticValue)> + Send + Sync + 'static,
        unflatten: impl Fn(&StaticValue, Vec<Value>) -> Result<Value> + Send + Sync + 'static,
    ) -> NodeType {
        NodeType {
            name: name.into(),
            flatten: Arc::new(flatten),
            unflatten: Arc::new(unflatten),
        }
    }
}

impl fmt::Debug for NodeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeType")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Node types for dynamic values, looked up by class name before the
/// built-in containers.
#[derive(Debug, Default)]
pub struct Registry {
    types: RwLock<HashMap<String, Arc<NodeType>>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// The process-wide registry used by `Value`'s `Tree` impl.
    pub fn global() -> &'static Registry {
        static GLOBAL: OnceLock<Registry> = OnceLock::new();
        GLOBAL.get_or_init(Registry::new)
    }

    /// Registers `node_type`; a name can be registered once.
    pub fn register(&self, node_type: NodeType) -> Result<()> {
        // The lock is never held while user code runs, so a poisoned lock
        // still guards a consistent map.
        let mut types = self.types.write().unwrap_or_else(PoisonError::into_inner);
        if types.contains_key(&node_type.name) {
            return Err(tree_err(format!(
                "node type `{}` is already registered",
                node_type.name
            )));
        }
        types.insert(node_type.name.clone(), Arc::new(node_type));
        Ok(())
    }

    /// The node type registered as `name`.
    pub fn get(&self, name: &str) -> Option<NodeType> {
        self.lookup(name).map(|t| (*t).clone())
    }

    pub(super) fn lookup(&self, name: &str) -> Option<Arc<NodeType>> {
        let types = self.types.read().unwrap_or_else(PoisonError::into_inner);
        types.get(name).cloned()
    }
}

#[cfg(test)]
mod into_parts_tests {
    use super::*;

    #[test]
    fn into_parts_and_back_is_the_same_value_for_every_variant() {
        let values = [
            Value::None,
            Value::Bool(true),
            Value::Int(-3),
            Value::Float(0.5),
            Value::Str("s".into()),
            Value::List(vec![Value::Int(1)]),
            Value::Tuple(vec![Value::None, Value::Int(2)]),
            Value::Map([("k".to_string(), Value::Bool(false))].into()),
            Value::Object {
                class: "Linear".into(),
                inner: Box::new(Value::Int(4)),
            },
            Value::Opaque {
                type_name: "fn".into(),
            },
        ];
        for v in values {
            let before = format!("{v:?}");
            assert_eq!(format!("{:?}", Value::from(v.into_parts())), before);
        }
    }

    #[test]
    fn into_list_and_into_map_give_other_values_back() {
        let items = Value::List(vec![Value::Int(1), Value::Int(2)])
            .into_list()
            .unwrap();
        assert_eq!(items.len(), 2);
        let back = Value::Int(7).into_list().unwrap_err();
        assert!(matches!(back, Value::Int(7)));
        let map = Value::Map([("a".to_string(), Value::None)].into())
            .into_map()
            .unwrap();
        assert!(map.contains_key("a"));
        let back = Value::List(vec![]).into_map().unwrap_err();
        assert_eq!(back.type_name(), "list");
    }

    #[test]
    fn taking_apart_a_deeply_nested_value_drops_it_without_recursion() {
        let mut deep = Value::Int(1);
        for _ in 0..100_000 {
            deep = Value::List(vec![deep]);
        }
        let mut items = deep.into_list().unwrap();
        let inner = items.pop().unwrap();
        drop(items);
        assert_eq!(inner.type_name(), "list");
        drop(inner);
    }
}
