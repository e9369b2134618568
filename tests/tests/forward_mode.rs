//! Forward mode through compile: every op family's jvp rule is checked
//! against central differences along random directions, and against
//! reverse mode (`⟨J·v, u⟩ = ⟨v, Jᵀ·u⟩`); `jvp` eager == compiled ==
//! shapeless == wgpu on random programs; `linearize`, `jacfwd`, `jacrev`
//! and `hessian` give the hand-derived values; errors name the leaf path or
//! the op. Case count of the property tests: `KILN_CASES` (CI default 24).

use kiln::implicit::{ImplicitArray, LowRank};
use kiln::ops::custom::CustomOp;
use kiln::random::Key;
use kiln::{
    compile, concat, dequantize, gather_qmm, grad, hessian, jacfwd, jacrev, jvp, linearize, nn,
    quantize, quantized_matmul, stop_gradient, vjp, Array, DType, QuantFormat, Quantized,
    SliceAxis,
};
use kiln_tests::conformance::compare_within;
use kiln_tests::programs::{cases, instr, make_inputs, run};
use proptest::prelude::*;
use std::sync::Arc;

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

fn directions(xs: &[Array], seed: u64) -> Vec<Array> {
    xs.iter()
        .enumerate()
        .map(|(i, x)| normal(seed + i as u64, &x.dims().unwrap()))
        .collect()
}

/// Checks `jvp(f)` at `xs` along three random directions against the
/// central difference `(f(x+εv) − f(x−εv)) / 2ε`, element by element, and
/// against reverse mode: `⟨J·v, u⟩ = ⟨v, Jᵀ·u⟩` for a random `u`. The
/// function is evaluated in f32, so ε and the tolerance are set for f32
/// rounding.
fn check_jvp(name: &str, f: impl Fn(Vec<Array>) -> Array, xs: Vec<Array>) {
    let eps = 1e-2f32;
    for k in 0..3u64 {
        let v = directions(&xs, 1000 + 17 * k);
        let (y, dy) = jvp(&f, &xs, &v).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            y.aval(),
            dy.aval(),
            "{name}: the tangent has the output's aval"
        );
        let moved = |sign: f32| -> Vec<f64> {
            let shifted: Vec<Array> = xs
                .iter()
                .zip(&v)
                .map(|(x, d)| x + &(d * (sign * eps)))
                .collect();
            values(&f(shifted))
        };
        let (up, down) = (moved(1.0), moved(-1.0));
        for (i, (analytic, (u, d))) in values(&dy).iter().zip(up.iter().zip(&down)).enumerate() {
            let numeric = (u - d) / (2.0 * f64::from(eps));
            let scale = 1.0 + numeric.abs().max(analytic.abs());
            assert!(
                (numeric - analytic).abs() <= 2e-2 * scale,
                "{name}: direction {k}, element {i}: numeric {numeric} vs jvp {analytic}"
            );
        }
        let u = normal(5000 + k, &y.dims().unwrap());
        let (_, pullback) = vjp(&f, &xs).unwrap();
        let back = pullback.call(&u).unwrap();
        let (forward, reverse) = (dot(&[dy], &[u]), dot(&v, &back));
        assert!(
            (forward - reverse).abs() <= 1e-4 * (1.0 + forward.abs()),
            "{name}: ⟨J·v, u⟩ = {forward} but ⟨v, Jᵀ·u⟩ = {reverse}"
        );
    }
}

#[test]
fn unary_jvps_match_central_differences() {
    let anywhere = || vec![normal(1, &[2, 3])];
    let positive = || vec![uniform(2, &[2, 3], 0.5, 3.0)];
    check_jvp("neg", |x| -&x[0], anywhere());
    check_jvp("abs", |x| x[0].abs(), positive());
    check_jvp("exp", |x| x[0].exp(), anywhere());
    check_jvp("log", |x| x[0].log(), positive());
    check_jvp("sin", |x| x[0].sin(), anywhere());
    check_jvp("cos", |x| x[0].cos(), anywhere());
    check_jvp("tanh", |x| x[0].tanh(), anywhere());
    check_jvp("sqrt", |x| x[0].sqrt(), positive());
    check_jvp("rsqrt", |x| x[0].rsqrt(), positive());
    check_jvp("sigmoid", |x| x[0].sigmoid(), anywhere());
    check_jvp("relu", |x| (&x[0] + 4.0).relu(), positive());
    check_jvp("erf", |x| x[0].erf(), anywhere());
}

#[test]
fn binary_jvps_broadcast_their_tangents_to_the_output() {
    let pair = || vec![normal(3, &[2, 3]), normal(4, &[1, 3])];
    let positive = || vec![uniform(5, &[2, 3], 0.5, 2.0), uniform(6, &[3], 0.5, 2.0)];
    check_jvp("add", |x| &x[0] + &x[1], pair());
    check_jvp("sub", |x| &x[1] - &x[0], pair());
    check_jvp("mul", |x| &x[0] * &x[1], pair());
    check_jvp("div", |x| &x[0] / &x[1], positive());
    check_jvp("pow", |x| x[0].pow(&x[1]), positive());
    check_jvp("maximum", |x| x[0].maximum(&x[1]), pair());
    check_jvp("minimum", |x| x[1].minimum(&x[0]), pair());
    // Only the broadcast operand has a tangent: it still fills the output.
    let x = normal(7, &[2, 3]);
    let (_, dy) = jvp(
        |b: Array| &x + &b,
        &normal(8, &[3]),
        &Array::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap(),
    )
    .unwrap();
    assert_eq!(
        dy.to_vec::<f32>().unwrap(),
        vec![1.0, 2.0, 3.0, 1.0, 2.0, 3.0]
    );
    // Comparisons have no tangent: zeros of their (bool) output.
    let (_, dy) = jvp(|x: Array| x.greater(0.0), &x, &x).unwrap();
    assert_eq!(dy.to_vec::<bool>().unwrap(), vec![false; 6]);
}

#[test]
fn select_cast_and_stop_gradient_jvps() {
    check_jvp(
        "where",
        |x| x[0].greater(0.0).select(&x[1], &x[2]),
        vec![normal(9, &[2, 3]), normal(10, &[3]), normal(11, &[2, 1])],
    );
    // A cast between floats casts the tangent; to an integer there is none.
    let x = normal(12, &[4]);
    let t = normal(13, &[4]);
    let (_, dy) = jvp(|x: Array| x.cast(DType::F16), &x, &t).unwrap();
    assert_eq!(
        dy.to_vec::<half::f16>().unwrap(),
        t.cast(DType::F16).to_vec::<half::f16>().unwrap()
    );
    let (_, dy) = jvp(|x: Array| x.cast(DType::I32), &x, &t).unwrap();
    assert_eq!(dy.to_vec::<i32>().unwrap(), vec![0; 4]);
    let x = Array::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    let (_, dy) = jvp(
        |x: Array| &x * stop_gradient(&x),
        &x,
        &Array::ones(&[2], DType::F32),
    )
    .unwrap();
    // d(x·c)/dx with c = x held constant: c.
    assert_eq!(dy.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
}

#[test]
fn reduction_and_matmul_jvps_match_central_differences() {
    check_jvp("sum", |x| x[0].sum(&[1], false), vec![normal(13, &[3, 4])]);
    check_jvp("mean", |x| x[0].mean(&[0], true), vec![normal(14, &[3, 4])]);
    check_jvp("max", |x| x[0].max(&[1], false), vec![normal(15, &[3, 4])]);
    check_jvp(
        "min",
        |x| x[0].min(&[0, 1], false),
        vec![normal(16, &[3, 4])],
    );
    check_jvp(
        "matmul",
        |x| x[0].matmul(&x[1]),
        vec![normal(17, &[2, 3, 4]), normal(18, &[4, 5])],
    );
    check_jvp(
        "dot",
        |x| x[0].matmul(&x[1]),
        vec![normal(19, &[4]), normal(20, &[4])],
    );
}

#[test]
fn a_maximum_over_ties_takes_the_mean_tangent_of_the_tied_elements() {
    let x = Array::from_vec(vec![1.0f32, 3.0, 3.0], &[3]).unwrap();
    let t = Array::from_vec(vec![5.0f32, 2.0, 4.0], &[3]).unwrap();
    let (_, dy) = jvp(|x: Array| x.max(&[0], false), &x, &t).unwrap();
    assert_eq!(dy.to_vec::<f32>().unwrap(), vec![3.0]);
}

#[test]
fn layout_and_index_jvps_apply_the_op_to_the_tangent() {
    check_jvp(
        "reshape",
        |x| x[0].reshape(&[3, 4]).exp(),
        vec![normal(21, &[2, 6])],
    );
    check_jvp(
        "permute",
        |x| x[0].permute(&[2, 0, 1]).sin(),
        vec![normal(22, &[2, 3, 4])],
    );
    check_jvp(
        "broadcast_to",
        |x| x[0].broadcast_to(vec![3, 4]).tanh(),
        vec![normal(23, &[4])],
    );
    check_jvp(
        "slice",
        |x| x[0].slice_axis(1, 1, Some(4), 2),
        vec![normal(24, &[3, 5])],
    );
    check_jvp(
        "concat",
        |x| concat(&[x[0].clone(), x[1].exp()], 0),
        vec![normal(25, &[2, 3]), normal(26, &[1, 3])],
    );
    check_jvp(
        "take",
        |x| {
            let idx = Array::from_vec(vec![2i32, 0, 2], &[3]).unwrap();
            x[0].take(&idx, 0)
        },
        vec![normal(27, &[4, 2])],
    );
    check_jvp(
        "scatter_add",
        |x| {
            let idx = Array::from_vec(vec![1i32, 1, 3], &[3]).unwrap();
            x[0].scatter_add(&idx, 0, 5)
        },
        vec![normal(28, &[3, 2])],
    );
    check_jvp(
        "pad_slice",
        |x| {
            let axes = [
                SliceAxis {
                    start: 1,
                    stop: None,
                    step: 2,
                },
                SliceAxis::full(),
            ];
            x[0].pad_slice(&axes, vec![5, 2])
        },
        vec![normal(29, &[2, 2])],
    );
    check_jvp(
        "softmax",
        |x| nn::softmax(&x[0], -1),
        vec![normal(30, &[2, 5])],
    );
    check_jvp(
        "layer_norm",
        |x| nn::layer_norm(&x[0], None, None, 1e-3),
        vec![normal(31, &[2, 5])],
    );
    // The index operand of take carries no tangent; only the values do.
    let x = normal(32, &[4]);
    let idx = Array::from_vec(vec![3i32, 1], &[2]).unwrap();
    let (_, dy) = jvp(
        |x: Array| x.take(&idx, 0),
        &x,
        &Array::arange(0.0, 4.0, 1.0, DType::F32).unwrap(),
    )
    .unwrap();
    assert_eq!(dy.to_vec::<f32>().unwrap(), vec![3.0, 1.0]);
}

/// Codes and scales (and biases) of a 4-bit weight, as constants.
fn quantized(seed: u64, shape: &[usize]) -> Quantized {
    let q = quantize(&normal(seed, shape), QuantFormat::affine(4, 32));
    for part in [&q.packed, &q.scales].into_iter().chain(q.biases.as_ref()) {
        part.eval().unwrap();
    }
    q
}

#[test]
fn quantized_product_jvps_cover_x_scales_and_biases() {
    // The weight's float parts are differentiated as arguments; the codes
    // stay constants (they are integers).
    fn weight(xs: &[Array], codes: &Array) -> Quantized {
        Quantized {
            packed: codes.clone(),
            scales: xs[1].clone(),
            biases: Some(xs[2].clone()),
            format: QuantFormat::affine(4, 32),
        }
    }
    let w = quantized(40, &[6, 64]);
    let codes = w.packed.clone();
    let args = vec![
        normal(41, &[3, 64]),
        w.scales.clone(),
        w.biases.clone().unwrap(),
    ];
    check_jvp(
        "dequantize",
        |x| dequantize(&codes, &x[1], Some(&x[2]), QuantFormat::affine(4, 32)),
        args.clone(),
    );
    check_jvp(
        "quantized_matmul",
        |x| quantized_matmul(&x[0], &weight(&x, &codes), true),
        args.clone(),
    );
    check_jvp(
        "quantized_matmul (x @ w)",
        |x| {
            quantized_matmul(
                &x[0].slice_axis(1, 0, Some(6), 1),
                &weight(&x, &codes),
                false,
            )
        },
        args.clone(),
    );
    check_jvp(
        "gather_qmm",
        |x| {
            let batch = |w: &Array| w.reshape(&[1, 6, -1]);
            let w = weight(&x, &codes);
            let w = Quantized {
                packed: batch(&w.packed),
                scales: batch(&w.scales),
                biases: w.biases.as_ref().map(batch),
                format: w.format,
            };
            let lhs = Array::from_vec(vec![0u32, 0], &[2]).unwrap();
            let rhs = Array::from_vec(vec![0u32, 0], &[2]).unwrap();
            gather_qmm(&x[0].expand_dims(0), &w, &lhs, &rhs, true)
        },
        args,
    );
}

#[test]
fn a_custom_op_uses_its_jvp_and_one_without_is_an_error_naming_it() {
    let cube = CustomOp::new("cube", |x: &Array| Ok(x * x * x))
        .with_jvp(|x: &Array, _out: &Array, t: &Array| Ok(x * x * 3.0 * t));
    let x = Array::from_vec(vec![1.0f32, -2.0], &[2]).unwrap();
    let (y, dy) = jvp(|x: Array| cube.call(&x), &x, &Array::ones(&[2], DType::F32)).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0, -8.0]);
    assert_eq!(dy.to_vec::<f32>().unwrap(), vec![3.0, 12.0]);

    let square = CustomOp::new("square_no_jvp", |x: &Array| Ok(x * x));
    let err = jvp(|x: Array| square.call(&x), &x, &x)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("square_no_jvp") && err.contains("no jvp"),
        "{err}"
    );

    let wrong = CustomOp::new("wrong_jvp", |x: &Array| Ok(x * 2.0))
        .with_jvp(|x: &Array, _out: &Array, _t: &Array| Ok(x.sum_all()));
    let err = jvp(|x: Array| wrong.call(&x), &x, &x)
        .unwrap_err()
        .to_string();
    assert!(err.contains("wrong_jvp") && err.contains("f32[]"), "{err}");
}

#[test]
fn a_kernel_has_no_jvp_and_says_so() {
    let kernel = kiln_tests::doubling_kernel("twice").build().unwrap();
    let x = normal(50, &[3]);
    let err = jvp(move |x: Array| kernel.call(&[&x]), &x, &x)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`twice`") && err.contains("no jvp"), "{err}");
}

#[test]
fn tangents_flow_through_an_implicit_arrays_materialization() {
    let x = normal(60, &[3, 6]);
    let w = LowRank {
        base: normal(61, &[6, 5]),
        a: normal(62, &[6, 2]),
        b: normal(63, &[2, 5]),
    };
    let t = LowRank {
        base: normal(64, &[6, 5]),
        a: normal(65, &[6, 2]),
        b: normal(66, &[2, 5]),
    };
    let implicit = {
        let x = x.clone();
        move |w: LowRank| x.matmul(&w.array()).tanh()
    };
    let dense = move |w: LowRank| x.matmul(&(&w.base + &w.a.matmul(&w.b))).tanh();
    let (_, got) = jvp(implicit, &w, &t).unwrap();
    let (_, want) = jvp(dense, &w, &t).unwrap();
    compare_within(&got.data().unwrap(), &want.data().unwrap(), 1e-5, 1e-4).unwrap();
    // Materialized explicitly, too.
    let (_, dy) = jvp(|w: LowRank| w.materialize().unwrap(), &w, &t).unwrap();
    let want = &t.base + &t.a.matmul(&w.b) + w.a.matmul(&t.b);
    compare_within(&dy.data().unwrap(), &want.data().unwrap(), 1e-5, 1e-4).unwrap();
}

#[test]
fn tangents_come_back_in_the_outputs_tree_type_and_integer_leaves_take_none() {
    let f = |(x, n): (Array, Array)| (x.exp(), (x.sin(), n.cast(DType::F32) * &x));
    let x = Array::from_vec(vec![0.0f32, 1.0], &[2]).unwrap();
    let n = Array::from_vec(vec![2i32, 3], &[2]).unwrap();
    let tx = Array::from_vec(vec![1.0f32, 1.0], &[2]).unwrap();
    let (_, (de, (ds, dm))) = jvp(f, &(x.clone(), n.clone()), &(tx, n.clone())).unwrap();
    assert_eq!(de.to_vec::<f32>().unwrap(), vec![1.0, std::f32::consts::E]);
    assert_eq!(ds.to_vec::<f32>().unwrap(), vec![1.0, 1f32.cos()]);
    // The integer leaf's tangent is ignored: d(n·x) = n·dx.
    assert_eq!(dm.to_vec::<f32>().unwrap(), vec![2.0, 3.0]);
}

#[test]
fn mismatched_tangents_are_errors_naming_the_leaf_path() {
    let x = (normal(70, &[2]), normal(71, &[3]));
    let err = jvp(
        |(a, b): (Array, Array)| a.sum_all() + b.sum_all(),
        &x,
        &(normal(72, &[2]), normal(73, &[4])),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("args[1]") && err.contains("f32[4]") && err.contains("f32[3]"),
        "{err}"
    );
    let err = jvp(
        |v: Vec<Array>| v[0].clone(),
        &vec![normal(74, &[2])],
        &vec![normal(74, &[2]), normal(75, &[2])],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("structure"), "{err}");
}

/// `x²`, refusing a matrix with an explicit `Err`.
fn square_of_vector(x: Array) -> kiln::Result<Array> {
    if x.ndim() != 1 {
        return Err(kiln::Error::InvalidArgument {
            op: "square_of_vector".into(),
            detail: "takes a vector".into(),
            at: None,
        });
    }
    Ok(&x * &x)
}

#[test]
fn jvp_and_linearize_of_a_function_returning_a_result_give_its_value_or_its_error() {
    let x = Array::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    let v = Array::from_vec(vec![1.0f32, 0.5], &[2]).unwrap();
    let (y, dy) = jvp(square_of_vector, &x, &v).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0, 4.0]);
    assert_eq!(dy.to_vec::<f32>().unwrap(), vec![2.0, 2.0]);
    let (y, tangent_map) = linearize(square_of_vector, &x).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0, 4.0]);
    assert_eq!(
        tangent_map.call(&v).unwrap().to_vec::<f32>().unwrap(),
        vec![2.0, 2.0]
    );
    let matrix = Array::from_vec(vec![1.0f32; 4], &[2, 2]).unwrap();
    let want = square_of_vector(matrix.clone()).unwrap_err();
    assert_eq!(jvp(square_of_vector, &matrix, &matrix).unwrap_err(), want);
    assert_eq!(linearize(square_of_vector, &matrix).err(), Some(want));
}

#[test]
fn compiled_jvp_is_one_cache_entry_and_composes_with_grad() {
    let f = |x: Array| (x.sin() * &x).sum_all();
    // Forward over reverse: a Hessian-vector product.
    let hvp = compile(move |(x, v): (Array, Array)| {
        jvp(move |x: Array| grad(f).call(&x), &x, &v).map(|(_, t)| t)
    });
    let x = Array::from_vec(vec![0.5f32, 1.0, 2.0], &[3]).unwrap();
    let v = Array::from_vec(vec![1.0f32, 0.0, -1.0], &[3]).unwrap();
    let got = hvp.call(&(x.clone(), v.clone())).unwrap();
    hvp.call(&(x.clone(), v.clone())).unwrap();
    assert_eq!((hvp.cache().hits, hvp.cache().misses), (1, 1));
    // d²/dx² (x sin x) = 2 cos x − x sin x, diagonal.
    let want: Vec<f32> = [0.5f32, 1.0, 2.0]
        .iter()
        .zip([1.0f32, 0.0, -1.0])
        .map(|(&x, v)| (2.0 * x.cos() - x * x.sin()) * v)
        .collect();
    compare_within(
        &got.data().unwrap(),
        &Array::from_vec(want, &[3]).unwrap().data().unwrap(),
        1e-5,
        1e-4,
    )
    .unwrap();
    // Reverse over forward: the gradient of a directional derivative.
    let g = grad(move |x: Array| jvp(f, &x, &Array::ones(&[3], DType::F32)).unwrap().1)
        .call(&x)
        .unwrap();
    let want: Vec<f32> = [0.5f32, 1.0, 2.0]
        .iter()
        .map(|&x| 2.0 * x.cos() - x * x.sin())
        .collect();
    compare_within(
        &g.data().unwrap(),
        &Array::from_vec(want, &[3]).unwrap().data().unwrap(),
        1e-5,
        1e-4,
    )
    .unwrap();
}

#[test]
fn a_shapeless_compiled_jvp_does_not_retrace_for_a_new_batch() {
    let f = compile(|(x, v): (Array, Array)| {
        jvp(|x: Array| nn::softmax(&x, -1), &x, &v).map(|(_, t)| t)
    })
    .shapeless();
    for batch in [2usize, 5, 9] {
        let (x, v) = (
            normal(batch as u64, &[batch, 4]),
            normal(100 + batch as u64, &[batch, 4]),
        );
        let got = f.call(&(x.clone(), v.clone())).unwrap();
        let (_, want) = jvp(|x: Array| nn::softmax(&x, -1), &x, &v).unwrap();
        compare_within(&got.data().unwrap(), &want.data().unwrap(), 1e-6, 1e-5).unwrap();
    }
    assert_eq!(f.cache().misses, 1);
}

#[test]
fn linearize_keeps_the_primal_work_and_runs_only_the_tangent_map() {
    let x = Array::from_vec(vec![0.0f32, 1.0, 2.0], &[3]).unwrap();
    let (y, tangent_map) = linearize(|x: Array| x.sin() * x.exp(), &x).unwrap();
    let want_y: Vec<f32> = [0.0f32, 1.0, 2.0]
        .iter()
        .map(|x| x.sin() * x.exp())
        .collect();
    compare_within(
        &y.data().unwrap(),
        &Array::from_vec(want_y, &[3]).unwrap().data().unwrap(),
        1e-6,
        1e-6,
    )
    .unwrap();
    for t in [vec![1.0f32, 0.0, 0.0], vec![0.5, -1.0, 2.0]] {
        let dt = Array::from_vec(t.clone(), &[3]).unwrap();
        let got = tangent_map.call(&dt).unwrap();
        let (_, want) = jvp(|x: Array| x.sin() * x.exp(), &x, &dt).unwrap();
        compare_within(&got.data().unwrap(), &want.data().unwrap(), 1e-6, 1e-6).unwrap();
    }
    let err = tangent_map.call(&normal(80, &[4])).unwrap_err().to_string();
    assert!(err.contains("f32[4]") && err.contains("f32[3]"), "{err}");
}

#[test]
fn jacobians_forward_and_reverse_agree_in_the_arguments_tree_type() {
    let f = |(a, b): (Array, Array)| (a.matmul(&b)).tanh();
    let args = (normal(90, &[2, 3]), normal(91, &[3, 2]));
    let (ja, jb) = jacfwd(f).call(&args).unwrap();
    let (ra, rb) = jacrev(f).call(&args).unwrap();
    assert_eq!(ja.dims().unwrap(), vec![2, 2, 2, 3]);
    assert_eq!(jb.dims().unwrap(), vec![2, 2, 3, 2]);
    compare_within(&ja.data().unwrap(), &ra.data().unwrap(), 1e-6, 1e-5).unwrap();
    compare_within(&jb.data().unwrap(), &rb.data().unwrap(), 1e-6, 1e-5).unwrap();
    // Entry [i, j, p, q] of ∂y/∂a is δ(i,p)·(1 − y²)[i, j]·b[q, j].
    let y = f(args.clone()).to_vec::<f32>().unwrap();
    let b = args.1.to_vec::<f32>().unwrap();
    let ja = ja.to_vec::<f32>().unwrap();
    for i in 0..2 {
        for j in 0..2 {
            for p in 0..2 {
                for q in 0..3 {
                    let want = if i == p {
                        (1.0 - y[i * 2 + j].powi(2)) * b[q * 2 + j]
                    } else {
                        0.0
                    };
                    let got = ja[((i * 2 + j) * 2 + p) * 3 + q];
                    assert!(
                        (got - want).abs() <= 1e-5,
                        "[{i},{j},{p},{q}]: {got} vs {want}"
                    );
                }
            }
        }
    }
    // Compiled: one entry.
    let compiled = compile(jacfwd(f));
    compiled.call(&args).unwrap();
    compiled.call(&args).unwrap();
    assert_eq!((compiled.cache().hits, compiled.cache().misses), (1, 1));
}

#[test]
fn a_jacobians_graph_does_not_grow_with_the_element_count() {
    let nodes = |n: usize| {
        let f = compile(jacfwd(|x: Array| x.sin() * x.sum_all()));
        f.call(&normal(n as u64, &[n])).unwrap();
        f.cache().reports[0].traced_nodes
    };
    assert_eq!(nodes(4), nodes(32));
}

#[test]
fn the_hessian_of_a_quadratic_form_is_a_plus_a_transposed() {
    let a = normal(95, &[4, 4]);
    let h = {
        let a = a.clone();
        hessian(move |x: Array| x.matmul(&a.matmul(&x)))
    }
    .call(&normal(96, &[4]))
    .unwrap();
    let want = &a + &a.transpose();
    assert_eq!(h.dims().unwrap(), vec![4, 4]);
    compare_within(&h.data().unwrap(), &want.data().unwrap(), 1e-5, 1e-5).unwrap();
}

/// Two leaves of different shapes, for Jacobians over a struct.
#[derive(kiln::Tree, Clone, Debug)]
struct Pair {
    a: Array,
    b: Array,
}

fn vector(values: &[f32]) -> Array {
    Array::from_vec(values.to_vec(), &[values.len()]).unwrap()
}

/// `got` has `dims` and exactly the values `want`.
fn exactly(name: &str, got: &Array, dims: &[usize], want: &[f32]) {
    assert_eq!(got.dims().unwrap(), dims, "{name}");
    compare_within(
        &got.data().unwrap(),
        &kiln::HostData::F32(want.to_vec()),
        1e-6,
        1e-6,
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"));
}

#[test]
fn a_tuple_outputs_jacobian_replaces_each_output_leaf_by_the_struct_argument() {
    // y1 = a·b (b broadcast), y2 = Σa²·b at a = [1, 2], b = [3].
    let f = |p: Pair| (&p.a * &p.b, (&p.a * &p.a).sum(&[0], true) * &p.b);
    let args = Pair {
        a: vector(&[1.0, 2.0]),
        b: vector(&[3.0]),
    };
    let forward = jacfwd(f).call(&args).unwrap();
    let reverse = jacrev(f).call(&args).unwrap();
    for (mode, (y1, y2)) in [("jacfwd", forward), ("jacrev", reverse)] {
        exactly(
            &format!("{mode} ∂y1/∂a"),
            &y1.a,
            &[2, 2],
            &[3.0, 0.0, 0.0, 3.0],
        );
        exactly(&format!("{mode} ∂y1/∂b"), &y1.b, &[2, 1], &[1.0, 2.0]);
        exactly(&format!("{mode} ∂y2/∂a"), &y2.a, &[1, 2], &[6.0, 12.0]);
        exactly(&format!("{mode} ∂y2/∂b"), &y2.b, &[1, 1], &[5.0]);
    }
}

#[test]
fn a_struct_outputs_jacobian_is_one_argument_tree_per_leaf() {
    // The output Pair { a: x², b: Σx } of x = [1, 2]: per leaf, ∂leaf/∂x.
    let f = |x: Array| Pair {
        a: &x * &x,
        b: x.sum(&[0], true),
    };
    let x = vector(&[1.0, 2.0]);
    for jacobian in [jacfwd(f).call(&x).unwrap(), jacrev(f).call(&x).unwrap()] {
        assert_eq!(jacobian.len(), 2);
        exactly("∂a/∂x", &jacobian[0], &[2, 2], &[2.0, 0.0, 0.0, 4.0]);
        exactly("∂b/∂x", &jacobian[1], &[1, 2], &[1.0, 1.0]);
    }
}

/// `Σx²·y + Σy³` at x = [1, 2], y = [3]: Hxx = 2y·I, Hxy = 2x, Hyx = 2xᵀ,
/// Hyy = 6y.
fn cubic(x: &Array, y: &Array) -> Array {
    (x * x * y).sum_all() + (y * y * y).sum_all()
}

#[test]
fn the_hessian_over_a_tuple_argument_is_a_tuple_of_tuples() {
    let args = (vector(&[1.0, 2.0]), vector(&[3.0]));
    let ((hxx, hxy), (hyx, hyy)) = hessian(|(x, y): (Array, Array)| cubic(&x, &y))
        .call(&args)
        .unwrap();
    exactly("Hxx", &hxx, &[2, 2], &[6.0, 0.0, 0.0, 6.0]);
    exactly("Hxy", &hxy, &[2, 1], &[2.0, 4.0]);
    exactly("Hyx", &hyx, &[1, 2], &[2.0, 4.0]);
    exactly("Hyy", &hyy, &[1, 1], &[18.0]);
}

#[test]
fn the_hessian_over_a_struct_argument_is_one_struct_per_leaf() {
    let args = Pair {
        a: vector(&[1.0, 2.0]),
        b: vector(&[3.0]),
    };
    let h = compile(hessian(|p: Pair| cubic(&p.a, &p.b)));
    let rows = h.call(&args).unwrap();
    assert_eq!(rows.len(), 2);
    exactly("Haa", &rows[0].a, &[2, 2], &[6.0, 0.0, 0.0, 6.0]);
    exactly("Hab", &rows[0].b, &[2, 1], &[2.0, 4.0]);
    exactly("Hba", &rows[1].a, &[1, 2], &[2.0, 4.0]);
    exactly("Hbb", &rows[1].b, &[1, 1], &[18.0]);
    h.call(&args).unwrap();
    assert_eq!((h.cache().hits, h.cache().misses), (1, 1));
}

#[test]
fn a_jacobian_of_an_integer_output_leaf_is_an_error_naming_it() {
    let err = jacfwd(|x: Array| (x.exp(), x.cast(DType::I32)))
        .call(&vector(&[1.0]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("output leaf [1]") && err.contains("i32"),
        "{err}"
    );
}

#[test]
fn a_jacobian_of_symbolic_shapes_is_an_error_naming_the_leaf() {
    let f = compile(|x: Array| jacfwd(|x: Array| x.exp()).call(&x)).shapeless();
    let err = f.call(&normal(97, &[3])).unwrap_err().to_string();
    assert!(err.contains("known shape"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(24)))]

    #[test]
    fn jvp_eager_compiled_shapeless_and_wgpu_agree_and_match_reverse_mode(
        program in prop::collection::vec(instr(), 1..8),
        seed in 0u64..1000,
    ) {
        let program = Arc::new(program);
        let f = {
            let program = program.clone();
            move |xs: Vec<Array>| run(&program, xs)
        };
        let inputs = make_inputs(3, seed, DType::F32);
        let tangents = make_inputs(3, seed + 7919, DType::F32);
        let (out, eager) = jvp(f.clone(), &inputs, &tangents).unwrap();
        let pushed = {
            let f = f.clone();
            move |(x, t): (Vec<Array>, Vec<Array>)| jvp(f.clone(), &x, &t).map(|(_, t)| t)
        };
        let args = (inputs.clone(), tangents.clone());
        let compiled = compile(pushed.clone()).call(&args).unwrap();
        let shapeless = compile(pushed.clone()).shapeless().call(&args).unwrap();
        for ((e, c), s) in eager.iter().zip(&compiled).zip(&shapeless) {
            let e = e.data().unwrap();
            prop_assert!(compare_within(&c.data().unwrap(), &e, 1e-5, 1e-4).is_ok());
            prop_assert!(compare_within(&s.data().unwrap(), &e, 1e-5, 1e-4).is_ok());
        }
        if let Some(gpu) = kiln_tests::gpu::backend() {
            let on_gpu = compile(pushed).with_backend(gpu).call(&args).unwrap();
            for (g, e) in on_gpu.iter().zip(&eager) {
                let check = compare_within(&g.data().unwrap(), &e.data().unwrap(), 1e-4, 1e-3);
                prop_assert!(check.is_ok(), "{:?}", check);
            }
        }
        // ⟨J·v, u⟩ = ⟨v, Jᵀ·u⟩ for a random cotangent u.
        let u: Vec<Array> = out
            .iter()
            .enumerate()
            .map(|(i, o)| normal(seed * 31 + i as u64, &o.dims().unwrap()))
            .collect();
        let (_, pullback) = vjp(f, &inputs).unwrap();
        let back = pullback.call(&u).unwrap();
        let (forward, reverse) = (dot(&eager, &u), dot(&tangents, &back));
        let scale = 1.0 + forward.abs().max(reverse.abs());
        prop_assert!(
            (forward - reverse).abs() <= 1e-3 * scale,
            "⟨J·v, u⟩ = {} but ⟨v, Jᵀ·u⟩ = {}", forward, reverse
        );
    }
}
