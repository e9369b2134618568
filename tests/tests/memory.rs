//! Steady-state memory: once warm, calling a compiled function again and
//! again (or cycling a shapeless one through sizes it has already seen)
//! does not grow the process's resident memory, on wgpu and on the CPU;
//! the pools keep what the next call needs and no more.
//!
//! RSS is read from `/proc/self/statm` (Linux only; elsewhere the tests
//! skip and say why). The tests hold one lock so that no two of them run
//! at once: each one's growth would otherwise include the other's.
//! Ten thousand calls take about 3 s on lavapipe in a debug build, so the
//! count is fixed rather than a knob.

use kiln::{compile, Array, Backend, CpuBackend};
use kiln_tests::rss::resident_bytes;
use kiln_wgpu::{PoolStats, MAX_IDLE_BUFFERS, MAX_IDLE_BYTES};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Held by every test of this binary for its whole run, opening the
/// backend included (opening lavapipe alone adds tens of MB).
static SERIAL: Mutex<()> = Mutex::new(());

/// Waits until no other test of this binary runs.
fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The most a warm process may grow over its measured calls: a leak of
/// even 200 bytes per call would pass it over 10,000 calls, while the
/// allocator's own fluctuation (a few pages) stays well below it.
const GROWTH_LIMIT: u64 = 2 << 20;

/// Calls before the first measurement: plans, pipelines, pools and the
/// allocator's arenas reach their working size.
const WARM_UP_CALLS: usize = 200;

/// Distinct sizes a shapeless function is cycled through (2 to 201: a
/// shapeless trace keeps a dim of 1 concrete, since it decides
/// broadcasting, so size 1 would need a trace of its own).
const SIZES: usize = 200;

/// Cycles through [`SIZES`]; the first one warms up.
const CYCLES: usize = 5;

/// Calls measured after the warm-up.
const CALLS: usize = 10_000;

/// RSS now, or `None` after printing why this test skips.
fn rss_or_skip() -> Option<u64> {
    match resident_bytes() {
        Ok(bytes) => Some(bytes),
        Err(reason) => {
            eprintln!("skipping memory test: {reason}");
            None
        }
    }
}

/// `(exp(x) * 2 + 1).sum()` over the first axis, compiled for `backend`.
fn small_function<B: Backend>(backend: B) -> impl Fn(&Array) -> f32 {
    let f = compile(|x: Array| (x.exp() * 2.0 + 1.0).sum(&[0], false)).with_backend(backend);
    move |x| {
        f.call(x)
            .and_then(|y| y.item::<f32>())
            .expect("the small function runs")
    }
}

/// `n` elements `0, 1/n, 2/n, …`; their function value is known in closed form.
fn ramp(n: usize) -> Array {
    let values = (0..n).map(|i| i as f32 / n as f32).collect();
    Array::from_vec(values, &[n]).expect("a ramp")
}

/// `sum(exp(x) * 2 + 1)` of [`ramp`]`(n)`, in f64.
fn expected(n: usize) -> f64 {
    (0..n)
        .map(|i| (i as f64 / n as f64).exp() * 2.0 + 1.0)
        .sum()
}

fn assert_close(got: f32, n: usize) {
    let want = expected(n);
    assert!(
        (f64::from(got) - want).abs() <= 1e-4 * want.abs().max(1.0),
        "size {n}: got {got}, want {want}"
    );
}

/// Warms `backend` up, then asserts [`CALLS`] more calls of one compiled
/// function, each reading its result back, grow RSS by at most
/// [`GROWTH_LIMIT`].
fn steady_calls_stay_flat<B: Backend>(backend: B) {
    let f = small_function(backend);
    let x = ramp(64);
    for _ in 0..WARM_UP_CALLS {
        assert_close(f(&x), 64);
    }
    let Some(before) = rss_or_skip() else {
        return;
    };
    for _ in 0..CALLS {
        assert_close(f(&x), 64);
    }
    let after = resident_bytes().expect("RSS was readable before");
    let growth = after.saturating_sub(before);
    eprintln!("RSS {before} -> {after} bytes over {CALLS} calls (growth {growth})");
    assert!(
        growth <= GROWTH_LIMIT,
        "RSS grew by {growth} bytes over {CALLS} warm calls (limit {GROWTH_LIMIT})"
    );
}

/// Cycles a shapeless compile of the small function through [`SIZES`]
/// sizes [`CYCLES`] times and asserts RSS grows by at most
/// [`GROWTH_LIMIT`] between the end of the second cycle and the end of the
/// last: the first cycle builds what every size needs and the second lets
/// the allocator settle, after which each cycle repeats the same work. On
/// wgpu, which keeps plans for 16 shape sets per executable, every call
/// of the cycle builds a plan and evicts one, so this also checks that an
/// evicted plan releases its buffers and bind groups.
fn shapeless_cycles_stay_flat<B: Backend>(backend: B) {
    let f = compile(|x: Array| (x.exp() * 2.0 + 1.0).sum(&[0], false))
        .shapeless()
        .with_backend(backend);
    let inputs: Vec<(usize, Array)> = (2..SIZES + 2).map(|n| (n, ramp(n))).collect();
    let mut after_cycle = Vec::with_capacity(CYCLES);
    for _ in 0..CYCLES {
        for (n, x) in &inputs {
            let y = f.call(x).and_then(|y| y.item::<f32>());
            assert_close(y.expect("the shapeless function runs"), *n);
        }
        match rss_or_skip() {
            Some(bytes) => after_cycle.push(bytes),
            None => return,
        }
    }
    assert_eq!(f.cache().entries, 1, "new sizes reuse the one trace");
    eprintln!("RSS after each cycle of {SIZES} sizes: {after_cycle:?}");
    let growth = after_cycle[CYCLES - 1].saturating_sub(after_cycle[1]);
    assert!(
        growth <= GROWTH_LIMIT,
        "RSS grew by {growth} bytes from cycle 2 to cycle {CYCLES} (limit {GROWTH_LIMIT}): \
         {after_cycle:?}"
    );
}

#[test]
fn warm_wgpu_calls_do_not_grow_rss() {
    let _serial = serial();
    if let Some(gpu) = kiln_tests::gpu::backend() {
        steady_calls_stay_flat(gpu);
    }
}

#[test]
fn shapeless_wgpu_cycling_through_sizes_does_not_grow_rss() {
    let _serial = serial();
    if let Some(gpu) = kiln_tests::gpu::backend() {
        shapeless_cycles_stay_flat(gpu);
    }
}

#[test]
fn shapeless_wgpu_calls_over_ever_new_sizes_keep_at_most_the_pool_limit_idle() {
    let _serial = serial();
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let f = compile(|x: Array| (x.exp() * 2.0 + 1.0).sum(&[0], false))
        .shapeless()
        .with_backend(gpu.clone());
    // Every call returns an argument buffer of a size never seen before:
    // without a limit the pool would keep one per size.
    let sizes = 2..MAX_IDLE_BUFFERS + 202;
    for n in sizes.clone() {
        let y = f.call(&ramp(n)).and_then(|y| y.item::<f32>());
        assert_close(y.expect("the shapeless function runs"), n);
        let pool = gpu.pool();
        assert!(
            pool.idle_buffers <= MAX_IDLE_BUFFERS && pool.idle_bytes <= MAX_IDLE_BYTES,
            "after size {n} the pool keeps {pool:?}"
        );
    }
    assert_eq!(
        gpu.pool().idle_buffers,
        MAX_IDLE_BUFFERS,
        "{} sizes fill the pool to its limit and no further",
        sizes.len()
    );
}

#[test]
fn warm_cpu_calls_do_not_grow_rss() {
    let _serial = serial();
    steady_calls_stay_flat(CpuBackend);
}

#[test]
fn shapeless_cpu_cycling_through_sizes_does_not_grow_rss() {
    let _serial = serial();
    shapeless_cycles_stay_flat(CpuBackend);
}

/// The host pool now (process-wide, so read only under [`serial`]).
fn host_pool() -> PoolStats {
    kiln::pool::host_pool_stats()
}

/// Calls `total` (a compiled call whose one large intermediate, `bytes`
/// long, lives only inside it) 11 times: after the first, the pool holds
/// that buffer, and every later call takes it and gives it back.
fn intermediate_waits_in_the_host_pool(
    total: impl Fn() -> kiln::Result<f32>,
    want: f32,
    bytes: u64,
) {
    let before = host_pool();
    assert_eq!(total().expect("first call"), want);
    let kept = host_pool();
    assert_eq!(kept.idle_buffers, before.idle_buffers + 1);
    assert_eq!(kept.idle_bytes, before.idle_bytes + bytes);
    for _ in 0..10 {
        assert_eq!(total().expect("warm call"), want);
    }
    assert_eq!(
        host_pool(),
        kept,
        "each call takes the buffer and gives it back"
    );
}

#[test]
fn a_cpu_calls_large_intermediate_waits_in_the_host_pool_for_the_next_call() {
    let _serial = serial();
    // The 200×300 product (240,000 bytes, a size no other test here makes)
    // lives only inside the call: its sum is the output.
    let f = compile(|(x, w): (Array, Array)| x.matmul(&w).sum(&[0, 1], false));
    let x = Array::from_vec(vec![0.5f32; 200 * 100], &[200, 100]).expect("x");
    let w = Array::from_vec(vec![0.25f32; 100 * 300], &[100, 300]).expect("w");
    let args = (x, w);
    let total = || f.call(&args).and_then(|y| y.item::<f32>());
    intermediate_waits_in_the_host_pool(total, 750_000.0, 240_000);
}

#[test]
fn a_cpu_calls_transposed_copy_waits_in_the_host_pool_for_the_next_call() {
    let _serial = serial();
    // The 260×300 transpose (312,000 bytes, a size no other test here
    // makes) is materialized, scaled in place and summed inside the call.
    let f = compile(|x: Array| (x.transpose() * 2.0).sum(&[0, 1], false));
    let x = Array::from_vec(vec![0.5f32; 300 * 260], &[300, 260]).expect("x");
    let total = || f.call(&x).and_then(|y| y.item::<f32>());
    intermediate_waits_in_the_host_pool(total, 78_000.0, 312_000);
}

#[test]
fn arrays_of_sizes_no_cpu_output_asked_for_are_freed_not_kept() {
    let _serial = serial();
    let before = host_pool();
    for i in 0..64 {
        // 1,000,004 bytes each: a size no output here asks the pool for.
        let array = Array::from_vec(vec![i as f32; 250_001], &[250_001]).expect("array");
        drop(array);
    }
    assert_eq!(host_pool(), before);
}
