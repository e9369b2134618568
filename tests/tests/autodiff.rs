//! Autodiff through compile: every differentiable op's vjp is checked
//! against central differences along random directions (as JAX's
//! `check_grads` does); gradients come back in the argument's tree type;
//! `grad` eager == compiled == compiled shapeless == wgpu on random
//! programs; errors name the leaf path, the shape or the op. Case count of
//! the property test: `KILN_CASES` (CI default 24).

use kiln::ops::matmul::error_bound;
use kiln::random::Key;
use kiln::{
    compile, grad, nn, stop_gradient, value_and_grad, vjp, Array, DType, Error, Op, SliceAxis,
    Tree, ValueKind,
};
use kiln_tests::conformance::compare_within;
use kiln_tests::programs::{cases, instr, make_inputs, run};
use proptest::prelude::*;
use std::sync::Arc;

/// A scalar function of a list of arrays, as the checks write them.
type Loss = fn(Vec<Array>) -> Array;

fn normal(seed: u64, shape: &[usize]) -> Array {
    Array::random_normal(Key::new(seed), shape, DType::F32).unwrap()
}

/// Values in `[low, high)`, for functions defined on part of the line.
fn uniform(seed: u64, shape: &[usize], low: f64, high: f64) -> Array {
    Array::random_uniform(Key::new(seed), shape, low, high, DType::F32).unwrap()
}

fn values(a: &Array) -> Vec<f64> {
    a.data().unwrap().to_f64_vec()
}

/// `Σ a·b` over all elements of two lists of arrays.
fn dot(a: &[Array], b: &[Array]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            values(x)
                .iter()
                .zip(values(y))
                .map(|(p, q)| p * q)
                .sum::<f64>()
        })
        .sum()
}

/// Checks `grad(loss)` at `xs` against the central difference of `loss`
/// along three random directions: `⟨∇f, v⟩ ≈ (f(x+εv) − f(x−εv)) / 2ε`.
/// The function is evaluated in f32 (Kiln's widest float), so ε and the
/// tolerance are set for f32 rounding.
fn check_grads(name: &str, loss: Loss, xs: Vec<Array>) {
    let g = grad(loss)
        .call(&xs)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(g.len(), xs.len(), "{name}");
    for (x, gx) in xs.iter().zip(&g) {
        assert_eq!(
            x.aval(),
            gx.aval(),
            "{name}: the gradient has its leaf's aval"
        );
    }
    let f = |xs: &[Array]| -> f64 {
        f64::from(
            loss(xs.to_vec())
                .item::<f32>()
                .unwrap_or_else(|e| panic!("{name}: {e}")),
        )
    };
    let eps = 1e-2;
    for k in 0..3u64 {
        let v: Vec<Array> = xs
            .iter()
            .enumerate()
            .map(|(i, x)| normal(1000 + 17 * k + i as u64, &x.dims().unwrap()))
            .collect();
        let moved = |sign: f32| -> Vec<Array> {
            xs.iter()
                .zip(&v)
                .map(|(x, d)| x + &(d * (sign * eps)))
                .collect()
        };
        let numeric = (f(&moved(1.0)) - f(&moved(-1.0))) / (2.0 * f64::from(eps));
        let analytic = dot(&g, &v);
        let scale = 1.0 + numeric.abs().max(analytic.abs());
        assert!(
            (numeric - analytic).abs() <= 2e-2 * scale,
            "{name}: direction {k}: numeric {numeric} vs analytic {analytic}"
        );
    }
}

#[test]
fn unary_vjps_match_central_differences() {
    let anywhere = || vec![normal(1, &[2, 3])];
    let positive = || vec![uniform(2, &[2, 3], 0.5, 2.0)];
    let away_from_kinks =
        || vec![uniform(3, &[5], 0.3, 1.5) * normal(4, &[5]).greater(0.0).select(1.0, -1.0)];
    check_grads("neg", |x| x[0].neg().sum_all(), anywhere());
    check_grads("abs", |x| x[0].abs().sum_all(), away_from_kinks());
    check_grads("exp", |x| x[0].exp().sum_all(), anywhere());
    check_grads("log", |x| x[0].log().sum_all(), positive());
    check_grads("sin", |x| x[0].sin().sum_all(), anywhere());
    check_grads("cos", |x| x[0].cos().sum_all(), anywhere());
    check_grads("tanh", |x| x[0].tanh().sum_all(), anywhere());
    check_grads("sqrt", |x| x[0].sqrt().sum_all(), positive());
    check_grads("rsqrt", |x| x[0].rsqrt().sum_all(), positive());
    check_grads("sigmoid", |x| x[0].sigmoid().sum_all(), anywhere());
    check_grads("relu", |x| x[0].relu().sum_all(), away_from_kinks());
    check_grads("erf", |x| x[0].erf().sum_all(), anywhere());
}

#[test]
fn binary_vjps_sum_over_broadcast_axes() {
    let pair = |a: &[usize], b: &[usize]| vec![normal(5, a), normal(6, b)];
    check_grads("add", |x| (&x[0] + &x[1]).sum_all(), pair(&[2, 3], &[3]));
    check_grads("sub", |x| (&x[0] - &x[1]).sum_all(), pair(&[2, 1], &[1, 3]));
    check_grads(
        "mul",
        |x| (&x[0] * &x[1]).sum_all(),
        pair(&[4, 2, 3], &[2, 1]),
    );
    check_grads(
        "div",
        |x| (&x[0] / &x[1]).sum_all(),
        vec![normal(7, &[2, 3]), uniform(8, &[3], 0.5, 2.0)],
    );
    check_grads(
        "pow",
        |x| x[0].pow(&x[1]).sum_all(),
        vec![uniform(9, &[2, 3], 0.5, 2.0), normal(10, &[2, 3])],
    );
    // Operands at least 0.4 apart, so the differences never cross a tie.
    let apart = |a: &[usize], b: &[usize]| {
        let sign = normal(43, a).greater(0.0).select(1.0, -1.0);
        vec![uniform(44, a, 0.5, 1.5) * sign, uniform(45, b, -0.1, 0.1)]
    };
    check_grads(
        "maximum",
        |x| x[0].maximum(&x[1]).sum_all(),
        apart(&[3, 4], &[4]),
    );
    check_grads(
        "minimum",
        |x| x[0].minimum(&x[1]).sum_all(),
        apart(&[3, 1], &[3, 4]),
    );
    check_grads(
        "where",
        |x| x[0].greater(0.0).select(&x[1], &x[0] * 3.0).sum_all(),
        pair(&[2, 3], &[3]),
    );
}

#[test]
fn reduction_and_matmul_vjps_match_central_differences() {
    check_grads(
        "sum over two axes",
        |x| (x[0].sum(&[0, 2], false) * 2.0).sum_all(),
        vec![normal(11, &[2, 3, 4])],
    );
    check_grads(
        "max",
        |x| x[0].max(&[-1], true).sum_all(),
        vec![normal(12, &[3, 5])],
    );
    check_grads(
        "min",
        |x| x[0].min(&[0], false).sum_all(),
        vec![normal(13, &[3, 5])],
    );
    check_grads(
        "mean",
        |x| (x[0].mean(&[1], false) * x[0].mean(&[1], false)).sum_all(),
        vec![normal(14, &[3, 5])],
    );
    check_grads(
        "batched matmul",
        |x| x[0].matmul(&x[1]).tanh().sum_all(),
        vec![normal(15, &[1, 3, 4]), normal(16, &[2, 4, 5])],
    );
    check_grads(
        "matrix-vector",
        |x| x[0].matmul(&x[1]).sum_all(),
        vec![normal(17, &[3, 4]), normal(18, &[4])],
    );
}

#[test]
fn take_along_axis_and_triangle_vjps_match_central_differences() {
    check_grads(
        "take_along_axis",
        |x| {
            let targets = Array::from_vec(vec![3i32, 0, -1, 2, 2, 1], &[3, 2]).unwrap();
            (x[0].take_along_axis(&targets, -1) * normal(40, &[3, 2])).sum_all()
        },
        vec![normal(41, &[3, 4])],
    );
    check_grads(
        "tril",
        |x| (x[0].tril(-1) * normal(42, &[2, 3, 3])).sum_all(),
        vec![normal(43, &[2, 3, 3])],
    );
    check_grads(
        "triu",
        |x| (x[0].triu(1).exp()).sum_all(),
        vec![normal(44, &[3, 4])],
    );
}

#[test]
fn array_api_vjps_match_central_differences() {
    let spaced = |values: &[f32], shape: &[usize]| Array::from_vec(values.to_vec(), shape).unwrap();
    check_grads(
        "square",
        |x| x[0].square().sum_all(),
        vec![normal(50, &[2, 3])],
    );
    check_grads(
        "tan",
        |x| x[0].tan().sum_all(),
        vec![uniform(51, &[5], -1.0, 1.0)],
    );
    check_grads(
        "log1p",
        |x| (x[0].log1p() * normal(52, &[5])).sum_all(),
        vec![uniform(53, &[5], -0.5, 2.0)],
    );
    check_grads(
        "clip",
        |x| (x[0].clip(Some(-0.5), Some(0.5)) * normal(54, &[6])).sum_all(),
        vec![spaced(&[-1.0, -0.3, 0.2, 0.9, 0.45, -0.8], &[6])],
    );
    check_grads(
        "var and std",
        |x| x[0].var(&[1], 1, false).sum_all() + x[0].std(&[0], 0, false).sum_all(),
        vec![normal(55, &[3, 4])],
    );
    check_grads(
        "logsumexp",
        |x| (x[0].logsumexp(&[1], false) * normal(56, &[3])).sum_all(),
        vec![normal(57, &[3, 4])],
    );
    check_grads(
        "prod",
        |x| x[0].prod(&[0, 1], false),
        vec![uniform(58, &[2, 3], 0.5, 1.5)],
    );
    check_grads(
        "cumsum",
        |x| (x[0].cumsum(1) * normal(59, &[2, 5])).sum_all(),
        vec![normal(60, &[2, 5])],
    );
    check_grads(
        "sort and top_k",
        |x| (x[0].sort(1) * normal(61, &[2, 4])).sum_all() + x[0].top_k(2).0.square().sum_all(),
        vec![spaced(
            &[0.3, -1.1, 2.2, 1.0, -0.4, 0.8, 1.9, -2.0],
            &[2, 4],
        )],
    );
    check_grads(
        "einsum",
        |x| (kiln::einsum("bij,jk->bki", &[&x[0], &x[1]]) * normal(62, &[2, 4, 3])).sum_all(),
        vec![normal(63, &[2, 3, 5]), normal(64, &[5, 4])],
    );
    check_grads(
        "stack, split, tile, repeat, pad",
        |x| {
            let parts = x[0].split(2, 1).unwrap();
            let joined = kiln::stack(&parts, 0).tile(&[1, 2, 1]).repeat(2, 2);
            (joined.pad(&[(0, 1), (1, 0), (2, 0)], 0.5).flatten().exp()).sum_all()
        },
        vec![normal(65, &[3, 4])],
    );
}

#[test]
fn layout_and_index_vjps_match_central_differences() {
    check_grads(
        "reshape",
        |x| {
            (x[0].reshape(&[3, 2])
                * Array::arange(0.0, 6.0, 1.0, DType::F32)
                    .unwrap()
                    .reshape(&[3, 2]))
            .sum_all()
        },
        vec![normal(19, &[2, 3])],
    );
    check_grads(
        "permute",
        |x| (x[0].permute(&[2, 0, 1]).exp()).sum_all(),
        vec![normal(20, &[2, 3, 4])],
    );
    check_grads(
        "broadcast_to",
        |x| (x[0].broadcast_to([4, 2, 3]) * normal(21, &[4, 2, 3])).sum_all(),
        vec![normal(22, &[2, 1])],
    );
    check_grads(
        "strided slice",
        |x| {
            x[0].slice(&[
                SliceAxis {
                    start: 1,
                    stop: None,
                    step: 2,
                },
                SliceAxis {
                    start: 0,
                    stop: Some(3),
                    step: 2,
                },
            ])
            .exp()
            .sum_all()
        },
        vec![normal(23, &[5, 4])],
    );
    check_grads(
        "concat",
        |x| (kiln::concat(&[x[0].clone(), x[1].exp()], 1) * normal(24, &[2, 5])).sum_all(),
        vec![normal(25, &[2, 2]), normal(26, &[2, 3])],
    );
    check_grads(
        "take with repeated indices",
        |x| {
            (x[0]
                .take(&Array::from_vec(vec![2i32, 0, 2, -1], &[2, 2]).unwrap(), 0)
                .exp())
            .sum_all()
        },
        vec![normal(27, &[3, 2])],
    );
    check_grads(
        "size-0 dims",
        |x| x[0].sum_all() + x[1].exp().sum_all(),
        vec![normal(28, &[0, 3]), normal(29, &[2])],
    );
}

#[test]
fn nn_compositions_differentiate_by_composition() {
    check_grads(
        "softmax",
        |x| (nn::softmax(&x[0], -1) * normal(30, &[2, 4])).sum_all(),
        vec![normal(31, &[2, 4])],
    );
    check_grads(
        "log_softmax",
        |x| nn::log_softmax(&x[0], -1).sum_all(),
        vec![normal(32, &[2, 4])],
    );
    check_grads(
        "gelu",
        |x| nn::gelu(&x[0]).sum_all(),
        vec![normal(33, &[6])],
    );
    check_grads(
        "gelu_tanh",
        |x| nn::gelu_tanh(&x[0]).sum_all(),
        vec![normal(34, &[6])],
    );
    check_grads(
        "layer_norm",
        |x| (nn::layer_norm(&x[0], Some(&x[1]), Some(&x[2]), 1e-5) * normal(35, &[3, 4])).sum_all(),
        vec![normal(36, &[3, 4]), normal(37, &[4]), normal(38, &[4])],
    );
}

#[derive(Tree, Clone, Debug)]
struct Dense {
    w: Array,
    b: Array,
    #[tree(static)]
    name: String,
}

fn dense_loss((p, x): (Dense, Array)) -> Array {
    let y = x.matmul(&p.w) + &p.b;
    (&y * &y).mean_all()
}

fn dense() -> (Dense, Array) {
    (
        Dense {
            w: normal(40, &[3, 2]),
            b: normal(41, &[2]),
            name: "layer".into(),
        },
        normal(42, &[4, 3]),
    )
}

#[test]
fn gradients_come_back_in_the_arguments_own_tree_type() {
    let (params, x) = dense();
    let (g, gx) = grad(dense_loss).call(&(params.clone(), x.clone())).unwrap();
    assert_eq!(g.name, "layer");
    assert_eq!(g.w.dims(), Some(vec![3, 2]));
    // d/db mean(y²) = 2·mean over rows of y.
    let y = x.matmul(&params.w) + &params.b;
    let want = (&y * 2.0).sum(&[0], false) / 8.0;
    compare_within(&g.b.data().unwrap(), &want.data().unwrap(), 1e-6, 1e-5).unwrap();
    assert_eq!(gx.dims(), Some(vec![4, 3]));
}

#[test]
fn wrt_selects_subtrees_and_other_leaves_get_zeros() {
    let (params, x) = dense();
    let (g, gx) = grad(dense_loss)
        .wrt(["args[0].w"])
        .call(&(params, x))
        .unwrap();
    assert!(values(&g.w).iter().any(|v| *v != 0.0));
    assert!(values(&g.b).iter().all(|v| *v == 0.0));
    assert!(values(&gx).iter().all(|v| *v == 0.0));
    let err = grad(dense_loss)
        .wrt(["args.nothing"])
        .call(&dense())
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("no argument leaf at `args.nothing`"),
        "{err}"
    );
}

#[test]
fn value_and_grad_with_aux_returns_the_loss_the_aux_and_the_gradient() {
    let f = value_and_grad(|x: Array| {
        let loss = (&x * &x).sum_all();
        (loss, x.max(&[0], false))
    })
    .has_aux();
    let x = Array::from_vec(vec![1.0f32, -3.0], &[2]).unwrap();
    let ((loss, aux), g) = f.call(&x).unwrap();
    assert_eq!(loss.item::<f32>().unwrap(), 10.0);
    assert_eq!(aux.item::<f32>().unwrap(), 1.0);
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![2.0, -6.0]);
}

/// `mean(x²)` of a vector; a matrix is refused with an explicit `Err`.
fn vector_loss(x: Array) -> kiln::Result<Array> {
    if x.ndim() != 1 {
        return Err(Error::InvalidArgument {
            op: "vector_loss".into(),
            detail: "takes a vector".into(),
            at: None,
        });
    }
    Ok((&x * &x).mean_all())
}

#[test]
fn grad_of_a_function_returning_ok_differentiates_its_loss() {
    let x = Array::from_vec(vec![1.0f32, -3.0], &[2]).unwrap();
    let g = grad(vector_loss).call(&x).unwrap();
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![1.0, -3.0]);
    let (loss, g) = compile(value_and_grad(vector_loss)).call(&x).unwrap();
    assert_eq!(loss.item::<f32>().unwrap(), 5.0);
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![1.0, -3.0]);
    let with_aux = value_and_grad(|x: Array| -> kiln::Result<(Array, Array)> {
        Ok((vector_loss(x.clone())?, x.max(&[0], false)))
    })
    .has_aux();
    let ((loss, aux), _) = with_aux.call(&x).unwrap();
    assert_eq!(
        (loss.item::<f32>().unwrap(), aux.item::<f32>().unwrap()),
        (5.0, 1.0)
    );
}

#[test]
fn grad_of_a_function_returning_err_is_that_error_and_its_cache_stays_usable() {
    let matrix = Array::from_vec(vec![1.0f32; 4], &[2, 2]).unwrap();
    let want = vector_loss(matrix.clone()).unwrap_err();
    assert_eq!(grad(vector_loss).call(&matrix).unwrap_err(), want);
    let df = compile(grad(vector_loss));
    assert_eq!(df.call(&matrix).unwrap_err(), want);
    let g = df
        .call(&Array::from_vec(vec![2.0f32], &[1]).unwrap())
        .unwrap();
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![4.0]);
}

#[test]
fn vjp_of_a_function_returning_a_result_gives_its_value_or_its_error() {
    let x = Array::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    let (y, pullback) = vjp(vector_loss, &x).unwrap();
    assert_eq!(y.item::<f32>().unwrap(), 2.5);
    let g = pullback.call(&Array::scalar(1.0, DType::F32)).unwrap();
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
    let matrix = Array::from_vec(vec![1.0f32; 4], &[2, 2]).unwrap();
    let Err(Error::InvalidArgument { op, .. }) = vjp(vector_loss, &matrix) else {
        panic!("the function's error");
    };
    assert_eq!(op, "vector_loss");
}

#[test]
fn stop_gradient_blocks_the_gradient_but_not_the_value() {
    let f = value_and_grad(|x: Array| (x.exp() * stop_gradient(&x.exp())).sum_all());
    let (value, g) = f
        .call(&Array::from_vec(vec![0.0f32, 1.0], &[2]).unwrap())
        .unwrap();
    assert!((value.item::<f32>().unwrap() - (1.0 + 1f32.exp().powi(2))).abs() < 1e-4);
    let g = g.to_vec::<f32>().unwrap();
    assert!(
        (g[0] - 1.0).abs() < 1e-6 && (g[1] - 1f32.exp().powi(2)).abs() < 1e-4,
        "{g:?}"
    );
}

#[test]
fn compiled_grad_is_one_cache_entry_and_matches_eager() {
    let df = compile(value_and_grad(dense_loss));
    let args = dense();
    let (loss, (g, _)) = df.call(&args).unwrap();
    let (eager_loss, (eager_g, _)) = value_and_grad(dense_loss).call(&args).unwrap();
    assert_eq!(
        loss.item::<f32>().unwrap(),
        eager_loss.item::<f32>().unwrap()
    );
    assert_eq!(values(&g.w), values(&eager_g.w));
    df.call(&args).unwrap();
    let cache = df.cache();
    assert_eq!((cache.entries, cache.hits, cache.misses), (1, 1, 1));
    // The backward graph is planned and verified like any graph.
    let report = &cache.reports[0];
    assert!(report.plan.memory.peak_bytes >= report.plan.memory.lower_bound_bytes);
}

/// One layer of [`mlp4_loss`]: weight `[width, width]`, bias `[width]`.
type Layer = (Array, Array);

/// Mean squared error of a 4-layer tanh MLP, as the `grad_mlp4_cached`
/// benchmark computes it.
fn mlp4_loss((layers, x, y): (Vec<Layer>, Array, Array)) -> Array {
    let out = layers.iter().fold(x, |h, (w, b)| (h.matmul(w) + b).tanh());
    let error = out - &y;
    (&error * &error).mean_all()
}

fn mlp4_arguments(batch: usize, width: usize) -> (Vec<Layer>, Array, Array) {
    let layers = (0..4)
        .map(|i| {
            (
                normal(i, &[width, width]) * 0.3,
                normal(i + 4, &[width]) * 0.1,
            )
        })
        .collect();
    (
        layers,
        normal(10, &[batch, width]),
        normal(11, &[batch, width]),
    )
}

#[test]
fn the_mlp_grad_step_reads_every_transpose_in_place() {
    let step = compile(value_and_grad(mlp4_loss).wrt(["args[0]"]));
    let args = mlp4_arguments(8, 16);
    let exe = step.executable(&args).unwrap();
    let mut products = Vec::new();
    for node in &exe.graph().nodes {
        match &node.kind {
            ValueKind::Op(Op::Permute(perm)) => panic!("a permute {perm:?} is materialized"),
            ValueKind::Op(op @ (Op::Matmul | Op::TransposedMatmul { .. })) => {
                products.push(op.describe())
            }
            _ => {}
        }
    }
    products.sort();
    // Four forward products; per layer hᵀ·g for the weight's gradient, and
    // g·wᵀ for the three layers whose input takes a gradient.
    let mut want = [
        vec!["matmul"; 4],
        vec!["matmul(a @ bᵀ)"; 3],
        vec!["matmul(aᵀ @ b)"; 4],
    ]
    .concat();
    want.sort();
    assert_eq!(products, want);
    let (loss, (grads, _, _)) = step.call(&args).unwrap();
    let record = step.cache().reports[0]
        .passes
        .iter()
        .find(|p| p.pass == "transposed_operands")
        .cloned();
    assert_eq!(record.map(|r| r.changed), Some(7));
    // Eager evaluation on the CPU reads the transposes in place too: the
    // same products, the same bits.
    let (eager_loss, (eager_grads, _, _)) = value_and_grad(mlp4_loss)
        .wrt(["args[0]"])
        .call(&args)
        .unwrap();
    let close =
        |a: &Array, b: &Array| compare_within(&a.data().unwrap(), &b.data().unwrap(), 0.0, 0.0);
    close(&loss, &eager_loss).unwrap();
    for ((w, b), (eager_w, eager_b)) in grads.iter().zip(&eager_grads) {
        close(w, eager_w).unwrap();
        close(b, eager_b).unwrap();
    }
}

#[test]
fn the_mlp_grad_step_on_wgpu_reads_every_transpose_in_place_and_matches_the_cpu() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let args = mlp4_arguments(8, 16);
    let step = compile(value_and_grad(mlp4_loss).wrt(["args[0]"])).with_backend(gpu);
    let exe = step.executable(&args).unwrap();
    let mut transposed = 0;
    for node in &exe.graph().nodes {
        match &node.kind {
            ValueKind::Op(Op::Permute(perm)) => panic!("a permute {perm:?} is materialized"),
            ValueKind::Op(Op::TransposedMatmul { .. }) => transposed += 1,
            _ => {}
        }
    }
    assert_eq!(transposed, 7);
    let (loss, (grads, _, _)) = step.call(&args).unwrap();
    let (cpu_loss, (cpu_grads, _, _)) = compile(value_and_grad(mlp4_loss).wrt(["args[0]"]))
        .call(&args)
        .unwrap();
    // The GPU sums each product in k order, the CPU in its blocked order:
    // the last bits may differ.
    let close =
        |a: &Array, b: &Array| compare_within(&a.data().unwrap(), &b.data().unwrap(), 1e-5, 1e-4);
    close(&loss, &cpu_loss).unwrap();
    for ((w, b), (cpu_w, cpu_b)) in grads.iter().zip(&cpu_grads) {
        close(w, cpu_w).unwrap();
        close(b, cpu_b).unwrap();
    }
}

/// `got` against `a @ b` computed in f64 (a `[batch, m, k]`, b `[batch, k,
/// n]`, row-major), output by output within [`error_bound`].
fn check_product_against_f64(
    got: &[f64],
    a: &[f64],
    b: &[f64],
    (batch, m, k, n): (usize, usize, usize, usize),
) -> Result<(), String> {
    for e in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let (mut exact, mut abs_sum) = (0.0f64, 0.0f64);
                for p in 0..k {
                    let t = a[(e * m + i) * k + p] * b[(e * k + p) * n + j];
                    exact += t;
                    abs_sum += t.abs();
                }
                let g = got[(e * m + i) * n + j];
                if (g - exact).abs() > error_bound(k, abs_sum) {
                    return Err(format!("output ({e}, {i}, {j}): {g} vs {exact} (k = {k})"));
                }
            }
        }
    }
    Ok(())
}

/// The row-major transpose of each of `batch` `rows`×`cols` matrices.
fn transposed(x: &[f64], batch: usize, rows: usize, cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    for e in 0..batch {
        for r in 0..rows {
            for c in 0..cols {
                out[(e * cols + c) * rows + r] = x[(e * rows + r) * cols + c];
            }
        }
    }
    out
}

#[test]
fn grad_of_a_compiled_function_differentiates_through_it() {
    let inner = compile(|x: Array| x.sin() * 2.0);
    let g = grad(|x: Array| inner.call(&x).unwrap_or_else(|e| panic!("{e}")).sum_all())
        .call(&Array::from_vec(vec![0.0f32, 1.0], &[2]).unwrap())
        .unwrap();
    let want: Vec<f32> = [0.0f32, 1.0].iter().map(|x| 2.0 * x.cos()).collect();
    let got = g.to_vec::<f32>().unwrap();
    assert!(
        got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-6),
        "{got:?}"
    );
}

#[test]
fn a_shapeless_compiled_grad_does_not_retrace_for_a_new_batch() {
    let df = compile(grad(|x: Array| (x.tanh() * 3.0).mean_all())).shapeless();
    for batch in [2usize, 5, 9] {
        let x = normal(50 + batch as u64, &[batch, 3]);
        let g = df.call(&x).unwrap();
        let eager = grad(|x: Array| (x.tanh() * 3.0).mean_all())
            .call(&x)
            .unwrap();
        compare_within(&g.data().unwrap(), &eager.data().unwrap(), 1e-6, 1e-5).unwrap();
    }
    assert_eq!((df.cache().entries, df.cache().misses), (1, 1));
}

#[test]
fn a_donated_training_step_updates_parameters_and_the_loss_falls() {
    let step = compile(|(p, x): (Dense, Array)| -> kiln::Result<(Dense, Array)> {
        let (loss, (g, _)) = value_and_grad(dense_loss)
            .wrt(["args[0]"])
            .call(&(p.clone(), x))?;
        let update = |w: &Array, dw: &Array| w - &(dw * 0.1);
        Ok((
            Dense {
                w: update(&p.w, &g.w),
                b: update(&p.b, &g.b),
                name: p.name,
            },
            loss,
        ))
    })
    .donate(["args[0]"]);
    let (mut params, x) = dense();
    let mut losses = Vec::new();
    for _ in 0..20 {
        let (next, loss) = step.call_owned((params, x.clone())).unwrap();
        losses.push(loss.item::<f32>().unwrap());
        params = next;
    }
    assert!(losses[19] < 0.5 * losses[0], "{losses:?}");
    assert_eq!(step.cache().entries, 1);
}

#[test]
fn grad_of_an_integer_leaf_is_an_error_naming_its_path() {
    let f = grad(|(x, n): (Array, Array)| (&x * n.cast(DType::F32)).sum_all());
    let args = (
        normal(60, &[2]),
        Array::from_vec(vec![1i32, 2], &[2]).unwrap(),
    );
    let err = f.call(&args).unwrap_err();
    assert!(matches!(err, Error::DType { .. }), "{err}");
    assert!(err.to_string().contains("`args[1]`"), "{err}");
    let g = f.wrt(["args[0]"]).call(&args).unwrap();
    assert_eq!(g.0.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
}

#[test]
fn grad_of_a_non_scalar_output_is_an_error_naming_its_shape() {
    let err = grad(|x: Array| x.exp())
        .call(&normal(61, &[2, 3]))
        .unwrap_err();
    assert!(
        err.to_string().contains("scalar float loss") && err.to_string().contains("f32[2,3]"),
        "{err}"
    );
}

#[test]
fn a_pullback_checks_the_cotangent_structure_and_shapes() {
    let x = normal(62, &[3]);
    let (out, pullback) = vjp(|x: Array| (x.exp(), x.sum_all()), &x).unwrap();
    assert_eq!(out.0.dims(), Some(vec![3]));
    let g = pullback
        .call(&(
            Array::ones(&[3], DType::F32),
            Array::scalar(2.0, DType::F32),
        ))
        .unwrap();
    let want: Vec<f64> = values(&x).iter().map(|v| v.exp() + 2.0).collect();
    assert!(values(&g)
        .iter()
        .zip(&want)
        .all(|(a, b)| (a - b).abs() < 1e-4));
    let err = pullback
        .call(&(
            Array::ones(&[4], DType::F32),
            Array::scalar(2.0, DType::F32),
        ))
        .unwrap_err();
    assert!(
        err.to_string().contains("args[0]") && err.to_string().contains("f32[4]"),
        "{err}"
    );
    let (_, pullback) = vjp(|x: Array| vec![x.exp(), x.sin()], &x).unwrap();
    let err = pullback
        .call(&vec![Array::ones(&[3], DType::F32)])
        .unwrap_err();
    assert!(matches!(err, Error::Tree { .. }), "{err}");
    assert!(err.to_string().contains("structure"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(24)))]

    /// The backward pass's products `g @ wᵀ` and `xᵀ @ g`, compiled for the
    /// CPU, read the transposed operand in place (no permute is left) and
    /// stay within the per-k bound of an f64 product.
    #[test]
    fn transposed_operands_are_read_in_place_within_the_per_k_bound(
        batch in prop::sample::select(vec![0usize, 1, 3]),
        m in 1usize..40,
        k in 1usize..300,
        n in 1usize..40,
        seed in 0u64..1000,
    ) {
        // batch 0 stands for rank-2 operands.
        let lead = if batch == 0 { vec![] } else { vec![batch] };
        let mats = batch.max(1);
        let shape = |r: usize, c: usize| [lead.clone(), vec![r, c]].concat();
        let f = compile(|(x, w, g): (Array, Array, Array)| {
            (g.matmul(&w.swap_axes(-1, -2)), x.swap_axes(-1, -2).matmul(&g))
        });
        // g·wᵀ: g [m, n], w [k, n] → [m, k]; xᵀ·g: x [m, k], g [m, n] → [k, n].
        let (x, w, g) = (normal(seed, &shape(m, k)), normal(seed + 1, &shape(k, n)), normal(seed + 2, &shape(m, n)));
        let args = (x.clone(), w.clone(), g.clone());
        let exe = f.executable(&args).unwrap();
        prop_assert!(!exe.graph().nodes.iter().any(|node| matches!(node.kind, ValueKind::Op(Op::Permute(_)))));
        let (gw_t, x_t_g) = f.call(&args).unwrap();
        let (x, w, g) = (values(&x), values(&w), values(&g));
        let checked = check_product_against_f64(&values(&gw_t), &g, &transposed(&w, mats, k, n), (mats, m, n, k));
        prop_assert!(checked.is_ok(), "g @ wᵀ: {:?}", checked);
        let checked = check_product_against_f64(&values(&x_t_g), &transposed(&x, mats, m, k), &g, (mats, k, m, n));
        prop_assert!(checked.is_ok(), "xᵀ @ g: {:?}", checked);
    }


    #[test]
    fn grad_eager_compiled_shapeless_and_wgpu_agree_on_random_programs(
        program in prop::collection::vec(instr(), 1..8),
        seed in 0u64..1000,
    ) {
        let program = Arc::new(program);
        let loss = {
            let program = program.clone();
            move |xs: Vec<Array>| {
                run(&program, xs)
                    .iter()
                    .map(|o| (o * o).mean_all().cast(DType::F32))
                    .fold(Array::scalar(0.0, DType::F32), |acc, l| acc + l)
            }
        };
        let inputs = make_inputs(3, seed, DType::F32);
        let eager = grad(loss.clone()).call(&inputs).unwrap();
        let compiled = compile(grad(loss.clone())).call(&inputs).unwrap();
        let shapeless = compile(grad(loss.clone())).shapeless().call(&inputs).unwrap();
        for ((e, c), s) in eager.iter().zip(&compiled).zip(&shapeless) {
            let e = e.data().unwrap();
            prop_assert!(compare_within(&c.data().unwrap(), &e, 1e-5, 1e-4).is_ok());
            prop_assert!(compare_within(&s.data().unwrap(), &e, 1e-5, 1e-4).is_ok());
        }
        if let Some(gpu) = kiln_tests::gpu::backend() {
            let on_gpu = compile(grad(loss)).with_backend(gpu).call(&inputs).unwrap();
            for (g, e) in on_gpu.iter().zip(&eager) {
                let check = compare_within(&g.data().unwrap(), &e.data().unwrap(), 1e-4, 1e-3);
                prop_assert!(check.is_ok(), "{:?}", check);
            }
        }
    }
}

#[test]
fn ties_split_the_gradient_evenly() {
    let x = Array::from_vec(vec![1.0f32, 3.0, 3.0], &[3]).unwrap();
    let g = grad(|x: Array| x.max(&[0], false)).call(&x).unwrap();
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![0.0, 0.5, 0.5]);
    let (ga, gb) = grad(|(a, b): (Array, Array)| a.maximum(&b).sum_all())
        .call(&(
            x.clone(),
            Array::from_vec(vec![2.0f32, 3.0, 4.0], &[3]).unwrap(),
        ))
        .unwrap();
    assert_eq!(ga.to_vec::<f32>().unwrap(), vec![0.0, 0.5, 0.0]);
    assert_eq!(gb.to_vec::<f32>().unwrap(), vec![1.0, 0.5, 1.0]);
}

#[test]
fn conventions_at_the_kinks_of_abs_and_relu_are_zero() {
    let x = Array::from_vec(vec![-1.0f32, 0.0, 2.0], &[3]).unwrap();
    let g = grad(|x: Array| x.abs().sum_all() + x.relu().sum_all())
        .call(&x)
        .unwrap();
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![-1.0, 0.0, 2.0]);
}

#[test]
fn the_report_marks_the_backward_pass_and_the_residuals_it_reads() {
    let df = compile(value_and_grad(dense_loss)).fusion(false);
    df.call(&dense()).unwrap();
    let report = &df.cache().reports[0];
    let backward: Vec<&kiln::ReportNode> = report.nodes.iter().filter(|n| n.backward).collect();
    assert!(!backward.is_empty());
    // The loss is forward; the weights' gradient (the last output) is backward.
    assert!(!report.nodes[report.outputs[0]].backward);
    assert!(report.nodes[report.outputs[1]].backward);
    // d/dy mean(y²) reads y = x·w + b, saved from the forward pass.
    let y = report
        .residuals
        .iter()
        .find(|r| r.op == "add" && r.aval == "f32[4,2]")
        .unwrap_or_else(|| panic!("{:?}", report.residuals));
    assert_eq!(y.bytes, 32);
    assert!(!report.nodes[y.node].backward);
    assert!(report
        .nodes
        .iter()
        .any(|n| n.backward && n.inputs.contains(&y.node)));
    let total: usize = report.residuals.iter().map(|r| r.bytes).sum();
    assert_eq!(report.residual_bytes, total);
    let forward_only = compile(dense_loss);
    forward_only.call(&dense()).unwrap();
    let plain = &forward_only.cache().reports[0];
    assert!(plain.residuals.is_empty() && plain.nodes.iter().all(|n| !n.backward));
}

#[test]
fn f16_gradients_match_f32_within_f16_precision() {
    let loss = |x: Array| {
        ((x.tanh() * &x)
            .matmul(&x.transpose())
            .sum(&[1], false)
            .exp())
        .mean_all()
    };
    let x32 = uniform(70, &[3, 4], -0.5, 0.5);
    let g32 = grad(loss).call(&x32).unwrap();
    let g16 = grad(loss).call(&x32.cast(DType::F16)).unwrap();
    assert_eq!(g16.dtype(), DType::F16);
    compare_within(
        &g16.cast(DType::F32).data().unwrap(),
        &g32.data().unwrap(),
        2e-3,
        2e-2,
    )
    .unwrap();
}

#[test]
fn differentiating_through_an_op_without_a_vjp_is_an_error_naming_it() {
    // A user kernel has a shape rule and a reference evaluation, no vjp.
    let kernel = kiln_tests::doubling_kernel("twice").build().unwrap();
    let twice = move |x: &Array| kernel.call(&[x]);
    let x = normal(71, &[3]);
    assert_eq!(
        twice(&x).sum_all().item::<f32>().unwrap(),
        2.0 * x.sum_all().item::<f32>().unwrap()
    );
    let err = grad(move |x: Array| twice(&x).sum_all())
        .call(&x)
        .unwrap_err();
    assert!(
        err.to_string().contains("`twice`") && err.to_string().contains("no vjp"),
        "{err}"
    );
}
