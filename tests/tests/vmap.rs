//! vmap: the batched function equals stacking the function on each example
//! (random programs with random in/out axes, on the CPU and wgpu); each op
//! family's batching rule, the per-example fallback of ops without one,
//! composition with compile, grad and shapeless; an MLP batched by vmap has
//! the hand-batched program's matmuls; errors name the leaf paths and
//! sizes. Case count of the property test: `KILN_CASES` (CI default 24).

use kiln::implicit::{ImplicitArray, LowRank};
use kiln::ops::custom::CustomOp;
use kiln::{
    compile, concat, gather_qmm, grad, jvp, nn, quantize, quantized_matmul, vmap, Array, DType,
    QuantFormat, SliceAxis, Tree,
};
use kiln_tests::arrays::{close, example, normal, stack};
use kiln_tests::conformance::compare_within;
use kiln_tests::programs::{cases, instr, make_inputs, run};
use proptest::prelude::*;
use std::sync::Arc;

/// Checks `vmap(f)` over `xs` (each batched along axis 0, `n` examples)
/// against stacking `f` on each example.
fn check_vmap(name: &str, f: impl Fn(Vec<Array>) -> Array, xs: Vec<Array>) {
    let n = xs[0].dims().unwrap()[0];
    let got = vmap(&f).call(&xs).unwrap_or_else(|e| panic!("{name}: {e}"));
    let want = stack(
        &(0..n)
            .map(|i| f(xs.iter().map(|x| example(x, 0, i)).collect()))
            .collect::<Vec<_>>(),
        0,
    );
    assert_eq!(got.dims(), want.dims(), "{name}");
    compare_within(&got.data().unwrap(), &want.data().unwrap(), 1e-6, 1e-5)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
}

#[test]
fn elementwise_and_broadcasting_rules_keep_each_examples_values() {
    check_vmap("exp", |x| x[0].exp(), vec![normal(1, &[3, 2, 4])]);
    check_vmap(
        "add",
        |x| &x[0] + &x[1],
        vec![normal(2, &[3, 4]), normal(3, &[3, 2, 4])],
    );
    check_vmap(
        "where",
        |x| x[0].greater(0.0).select(&x[1], 0.5),
        vec![normal(4, &[3, 2, 1]), normal(5, &[3, 4])],
    );
    check_vmap(
        "cast",
        |x| x[0].cast(DType::F16).cast(DType::F32),
        vec![normal(6, &[3, 5])],
    );
    // A shared operand of higher rank than the batched one.
    let shared = normal(7, &[2, 4]);
    let got = vmap(|x: Array| &x * &shared)
        .call(&normal(8, &[3, 4]))
        .unwrap();
    assert_eq!(got.dims().unwrap(), vec![3, 2, 4]);
}

#[test]
fn reduction_and_layout_rules_shift_their_axes_past_the_batch() {
    let x = || vec![normal(10, &[3, 4, 5])];
    check_vmap("sum", |x| x[0].sum(&[1], false), x());
    check_vmap("max keepdims", |x| x[0].max(&[0], true), x());
    check_vmap("mean", |x| x[0].mean(&[0, 1], false), x());
    check_vmap("argmax", |x| x[0].argmax(1, false).cast(DType::F32), x());
    check_vmap("reshape", |x| x[0].reshape(&[5, 4]), x());
    check_vmap("permute", |x| x[0].permute(&[1, 0]), x());
    check_vmap("broadcast_to", |x| x[0].broadcast_to(vec![2, 4, 5]), x());
    check_vmap("slice", |x| x[0].slice_axis(1, 1, None, 2), x());
    check_vmap(
        "pad_slice",
        |x| {
            x[0].pad_slice(
                &[
                    SliceAxis::full(),
                    SliceAxis {
                        start: 0,
                        stop: None,
                        step: 2,
                    },
                ],
                vec![4, 10],
            )
        },
        x(),
    );
    check_vmap(
        "concat with a shared operand",
        |x| concat(&[x[0].clone(), Array::ones(&[1, 5], DType::F32)], 0),
        x(),
    );
    check_vmap("softmax", |x| nn::softmax(&x[0], -1), x());
    check_vmap(
        "layer_norm",
        |x| nn::layer_norm(&x[0], None, None, 1e-3),
        x(),
    );
}

#[test]
fn matmul_rules_cover_vectors_batches_and_shared_weights() {
    let w = normal(20, &[4, 3]);
    // A vector per example times a shared matrix.
    let vs = normal(21, &[5, 4]);
    let got = vmap(|v: Array| v.matmul(&w)).call(&vs).unwrap();
    close(&got, &vs.matmul(&w), 1e-6, 1e-6);
    check_vmap(
        "matrix @ batched",
        |x| x[0].matmul(&x[1]),
        vec![normal(22, &[5, 2, 4]), normal(23, &[5, 4, 3])],
    );
    check_vmap(
        "batched dims",
        |x| x[0].matmul(&x[1]),
        vec![normal(24, &[5, 2, 3, 4]), normal(25, &[5, 4, 2])],
    );
    // Shared weight, batched rows: folded into one product.
    let xs = normal(26, &[6, 4]);
    let got = vmap(|x: Array| x.matmul(&w)).call(&xs).unwrap();
    close(&got, &xs.matmul(&w), 1e-6, 1e-6);
}

#[test]
fn take_and_scatter_add_batch_values_and_indices() {
    let table = normal(30, &[6, 3]);
    // Shared table, per-example indices: one take.
    let ids = Array::from_vec(vec![0i32, 5, 2, 2, 1, 0], &[3, 2]).unwrap();
    let got = vmap(|i: Array| table.take(&i, 0)).call(&ids).unwrap();
    close(&got, &table.take(&ids, 0), 0.0, 0.0);
    // Per-example values, shared indices.
    let idx = Array::from_vec(vec![2i32, 0], &[2]).unwrap();
    check_vmap("take", |x| x[0].take(&idx, 1), vec![normal(31, &[3, 4, 5])]);
    check_vmap(
        "scatter_add",
        |x| x[0].scatter_add(&idx, 0, 4),
        vec![normal(32, &[3, 2, 5])],
    );
}

/// `f` vmapped and compiled over `args` (batched along axis 0, `n`
/// examples) equals stacking `f` on each example, with no per-example
/// fallback on the report.
fn check_batched_without_fallback<T: Tree + Clone + 'static>(
    name: &str,
    f: impl Fn(T) -> Array + Clone + Send + Sync + 'static,
    args: T,
    n: usize,
    pick: impl Fn(&T, usize) -> T,
) {
    let compiled = compile(vmap(f.clone()));
    let got = compiled
        .call(&args)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let want = stack(&(0..n).map(|k| f(pick(&args, k))).collect::<Vec<_>>(), 0);
    close(&got, &want, 1e-5, 1e-5);
    let report = &compiled.cache().reports[0];
    assert!(
        report.vmap_fallbacks.is_empty(),
        "{name}: {:?}",
        report.vmap_fallbacks
    );
}

fn pick_pair(args: &(Array, Array), k: usize) -> (Array, Array) {
    (example(&args.0, 0, k), example(&args.1, 0, k))
}

#[test]
fn take_with_batched_values_and_indices_is_one_take_with_offset_indices() {
    // Negative indices wrap per example, along a non-leading axis too.
    let ids = Array::from_vec(vec![0i32, 5, -1, 2, 1, -6], &[3, 2]).unwrap();
    let f = |(x, i): (Array, Array)| x.take(&i, 0);
    check_batched_without_fallback(
        "take axis 0",
        f,
        (normal(33, &[3, 6, 2]), ids.clone()),
        3,
        pick_pair,
    );
    let g = |(x, i): (Array, Array)| x.take(&i, 1);
    check_batched_without_fallback(
        "take axis 1",
        g,
        (normal(35, &[3, 4, 6, 2]), ids.clone()),
        3,
        pick_pair,
    );
    let idx = Array::from_vec(vec![3u32, 0, 1, 1, 2, 5, 0, 4, 4, 1, 2, 3], &[3, 2, 2]).unwrap();
    check_batched_without_fallback(
        "take u32 2-d indices",
        g,
        (normal(36, &[3, 2, 6]), idx),
        3,
        pick_pair,
    );
    // One take for all examples, not one per example.
    let compiled = compile(vmap(f));
    compiled.call(&(normal(33, &[3, 6, 2]), ids)).unwrap();
    let report = &compiled.cache().reports[0];
    let takes = report
        .nodes
        .iter()
        .filter(|n| n.op.starts_with("take"))
        .count();
    assert_eq!(
        takes,
        1,
        "{:?}",
        report.nodes.iter().map(|n| &n.op).collect::<Vec<_>>()
    );
}

#[test]
fn an_out_of_range_index_of_one_example_is_still_an_error_under_vmap() {
    // Row 6 of example 0 would be row 0 of example 1 once folded.
    let ids = Array::from_vec(vec![6i32, 0, 0, 0], &[2, 2]).unwrap();
    let err = vmap(|(x, i): (Array, Array)| x.take(&i, 0))
        .call(&(normal(37, &[2, 6, 3]), ids.clone()))
        .and_then(|a| a.check())
        .and_then(|a| a.data().map(|_| a))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("take") && err.contains("out of range"),
        "{err}"
    );
    let err = vmap(|(u, i): (Array, Array)| u.scatter_add(&i, 0, 6))
        .call(&(normal(38, &[2, 2, 3]), ids))
        .and_then(|a| a.data().map(|_| a))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("scatter_add") && err.contains("out of range"),
        "{err}"
    );
}

#[test]
fn scatter_add_with_batched_indices_scatters_once_into_every_examples_rows() {
    let ids = Array::from_vec(vec![0i32, 5, -1, 2, 1, 1], &[3, 2]).unwrap();
    let f = |(u, i): (Array, Array)| u.scatter_add(&i, 0, 6);
    check_batched_without_fallback(
        "scatter axis 0",
        f,
        (normal(34, &[3, 2, 4]), ids.clone()),
        3,
        pick_pair,
    );
    let g = |(u, i): (Array, Array)| u.scatter_add(&i, 1, 6);
    check_batched_without_fallback(
        "scatter axis 1",
        g,
        (normal(39, &[3, 4, 2, 2]), ids.clone()),
        3,
        pick_pair,
    );
    // Shared updates, per-example indices.
    let shared = normal(40, &[2, 4]);
    let h = move |i: Array| shared.scatter_add(&i, 0, 6);
    check_batched_without_fallback("scatter shared updates", h, ids, 3, |i, k| example(i, 0, k));
}

#[test]
fn take_and_scatter_add_batch_a_symbolic_number_of_examples() {
    let f = |(x, i): (Array, Array)| x.take(&i, 1).scatter_add(&i, 1, 5);
    let cpu = compile(vmap(f)).shapeless();
    // On wgpu too: the offsets' iota and dim_size are resolved per call.
    let gpu = kiln_tests::gpu::backend().map(|b| compile(vmap(f)).shapeless().with_backend(b));
    for n in [2usize, 3, 7] {
        let xs = normal(200 + n as u64, &[n, 2, 5]);
        let ids: Vec<i32> = (0..n * 3).map(|k| (k as i32 * 7) % 5 - 2).collect();
        let ids = Array::from_vec(ids, &[n, 3]).unwrap();
        let want = stack(
            &(0..n)
                .map(|k| f((example(&xs, 0, k), example(&ids, 0, k))))
                .collect::<Vec<_>>(),
            0,
        );
        let args = (xs, ids);
        close(&cpu.call(&args).unwrap(), &want, 1e-6, 1e-6);
        if let Some(gpu) = &gpu {
            close(&gpu.call(&args).unwrap(), &want, 1e-5, 1e-5);
        }
    }
    assert_eq!(cpu.cache().misses, 1);
    assert!(cpu.cache().reports[0].vmap_fallbacks.is_empty());
}

#[test]
fn gather_qmm_batches_its_matrices_and_indices_without_a_loop() {
    let format = QuantFormat::affine(4, 32);
    let x = normal(44, &[2, 2, 64]);
    let w = normal(45, &[3, 6, 64]);
    let lhs = Array::from_vec(vec![1u32, 0, 0, 1, 1, 1], &[3, 2]).unwrap();
    let rhs = Array::from_vec(vec![2u32, 0, 1], &[3, 1]).unwrap();
    // Per-example x, weights and indices.
    let xs = normal(46, &[4, 2, 2, 64]);
    let ws = normal(47, &[4, 3, 6, 64]);
    let lhss = Array::from_vec((0..24).map(|k| (k % 3 % 2) as u32).collect(), &[4, 3, 2]).unwrap();
    let rhss = Array::from_vec((0..12).map(|k| (k * 5 % 3) as u32).collect(), &[4, 3, 1]).unwrap();
    type Args = (Array, Array, Array, Array);
    let all = move |(x, w, l, r): Args| gather_qmm(&x, &quantize(&w, format), &l, &r, true);
    let pick = |a: &Args, k: usize| {
        (
            example(&a.0, 0, k),
            example(&a.1, 0, k),
            example(&a.2, 0, k),
            example(&a.3, 0, k),
        )
    };
    let args = (xs.clone(), ws.clone(), lhss.clone(), rhss.clone());
    check_batched_without_fallback("gather_qmm all batched", all, args, 4, pick);
    // Only x batched; only the weight batched; only the indices batched.
    let (w1, l1, r1) = (w.clone(), lhs.clone(), rhs.clone());
    let only_x = move |x: Array| gather_qmm(&x, &quantize(&w1, format), &l1, &r1, true);
    check_batched_without_fallback("gather_qmm x", only_x, xs, 4, |a, k| example(a, 0, k));
    let (x1, l1, r1) = (x.clone(), lhs.clone(), rhs.clone());
    let only_w = move |w: Array| gather_qmm(&x1, &quantize(&w, format), &l1, &r1, true);
    check_batched_without_fallback("gather_qmm w", only_w, ws, 4, |a, k| example(a, 0, k));
    let q = quantize(&w, format);
    let only_idx = move |(l, r): (Array, Array)| gather_qmm(&x, &q, &l, &r, true);
    check_batched_without_fallback("gather_qmm indices", only_idx, (lhss, rhss), 4, pick_pair);
}

#[test]
fn quantized_products_fold_a_shared_weight_and_batch_a_batched_one() {
    let format = QuantFormat::affine(4, 32);
    let w = quantize(&normal(40, &[6, 64]), format);
    let xs = normal(41, &[5, 2, 64]);
    let got = vmap(|x: Array| quantized_matmul(&x, &w, true))
        .call(&xs)
        .unwrap();
    close(&got, &quantized_matmul(&xs, &w, true), 1e-6, 1e-6);
    // Per-example weights (quantized per example) times per-example x.
    let ws = normal(42, &[3, 6, 64]);
    let xs = normal(43, &[3, 2, 64]);
    let f = move |(x, w): (Array, Array)| quantized_matmul(&x, &quantize(&w, format), true);
    let got = vmap(f).call(&(xs.clone(), ws.clone())).unwrap();
    let want = stack(
        &(0..3)
            .map(|k| f((example(&xs, 0, k), example(&ws, 0, k))))
            .collect::<Vec<_>>(),
        0,
    );
    close(&got, &want, 1e-6, 1e-6);
}

#[test]
fn a_custom_op_uses_its_batching_rule_or_runs_per_example() {
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    let norm = CustomOp::new("norm", |x: &Array| Ok((x * x).sum_all().sqrt())).with_vmap(
        move |x: &Array, _| {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok((x * x).sum(&[-1], false).sqrt())
        },
    );
    let xs = Array::from_vec(vec![3.0f32, 4.0, 6.0, 8.0, 0.0, 1.0], &[3, 2]).unwrap();
    let got = vmap(|x: Array| norm.call(&x)).call(&xs).unwrap();
    assert_eq!(got.to_vec::<f32>().unwrap(), vec![5.0, 10.0, 1.0]);
    assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 1);

    let plain = CustomOp::new("plain_norm", |x: &Array| Ok((x * x).sum_all().sqrt()));
    let got = vmap(|x: Array| plain.call(&x)).call(&xs).unwrap();
    assert_eq!(got.to_vec::<f32>().unwrap(), vec![5.0, 10.0, 1.0]);

    let wrong = CustomOp::new("wrong_rule", |x: &Array| Ok(x.sum_all()))
        .with_vmap(|x: &Array, _| Ok(x.clone()));
    let err = vmap(|x: Array| wrong.call(&x))
        .call(&xs)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("wrong_rule") && err.contains("f32[3]"),
        "{err}"
    );
}

#[test]
fn a_kernel_runs_once_per_example_and_the_report_says_so() {
    let kernel = kiln_tests::doubling_kernel("twice").build().unwrap();
    let xs = normal(50, &[3, 4]);
    let f = compile(vmap(move |x: Array| kernel.call(&[&x]) + 1.0));
    close(&f.call(&xs).unwrap(), &(&xs * 2.0 + 1.0), 1e-6, 1e-6);
    // The loop is on the report, not hidden.
    assert_eq!(
        f.cache().reports[0].vmap_fallbacks,
        vec![kiln::VmapFallback {
            op: "twice".into(),
            examples: 3,
            reason: "a user kernel has no batching rule".into(),
        }]
    );
}

#[test]
fn a_kernel_that_batches_its_leading_dim_runs_once_for_all_examples() {
    let kernel = kiln_tests::doubling_kernel("twice_batched")
        .batches_leading_dim()
        .build()
        .unwrap();
    let xs = normal(51, &[3, 4]);
    let f = compile(vmap(move |x: Array| kernel.call(&[&x])));
    close(&f.call(&xs).unwrap(), &(&xs * 2.0), 1e-6, 1e-6);
    let report = &f.cache().reports[0];
    assert!(report.vmap_fallbacks.is_empty());
    assert_eq!(
        report
            .nodes
            .iter()
            .filter(|n| n.op.starts_with("twice_batched"))
            .count(),
        1
    );
}

#[test]
fn an_implicit_array_is_batched_through_its_materialization_and_the_report_says_so() {
    let x = normal(60, &[3, 6]);
    let ws = LowRank {
        base: normal(61, &[4, 6, 5]),
        a: normal(62, &[4, 6, 2]),
        b: normal(63, &[4, 2, 5]),
    };
    let f = {
        let x = x.clone();
        move |w: LowRank| x.matmul(&w.array()).tanh()
    };
    let got = vmap(f.clone()).call(&ws).unwrap();
    let want = stack(
        &(0..4)
            .map(|k| {
                f(LowRank {
                    base: example(&ws.base, 0, k),
                    a: example(&ws.a, 0, k),
                    b: example(&ws.b, 0, k),
                })
            })
            .collect::<Vec<_>>(),
        0,
    );
    close(&got, &want, 1e-5, 1e-5);
    // Compiled, the dense value is on the report, not hidden; a shared
    // implicit value stays implicit and is not.
    let compiled = compile(vmap(f));
    close(&compiled.call(&ws).unwrap(), &want, 1e-5, 1e-5);
    let report = &compiled.cache().reports[0];
    assert!(report.vmap_fallbacks.is_empty());
    assert_eq!(
        report.vmap_materialized.len(),
        1,
        "{:?}",
        report.vmap_materialized
    );
    let record = &report.vmap_materialized[0];
    assert!(record.value.contains("low_rank"), "{record:?}");
    assert!(record.reason.contains("differ per example"), "{record:?}");
    let w = LowRank {
        base: normal(64, &[6, 5]),
        a: normal(65, &[6, 2]),
        b: normal(66, &[2, 5]),
    };
    let shared = compile(vmap(move |x: Array| x.matmul(&w.array())));
    shared.call(&normal(67, &[3, 6])).unwrap();
    assert!(shared.cache().reports[0].vmap_materialized.is_empty());
}

#[test]
fn in_and_out_axes_choose_subtrees_and_positions() {
    #[derive(Tree, Clone)]
    struct Layer {
        w: Array,
        b: Array,
    }
    let layer = Layer {
        w: normal(70, &[4, 3]),
        b: normal(71, &[3]),
    };
    let xs = normal(72, &[4, 5]); // batch along axis 1
    let f = vmap(|(l, x): (Layer, Array)| (x.matmul(&l.w) + &l.b, l.b.sum_all()))
        .in_axes([("args[0]", None), ("args[1]", Some(-1))])
        .out_axes([("out[0]", Some(1)), ("out[1]", None)]);
    let (ys, shared) = f.call(&(layer.clone(), xs.clone())).unwrap();
    let want = (xs.transpose().matmul(&layer.w) + &layer.b).transpose();
    close(&ys, &want, 1e-6, 1e-6);
    close(&shared, &layer.b.sum_all(), 0.0, 0.0);
    // An output that differs per example cannot be shared.
    let err = vmap(|x: Array| x.exp())
        .out_axes([("out", None)])
        .call(&xs)
        .unwrap_err()
        .to_string();
    assert!(err.contains("out") && err.contains("differs"), "{err}");
}

#[test]
fn mismatched_batch_sizes_name_both_leaf_paths_and_sizes() {
    let err = vmap(|(a, b): (Array, Array)| &a + &b)
        .call(&(normal(80, &[3, 2]), normal(81, &[4, 2])))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("args[0]")
            && err.contains("args[1]")
            && err.contains('3')
            && err.contains('4'),
        "{err}"
    );
    let err = vmap(|a: Array| a)
        .in_axes([("args", Some(2))])
        .call(&normal(82, &[3, 2]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("axis 2") && err.contains("f32[3,2]"), "{err}");
    let err = vmap(|a: Array| a)
        .in_axes([("args.nothing", None)])
        .call(&normal(83, &[3]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("args.nothing"), "{err}");
}

#[derive(Tree, Clone)]
struct Mlp {
    layers: Vec<(Array, Array)>,
}

fn mlp(seed: u64, width: usize, depth: usize) -> Mlp {
    Mlp {
        layers: (0..depth)
            .map(|i| {
                (
                    normal(seed + 2 * i as u64, &[width, width]) * 0.1,
                    normal(seed + 2 * i as u64 + 1, &[width]) * 0.1,
                )
            })
            .collect(),
    }
}

fn forward(p: &Mlp, x: &Array) -> Array {
    p.layers
        .iter()
        .fold(x.clone(), |h, (w, b)| (h.matmul(w) + b).tanh())
}

fn matmuls(report: &kiln::Report) -> usize {
    report
        .nodes
        .iter()
        .filter(|n| n.op.starts_with("matmul"))
        .count()
}

#[test]
fn a_vmapped_mlp_has_the_hand_batched_programs_matmuls() {
    let p = mlp(90, 8, 4);
    let xs = normal(99, &[16, 8]);
    let per_example =
        compile(vmap(|(p, x): (Mlp, Array)| forward(&p, &x)).in_axes([("args[0]", None)]));
    let hand = compile(|(p, x): (Mlp, Array)| forward(&p, &x));
    let got = per_example.call(&(p.clone(), xs.clone())).unwrap();
    close(
        &got,
        &hand.call(&(p.clone(), xs.clone())).unwrap(),
        1e-6,
        1e-6,
    );
    let (v, h) = (
        per_example.cache().reports[0].clone(),
        hand.cache().reports[0].clone(),
    );
    assert_eq!(matmuls(&v), 4);
    assert_eq!(matmuls(&v), matmuls(&h));
}

#[test]
fn per_example_gradients_are_one_cache_entry() {
    let p = mlp(100, 4, 2);
    let xs = normal(110, &[5, 4]);
    let loss = |(p, x): (Mlp, Array)| {
        let y = forward(&p, &x);
        (&y * &y).sum_all()
    };
    let per_example = compile(vmap(grad(loss).wrt(["args[0]"])).in_axes([("args[0]", None)]));
    let got = per_example.call(&(p.clone(), xs.clone())).unwrap();
    per_example.call(&(p.clone(), xs.clone())).unwrap();
    assert_eq!(
        (per_example.cache().hits, per_example.cache().misses),
        (1, 1)
    );
    for k in 0..5 {
        let (want, _) = grad(loss)
            .wrt(["args[0]"])
            .call(&(p.clone(), example(&xs, 0, k)))
            .unwrap();
        for ((gw, gb), (ww, wb)) in got.0.layers.iter().zip(&want.layers) {
            close(&example(gw, 0, k), ww, 1e-6, 1e-5);
            close(&example(gb, 0, k), wb, 1e-6, 1e-5);
        }
    }
}

#[test]
fn vmap_composes_with_jvp_compiled_functions_and_shapeless_batches() {
    // vmap of a compiled function.
    let inner = compile(|x: Array| x.sin() * 2.0);
    let xs = normal(120, &[3, 4]);
    close(
        &vmap(|x: Array| inner.call(&x).unwrap()).call(&xs).unwrap(),
        &(xs.sin() * 2.0),
        1e-6,
        1e-6,
    );
    // jvp of vmap and vmap of jvp agree.
    let vs = normal(121, &[3, 4]);
    let (_, a) = jvp(
        |x: Array| vmap(|x: Array| nn::softmax(&x, -1)).call(&x).unwrap(),
        &xs,
        &vs,
    )
    .unwrap();
    let b = vmap(|(x, v): (Array, Array)| jvp(|x: Array| nn::softmax(&x, -1), &x, &v).unwrap().1)
        .call(&(xs.clone(), vs.clone()))
        .unwrap();
    close(&a, &b, 1e-6, 1e-5);
    // A symbolic batch: one trace for every batch size.
    let f = compile(vmap(|x: Array| nn::softmax(&x, -1).sum(&[0], false))).shapeless();
    for n in [2usize, 5, 9] {
        let xs = normal(130 + n as u64, &[n, 3, 4]);
        let want = stack(
            &(0..n)
                .map(|k| nn::softmax(&example(&xs, 0, k), -1).sum(&[0], false))
                .collect::<Vec<_>>(),
            0,
        );
        close(&f.call(&xs).unwrap(), &want, 1e-6, 1e-5);
    }
    assert_eq!(f.cache().misses, 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(24)))]

    #[test]
    fn vmap_equals_stacking_the_function_on_each_example(
        program in prop::collection::vec(instr(), 1..8),
        seed in 0u64..1000,
        in_axes in prop::collection::vec(prop::option::weighted(0.8, 0usize..3), 4),
        out_axes in prop::collection::vec(0usize..3, 2),
    ) {
        let program = Arc::new(program);
        let f = {
            let program = program.clone();
            move |xs: Vec<Array>| run(&program, xs)
        };
        let n = 3usize;
        let examples: Vec<Vec<Array>> = (0..n).map(|k| make_inputs(3, seed + k as u64, DType::F32)).collect();
        // Each input batched along its chosen axis, or shared (example 0's).
        let batch_axes: Vec<Option<usize>> = in_axes
            .iter()
            .zip(&examples[0])
            .map(|(a, x)| a.map(|a| a.min(x.ndim())))
            .collect();
        let mut any = batch_axes.iter().any(Option::is_some);
        let batch_axes: Vec<Option<usize>> = batch_axes
            .into_iter()
            .map(|a| if any { a } else { any = true; Some(0) })
            .collect();
        let args: Vec<Array> = batch_axes
            .iter()
            .enumerate()
            .map(|(i, a)| match a {
                Some(a) => stack(&examples.iter().map(|e| e[i].clone()).collect::<Vec<_>>(), *a),
                None => examples[0][i].clone(),
            })
            .collect();
        let per_example: Vec<Vec<Array>> = (0..n)
            .map(|k| {
                let inputs = batch_axes.iter().enumerate().map(|(i, a)| if a.is_some() { examples[k][i].clone() } else { examples[0][i].clone() }).collect();
                f(inputs)
            })
            .collect();
        let in_spec: Vec<(String, Option<isize>)> = batch_axes.iter().enumerate().map(|(i, a)| (format!("args[{i}]"), a.map(|a| a as isize))).collect();
        let out_spec: Vec<(String, Option<isize>)> = per_example[0]
            .iter()
            .enumerate()
            .map(|(i, o)| (format!("out[{i}]"), Some(out_axes[i].min(o.ndim()) as isize)))
            .collect();
        let mapped = vmap(f.clone()).in_axes(in_spec.clone()).out_axes(out_spec.clone());
        let got = mapped.call(&args).unwrap();
        for (i, g) in got.iter().enumerate() {
            let axis = out_axes[i].min(per_example[0][i].ndim());
            let want = stack(&per_example.iter().map(|o| o[i].clone()).collect::<Vec<_>>(), axis);
            let check = compare_within(&g.data().unwrap(), &want.data().unwrap(), 1e-5, 1e-4);
            prop_assert!(check.is_ok(), "output {}: {:?}", i, check);
        }
        if let Some(gpu) = kiln_tests::gpu::backend() {
            let on_gpu = compile(vmap(f).in_axes(in_spec).out_axes(out_spec)).with_backend(gpu).call(&args).unwrap();
            for (g, c) in on_gpu.iter().zip(&got) {
                let check = compare_within(&g.data().unwrap(), &c.data().unwrap(), 1e-4, 1e-3);
                prop_assert!(check.is_ok(), "{:?}", check);
            }
        }
    }
}
