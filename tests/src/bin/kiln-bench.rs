//! Kiln's benchmarks: prints one JSON document (see DESIGN.md, Benchmarks).
//! `cargo xtask bench [NAME...]` runs it in release mode.

use kiln::{compile, Array, DType, Tree};
use kiln_tests::bench::{median_micros, selected, time_once_ms, BenchReport};
use std::collections::BTreeMap;

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
    println!("{}", report.to_json());
}
