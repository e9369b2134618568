//! `kiln::optim` against hand-computed updates: each optimizer over three
//! steps beside a plain f64 loop of its rule, the schedules' values, global
//! norm clipping, errors naming the path, and a compiled, donated training
//! step that hits the cache and writes parameters and moments in place.

use kiln::optim::{clip_by_global_norm, Adam, AdamState, AdamW, Optimizer, Schedule, Sgd};
use kiln::random::Key;
use kiln::{compile, value_and_grad, Array, DType, Error, Result, Tree};

/// The parameters every rule starts from: two leaves, of 3 and 1 elements.
fn initial() -> Vec<Vec<f64>> {
    vec![vec![1.0, -2.0, 0.5], vec![0.25]]
}

/// The gradients of the three steps (fixed, so the rules alone decide).
fn gradients() -> Vec<Vec<Vec<f64>>> {
    vec![
        vec![vec![0.1, -0.3, 0.2], vec![1.0]],
        vec![vec![-0.2, 0.4, 0.05], vec![-0.5]],
        vec![vec![0.3, 0.1, -0.1], vec![0.25]],
    ]
}

fn arrays(values: &[Vec<f64>]) -> Vec<Array> {
    values
        .iter()
        .map(|v| {
            let v: Vec<f32> = v.iter().map(|&x| x as f32).collect();
            let n = v.len();
            Array::from_vec(v, &[n]).expect("array")
        })
        .collect()
}

fn values(leaves: &[Array]) -> Vec<Vec<f64>> {
    leaves
        .iter()
        .map(|a| {
            let v = a.to_vec::<f32>().expect("values");
            v.into_iter().map(f64::from).collect()
        })
        .collect()
}

/// The parameters after each of the three steps, through `opt`.
fn run<O: Optimizer>(opt: &O) -> Vec<Vec<Vec<f64>>> {
    let mut params = arrays(&initial());
    let mut state = opt.init(&params).expect("init");
    let mut history = Vec::new();
    for (k, g) in gradients().iter().enumerate() {
        let step = Array::scalar(k as f64, DType::F32);
        let (p, s) = opt
            .update(&params, &arrays(g), &state, &step)
            .expect("update");
        history.push(values(&p));
        (params, state) = (p, s);
    }
    history
}

/// The parameters after each step of a per-element rule over the three
/// gradients: `rule(k, p, g, state)` updates one element at step `k`.
fn reference<S: Clone>(
    init: S,
    mut rule: impl FnMut(usize, &mut f64, f64, &mut S),
) -> Vec<Vec<Vec<f64>>> {
    let mut params = initial();
    let mut states: Vec<Vec<S>> = params.iter().map(|l| vec![init.clone(); l.len()]).collect();
    let mut history = Vec::new();
    for (k, grads) in gradients().iter().enumerate() {
        for (l, leaf) in params.iter_mut().enumerate() {
            for (i, p) in leaf.iter_mut().enumerate() {
                rule(k, p, grads[l][i], &mut states[l][i]);
            }
        }
        history.push(params.clone());
    }
    history
}

fn assert_close(got: &[Vec<Vec<f64>>], expected: &[Vec<Vec<f64>>]) {
    for (step, (g, e)) in got.iter().zip(expected).enumerate() {
        for (gl, el) in g.iter().zip(e) {
            for (a, b) in gl.iter().zip(el) {
                assert!(
                    (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                    "step {step}: got {g:?}, expected {e:?}"
                );
            }
        }
    }
    assert_eq!(got.len(), expected.len());
}

#[test]
fn sgd_subtracts_the_scaled_gradient() {
    let expected = reference((), |_, p, g, _| *p -= 0.1 * g);
    assert_close(&run(&Sgd::new(0.1)), &expected);
}

#[test]
fn sgd_momentum_accumulates_a_velocity() {
    let expected = reference(0.0, |_, p, g, v: &mut f64| {
        *v = 0.9 * *v + g;
        *p -= 0.1 * *v;
    });
    assert_close(&run(&Sgd::new(0.1).momentum(0.9)), &expected);
}

#[test]
fn sgd_nesterov_with_weight_decay_looks_ahead_along_the_velocity() {
    let expected = reference(0.0, |_, p, g, v: &mut f64| {
        let g = g + 0.05 * *p;
        *v = 0.8 * *v + g;
        *p -= 0.1 * (g + 0.8 * *v);
    });
    let opt = Sgd::new(0.1)
        .momentum(0.8)
        .nesterov(true)
        .weight_decay(0.05);
    assert_close(&run(&opt), &expected);
}

#[test]
fn sgd_follows_its_schedule_step_by_step() {
    // warm-up over 2 steps to 1.0: rates 0, 0.5, then the peak.
    let rates = [0.0, 0.5, 1.0];
    let expected = reference((), |k, p, g, _| *p -= rates[k] * g);
    let opt = Sgd::new(Schedule::warmup_cosine(1.0, 2, 4, 0.1));
    assert_close(&run(&opt), &expected);
}

/// Adam's rule on one element at step `k`, with `(m, v)` its moments.
fn adam_rule(
    lr: f64,
    (b1, b2, eps, decay): (f64, f64, f64, f64),
) -> impl FnMut(usize, &mut f64, f64, &mut (f64, f64)) {
    move |k, p, g, (m, v)| {
        let t = (k + 1) as f64;
        *m = b1 * *m + (1.0 - b1) * g;
        *v = b2 * *v + (1.0 - b2) * g * g;
        let m_hat = *m / (1.0 - b1.powf(t));
        let v_hat = *v / (1.0 - b2.powf(t));
        *p -= lr * (m_hat / (v_hat.sqrt() + eps) + decay * *p);
    }
}

#[test]
fn adam_corrects_the_moments_bias_by_the_step() {
    let expected = reference((0.0, 0.0), adam_rule(0.1, (0.8, 0.9, 1e-3, 0.0)));
    let opt = Adam::new(0.1).betas(0.8, 0.9).eps(1e-3);
    assert_close(&run(&opt), &expected);
}

#[test]
fn adam_defaults_match_optax_and_pytorch() {
    let opt = Adam::new(0.01);
    assert_eq!((opt.beta1, opt.beta2, opt.eps), (0.9, 0.999, 1e-8));
    let expected = reference((0.0, 0.0), adam_rule(0.01, (0.9, 0.999, 1e-8, 0.0)));
    assert_close(&run(&opt), &expected);
}

#[test]
fn adamw_decays_the_weights_apart_from_the_moments() {
    let opt = AdamW::new(0.1).weight_decay(0.2);
    assert_eq!((opt.beta1, opt.beta2, opt.eps), (0.9, 0.999, 1e-8));
    assert_eq!(AdamW::new(0.1).weight_decay, 0.01);
    let expected = reference((0.0, 0.0), adam_rule(0.1, (0.9, 0.999, 1e-8, 0.2)));
    assert_close(&run(&opt), &expected);
}

#[test]
fn clipped_optimizer_rescales_gradients_above_the_global_norm() {
    let norms: Vec<f64> = gradients()
        .iter()
        .map(|g| g.iter().flatten().map(|x| x * x).sum::<f64>().sqrt())
        .collect();
    // Steps 0 and 1 are above the bound, step 2 below it.
    assert!(
        norms[0] > 0.5 && norms[1] > 0.5 && norms[2] < 0.5,
        "{norms:?}"
    );
    let expected = reference((), |k, p, g, _| *p -= g * (0.5 / norms[k].max(0.5)));
    assert_close(&run(&Sgd::new(1.0).clip(0.5)), &expected);
}

#[test]
fn clip_by_global_norm_returns_the_norm_before_clipping() {
    let grads = arrays(&gradients()[0]);
    let (clipped, norm) = clip_by_global_norm(&grads, 0.5).expect("clip");
    let expected_norm = (0.01f64 + 0.09 + 0.04 + 1.0).sqrt();
    assert!((f64::from(norm.item::<f32>().expect("norm")) - expected_norm).abs() < 1e-6);
    let total: f64 = values(&clipped).iter().flatten().map(|x| x * x).sum();
    assert!((total.sqrt() - 0.5).abs() < 1e-6, "{total}");
    let (same, _) = clip_by_global_norm(&grads, 10.0).expect("clip");
    assert_eq!(values(&same), values(&grads));
}

#[test]
fn clip_by_global_norm_refuses_a_non_positive_bound() {
    let grads = arrays(&gradients()[0]);
    let Err(Error::InvalidArgument { op, detail, .. }) = clip_by_global_norm(&grads, 0.0) else {
        panic!("expected an invalid argument");
    };
    assert_eq!(op, "clip_by_global_norm");
    assert!(detail.contains("max_norm"), "{detail}");
}

/// The reference warm-up + cosine schedule of (peak 2, 4 warm-up steps,
/// 8 decay steps, final 0.2).
fn warmup_cosine_reference(step: usize) -> f64 {
    let (peak, warmup, decay, last) = (2.0, 4.0, 8.0, 0.2);
    let s = step as f64;
    if s < warmup {
        peak * s / warmup
    } else if s < warmup + decay {
        let progress = (s - warmup) / decay;
        last + (peak - last) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
    } else {
        last
    }
}

const SCHEDULE_STEPS: [usize; 11] = [0, 1, 3, 4, 5, 8, 11, 12, 13, 50, 10_000];

#[test]
fn warmup_cosine_on_the_host_rises_linearly_then_decays_to_final() {
    let schedule = Schedule::warmup_cosine(2.0, 4, 8, 0.2);
    for step in SCHEDULE_STEPS {
        let expected = warmup_cosine_reference(step);
        assert!(
            (schedule.value(step) - expected).abs() < 1e-12,
            "step {step}"
        );
    }
    assert_eq!(schedule.value(4), 2.0, "the peak ends the warm-up");
    assert!((schedule.value(8) - 1.1).abs() < 1e-12, "half-way down");
    assert_eq!(schedule.value(12), 0.2, "the decay ends at the final rate");
}

#[test]
fn warmup_cosine_in_the_graph_matches_the_host_for_float_and_integer_steps() {
    let schedule = Schedule::warmup_cosine(2.0, 4, 8, 0.2);
    for step in SCHEDULE_STEPS {
        let expected = schedule.value(step);
        let as_float = schedule.at(&Array::scalar(step as f64, DType::F32));
        let as_int = schedule.at(&Array::scalar(step as f64, DType::I32));
        for rate in [as_float, as_int] {
            assert_eq!(rate.dtype(), DType::F32);
            let got = f64::from(rate.item::<f32>().expect("rate"));
            assert!(
                (got - expected).abs() < 1e-6,
                "step {step}: {got} vs {expected}"
            );
        }
    }
}

#[test]
fn constant_schedule_is_the_same_at_every_step() {
    let schedule = Schedule::from(0.3);
    assert_eq!(schedule, Schedule::constant(0.3));
    for step in [0, 1, 1000] {
        assert_eq!(schedule.value(step), 0.3);
        let got = schedule.at(&Array::scalar(step as f64, DType::F32));
        assert!((got.item::<f32>().expect("rate") - 0.3).abs() < 1e-7);
    }
}

#[test]
fn a_compiled_schedule_takes_the_step_as_a_traced_argument() {
    let schedule = Schedule::warmup_cosine(2.0, 4, 8, 0.2);
    let rate = compile(move |step: Array| schedule.at(&step));
    for step in [0usize, 5, 20] {
        let got = rate
            .call(&Array::scalar(step as f64, DType::F32))
            .expect("call");
        let got = f64::from(got.item::<f32>().expect("rate"));
        assert!((got - warmup_cosine_reference(step)).abs() < 1e-6);
    }
    let cache = rate.cache();
    assert_eq!((cache.entries, cache.misses, cache.hits), (1, 1, 2));
}

/// A tree error's path and detail, or a panic naming what came instead.
fn tree_error<T>(result: Result<T>) -> (String, String) {
    match result {
        Err(Error::Tree { path, detail }) => (path, detail),
        Err(other) => panic!("expected a tree error, got {other}"),
        Ok(_) => panic!("expected a tree error, got Ok"),
    }
}

fn nested(shapes: &[&[usize]]) -> Vec<Vec<Array>> {
    shapes
        .iter()
        .map(|layer| {
            layer
                .iter()
                .map(|&n| Array::ones(&[n], DType::F32))
                .collect()
        })
        .collect()
}

#[test]
fn gradients_of_another_structure_are_an_error_naming_the_path() {
    let opt = AdamW::new(0.1);
    let params = nested(&[&[3, 1], &[2]]);
    let grads = nested(&[&[3, 1], &[2, 2]]);
    let state = opt.init(&params).expect("init");
    let step = Array::scalar(0.0, DType::F32);
    let (path, detail) = tree_error(opt.update(&params, &grads, &state, &step));
    assert_eq!(path, "[1]");
    assert!(
        detail.contains("list[2]") && detail.contains("list[1]"),
        "{detail}"
    );
}

#[test]
fn a_gradient_of_another_shape_is_an_error_naming_its_leaf() {
    let opt = Sgd::new(0.1).momentum(0.9);
    let params = nested(&[&[3, 1], &[2]]);
    let grads = nested(&[&[3, 1], &[5]]);
    let state = opt.init(&params).expect("init");
    let step = Array::scalar(0.0, DType::F32);
    let (path, detail) = tree_error(opt.update(&params, &grads, &state, &step));
    assert_eq!(path, "[1][0]");
    assert!(detail.contains("gradient is f32[5]"), "{detail}");
}

#[test]
fn a_state_made_for_other_parameters_is_an_error_naming_the_moment() {
    let opt = Adam::new(0.1);
    let params = nested(&[&[3, 1], &[2]]);
    let state = opt.init(&nested(&[&[3, 4], &[2]])).expect("init");
    let step = Array::scalar(0.0, DType::F32);
    let (path, detail) = tree_error(opt.update(&params, &params, &state, &step));
    assert_eq!(path, "[0][1]");
    assert!(detail.contains("first moment is f32[4]"), "{detail}");
}

#[test]
fn a_state_without_velocity_given_to_sgd_with_momentum_is_an_error_naming_it() {
    let params = nested(&[&[3]]);
    let plain = Sgd::new(0.1).init(&params).expect("init");
    let step = Array::scalar(0.0, DType::F32);
    let opt = Sgd::new(0.1).momentum(0.9);
    let (path, detail) = tree_error(opt.update(&params, &params, &plain, &step));
    assert_eq!(path, "velocity");
    assert!(detail.contains("init"), "{detail}");
}

#[test]
fn a_step_that_is_not_a_scalar_is_an_invalid_argument() {
    let opt = Adam::new(0.1);
    let params = nested(&[&[3]]);
    let state = opt.init(&params).expect("init");
    let steps = Array::zeros(&[2], DType::F32);
    let Err(Error::InvalidArgument { op, detail, .. }) =
        opt.update(&params, &params, &state, &steps)
    else {
        panic!("expected an invalid argument");
    };
    assert_eq!(op, "adam");
    assert!(detail.contains("f32[2]"), "{detail}");
}

#[test]
fn a_beta_of_one_is_an_invalid_argument_naming_it() {
    let opt = AdamW::new(0.1).betas(0.9, 1.0);
    let Err(Error::InvalidArgument { op, detail, .. }) = opt.init(&nested(&[&[3]])) else {
        panic!("expected an invalid argument");
    };
    assert_eq!(op, "adamw");
    assert!(detail.contains("beta2 = 1"), "{detail}");
}

/// The model of the training tests: `x @ w + b`.
#[derive(Tree, Clone)]
struct Linear {
    w: Array,
    b: Array,
}

fn mse((model, x, y): (Linear, Array, Array)) -> Array {
    let error = x.matmul(&model.w) + &model.b - &y;
    (&error * &error).mean_all()
}

/// Parameters, optimizer state, step, inputs and targets.
type StepArgs = (Linear, AdamState<Linear>, Array, Array, Array);

/// One AdamW step on the mean squared error, returning the new parameters,
/// the new state and the loss before the step.
fn adamw_step(
    opt: AdamW,
) -> impl Fn(StepArgs) -> Result<(Linear, AdamState<Linear>, Array)> + Send + Sync + 'static {
    move |(model, state, step, x, y)| {
        let (loss, (grads, _, _)) =
            value_and_grad(mse)
                .wrt(["args[0]"])
                .call(&(model.clone(), x, y))?;
        let (model, state) = opt.update(&model, &grads, &state, &step)?;
        Ok((model, state, loss))
    }
}

/// Inputs `[n, 3]` and targets `x @ [1, -2, 0.5] + 0.3`.
fn regression_data(n: usize) -> (Array, Array) {
    let x = Array::random_normal(Key::new(7), &[n, 3], DType::F32).expect("x");
    let w = Array::from_vec(vec![1.0f32, -2.0, 0.5], &[3, 1]).expect("w");
    let y = x.matmul(&w) + 0.3f32;
    (x, y)
}

fn zero_model() -> Linear {
    Linear {
        w: Array::zeros(&[3, 1], DType::F32),
        b: Array::zeros(&[1], DType::F32),
    }
}

#[test]
fn a_compiled_donated_step_hits_the_cache_and_updates_in_place() {
    let opt = AdamW::new(Schedule::warmup_cosine(0.05, 2, 10, 0.01));
    let train = compile(adamw_step(opt.clone())).donate(["args[0]", "args[1]"]);
    let (x, y) = regression_data(16);
    let mut model = zero_model();
    let mut state = opt.init(&model).expect("init");
    for k in 0..3 {
        let step = Array::scalar(k as f64, DType::F32);
        let args = (model, state, step, x.clone(), y.clone());
        (model, state, _) = train.call_owned(args).expect("step");
    }
    let cache = train.cache();
    assert_eq!(
        (cache.entries, cache.misses, cache.hits),
        (1, 1, 2),
        "{}",
        cache.summary()
    );
    let report = &cache.reports[0];
    let donated = [
        "args[0].w",
        "args[0].b",
        "args[1].m.w",
        "args[1].m.b",
        "args[1].v.w",
        "args[1].v.b",
    ];
    assert_eq!(report.plan.donated, donated.map(String::from));
    // Outputs in order: the model's leaves, the moments', then the loss.
    for (out, input) in report.outputs.iter().zip(donated) {
        let node = &report.nodes[*out];
        assert_eq!(
            node.home, input,
            "output %{out} ({}) is not written over {input}",
            node.op
        );
        let decision = node.reinplace.as_ref().map(|d| d.summary());
        assert!(
            decision
                .as_deref()
                .is_some_and(|d| d.starts_with("in place of")),
            "output %{out}: {decision:?}"
        );
    }
    assert!(report
        .nodes
        .iter()
        .any(|n| n.composition.as_deref() == Some("adamw")));
}

#[test]
fn adamw_fits_a_linear_regression() {
    let opt = AdamW::new(0.05);
    let train = compile(adamw_step(opt.clone())).donate(["args[0]", "args[1]"]);
    let (x, y) = regression_data(64);
    let mut model = zero_model();
    let mut state = opt.init(&model).expect("init");
    let mut losses = Vec::new();
    for k in 0..300 {
        let step = Array::scalar(k as f64, DType::F32);
        let args = (model, state, step, x.clone(), y.clone());
        let loss;
        (model, state, loss) = train.call_owned(args).expect("step");
        losses.push(loss.item::<f32>().expect("loss"));
    }
    let (first, last) = (losses[0], losses[losses.len() - 1]);
    assert!(first > 1.0 && last < 1e-3 * first, "loss {first} → {last}");
    let w = model.w.to_vec::<f32>().expect("w");
    assert!((w[1] + 2.0).abs() < 0.05, "{w:?}");
}
