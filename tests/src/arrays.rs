//! Array helpers the integration tests share: random inputs, one example
//! of a batch, stacking examples, and closeness within a tolerance.

use crate::conformance::compare_within;
use kiln::random::Key;
use kiln::{concat, Array, DType};

/// Standard normal f32 values of `shape`, from `seed`.
pub fn normal(seed: u64, shape: &[usize]) -> Array {
    Array::random_normal(Key::new(seed), shape, DType::F32).expect("a valid shape")
}

/// Example `i` of `x` along `axis`.
pub fn example(x: &Array, axis: usize, i: usize) -> Array {
    x.slice_axis(axis as isize, i as i64, Some(i as i64 + 1), 1)
        .squeeze(&[axis as isize])
}

/// `parts` stacked along a new `axis`.
pub fn stack(parts: &[Array], axis: usize) -> Array {
    let expanded: Vec<Array> = parts.iter().map(|p| p.expand_dims(axis as isize)).collect();
    concat(&expanded, axis as isize)
}

/// Panics unless `got` and `want` have one shape and values within
/// `atol + rtol·|want|` (see [`compare_within`]).
pub fn close(got: &Array, want: &Array, atol: f64, rtol: f64) {
    assert_eq!(got.dims(), want.dims(), "shapes");
    let (got, want) = (
        got.data().expect("evaluates"),
        want.data().expect("evaluates"),
    );
    compare_within(&got, &want, atol, rtol).unwrap_or_else(|e| panic!("{e}"));
}
