//! The functions transformer layers are written with: SiLU, rotary
//! embeddings, scaled dot-product attention, masks, cross-entropy and
//! in-graph dropout. Each is a composition of public ops recorded under its
//! own name.

use crate::random::Key;
use crate::{in_composition, select, Array, DType};

/// SiLU (swish): `x · sigmoid(x)`.
///
/// ```
/// use kiln::{nn, Array};
/// let y = nn::silu(&Array::from_vec(vec![0.0f32, 1.0], &[2])?);
/// assert!((y.to_vec::<f32>()?[1] - 0.7310586).abs() < 1e-6);
/// # Ok::<(), kiln::Error>(())
/// ```
#[track_caller]
pub fn silu(x: &Array) -> Array {
    in_composition("silu", || x * x.sigmoid())
}

/// The causal mask of `t` positions: bool `[t, t]`, true where a query
/// (row) may attend to a key (column), that is at or before its own
/// position. The same as `tril(ones([t, t]))`.
#[track_caller]
pub fn causal_mask(t: usize) -> Array {
    in_composition("causal_mask", || {
        let grid = Array::zeros(&[t, t], DType::I32);
        grid.iota(0, DType::I32)
            .expand_dims(1)
            .greater_equal(grid.iota(1, DType::I32).expand_dims(0))
    })
}

/// Rotary position embeddings (RoPE, the "rotate half" form of GPT-NeoX and
/// LLaMA) of `x: [..., t, d]` at integer `positions: [t]` (`d` even): the
/// two halves of the last axis are rotated by the angles `position ·
/// base^(-2i/d)`. Decoding passes the positions of the new tokens (the
/// cache's offset plus `0..t`), so a token is rotated as in the full pass.
///
/// ```
/// use kiln::{nn, Array, DType};
/// let x = Array::ones(&[1, 4], DType::F32);
/// // Position 0 is the identity.
/// let y = nn::rope(&x, &Array::from_vec(vec![0i32], &[1])?, 10_000.0);
/// assert_eq!(y.to_vec::<f32>()?, vec![1.0; 4]);
/// # Ok::<(), kiln::Error>(())
/// ```
#[track_caller]
pub fn rope(x: &Array, positions: &Array, base: f64) -> Array {
    in_composition("rope", || {
        let d = x.shape().0.last().and_then(|d| d.known()).unwrap_or(0);
        let half = d / 2;
        if !d.is_multiple_of(2) || half == 0 {
            return Array::failed(crate::Error::Shape {
                at: None,
                op: "rope".into(),
                detail: format!(
                    "the last axis must have an even, non-zero size, got {}",
                    x.aval()
                ),
                operands: x.aval().to_string(),
            });
        }
        let exponents = Array::zeros(&[half], DType::F32).iota(0, DType::F32) * (-2.0 / d as f64);
        let frequencies = Array::scalar(base, DType::F32).pow(&exponents);
        let angles = positions
            .cast(DType::F32)
            .expand_dims(-1)
            .matmul(&frequencies.expand_dims(0))
            .cast(x.dtype());
        let (cos, sin) = (angles.cos(), angles.sin());
        let first = x.slice_axis(-1, 0, Some(half as i64), 1);
        let second = x.slice_axis(-1, half as i64, None, 1);
        crate::concat(
            &[
                &first * &cos - &second * &sin,
                &first * &sin + &second * &cos,
            ],
            -1,
        )
    })
}

/// Scaled dot-product attention: `softmax(q kᵀ / √d + mask) v` for `q:
/// [..., tq, d]`, `k: [..., tk, d]`, `v: [..., tk, dv]`; `mask` (bool,
/// broadcast to `[..., tq, tk]`) is true where a query may attend to a key.
/// A masked score takes the dtype's lowest finite value, not −∞, so a row
/// with every key masked gives the mean of `v` instead of NaN (as flax's
/// `dot_product_attention`).
#[track_caller]
pub fn scaled_dot_product_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    mask: Option<&Array>,
) -> Array {
    in_composition("scaled_dot_product_attention", || {
        let d = q
            .shape()
            .0
            .last()
            .and_then(|d| d.known())
            .unwrap_or(1)
            .max(1);
        let scores = (q * (1.0 / (d as f64).sqrt())).matmul(&k.swap_axes(-1, -2));
        let scores = match mask {
            Some(mask) => select(mask, &scores, lowest_finite(q.dtype())),
            None => scores,
        };
        crate::nn::softmax(&scores, -1).matmul(v)
    })
}

/// The lowest finite value of a float dtype (f32's for other dtypes).
pub(super) fn lowest_finite(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => f64::from(half::f16::MIN),
        DType::BF16 => f64::from(half::bf16::MIN),
        _ => f64::from(f32::MIN),
    }
}

/// Cross-entropy of `logits: [..., classes]` against integer `targets:
/// [...]`, averaged over the targets that are not `ignore` (as PyTorch's
/// `ignore_index`): `-mean(log_softmax(logits)[target])`. With every
/// target ignored the result is 0. A target outside `0..classes` (other
/// than `ignore`) picks no class and adds `log(Σ exp)` alone, as
/// `one_hot` would.
///
/// ```
/// use kiln::{nn, Array};
/// let logits = Array::from_vec(vec![0.0f32, 0.0, 5.0, 0.0], &[2, 2])?;
/// let targets = Array::from_vec(vec![1i32, -100], &[2])?;
/// let loss = nn::cross_entropy(&logits, &targets, Some(-100));
/// assert!((loss.item::<f32>()? - std::f32::consts::LN_2).abs() < 1e-6);
/// # Ok::<(), kiln::Error>(())
/// ```
#[track_caller]
pub fn cross_entropy(logits: &Array, targets: &Array, ignore: Option<i64>) -> Array {
    in_composition("cross_entropy", || {
        let log_probs = crate::nn::log_softmax(logits, -1);
        let targets = targets.cast(DType::I32);
        let classes = logits.iota(-1, DType::I32);
        let picked =
            select(&classes.equal(targets.expand_dims(-1)), &log_probs, 0.0).sum(&[-1], false);
        match ignore {
            None => -picked.mean_all(),
            Some(ignore) => {
                let kept = targets.not_equal(ignore as f64).cast(logits.dtype());
                let count = kept.sum_all().maximum(1.0);
                -(picked * &kept).sum_all() / count
            }
        }
    })
}

/// An in-graph random key: the `u32` scalar that [`random_uniform`] and
/// [`dropout`] draw from. Passed as an argument of a compiled training step
/// (a fresh one per step), it changes the draws without a retrace, where a
/// [`Key`] held as a static value would miss the cache on every step.
#[track_caller]
pub fn key_array(key: Key) -> Array {
    // The low 32 bits of the key's mixed seed.
    Array::scalar((key.fold_in(0).seed() & 0xffff_ffff) as f64, DType::U32)
}

/// Uniform `f32` values in `[0, 1)` of `shape`, drawn inside the graph from
/// a `u32` scalar `key` (see [`key_array`]): element `i` is a hash of the
/// key and `i`, so the draws are a function of the key alone, on every
/// backend. The hash is a bijective multiply–add–shift mixer of 32-bit
/// words (wrapping products and shifts as divisions: Kiln's integer ops
/// have no xor); its top 24 bits make the value.
#[track_caller]
pub fn random_uniform(key: &Array, shape: &[usize]) -> Array {
    in_composition("random_uniform", || {
        let n: usize = shape.iter().product();
        let index = Array::zeros(&[n], DType::U32).iota(0, DType::U32);
        let key = key.cast(DType::U32);
        let mut h = index * 0x9E37_79B9_u32 as f64 + &key;
        for multiplier in [0x85EB_CA6B_u32, 0xC2B2_AE35, 0x27D4_EB2F] {
            h = &h + &h / 65536.0;
            h = &h * multiplier as f64 + &key;
        }
        h = &h + &h / 65536.0;
        let top = &h / 256.0;
        (top.cast(DType::F32) * (1.0 / 16_777_216.0))
            .reshape(&shape.iter().map(|&d| d as i64).collect::<Vec<_>>())
    })
}

/// Inverted dropout: each element of `x` is zeroed with probability `rate`
/// and the rest scaled by `1 / (1 - rate)`, from the in-graph `key` (see
/// [`random_uniform`]). A rate of 0 is the identity; a rate outside `[0,
/// 1)` is an error.
#[track_caller]
pub fn dropout(x: &Array, rate: f64, key: &Array) -> Array {
    in_composition("dropout", || {
        if !(0.0..1.0).contains(&rate) {
            return Array::failed(crate::Error::InvalidArgument {
                at: None,
                op: "dropout".into(),
                detail: format!("the rate must be in [0, 1), got {rate}"),
            });
        }
        if rate == 0.0 {
            return x.clone();
        }
        let Some(dims) = x.dims() else {
            return Array::failed(crate::Error::InvalidArgument {
                at: None,
                op: "dropout".into(),
                detail: format!("needs a known shape, got {}", x.aval()),
            });
        };
        let keep = random_uniform(key, &dims).greater_equal(rate);
        select(&keep, x * (1.0 / (1.0 - rate)), 0.0)
    })
}
