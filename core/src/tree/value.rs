//! Dynamic values (the playground's script values) and the runtime registry
//! of node types.

use super::impls::{mismatch, next_leaf};
use super::path::{prefix_error, tree_err, PathEntry};
use super::static_value::StaticValue;
use super::{intern_key, NodeDef, Tree, TreeDef};
use crate::array::Array;
use crate::error::Result;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::vec::IntoIter;

/// A dynamically typed value, as scripts produce them.
#[derive(Clone, Debug)]
pub enum Value {
    /// No value.
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

    /// Flattens with an explicit registry: registered types first (by
    /// [`Value::type_name`]), then the built-in containers.
    pub fn flatten_with(&self, registry: &Registry, leaves: &mut Vec<Array>) -> Result<TreeDef> {
        if let Some(node_type) = registry.lookup(self.type_name()) {
            return flatten_registered(&node_type, registry, self, leaves);
        }
        let indexed = |items: &[Value], leaves: &mut Vec<Array>| {
            items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.flatten_with(registry, leaves)
                        .map_err(|e| prefix_error(e, PathEntry::Index(i)))
                })
                .collect::<Result<Vec<_>>>()
        };
        Ok(match self {
            Value::None => scalar(ScriptScalar::None),
            Value::Bool(b) => scalar(ScriptScalar::Bool(*b)),
            Value::Int(i) => scalar(ScriptScalar::Int(*i)),
            Value::Float(x) => scalar(ScriptScalar::Float(x.to_bits())),
            Value::Str(s) => scalar(ScriptScalar::Str(s.clone())),
            Value::Array(a) => {
                leaves.push(a.clone());
                TreeDef::Leaf
            }
            Value::List(items) => TreeDef::List(indexed(items, leaves)?),
            Value::Tuple(items) => TreeDef::Tuple(indexed(items, leaves)?),
            Value::Map(map) => TreeDef::Map(
                map.iter()
                    .map(|(k, v)| {
                        v.flatten_with(registry, leaves)
                            .map(|d| (intern_key(k), d))
                            .map_err(|e| prefix_error(e, PathEntry::Key(k.clone())))
                    })
                    .collect::<Result<_>>()?,
            ),
            Value::Object { class, inner } => {
                // Unregistered: the payload's container, wrapped so the class
                // survives a round trip.
                let def = inner
                    .flatten_with(registry, leaves)
                    .map_err(|e| prefix_error(e, PathEntry::Field(Cow::Borrowed(""))))?;
                TreeDef::Node(Arc::new(NodeDef {
                    type_name: Cow::Owned(class.to_string()),
                    aux: StaticValue::unit(),
                    fields: vec![(Cow::Borrowed(""), def)],
                }))
            }
            Value::Opaque { type_name } => {
                return Err(tree_err(format!(
                    "`{type_name}` is not a tree: register it as a node type or return arrays, \
                     containers and scalars"
                )))
            }
        })
    }

    /// Builds a new value from `def` and leaves with an explicit registry.
    /// Registered nodes are rebuilt by their registered unflatten.
    pub fn unflatten_with(
        registry: &Registry,
        def: &TreeDef,
        leaves: &mut IntoIter<Array>,
    ) -> Result<Value> {
        let indexed = |items: &[TreeDef], leaves: &mut IntoIter<Array>| {
            items
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    Value::unflatten_with(registry, d, leaves)
                        .map_err(|e| prefix_error(e, PathEntry::Index(i)))
                })
                .collect::<Result<Vec<_>>>()
        };
        Ok(match def {
            TreeDef::Leaf => Value::Array(next_leaf(leaves)?),
            TreeDef::Static(v) => match v.downcast_ref::<ScriptScalar>() {
                Some(s) => s.to_value(),
                None => return Err(mismatch("a script scalar", def)),
            },
            TreeDef::Unit => Value::Tuple(Vec::new()),
            TreeDef::Tuple(items) => Value::Tuple(indexed(items, leaves)?),
            TreeDef::List(items) => Value::List(indexed(items, leaves)?),
            TreeDef::Option(None) => Value::None,
            TreeDef::Option(Some(d)) => Value::unflatten_with(registry, d, leaves)?,
            TreeDef::Map(items) => Value::Map(
                items
                    .iter()
                    .map(|(k, d)| {
                        Value::unflatten_with(registry, d, leaves)
                            .map(|v| (k.to_string(), v))
                            .map_err(|e| prefix_error(e, PathEntry::Key(k.to_string())))
                    })
                    .collect::<Result<_>>()?,
            ),
            TreeDef::Node(node) => match node.fields.as_slice() {
                [(name, inner)] if name.is_empty() && node.aux.is_unit() => Value::Object {
                    class: Arc::from(node.type_name.as_ref()),
                    inner: Box::new(
                        Value::unflatten_with(registry, inner, leaves)
                            .map_err(|e| prefix_error(e, PathEntry::Field(Cow::Borrowed(""))))?,
                    ),
                },
                _ => unflatten_registered(registry, node, leaves)?,
            },
        })
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
enum ScriptScalar {
    None,
    Bool(bool),
    Int(i64),
    Float(u64),
    Str(String),
}

impl ScriptScalar {
    fn to_value(&self) -> Value {
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

fn scalar(s: ScriptScalar) -> TreeDef {
    TreeDef::Static(StaticValue::new(s))
}

/// Names of registered children `0`, `1`, ... without allocating for the
/// common small counts.
fn child_name(i: usize) -> Cow<'static, str> {
    const NAMES: [&str; 16] = [
        "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15",
    ];
    match NAMES.get(i) {
        Some(name) => Cow::Borrowed(name),
        None => Cow::Owned(i.to_string()),
    }
}

fn flatten_registered(
    node_type: &NodeType,
    registry: &Registry,
    value: &Value,
    leaves: &mut Vec<Array>,
) -> Result<TreeDef> {
    let name = &node_type.name;
    let (children, aux) = (node_type.flatten)(value)
        .map_err(|e| tree_err(format!("the flatten of node type `{name}` failed: {e}")))?;
    let fields = children
        .iter()
        .enumerate()
        .map(|(i, child)| {
            let field = child_name(i);
            match child.flatten_with(registry, leaves) {
                Ok(def) => Ok((field, def)),
                Err(e) => Err(prefix_error(e, PathEntry::Field(field))),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(TreeDef::Node(Arc::new(NodeDef {
        type_name: Cow::Owned(name.clone()),
        aux,
        fields,
    })))
}

fn unflatten_registered(
    registry: &Registry,
    node: &NodeDef,
    leaves: &mut IntoIter<Array>,
) -> Result<Value> {
    let name = &node.type_name;
    let node_type = registry
        .lookup(name)
        .ok_or_else(|| tree_err(format!("node type `{name}` is not registered")))?;
    // A registered node's children are exactly `0`, `1`, ... as flatten made them.
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
    let children = node
        .fields
        .iter()
        .map(|(field, d)| {
            Value::unflatten_with(registry, d, leaves)
                .map_err(|e| prefix_error(e, PathEntry::Field(field.clone())))
        })
        .collect::<Result<Vec<_>>>()?;
    let count = children.len();
    (node_type.unflatten)(&node.aux, children).map_err(|e| {
        tree_err(format!(
            "the unflatten of node type `{name}` failed with {count} children: {e}"
        ))
    })
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

    fn lookup(&self, name: &str) -> Option<Arc<NodeType>> {
        let types = self.types.read().unwrap_or_else(PoisonError::into_inner);
        types.get(name).cloned()
    }
}
