//! Deep and cyclic trees: nesting beyond `MAX_TREE_DEPTH` and registered
//! flattens that return their own node are `Err`s naming the path, and every
//! walk of a tree at the limit fits in the 1 MiB stack of wasm32.
//!
//! A stack overflow aborts the whole process, so each case that overflowed
//! before runs in a child process (this test binary, re-run on that one
//! test) on a thread with a 1 MiB stack: a regression fails the test that
//! covers it instead of killing the test binary.

use kiln::{
    compile, tree_flatten, tree_map, tree_unflatten, Array, Error, KeyPath, MissReason, NodeType,
    PathEntry, Registry, StaticValue, Tree, TreeDef, Value, MAX_TREE_DEPTH,
};
use proptest::prelude::*;
use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::process::Command;

/// Names the case a child process runs.
const CHILD_CASE: &str = "KILN_TREE_DEPTH_CASE";

/// The smallest stack Kiln runs on (wasm32's default).
const SMALL_STACK: usize = 1 << 20;

/// Far deeper than any limit: what a script loop can build in a moment.
const SCRIPT_DEPTH: usize = 10_000;

/// Runs `case` on a thread with a 1 MiB stack, in a child process running
/// only the test `name`; the test passes when the child exits successfully.
fn in_child_process(name: &str, case: fn()) {
    if std::env::var(CHILD_CASE).as_deref() == Ok(name) {
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .stack_size(SMALL_STACK)
            .spawn(case)
            .expect("a thread can be started");
        if thread.join().is_err() {
            panic!("the case `{name}` failed");
        }
        return;
    }
    let exe = std::env::current_exe().expect("the test binary knows its path");
    let output = Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads", "1"])
        .env(CHILD_CASE, name)
        .output()
        .expect("the test binary can be re-run");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "`{name}` failed in its child process ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(
        stdout.contains("1 passed"),
        "the child process did not run `{name}`:\n{stdout}"
    );
}

/// A test whose body runs in a child process with a 1 MiB stack.
macro_rules! child_process_test {
    ($(#[doc = $doc:literal])* fn $name:ident() $body:block) => {
        $(#[doc = $doc])*
        #[test]
        fn $name() {
            in_child_process(stringify!($name), || $body);
        }
    };
}

fn arr(values: &[f32]) -> Array {
    Array::from_vec(values.to_vec(), &[values.len()]).expect("values match the shape")
}

fn tree_error(err: Error) -> (String, String) {
    match err {
        Error::Tree { path, detail } => (path, detail),
        other => panic!("expected a tree error, got {other:?}"),
    }
}

/// The detail of the error for a tree nesting deeper than the limit.
fn too_deep() -> String {
    format!("nesting deeper than {MAX_TREE_DEPTH} levels")
}

/// `leaf` inside `depth` containers made by `wrap`.
fn nest(depth: usize, leaf: Value, wrap: impl Fn(Value) -> Value) -> Value {
    (0..depth).fold(leaf, |inner, _| wrap(inner))
}

fn list(inner: Value) -> Value {
    Value::List(vec![inner])
}

fn dict(inner: Value) -> Value {
    Value::Map(BTreeMap::from([("k".to_string(), inner)]))
}

/// Structural equality, arrays by data, floats by bits; iterative, so it
/// compares values of any depth.
fn same_value(a: &Value, b: &Value) -> bool {
    let mut pending = vec![(a, b)];
    while let Some(pair) = pending.pop() {
        match pair {
            (Value::None, Value::None) => {}
            (Value::Bool(x), Value::Bool(y)) if x == y => {}
            (Value::Int(x), Value::Int(y)) if x == y => {}
            (Value::Float(x), Value::Float(y)) if x.to_bits() == y.to_bits() => {}
            (Value::Str(x), Value::Str(y)) if x == y => {}
            (Value::Array(x), Value::Array(y))
                if x.aval() == y.aval() && x.to_vec::<f32>().ok() == y.to_vec::<f32>().ok() => {}
            (Value::List(x), Value::List(y)) | (Value::Tuple(x), Value::Tuple(y))
                if x.len() == y.len() =>
            {
                pending.extend(x.iter().zip(y));
            }
            (Value::Map(x), Value::Map(y)) if x.len() == y.len() && x.keys().eq(y.keys()) => {
                pending.extend(x.values().zip(y.values()));
            }
            (Value::Object { class: c, inner: i }, Value::Object { class: d, inner: j })
                if c == d =>
            {
                pending.push((i, j));
            }
            _ => return false,
        }
    }
    true
}

fn hash_of(def: &TreeDef) -> u64 {
    let mut hasher = DefaultHasher::new();
    def.hash(&mut hasher);
    hasher.finish()
}

/// A registered class `name` whose payload (`inner`) is its only child.
fn wrapper_type(name: &'static str) -> NodeType {
    NodeType::new(
        name,
        |v: &Value| match v {
            Value::Object { inner, .. } => Ok((vec![(**inner).clone()], StaticValue::unit())),
            other => Ok((vec![other.clone()], StaticValue::unit())),
        },
        move |_: &StaticValue, mut children: Vec<Value>| {
            Ok(Value::Object {
                class: name.into(),
                inner: Box::new(children.pop().unwrap_or_default()),
            })
        },
    )
}

fn object(class: &str, inner: Value) -> Value {
    Value::Object {
        class: class.into(),
        inner: Box::new(inner),
    }
}

child_process_test! {
    /// Lists nested 10,000 deep stop at the limit with the path to it.
    fn a_list_nested_10000_deep_is_an_error_naming_the_path() {
        let deep = nest(SCRIPT_DEPTH, Value::Array(arr(&[1.0])), list);
        let copy = deep.clone();
        let (path, detail) = tree_error(tree_flatten(&deep).unwrap_err());
        assert_eq!(path, "[0]".repeat(MAX_TREE_DEPTH));
        assert!(detail.starts_with(&too_deep()), "{detail}");
        assert!(same_value(&deep, &copy), "the caller's value is untouched");
        // The failed flatten left every level it entered: a tree at the
        // limit still flattens on this thread.
        let at_limit = nest(MAX_TREE_DEPTH, Value::Array(arr(&[1.0])), list);
        let (leaves, def) = tree_flatten(&at_limit).unwrap();
        assert_eq!((leaves.len(), def.num_leaves()), (1, 1));
    }
}

child_process_test! {
    /// Dicts nested 10,000 deep stop at the limit with the path to it, and
    /// so does a compiled call taking one.
    fn a_dict_nested_10000_deep_is_an_error_naming_the_path_also_through_compile() {
        let deep = nest(SCRIPT_DEPTH, Value::Array(arr(&[1.0])), dict);
        let (path, detail) = tree_error(tree_flatten(&deep).unwrap_err());
        assert_eq!(path, r#"["k"]"#.repeat(MAX_TREE_DEPTH));
        assert!(detail.starts_with(&too_deep()), "{detail}");
        let f = compile(|v: Value| v);
        let (path, detail) = tree_error(f.call(&deep).unwrap_err());
        assert_eq!(path, r#"["k"]"#.repeat(MAX_TREE_DEPTH));
        assert!(detail.starts_with(&too_deep()), "{detail}");
        assert_eq!(f.cache().entries, 0);
    }
}

child_process_test! {
    /// Script objects and registered nodes nested 10,000 deep stop at the
    /// limit with the path to it.
    fn objects_and_registered_nodes_nested_10000_deep_are_an_error_naming_the_path() {
        let plain = nest(SCRIPT_DEPTH, Value::Int(1), |v| object("Plain", v));
        let (path, detail) = tree_error(tree_flatten(&plain).unwrap_err());
        assert_eq!(path, "<root>", "an unregistered object's payload adds no path step");
        assert!(detail.starts_with(&too_deep()), "{detail}");

        let registry = Registry::new();
        registry.register(wrapper_type("Wrapper")).unwrap();
        let wrapped = nest(SCRIPT_DEPTH, Value::Int(1), |v| object("Wrapper", v));
        let (path, detail) = tree_error(wrapped.flatten_with(&registry, &mut Vec::new()).unwrap_err());
        assert_eq!(path, vec!["0"; MAX_TREE_DEPTH].join("."));
        assert!(detail.starts_with(&too_deep()), "{detail}");
        assert!(detail.contains("inside node type `Wrapper`"), "{detail}");
    }
}

child_process_test! {
    /// Dropping, cloning and printing a value 10,000 deep never recurse.
    fn a_value_nested_10000_deep_clones_drops_and_prints() {
        let deep = nest(SCRIPT_DEPTH, Value::Int(7), |v| {
            object("Box", Value::Tuple(vec![dict(v), Value::Str("s".into())]))
        });
        let copy = deep.clone();
        assert!(same_value(&copy, &deep));
        drop(deep);
        let shallow = nest(SCRIPT_DEPTH, Value::Int(7), list);
        let printed = format!("{shallow:?}");
        let levels = MAX_TREE_DEPTH + 1;
        assert_eq!(
            printed,
            format!("{}..{}", "List([".repeat(levels), "])".repeat(levels))
        );
    }
}

child_process_test! {
    /// A def built by hand 10,000 deep drops, counts its leaves and lists
    /// their paths; unflattening it is an error at the limit.
    fn a_def_nested_10000_deep_drops_and_is_refused_by_unflatten() {
        let def = (0..SCRIPT_DEPTH).fold(TreeDef::Leaf, |inner, _| {
            TreeDef::List(vec![inner])
        });
        assert_eq!(def.num_leaves(), 1);
        let paths = def.leaf_paths();
        assert_eq!(paths.len(), 1);
        assert_eq!(paths[0].len(), SCRIPT_DEPTH);
        assert_eq!(paths[0].to_string(), "[0]".repeat(SCRIPT_DEPTH));
        let (path, detail) =
            tree_error(tree_unflatten::<Value>(&def, vec![arr(&[1.0])]).unwrap_err());
        assert_eq!(path, "[0]".repeat(MAX_TREE_DEPTH));
        assert!(detail.starts_with(&too_deep()), "{detail}");
        drop(def);
        let map_def = (0..SCRIPT_DEPTH).fold(TreeDef::Leaf, |inner, _| {
            TreeDef::Option(Some(Box::new(TreeDef::Map(vec![("k".into(), inner)]))))
        });
        assert_eq!(map_def.num_leaves(), 1);
        drop(map_def);
    }
}

/// A recursive Rust type: its depth is its data's.
#[derive(Tree, Debug)]
struct Chain {
    weight: Array,
    next: Option<Box<Chain>>,
}

child_process_test! {
    /// A recursive derived struct deeper than the limit is an error at the
    /// limit, in flatten and in unflatten.
    fn a_recursive_struct_deeper_than_the_limit_is_an_error_naming_the_path() {
        let chain = (0..MAX_TREE_DEPTH).fold(None, |next, _| {
            Some(Box::new(Chain { weight: arr(&[1.0]), next }))
        });
        let chain = chain.expect("the chain has links");
        let (path, detail) = tree_error(tree_flatten(&*chain).unwrap_err());
        // Each link is two levels (the struct and its `Option`).
        assert_eq!(path, "next.".repeat(MAX_TREE_DEPTH / 2 - 1) + "next");
        assert!(detail.starts_with(&too_deep()), "{detail}");
    }
}

child_process_test! {
    /// At the limit every operation works in a 1 MiB stack: flatten,
    /// unflatten, the def's equality, hash, clone, display and debug, the
    /// first difference, and a compiled call with a miss explained.
    fn every_walk_of_a_tree_at_the_limit_fits_in_a_small_stack() {
        let at_limit = |bottom: i64| {
            nest(MAX_TREE_DEPTH - 1, Value::List(vec![Value::Array(arr(&[1.0, 2.0])), Value::Int(bottom)]), |v| {
                match v {
                    Value::List(_) => dict(v),
                    other => list(other),
                }
            })
        };
        let value = at_limit(1);
        let (leaves, def) = tree_flatten(&value).unwrap();
        let back: Value = tree_unflatten(&def, leaves.clone()).unwrap();
        assert!(same_value(&back, &value));
        let doubled = tree_map(&value, |a| Ok(a.clone() * 2.0)).unwrap();
        assert_eq!(
            tree_flatten(&doubled).unwrap().0[0].to_vec::<f32>().unwrap(),
            [2.0, 4.0]
        );
        let copy = def.clone();
        assert_eq!(copy, def);
        assert_eq!(hash_of(&copy), hash_of(&def));
        let closing = "}]".repeat(MAX_TREE_DEPTH / 2 - 1) + "}";
        assert!(def.to_string().ends_with(&format!("[*, 1]{closing}")), "{def}");
        assert!(format!("{def:?}").contains("Leaf"));
        assert!(format!("{value:?}").contains("Int(1)"));
        let (_, other_def) = tree_flatten(&at_limit(2)).unwrap();
        let diff = def.first_difference(&other_def).unwrap();
        assert_eq!(diff.path.len(), MAX_TREE_DEPTH);

        let f = compile(|v: Value| v);
        let out = f.call(&value).unwrap();
        assert!(same_value(&out, &value));
        f.call(&at_limit(2)).unwrap();
        let cache = f.cache();
        assert_eq!((cache.entries, cache.misses), (2, 2));
        match &cache.miss_log[1].reasons[..] {
            [MissReason::Static { path, before, now }] => {
                assert_eq!(path, &format!("args{}[1]", r#"["k"][0]"#.repeat(MAX_TREE_DEPTH / 2 - 1) + r#"["k"]"#));
                assert_eq!((before.as_str(), now.as_str()), ("1", "2"));
            }
            other => panic!("expected one static difference, got {other:?}"),
        }
    }
}

child_process_test! {
    /// A registered flatten returning the node itself is a cycle, refused
    /// where the node first repeats.
    fn a_registered_flatten_returning_its_node_is_a_cycle_naming_the_type_and_path() {
        let registry = Registry::new();
        registry
            .register(NodeType::new(
                "Loop",
                |v: &Value| Ok((vec![v.clone()], StaticValue::unit())),
                |_: &StaticValue, _: Vec<Value>| Ok(Value::None),
            ))
            .unwrap();
        let looping = Value::Tuple(vec![
            Value::Array(arr(&[1.0])),
            object("Loop", Value::Array(arr(&[2.0]))),
        ]);
        let (path, detail) =
            tree_error(looping.flatten_with(&registry, &mut Vec::new()).unwrap_err());
        assert_eq!(path, "[1].0");
        assert_eq!(
            detail,
            "node type `Loop` flattens into itself: this value equals the enclosing `Loop` \
             1 registered node(s) up, so flattening would never end (a registered flatten \
             must return the node's children, not the node)"
        );
    }
}

child_process_test! {
    /// Two registered types flattening into each other are a cycle,
    /// refused where the first node repeats.
    fn registered_types_flattening_into_each_other_are_a_cycle_naming_the_type_and_path() {
        let registry = Registry::new();
        // `Ping` flattens into a `Pong` holding it; `Pong` into its payload.
        registry
            .register(NodeType::new(
                "Ping",
                |v: &Value| Ok((vec![object("Pong", v.clone())], StaticValue::unit())),
                |_: &StaticValue, _: Vec<Value>| Ok(Value::None),
            ))
            .unwrap();
        registry.register(wrapper_type("Pong")).unwrap();
        let ping = dict(object("Ping", Value::Int(3)));
        let (path, detail) = tree_error(ping.flatten_with(&registry, &mut Vec::new()).unwrap_err());
        assert_eq!(path, r#"["k"].0.0"#);
        assert!(
            detail.starts_with(
                "node type `Ping` flattens into itself: this value equals the enclosing `Ping` \
                 2 registered node(s) up"
            ),
            "{detail}"
        );
    }
}

child_process_test! {
    /// A registered flatten whose children keep growing never repeats a
    /// value; the depth limit stops it, naming the type and the path.
    fn a_registered_flatten_that_keeps_growing_stops_at_the_depth_limit() {
        let registry = Registry::new();
        registry
            .register(NodeType::new(
                "Grow",
                |v: &Value| Ok((vec![object("Grow", Value::List(vec![v.clone()]))], StaticValue::unit())),
                |_: &StaticValue, _: Vec<Value>| Ok(Value::None),
            ))
            .unwrap();
        let (path, detail) = tree_error(
            object("Grow", Value::None)
                .flatten_with(&registry, &mut Vec::new())
                .unwrap_err(),
        );
        assert_eq!(path, vec!["0"; MAX_TREE_DEPTH].join("."));
        assert!(detail.starts_with(&too_deep()), "{detail}");
        assert!(
            detail.ends_with(
                "(inside node type `Grow`: does its flatten return new values containing the node?)"
            ),
            "{detail}"
        );
    }
}

/// One level of a generated value: the container holding the next level,
/// with leaf siblings around it.
#[derive(Clone, Debug)]
enum Wrapper {
    /// A list with `before` and `after` leaves beside the inner value.
    List {
        before: usize,
        after: usize,
    },
    Tuple {
        before: usize,
        after: usize,
    },
    /// A dict with the inner value at `key` and a leaf at each of `others`.
    Dict {
        key: String,
        others: Vec<String>,
    },
    /// An unregistered script object (its payload adds no path step).
    Object,
    /// A registered node whose only child is its payload.
    Registered,
}

fn leaf(i: usize) -> Value {
    match i % 3 {
        0 => Value::Array(arr(&[i as f32])),
        1 => Value::Int(i as i64),
        _ => Value::Str(format!("s{i}")),
    }
}

impl Wrapper {
    fn wrap(&self, inner: Value) -> Value {
        let leaves = |n: usize| (0..n).map(leaf);
        match self {
            Wrapper::List { before, after } | Wrapper::Tuple { before, after } => {
                let items = leaves(*before)
                    .chain([inner])
                    .chain(leaves(*after))
                    .collect();
                if matches!(self, Wrapper::List { .. }) {
                    Value::List(items)
                } else {
                    Value::Tuple(items)
                }
            }
            Wrapper::Dict { key, others } => {
                let mut map: BTreeMap<String, Value> =
                    others.iter().cloned().zip(leaves(others.len())).collect();
                map.insert(key.clone(), inner);
                Value::Map(map)
            }
            Wrapper::Object => object("Point", inner),
            Wrapper::Registered => object("Wrap", inner),
        }
    }

    /// The path step from this container to the inner value.
    fn step(&self) -> PathEntry {
        match self {
            Wrapper::List { before, .. } | Wrapper::Tuple { before, .. } => {
                PathEntry::Index(*before)
            }
            Wrapper::Dict { key, .. } => PathEntry::Key(key.clone()),
            Wrapper::Object => PathEntry::Field("".into()),
            Wrapper::Registered => PathEntry::Field("0".into()),
        }
    }
}

fn arb_wrapper() -> impl Strategy<Value = Wrapper> {
    prop_oneof![
        (0..3_usize, 0..3_usize).prop_map(|(before, after)| Wrapper::List { before, after }),
        (0..3_usize, 0..3_usize).prop_map(|(before, after)| Wrapper::Tuple { before, after }),
        ("[a-d]", prop::collection::btree_set("[e-h]", 0..3)).prop_map(|(key, others)| {
            Wrapper::Dict {
                key,
                others: others.into_iter().collect(),
            }
        }),
        Just(Wrapper::Object),
        Just(Wrapper::Registered),
    ]
}

fn cases() -> u32 {
    std::env::var("KILN_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// Random values nested up to past the limit, with siblings at every
    /// level: within the limit, flatten then unflatten gives the value back;
    /// past it, flatten is an `Err` at the path through the first
    /// `MAX_TREE_DEPTH` containers.
    #[test]
    fn deep_and_wide_values_round_trip_or_fail_at_the_limit(
        spine in prop::collection::vec(arb_wrapper(), 0..MAX_TREE_DEPTH + 40),
        bottom in 0..3_usize,
    ) {
        let registry = Registry::new();
        registry.register(wrapper_type("Wrap")).unwrap();
        // The spine lists the containers from the root down.
        let value = spine.iter().rev().fold(leaf(bottom), |inner, w| w.wrap(inner));
        let mut leaves = Vec::new();
        let flattened = value.flatten_with(&registry, &mut leaves);
        if spine.len() > MAX_TREE_DEPTH {
            let (path, detail) = tree_error(flattened.unwrap_err());
            let steps = spine[..MAX_TREE_DEPTH].iter().map(Wrapper::step).collect();
            prop_assert_eq!(path, KeyPath(steps).to_string());
            prop_assert!(detail.starts_with(&too_deep()), "{}", detail);
        } else {
            let def = flattened.unwrap();
            prop_assert_eq!(leaves.len(), def.num_leaves());
            let back = Value::unflatten_with(&registry, &def, &mut leaves.clone().into_iter()).unwrap();
            prop_assert!(same_value(&back, &value));
            let mut again = Vec::new();
            prop_assert_eq!(back.flatten_with(&registry, &mut again).unwrap(), def);
            prop_assert_eq!(again.len(), leaves.len());
        }
    }
}
