//! Kiln's benchmarks: prints one JSON document (see DESIGN.md, Benchmarks).
//! `cargo xtask bench [NAME...]` runs it in release mode.

use kiln::{compile, Array, Backend, DType, Tree};
use kiln_tests::bench::{median_micros, selected, time_once_ms, BenchReport};
use kiln_wgpu::{MatmulVariant, WgpuBackend, WgpuBuffer};
use std::collections::BTreeMap;
use std::time::Instant;

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
    (0..n).fold(x, |x, i| match i % 4 {
        0 => x * 1.0001,
        1 => x + 0.001,
        2 => x - 0.0005,
        _ => x.maximum(-10.0),
    })
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

fn main() {
    let names: Vec<String> = std::env::args().skip(1).collect();
    let mut report = BenchReport::new();
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
    wgpu_benchmarks(&names, &mut report);
    println!("{}", report.to_json());
}

/// The wgpu figures, on the default adapter; omitted (with a note on
/// stderr) where there is none.
fn wgpu_benchmarks(names: &[String], report: &mut BenchReport) {
    const NAMES: [&str; 5] = [
        "wgpu_fused_chain_100_4m",
        "wgpu_copy_4m",
        "wgpu_matmul_1024",
        "wgpu_matmul_1024_naive",
        "wgpu_host_overhead_10op",
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
    for (name, variant) in [
        ("wgpu_matmul_1024", MatmulVariant::Tiled),
        ("wgpu_matmul_1024_naive", MatmulVariant::Naive),
    ] {
        if selected(name, names) {
            let gpu = gpu.with_matmul_variant(variant);
            let f = compile(|(a, b): (Array, Array)| a.matmul(&b)).with_backend(gpu.clone());
            let ms = device_ms(&gpu, &f, (ramp(&[1024, 1024]), ramp(&[1024, 1024])), 3);
            report.record(name, 2.0 * 1024f64.powi(3) / (ms * 1e-3) / 1e9, "gflops");
        }
    }
    if selected("wgpu_host_overhead_10op", names) {
        report.record("wgpu_host_overhead_10op", host_overhead_10op(&gpu), "us");
    }
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
    let exe = f.executable(&args).expect("compiles");
    let mut leaves = Vec::new();
    args.flatten(&mut leaves).expect("flattens");
    let shapes: Vec<Vec<usize>> = leaves
        .iter()
        .map(|a| a.shape().as_known().expect("known shape"))
        .collect();
    let refs: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
    let shapes = exe.resolve_shapes(&refs).expect("shapes").into_owned();
    let buffers: Vec<WgpuBuffer> = leaves
        .iter()
        .map(|a| gpu.upload(&a.data().expect("data")).expect("upload"))
        .collect();
    median_micros(iterations, || {
        let outputs = gpu.run(&exe, buffers.clone(), &shapes).expect("run");
        gpu.wait_idle().expect("device finishes");
        drop(outputs);
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
