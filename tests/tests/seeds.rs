//! The seed scenarios of the core engine issue: custom struct nodes, the
//! runtime registry with aux data in the cache key, fresh outputs, and every
//! kind of miss explanation.

use kiln::{compile, Array, DType, MissReason, NodeType, Registry, StaticValue, Tree, Value};
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

fn arr(values: &[f32]) -> Array {
    Array::from_slice(values, &[values.len()]).expect("1-D data")
}

#[derive(Tree, Clone, Debug)]
struct Pair {
    a: Array,
    b: Array,
}

#[test]
fn seed1_derived_pair_passes_through_compile_and_can_be_returned() {
    let f = compile(|p: Pair| Pair {
        a: &p.a + &p.b,
        b: &p.a * &p.b,
    });
    let out = f
        .call(&Pair {
            a: arr(&[1.0, 2.0]),
            b: arr(&[3.0, 4.0]),
        })
        .unwrap();
    assert_eq!(out.a.to_vec::<f32>().unwrap(), vec![4.0, 6.0]);
    assert_eq!(out.b.to_vec::<f32>().unwrap(), vec![3.0, 8.0]);
}

/// Registers `name` as a node type whose payload is a map with an array
/// `x` and a static `tag`; the tag becomes aux data made by `make_aux`.
fn register_tagged(name: &str, make_aux: fn(&str) -> StaticValue) {
    let class: Arc<str> = Arc::from(name);
    let result = Registry::global().register(NodeType::new(
        name,
        move |v: &Value| match v {
            Value::Object { inner, .. } => match inner.as_ref() {
                Value::Map(m) => match (m.get("x"), m.get("tag")) {
                    (Some(x), Some(Value::Str(tag))) => Ok((vec![x.clone()], make_aux(tag))),
                    _ => Err(kiln::Error::Tree {
                        path: String::new(),
                        detail: "needs x and tag".into(),
                    }),
                },
                _ => Err(kiln::Error::Tree {
                    path: String::new(),
                    detail: "payload is not a map".into(),
                }),
            },
            _ => Err(kiln::Error::Tree {
                path: String::new(),
                detail: "not an object".into(),
            }),
        },
        move |aux: &StaticValue, children: Vec<Value>| {
            let tag = format!("{aux}").trim_matches('"').to_string();
            let mut m = BTreeMap::new();
            m.insert(
                "x".to_string(),
                children.into_iter().next().unwrap_or(Value::None),
            );
            m.insert("tag".to_string(), Value::Str(tag));
            Ok(Value::Object {
                class: class.clone(),
                inner: Box::new(Value::Map(m)),
            })
        },
    ));
    result.expect("fresh registration");
}

fn tagged(class: &str, x: Array, tag: &str) -> Value {
    let mut m = BTreeMap::new();
    m.insert("x".to_string(), Value::Array(x));
    m.insert("tag".to_string(), Value::Str(tag.to_string()));
    Value::Object {
        class: Arc::from(class),
        inner: Box::new(Value::Map(m)),
    }
}

fn double_x(v: Value) -> Value {
    match &v {
        Value::Object { inner, .. } => match inner.as_ref() {
            Value::Map(m) => match m.get("x") {
                Some(Value::Array(x)) => Value::Array(x.clone() * 2.0),
                _ => Value::None,
            },
            _ => Value::None,
        },
        _ => Value::None,
    }
}

#[test]
fn seed2_aux_is_part_of_the_key_by_equality() {
    register_tagged("seed2.Tagged", |tag| StaticValue::new(tag.to_string()));
    let f = compile(double_x);
    let x = arr(&[1.0, 2.0]);
    f.call(&tagged("seed2.Tagged", x.clone(), "a")).unwrap();
    f.call(&tagged("seed2.Tagged", x.clone(), "a")).unwrap();
    f.call(&tagged("seed2.Tagged", x.clone(), "b")).unwrap();
    let cache = f.cache();
    assert_eq!((cache.entries, cache.hits, cache.misses), (2, 1, 2));
    let reason = &cache.miss_log[1].reasons[0];
    assert!(
        matches!(reason, MissReason::Static { before, now, .. } if before.contains('a') && now.contains('b')),
        "{reason}"
    );
}

/// A tag whose hash ignores its value: every two tags collide.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CollidingTag(String);

impl Hash for CollidingTag {
    fn hash<H: Hasher>(&self, state: &mut H) {
        0u8.hash(state);
    }
}

#[test]
fn seed2_equal_hashes_with_different_aux_still_make_two_entries() {
    register_tagged("seed2.Colliding", |tag| {
        StaticValue::new(CollidingTag(tag.to_string()))
    });
    let f = compile(double_x);
    let x = arr(&[1.0]);
    f.call(&tagged("seed2.Colliding", x.clone(), "first"))
        .unwrap();
    f.call(&tagged("seed2.Colliding", x.clone(), "second"))
        .unwrap();
    f.call(&tagged("seed2.Colliding", x, "first")).unwrap();
    let cache = f.cache();
    assert_eq!((cache.entries, cache.hits), (2, 1));
}

#[test]
fn seed3_registered_type_wrapping_a_list_is_flattened_by_its_registration() {
    // The registration keeps only the first element as a child; the list
    // length goes to aux. Flattened as a plain list it would have 3 leaves.
    Registry::global()
        .register(NodeType::new(
            "seed3.Stack",
            |v: &Value| match v {
                Value::Object { inner, .. } => match inner.as_ref() {
                    Value::List(items) => Ok((
                        items.iter().take(1).cloned().collect(),
                        StaticValue::new(items.len()),
                    )),
                    _ => Err(kiln::Error::Tree {
                        path: String::new(),
                        detail: "payload is not a list".into(),
                    }),
                },
                _ => Err(kiln::Error::Tree {
                    path: String::new(),
                    detail: "not an object".into(),
                }),
            },
            |_aux: &StaticValue, children: Vec<Value>| {
                Ok(Value::Object {
                    class: Arc::from("seed3.Stack"),
                    inner: Box::new(Value::List(children)),
                })
            },
        ))
        .unwrap();
    let stack = Value::Object {
        class: Arc::from("seed3.Stack"),
        inner: Box::new(Value::List(vec![
            Value::Array(arr(&[1.0])),
            Value::Array(arr(&[2.0])),
            Value::Array(arr(&[3.0])),
        ])),
    };
    let (leaves, def) = kiln::tree_flatten(&stack).unwrap();
    assert_eq!(leaves.len(), 1);
    assert_eq!(leaves[0].to_vec::<f32>().unwrap(), vec![1.0]);
    assert!(def.to_string().contains("seed3.Stack"), "{def}");
    let f = compile(|v: Value| v);
    match &f.call(&stack).unwrap() {
        Value::Object { class, inner } => {
            assert_eq!(&**class, "seed3.Stack");
            assert!(matches!(inner.as_ref(), Value::List(items) if items.len() == 1));
        }
        other => panic!("expected the registered object back, got {other:?}"),
    }
}

#[test]
fn seed4_returning_an_input_shaped_node_builds_a_fresh_value() {
    register_tagged("seed4.Tagged", |tag| StaticValue::new(tag.to_string()));
    // `Value` drops iteratively (it implements `Drop`), so a payload is
    // changed in place rather than moved out of the value.
    let f = compile(|mut v: Value| {
        if let Value::Object { inner, .. } = &mut v {
            if let Value::Map(m) = inner.as_mut() {
                if let Some(Value::Array(x)) = m.get_mut("x") {
                    *x = x.clone() + 100.0;
                }
            }
        }
        v
    });
    let input = tagged("seed4.Tagged", arr(&[1.0, 2.0]), "keep");
    let out = f.call(&input).unwrap();
    let x_of = |v: &Value| match v {
        Value::Object { inner, .. } => match inner.as_ref() {
            Value::Map(m) => match m.get("x") {
                Some(Value::Array(x)) => x.to_vec::<f32>().unwrap(),
                _ => vec![],
            },
            _ => vec![],
        },
        _ => vec![],
    };
    assert_eq!(x_of(&out), vec![101.0, 102.0]);
    assert_eq!(x_of(&input), vec![1.0, 2.0]);
}

#[test]
fn seed6_every_miss_explanation_kind() {
    let f = compile(|(p, scale): (Vec<Array>, String)| {
        p.iter().fold(Array::scalar(0.0, DType::F32), |acc, x| {
            acc + x.sum_all() * if scale == "double" { 2.0 } else { 1.0 }
        })
    });
    let two = vec![
        Array::zeros(&[4, 4], DType::F32),
        Array::zeros(&[2], DType::F32),
    ];
    f.call(&(two.clone(), "double".to_string())).unwrap();
    let three = vec![
        Array::zeros(&[4, 4], DType::F32),
        Array::zeros(&[2], DType::F32),
        Array::zeros(&[2], DType::F32),
    ];
    f.call(&(three, "double".to_string())).unwrap();
    let wider = vec![
        Array::zeros(&[8, 4], DType::F32),
        Array::zeros(&[2], DType::F32),
    ];
    f.call(&(wider, "double".to_string())).unwrap();
    f.call(&(two, "single".to_string())).unwrap();
    let log = f.cache().miss_log;
    let texts: Vec<String> = log.iter().map(|m| m.reasons[0].to_string()).collect();
    assert_eq!(texts[0], "never seen");
    assert!(
        matches!(&log[1].reasons[0], MissReason::TreeStructure { path, .. } if path == "args[0]"),
        "{}",
        texts[1]
    );
    assert!(
        texts[1].starts_with("tree structure differs at path args[0] (before "),
        "{}",
        texts[1]
    );
    assert_eq!(
        texts[2],
        "aval differs at leaf args[0][0]: f32[4,4] → f32[8,4]"
    );
    assert_eq!(
        texts[3],
        "static/aux differs at node args[1]: before \"double\", now \"single\""
    );
}

#[test]
fn function_returning_a_non_tree_is_an_error() {
    let f = compile(|_: Value| Value::Opaque {
        type_name: "closure".into(),
    });
    let err = f.call(&Value::Array(arr(&[1.0]))).unwrap_err();
    assert!(err.to_string().contains("closure"), "{err}");
    assert_eq!(f.cache().entries, 0);
}

#[test]
fn registry_flatten_returning_inconsistent_children_is_an_error() {
    Registry::global()
        .register(NodeType::new(
            "seed.Inconsistent",
            |_: &Value| {
                Ok((
                    vec![Value::Opaque {
                        type_name: "socket".into(),
                    }],
                    StaticValue::new(()),
                ))
            },
            |_: &StaticValue, children: Vec<Value>| Ok(Value::List(children)),
        ))
        .unwrap();
    let f = compile(|v: Value| v);
    let bad = Value::Object {
        class: Arc::from("seed.Inconsistent"),
        inner: Box::new(Value::None),
    };
    let err = f.call(&bad).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("socket") || text.contains("seed.Inconsistent"),
        "{text}"
    );
    assert_eq!(f.cache().entries, 0);
    let recovered = f.call(&Value::Array(arr(&[3.0]))).unwrap();
    assert!(matches!(recovered, Value::Array(_)), "{recovered:?}");
}
