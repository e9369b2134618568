//! `cargo xtask bench models`: the GPT of `kiln-models`. Its AdamW training
//! step at the "small" config (first call: trace, passes, plan and first
//! run; cached call; planned peak beside the lower bound), and greedy
//! decoding at GPT-2 small's shape (random weights) in f32 and 4-bit, each
//! beside the weight bytes a token reads over the time. The CPU figures run
//! in the one-thread child; the wgpu figure in the parent.

use kiln::optim::{AdamState, AdamW, Optimizer};
use kiln::random::Key;
use kiln::{compile, Array, Backend, DType, QuantFormat};
use kiln_models::data::{batch, Sampler};
use kiln_models::{decode, train, Gpt, GptConfig, Sampling};
use kiln_tests::bench::{selected, time_once_ms, BenchReport};

/// The one-thread figures.
pub const CPU_FIGURES: [&str; 12] = [
    "gpt_small_train_step_cached_ms",
    "gpt_small_train_first_call_ms",
    "gpt_small_train_compile_ms",
    "gpt_small_train_peak_bytes",
    "gpt_small_train_lower_bound_bytes",
    "gpt2_decode_f32_ms_per_token",
    "gpt2_decode_f32_gbs",
    "gpt2_decode_q4_ms_per_token",
    "gpt2_decode_q4_gbs",
    "gpt2_decode_f32_limit_ratio",
    "gpt2_decode_q4_limit_ratio",
    "export_gpt_small_train_ms",
];

/// The wgpu figure.
pub const WGPU_FIGURE: &str = "wgpu_gpt_small_train_device_bytes";

/// True when `name` runs: named by prefix, or the `models` group.
pub fn wanted(name: &str, names: &[String]) -> bool {
    names.iter().any(|n| n == "models") || selected(name, names)
}

/// True when any one-thread figure runs.
pub fn cpu_wanted(names: &[String]) -> bool {
    CPU_FIGURES.iter().any(|f| wanted(f, names))
}

/// The JAX reference's optimizer: AdamW, β = (0.9, 0.95), lr 3e-4, weight
/// decay 0.1 (`../shared/references/gpt_jax.py`).
fn optimizer() -> AdamW {
    AdamW::new(3e-4).betas(0.9, 0.95).weight_decay(0.1)
}

/// The "small" model's first training-step arguments (step count 0) and
/// the optimizer they are for.
fn small_step_args() -> (AdamW, train::StepArgs<AdamState<Gpt>>) {
    let config = GptConfig::SMALL;
    let optimizer = optimizer();
    let model = Gpt::new(Key::new(0), config).expect("a model");
    let state = optimizer.init(&model).expect("a state");
    let text: Vec<u8> = (0..1 << 16).map(|i| (i * 31 % 251) as u8).collect();
    let (inputs, targets) = batch(&text, 8, config.context, &mut Sampler::new(1)).expect("a batch");
    let count = Array::scalar(0.0, DType::F32);
    (optimizer, (model, state, count, inputs, targets))
}

/// The "small" model's training step on `backend`: the first call's and
/// the median cached call's milliseconds, and the entry's report.
fn train_step_figures<B: Backend>(backend: B, cached_calls: usize) -> (f64, f64, kiln::CacheInfo) {
    let (optimizer, (mut model, mut state, _, inputs, targets)) = small_step_args();
    let step = compile(train::step(optimizer))
        .donate(train::DONATED)
        .with_backend(backend);
    let mut times = Vec::new();
    for i in 0..=cached_calls {
        let count = Array::scalar(i as f64, DType::F32);
        let args = (model, state, count, inputs.clone(), targets.clone());
        let mut result = None;
        times.push(time_once_ms(|| {
            let (m, s, loss) = step.call_owned(args).expect("steps");
            loss.item::<f32>().expect("a loss");
            result = Some((m, s));
        }));
        (model, state) = result.expect("a step ran");
    }
    let first = times.remove(0);
    times.sort_by(f64::total_cmp);
    let cached = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
    (first, cached, step.cache())
}

/// The part of the first call that is not running the step: trace,
/// passes, slot plan and verifier (`Compiled::prepare`).
fn compile_ms() -> f64 {
    let (optimizer, args) = small_step_args();
    let step = compile(train::step(optimizer)).donate(train::DONATED);
    time_once_ms(|| {
        step.prepare(&args).expect("compiles");
    })
}

/// Exporting the "small" model's training step to StableHLO, from a
/// fresh compile (trace, passes, writing the module); the fastest of three.
fn export_ms() -> f64 {
    let (optimizer, args) = small_step_args();
    (0..3)
        .map(|_| {
            let step = compile(train::step(optimizer.clone()));
            time_once_ms(|| {
                std::hint::black_box(step.export(&args).expect("exports").stablehlo());
            })
        })
        .fold(f64::INFINITY, f64::min)
}

/// Milliseconds per token of greedy decoding of 32 tokens in one compiled
/// scan (a cached call), and the weight bytes a token reads. Each call
/// takes fresh empty caches (they are donated), made before its clock
/// starts: JAX's figure, too, times steps on caches that exist.
fn decode_figures(model: &Gpt) -> (f64, f64) {
    const TOKENS: usize = 32;
    let run = compile(
        |(model, caches, first): (Gpt, Vec<kiln::nn::KvCache>, Array)| {
            let key = Array::scalar(0.0, DType::U32);
            decode(&model, &caches, &first, &key, TOKENS, Sampling::GREEDY)
        },
    )
    .donate(["args[1]"]);
    let first = Array::from_vec(vec![1i32], &[1]).expect("a token");
    let call = |caches: Vec<kiln::nn::KvCache>| {
        let (tokens, _) = run
            .call_owned((model.clone(), caches, first.clone()))
            .expect("decodes");
        tokens.to_vec::<i32>().expect("tokens");
    };
    call(model.empty_caches(1));
    let ms = (0..3)
        .map(|_| {
            let caches = model.empty_caches(1);
            time_once_ms(|| call(caches))
        })
        .fold(f64::INFINITY, f64::min);
    let bytes = model.weight_bytes().expect("known sizes") as f64;
    (ms / TOKENS as f64, bytes)
}

/// The one-thread figures.
pub fn benchmarks(
    names: &[String],
    report: &mut BenchReport,
    read_bandwidth_gbs: impl Fn() -> f64,
) {
    if wanted("export_gpt_small_train_ms", names) {
        report.record("export_gpt_small_train_ms", export_ms(), "ms");
    }
    if CPU_FIGURES[..5].iter().any(|f| wanted(f, names)) {
        report.record("gpt_small_train_compile_ms", compile_ms(), "ms");
        let (first, cached, cache) = train_step_figures(kiln::CpuBackend, 5);
        report.record("gpt_small_train_first_call_ms", first, "ms");
        report.record("gpt_small_train_step_cached_ms", cached, "ms");
        let memory = &cache.reports[0].plan.memory;
        report.record(
            "gpt_small_train_peak_bytes",
            memory.peak_bytes as f64,
            "bytes",
        );
        report.record(
            "gpt_small_train_lower_bound_bytes",
            memory.lower_bound_bytes as f64,
            "bytes",
        );
    }
    if !CPU_FIGURES[5..11].iter().any(|f| wanted(f, names)) {
        return;
    }
    let bandwidth = read_bandwidth_gbs();
    let model = Gpt::new(Key::new(0), GptConfig::GPT2).expect("GPT-2 small");
    let variants = [
        ("f32", model.clone()),
        (
            "q4",
            model
                .quantize(QuantFormat::affine(4, 64))
                .expect("quantizes"),
        ),
    ];
    drop(model);
    for (name, model) in variants {
        let (ms, bytes) = decode_figures(&model);
        let gbs = bytes / (ms * 1e-3) / 1e9;
        report.record(format!("gpt2_decode_{name}_ms_per_token"), ms, "ms");
        report.record(format!("gpt2_decode_{name}_gbs"), gbs, "GB/s");
        report.record(
            format!("gpt2_decode_{name}_limit_ratio"),
            bandwidth / gbs,
            "ratio",
        );
    }
}

/// The device bytes the small model's training step holds on wgpu.
pub fn wgpu_benchmarks(names: &[String], gpu: &kiln_wgpu::WgpuBackend, report: &mut BenchReport) {
    if !wanted(WGPU_FIGURE, names) {
        return;
    }
    let before = gpu.program_bytes();
    let (_, cached, _) = train_step_figures(gpu.clone(), 1);
    report.record(WGPU_FIGURE, (gpu.program_bytes() - before) as f64, "bytes");
    report.record("wgpu_gpt_small_train_step_ms", cached, "ms");
}
