//! A decoding loop with a KV cache, shared by the control-flow tests and
//! benchmarks: each `scan` step writes its key into row `t` of the cache
//! with `dynamic_update_slice` and attends over the cache with a query.

use kiln::random::Key;
use kiln::{scan, Array, DType, Result};

/// The loop over `steps` keys: `(cache, query, keys) -> (cache, last
/// output)`, the cache `[rows, width]`, the query `[width]`, the keys
/// `[steps, width]`.
pub fn decode(steps: usize) -> impl Fn((Array, Array, Array)) -> Result<(Array, Array)> {
    move |(cache, q, ks): (Array, Array, Array)| {
        let zero = Array::scalar(0.0, DType::I32);
        let t = Array::arange(0.0, steps as f64, 1.0, DType::I32)?;
        let ((cache, out), ()) = scan(
            |(cache, _): (Array, Array), (k, t): (Array, Array)| {
                let cache = cache.dynamic_update_slice(&k.expand_dims(0), &[t, zero.clone()]);
                let scores = cache.matmul(&q.expand_dims(1)).squeeze(&[1]);
                let out = kiln::nn::softmax(&scores, -1)
                    .expand_dims(0)
                    .matmul(&cache)
                    .squeeze(&[0]);
                Ok(((cache, out), ()))
            },
            &(cache, q.zeros_like()),
            &(ks, t),
        )?;
        Ok((cache, out))
    }
}

/// Arguments of [`decode`]: a zero cache of 256 rows of `width`, a random
/// query and `steps` random keys.
pub fn decode_args(steps: usize, width: usize) -> (Array, Array, Array) {
    let normal = |seed: u64, shape: &[usize]| {
        Array::random_normal(Key::new(seed), shape, DType::F32).expect("a valid shape")
    };
    (
        Array::zeros(&[256, width], DType::F32),
        normal(7, &[width]),
        normal(8, &[steps, width]),
    )
}
