//! Kiln's benchmarks: prints one JSON document (see DESIGN.md, Benchmarks).
//! `cargo xtask bench [NAME...]` runs it in release mode.

use kiln::{
    compile, nn, Array, Backend, DType, Executable, HostData, Kernel, PlanMemory, SlotPlan, Tree,
};
use kiln_cpu_bench::{
    anchor_chain, input, scalar_chain, unary_input, CHAINS, ELEMENTS, SCALAR_CHAIN, UNARY, WIDE,
};
use kiln_tests::arrays::example;
use kiln_tests::bench::{median_cpu_micros, median_micros, selected, time_once_ms, BenchReport};
use kiln_tests::rss::resident_bytes;
use kiln_tests::value_shapes;
use kiln_wgpu::{MatmulVariant, WgpuBackend};
use std::collections::BTreeMap;
use std::time::Instant;

#[path = "kiln-bench/control.rs"]
mod control;
#[path = "kiln-bench/fma_peak.rs"]
mod fma_peak;
#[path = "kiln-bench/matmul.rs"]
mod matmul;
#[path = "kiln-bench/metal.rs"]
mod metal;
#[path = "kiln-bench/models.rs"]
mod models;
#[path = "kiln-bench/quant.rs"]
mod quant;

/// Ten (4,4) arrays in a derived struct.
#[derive(Tree, Clone)]
struct Ten {
    w0: Array,
    w1: Array,
    w2: Array,
    w3: Array,
    w4: Array,
    w5: Array,
    w6: Array,
    w7: Array,
    w8: Array,
    w9: Array,
}

fn small(i: usize) -> Array {
    Array::from_vec(
        (0..16).map(|j| ((i + j) % 7) as f32 * 0.1).collect(),
        &[4, 4],
    )
    .expect("16 elements")
}

/// `sum over leaves of exp(x) * 2 + 1`, a (4,4) array.
fn sum_of_leaves<'a>(leaves: impl Iterator<Item = &'a Array>) -> Array {
    leaves.fold(Array::zeros(&[4, 4], DType::F32), |acc, x| {
        acc + (x.exp() * 2.0 + 1.0)
    })
}

/// A chain of `n` cheap elementwise ops.
fn chain(x: Array, n: usize) -> Array {
    scalar_chain(x, n)
}

fn dispatch_10() -> f64 {
    let f = compile(|t: Ten| {
        sum_of_leaves(
            [
                &t.w0, &t.w1, &t.w2, &t.w3, &t.w4, &t.w5, &t.w6, &t.w7, &t.w8, &t.w9,
            ]
            .into_iter(),
        )
    });
    let args = Ten {
        w0: small(0),
        w1: small(1),
        w2: small(2),
        w3: small(3),
        w4: small(4),
        w5: small(5),
        w6: small(6),
        w7: small(7),
        w8: small(8),
        w9: small(9),
    };
    f.call(&args).expect("first call");
    median_micros(20_000, || {
        f.call(&args).expect("cached call");
    })
}

fn dispatch_100() -> f64 {
    let f = compile(|m: BTreeMap<String, Array>| sum_of_leaves(m.values()));
    let args: BTreeMap<String, Array> = (0..100).map(|i| (format!("w{i:03}"), small(i))).collect();
    f.call(&args).expect("first call");
    median_micros(10_000, || {
        f.call(&args).expect("cached call");
    })
}

/// Median over several fresh compiled functions of the first call's time
/// (trace + passes + executable + run): each sample is a real first call.
fn first_call_chain(n: usize) -> f64 {
    let x = Array::random_uniform(
        kiln::random::Key::new(1),
        &[256, 256],
        -1.0,
        1.0,
        DType::F32,
    )
    .expect("input");
    x.eval().expect("input ready");
    let samples = if n >= 10_000 { 3 } else { 9 };
    let mut times: Vec<f64> = (0..samples)
        .map(|_| {
            let f = compile(move |x: Array| chain(x, n));
            time_once_ms(|| {
                f.call(&x).expect("first call").eval().expect("result");
            })
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn retrace_chain_100() -> f64 {
    let f = compile(|x: Array| chain(x, 100));
    f.prepare(&Array::zeros(&[256, 256], DType::F32))
        .expect("first compile");
    let mut times: Vec<f64> = (1..=21)
        .map(|i| {
            let new_shape = Array::zeros(&[i, 256], DType::F32);
            time_once_ms(|| {
                f.prepare(&new_shape).expect("compiles");
            })
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// The plan's memory figures for the executable serving `args`.
fn plan_memory(exe: &Executable, args: &[Array]) -> PlanMemory {
    let shapes = value_shapes(exe, args);
    exe.plan().memory(exe.graph(), &shapes)
}

fn zeros(shape: &[usize]) -> Array {
    Array::zeros(shape, DType::F32)
}

/// (i) A 100-op elementwise chain on a (1024,1024) f32 input.
fn plan_chain100() -> PlanMemory {
    let f = compile(|x: Vec<Array>| chain(x[0].clone(), 100));
    let args = vec![zeros(&[1024, 1024])];
    plan_memory(&f.executable(&args).expect("compiles"), &args)
}

/// (ii) A 4-layer MLP forward: x (256,1024), four (1024,1024) weights,
/// gelu between the layers, no bias.
fn mlp4_forward(args: Vec<Array>) -> Array {
    let mut h = args[0].clone();
    for (i, w) in args[1..].iter().enumerate() {
        h = h.matmul(w);
        if i < 3 {
            h = nn::gelu(&h);
        }
    }
    h
}

/// The arguments of [`mlp4_forward`].
fn mlp4_forward_args() -> Vec<Array> {
    let mut args = vec![zeros(&[256, 1024])];
    args.extend((0..4).map(|_| zeros(&[1024, 1024])));
    args
}

fn plan_mlp4() -> PlanMemory {
    let args = mlp4_forward_args();
    let exe = compile(mlp4_forward).executable(&args).expect("compiles");
    plan_memory(&exe, &args)
}

/// (iii) A transformer block forward: sequence 128, model width 512, 8
/// heads, MLP width 2048; pre-norm attention and MLP with residuals.
fn block_forward(args: Vec<Array>) -> Array {
    const SEQ: i64 = 128;
    const HEADS: i64 = 8;
    const HEAD: i64 = 64;
    let [x, wq, wk, wv, wo, w1, w2] = <[Array; 7]>::try_from(args).expect("seven arguments");
    let heads = |t: Array| t.reshape(&[SEQ, HEADS, HEAD]).permute(&[1, 0, 2]);
    let h = nn::layer_norm(&x, None, None, 1e-5);
    let (q, k, v) = (
        heads(h.matmul(&wq)),
        heads(h.matmul(&wk)),
        heads(h.matmul(&wv)),
    );
    let scores = q.matmul(&k.swap_axes(-1, -2)) * (1.0 / (HEAD as f32).sqrt());
    let attention = nn::softmax(&scores, -1)
        .matmul(&v)
        .permute(&[1, 0, 2])
        .reshape(&[SEQ, HEADS * HEAD]);
    let x = x + attention.matmul(&wo);
    let h = nn::layer_norm(&x, None, None, 1e-5);
    &x + nn::gelu(&h.matmul(&w1)).matmul(&w2)
}

/// The arguments of [`block_forward`].
fn block_forward_args() -> Vec<Array> {
    vec![
        zeros(&[128, 512]),
        zeros(&[512, 512]),
        zeros(&[512, 512]),
        zeros(&[512, 512]),
        zeros(&[512, 512]),
        zeros(&[512, 2048]),
        zeros(&[2048, 512]),
    ]
}

fn plan_block() -> PlanMemory {
    let args = block_forward_args();
    let exe = compile(block_forward).executable(&args).expect("compiles");
    plan_memory(&exe, &args)
}

/// Milliseconds to plan (reinplace, slots and arena) a graph of at least
/// 10,000 values: a deep network of elementwise ops, reductions and small
/// matmuls with skip connections up to 16 values back, so lifetimes and
/// sizes vary.
fn plan_10000_nodes() -> f64 {
    let f = compile(|args: Vec<Array>| {
        let (x, w) = (args[0].clone(), args[1].clone());
        let mut pool = vec![x];
        for i in 1..5100 {
            let last = pool[i - 1].clone();
            let skip = pool[i.saturating_sub(1 + i % 16)].clone();
            let value = match i % 5 {
                0 => last.matmul(&w),
                1 => (last.tanh() * skip).sum(&[1], true) + &pool[i - 1],
                2 => last.exp().minimum(4.0),
                3 => &last + &last,
                _ => last.sigmoid() - skip,
            };
            pool.push(value);
        }
        pool.pop().expect("a value")
    })
    .fusion(false);
    let args = vec![zeros(&[64, 64]), zeros(&[64, 64])];
    let exe = f.executable(&args).expect("compiles");
    let graph = exe.graph();
    assert!(
        graph.nodes.len() >= 10_000,
        "only {} nodes",
        graph.nodes.len()
    );
    let shapes: Vec<Vec<usize>> = graph
        .nodes
        .iter()
        .map(|n| n.aval.shape.as_known().expect("known"))
        .collect();
    let donated = [false, false];
    let mut times: Vec<f64> = (0..7)
        .map(|_| {
            time_once_ms(|| {
                let plan = SlotPlan::build(graph, &donated, &shapes);
                std::hint::black_box(plan.memory(graph, &shapes));
            })
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn record_plan(report: &mut BenchReport, names: &[String], graph: &str, plan: fn() -> PlanMemory) {
    let prefix = format!("plan_{graph}");
    if !selected(&prefix, names) && !names.iter().any(|n| n.starts_with(&prefix)) {
        return;
    }
    let memory = plan();
    report.record(
        format!("{prefix}_peak_bytes"),
        memory.peak_bytes as f64,
        "bytes",
    );
    report.record(
        format!("{prefix}_lower_bound_bytes"),
        memory.lower_bound_bytes as f64,
        "bytes",
    );
    report.record(
        format!("{prefix}_noreuse_bytes"),
        memory.no_reuse_bytes as f64,
        "bytes",
    );
}

/// One layer of the gradient benchmark's MLP.
type Layer = (Array, Array);

/// Mean squared error of a 4-layer tanh MLP (width 256) on a batch.
fn mlp4_loss((layers, x, y): (Vec<Layer>, Array, Array)) -> Array {
    let out = layers.iter().fold(x, |h, (w, b)| (h.matmul(w) + b).tanh());
    let error = out - &y;
    (&error * &error).mean_all()
}

/// Standard normal values of `shape`, drawn from `seed`.
fn normal(seed: u64, shape: &[usize]) -> Array {
    Array::random_normal(kiln::random::Key::new(seed), shape, DType::F32).expect("f32 normal")
}

/// The arguments of the gradient benchmark: 4 layers of width 256, a batch of 64.
fn mlp4_arguments() -> (Vec<Layer>, Array, Array) {
    let width = 256;
    let layers = (0..4)
        .map(|i| {
            (
                normal(i, &[width, width]) * 0.05,
                Array::zeros(&[width], DType::F32),
            )
        })
        .collect();
    (layers, normal(10, &[64, width]), normal(11, &[64, width]))
}

/// True when the gradient figures run: named by prefix, or
/// `grad_mlp4_cached` through the `matmul` group.
fn grad_wanted(names: &[String]) -> bool {
    ["grad_mlp4", "plan_grad_mlp4"]
        .iter()
        .any(|w| selected(w, names) || names.iter().any(|n| w.starts_with(n.as_str())))
        || matmul::wanted("grad_mlp4_cached", names)
}

/// One SGD training step of the 4-layer MLP: new layers and the loss.
fn mlp4_train_step(args: (Vec<Layer>, Array, Array)) -> kiln::Result<(Vec<Layer>, Array)> {
    let (loss, (grads, _, _)) = kiln::value_and_grad(mlp4_loss)
        .wrt(["args[0]"])
        .call(&args)?;
    let layers = args
        .0
        .iter()
        .zip(&grads)
        .map(|((w, b), (dw, db))| (w - &(dw * 0.01), b - &(db * 0.01)))
        .collect();
    Ok((layers, loss))
}

/// `export_mlp4_train_ms`: exporting the MLP's training step to StableHLO
/// from a fresh compile (trace, passes, writing the module); the fastest
/// of five.
fn export_benchmarks(names: &[String], report: &mut BenchReport) {
    if !selected("export_mlp4_train_ms", names) {
        return;
    }
    let args = mlp4_arguments();
    let ms = (0..5)
        .map(|_| {
            let step = compile(mlp4_train_step);
            time_once_ms(|| {
                std::hint::black_box(step.export(&args).expect("exports").stablehlo());
            })
        })
        .fold(f64::INFINITY, f64::min);
    report.record("export_mlp4_train_ms", ms, "ms");
}

/// `compile(value_and_grad(loss))` of the 4-layer MLP on the CPU: the first
/// call (trace, passes, plan, run), the median cached call, and the planned
/// memory of the training step with its residuals.
/// It runs in the one-thread child.
fn grad_benchmarks(names: &[String], report: &mut BenchReport) {
    if !grad_wanted(names) {
        return;
    }
    let step = compile(kiln::value_and_grad(mlp4_loss).wrt(["args[0]"]));
    let args = mlp4_arguments();
    report.record(
        "grad_mlp4_first_call",
        time_once_ms(|| {
            std::hint::black_box(step.call(&args).expect("the gradient compiles and runs"));
        }),
        "ms",
    );
    report.record(
        "grad_mlp4_cached",
        median_micros(50, || {
            std::hint::black_box(step.call(&args).expect("cached call"));
        }),
        "us",
    );
    let cache = step.cache();
    let entry = &cache.reports[0];
    let memory = &entry.plan.memory;
    report.record(
        "plan_grad_mlp4_peak_bytes",
        memory.peak_bytes as f64,
        "bytes",
    );
    report.record(
        "plan_grad_mlp4_lower_bound_bytes",
        memory.lower_bound_bytes as f64,
        "bytes",
    );
    report.record(
        "plan_grad_mlp4_residual_bytes",
        entry.residual_bytes as f64,
        "bytes",
    );
}

/// The 4-layer MLP's forward pass on a batch, or on one example.
fn mlp4_on((layers, x): (Vec<Layer>, Array)) -> Array {
    layers.iter().fold(x, |h, (w, b)| (h.matmul(w) + b).tanh())
}

/// The figures of [`vmap_benchmarks`].
const VMAP_FIGURES: [&str; 3] = ["vmap_mlp4_cached", "batched_mlp4_cached", "vmap_mlp4_ratio"];

/// `compile(vmap(f))` of the per-example MLP forward pass against the same
/// work written batched by hand (`batched_mlp4_cached`), cached calls on a
/// batch of 64, measured in alternating rounds so load hits both alike;
/// `vmap_mlp4_ratio` is their quotient (target ≤ 1.05). Runs in the
/// one-thread child.
fn vmap_benchmarks(names: &[String], report: &mut BenchReport) {
    let wanted = VMAP_FIGURES.iter().any(|n| selected(n, names));
    if !wanted {
        return;
    }
    let (layers, x, _) = mlp4_arguments();
    let args = (layers, x);
    let mapped = compile(kiln::vmap(mlp4_on).in_axes([("args[0]", None)]));
    let by_hand = compile(mlp4_on);
    let (mut vmapped, mut batched) = (Vec::new(), Vec::new());
    for _ in 0..7 {
        vmapped.push(median_micros(30, || {
            std::hint::black_box(mapped.call(&args).expect("vmap runs"));
        }));
        batched.push(median_micros(30, || {
            std::hint::black_box(by_hand.call(&args).expect("the batched MLP runs"));
        }));
    }
    let (v, b) = (middle(vmapped), middle(batched));
    report.record("vmap_mlp4_cached", v, "us");
    report.record("batched_mlp4_cached", b, "us");
    report.record("vmap_mlp4_ratio", v / b, "ratio");
}

/// The figures of [`per_example_grad_benchmarks`].
const PER_EXAMPLE_FIGURES: [&str; 2] = [
    "per_example_grads_mlp4_cached",
    "per_example_grads_mlp4_loop_cached",
];

/// Per-example gradients of the 4-layer MLP's loss, batch 64, cached calls at
/// one thread: `compile(vmap(grad(loss)))` over the whole batch
/// (`per_example_grads_mlp4_cached`) against the reference a user without
/// `vmap` writes, 64 cached calls of `compile(grad(loss))`, one per example
/// (`per_example_grads_mlp4_loop_cached`, the whole loop timed). The examples
/// are sliced before any clock starts, and the two are measured in alternating
/// rounds so load hits both alike. Runs in the one-thread child.
fn per_example_grad_benchmarks(names: &[String], report: &mut BenchReport) {
    if !PER_EXAMPLE_FIGURES.iter().any(|n| selected(n, names)) {
        return;
    }
    let args = mlp4_arguments();
    let per_example =
        compile(kiln::vmap(kiln::grad(mlp4_loss).wrt(["args[0]"])).in_axes([("args[0]", None)]));
    let one_example = compile(kiln::grad(mlp4_loss).wrt(["args[0]"]));
    let (layers, x, y) = &args;
    let batch = x.dims().expect("the batch has concrete dims")[0];
    let examples: Vec<(Vec<Layer>, Array, Array)> = (0..batch)
        .map(|k| (layers.clone(), example(x, 0, k), example(y, 0, k)))
        .collect();
    let (mut mapped, mut looped) = (Vec::new(), Vec::new());
    for _ in 0..7 {
        mapped.push(median_micros(20, || {
            std::hint::black_box(per_example.call(&args).expect("vmap(grad) runs"));
        }));
        looped.push(median_micros(5, || {
            for e in &examples {
                std::hint::black_box(one_example.call(e).expect("grad runs"));
            }
        }));
    }
    report.record("per_example_grads_mlp4_cached", middle(mapped), "us");
    report.record("per_example_grads_mlp4_loop_cached", middle(looped), "us");
}

/// The median of the rounds' figures (of alternating-round measurements).
fn middle(mut rounds: Vec<f64>) -> f64 {
    rounds.sort_by(f64::total_cmp);
    rounds[rounds.len() / 2]
}

/// The hidden first argument under which the program re-runs itself with
/// `KILN_THREADS=1` to take the single-thread CPU figures.
const CPU_CHILD: &str = "--cpu-single-thread";

/// The hidden first argument under which the program re-runs itself with
/// `KILN_THREADS=2` to take the two-thread (`_2t`) CPU figures.
const CPU_TWO_THREADS: &str = "--cpu-two-threads";

fn main() {
    let mut names: Vec<String> = std::env::args().skip(1).collect();
    if names.first().map(String::as_str) == Some(CPU_CHILD) {
        names.remove(0);
        let mut report = BenchReport::new();
        cpu_figures(&names, &mut report);
        transpose_figure(&names, &mut report);
        matmul::one_thread(&names, &mut report);
        grad_benchmarks(&names, &mut report);
        export_benchmarks(&names, &mut report);
        vmap_benchmarks(&names, &mut report);
        per_example_grad_benchmarks(&names, &mut report);
        control::benchmarks(&names, &mut report);
        models::benchmarks(&names, &mut report, matmul::read_bandwidth_gbs);
        println!("{}", report.to_json());
        return;
    }
    if names.first().map(String::as_str) == Some(CPU_TWO_THREADS) {
        names.remove(0);
        let mut report = BenchReport::new();
        matmul::two_threads(&names, &mut report);
        println!("{}", report.to_json());
        return;
    }
    let mut report = BenchReport::new();
    cpu_benchmarks(&names, &mut report);
    if selected("dispatch_10", &names) {
        report.record("dispatch_10", dispatch_10(), "us");
    }
    if selected("dispatch_100", &names) {
        report.record("dispatch_100", dispatch_100(), "us");
    }
    for n in [10, 100, 1000, 10_000] {
        let name = format!("first_call_chain_{n}");
        if selected(&name, &names) {
            report.record(&name, first_call_chain(n), "ms");
        }
    }
    if selected("retrace_chain_100", &names) {
        report.record("retrace_chain_100", retrace_chain_100(), "ms");
    }
    record_plan(&mut report, &names, "chain100", plan_chain100);
    record_plan(&mut report, &names, "mlp4", plan_mlp4);
    record_plan(&mut report, &names, "block", plan_block);
    if selected("plan_10000_nodes", &names) {
        report.record("plan_10000_nodes", plan_10000_nodes(), "ms");
    }
    custom_kernel_benchmarks(&names, &mut report);
    wgpu_benchmarks(&names, &mut report);
    if control::WGPU_FIGURES.iter().any(|f| selected(f, &names)) || control::wanted(&names) {
        match WgpuBackend::new() {
            Ok(gpu) => control::wgpu_benchmarks(&names, &gpu, &mut report),
            Err(e) => {
                eprintln!("kiln-bench: no wgpu adapter ({e}); the wgpu cond figures are left out")
            }
        }
    }
    if models::wanted(models::WGPU_FIGURE, &names) {
        match WgpuBackend::new() {
            Ok(gpu) => models::wgpu_benchmarks(&names, &gpu, &mut report),
            Err(e) => eprintln!(
                "kiln-bench: no wgpu adapter ({e}); {} is left out",
                models::WGPU_FIGURE
            ),
        }
    }
    quant::benchmarks(&names, &mut report);
    metal::benchmarks(&names, &mut report);
    println!("{}", report.to_json());
}

/// The wgpu figures, on the default adapter; omitted (with a note on
/// stderr) where there is none.
fn wgpu_benchmarks(names: &[String], report: &mut BenchReport) {
    const NAMES: [&str; 17] = [
        "wgpu_block_device_bytes",
        "wgpu_mlp4_device_bytes",
        "wgpu_grad_mlp4_device_bytes",
        "wgpu_fused_chain_100_4m",
        "wgpu_copy_4m",
        "wgpu_elementwise_1op_4m",
        "wgpu_matmul_1024",
        "wgpu_matmul_1024_naive",
        "wgpu_matmul_f16_1024",
        "wgpu_matmul_4096",
        "wgpu_matmul_4096_naive",
        "wgpu_matmul_f16_4096",
        "wgpu_qmm_4bit_1024x1024_m1",
        "wgpu_qmm_4bit_1024x1024_m64",
        "wgpu_scatter_add_8192x64_2048",
        "wgpu_host_overhead_10op",
        "wgpu_rss_growth_10k_calls",
    ];
    if !NAMES.iter().any(|name| selected(name, names)) {
        return;
    }
    let gpu = match WgpuBackend::new() {
        Ok(gpu) => gpu,
        Err(e) => {
            eprintln!("kiln-bench: no wgpu adapter ({e}); the wgpu figures are left out");
            return;
        }
    };
    report.adapter = Some(gpu.adapter());
    let four_m = [4 << 20];
    if selected("wgpu_fused_chain_100_4m", names) {
        let f = compile(|x: Array| chain(x, 100)).with_backend(gpu.clone());
        let ms = device_ms(&gpu, &f, ramp(&four_m), 20);
        report.record("wgpu_fused_chain_100_4m", ms, "ms");
    }
    if selected("wgpu_copy_4m", names) {
        // A reshape is a plain buffer copy into the output.
        let f = compile(|x: Array| x.reshape(&[2048, 2048])).with_backend(gpu.clone());
        let ms = device_ms(&gpu, &f, ramp(&four_m), 20);
        report.record("wgpu_copy_4m", ms, "ms");
    }
    if selected("wgpu_elementwise_1op_4m", names) {
        // The cheapest kernel that reads and writes every element: the
        // floor of any elementwise kernel on this adapter.
        let f = compile(|x: Array| x * 1.0001).with_backend(gpu.clone());
        let ms = device_ms(&gpu, &f, ramp(&four_m), 20);
        report.record("wgpu_elementwise_1op_4m", ms, "ms");
    }
    // 1024³ for a software adapter; a real GPU finishes that in about the
    // time a call takes to submit and wait, so it is timed at 4096³ too.
    let sides: &[usize] = if gpu.is_software() {
        &[1024]
    } else {
        &[1024, 4096]
    };
    for &n in sides {
        let gflops = |ms: f64| 2.0 * (n as f64).powi(3) / (ms * 1e-3) / 1e9;
        let iterations = if n > 1024 { 10 } else { 3 };
        for (name, variant) in [
            (format!("wgpu_matmul_{n}"), MatmulVariant::Tiled),
            (format!("wgpu_matmul_{n}_naive"), MatmulVariant::Naive),
        ] {
            if selected(&name, names) {
                let gpu = gpu.with_matmul_variant(variant);
                let f = compile(|(a, b): (Array, Array)| a.matmul(&b)).with_backend(gpu.clone());
                let ms = device_ms(&gpu, &f, (ramp(&[n, n]), ramp(&[n, n])), iterations);
                report.record(name, gflops(ms), "gflops");
            }
        }
        let name = format!("wgpu_matmul_f16_{n}");
        if selected(&name, names) {
            // f16 storage (native where the adapter has SHADER_F16), f32 sums.
            let half = |a: Array| {
                let h = a.cast(DType::F16);
                h.eval().expect("casts");
                h
            };
            let f = compile(|(a, b): (Array, Array)| a.matmul(&b)).with_backend(gpu.clone());
            let args = (half(ramp(&[n, n])), half(ramp(&[n, n])));
            let ms = device_ms(&gpu, &f, args, iterations);
            report.record(name, gflops(ms), "gflops");
        }
    }
    quant::wgpu_products(&gpu, names, report);
    if selected("wgpu_scatter_add_8192x64_2048", names) {
        // An embedding table's gradient: 2,048 update rows of 64 values
        // added into 8,192 rows at indices spread over the whole table.
        let f = compile(|(g, idx): (Array, Array)| g.scatter_add(&idx, 0, 8192))
            .with_backend(gpu.clone());
        let idx: Vec<i32> = (0..2048).map(|i| i * 7919 % 8192).collect();
        let idx = Array::from_vec(idx, &[2048]).expect("sized indices");
        let ms = device_ms(&gpu, &f, (ramp(&[2048, 64]), idx), 3);
        report.record("wgpu_scatter_add_8192x64_2048", ms, "ms");
    }
    if selected("wgpu_host_overhead_10op", names) {
        report.record("wgpu_host_overhead_10op", host_overhead_10op(&gpu), "us");
    }
    device_bytes_benchmarks(&gpu, names, report);
    if selected("wgpu_rss_growth_10k_calls", names) {
        match rss_growth_10k_calls(&gpu) {
            Ok(bytes) => report.record("wgpu_rss_growth_10k_calls", bytes, "bytes"),
            Err(reason) => eprintln!("kiln-bench: wgpu_rss_growth_10k_calls left out: {reason}"),
        }
    }
}

/// Bytes of device buffers a cached call of the planned graphs holds on
/// `gpu` (its program's arena: slots, constants, parameter words, status
/// words, scratch), arguments and outputs excluded; the plan's peak bytes
/// are beside them in `plan_*_peak_bytes`.
fn device_bytes_benchmarks(gpu: &WgpuBackend, names: &[String], report: &mut BenchReport) {
    let held = |run: &dyn Fn()| {
        let before = gpu.program_bytes();
        run();
        run();
        (gpu.program_bytes() - before) as f64
    };
    if selected("wgpu_block_device_bytes", names) {
        let f = compile(block_forward).with_backend(gpu.clone());
        let args = block_forward_args();
        let bytes = held(&|| drop(f.call(&args).expect("the block runs")));
        report.record("wgpu_block_device_bytes", bytes, "bytes");
    }
    if selected("wgpu_mlp4_device_bytes", names) {
        let f = compile(mlp4_forward).with_backend(gpu.clone());
        let args = mlp4_forward_args();
        let bytes = held(&|| drop(f.call(&args).expect("the MLP runs")));
        report.record("wgpu_mlp4_device_bytes", bytes, "bytes");
    }
    if selected("wgpu_grad_mlp4_device_bytes", names) {
        let step =
            compile(kiln::value_and_grad(mlp4_loss).wrt(["args[0]"])).with_backend(gpu.clone());
        let args = mlp4_arguments();
        let bytes = held(&|| drop(step.call(&args).expect("the training step runs")));
        report.record("wgpu_grad_mlp4_device_bytes", bytes, "bytes");
    }
}

/// Bytes the process's RSS grows over 10,000 calls of a small compiled
/// function, each reading its result back, after 200 warm-up calls (the
/// memory tests bound it by 2 MiB); `Err` where RSS cannot be read.
fn rss_growth_10k_calls(gpu: &WgpuBackend) -> Result<f64, String> {
    let f = compile(|x: Array| (x.exp() * 2.0 + 1.0).sum(&[0], false)).with_backend(gpu.clone());
    let x = ramp(&[64]);
    let call = || {
        f.call(&x)
            .and_then(|y| y.item::<f32>())
            .expect("the small function runs");
    };
    (0..200).for_each(|_| call());
    let before = resident_bytes()?;
    (0..10_000).for_each(|_| call());
    let after = resident_bytes()?;
    Ok(after.saturating_sub(before) as f64)
}

/// f32 values 0, 1e-6, 2e-6, ... of `shape`.
fn ramp(shape: &[usize]) -> Array {
    let n: usize = shape.iter().product();
    Array::from_vec((0..n).map(|i| i as f32 * 1e-6).collect(), shape).expect("sized data")
}

/// The median milliseconds `f`'s executable takes on the device, its
/// arguments already resident, waiting for completion each time.
fn device_ms<In: Tree + Clone, F: Fn(In) -> Out, Out: Tree>(
    gpu: &WgpuBackend,
    f: &kiln::Compiled<In, Out, F, WgpuBackend>,
    args: In,
    iterations: usize,
) -> f64 {
    device_ms_with(gpu, f, args, iterations, |gpu, outputs| {
        gpu.wait_idle().expect("device finishes");
        drop(outputs);
    })
}

/// Median milliseconds of a cached call of `f` on `args` on `backend`,
/// the device's work included: `finish` waits for it.
fn device_ms_with<B: Backend, In: Tree + Clone, F: Fn(In) -> Out, Out: Tree>(
    backend: &B,
    f: &kiln::Compiled<In, Out, F, B>,
    args: In,
    iterations: usize,
    finish: impl Fn(&B, Vec<B::Buffer>),
) -> f64 {
    let exe = f.executable(&args).expect("compiles");
    let mut leaves = Vec::new();
    args.flatten(&mut leaves).expect("flattens");
    let shapes = value_shapes(&exe, &leaves);
    let buffers: Vec<B::Buffer> = leaves
        .iter()
        .map(|a| backend.upload(&a.data().expect("data")).expect("upload"))
        .collect();
    median_micros(iterations, || {
        let outputs = backend.run(&exe, buffers.clone(), &shapes).expect("run");
        finish(backend, outputs);
    }) / 1e3
}

/// Host microseconds of a cached call of a 10-op graph on tiny inputs:
/// uploading the argument, finding the plan, recording and submitting ten
/// dispatches. The device's work is waited for outside the timed part.
fn host_overhead_10op(gpu: &WgpuBackend) -> f64 {
    let f = compile(|x: Array| chain(x, 10))
        .fusion(false)
        .with_backend(gpu.clone());
    let x = small(0);
    let exe = f.executable(&x).expect("compiles");
    let shapes = exe.resolve_shapes(&[&[4, 4]]).expect("shapes").into_owned();
    let data = x.data().expect("data");
    let mut samples = Vec::new();
    for i in 0..2_200 {
        let start = Instant::now();
        let input = gpu.upload(&data).expect("upload");
        let outputs = gpu.run(&exe, vec![input], &shapes).expect("run");
        let micros = start.elapsed().as_secs_f64() * 1e6;
        gpu.wait_idle().expect("device finishes");
        drop(outputs);
        // The first 200 calls warm the caches up.
        if i >= 200 {
            samples.push(micros);
        }
    }
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// The CPU executor's single-thread throughput figures (`cpu_unary_<op>_ns`,
/// `cpu_chain_<n>`), taken in a child process with `KILN_THREADS=1`: the
/// thread count is read once per process, and the other figures keep every
/// core.
fn cpu_benchmarks(names: &[String], report: &mut BenchReport) {
    let wanted = UNARY
        .iter()
        .map(|(op, _)| format!("cpu_unary_{op}_ns"))
        .chain(WIDE.iter().map(|(op, _)| format!("cpu_unary_{op}_wide_ns")))
        .chain(CHAINS.iter().map(|n| format!("cpu_chain_{n}")))
        .chain([format!("cpu_scalar_chain_{SCALAR_CHAIN}")])
        .chain([TRANSPOSE_FIGURE.to_string()])
        .chain(quant::CPU_FIGURES.map(String::from))
        .chain(VMAP_FIGURES.map(String::from))
        .chain(PER_EXAMPLE_FIGURES.map(String::from));
    let one_thread = wanted.into_iter().any(|name| selected(&name, names))
        || grad_wanted(names)
        || selected("export_mlp4_train_ms", names)
        || matmul::ONE_THREAD
            .iter()
            .any(|name| matmul::wanted(name, names))
        || quant::OTHER_FORMATS
            .iter()
            .any(|(format, _)| matmul::wanted(&format!("qmm_{format}_4096x4096_m1_cpu"), names))
        || names.iter().any(|n| n == "quant")
        || control::wanted(names)
        || models::cpu_wanted(names);
    if one_thread {
        cpu_child(CPU_CHILD, 1, names, report);
    }
    if matmul::TWO_THREADS
        .iter()
        .any(|name| matmul::wanted(name, names))
    {
        cpu_child(CPU_TWO_THREADS, 2, names, report);
    }
}

/// Runs this program again under `flag` with `KILN_THREADS=threads` and
/// records the figures it prints.
fn cpu_child(flag: &str, threads: usize, names: &[String], report: &mut BenchReport) {
    let child = std::env::current_exe().and_then(|exe| {
        std::process::Command::new(exe)
            .arg(flag)
            .args(names)
            .env("KILN_THREADS", threads.to_string())
            .stderr(std::process::Stdio::inherit())
            .output()
    });
    let parsed = child.map_err(|e| e.to_string()).and_then(|out| {
        serde_json::from_slice::<serde_json::Value>(&out.stdout).map_err(|e| e.to_string())
    });
    let results = match parsed {
        Ok(document) => document["results"].clone(),
        Err(reason) => {
            eprintln!(
                "kiln-bench: the {threads}-thread CPU run failed ({reason}); its figures are left out"
            );
            return;
        }
    };
    for (name, figure) in results.as_object().into_iter().flatten() {
        if let (Some(value), Some(unit)) = (figure["value"].as_f64(), figure["unit"].as_str()) {
            report.record(name.clone(), value, unit);
        }
    }
}

/// One op per cached compiled call on a 256×256 f32 array with values in
/// (−1, 1) (`log`, `sqrt` and `rsqrt` read |x| + 0.5), in ns per element;
/// and the anchors' chain in ms. Runs in the `KILN_THREADS=1` child, timed
/// in the thread's CPU time (all the work runs on it), so other processes
/// on the machine do not inflate the figures.
fn cpu_figures(names: &[String], report: &mut BenchReport) {
    let x = input();
    for (op, f) in UNARY {
        let name = format!("cpu_unary_{op}_ns");
        if !selected(&name, names) {
            continue;
        }
        let input = unary_input(op, &x);
        let compiled = compile(move |x: Array| f(&x));
        compiled.call(&input).expect("first call");
        let micros = median_cpu_micros(400, || {
            std::hint::black_box(compiled.call(&input).expect("cached call"));
        });
        report.record(name, micros * 1e3 / ELEMENTS as f64, "ns");
    }
    let wide = x.clone() * 3.0;
    wide.eval().expect("the input evaluates");
    for (op, f) in WIDE {
        let name = format!("cpu_unary_{op}_wide_ns");
        if !selected(&name, names) {
            continue;
        }
        let compiled = compile(move |x: Array| f(&x));
        compiled.call(&wide).expect("first call");
        let micros = median_cpu_micros(400, || {
            std::hint::black_box(compiled.call(&wide).expect("cached call"));
        });
        report.record(name, micros * 1e3 / ELEMENTS as f64, "ns");
    }
    for n in CHAINS {
        let name = format!("cpu_chain_{n}");
        if !selected(&name, names) {
            continue;
        }
        let compiled = compile(move |x: Array| anchor_chain(x, n));
        compiled.call(&x).expect("first call");
        let iterations = (2000 / n).max(7);
        let micros = median_cpu_micros(iterations, || {
            std::hint::black_box(compiled.call(&x).expect("cached call"));
        });
        report.record(name, micros / 1e3, "ms");
    }
    let name = format!("cpu_scalar_chain_{SCALAR_CHAIN}");
    if selected(&name, names) {
        // The cheap chain (×c, +c, −c, max c repeated): what folding scalar
        // runs into epilogues saves, with no transcendental to hide it.
        let compiled = compile(move |x: Array| scalar_chain(x, SCALAR_CHAIN));
        compiled.call(&x).expect("first call");
        let micros = median_cpu_micros(200, || {
            std::hint::black_box(compiled.call(&x).expect("cached call"));
        });
        report.record(name, micros / 1e3, "ms");
    }
}

/// The transposed copy's figure: a cached compiled call that materializes
/// the transpose of a 1024×1024 f32 array, µs.
const TRANSPOSE_FIGURE: &str = "cpu_transpose_f32_1024_us";

/// [`TRANSPOSE_FIGURE`], in the `KILN_THREADS=1` child.
fn transpose_figure(names: &[String], report: &mut BenchReport) {
    if !selected(TRANSPOSE_FIGURE, names) {
        return;
    }
    let side = 1024;
    let values: Vec<f32> = (0..side * side).map(|i| (i % 1000) as f32).collect();
    let x = Array::from_vec(values, &[side, side]).expect("the input fits");
    let transpose = compile(|x: Array| x.transpose());
    transpose.call(&x).expect("first call");
    let micros = median_cpu_micros(200, || {
        std::hint::black_box(transpose.call(&x).expect("cached call"));
    });
    report.record(TRANSPOSE_FIGURE, micros, "us");
}

/// `x * 2 + 1` as a user kernel, with a reference as direct as the
/// built-in's evaluation (one pass over the f32 data).
fn twice_plus_one_kernel() -> Kernel {
    Kernel::builder("twice_plus_one", ["x"])
        .shape_rule(|inputs, _| Ok(inputs[0].clone()))
        .reference(|call| match call.inputs[0] {
            HostData::F32(x) => Ok(HostData::F32(x.iter().map(|v| v * 2.0 + 1.0).collect())),
            other => Ok(HostData::from_f64s(
                other.dtype(),
                other.to_f64_vec().into_iter().map(|v| v * 2.0 + 1.0),
            )),
        })
        .wgsl(
            "@group(0) @binding(0) var<storage, read> params: array<u32>;
             @group(0) @binding(1) var<storage, read_write> out: array<f32>;
             @group(0) @binding(2) var<storage, read> x: array<f32>;
             @compute @workgroup_size(64)
             fn main(@builtin(global_invocation_id) id: vec3<u32>) {
                 if id.x < params[0] { out[id.x] = x[id.x] * 2.0 + 1.0; }
             }",
        )
        .build()
        .expect("the benchmark kernel is valid")
}

/// A cached call (argument upload and result read back included) of a
/// small graph holding one user kernel against the same graph with the
/// built-in ops doing the same work, on the CPU and on wgpu.
fn custom_kernel_benchmarks(names: &[String], report: &mut BenchReport) {
    let x = ramp(&[64, 64]);
    let time_call = |f: &dyn Fn(&Array) -> Array| {
        median_micros(400, || {
            let y = f(&x);
            std::hint::black_box(y.data().expect("runs"));
        })
    };
    let kernel = twice_plus_one_kernel();
    let custom = {
        let kernel = kernel.clone();
        move |x: Array| kernel.call(&[&x]).sum(&[1], false)
    };
    let builtin = |x: Array| (x * 2.0 + 1.0).sum(&[1], false);
    if selected("custom_kernel_call_cpu", names) || selected("builtin_kernel_call_cpu", names) {
        let (custom, builtin) = (compile(custom.clone()), compile(builtin));
        report.record(
            "custom_kernel_call_cpu",
            time_call(&|x| custom.call(x).expect("runs")),
            "us",
        );
        report.record(
            "builtin_kernel_call_cpu",
            time_call(&|x| builtin.call(x).expect("runs")),
            "us",
        );
    }
    if !(selected("custom_kernel_call_wgpu", names) || selected("builtin_kernel_call_wgpu", names))
    {
        return;
    }
    let gpu = match WgpuBackend::new() {
        Ok(gpu) => gpu,
        Err(e) => {
            eprintln!(
                "kiln-bench: no wgpu adapter ({e}); the custom kernel wgpu figures are left out"
            );
            return;
        }
    };
    let custom = compile(custom).with_backend(gpu.clone());
    let builtin = compile(builtin).with_backend(gpu);
    report.record(
        "custom_kernel_call_wgpu",
        time_call(&|x| custom.call(x).expect("runs")),
        "us",
    );
    report.record(
        "builtin_kernel_call_wgpu",
        time_call(&|x| builtin.call(x).expect("runs")),
        "us",
    );
}
