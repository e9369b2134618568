//! What the op families' unit tests check of their transformation rules,
//! written once: a jvp rule against a central difference of the op, a
//! batching rule against the op run on each example and stacked, and the
//! error an op without a rule gives. It sits in the compile layer because
//! it runs the transformations through `compile`; only the families'
//! test modules reach up to it.

use crate::handle::array::Array;
use crate::ops::layout::concat;
use crate::random::Key;
use crate::{compile, jvp, vmap, DType, Report};
use std::sync::Arc;

/// Standard normal f32 values of `shape`, from `seed`.
pub(crate) fn normal(seed: u64, shape: &[usize]) -> Array {
    Array::random_normal(Key::new(seed), shape, DType::F32).expect("a valid shape")
}

/// Uniform f32 values in `[low, high)` of `shape`, for ops defined on part
/// of the line.
pub(crate) fn uniform(seed: u64, shape: &[usize], low: f64, high: f64) -> Array {
    Array::random_uniform(Key::new(seed), shape, low, high, DType::F32).expect("a valid shape")
}

/// `values` as an f32 array of `shape`.
pub(crate) fn array(values: &[f32], shape: &[usize]) -> Array {
    Array::from_vec(values.to_vec(), shape).expect("as many values as the shape holds")
}

/// The values of `a` as f64s.
pub(crate) fn values(a: &Array) -> Vec<f64> {
    a.data().expect("the array evaluates").to_f64_vec()
}

/// Panics naming `what` unless `got` and `want` have the same shape and
/// values within `atol + rtol·|want|`.
pub(crate) fn assert_close(what: &str, got: &Array, want: &Array, atol: f64, rtol: f64) {
    assert_eq!(got.dims(), want.dims(), "{what}: shapes");
    for (i, (g, w)) in values(got).iter().zip(values(want)).enumerate() {
        assert!(
            (g - w).abs() <= atol + rtol * w.abs(),
            "{what}: element {i} is {g}, want {w}"
        );
    }
}

/// Panics naming `what` unless the jvp of `f` at the float arrays `xs`
/// along random directions equals the central difference
/// `(f(x + εv) − f(x − εv)) / 2ε` (ε = 1e-2, f32 arithmetic).
pub(crate) fn assert_jvp_matches_central_difference(
    what: &str,
    f: impl Fn(Vec<Array>) -> Array,
    xs: &[Array],
) {
    let dirs: Vec<Array> = xs
        .iter()
        .enumerate()
        .map(|(i, x)| normal(1000 + i as u64, &x.dims().expect("known shape")))
        .collect();
    let (_, tangent) = jvp(&f, &xs.to_vec(), &dirs).unwrap_or_else(|e| panic!("{what}: {e}"));
    let eps = 1e-2;
    let shifted = |sign: f32| -> Vec<Array> {
        xs.iter()
            .zip(&dirs)
            .map(|(x, v)| x + &(v * (sign * eps)))
            .collect()
    };
    let difference = (f(shifted(1.0)) - f(shifted(-1.0))) / (2.0 * eps);
    assert_close(what, &tangent, &difference, 5e-3, 5e-3);
}

/// Panics naming `what` unless `vmap(f)` over `xs` (each batched along
/// axis 0), compiled, equals stacking `f` on each example; returns the
/// compile's report (what vmap recorded: per-example fallbacks,
/// materialized implicit values).
pub(crate) fn assert_batches_like_stacking(
    what: &str,
    f: impl Fn(Vec<Array>) -> Array + Clone + 'static,
    xs: &[Array],
) -> Arc<Report> {
    let n = xs[0].dims().expect("known shape")[0];
    let batched = compile(vmap(f.clone()));
    let got = batched
        .call(&xs.to_vec())
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let examples: Vec<Array> = (0..n as i64)
        .map(|k| {
            let example = xs
                .iter()
                .map(|x| x.slice_axis(0, k, Some(k + 1), 1).squeeze(&[0]))
                .collect();
            f(example).expand_dims(0)
        })
        .collect();
    assert_close(what, &got, &concat(&examples, 0), 1e-6, 1e-6);
    batched.cache().reports[0].clone()
}

/// Panics unless `result` is an `Err` whose message names `op` and
/// contains `detail`.
pub(crate) fn assert_err_names<T>(result: crate::Result<T>, op: &str, detail: &str) {
    let Err(err) = result else {
        panic!("{op}: expected an error")
    };
    let message = err.to_string();
    assert!(
        message.contains(op) && message.contains(detail),
        "{message}"
    );
}
