//! Causal multi-head self-attention, with optional rotary embeddings and a
//! key/value cache for decoding.

use super::functions::{causal_mask, lowest_finite, rope, scaled_dot_product_attention};
use super::layers::Linear;
use crate::random::Key;
use crate::{
    in_composition, select, while_loop, Array, DType, Dim, Error, QuantFormat, Result, Shape, Tree,
};

/// Positions of a long cache that [`Attention::forward_cached`] reads at
/// once: it reads blocks up to the last one written, not the whole cache.
pub(super) const CACHE_BLOCK: usize = 64;

/// The keys and values of the positions decoded so far, for one attention
/// layer: `keys` and `values` are `[batch, heads, capacity, head_dim]`,
/// `offset` (an `i32` scalar) the number of positions written. A step
/// writes its new positions at `offset` with `dynamic_update_slice`, so in
/// a compiled loop the cache is updated in place.
#[derive(Tree, Clone, Debug)]
pub struct KvCache {
    /// `[batch, heads, capacity, head_dim]`.
    pub keys: Array,
    /// `[batch, heads, capacity, head_dim]`.
    pub values: Array,
    /// The positions written so far, `i32[]`.
    pub offset: Array,
}

impl KvCache {
    /// An empty cache of `capacity` positions.
    pub fn new(batch: usize, heads: usize, capacity: usize, head_dim: usize) -> KvCache {
        let shape = [batch, heads, capacity, head_dim];
        KvCache {
            keys: Array::zeros(&shape, DType::F32),
            values: Array::zeros(&shape, DType::F32),
            offset: Array::scalar(0.0, DType::I32),
        }
    }
}

/// Causal multi-head self-attention: one fused `qkv` projection, `heads`
/// heads, an output projection; rotary embeddings on queries and keys when
/// `rope_base` is set (LLaMA), none otherwise (GPT-2 adds learned positions
/// to its input instead).
#[derive(Tree, Clone, Debug)]
pub struct Attention {
    /// `dim → 3·dim`: queries, keys and values.
    pub qkv: Linear,
    /// `dim → dim`.
    pub proj: Linear,
    /// The number of heads (dividing `dim`).
    #[tree(static)]
    pub heads: usize,
    /// The base of the rotary embeddings' angles (10 000 in LLaMA), if any.
    pub rope_base: Option<f64>,
}

impl Attention {
    /// A layer of `dim` with `heads` heads and biases, weights from `N(0,
    /// std²)`.
    pub fn new(key: Key, dim: usize, heads: usize, std: f64) -> Result<Attention> {
        if heads == 0 || !dim.is_multiple_of(heads) {
            return Err(Error::InvalidArgument {
                at: None,
                op: "Attention::new".into(),
                detail: format!("{heads} heads do not divide the width {dim}"),
            });
        }
        Ok(Attention {
            qkv: Linear::with_std(key.fold_in(0), dim, 3 * dim, true, std)?,
            proj: Linear::with_std(key.fold_in(1), dim, dim, true, std)?,
            heads,
            rope_base: None,
        })
    }

    /// The layer with rotary embeddings of `base`.
    pub fn with_rope(mut self, base: f64) -> Attention {
        self.rope_base = Some(base);
        self
    }

    /// Causal attention over `x: [batch, t, dim]`.
    #[track_caller]
    pub fn forward(&self, x: &Array) -> Array {
        in_composition("attention", || {
            let (q, k, v) = self.heads_of(x);
            let positions = x.iota(1, DType::I32);
            let (q, k) = self.rotate(&q, &k, &positions);
            let t = x.shape().0.get(1).and_then(Dim::known).unwrap_or(0);
            let y = scaled_dot_product_attention(&q, &k, &v, Some(&causal_mask(t)));
            self.proj.forward(&self.merge_heads(&y, x))
        })
    }

    /// Attention of the new positions `x: [batch, t, dim]` over the cache
    /// and themselves; returns the output and the cache with them written
    /// at its offset (which advances by `t`). Writing past the cache's
    /// capacity is the caller's to prevent (`dynamic_update_slice` clamps
    /// its start, as XLA's does): see [`KvCache`].
    #[track_caller]
    pub fn forward_cached(&self, x: &Array, cache: &KvCache) -> (Array, KvCache) {
        in_composition("attention", || {
            let (q, k, v) = self.heads_of(x);
            let offset = cache.offset.cast(DType::I32);
            let new_positions = x.iota(1, DType::I32) + &offset;
            let (q, k) = self.rotate(&q, &k, &new_positions);
            let zero = Array::scalar(0.0, DType::I32);
            let starts = [zero.clone(), zero.clone(), offset.clone(), zero];
            let keys = cache.keys.dynamic_update_slice(&k, &starts);
            let values = cache.values.dynamic_update_slice(&v, &starts);
            let t = x.shape().0.get(1).and_then(Dim::known).unwrap_or(0);
            let written = &offset + t as f64;
            let y = attend_written(&q, &keys, &values, &new_positions, &written);
            let next = KvCache {
                keys,
                values,
                offset: written,
            };
            (self.proj.forward(&self.merge_heads(&y, x)), next)
        })
    }

    /// The layer with its projections quantized in `format`.
    pub fn quantize(&self, format: QuantFormat) -> Result<Attention> {
        Ok(Attention {
            qkv: self.qkv.quantize(format)?,
            proj: self.proj.quantize(format)?,
            heads: self.heads,
            rope_base: self.rope_base,
        })
    }

    /// Queries, keys and values of `x: [batch, t, dim]`, each `[batch,
    /// heads, t, head_dim]`.
    fn heads_of(&self, x: &Array) -> (Array, Array, Array) {
        let dims = &x.shape().0;
        let dim = dims.last().and_then(Dim::known).unwrap_or(0);
        let heads = self.heads.max(1);
        if dims.len() != 3 || !dim.is_multiple_of(heads) {
            let error = Array::failed(Error::Shape {
                at: None,
                op: "attention".into(),
                detail: format!(
                    "needs x: [batch, t, dim] with dim divisible by {heads} heads, got {}",
                    x.aval()
                ),
                operands: x.aval().to_string(),
            });
            return (error.clone(), error.clone(), error);
        }
        let qkv = self.qkv.forward(x);
        let split = Shape(vec![
            dims[0].clone(),
            dims[1].clone(),
            Dim::Known(heads),
            Dim::Known(dim / heads),
        ]);
        let part = |i: i64| {
            qkv.slice_axis(-1, i * dim as i64, Some((i + 1) * dim as i64), 1)
                .reshape_to(split.clone())
                .permute(&[0, 2, 1, 3])
        };
        (part(0), part(1), part(2))
    }

    /// `q` and `k` rotated at `positions` when the layer has rotary
    /// embeddings.
    fn rotate(&self, q: &Array, k: &Array, positions: &Array) -> (Array, Array) {
        match self.rope_base {
            Some(base) => (rope(q, positions, base), rope(k, positions, base)),
            None => (q.clone(), k.clone()),
        }
    }

    /// `[batch, heads, t, head_dim]` back to `x`'s `[batch, t, dim]`.
    fn merge_heads(&self, y: &Array, x: &Array) -> Array {
        y.permute(&[0, 2, 1, 3]).reshape_to(x.shape().clone())
    }
}

/// Causal attention of queries `q: [batch, heads, t, d]` at `positions`
/// (`i32[t]`) over the first `written` positions of a cache's `keys` and
/// `values`. A cache longer than [`CACHE_BLOCK`] (and a whole number of
/// blocks) is read block by block in a `while_loop`, only as far as it is
/// written, with the running maximum, sum and weighted values of an online
/// softmax: a decoding step early in a long context reads a block where
/// the masked product would read the whole cache (GPT-2's 1024 positions
/// are 75 MB a token). Masked scores take the dtype's lowest finite value
/// as in [`scaled_dot_product_attention`], whose result this is up to the
/// order of the additions; the loop is not reverse-differentiable (train
/// with [`Attention::forward`]).
fn attend_written(
    q: &Array,
    keys: &Array,
    values: &Array,
    positions: &Array,
    written: &Array,
) -> Array {
    let masked = || {
        let mask = keys
            .iota(2, DType::I32)
            .expand_dims(0)
            .less_equal(positions.expand_dims(1));
        scaled_dot_product_attention(q, keys, values, Some(&mask))
    };
    let known = |a: &Array| -> Option<Vec<usize>> {
        let dims: Option<Vec<usize>> = a.shape().0.iter().map(Dim::known).collect();
        dims.filter(|d| d.len() == 4)
    };
    let (Some(q_dims), Some(k_dims), Some(v_dims)) = (known(q), known(keys), known(values)) else {
        return masked();
    };
    if k_dims[2] <= CACHE_BLOCK || !k_dims[2].is_multiple_of(CACHE_BLOCK) {
        return masked();
    }
    let block = CACHE_BLOCK as f64;
    let lowest = lowest_finite(q.dtype());
    let q = q * (1.0 / (q_dims[3].max(1) as f64).sqrt());
    let row = q.slice_axis(-1, 0, Some(1), 1).zeros_like();
    let mut acc_shape = q.shape().clone();
    acc_shape.0[3] = Dim::Known(v_dims[3]);
    let init = (
        Array::scalar(0.0, DType::I32),
        &row + lowest,
        row.clone(),
        Array::zeros(&[1], q.dtype()).broadcast_to(acc_shape),
    );
    let zero = Array::scalar(0.0, DType::I32);
    let block_positions = Array::zeros(&[CACHE_BLOCK], DType::I32).iota(0, DType::I32);
    let result = while_loop(
        |(j, ..): (Array, Array, Array, Array)| Ok((&j * block).less(written)),
        |(j, max, sum, acc)| {
            let start = &j * block;
            let starts = [zero.clone(), zero.clone(), start.clone(), zero.clone()];
            let k = keys.dynamic_slice(&starts, &[k_dims[0], k_dims[1], CACHE_BLOCK, k_dims[3]]);
            let v = values.dynamic_slice(&starts, &[v_dims[0], v_dims[1], CACHE_BLOCK, v_dims[3]]);
            let mask = (&block_positions + &start)
                .expand_dims(0)
                .less_equal(positions.expand_dims(1));
            let scores = select(&mask, q.matmul(&k.swap_axes(-1, -2)), lowest);
            let new_max = max.maximum(scores.max(&[-1], true));
            let weights = (&scores - &new_max).exp();
            let rescale = (&max - &new_max).exp();
            Ok((
                &j + 1.0,
                new_max,
                &sum * &rescale + weights.sum(&[-1], true),
                &acc * &rescale + weights.matmul(&v),
            ))
        },
        &init,
    );
    match result {
        Ok((_, _, sum, acc)) => &acc / &sum,
        Err(e) => Array::failed(e),
    }
}
