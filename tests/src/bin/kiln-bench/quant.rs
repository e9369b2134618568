//! `cargo xtask bench quant`: the quantized product against the fastest
//! dense product (an f32 weight already dequantized and laid out for
//! `x @ w`) and against dequantize then matmul, on the CPU executor (in the
//! one- and two-thread children) and on wgpu, and the 4-bit MLP's weight
//! bytes and planned activation peak beside the f32 model's.

use super::{device_ms, plan_memory, zeros};
use kiln::{compile, nn, quantize, quantized_matmul, Array, QuantFormat, Quantized};
use kiln_tests::bench::{median_micros, selected, BenchReport};
use kiln_wgpu::WgpuBackend;

/// The benchmarks' format: 4 bits, groups of 64.
const FORMAT: QuantFormat = QuantFormat::Affine {
    bits: 4,
    group_size: 64,
};

/// Every benchmark of the group.
const NAMES: [&str; 7] = [
    "qmm_4bit_4096x4096",
    "dense_matmul_4096x4096",
    "dequant_then_matmul_4096x4096",
    "mlp4_q4_weight_bytes",
    "mlp4_f32_weight_bytes",
    "plan_mlp4_q4_peak_bytes",
    "plan_mlp4_peak_bytes",
];

/// True when `name` runs: named by prefix, or the whole group by `quant`.
fn wanted(name: &str, names: &[String]) -> bool {
    names.iter().any(|n| n == "quant") || selected(name, names)
}

/// The weight of `args[1..]` (packed codes, scales and, for the affine
/// formats, biases) in `format`.
fn weight(args: &[Array], format: QuantFormat) -> Quantized {
    Quantized {
        packed: args[1].clone(),
        scales: args[2].clone(),
        biases: args.get(3).cloned(),
        format,
    }
}

/// `x @ wᵀ` read from the packed codes.
fn quantized(args: Vec<Array>) -> Array {
    quantized_matmul(&args[0], &weight(&args, FORMAT), true)
}

/// The same product through the dequantized weight.
fn dequantized(args: Vec<Array>) -> Array {
    args[0].matmul(&weight(&args, FORMAT).dequantize().transpose())
}

/// `x @ w` with the weight dense f32, dequantized and transposed before
/// the call: the fastest dense path, the honest baseline of the speedup.
fn dense(args: Vec<Array>) -> Array {
    args[0].matmul(&args[1])
}

/// `[x, wᵀ]`: the dense baseline's arguments for the quantized `args`.
fn dense_arguments(args: &[Array]) -> Vec<Array> {
    let w = weight(args, FORMAT).dequantize().transpose();
    let w = Array::from_data(
        (*w.data().expect("dequantizes")).clone(),
        &w.shape().as_known().expect("known"),
    )
    .expect("sized");
    vec![args[0].clone(), w]
}

/// `[x, packed, scales, biases]` of an `m`×4096 x and a 4096×4096 weight.
fn arguments(m: usize) -> Vec<Array> {
    square_arguments(m, 4096, FORMAT)
}

/// `[x, packed, scales, biases]` of an `m`×`n` x and an `n`×`n` weight in
/// `format` (no biases where it has none).
fn square_arguments(m: usize, n: usize, format: QuantFormat) -> Vec<Array> {
    let ramp = |len: usize| (0..len).map(|i| ((i % 1000) as f32 - 500.0) * 1e-3);
    let w = Array::from_vec(ramp(n * n).collect(), &[n, n]).expect("sized");
    let q = quantize(&w, format);
    let mut args = vec![Array::from_vec(ramp(m * n).collect(), &[m, n]).expect("sized")];
    args.extend([q.packed, q.scales]);
    args.extend(q.biases);
    for a in &args {
        a.eval().expect("quantizes");
    }
    args
}

/// `wgpu_qmm_4bit_1024x1024_m{1,64}`: the 4-bit product `x @ wᵀ` of a
/// 1024×1024 weight on wgpu, in µs, sized for a software adapter (lavapipe):
/// at m = 64 the tiled kernel, at m = 1 the streaming one.
pub(crate) fn wgpu_products(gpu: &WgpuBackend, names: &[String], report: &mut BenchReport) {
    for (m, iterations) in [(1, 20), (64, 5)] {
        let name = format!("wgpu_qmm_4bit_1024x1024_m{m}");
        if selected(&name, names) {
            let q = compile(quantized).with_backend(gpu.clone());
            let us = device_ms(gpu, &q, square_arguments(m, 1024, FORMAT), iterations) * 1e3;
            report.record(name, us, "us");
        }
    }
}

pub(crate) fn benchmarks(names: &[String], report: &mut BenchReport) {
    if !NAMES.iter().any(|name| wanted(name, names)) {
        return;
    }
    weight_bytes(names, report);
    let products = [
        "qmm_4bit_4096x4096",
        "dense_matmul_4096x4096",
        "dequant_then_matmul_4096x4096",
    ];
    if !products.iter().any(|name| wanted(name, names)) {
        return;
    }
    let Ok(gpu) = WgpuBackend::new().map_err(|e| {
        eprintln!("kiln-bench: no wgpu adapter ({e}); the wgpu qmm figures are left out")
    }) else {
        return;
    };
    report.adapter = Some(gpu.adapter());
    for (m, iterations) in [(1, 10), (64, 2)] {
        let args = arguments(m);
        let dense_args = dense_arguments(&args);
        let q = compile(quantized).with_backend(gpu.clone());
        let f = compile(dense).with_backend(gpu.clone());
        let d = compile(dequantized).with_backend(gpu.clone());
        let us = Products {
            quantized: device_ms(&gpu, &q, args.clone(), iterations) * 1e3,
            dense: device_ms(&gpu, &f, dense_args, iterations) * 1e3,
            dequantized: device_ms(&gpu, &d, args, iterations) * 1e3,
        };
        record(report, m, "wgpu", us);
    }
}

/// The CPU product figures of the one-thread child.
pub(crate) const CPU_FIGURES: [&str; 6] = [
    "qmm_4bit_4096x4096_m1_cpu",
    "qmm_4bit_4096x4096_m64_cpu",
    "dense_matmul_4096x4096_m1_cpu",
    "dense_matmul_4096x4096_m64_cpu",
    "dequant_then_matmul_4096x4096_m1_cpu",
    "dequant_then_matmul_4096x4096_m64_cpu",
];

/// True when a CPU product figure runs in the child whose figures end in
/// `suffix` (`""` at one thread, `"_2t"` at two): named by prefix, or by
/// the `quant` or `matmul` group.
fn cpu_wanted(m: usize, suffix: &str, names: &[String]) -> bool {
    let names_of = |product: &str| format!("{product}_4096x4096_m{m}_cpu{suffix}");
    let group = names.iter().any(|n| n == "quant") && suffix.is_empty();
    group
        || super::matmul::wanted(&names_of("qmm_4bit"), names)
        || selected(&names_of("dequant_then_matmul"), names)
        || selected(&names_of("dense_matmul"), names)
}

/// The quantized product and dequantize then matmul on the CPU executor,
/// in wall time (at two threads both threads work), as
/// `qmm_4bit_4096x4096_m{1,64}_cpu{suffix}`.
pub(crate) fn cpu_products(names: &[String], suffix: &str, report: &mut BenchReport) {
    for (m, iterations) in [(1, 40), (64, 5)] {
        if !cpu_wanted(m, suffix, names) {
            continue;
        }
        let args = arguments(m);
        let dense_args = dense_arguments(&args);
        let q = compile(quantized);
        let f = compile(dense);
        let d = compile(dequantized);
        let time = |f: &dyn Fn() -> Array| {
            median_micros(iterations, || {
                std::hint::black_box(f().data().expect("runs"));
            })
        };
        let us = Products {
            quantized: time(&|| q.call(&args).expect("runs")),
            dense: time(&|| f.call(&dense_args).expect("runs")),
            dequantized: time(&|| d.call(&args).expect("runs")),
        };
        record(report, m, &format!("cpu{suffix}"), us);
    }
}

/// The formats of `qmm_{name}_4096x4096_m1_cpu`: every format
/// `quantized_matmul` takes besides the benchmark format, named as in the
/// figures.
pub(crate) const OTHER_FORMATS: [(&str, QuantFormat); 7] = [
    (
        "2bit",
        QuantFormat::Affine {
            bits: 2,
            group_size: 64,
        },
    ),
    (
        "3bit",
        QuantFormat::Affine {
            bits: 3,
            group_size: 64,
        },
    ),
    (
        "5bit",
        QuantFormat::Affine {
            bits: 5,
            group_size: 64,
        },
    ),
    (
        "6bit",
        QuantFormat::Affine {
            bits: 6,
            group_size: 64,
        },
    ),
    (
        "8bit",
        QuantFormat::Affine {
            bits: 8,
            group_size: 64,
        },
    ),
    ("nf4", QuantFormat::Nf4),
    ("int8", QuantFormat::Int8),
];

/// `qmm_{name}_4096x4096_m1_cpu` for each of [`OTHER_FORMATS`]: one row
/// times a 4096×4096 weight, in µs, and `..._gbs`, the weight's bytes
/// (codes, scales and biases) over that time, to hold against
/// `cpu_read_bandwidth_gbs` (the memory limit).
pub(crate) fn format_products(names: &[String], report: &mut BenchReport) {
    for (name, format) in OTHER_FORMATS {
        let figure = format!("qmm_{name}_4096x4096_m1_cpu");
        if !super::matmul::wanted(&figure, names) {
            continue;
        }
        let args = square_arguments(1, 4096, format);
        let weight_bytes: usize = args[1..]
            .iter()
            .map(|a| a.data().expect("data").size_bytes())
            .sum();
        let product = compile(move |args: Vec<Array>| {
            quantized_matmul(&args[0], &weight(&args, format), true)
        });
        let us = median_micros(40, || {
            std::hint::black_box(product.call(&args).expect("runs").data().expect("runs"));
        });
        report.record(figure.clone(), us, "us");
        report.record(
            format!("{figure}_gbs"),
            weight_bytes as f64 / us / 1e3,
            "GB/s",
        );
    }
}

/// Microseconds of the three products of one shape.
struct Products {
    quantized: f64,
    dense: f64,
    dequantized: f64,
}

/// The products' microseconds and the speedup over the fastest dense path
/// (dense over quantized: above 1 when the quantized product is faster).
fn record(report: &mut BenchReport, m: usize, backend: &str, us: Products) {
    let name = |product: &str| format!("{product}_4096x4096_m{m}_{backend}");
    report.record(name("qmm_4bit"), us.quantized, "us");
    report.record(name("dense_matmul"), us.dense, "us");
    report.record(name("dequant_then_matmul"), us.dequantized, "us");
    report.record(
        format!("qmm_4bit_4096x4096_m{m}_{backend}_speedup"),
        us.dense / us.quantized,
        "x",
    );
}

/// The MLP of `plan_mlp4` (x 256×1024, four 1024×1024 layers, gelu
/// between) with 4-bit weights: its weight bytes against the f32 model's,
/// and the planned peak of its computed values against the f32 model's.
fn weight_bytes(names: &[String], report: &mut BenchReport) {
    let wanted_any = [
        "mlp4_q4_weight_bytes",
        "mlp4_f32_weight_bytes",
        "plan_mlp4_q4_peak_bytes",
        "plan_mlp4_peak_bytes",
    ]
    .iter()
    .any(|name| wanted(name, names));
    if !wanted_any {
        return;
    }
    let f32_weights: Vec<Array> = (0..4).map(|_| zeros(&[1024, 1024])).collect();
    let mut q_args = vec![zeros(&[256, 1024])];
    for w in &f32_weights {
        // Stored [out, in] and multiplied transposed, as MLX lays it out.
        let q = quantize(&w.transpose(), FORMAT);
        q_args.extend([q.packed, q.scales, q.biases.expect("affine has biases")]);
    }
    for a in &q_args {
        a.eval().expect("quantizes");
    }
    let bytes = |arrays: &[Array]| -> usize {
        arrays
            .iter()
            .map(|a| a.data().expect("data").size_bytes())
            .sum()
    };
    report.record("mlp4_f32_weight_bytes", bytes(&f32_weights) as f64, "bytes");
    report.record("mlp4_q4_weight_bytes", bytes(&q_args[1..]) as f64, "bytes");
    let layers = |h0: &Array, layer: &dyn Fn(usize, &Array) -> Array| {
        (0..4).fold(h0.clone(), |h, i| {
            let h = layer(i, &h);
            if i < 3 {
                nn::gelu(&h)
            } else {
                h
            }
        })
    };
    let q4 = compile(move |args: Vec<Array>| {
        layers(&args[0], &|i, h| {
            let w = Quantized {
                packed: args[1 + 3 * i].clone(),
                scales: args[2 + 3 * i].clone(),
                biases: Some(args[3 + 3 * i].clone()),
                format: FORMAT,
            };
            quantized_matmul(h, &w, true)
        })
    });
    let exe = q4.executable(&q_args).expect("compiles");
    report.record(
        "plan_mlp4_q4_peak_bytes",
        plan_memory(&exe, &q_args).peak_bytes as f64,
        "bytes",
    );
    let mut f32_args = vec![zeros(&[256, 1024])];
    f32_args.extend(f32_weights);
    let f = compile(move |args: Vec<Array>| layers(&args[0], &|i, h| h.matmul(&args[1 + i])));
    let exe = f.executable(&f32_args).expect("compiles");
    report.record(
        "plan_mlp4_peak_bytes",
        plan_memory(&exe, &f32_args).peak_bytes as f64,
        "bytes",
    );
}
