//! Custom ops with struct arguments (seed magi #32): an attention-like op
//! over `(q, k, v, cfg)` whose config mixes arrays, floats, bools, an enum
//! and a nested struct. One node in the graph with its flattened schema;
//! equal configs are one cache entry and one CSE'd node; a flipped static
//! is a miss naming its path; gradients come back in the arguments' own
//! tree types, numerically checked; wrong vjp structures are `Err`s naming
//! the path.

use kiln::random::Key;
use kiln::{compile, grad, nn, Array, CustomOp, DType, Function, MissReason, Op, Tree, ValueKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum MaskKind {
    Banded,
    Dense,
}

#[derive(Tree, Clone, Debug)]
struct Sub {
    bias: Array,
    #[tree(static)]
    temperature: f32,
}

#[derive(Tree, Clone, Debug)]
struct AttnCfg {
    #[tree(static)]
    scale: f32,
    #[tree(static)]
    causal: bool,
    #[tree(static)]
    mask: MaskKind,
    inner: Sub,
}

type AttnArgs = (Array, Array, Array, AttnCfg);

fn normal(seed: u64, shape: &[usize]) -> Array {
    Array::random_normal(Key::new(seed), shape, DType::F32).unwrap()
}

/// A `[n, n]` f32 array with 1 where `keep(i, j)`, 0 elsewhere.
fn pattern(n: usize, keep: impl Fn(usize, usize) -> bool) -> Array {
    let data: Vec<f32> = (0..n * n)
        .map(|p| f32::from(u8::from(keep(p / n, p % n))))
        .collect();
    Array::from_vec(data, &[n, n]).unwrap()
}

/// The attention the op computes, as a plain composition (also the oracle).
fn attention((q, k, v, cfg): &AttnArgs) -> Array {
    let n = q.dims().map_or(0, |d| d[0]);
    let scores = q.matmul(&k.transpose()) * (cfg.scale / cfg.inner.temperature) + &cfg.inner.bias;
    let mut allowed = pattern(n, |_, _| true);
    if cfg.causal {
        allowed = allowed * pattern(n, |i, j| j <= i);
    }
    if cfg.mask == MaskKind::Banded {
        allowed = allowed * pattern(n, |i, j| i.abs_diff(j) <= 1);
    }
    let masked = kiln::select(&allowed.greater(0.5), &scores, -1e9);
    nn::softmax(&masked, -1).matmul(v)
}

/// The op with a vjp built from Kiln's own `grad` of the composition
/// (applied lazily, since vjps run inside traces), returning `cfg`'s
/// cotangent as an `AttnCfg` (statics carried along).
fn attention_op() -> CustomOp<AttnArgs> {
    CustomOp::new("attention", |args: &AttnArgs| Ok(attention(args))).with_vjp(
        |args: &AttnArgs, _out: &Array, g: &Array| {
            let cfg = args.3.clone();
            let g = g.clone();
            // The gradient of ⟨attention(x), g⟩ is the vjp of attention at g.
            let inner = move |(q, k, v, bias): (Array, Array, Array, Array)| {
                let mut cfg = cfg.clone();
                cfg.inner.bias = bias;
                (attention(&(q, k, v, cfg)) * &g).sum_all()
            };
            let primals = (
                args.0.clone(),
                args.1.clone(),
                args.2.clone(),
                args.3.inner.bias.clone(),
            );
            let (dq, dk, dv, dbias) = grad(inner).apply(primals)?;
            let mut dcfg = args.3.clone();
            dcfg.inner.bias = dbias;
            Ok((dq, dk, dv, Some(dcfg)))
        },
    )
}

fn config(causal: bool) -> AttnCfg {
    AttnCfg {
        scale: 0.5,
        causal,
        mask: MaskKind::Banded,
        inner: Sub {
            bias: normal(4, &[4, 4]) * 0.1,
            temperature: 2.0,
        },
    }
}

fn inputs(causal: bool) -> AttnArgs {
    (
        normal(1, &[4, 3]),
        normal(2, &[4, 3]),
        normal(3, &[4, 5]),
        config(causal),
    )
}

fn max_difference(a: &Array, b: &Array) -> f32 {
    let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn a_custom_op_computes_its_forward_eagerly_and_compiled() {
    let op = attention_op();
    let args = inputs(true);
    let expected = attention(&args);
    assert!(max_difference(&op.call(&args), &expected) < 1e-6);
    let f = compile(|args: AttnArgs| attention_op().call(&args));
    assert!(max_difference(&f.call(&args).unwrap(), &expected) < 1e-6);
}

#[test]
fn the_op_is_one_node_with_its_name_and_flattened_schema() {
    let op = attention_op();
    let f = compile(move |args: AttnArgs| op.call(&args));
    let args = inputs(true);
    let exe = f.executable(&args).unwrap();
    let customs: Vec<&Op> = exe
        .graph()
        .nodes
        .iter()
        .filter_map(|n| match &n.kind {
            ValueKind::Op(op @ Op::Custom(_)) => Some(op),
            _ => None,
        })
        .collect();
    assert_eq!(customs.len(), 1);
    let Op::Custom(call) = customs[0] else {
        unreachable!()
    };
    assert_eq!(call.name(), "attention");
    let schema: Vec<(String, Option<String>)> = call
        .schema()
        .into_iter()
        .map(|e| (e.path, e.attribute))
        .collect();
    let entry =
        |path: &str, attribute: Option<&str>| (path.to_string(), attribute.map(String::from));
    assert_eq!(
        schema,
        vec![
            entry("[0]", None),
            entry("[1]", None),
            entry("[2]", None),
            entry("[3].scale", Some("0.5")),
            entry("[3].causal", Some("true")),
            entry("[3].mask", Some("Banded")),
            entry("[3].inner.bias", None),
            entry("[3].inner.temperature", Some("2.0")),
        ]
    );
    f.call(&args).unwrap();
    let report = f.cache().reports[0].clone();
    let node = report
        .nodes
        .iter()
        .find(|n| n.op.starts_with("attention("))
        .expect("the report shows the custom node");
    assert!(node.op.contains("[3].causal=true"), "{}", node.op);
    // Only the op and the ops around it: the forward stays inside the node.
    assert!(!report.nodes.iter().any(|n| n.op.starts_with("matmul")));
}

#[test]
fn equal_configs_are_one_cache_entry_and_one_cse_node() {
    let op = attention_op();
    let f = compile(move |args: AttnArgs| {
        // Two applications with equal (separately built) configs merge.
        let again = (
            args.0.clone(),
            args.1.clone(),
            args.2.clone(),
            args.3.clone(),
        );
        &op.call(&args) + &op.call(&again)
    });
    let args = inputs(false);
    let first = f.call(&args).unwrap();
    let other_config = inputs(false);
    f.call(&(
        args.0.clone(),
        args.1.clone(),
        args.2.clone(),
        other_config.3,
    ))
    .unwrap();
    assert_eq!(f.cache().entries, 1);
    let exe = f.executable(&args).unwrap();
    let customs = exe
        .graph()
        .nodes
        .iter()
        .filter(|n| matches!(n.kind, ValueKind::Op(Op::Custom(_))))
        .count();
    assert_eq!(customs, 1, "CSE merges the two equal applications");
    assert!(max_difference(&first, &(attention(&args) * 2.0)) < 1e-5);
}

#[test]
fn a_flipped_static_misses_the_cache_naming_its_path() {
    let op = attention_op();
    let f = compile(move |args: AttnArgs| op.call(&args));
    f.call(&inputs(true)).unwrap();
    f.call(&inputs(false)).unwrap();
    let cache = f.cache();
    assert_eq!(cache.entries, 2);
    let reasons = &cache.last_miss().unwrap().reasons;
    assert_eq!(
        reasons,
        &vec![MissReason::Static {
            path: "args[3].causal".into(),
            before: "true".into(),
            now: "false".into(),
        }]
    );
}

#[test]
fn gradients_come_back_in_the_arguments_tree_types_and_match_differences() {
    let loss = |args: AttnArgs| (attention_op().call(&args) * normal(9, &[4, 5])).sum_all();
    let args = inputs(true);
    let (dq, dk, dv, dcfg): AttnArgs = grad(loss).call(&args).unwrap();
    // Statics come back as they were; the array leaf gets its cotangent.
    assert_eq!(
        (dcfg.scale, dcfg.causal, dcfg.mask),
        (0.5, true, MaskKind::Banded)
    );
    assert_eq!(dcfg.inner.temperature, 2.0);
    let grads = [dq, dk, dv, dcfg.inner.bias];
    let primals = [
        args.0.clone(),
        args.1.clone(),
        args.2.clone(),
        args.3.inner.bias.clone(),
    ];
    // Central differences along a random direction in all four leaves.
    let directions: Vec<Array> = primals
        .iter()
        .enumerate()
        .map(|(i, x)| normal(100 + i as u64, &x.dims().unwrap()))
        .collect();
    let moved = |sign: f32| {
        let leaves: Vec<Array> = primals
            .iter()
            .zip(&directions)
            .map(|(x, d)| x + &(d * (sign * 1e-2)))
            .collect();
        let mut cfg = args.3.clone();
        cfg.inner.bias = leaves[3].clone();
        let value = loss((leaves[0].clone(), leaves[1].clone(), leaves[2].clone(), cfg));
        f64::from(value.item::<f32>().unwrap())
    };
    let numeric = (moved(1.0) - moved(-1.0)) / 2e-2;
    let analytic: f64 = grads
        .iter()
        .zip(&directions)
        .map(|(g, d)| {
            let (g, d) = (g.to_vec::<f32>().unwrap(), d.to_vec::<f32>().unwrap());
            g.iter().zip(&d).map(|(a, b)| f64::from(a * b)).sum::<f64>()
        })
        .sum();
    assert!(
        (numeric - analytic).abs() <= 2e-2 * (1.0 + numeric.abs()),
        "numeric {numeric} vs analytic {analytic}"
    );
}

#[test]
fn a_compiled_gradient_through_the_op_matches_the_eager_one() {
    let loss = |args: AttnArgs| attention_op().call(&args).sum_all();
    let args = inputs(false);
    let eager: AttnArgs = grad(loss).call(&args).unwrap();
    let compiled: AttnArgs = compile(grad(loss)).call(&args).unwrap();
    assert!(max_difference(&eager.0, &compiled.0) < 1e-5);
    assert!(max_difference(&eager.3.inner.bias, &compiled.3.inner.bias) < 1e-5);
}

#[test]
fn a_none_cotangent_for_a_whole_sub_struct_gives_structural_zeros() {
    let op = CustomOp::new("attention_frozen_cfg", |args: &AttnArgs| {
        Ok(attention(args))
    })
    .with_vjp(|args: &AttnArgs, _out: &Array, g: &Array| {
        // d(out)/dv only: the probabilities times g.
        let identity = pattern(4, |i, j| i == j);
        let probs = attention(&(args.0.clone(), args.1.clone(), identity, args.3.clone()));
        let dv = probs.transpose().matmul(g);
        Ok((None::<Array>, None::<Array>, dv, None::<AttnCfg>))
    });
    let args = inputs(true);
    let (dq, _, dv, dcfg): AttnArgs = grad(move |a: AttnArgs| op.call(&a).sum_all())
        .call(&args)
        .unwrap();
    assert!(dq.to_vec::<f32>().unwrap().iter().all(|&x| x == 0.0));
    assert!(dcfg
        .inner
        .bias
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .all(|&x| x == 0.0));
    let expected: AttnArgs = grad(|a: AttnArgs| attention_op().call(&a).sum_all())
        .call(&args)
        .unwrap();
    assert!(max_difference(&dv, &expected.2) < 1e-5);
}

#[test]
fn a_vjp_returning_the_wrong_structure_is_an_error_naming_the_path() {
    #[derive(Tree, Clone)]
    struct NotSub {
        other: Array,
    }
    let op = CustomOp::new("attention", |args: &AttnArgs| Ok(attention(args))).with_vjp(
        |args: &AttnArgs, _: &Array, g: &Array| {
            let wrong = (args.3.scale, args.3.causal, NotSub { other: g.clone() });
            Ok((g.clone(), g.clone(), g.clone(), Some(wrong)))
        },
    );
    let err = grad(move |a: AttnArgs| op.call(&a).sum_all())
        .call(&inputs(false))
        .unwrap_err()
        .to_string();
    assert!(err.contains("`[3]`") && err.contains("attention"), "{err}");
}

#[test]
fn a_vjp_returning_a_wrong_shape_is_an_error_naming_the_leaf() {
    let op = CustomOp::new("attention", |args: &AttnArgs| Ok(attention(args))).with_vjp(
        |args: &AttnArgs, _: &Array, g: &Array| {
            Ok((g.clone(), args.1.clone(), args.2.clone(), None::<AttnCfg>))
        },
    );
    let err = grad(move |a: AttnArgs| op.call(&a).sum_all())
        .call(&inputs(false))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`[0]`") && err.contains("f32[4,5]") && err.contains("f32[4,3]"),
        "{err}"
    );
}

#[test]
fn differentiating_a_custom_op_without_a_vjp_is_an_error_naming_it() {
    let op = CustomOp::new("plain_attention", |args: &AttnArgs| Ok(attention(args)));
    let args = inputs(false);
    assert!(max_difference(&op.call(&args), &attention(&args)) < 1e-6);
    let err = grad(move |a: AttnArgs| op.call(&a).sum_all())
        .call(&args)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`plain_attention`") && err.contains("no vjp"),
        "{err}"
    );
}

#[test]
fn a_custom_op_in_a_shapeless_compile_traces_once_for_every_size() {
    let scale = CustomOp::new("scaled_softmax", |(x, t): &(Array, f32)| {
        Ok(nn::softmax(&(x * *t), -1))
    });
    let f = compile(move |x: Array| scale.call(&(x, 0.5))).shapeless();
    for n in [3, 7, 20] {
        let x = normal(n as u64, &[n, 5]);
        let y = f.call(&x).unwrap();
        assert_eq!(y.dims().unwrap(), vec![n, 5]);
        assert!(max_difference(&y, &nn::softmax(&(&x * 0.5), -1)) < 1e-6);
    }
    assert_eq!(f.cache().misses, 1, "one trace for every size");
}

#[test]
fn a_forward_closing_over_a_traced_value_is_an_error() {
    let f = compile(|x: Array| {
        let captured = x.clone();
        let op = CustomOp::new("leaky", move |y: &Array| Ok(y + &captured));
        op.call(&x)
    });
    let err = f.call(&normal(1, &[3])).unwrap_err().to_string();
    assert!(err.contains("`leaky`") && err.contains("argument"), "{err}");
}

#[test]
fn an_enum_static_shows_its_variant_in_the_miss() {
    let op = attention_op();
    let f = compile(move |args: AttnArgs| op.call(&args));
    let banded = inputs(true);
    let mut dense = inputs(true);
    dense.3.mask = MaskKind::Dense;
    f.call(&banded).unwrap();
    let y = f.call(&dense).unwrap();
    assert!(max_difference(&y, &attention(&dense)) < 1e-6);
    assert_eq!(
        f.cache().last_miss().unwrap().reasons,
        vec![MissReason::Static {
            path: "args[3].mask".into(),
            before: "Banded".into(),
            now: "Dense".into(),
        }]
    );
}
