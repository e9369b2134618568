//! Trees: derive, paths, differences, the dynamic registry and round trips.

use kiln::{
    tree_flatten, tree_flatten_with_path, tree_leaves, tree_map, tree_unflatten, Array,
    DifferenceKind, Error, NodeDef, NodeType, Registry, StaticValue, Tree, TreeDef, Value,
};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

fn arr(values: &[f32]) -> Array {
    Array::from_vec(values.to_vec(), &[values.len()]).unwrap()
}

fn data(a: &Array) -> Vec<f32> {
    a.to_vec::<f32>().unwrap()
}

fn tree_error(err: Error) -> (String, String) {
    match err {
        Error::Tree { path, detail } => (path, detail),
        other => panic!("expected a tree error, got {other:?}"),
    }
}

#[derive(Tree, Debug)]
struct Pair {
    a: Array,
    b: Array,
}

#[derive(Tree, Debug)]
struct Layer {
    w: Array,
    bias: Option<Array>,
    #[tree(static)]
    activation: String,
}

#[derive(Tree, Debug)]
struct Model {
    layers: Vec<Layer>,
    #[tree(static)]
    depth: usize,
}

#[derive(Tree, Debug)]
struct Params {
    p: Model,
    scale: f32,
}

#[derive(Tree, Debug)]
struct Scaled(Array, #[tree(static)] u32);

#[derive(Tree, Debug)]
struct Marker;

#[derive(Tree, Debug)]
struct Wrap<T> {
    inner: T,
    #[tree(static)]
    tag: (i64, bool),
}

mod other {
    use kiln::{Array, Tree};

    #[derive(Tree, Debug)]
    pub struct Pair {
        pub a: Array,
        pub b: Array,
    }
}

fn model(act: &str) -> Model {
    Model {
        layers: (0..3)
            .map(|i| Layer {
                w: arr(&[i as f32]),
                bias: (i == 1).then(|| arr(&[10.0])),
                activation: act.to_string(),
            })
            .collect(),
        depth: 3,
    }
}

#[test]
fn derived_named_struct_round_trips_with_field_paths() {
    let pair = Pair {
        a: arr(&[1.0]),
        b: arr(&[2.0, 3.0]),
    };
    let (leaves, def) = tree_flatten(&pair).unwrap();
    assert_eq!(def.to_string(), "Pair { a: *, b: * }");
    let paths: Vec<String> = def.leaf_paths().iter().map(|p| p.to_string()).collect();
    assert_eq!(paths, ["a", "b"]);
    let back: Pair = tree_unflatten(&def, leaves).unwrap();
    assert_eq!(data(&back.a), [1.0]);
    assert_eq!(data(&back.b), [2.0, 3.0]);
}

#[test]
fn derived_def_records_the_full_type_path() {
    let (_, def) = tree_flatten(&Pair {
        a: arr(&[1.0]),
        b: arr(&[2.0]),
    })
    .unwrap();
    let TreeDef::Node(node) = &def else {
        panic!("expected a node, got {def:?}")
    };
    assert_eq!(node.type_name, std::any::type_name::<Pair>());
    assert!(node.aux.is_unit());
}

#[test]
fn same_short_name_in_another_module_is_a_different_structure() {
    let ours = tree_flatten(&Pair {
        a: arr(&[1.0]),
        b: arr(&[2.0]),
    })
    .unwrap();
    let theirs = tree_flatten(&other::Pair {
        a: arr(&[1.0]),
        b: arr(&[2.0]),
    })
    .unwrap();
    assert_ne!(ours.1, theirs.1);
    let err = tree_unflatten::<Pair>(&theirs.1, theirs.0).unwrap_err();
    let (path, detail) = tree_error(err);
    assert_eq!(path, "<root>");
    assert!(detail.contains("other::Pair"), "{detail}");
    let diff = ours.1.first_difference(&theirs.1).unwrap();
    assert!(
        matches!(&diff.kind, DifferenceKind::Structure { before, now } if before != now),
        "{diff:?}"
    );
}

#[test]
fn derived_tuple_unit_and_generic_structs_round_trip_with_statics() {
    let value = (
        Scaled(arr(&[4.0]), 7),
        Marker,
        Wrap {
            inner: vec![arr(&[5.0])],
            tag: (-2, true),
        },
    );
    let (leaves, def) = tree_flatten(&value).unwrap();
    assert_eq!(leaves.len(), 2);
    assert_eq!(
        def.to_string(),
        "(Scaled(*, 7), Marker, Wrap<Vec<Array>> { inner: [*], tag: (-2, true) })"
    );
    let back: (Scaled, Marker, Wrap<Vec<Array>>) = tree_unflatten(&def, leaves).unwrap();
    assert_eq!(data(&back.0 .0), [4.0]);
    assert_eq!(back.0 .1, 7);
    assert_eq!(data(&back.2.inner[0]), [5.0]);
    assert_eq!(back.2.tag, (-2, true));
}

#[test]
fn static_fields_are_part_of_the_def_by_equality() {
    let relu = tree_flatten(&model("relu")).unwrap().1;
    assert_eq!(relu, tree_flatten(&model("relu")).unwrap().1);
    assert_ne!(relu, tree_flatten(&model("gelu")).unwrap().1);
}

#[test]
fn flatten_with_path_renders_nested_paths() {
    let params = Params {
        p: model("relu"),
        scale: 0.5,
    };
    let with_paths = tree_flatten_with_path(&params).unwrap();
    let rendered: Vec<(String, Vec<f32>)> = with_paths
        .iter()
        .map(|(p, a)| (p.to_string(), data(a)))
        .collect();
    assert_eq!(
        rendered,
        [
            ("p.layers[0].w".to_string(), vec![0.0]),
            ("p.layers[1].w".to_string(), vec![1.0]),
            ("p.layers[1].bias".to_string(), vec![10.0]),
            ("p.layers[2].w".to_string(), vec![2.0]),
        ]
    );
}

#[test]
fn first_difference_names_the_nested_static_that_changed() {
    let before = tree_flatten(&Params {
        p: model("relu"),
        scale: 0.5,
    })
    .unwrap()
    .1;
    let mut changed = model("relu");
    changed.layers[2].activation = "gelu".into();
    let now = tree_flatten(&Params {
        p: changed,
        scale: 0.5,
    })
    .unwrap()
    .1;
    let diff = before.first_difference(&now).unwrap();
    assert_eq!(diff.path.to_string(), "p.layers[2].activation");
    assert_eq!(
        diff.kind,
        DifferenceKind::Static {
            before: "\"relu\"".into(),
            now: "\"gelu\"".into()
        }
    );
}

#[test]
fn first_difference_names_a_structure_change() {
    let before = tree_flatten(&model("relu")).unwrap().1;
    let mut fewer = model("relu");
    fewer.layers.pop();
    let now = tree_flatten(&fewer).unwrap().1;
    let diff = before.first_difference(&now).unwrap();
    assert_eq!(diff.path.to_string(), "layers");
    assert_eq!(
        diff.kind,
        DifferenceKind::Structure {
            before: "list[3]".into(),
            now: "list[2]".into()
        }
    );
    let pair = tree_flatten(&Pair {
        a: arr(&[1.0]),
        b: arr(&[1.0]),
    })
    .unwrap()
    .1;
    let list = tree_flatten(&vec![arr(&[1.0]); 3]).unwrap().1;
    assert_eq!(
        pair.first_difference(&list).unwrap().kind,
        DifferenceKind::Structure {
            before: "Pair{a,b}".into(),
            now: "list[3]".into()
        }
    );
}

#[test]
fn derived_unflatten_errors_carry_the_field_path() {
    let pair = Pair {
        a: arr(&[1.0]),
        b: arr(&[2.0]),
    };
    let (_, def) = tree_flatten(&pair).unwrap();
    let TreeDef::Node(node) = &def else {
        panic!("expected a node")
    };
    let mut tampered = (**node).clone();
    tampered.fields[1].1 = TreeDef::Static(StaticValue::new(1_i64));
    let err =
        tree_unflatten::<Pair>(&TreeDef::Node(Arc::new(tampered)), vec![arr(&[1.0])]).unwrap_err();
    assert_eq!(
        tree_error(err),
        (
            "b".to_string(),
            "expected an array leaf, found Static(1)".to_string()
        )
    );
}

#[test]
fn derived_unflatten_rejects_renamed_fields() {
    let def = TreeDef::Node(Arc::new(NodeDef {
        type_name: std::any::type_name::<Pair>().into(),
        aux: StaticValue::unit(),
        fields: vec![("a".into(), TreeDef::Leaf), ("c".into(), TreeDef::Leaf)],
    }));
    let (path, detail) =
        tree_error(tree_unflatten::<Pair>(&def, vec![arr(&[1.0]), arr(&[2.0])]).unwrap_err());
    assert_eq!(path, "<root>");
    assert!(
        detail.contains("has fields [a, b], the structure has [a, c]"),
        "{detail}"
    );
}

#[test]
fn derived_static_field_of_the_wrong_type_is_an_error_at_its_path() {
    let (leaves, def) = tree_flatten(&Scaled(arr(&[1.0]), 3)).unwrap();
    let TreeDef::Node(node) = &def else {
        panic!("expected a node")
    };
    let mut tampered = (**node).clone();
    tampered.fields[1].1 = TreeDef::Static(StaticValue::new(3_u64));
    let (path, detail) = tree_error(
        tree_unflatten::<Scaled>(&TreeDef::Node(Arc::new(tampered)), leaves).unwrap_err(),
    );
    assert_eq!(path, "1");
    assert_eq!(detail, "expected a static u32, found Static(3)");
}

#[test]
fn tree_map_builds_a_new_value_and_leaves_the_input_unchanged() {
    let input = model("relu");
    let doubled = tree_map(&input, |a| {
        let v: Vec<f32> = data(a).iter().map(|x| x * 2.0 + 1.0).collect();
        Array::from_vec(v, &[1])
    })
    .unwrap();
    let before: Vec<Vec<f32>> = tree_leaves(&input).unwrap().iter().map(data).collect();
    let after: Vec<Vec<f32>> = tree_leaves(&doubled).unwrap().iter().map(data).collect();
    assert_eq!(before, [vec![0.0], vec![1.0], vec![10.0], vec![2.0]]);
    assert_eq!(after, [vec![1.0], vec![3.0], vec![21.0], vec![5.0]]);
    assert_eq!(doubled.layers[1].activation, "relu");
    assert_eq!(doubled.depth, 3);
}

#[test]
fn tree_map_errors_propagate() {
    let err = tree_map(&vec![arr(&[1.0])], |_| {
        Err(Error::Runtime {
            op: "f".into(),
            detail: "boom".into(),
        })
    })
    .unwrap_err();
    assert_eq!(
        err,
        Error::Runtime {
            op: "f".into(),
            detail: "boom".into()
        }
    );
}

#[test]
fn unflatten_rejects_too_few_and_too_many_leaves_for_derived_structs() {
    let (leaves, def) = tree_flatten(&model("relu")).unwrap();
    assert_eq!(leaves.len(), 4);
    let (_, detail) = tree_error(tree_unflatten::<Model>(&def, leaves[..3].to_vec()).unwrap_err());
    assert_eq!(
        detail,
        "ran out of leaves: the structure needs 4 leaves, 3 were given"
    );
    let mut more = leaves.clone();
    more.push(arr(&[0.0]));
    let (_, detail) = tree_error(tree_unflatten::<Model>(&def, more).unwrap_err());
    assert_eq!(detail, "5 leaves given, the structure takes 4");
}

// ---- dynamic values and the registry ----

/// A class whose payload is a list: only its arrays are children; the other
/// elements (with their positions) go into aux data.
fn cache_type() -> NodeType {
    NodeType {
        name: "Cache".into(),
        flatten: Arc::new(|v: &Value| {
            let Value::Object { inner, .. } = v else {
                return Err(Error::InvalidArgument {
                    op: "Cache.flatten".into(),
                    detail: format!("not a Cache: {}", v.type_name()),
                    at: None,
                });
            };
            let Value::List(items) = &**inner else {
                return Err(Error::InvalidArgument {
                    op: "Cache.flatten".into(),
                    detail: "payload is not a list".into(),
                    at: None,
                });
            };
            let mut children = Vec::new();
            let mut kept = Vec::new();
            for (i, item) in items.iter().enumerate() {
                match item {
                    Value::Array(_) => children.push(item.clone()),
                    Value::Int(n) => kept.push((i, *n)),
                    other => {
                        return Err(Error::InvalidArgument {
                            op: "Cache.flatten".into(),
                            detail: format!("unexpected {}", other.type_name()),
                            at: None,
                        })
                    }
                }
            }
            Ok((children, StaticValue::new(kept)))
        }),
        unflatten: Arc::new(|aux: &StaticValue, children: Vec<Value>| {
            let kept =
                aux.downcast_ref::<Vec<(usize, i64)>>()
                    .ok_or_else(|| Error::InvalidArgument {
                        op: "Cache.unflatten".into(),
                        detail: "bad aux".into(),
                        at: None,
                    })?;
            let mut children = children.into_iter();
            let total = kept.len() + children.len();
            let mut items = Vec::with_capacity(total);
            for i in 0..total {
                match kept.iter().find(|(at, _)| *at == i) {
                    Some((_, n)) => items.push(Value::Int(*n)),
                    None => items.push(children.next().ok_or_else(|| Error::InvalidArgument {
                        op: "Cache.unflatten".into(),
                        detail: "too few children".into(),
                        at: None,
                    })?),
                }
            }
            Ok(Value::Object {
                class: "Cache".into(),
                inner: Box::new(Value::List(items)),
            })
        }),
    }
}

fn cache(items: Vec<Value>) -> Value {
    Value::Object {
        class: "Cache".into(),
        inner: Box::new(Value::List(items)),
    }
}

fn registry_with_cache() -> Registry {
    let registry = Registry::new();
    registry.register(cache_type()).unwrap();
    registry
}

fn flatten_with(registry: &Registry, v: &Value) -> kiln::Result<(Vec<Array>, TreeDef)> {
    let mut leaves = Vec::new();
    let def = v.flatten_with(registry, &mut leaves)?;
    Ok((leaves, def))
}

fn unflatten_with(registry: &Registry, def: &TreeDef, leaves: Vec<Array>) -> kiln::Result<Value> {
    Value::unflatten_with(registry, def, &mut leaves.into_iter())
}

/// Structural equality of values, arrays by aval and data, floats by bits.
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::None, Value::None) => true,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::Int(x), Value::Int(y)) => x == y,
        (Value::Float(x), Value::Float(y)) => x.to_bits() == y.to_bits(),
        (Value::Str(x), Value::Str(y)) => x == y,
        (Value::Array(x), Value::Array(y)) => x.aval() == y.aval() && data(x) == data(y),
        (Value::List(x), Value::List(y)) | (Value::Tuple(x), Value::Tuple(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_value(p, q))
        }
        (Value::Map(x), Value::Map(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((k, p), (l, q))| k == l && same_value(p, q))
        }
        (Value::Object { class: c, inner: i }, Value::Object { class: d, inner: j }) => {
            c == d && same_value(i, j)
        }
        _ => false,
    }
}

#[test]
fn registered_class_wrapping_a_list_is_flattened_by_its_registration() {
    let registry = registry_with_cache();
    let value = cache(vec![
        Value::Array(arr(&[1.0])),
        Value::Int(7),
        Value::Array(arr(&[2.0])),
    ]);
    let (leaves, def) = flatten_with(&registry, &value).unwrap();
    assert_eq!(
        def,
        TreeDef::Node(Arc::new(NodeDef {
            type_name: "Cache".into(),
            aux: StaticValue::new(vec![(1_usize, 7_i64)]),
            fields: vec![("0".into(), TreeDef::Leaf), ("1".into(), TreeDef::Leaf)],
        }))
    );
    assert_eq!(leaves.iter().map(data).collect::<Vec<_>>(), [[1.0], [2.0]]);
    let back = unflatten_with(&registry, &def, leaves).unwrap();
    assert!(same_value(&back, &value), "{back:?}");
}

#[test]
fn registered_aux_changes_the_def_and_is_reported_as_static() {
    let registry = registry_with_cache();
    let a = flatten_with(
        &registry,
        &cache(vec![Value::Int(1), Value::Array(arr(&[1.0]))]),
    )
    .unwrap()
    .1;
    let b = flatten_with(
        &registry,
        &cache(vec![Value::Int(2), Value::Array(arr(&[1.0]))]),
    )
    .unwrap()
    .1;
    assert_ne!(a, b);
    let diff = a.first_difference(&b).unwrap();
    assert_eq!(diff.path.to_string(), "<root>");
    assert_eq!(
        diff.kind,
        DifferenceKind::Static {
            before: "[(0, 1)]".into(),
            now: "[(0, 2)]".into()
        }
    );
}

#[test]
fn unregistered_class_falls_back_to_its_inner_container_and_survives_a_round_trip() {
    let registry = Registry::new();
    let value = Value::Object {
        class: "Cache".into(),
        inner: Box::new(Value::List(vec![Value::Array(arr(&[1.0])), Value::Int(7)])),
    };
    let (leaves, def) = flatten_with(&registry, &value).unwrap();
    assert_eq!(def.to_string(), "Cache([*, 7])");
    let paths: Vec<String> = def.leaf_paths().iter().map(|p| p.to_string()).collect();
    assert_eq!(paths, ["[0]"]);
    let back = unflatten_with(&registry, &def, leaves).unwrap();
    assert!(same_value(&back, &value), "{back:?}");
}

#[test]
fn registering_a_name_twice_is_an_error() {
    let registry = registry_with_cache();
    let (path, detail) = tree_error(registry.register(cache_type()).unwrap_err());
    assert_eq!(path, "<root>");
    assert_eq!(detail, "node type `Cache` is already registered");
    assert_eq!(registry.get("Cache").unwrap().name, "Cache");
    assert!(registry.get("Other").is_none());
}

#[test]
fn failing_registered_flatten_names_the_type_and_path() {
    let registry = registry_with_cache();
    let bad = cache(vec![Value::Str("x".into())]);
    let value = Value::Map(BTreeMap::from([(
        "state".to_string(),
        Value::List(vec![Value::None, bad]),
    )]));
    let (path, detail) = tree_error(flatten_with(&registry, &value).unwrap_err());
    assert_eq!(path, r#"["state"][1]"#);
    assert!(detail.contains("node type `Cache`"), "{detail}");
    assert!(detail.contains("unexpected str"), "{detail}");
}

#[test]
fn failing_registered_unflatten_names_the_type_and_path() {
    let registry = registry_with_cache();
    let value = Value::Tuple(vec![cache(vec![Value::Array(arr(&[1.0]))])]);
    let (leaves, def) = flatten_with(&registry, &value).unwrap();
    // Swap the aux for one the registered unflatten cannot read.
    let TreeDef::Tuple(items) = &def else {
        panic!("expected a tuple")
    };
    let TreeDef::Node(node) = &items[0] else {
        panic!("expected a node")
    };
    let mut tampered = (**node).clone();
    tampered.aux = StaticValue::new("oops".to_string());
    let def = TreeDef::Tuple(vec![TreeDef::Node(Arc::new(tampered))]);
    let (path, detail) = tree_error(unflatten_with(&registry, &def, leaves).unwrap_err());
    assert_eq!(path, "[0]");
    assert!(detail.contains("node type `Cache`"), "{detail}");
    assert!(detail.contains("bad aux"), "{detail}");
}

#[test]
fn registered_unflatten_given_the_wrong_child_count_is_an_error() {
    let registry = registry_with_cache();
    // Flatten made one child for this aux; a structure claiming none leaves
    // the registered unflatten short of children.
    let def = TreeDef::Map(vec![(
        "c".into(),
        TreeDef::Node(Arc::new(NodeDef {
            type_name: "Cache".into(),
            aux: StaticValue::new(Vec::<(usize, i64)>::new()),
            fields: vec![],
        })),
    )]);
    let value = unflatten_with(&registry, &def, vec![]).unwrap();
    assert!(same_value(
        &value,
        &Value::Map(BTreeMap::from([("c".into(), cache(vec![]))]))
    ));
    let def = TreeDef::Node(Arc::new(NodeDef {
        type_name: "Cache".into(),
        aux: StaticValue::new(vec![(1_usize, 3_i64)]),
        fields: vec![],
    }));
    let (path, detail) = tree_error(unflatten_with(&registry, &def, vec![]).unwrap_err());
    assert_eq!(path, "<root>");
    assert!(detail.contains("node type `Cache`"), "{detail}");
    assert!(detail.contains("0 children"), "{detail}");
    // Children that are not the `0`, `1`, ... flatten produced are refused
    // before the registered unflatten runs.
    let def = TreeDef::Node(Arc::new(NodeDef {
        type_name: "Cache".into(),
        aux: StaticValue::new(Vec::<(usize, i64)>::new()),
        fields: vec![("1".into(), TreeDef::Leaf)],
    }));
    let (_, detail) = tree_error(unflatten_with(&registry, &def, vec![arr(&[1.0])]).unwrap_err());
    assert!(
        detail.contains("node type `Cache` expects children named"),
        "{detail}"
    );
}

#[test]
fn unflatten_of_an_unregistered_node_type_is_an_error() {
    let def = TreeDef::Node(Arc::new(NodeDef {
        type_name: "Nope".into(),
        aux: StaticValue::new(1_u8),
        fields: vec![],
    }));
    let (path, detail) = tree_error(unflatten_with(&Registry::new(), &def, vec![]).unwrap_err());
    assert_eq!(path, "<root>");
    assert_eq!(detail, "node type `Nope` is not registered");
}

#[derive(Tree, Debug)]
struct Outputs {
    out: Value,
}

#[test]
fn opaque_value_is_an_error_naming_its_type_and_path() {
    let value = Outputs {
        out: Value::List(vec![
            Value::Array(arr(&[1.0])),
            Value::Opaque {
                type_name: "closure".into(),
            },
        ]),
    };
    let err = tree_flatten(&value).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tree error at `out[1]`: `closure` is not a tree: register it as a node type or \
         return arrays, containers and scalars"
    );
}

#[test]
fn value_type_names() {
    let names: Vec<String> = [
        Value::None,
        Value::Bool(true),
        Value::Int(1),
        Value::Float(1.0),
        Value::Str("s".into()),
        Value::Array(arr(&[1.0])),
        Value::List(vec![]),
        Value::Tuple(vec![]),
        Value::Map(BTreeMap::new()),
        cache(vec![]),
        Value::Opaque {
            type_name: "handle".into(),
        },
    ]
    .iter()
    .map(|v| v.type_name().to_string())
    .collect();
    assert_eq!(
        names,
        [
            "none", "bool", "int", "float", "str", "array", "list", "tuple", "map", "Cache",
            "handle"
        ]
    );
}

#[test]
fn value_scalars_are_statics_and_values_use_the_global_registry() {
    let value = Value::Tuple(vec![
        Value::None,
        Value::Bool(false),
        Value::Int(-3),
        Value::Float(0.25),
        Value::Str("s".into()),
        Value::Array(arr(&[9.0])),
    ]);
    let (leaves, def) = tree_flatten(&value).unwrap();
    assert_eq!(def.to_string(), r#"(None, false, -3, 0.25, "s", *)"#);
    let back: Value = tree_unflatten(&def, leaves).unwrap();
    assert!(same_value(&back, &value), "{back:?}");
}

#[test]
fn global_registry_is_consulted_by_the_tree_impl() {
    let registered = NodeType {
        name: "GlobalTestBox".into(),
        flatten: Arc::new(|v: &Value| match v {
            Value::Object { inner, .. } => Ok((vec![(**inner).clone()], StaticValue::new("box"))),
            other => Ok((vec![other.clone()], StaticValue::new("box"))),
        }),
        unflatten: Arc::new(|_: &StaticValue, mut children: Vec<Value>| {
            Ok(Value::Object {
                class: "GlobalTestBox".into(),
                inner: Box::new(children.pop().unwrap_or(Value::None)),
            })
        }),
    };
    Registry::global().register(registered).unwrap();
    let value = Value::Object {
        class: "GlobalTestBox".into(),
        inner: Box::new(Value::Array(arr(&[1.0]))),
    };
    let (leaves, def) = tree_flatten(&value).unwrap();
    assert_eq!(def.to_string(), "GlobalTestBox[\"box\"](*)");
    let back: Value = tree_unflatten(&def, leaves).unwrap();
    assert!(same_value(&back, &value));
}

fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::None),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::Int),
        any::<f64>().prop_map(Value::Float),
        "[a-z]{0,4}".prop_map(Value::Str),
        prop::collection::vec(-10.0_f32..10.0, 0..4)
            .prop_map(|v| Value::Array(Array::from_vec(v.clone(), &[v.len()]).unwrap())),
    ];
    leaf.prop_recursive(4, 48, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::List),
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Tuple),
            prop::collection::btree_map("[a-z]{1,3}", inner.clone(), 0..4).prop_map(Value::Map),
            (prop_oneof![Just("Point"), Just("Cache")], inner.clone()).prop_map(
                |(class, inner)| Value::Object {
                    class: class.into(),
                    inner: Box::new(inner),
                }
            ),
            prop::collection::vec(
                prop_oneof![
                    any::<i64>().prop_map(Value::Int),
                    Just(Value::Array(arr(&[1.0, 2.0]))),
                ],
                0..5
            )
            .prop_map(cache),
        ]
    })
}

fn cases() -> u32 {
    std::env::var("KILN_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn random_values_round_trip_through_flatten_and_unflatten(value in arb_value()) {
        // `Cache` objects go through the registration; `Point` objects
        // (unregistered) through the fallback.
        let registry = registry_with_cache();
        // A Cache whose payload is not a list of arrays and ints is refused
        // by its registration; those cases must fail cleanly.
        let (leaves, def) = match flatten_with(&registry, &value) {
            Ok(x) => x,
            Err(Error::Tree { detail, .. }) => {
                prop_assert!(detail.contains("node type `Cache`"), "{}", detail);
                return Ok(());
            }
            Err(other) => return Err(TestCaseError::fail(format!("{other:?}"))),
        };
        prop_assert_eq!(leaves.len(), def.num_leaves());
        let back = unflatten_with(&registry, &def, leaves.clone()).unwrap();
        prop_assert!(same_value(&back, &value), "{:?} != {:?}", back, value);
        let (again_leaves, again_def) = flatten_with(&registry, &back).unwrap();
        prop_assert_eq!(&again_def, &def);
        prop_assert_eq!(again_def.first_difference(&def), None);
        prop_assert_eq!(
            again_leaves.iter().map(data).collect::<Vec<_>>(),
            leaves.iter().map(data).collect::<Vec<_>>()
        );
    }
}

#[test]
fn map_keys_are_shared_between_flattens() {
    let mut map = BTreeMap::new();
    map.insert(
        "weight".to_string(),
        Array::from_vec(vec![1.0f32], &[1]).unwrap(),
    );
    let (_, first) = tree_flatten(&map).unwrap();
    let (_, second) = tree_flatten(&map.clone()).unwrap();
    match (&first, &second) {
        (TreeDef::Map(a), TreeDef::Map(b)) => {
            assert_eq!(&*a[0].0, "weight");
            assert!(
                std::ptr::eq(a[0].0.as_str(), b[0].0.as_str()),
                "keys were copied, not shared"
            );
        }
        other => panic!("expected two maps, got {other:?}"),
    }
    let back: BTreeMap<String, Array> =
        tree_unflatten(&first, vec![Array::from_vec(vec![2.0f32], &[1]).unwrap()]).unwrap();
    assert_eq!(back["weight"].to_vec::<f32>().unwrap(), vec![2.0]);
}

#[test]
fn map_keys_are_shared_across_threads() {
    let map = BTreeMap::from([("bias".to_string(), arr(&[1.0]))]);
    let key_of = |def: &TreeDef| match def {
        TreeDef::Map(entries) => entries[0].0.as_str().as_ptr() as usize,
        other => panic!("expected a map, got {other:?}"),
    };
    let here = key_of(&tree_flatten(&map).unwrap().1);
    let there = std::thread::scope(|s| {
        s.spawn(|| key_of(&tree_flatten(&map).unwrap().1))
            .join()
            .unwrap()
    });
    assert_eq!(here, there, "each thread interned its own copy of the key");
}

#[test]
fn value_debug_reads_like_a_derived_debug() {
    let value = Value::Object {
        class: "Point".into(),
        inner: Box::new(Value::List(vec![
            Value::Int(1),
            Value::Map(BTreeMap::from([("k".to_string(), Value::None)])),
            Value::Tuple(vec![Value::Float(0.5), Value::Str("s".into())]),
            Value::Opaque {
                type_name: "Fn".into(),
            },
        ])),
    };
    assert_eq!(
        format!("{value:?}"),
        r#"Object { class: "Point", inner: List([Int(1), Map({"k": None}), Tuple([Float(0.5), Str("s")]), Opaque { type_name: "Fn" }]) }"#
    );
}

#[test]
fn value_clone_is_a_deep_copy() {
    let original = Value::Map(BTreeMap::from([(
        "layers".to_string(),
        Value::List(vec![
            Value::Tuple(vec![Value::Array(arr(&[1.0])), Value::Bool(true)]),
            Value::Object {
                class: "Cache".into(),
                inner: Box::new(Value::List(vec![Value::Int(3)])),
            },
        ]),
    )]));
    let mut copy = original.clone();
    assert!(same_value(&copy, &original));
    if let Value::Map(map) = &mut copy {
        map.insert("extra".into(), Value::None);
    }
    assert!(!same_value(&copy, &original));
    assert_eq!(format!("{original:?}").matches("Cache").count(), 1);
}
