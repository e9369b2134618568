//! Export to StableHLO: names, control flow, training steps with AdamW
//! (an MLP's and the `kiln-models` GPT's), a shapeless function, quantized
//! products, implicit arrays, sharded MLP training steps and the errors.
//!
//! Each test checks the module's text here; under `cargo xtask xla`
//! (`KILN_XLA_CASES` set) it also writes its case, which
//! `xtask/xla/run_cases.py` runs on XLA's CPU client (eight simulated
//! devices for the sharded ones) and compares with Kiln's results.

use kiln::export::{Exported, Mesh};
use kiln::implicit::LowRank;
use kiln::optim::{AdamState, AdamW, Optimizer};
use kiln::random::Key;
use kiln::ImplicitArray;
use kiln::{
    compile, concat, cond, fori_loop, gather_qmm, quantize, quantized_matmul, scan, value_and_grad,
    while_loop, Array, DType, QuantFormat, Quantized, Result, Tree,
};
use kiln_models::data::{self, Sampler};
use kiln_models::{train, Gpt, GptConfig};
use kiln_tests::xla::{cases_dir, write_case, Case, Loop, Match, Run};

/// An MLP of two dense layers with a tanh between them.
#[derive(Tree, Clone)]
struct Mlp {
    w1: Array,
    b1: Array,
    w2: Array,
    b2: Array,
}

impl Mlp {
    fn new(key: Key, inputs: usize, hidden: usize, outputs: usize) -> Mlp {
        let normal = |k: u64, shape: &[usize], fan_in: usize| {
            Array::random_normal(key.fold_in(k), shape, DType::F32).expect("normal")
                * (1.0 / (fan_in as f32).sqrt())
        };
        Mlp {
            w1: normal(0, &[inputs, hidden], inputs),
            b1: Array::zeros(&[hidden], DType::F32),
            w2: normal(1, &[hidden, outputs], hidden),
            b2: Array::zeros(&[outputs], DType::F32),
        }
    }

    fn forward(&self, x: &Array) -> Array {
        (x.matmul(&self.w1) + &self.b1).tanh().matmul(&self.w2) + &self.b2
    }
}

fn mse((model, x, y): (Mlp, Array, Array)) -> Array {
    let error = model.forward(&x) - &y;
    (&error * &error).mean_all()
}

/// The arguments of one training step: parameters, AdamW's moments, the
/// step count, a batch.
type StepArgs = (Mlp, AdamState<Mlp>, Array, Array, Array);

/// One AdamW step: new parameters and moments, the next step count, and
/// the loss before the update.
fn train_step((model, state, step, x, y): StepArgs) -> Result<(Mlp, AdamState<Mlp>, Array, Array)> {
    let (loss, (grads, _, _)) =
        value_and_grad(mse)
            .wrt(["args[0]"])
            .call(&(model.clone(), x, y))?;
    let (model, state) = AdamW::new(0.01).update(&model, &grads, &state, &step)?;
    Ok((model, state, step + 1.0, loss))
}

fn batch(key: Key, size: usize, inputs: usize, outputs: usize) -> (Array, Array) {
    let x = Array::random_normal(key.fold_in(0), &[size, inputs], DType::F32).expect("x");
    let y = Array::random_normal(key.fold_in(1), &[size, outputs], DType::F32).expect("y");
    (x, y)
}

/// The flattened leaves of `value`.
fn leaves<T: Tree>(value: &T) -> Vec<Array> {
    kiln::tree_flatten(value).expect("flattens").0
}

/// Runs `steps` training steps on Kiln's CPU executor from `args`; returns
/// the losses and the last step's arguments and results (flattened).
fn train(args: StepArgs, steps: usize) -> (Vec<f32>, Vec<Array>, Vec<Array>) {
    let compiled = compile(train_step);
    let mut args = args;
    let mut losses = Vec::new();
    let mut last = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let (model, state, step, loss) = compiled.call(&args).expect("the step runs");
        losses.push(loss.item::<f32>().expect("scalar loss"));
        let out = (model.clone(), state.clone(), step.clone(), loss);
        last = (leaves(&args), leaves(&out));
        args = (model, state, step, args.3.clone(), args.4.clone());
    }
    (losses, last.0, last.1)
}

fn step_args(inputs: usize, hidden: usize, outputs: usize, size: usize) -> StepArgs {
    let model = Mlp::new(Key::new(7), inputs, hidden, outputs);
    let state = AdamW::new(0.01).init(&model).expect("init");
    let (x, y) = batch(Key::new(8), size, inputs, outputs);
    (model, state, Array::scalar(0.0, DType::F32), x, y)
}

/// The XLA case of `steps` training steps of `exported` from `args`: the
/// parameters, moments and step count carried from step to step.
fn training_case<'a>(
    name: &str,
    exported: &'a Exported,
    args: StepArgs,
    steps: usize,
    mesh: Option<(&'a Mesh, Vec<Vec<Option<&'a str>>>)>,
) -> Case<'a> {
    let first_inputs = leaves(&args);
    let (losses, _, outputs) = train(args, steps);
    // Parameters, both moments, the step: results and arguments alike.
    let carried = outputs.len() - 1;
    Case {
        name: name.to_string(),
        exported,
        rule: Match::Tolerance,
        runs: vec![Run {
            inputs: first_inputs,
            outputs,
        }],
        collectives: if mesh.is_some() {
            vec!["all-reduce"]
        } else {
            Vec::new()
        },
        mesh,
        training: Some(Loop {
            feed: (0..carried).map(|i| (i, i)).collect(),
            loss: carried,
            losses,
        }),
    }
}

fn write(case: &Case<'_>) {
    if let Some(root) = cases_dir() {
        write_case(&root, case).expect("the case is written");
    }
}

/// Writes `exported` as a case of one run on one device: `inputs` give
/// Kiln's `outputs`.
fn write_one_run(
    name: String,
    exported: &Exported,
    rule: Match,
    inputs: Vec<Array>,
    outputs: Vec<Array>,
) {
    write(&Case {
        name,
        exported,
        rule,
        runs: vec![Run { inputs, outputs }],
        mesh: None,
        training: None,
        collectives: Vec::new(),
    });
}

#[test]
fn export_names_arguments_and_results_by_their_tree_paths() {
    let args = step_args(3, 4, 2, 5);
    let exported = compile(train_step).export(&args).expect("exports");
    let arg_paths: Vec<&str> = exported.args().iter().map(|a| a.path.as_str()).collect();
    assert_eq!(
        &arg_paths[..5],
        [
            "args[0].w1",
            "args[0].b1",
            "args[0].w2",
            "args[0].b2",
            "args[1].m.w1"
        ]
    );
    assert_eq!(
        arg_paths[arg_paths.len() - 3..],
        ["args[2]", "args[3]", "args[4]"]
    );
    let last = exported.results().last().expect("results");
    assert_eq!(last.path, "out[3]");
    let text = exported.stablehlo();
    assert!(text
        .contains("func.func public @main(%arg0: tensor<3x4xf32> {jax.arg_info = \"args[0].w1\"}"));
    assert!(text.contains("tensor<f32> {jax.result_info = \"out[3]\"}"));
}

#[test]
fn an_adamw_training_step_exports_and_trains_alike_on_xla() {
    let args = step_args(6, 16, 3, 32);
    let exported = compile(train_step).export(&args).expect("exports");
    let text = exported.stablehlo();
    assert!(text.contains("stablehlo.dot_general"));
    assert!(text.contains("stablehlo.rsqrt") || text.contains("stablehlo.sqrt"));
    write(&training_case("adamw_step", &exported, args, 5, None));
}

/// A program with every control-flow construct: a scan with a reversed
/// twin, a while loop, a fori loop and a cond.
fn control_program((x, xs): (Array, Array)) -> Result<(Array, Array, Array, Array)> {
    let (total, prefix) = scan(
        |c: Array, row: Array| {
            let c = &c + &row.tanh();
            Ok((c.clone(), c * 2.0))
        },
        &x,
        &xs,
    )?;
    let halved = while_loop(
        |v: Array| Ok(v.abs().sum(&[0], false).greater(1.0)),
        |v: Array| Ok(v * 0.5),
        &(&total * 4.0),
    )?;
    let counted = fori_loop(0, 5, |i, acc: Array| Ok(acc + i.cast(DType::F32)), &x)?;
    let chosen = cond(
        &x.sum(&[0], false).greater(0.0),
        |v: Array| Ok(v.exp()),
        |v: Array| Ok(-v),
        &halved,
    )?;
    Ok((prefix, halved, counted, chosen))
}

#[test]
fn scan_while_fori_and_cond_export_as_while_and_case() {
    let x = Array::from_vec(vec![0.5f32, -0.25, 1.0], &[3]).expect("x");
    let xs = Array::random_normal(Key::new(3), &[4, 3], DType::F32).expect("xs");
    let compiled = compile(control_program);
    let exported = compiled.export(&(x.clone(), xs.clone())).expect("exports");
    let text = exported.stablehlo();
    assert!(text.matches("stablehlo.while").count() >= 3, "{text}");
    assert!(text.contains("\"stablehlo.case\""));
    let out = compiled.call(&(x.clone(), xs.clone())).expect("runs");
    write_one_run(
        "control_flow".into(),
        &exported,
        Match::Tolerance,
        vec![x, xs],
        leaves(&out),
    );
}

fn shapeless_program((x, w): (Array, Array)) -> (Array, Array, Array) {
    let h = (x.matmul(&w).tanh() + 1.0) * &x.sum(&[1], true);
    let tail = x.slice_axis(0, -2, None, 1).slice_axis(1, 1, None, 2).exp();
    (h.mean(&[0], false), (&h * &h).mean_all(), tail)
}

#[test]
fn a_shapeless_export_has_dynamic_dims_and_runs_at_three_sizes() {
    let compiled = compile(shapeless_program).shapeless();
    let w = Array::random_normal(Key::new(4), &[4, 3], DType::F32).expect("w");
    let at = |n: usize| {
        let x =
            Array::random_normal(Key::new(5).fold_in(n as u64), &[n, 4], DType::F32).expect("x");
        (x, w.clone())
    };
    let exported = compiled.export(&at(2)).expect("exports");
    let text = exported.stablehlo();
    assert!(text.contains("%arg0: tensor<?x?xf32>"), "{text}");
    assert!(exported.symbols()[0].ends_with(" = args[0].shape[0]"));
    assert!(text.contains("stablehlo.get_dimension_size"));
    assert!(text.contains("stablehlo.real_dynamic_slice"));
    assert!(text.contains("jax.uses_shape_polymorphism = true"));
    let runs = [3, 8, 33]
        .into_iter()
        .map(|n| {
            let args = at(n);
            let out = compiled.call(&args).expect("runs");
            Run {
                inputs: vec![args.0, args.1],
                outputs: leaves(&out),
            }
        })
        .collect();
    write(&Case {
        name: "shapeless".into(),
        exported: &exported,
        rule: Match::Tolerance,
        runs,
        mesh: None,
        training: None,
        collectives: Vec::new(),
    });
}

/// The per-argument specs of a sharded training step: `params` for each
/// parameter (and so each moment), the batch's, and the step count's.
fn step_specs<'a>(
    params: [Vec<Option<&'a str>>; 4],
    batch: Option<&'a str>,
) -> Vec<Vec<Option<&'a str>>> {
    let mut specs: Vec<Vec<Option<&str>>> = Vec::new();
    for _ in 0..3 {
        specs.extend(params.iter().cloned());
    }
    specs.push(Vec::new());
    specs.push(vec![batch, None]);
    specs.push(vec![batch, None]);
    specs
}

/// Shards `exported`'s arguments by `specs` (in argument order).
fn shard_all(mut exported: Exported, specs: &[Vec<Option<&str>>]) -> Exported {
    let paths: Vec<String> = exported.args().iter().map(|a| a.path.clone()).collect();
    for (path, spec) in paths.iter().zip(specs) {
        exported = exported.shard(path, spec.iter().copied()).expect("shards");
    }
    exported
}

#[test]
fn a_data_parallel_mlp_step_shards_the_batch_over_eight_devices() {
    let args = step_args(16, 32, 4, 64);
    let mesh = Mesh::new([("data", 8)]).expect("mesh");
    let replicated = || vec![vec![None, None], vec![None], vec![None, None], vec![None]];
    let whole: [Vec<Option<&str>>; 4] = replicated().try_into().expect("four");
    let specs = step_specs(whole, Some("data"));
    let exported = shard_all(
        compile(train_step)
            .export(&args)
            .expect("exports")
            .with_mesh(mesh.clone()),
        &specs,
    );
    let text = exported.stablehlo();
    assert!(text.contains("sdy.mesh @mesh = <[\"data\"=8]>"));
    assert!(text.contains("mhlo.num_partitions = 8 : i32"));
    assert!(text.contains(
        "tensor<64x16xf32> {jax.arg_info = \"args[3]\", sdy.sharding = #sdy.sharding<@mesh, [{\"data\"}, {}]>}"
    ));
    write(&training_case(
        "sharded_data_parallel",
        &exported,
        args,
        5,
        Some((&mesh, specs)),
    ));
}

#[test]
fn a_tensor_parallel_mlp_step_splits_the_hidden_layer_over_eight_devices() {
    let args = step_args(16, 32, 4, 64);
    let mesh = Mesh::new([("data", 4), ("model", 2)]).expect("mesh");
    // The hidden layer's weight: rows over 4, columns over 2.
    let params = [
        vec![Some("data"), Some("model")],
        vec![Some("model")],
        vec![Some("model"), None],
        vec![None],
    ];
    let specs = step_specs(params, None);
    let exported = shard_all(
        compile(train_step)
            .export(&args)
            .expect("exports")
            .with_mesh(mesh.clone()),
        &specs,
    );
    let text = exported.stablehlo();
    assert!(text.contains(
        "{jax.arg_info = \"args[0].w1\", sdy.sharding = #sdy.sharding<@mesh, [{\"data\"}, {\"model\"}]>}"
    ));
    write(&training_case(
        "sharded_tensor_parallel",
        &exported,
        args,
        5,
        Some((&mesh, specs)),
    ));
}

#[test]
fn a_mesh_axis_that_does_not_divide_a_dim_is_an_err_naming_path_dim_and_axis() {
    let args = step_args(6, 10, 3, 8);
    let mesh = Mesh::new([("data", 4), ("model", 4)]).expect("mesh");
    let exported = compile(train_step)
        .export(&args)
        .expect("exports")
        .with_mesh(mesh);
    let err = exported
        .clone()
        .shard("args[0].w1", [None, Some("model")])
        .expect_err("10 columns do not split over 4");
    let message = err.to_string();
    assert!(message.contains("`args[0].w1`"), "{message}");
    assert!(message.contains("dim 1 of size 10"), "{message}");
    assert!(message.contains("mesh axis `model` of size 4"), "{message}");
    let err = exported
        .clone()
        .shard("args[0].w9", [None, None])
        .expect_err("no such leaf");
    assert!(err
        .to_string()
        .contains("no argument or result at `args[0].w9`"));
    let err = exported
        .shard("args[0].w1", [Some("rows"), None])
        .expect_err("no such axis");
    assert!(err.to_string().contains("mesh axis `rows`"));
}

#[test]
fn a_user_kernel_is_an_err_naming_it_and_its_op_id() {
    let kernel = kiln_tests::doubling_kernel("double")
        .build()
        .expect("kernel");
    let compiled = compile(move |x: Array| kernel.call(&[&x.exp()]).tanh());
    let x = Array::from_vec(vec![1.0f32, 2.0], &[2]).expect("x");
    let exe = compiled.executable(&x).expect("compiles");
    let id = exe
        .graph()
        .nodes
        .iter()
        .position(|n| matches!(&n.kind, kiln::ValueKind::Op(kiln::Op::Kernel(_))))
        .expect("the kernel is a node");
    let message = compiled
        .export(&x)
        .expect_err("no StableHLO form")
        .to_string();
    assert!(message.contains("user kernel `double`"), "{message}");
    assert!(message.contains(&format!("value {id} ")), "{message}");
}

/// `x @ wᵀ` over a weight quantized in `format`, the weight's parts passed
/// as arguments.
fn quantized_product(
    format: QuantFormat,
) -> impl Fn((Array, Array, Array, Array)) -> (Array, Array, Array) {
    move |(x, packed, scales, biases)| {
        let w = Quantized {
            packed,
            scales,
            biases: format.has_biases().then_some(biases),
            format,
        };
        // x's two matrices and w's one, picked per output batch entry.
        let xs = concat(&[x.expand_dims(0), (&x * 0.5).expand_dims(0)], 0);
        let lhs = Array::from_vec(vec![1u32, 0, 1], &[3]).expect("lhs");
        let rhs = Array::from_vec(vec![0u32], &[1]).expect("rhs");
        let picked = gather_qmm(&xs, &w, &lhs, &rhs, true);
        (quantized_matmul(&x, &w, true), w.dequantize(), picked)
    }
}

#[test]
fn quantized_products_export_as_dequantization_and_a_dot_general() {
    let formats = [
        ("affine4", QuantFormat::affine(4, 64)),
        ("affine3", QuantFormat::affine(3, 32)),
        ("affine6", QuantFormat::affine(6, 64)),
        ("nf4", QuantFormat::Nf4),
        ("int8", QuantFormat::Int8),
    ];
    for (name, format) in formats {
        let w = Array::random_normal(Key::new(11), &[6, 128], DType::F32).expect("w");
        let q = quantize(&w, format);
        let x = Array::random_normal(Key::new(12), &[3, 128], DType::F32).expect("x");
        let biases = q
            .biases
            .clone()
            .unwrap_or_else(|| Array::zeros(&[1], DType::F32));
        let args = (x, q.packed.clone(), q.scales.clone(), biases);
        let compiled = compile(quantized_product(format));
        let exported = compiled.export(&args).expect("exports");
        let text = exported.stablehlo();
        assert!(text.contains("stablehlo.shift_right_logical"), "{name}");
        assert!(text.contains("stablehlo.dot_general"), "{name}");
        let out = compiled.call(&args).expect("runs");
        write_one_run(
            format!("quantized_{name}"),
            &exported,
            Match::Tolerance,
            leaves(&args),
            leaves(&out),
        );
    }
}

#[test]
fn the_gpt_training_step_exports_and_trains_alike_on_xla() {
    let config = GptConfig {
        vocab: 32,
        context: 16,
        width: 16,
        layers: 2,
        heads: 2,
    };
    let optimizer = AdamW::new(3e-3);
    let model = Gpt::new(Key::new(7), config).expect("a model");
    let state = optimizer.init(&model).expect("a state");
    let text: Vec<u8> = (0..512).map(|i| (i * 7 % 32) as u8).collect();
    let (inputs, targets) =
        data::batch(&text, 2, config.context, &mut Sampler::new(1)).expect("a batch");
    // The step count stays 0: XLA's loop feeds results back, and the count
    // is no result of the step.
    let count = Array::scalar(0.0, DType::F32);
    let compiled = compile(train::step(optimizer));
    let mut args = (model, state, count, inputs, targets);
    let exported = compiled.export(&args).expect("exports");
    let text = exported.stablehlo();
    assert!(
        text.contains("\"stablehlo.gather\""),
        "the embedding is a gather"
    );
    let first_inputs = leaves(&args);
    let mut losses = Vec::new();
    let mut outputs = Vec::new();
    for _ in 0..5 {
        let (model, state, loss) = compiled.call(&args).expect("steps");
        losses.push(loss.item::<f32>().expect("a loss"));
        outputs = leaves(&(model.clone(), state.clone(), loss));
        args = (model, state, args.2, args.3, args.4);
    }
    let carried = outputs.len() - 1;
    write(&Case {
        name: "gpt_train_step".into(),
        exported: &exported,
        rule: Match::Tolerance,
        runs: vec![Run {
            inputs: first_inputs,
            outputs,
        }],
        mesh: None,
        training: Some(Loop {
            feed: (0..carried).map(|i| (i, i)).collect(),
            loss: carried,
            losses,
        }),
        collectives: Vec::new(),
    });
}

/// A wider MLP's AdamW step on one XLA device and data-parallel over
/// eight: the harness prints each one's time per step, for information.
#[test]
fn a_wide_mlp_step_exports_for_one_and_eight_devices() {
    let args = || step_args(256, 1024, 256, 256);
    let exported = compile(train_step).export(&args()).expect("exports");
    write(&training_case(
        "mlp_wide_1_device",
        &exported,
        args(),
        5,
        None,
    ));
    let mesh = Mesh::new([("data", 8)]).expect("mesh");
    let whole: [Vec<Option<&str>>; 4] =
        [vec![None, None], vec![None], vec![None, None], vec![None]];
    let specs = step_specs(whole, Some("data"));
    let sharded = shard_all(exported.with_mesh(mesh.clone()), &specs);
    assert_eq!(sharded.args().len(), specs.len());
    write(&training_case(
        "mlp_wide_8_devices",
        &sharded,
        args(),
        5,
        Some((&mesh, specs)),
    ));
}

#[test]
fn implicit_arrays_export_as_kiln_lowers_them() {
    let compiled = compile(|(x, w): (Array, LowRank)| {
        // The product goes through its handler; `exp` materializes.
        (x.matmul(&w.array()), w.array().exp().sum_all())
    });
    let normal = |seed: u64, shape: &[usize]| {
        Array::random_normal(Key::new(seed), shape, DType::F32).expect("normal")
    };
    let w = LowRank {
        base: normal(20, &[6, 5]),
        a: normal(21, &[6, 2]),
        b: normal(22, &[2, 5]),
    };
    let args = (normal(23, &[3, 6]), w);
    let exported = compiled.export(&args).expect("exports");
    assert_eq!(
        exported.args().len(),
        4,
        "x and the low-rank weight's three leaves"
    );
    let out = compiled.call(&args).expect("runs");
    write_one_run(
        "implicit_low_rank".into(),
        &exported,
        Match::Tolerance,
        leaves(&args),
        leaves(&out),
    );
}

#[test]
fn in_graph_random_numbers_export_bit_equal() {
    let compiled = compile(|(x, key): (Array, Array)| {
        (
            kiln::nn::random_uniform(&key, &[4, 8]),
            kiln::nn::dropout(&x, 0.25, &key),
        )
    });
    let x = Array::random_normal(Key::new(30), &[4, 8], DType::F32).expect("x");
    let args = (x, kiln::nn::key_array(Key::new(31)));
    let exported = compiled.export(&args).expect("exports");
    assert!(
        exported.stablehlo().contains("tensor<ui32>"),
        "the key is a u32 scalar"
    );
    let out = compiled.call(&args).expect("runs");
    write_one_run(
        "random_in_graph".into(),
        &exported,
        Match::Exact,
        leaves(&args),
        leaves(&out),
    );
}

#[test]
fn quantize_exports_bit_equal_in_every_format() {
    let formats = [
        ("affine4", QuantFormat::affine(4, 64)),
        ("affine5", QuantFormat::affine(5, 32)),
        ("nf4", QuantFormat::Nf4),
        ("int8", QuantFormat::Int8),
    ];
    for (name, format) in formats {
        for dtype in [DType::F32, DType::F16] {
            let compiled = compile(move |w: Array| {
                let q = quantize(&w, format);
                (q.packed, q.scales, q.biases)
            });
            let w = Array::random_normal(Key::new(40), &[4, 128], dtype).expect("w");
            let exported = compiled.export(&w).expect("exports");
            let out = compiled.call(&w).expect("runs");
            write_one_run(
                format!("quantize_{name}_{dtype}"),
                &exported,
                Match::Exact,
                vec![w],
                leaves(&out),
            );
        }
    }
}
