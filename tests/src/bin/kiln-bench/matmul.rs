//! `cargo xtask bench matmul`: dense f32/f16 products, the one-core read
//! bandwidth that bounds a GEMV and the FMA rates that bound a product, and
//! the quantized products (4-bit, and one row times a weight of each other
//! format), on the CPU executor. Runs in the children the program starts
//! with `KILN_THREADS` set (one thread, and two for the `_2t` figures).

use super::{fma_peak, quant};
use kiln::{compile, Array, DType};
use kiln_tests::bench::{median_cpu_micros, median_micros, selected, BenchReport};

/// The group's name on the command line.
pub(crate) const GROUP: &str = "matmul";

/// The figures taken at one thread.
pub(crate) const ONE_THREAD: [&str; 11] = [
    "cpu_fma_peak_128_gflops",
    "cpu_fma_peak_256_gflops",
    "cpu_fma_peak_512_gflops",
    "cpu_gemv_f32_256_us",
    "cpu_matmul_f32_256_gflops",
    "cpu_matmul_f32_1024_gflops",
    "cpu_matmul_f32_64x4096x4096_ms",
    "cpu_matmul_f16_1024_gflops",
    "cpu_read_bandwidth_gbs",
    "qmm_4bit_4096x4096_m1_cpu",
    "qmm_4bit_4096x4096_m64_cpu",
];

/// The figures taken at two threads.
pub(crate) const TWO_THREADS: [&str; 2] = [
    "qmm_4bit_4096x4096_m1_cpu_2t",
    "qmm_4bit_4096x4096_m64_cpu_2t",
];

/// True when `name` runs: named by prefix, or the whole group by `matmul`.
pub(crate) fn wanted(name: &str, names: &[String]) -> bool {
    names.iter().any(|n| n == GROUP) || selected(name, names)
}

/// A `[rows, cols]` array of `dtype` with values in [-1, 1).
fn matrix(rows: usize, cols: usize, dtype: DType) -> Array {
    let values = (0..rows * cols).map(|i| ((i * 7919) % 2000) as f32 / 1000.0 - 1.0);
    let a = Array::from_vec(values.collect(), &[rows, cols])
        .expect("sized")
        .cast(dtype);
    a.eval().expect("the input evaluates");
    a
}

/// Median milliseconds of a cached compiled `a @ b` (`m`×`k`·`k`×`n`),
/// in the thread's CPU time (the work runs on this one thread).
fn product_ms(m: usize, k: usize, n: usize, dtype: DType, iterations: usize) -> f64 {
    let args = (matrix(m, k, dtype), matrix(k, n, dtype));
    let f = compile(|(a, b): (Array, Array)| a.matmul(&b));
    f.call(&args).expect("first call");
    median_cpu_micros(iterations, || {
        std::hint::black_box(f.call(&args).expect("cached call").data().expect("runs"));
    }) / 1e3
}

/// GFLOP/s of an `n`³ product.
fn gflops(n: usize, dtype: DType, iterations: usize) -> f64 {
    2.0 * (n as f64).powi(3) / (product_ms(n, n, n, dtype, iterations) * 1e-3) / 1e9
}

/// GB/s of a plain sum over 64 MiB of f32 on this thread: the rate at
/// which one core streams memory, what a GEMV can approach.
pub fn read_bandwidth_gbs() -> f64 {
    let values: Vec<f32> = (0..16 << 20).map(|i| (i % 7) as f32).collect();
    let micros = median_micros(15, || {
        // Sixteen partial sums keep the adds off the critical path, so
        // the loop waits on memory, not on the adder.
        let mut acc = [0.0f32; 16];
        for chunk in values.chunks_exact(16) {
            for (a, v) in acc.iter_mut().zip(chunk) {
                *a += v;
            }
        }
        std::hint::black_box(acc);
    });
    (values.len() * 4) as f64 / (micros * 1e-6) / 1e9
}

/// The one-thread figures (the child with `KILN_THREADS=1`).
pub(crate) fn one_thread(names: &[String], report: &mut BenchReport) {
    for (name, figure) in fma_peak::peaks(names) {
        report.record(name, figure, "gflops");
    }
    if wanted("cpu_gemv_f32_256_us", names) {
        // One step of a recurrent network's `[1, 256]·[256, 256]`, the
        // compiled call's overhead included.
        let us = product_ms(1, 256, 256, DType::F32, 20_000) * 1e3;
        report.record("cpu_gemv_f32_256_us", us, "us");
    }
    if wanted("cpu_matmul_f32_256_gflops", names) {
        report.record(
            "cpu_matmul_f32_256_gflops",
            gflops(256, DType::F32, 200),
            "gflops",
        );
    }
    if wanted("cpu_matmul_f32_1024_gflops", names) {
        report.record(
            "cpu_matmul_f32_1024_gflops",
            gflops(1024, DType::F32, 15),
            "gflops",
        );
    }
    if wanted("cpu_matmul_f32_64x4096x4096_ms", names) {
        report.record(
            "cpu_matmul_f32_64x4096x4096_ms",
            product_ms(64, 4096, 4096, DType::F32, 10),
            "ms",
        );
    }
    if wanted("cpu_matmul_f16_1024_gflops", names) {
        report.record(
            "cpu_matmul_f16_1024_gflops",
            gflops(1024, DType::F16, 15),
            "gflops",
        );
    }
    if wanted("cpu_read_bandwidth_gbs", names) {
        report.record("cpu_read_bandwidth_gbs", read_bandwidth_gbs(), "GB/s");
    }
    quant::cpu_products(names, "", report);
    quant::format_products(names, report);
}

/// The two-thread figures (the child with `KILN_THREADS=2`).
pub(crate) fn two_threads(names: &[String], report: &mut BenchReport) {
    quant::cpu_products(names, "_2t", report);
}
