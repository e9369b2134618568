//! Causal multi-head self-attention, with optional rotary embeddings and a
//! key/value cache for decoding.

use super::functions::{causal_mask, rope, scaled_dot_product_attention};
use super::layers::Linear;
use crate::random::Key;
use crate::{in_composition, Array, DType, Dim, Error, QuantFormat, Result, Shape, Tree};

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
            let cached_positions = keys.iota(2, DType::I32);
            let mask = cached_positions
                .expand_dims(0)
                .less_equal(new_positions.expand_dims(1));
            let y = scaled_dot_product_attention(&q, &keys, &values, Some(&mask));
            let t = x.shape().0.get(1).and_then(Dim::known).unwrap_or(0);
            let next = KvCache {
                keys,
                values,
                offset: offset + t as f64,
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
