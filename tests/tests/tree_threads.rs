//! Flattening from many short-lived threads must not grow the process:
//! nothing per thread (an interner, a cache) may outlive its thread or be
//! copied once per thread. Alone in its own test binary because it measures
//! the resident set size, which any test running beside it would move.

use kiln::{tree_flatten, Array, Value};
use kiln_tests::rss::resident_bytes;
use std::collections::BTreeMap;

/// Threads in the measured run.
const THREADS: usize = 1_500;
/// Distinct map keys each thread flattens (the same names on every thread,
/// like a model's parameter names). While every thread interned its own
/// copy of each key, 1,500 threads grew the process by about 3 MB per 64 keys.
const KEYS: usize = 128;

/// Flattens a `BTreeMap<String, Array>` and a `Value` dict with the same
/// keys, checking the structures it gets.
fn flatten_maps(leaf: &Array) {
    let map: BTreeMap<String, Array> = (0..KEYS)
        .map(|i| (format!("layers.{i}.weight"), leaf.clone()))
        .collect();
    let (leaves, def) = tree_flatten(&map).expect("a map of arrays flattens");
    assert_eq!((leaves.len(), def.num_leaves()), (KEYS, KEYS));
    let dict = Value::Map(
        (0..KEYS)
            .map(|i| (format!("layers.{i}.weight"), Value::Array(leaf.clone())))
            .collect(),
    );
    let (leaves, def) = tree_flatten(&dict).expect("a dict of arrays flattens");
    assert_eq!((leaves.len(), def.num_leaves()), (KEYS, KEYS));
}

/// Runs `count` threads, a few at a time, each flattening the maps once.
fn run_threads(count: usize, leaf: &Array) {
    const AT_ONCE: usize = 8;
    for _ in 0..count.div_ceil(AT_ONCE) {
        std::thread::scope(|scope| {
            for _ in 0..AT_ONCE {
                scope.spawn(|| flatten_maps(leaf));
            }
        });
    }
}

#[test]
fn short_lived_threads_flattening_maps_do_not_grow_memory() {
    if let Err(reason) = resident_bytes() {
        eprintln!("skipped: {reason}");
        return;
    }
    let leaf = Array::from_vec(vec![1.0_f32, 2.0], &[2]).expect("two values, shape [2]");
    // Warm up: the allocator's per-thread arenas and the first interned keys
    // are a one-time cost, not growth.
    run_threads(200, &leaf);
    let before = resident_bytes().unwrap_or_default();
    run_threads(THREADS, &leaf);
    let after = resident_bytes().unwrap_or_default();
    let grown = after.saturating_sub(before);
    // Generous for allocator noise, far below the ~6 MB that per-thread
    // interning cost for this many threads.
    assert!(
        grown < 1 << 20,
        "{THREADS} threads grew the resident set by {grown} bytes ({before} → {after})"
    );
}
