//! `cargo xtask bench control`: loops under compile. A tanh RNN cell
//! (hidden 256, 1,000 steps) as one `scan` node against the same loop
//! unrolled at trace time (first call: trace + passes + plan; cached call),
//! and a decoding loop writing one row of a KV cache per step with
//! `dynamic_update_slice`, whose planned peak must not grow with its steps.
//! Runs in the one-thread child.

use kiln::{compile, scan, Array, DType, Result};
use kiln_tests::bench::{median_micros, selected, time_once_ms, BenchReport};
use kiln_tests::decoding::decode;

/// The figures of [`benchmarks`].
pub const FIGURES: [&str; 7] = [
    "scan_rnn_1000_first_call",
    "scan_rnn_1000_cached",
    "unrolled_rnn_1000_first_call",
    "unrolled_rnn_1000_cached",
    "kv_decode_16_peak_bytes",
    "kv_decode_256_peak_bytes",
    "kv_decode_256_cached",
];

const HIDDEN: usize = 256;
const STEPS: usize = 1000;

/// True when any figure runs: named by prefix, or the `control` group.
pub fn wanted(names: &[String]) -> bool {
    names.iter().any(|n| n == "control") || FIGURES.iter().any(|f| selected(f, names))
}

fn figure(name: &str, names: &[String]) -> bool {
    names.iter().any(|n| n == "control") || selected(name, names)
}

fn normal(seed: u64, shape: &[usize]) -> Array {
    Array::random_normal(kiln::random::Key::new(seed), shape, DType::F32).expect("normal")
}

type RnnArgs = (Array, Array, Array);

fn rnn_args() -> RnnArgs {
    (
        normal(1, &[1, HIDDEN]),
        normal(2, &[HIDDEN, HIDDEN]) * (1.0 / (HIDDEN as f32).sqrt()),
        normal(3, &[STEPS, 1, HIDDEN]),
    )
}

/// The final state of the RNN `h ← tanh(h·w + x)`, as a scan.
fn rnn_scan((h, w, xs): RnnArgs) -> Result<Array> {
    let (h, ()) = scan(
        |h: Array, x: Array| Ok(((h.matmul(&w) + x).tanh(), ())),
        &h,
        &xs,
    )?;
    Ok(h)
}

/// The same loop unrolled at trace time (what a Rust loop in a compiled
/// function becomes without `scan`).
fn rnn_unrolled((h, w, xs): RnnArgs) -> Array {
    (0..STEPS).fold(h, |h, i| {
        let x = xs
            .slice_axis(0, i as i64, Some(i as i64 + 1), 1)
            .squeeze(&[0]);
        (h.matmul(&w) + x).tanh()
    })
}

fn decode_args(steps: usize) -> (Array, Array, Array) {
    kiln_tests::decoding::decode_args(steps, 64)
}

/// The planned peak of one decoding call: the enclosing plan's arena plus
/// the body's, which is planned once and reused every step.
fn decode_peak(steps: usize) -> f64 {
    let f = compile(decode(steps));
    f.prepare(&decode_args(steps))
        .expect("the decoding loop compiles");
    f.cache().reports[0].total_peak_bytes() as f64
}

/// Records the control-flow figures that `names` select.
pub fn benchmarks(names: &[String], report: &mut BenchReport) {
    if !wanted(names) {
        return;
    }
    let args = rnn_args();
    for input in [&args.0, &args.1, &args.2] {
        input.eval().expect("inputs");
    }
    if figure("scan_rnn_1000_first_call", names) || figure("scan_rnn_1000_cached", names) {
        let f = compile(rnn_scan);
        let first = time_once_ms(|| {
            f.call(&args).expect("the scan runs");
        });
        report.record("scan_rnn_1000_first_call", first, "ms");
        let cached = median_micros(10, || {
            std::hint::black_box(f.call(&args).expect("cached scan"));
        });
        report.record("scan_rnn_1000_cached", cached / 1e3, "ms");
    }
    if figure("unrolled_rnn_1000_first_call", names) || figure("unrolled_rnn_1000_cached", names) {
        let f = compile(rnn_unrolled);
        let first = time_once_ms(|| {
            f.call(&args).expect("the unrolled loop runs");
        });
        report.record("unrolled_rnn_1000_first_call", first, "ms");
        let cached = median_micros(10, || {
            std::hint::black_box(f.call(&args).expect("cached unrolled loop"));
        });
        report.record("unrolled_rnn_1000_cached", cached / 1e3, "ms");
    }
    for steps in [16, 256] {
        let name = format!("kv_decode_{steps}_peak_bytes");
        if figure(&name, names) {
            report.record(name, decode_peak(steps), "bytes");
        }
    }
    if figure("kv_decode_256_cached", names) {
        let f = compile(decode(256));
        let args = decode_args(256);
        f.call(&args).expect("decoding runs");
        let cached = median_micros(10, || {
            std::hint::black_box(f.call(&args).expect("cached decoding"));
        });
        report.record("kv_decode_256_cached", cached / 1e3, "ms");
    }
}

/// The wgpu figures of `switch`: a `cond` whose branches are each a
/// 512×512 matmul against that matmul alone. The GPU lowering runs every
/// branch and selects (no readback stalls the queue), so the first costs
/// about twice the second.
///
/// And a `while_loop` of 100 iterations (a counter and a `[1024]` update)
/// against the same body as a `fori_loop`: the while loop reads its
/// predicate back every iteration (one submission and wait each), the
/// `fori_loop` records its 100 iterations into one submission. Both
/// figures include reading the result back.
pub const WGPU_FIGURES: [&str; 4] = [
    "wgpu_cond_both_branches_ms",
    "wgpu_cond_one_branch_ms",
    "wgpu_while_100_ms",
    "wgpu_fori_100_ms",
];

/// Records the wgpu control-flow figures `names` select, on `gpu`.
pub fn wgpu_benchmarks(names: &[String], gpu: &kiln_wgpu::WgpuBackend, report: &mut BenchReport) {
    if !WGPU_FIGURES.iter().any(|f| figure(f, names)) {
        return;
    }
    let a = normal(11, &[512, 512]);
    let b = normal(12, &[512, 512]);
    let pred = Array::scalar(1.0, DType::Bool);
    let both = compile(|(p, a, b): (Array, Array, Array)| {
        kiln::cond(
            &p,
            |(a, b): (Array, Array)| Ok(a.matmul(&b)),
            |(a, b): (Array, Array)| Ok(b.matmul(&a)),
            &(a, b),
        )
    })
    .with_backend(gpu.clone());
    let one = compile(|(a, b): (Array, Array)| a.matmul(&b)).with_backend(gpu.clone());
    let args = (pred, a.clone(), b.clone());
    both.call(&args).expect("cond runs");
    one.call(&(a.clone(), b.clone())).expect("matmul runs");
    let both_ms = median_micros(5, || {
        let out = both.call(&args).expect("cond runs");
        out.eval().expect("cond result");
    }) / 1e3;
    let one_ms = median_micros(5, || {
        one.call(&(a.clone(), b.clone()))
            .expect("matmul runs")
            .eval()
            .expect("matmul result");
    }) / 1e3;
    report.record("wgpu_cond_both_branches_ms", both_ms, "ms");
    report.record("wgpu_cond_one_branch_ms", one_ms, "ms");
    let step = |x: &Array| x * 1.01 + 1.0;
    let while_100 = compile(move |x: Array| {
        let (_, x) = kiln::while_loop(
            |(i, _): (Array, Array)| Ok(i.less(100)),
            move |(i, x): (Array, Array)| Ok((i + 1, step(&x))),
            &(Array::scalar(0.0, DType::I32), x),
        )?;
        Ok::<_, kiln::Error>(x)
    })
    .with_backend(gpu.clone());
    let fori_100 =
        compile(move |x: Array| kiln::fori_loop(0, 100, move |_, x: Array| Ok(step(&x)), &x))
            .with_backend(gpu.clone());
    let x = normal(13, &[1024]);
    let while_ms = loop_ms(|| while_100.call(&x));
    let fori_ms = loop_ms(|| fori_100.call(&x));
    report.record("wgpu_while_100_ms", while_ms, "ms");
    report.record("wgpu_fori_100_ms", fori_ms, "ms");
}

/// The median milliseconds of a loop's cached call, its result read back.
fn loop_ms(call: impl Fn() -> kiln::Result<Array>) -> f64 {
    let run = || {
        call()
            .and_then(|x| x.to_vec::<f32>())
            .expect("the loop's result")
    };
    run();
    median_micros(5, || drop(run())) / 1e3
}
