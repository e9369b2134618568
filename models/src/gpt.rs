//! A GPT-2-style decoder: tied token embeddings, learned positions,
//! pre-LayerNorm blocks of causal attention and a GELU (tanh) MLP, written
//! only with `kiln::nn`'s layers.

use kiln::nn::{cross_entropy, Activation, Attention, Embedding, KvCache, LayerNorm, Mlp};
use kiln::random::Key;
use kiln::{scan, select, Array, DType, Dim, Error, QuantFormat, Result, Tree};

/// A GPT's sizes: part of its tree as a static value, so a compiled
/// function keyed on the model retraces for another size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GptConfig {
    /// Tokens in the vocabulary.
    pub vocab: usize,
    /// The longest sequence (learned positions, the cache's capacity).
    pub context: usize,
    /// The residual stream's width.
    pub width: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Attention heads per block.
    pub heads: usize,
}

impl GptConfig {
    /// The byte-level model the `gpt` example trains: vocab 256, context
    /// 128, width 256, 4 layers, 4 heads.
    pub const SMALL: GptConfig = GptConfig {
        vocab: 256,
        context: 128,
        width: 256,
        layers: 4,
        heads: 4,
    };

    /// GPT-2 small's shape: vocab 50257, context 1024, width 768, 12
    /// layers, 12 heads.
    pub const GPT2: GptConfig = GptConfig {
        vocab: 50257,
        context: 1024,
        width: 768,
        layers: 12,
        heads: 12,
    };

    /// Width per head.
    pub fn head_dim(&self) -> usize {
        self.width / self.heads.max(1)
    }
}

/// One pre-LayerNorm block: `x + attn(ln1(x))`, then `x + mlp(ln2(x))`.
#[derive(Tree, Clone, Debug)]
pub struct Block {
    /// Before attention.
    pub ln1: LayerNorm,
    /// Causal self-attention.
    pub attn: Attention,
    /// Before the MLP.
    pub ln2: LayerNorm,
    /// `width → 4·width → width`, GELU (tanh).
    pub mlp: Mlp,
}

impl Block {
    fn new(key: Key, config: &GptConfig) -> Result<Block> {
        let (d, std) = (config.width, INIT_STD);
        Ok(Block {
            ln1: LayerNorm::new(d, LN_EPS),
            attn: Attention::new(key.fold_in(0), d, config.heads, std)?,
            ln2: LayerNorm::new(d, LN_EPS),
            mlp: Mlp::new(key.fold_in(1), d, 4 * d, Activation::GeluTanh, std)?,
        })
    }

    fn forward(&self, x: &Array) -> Array {
        let x = x + self.attn.forward(&self.ln1.forward(x));
        &x + self.mlp.forward(&self.ln2.forward(&x))
    }

    fn forward_cached(&self, x: &Array, cache: &KvCache) -> (Array, KvCache) {
        let (attended, cache) = self.attn.forward_cached(&self.ln1.forward(x), cache);
        let x = x + attended;
        (&x + self.mlp.forward(&self.ln2.forward(&x)), cache)
    }
}

/// GPT-2 draws every weight from `N(0, 0.02²)`.
const INIT_STD: f64 = 0.02;
/// GPT-2's LayerNorm epsilon.
const LN_EPS: f64 = 1e-5;

/// The model.
#[derive(Tree, Clone, Debug)]
pub struct Gpt {
    /// Token embeddings `[vocab, width]`, tied with the output layer.
    pub wte: Embedding,
    /// Learned positions `[context, width]`.
    pub wpe: Embedding,
    /// The blocks.
    pub blocks: Vec<Block>,
    /// The final LayerNorm.
    pub ln_f: LayerNorm,
    /// The sizes.
    #[tree(static)]
    pub config: GptConfig,
}

impl Gpt {
    /// A model of `config` with GPT-2's initialization from `key`.
    pub fn new(key: Key, config: GptConfig) -> Result<Gpt> {
        if config.heads == 0 || !config.width.is_multiple_of(config.heads) || config.vocab == 0 {
            return Err(Error::InvalidArgument {
                at: None,
                op: "Gpt::new".into(),
                detail: format!("an unusable configuration {config:?}"),
            });
        }
        let blocks = (0..config.layers)
            .map(|i| Block::new(key.fold_in(10 + i as u64), &config))
            .collect::<Result<Vec<_>>>()?;
        Ok(Gpt {
            wte: Embedding::new(key.fold_in(0), config.vocab, config.width, INIT_STD)?,
            wpe: Embedding::new(key.fold_in(1), config.context, config.width, INIT_STD)?,
            blocks,
            ln_f: LayerNorm::new(config.width, LN_EPS),
            config,
        })
    }

    /// The logits `[batch, t, vocab]` of token ids `[batch, t]` (`i32`). A
    /// sequence longer than the context is an error naming both lengths.
    pub fn forward(&self, ids: &Array) -> Array {
        let t = match self.sequence_length(ids) {
            Ok(t) => t,
            Err(e) => return Array::failed(e),
        };
        let positions = self.wpe.weight.slice_axis(0, 0, Some(t as i64), 1);
        let mut x = self.wte.forward(ids) + positions;
        for block in &self.blocks {
            x = block.forward(&x);
        }
        self.wte.as_linear(&self.ln_f.forward(&x))
    }

    /// The mean cross-entropy of predicting `targets` from `ids` (both
    /// `[batch, t]`).
    pub fn loss(&self, ids: &Array, targets: &Array) -> Array {
        cross_entropy(&self.forward(ids), targets, None)
    }

    /// The length of `ids: [batch, t]`, checked against the context.
    fn sequence_length(&self, ids: &Array) -> Result<usize> {
        let dims = &ids.shape().0;
        let t = match dims.as_slice() {
            [_, t] => t.known(),
            _ => None,
        };
        match t {
            Some(t) if t <= self.config.context => Ok(t),
            Some(t) => Err(Error::InvalidArgument {
                at: None,
                op: "Gpt::forward".into(),
                detail: format!(
                    "a sequence of {t} tokens is longer than the model's context of {}",
                    self.config.context
                ),
            }),
            None => Err(Error::Shape {
                at: None,
                op: "Gpt::forward".into(),
                detail: "needs token ids [batch, t] with a known length".into(),
                operands: ids.aval().to_string(),
            }),
        }
    }

    /// Empty caches, one per block, for decoding `batch` sequences.
    pub fn empty_caches(&self, batch: usize) -> Vec<KvCache> {
        let c = &self.config;
        (0..c.layers)
            .map(|_| KvCache::new(batch, c.heads, c.context, c.head_dim()))
            .collect()
    }

    /// The logits `[batch, t, vocab]` of new tokens `ids: [batch, t]` at
    /// the caches' offset, and the caches with them written.
    pub fn forward_cached(&self, ids: &Array, caches: &[KvCache]) -> (Array, Vec<KvCache>) {
        let t = ids.shape().0.get(1).and_then(Dim::known).unwrap_or(1);
        let offset = caches
            .first()
            .map_or_else(|| Array::scalar(0.0, DType::I32), |c| c.offset.clone());
        let zero = Array::scalar(0.0, DType::I32);
        let positions = self
            .wpe
            .weight
            .dynamic_slice(&[offset, zero], &[t, self.config.width]);
        let mut x = self.wte.forward(ids) + positions;
        let mut next = Vec::with_capacity(caches.len());
        for (block, cache) in self.blocks.iter().zip(caches) {
            let (y, cache) = block.forward_cached(&x, cache);
            x = y;
            next.push(cache);
        }
        (self.wte.as_linear(&self.ln_f.forward(&x)), next)
    }

    /// The model with every block's linear layers and the token table
    /// (looked up, and the output layer) quantized in `format`; the
    /// positions and norms stay f32.
    pub fn quantize(&self, format: QuantFormat) -> Result<Gpt> {
        let blocks = self
            .blocks
            .iter()
            .map(|b| {
                Ok(Block {
                    ln1: b.ln1.clone(),
                    attn: b.attn.quantize(format)?,
                    ln2: b.ln2.clone(),
                    mlp: b.mlp.quantize(format)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Gpt {
            wte: self.wte.quantize(format)?,
            blocks,
            ..self.clone()
        })
    }

    /// The weights' bytes a decoding step reads: every parameter once
    /// (the tied embedding as the output layer).
    pub fn weight_bytes(&self) -> Result<usize> {
        let leaves = kiln::tree_leaves(self)?;
        Ok(leaves.iter().filter_map(Array::nbytes).sum())
    }
}

/// How [`decode`] picks each token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0 is greedy (argmax); above, logits are divided by it and sampled.
    pub temperature: f64,
    /// When sampling, only the `top_k` most likely tokens (0: all).
    pub top_k: usize,
}

impl Sampling {
    /// Always the most likely token.
    pub const GREEDY: Sampling = Sampling {
        temperature: 0.0,
        top_k: 0,
    };
}

/// The next tokens `[batch]` (`i32`) from the last position's `logits:
/// [batch, vocab]`, drawn with `key` (an in-graph `u32` key) when sampling:
/// the Gumbel-max trick (the argmax of logits / temperature plus Gumbel
/// noise is a draw from their softmax), after the logits below the `k`-th
/// largest are masked out.
pub fn pick_tokens(logits: &Array, key: &Array, sampling: Sampling) -> Array {
    if sampling.temperature <= 0.0 {
        return logits.argmax(-1, false).cast(DType::I32);
    }
    let mut scaled = logits / sampling.temperature;
    if sampling.top_k > 0 {
        scaled = keep_top_k(&scaled, sampling.top_k);
    }
    let dims = logits.dims().unwrap_or_default();
    let uniform = kiln::nn::random_uniform(key, &dims).maximum(1e-20);
    let gumbel = -(-uniform.log()).log();
    (scaled + gumbel).argmax(-1, false).cast(DType::I32)
}

/// `x` with the entries below each row's `k`-th largest set to −∞: `k`
/// rounds of taking the row maximum and masking it out give the
/// threshold (no sort needed; ties count once).
fn keep_top_k(x: &Array, k: usize) -> Array {
    let mut rest = x.clone();
    let mut threshold = rest.max(&[-1], true);
    for _ in 1..k {
        rest = select(&rest.greater_equal(&threshold), f64::NEG_INFINITY, &rest);
        threshold = rest.max(&[-1], true);
    }
    select(&x.greater_equal(&threshold), x, f64::NEG_INFINITY)
}

/// Decodes `steps` tokens after `first: [batch]` inside one `scan`: each
/// step embeds the previous token at the caches' offset, writes its keys
/// and values into the caches in place (`dynamic_update_slice`) and picks
/// the next token. Returns the tokens `[steps, batch]` and the caches.
/// `key` is an in-graph key (`kiln::nn::key_array`); step `i` draws from
/// `key + i · 0x2545F491` (wrapping), which the draw's hash mixes.
pub fn decode(
    model: &Gpt,
    caches: &[KvCache],
    first: &Array,
    key: &Array,
    steps: usize,
    sampling: Sampling,
) -> Result<(Array, Vec<KvCache>)> {
    let step_index = Array::arange(0.0, steps as f64, 1.0, DType::U32)?;
    let init = (caches.to_vec(), first.clone());
    let ((caches, _), tokens) = scan(
        |(caches, token): (Vec<KvCache>, Array), i: Array| {
            let (logits, caches) = model.forward_cached(&token.expand_dims(1), &caches);
            let last = logits.squeeze(&[1]);
            let step_key = key.cast(DType::U32) + i * 0x2545_F491_u32 as f64;
            let next = pick_tokens(&last, &step_key, sampling);
            Ok(((caches, next.clone()), next))
        },
        &init,
        &step_index,
    )?;
    Ok((tokens, caches))
}
