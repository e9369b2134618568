//! Script classes as tree nodes: `register_node("Linear", ["w", "b"],
//! ["act"])` registers the class with Kiln's runtime [`Registry`], so an
//! object `node("Linear", #{ w: .., b: .., act: "relu" })` passes through
//! `compile` with `w` and `b` as children and `act` as aux data, which is
//! part of the cache key by equality.

use kiln::{NodeType, Registry, StaticValue, Value};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// An object of a script class.
#[derive(Clone, Debug)]
pub struct ScriptObject {
    /// The class name, as registered.
    pub class: Arc<str>,
    /// Its fields, children and aux alike.
    pub fields: rhai::Map,
}

/// How a registered class splits into children and aux data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    /// Fields flattened further (arrays or subtrees), in this order.
    pub children: Vec<String>,
    /// Scalar fields that form the node's aux data.
    pub aux: Vec<String>,
}

/// Registers class `name` with [`Registry::global`]. Kiln's registry is
/// process-wide and keeps a type for good, so a re-run registering the
/// same class the same way is accepted; registering it another way is an
/// error naming both specs.
pub fn register_node(name: &str, spec: NodeSpec) -> Result<(), String> {
    if let Some(field) = spec.children.iter().find(|c| spec.aux.contains(c)) {
        return Err(format!(
            "field `{field}` of `{name}` is listed both as a child and as aux data"
        ));
    }
    static SPECS: OnceLock<Mutex<HashMap<String, NodeSpec>>> = OnceLock::new();
    // Held across the registration, so two sessions registering one name
    // at once agree on a single spec.
    let mut specs = SPECS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(existing) = specs.get(name) {
        return if *existing == spec {
            Ok(())
        } else {
            Err(format!(
                "node type `{name}` is already registered with children {:?} and aux {:?}; \
                 registered types last for the page's lifetime, so pick another name",
                existing.children, existing.aux
            ))
        };
    }
    let class: Arc<str> = Arc::from(name);
    let flatten_spec = spec.clone();
    let unflatten_spec = spec.clone();
    Registry::global()
        .register(NodeType::new(
            name,
            move |value: &Value| flatten(&flatten_spec, value),
            move |aux: &StaticValue, children: Vec<Value>| {
                unflatten(&class, &unflatten_spec, aux, children)
            },
        ))
        .map_err(|e| e.to_string())?;
    specs.insert(name.to_string(), spec);
    Ok(())
}

/// The aux data of a script node: its aux fields by name.
#[derive(Clone, PartialEq, Eq, Hash)]
struct AuxFields(Vec<(String, AuxScalar)>);

/// A scalar aux field; floats by their bits, so equality is exact.
#[derive(Clone, PartialEq, Eq, Hash)]
enum AuxScalar {
    None,
    Bool(bool),
    Int(i64),
    Float(u64),
    Str(String),
}

impl fmt::Debug for AuxFields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, (name, value)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{name}: ")?;
            match value {
                AuxScalar::None => f.write_str("()")?,
                AuxScalar::Bool(b) => write!(f, "{b}")?,
                AuxScalar::Int(i) => write!(f, "{i}")?,
                AuxScalar::Float(bits) => write!(f, "{:?}", f64::from_bits(*bits))?,
                AuxScalar::Str(s) => write!(f, "{s:?}")?,
            }
        }
        f.write_str("}")
    }
}

fn node_error(detail: String) -> kiln::Error {
    kiln::Error::Tree {
        path: String::new(),
        detail,
    }
}

fn flatten(spec: &NodeSpec, value: &Value) -> kiln::Result<(Vec<Value>, StaticValue)> {
    let (class, fields) = match value {
        Value::Object { class, inner } => match inner.as_ref() {
            Value::Map(fields) => (class, fields),
            other => {
                return Err(node_error(format!(
                    "an object of class `{class}` holds a {}, not a map of fields",
                    other.type_name()
                )))
            }
        },
        other => {
            return Err(node_error(format!(
                "expected an object, got a {}",
                other.type_name()
            )))
        }
    };
    if let Some(extra) = fields
        .keys()
        .find(|k| !spec.children.contains(k) && !spec.aux.contains(k))
    {
        return Err(node_error(format!(
            "field `{extra}` of `{class}` is neither a child {:?} nor aux data {:?}",
            spec.children, spec.aux
        )));
    }
    let field = |name: &String| {
        fields.get(name).ok_or_else(|| {
            node_error(format!(
                "the object of class `{class}` has no field `{name}`"
            ))
        })
    };
    let children = spec
        .children
        .iter()
        .map(|name| field(name).cloned())
        .collect::<kiln::Result<Vec<_>>>()?;
    let aux = spec
        .aux
        .iter()
        .map(|name| {
            let scalar = match field(name)? {
                Value::None => AuxScalar::None,
                Value::Bool(b) => AuxScalar::Bool(*b),
                Value::Int(i) => AuxScalar::Int(*i),
                Value::Float(x) => AuxScalar::Float(x.to_bits()),
                Value::Str(s) => AuxScalar::Str(s.clone()),
                other => {
                    return Err(node_error(format!(
                        "aux field `{name}` of `{class}` must be a string, number, bool or (), \
                         got a {}",
                        other.type_name()
                    )))
                }
            };
            Ok((name.clone(), scalar))
        })
        .collect::<kiln::Result<Vec<_>>>()?;
    Ok((children, StaticValue::new(AuxFields(aux))))
}

fn unflatten(
    class: &Arc<str>,
    spec: &NodeSpec,
    aux: &StaticValue,
    children: Vec<Value>,
) -> kiln::Result<Value> {
    let aux = aux
        .downcast_ref::<AuxFields>()
        .ok_or_else(|| node_error(format!("the aux data of `{class}` is not a script node's")))?;
    if children.len() != spec.children.len() {
        return Err(node_error(format!(
            "`{class}` has {} children, got {}",
            spec.children.len(),
            children.len()
        )));
    }
    let mut fields: BTreeMap<String, Value> = spec.children.iter().cloned().zip(children).collect();
    for (name, scalar) in &aux.0 {
        let value = match scalar {
            AuxScalar::None => Value::None,
            AuxScalar::Bool(b) => Value::Bool(*b),
            AuxScalar::Int(i) => Value::Int(*i),
            AuxScalar::Float(bits) => Value::Float(f64::from_bits(*bits)),
            AuxScalar::Str(s) => Value::Str(s.clone()),
        };
        fields.insert(name.clone(), value);
    }
    Ok(Value::Object {
        class: class.clone(),
        inner: Box::new(Value::Map(fields)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln::Array;

    fn spec(children: &[&str], aux: &[&str]) -> NodeSpec {
        NodeSpec {
            children: children.iter().map(|s| s.to_string()).collect(),
            aux: aux.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn object(class: &str, w: f32, act: &str) -> Value {
        Value::Object {
            class: Arc::from(class),
            inner: Box::new(Value::Map(BTreeMap::from([
                (
                    "w".to_string(),
                    Value::Array(Array::from_vec(vec![w], &[1]).unwrap()),
                ),
                ("act".to_string(), Value::Str(act.to_string())),
            ]))),
        }
    }

    #[test]
    fn a_registered_class_flattens_children_and_keeps_aux_in_the_tree() {
        register_node("nodes_test.Linear", spec(&["w"], &["act"])).unwrap();
        let (leaves, def) = kiln::tree_flatten(&object("nodes_test.Linear", 2.0, "relu")).unwrap();
        assert_eq!(leaves.len(), 1);
        let (_, other) = kiln::tree_flatten(&object("nodes_test.Linear", 2.0, "tanh")).unwrap();
        assert_ne!(def, other, "aux data is part of the tree");
        let back: Value = kiln::tree_unflatten(&def, leaves).unwrap();
        let Value::Object { inner, .. } = &back else {
            panic!("{back:?}")
        };
        let Value::Map(fields) = &**inner else {
            panic!("not a map")
        };
        assert!(matches!(fields.get("act"), Some(Value::Str(s)) if s == "relu"));
    }

    #[test]
    fn registering_again_the_same_way_is_accepted_another_way_is_not() {
        register_node("nodes_test.Twice", spec(&["w"], &["act"])).unwrap();
        register_node("nodes_test.Twice", spec(&["w"], &["act"])).unwrap();
        let err = register_node("nodes_test.Twice", spec(&["w", "b"], &[])).unwrap_err();
        assert!(
            err.contains("already registered with children [\"w\"]"),
            "{err}"
        );
    }

    #[test]
    fn a_field_outside_the_spec_is_an_error_naming_it() {
        register_node("nodes_test.Strict", spec(&["w"], &[])).unwrap();
        let err = kiln::tree_flatten(&object("nodes_test.Strict", 1.0, "relu")).unwrap_err();
        assert!(err.to_string().contains("field `act`"), "{err}");
    }
}
