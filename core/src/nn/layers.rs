//! Layers: trees of parameters with an initializer from a [`Key`] and a
//! `forward`. Each forward is recorded as its composition (`linear`,
//! `layer_norm`, `mlp`, …), so reports and the playground group a whole
//! layer.

use super::functions::{dropout, silu};
use crate::random::Key;
use crate::{
    in_composition, quantize, quantized_matmul, Array, DType, Error, QuantFormat, Quantized,
    Result, Tree,
};

/// Normal samples of `shape` with standard deviation `std`.
pub(crate) fn normal(key: Key, shape: &[usize], std: f64) -> Result<Array> {
    Ok(Array::random_normal(key, shape, DType::F32)? * std)
}

/// A dense layer `y = x Wᵀ + b`, with the weight laid out `[outputs,
/// inputs]` as PyTorch and MLX lay it out (the product reads the transpose
/// in place, never materializing it).
///
/// Quantized ([`Linear::quantize`]), `weight` holds the packed codes and
/// `scales` / `biases` the groups' parameters, the names and layout of
/// MLX's `QuantizedLinear`, so its weight files load as they are.
#[derive(Tree, Clone, Debug)]
pub struct Linear {
    /// `[outputs, inputs]`, or the packed codes `u32[outputs, inputs·bits/32]`.
    pub weight: Array,
    /// `[outputs]`, when the layer has a bias.
    pub bias: Option<Array>,
    /// The quantization groups' scales `[outputs, inputs/group]`.
    pub scales: Option<Array>,
    /// The quantization groups' biases (affine formats).
    pub biases: Option<Array>,
    /// The weight's quantization format; `None` for a dense weight.
    #[tree(static)]
    pub quantization: Option<QuantFormat>,
}

impl Linear {
    /// A layer of `inputs → outputs` with weights drawn from `N(0, 1/inputs)`
    /// (LeCun normal) and, when `bias`, a zero bias.
    ///
    /// ```
    /// use kiln::{nn::Linear, random::Key, Array, DType};
    /// let layer = Linear::new(Key::new(0), 3, 2, true)?;
    /// let y = layer.forward(&Array::ones(&[5, 3], DType::F32));
    /// assert_eq!(y.shape().as_known(), Some(vec![5, 2]));
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn new(key: Key, inputs: usize, outputs: usize, bias: bool) -> Result<Linear> {
        let std = 1.0 / (inputs.max(1) as f64).sqrt();
        Linear::with_std(key, inputs, outputs, bias, std)
    }

    /// A layer of `inputs → outputs` with weights drawn from `N(0, std²)`
    /// and, when `bias`, a zero bias (GPT-2 draws with `std = 0.02`).
    pub fn with_std(
        key: Key,
        inputs: usize,
        outputs: usize,
        bias: bool,
        std: f64,
    ) -> Result<Linear> {
        Ok(Linear::from_weight(
            normal(key, &[outputs, inputs], std)?,
            bias.then(|| Array::zeros(&[outputs], DType::F32)),
        ))
    }

    /// A dense layer of the given weight `[outputs, inputs]` and bias.
    pub fn from_weight(weight: Array, bias: Option<Array>) -> Linear {
        Linear {
            weight,
            bias,
            scales: None,
            biases: None,
            quantization: None,
        }
    }

    /// `x Wᵀ + b` over the last axis of `x`.
    #[track_caller]
    pub fn forward(&self, x: &Array) -> Array {
        in_composition("linear", || {
            let y = match self.quantized() {
                Some(weight) => quantized_matmul(x, &weight, true),
                None => x.matmul(&self.weight.swap_axes(-1, -2)),
            };
            match &self.bias {
                Some(b) => y + b,
                None => y,
            }
        })
    }

    /// The layer with its weight quantized in `format` along the inputs
    /// (the bias stays as it is); its forward is then the quantized
    /// product, which reads the packed codes directly.
    pub fn quantize(&self, format: QuantFormat) -> Result<Linear> {
        let (weight, scales, biases) =
            quantize_weight("Linear::quantize", &self.weight, self.quantization, format)?;
        Ok(Linear {
            weight,
            bias: self.bias.clone(),
            scales,
            biases,
            quantization: Some(format),
        })
    }

    /// The quantized weight, when the layer is quantized.
    pub fn quantized(&self) -> Option<Quantized> {
        quantized_parts(
            "linear",
            &self.weight,
            &self.scales,
            &self.biases,
            self.quantization,
        )
    }
}

/// A table of `count` vectors of `dim`: `forward(ids)` picks rows.
///
/// Quantized ([`Embedding::quantize`]), the table is stored as
/// [`Linear`]'s quantized weight is (MLX's `QuantizedEmbedding` layout):
/// a lookup dequantizes only the rows it picks, and the table used as the
/// output layer is the quantized product.
#[derive(Tree, Clone, Debug)]
pub struct Embedding {
    /// `[count, dim]`, or the packed codes `u32[count, dim·bits/32]`.
    pub weight: Array,
    /// The quantization groups' scales `[count, dim/group]`.
    pub scales: Option<Array>,
    /// The quantization groups' biases (affine formats).
    pub biases: Option<Array>,
    /// The table's quantization format; `None` for a dense table.
    #[tree(static)]
    pub quantization: Option<QuantFormat>,
}

impl Embedding {
    /// A table drawn from `N(0, std²)`.
    pub fn new(key: Key, count: usize, dim: usize, std: f64) -> Result<Embedding> {
        Ok(Embedding::from_table(normal(key, &[count, dim], std)?))
    }

    /// The dense table `weight: [count, dim]`.
    pub fn from_table(weight: Array) -> Embedding {
        Embedding {
            weight,
            scales: None,
            biases: None,
            quantization: None,
        }
    }

    /// The rows of integer `ids`: `ids.shape ++ [dim]`. An id outside the
    /// table is an error when the gather runs.
    #[track_caller]
    pub fn forward(&self, ids: &Array) -> Array {
        in_composition("embedding", || match self.quantized() {
            Some(table) => Quantized {
                packed: table.packed.take(ids, 0),
                scales: table.scales.take(ids, 0),
                biases: table.biases.map(|b| b.take(ids, 0)),
                format: table.format,
            }
            .dequantize(),
            None => self.weight.take(ids, 0),
        })
    }

    /// `x @ weightᵀ`: the table used as the output layer (tied embeddings,
    /// as GPT-2 ties its token embedding and its logits).
    #[track_caller]
    pub fn as_linear(&self, x: &Array) -> Array {
        in_composition("embedding_logits", || match self.quantized() {
            Some(table) => quantized_matmul(x, &table, true),
            None => x.matmul(&self.weight.swap_axes(-1, -2)),
        })
    }

    /// The table quantized in `format` along `dim`.
    pub fn quantize(&self, format: QuantFormat) -> Result<Embedding> {
        let (weight, scales, biases) = quantize_weight(
            "Embedding::quantize",
            &self.weight,
            self.quantization,
            format,
        )?;
        Ok(Embedding {
            weight,
            scales,
            biases,
            quantization: Some(format),
        })
    }

    /// The quantized table, when the table is quantized.
    pub fn quantized(&self) -> Option<Quantized> {
        quantized_parts(
            "embedding",
            &self.weight,
            &self.scales,
            &self.biases,
            self.quantization,
        )
    }
}

/// `weight` quantized in `format`: its packed codes, scales and biases; an
/// error naming `op` when it is quantized already.
fn quantize_weight(
    op: &str,
    weight: &Array,
    current: Option<QuantFormat>,
    format: QuantFormat,
) -> Result<(Array, Option<Array>, Option<Array>)> {
    if current.is_some() {
        return Err(Error::InvalidArgument {
            at: None,
            op: op.into(),
            detail: "the weight is quantized already".into(),
        });
    }
    let q = quantize(weight, format);
    Ok((q.packed, Some(q.scales), q.biases))
}

/// The quantized weight of a layer's fields, when `format` is set.
fn quantized_parts(
    op: &str,
    weight: &Array,
    scales: &Option<Array>,
    biases: &Option<Array>,
    format: Option<QuantFormat>,
) -> Option<Quantized> {
    let format = format?;
    Some(Quantized {
        packed: weight.clone(),
        scales: scales.clone().unwrap_or_else(|| {
            Array::failed(Error::InvalidArgument {
                at: None,
                op: op.into(),
                detail: "a quantized weight without `scales`".into(),
            })
        }),
        biases: biases.clone(),
        format,
    })
}

/// Layer normalization over the last axis, with optional scale and shift.
#[derive(Tree, Clone, Debug)]
pub struct LayerNorm {
    /// The scale `[dim]` (γ).
    pub weight: Option<Array>,
    /// The shift `[dim]` (β).
    pub bias: Option<Array>,
    /// Added to the variance.
    #[tree(static)]
    pub eps: f64,
}

impl LayerNorm {
    /// γ = 1 and β = 0 over `dim`, with `eps`.
    pub fn new(dim: usize, eps: f64) -> LayerNorm {
        LayerNorm {
            weight: Some(Array::ones(&[dim], DType::F32)),
            bias: Some(Array::zeros(&[dim], DType::F32)),
            eps,
        }
    }

    /// `(x - mean) / sqrt(var + eps) · γ + β` over the last axis.
    #[track_caller]
    pub fn forward(&self, x: &Array) -> Array {
        crate::nn::layer_norm(x, self.weight.as_ref(), self.bias.as_ref(), self.eps)
    }
}

/// Root-mean-square normalization over the last axis (LLaMA's).
#[derive(Tree, Clone, Debug)]
pub struct RmsNorm {
    /// The scale `[dim]`.
    pub weight: Array,
    /// Added to the mean square.
    #[tree(static)]
    pub eps: f64,
}

impl RmsNorm {
    /// A scale of ones over `dim`.
    pub fn new(dim: usize, eps: f64) -> RmsNorm {
        RmsNorm {
            weight: Array::ones(&[dim], DType::F32),
            eps,
        }
    }

    /// `x / sqrt(mean(x²) + eps) · weight` over the last axis.
    #[track_caller]
    pub fn forward(&self, x: &Array) -> Array {
        in_composition("rms_norm", || {
            let mean_square = (x * x).mean(&[-1], true);
            x * (mean_square + self.eps).rsqrt() * &self.weight
        })
    }
}

/// Dropout of a fixed rate: keyed in training, the identity in evaluation.
#[derive(Tree, Clone, Debug)]
pub struct Dropout {
    /// The probability of zeroing an element.
    #[tree(static)]
    pub rate: f64,
}

impl Dropout {
    /// Dropout at `rate`.
    pub fn new(rate: f64) -> Dropout {
        Dropout { rate }
    }

    /// With a `key` (an in-graph key, see [`super::key_array`]) drops
    /// elements as [`super::dropout`] does; without one (evaluation) returns
    /// `x`.
    #[track_caller]
    pub fn forward(&self, x: &Array, key: Option<&Array>) -> Array {
        match key {
            Some(key) => dropout(x, self.rate, key),
            None => x.clone(),
        }
    }
}

/// The nonlinearity of an [`Mlp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    /// GELU, exact (erf).
    Gelu,
    /// GELU, tanh approximation (GPT-2's).
    GeluTanh,
    /// SiLU.
    Silu,
    /// SwiGLU: `silu(x W_gate) ⊙ (x W_up)`, with a third matrix (LLaMA's).
    SwiGlu,
}

/// A transformer's feed-forward block: `proj(act(up(x)))`, or for SwiGLU
/// `proj(silu(gate(x)) ⊙ up(x))`.
#[derive(Tree, Clone, Debug)]
pub struct Mlp {
    /// `dim → hidden`.
    pub up: Linear,
    /// `dim → hidden`, SwiGLU's gate.
    pub gate: Option<Linear>,
    /// `hidden → dim`.
    pub proj: Linear,
    /// The nonlinearity.
    #[tree(static)]
    pub activation: Activation,
}

impl Mlp {
    /// A block of `dim → hidden → dim` with biases (not for SwiGLU, which
    /// has none, as LLaMA), weights from `N(0, std²)`.
    pub fn new(
        key: Key,
        dim: usize,
        hidden: usize,
        activation: Activation,
        std: f64,
    ) -> Result<Mlp> {
        let bias = activation != Activation::SwiGlu;
        let gate = match activation {
            Activation::SwiGlu => Some(Linear::with_std(key.fold_in(2), dim, hidden, false, std)?),
            _ => None,
        };
        Ok(Mlp {
            up: Linear::with_std(key.fold_in(0), dim, hidden, bias, std)?,
            gate,
            proj: Linear::with_std(key.fold_in(1), hidden, dim, bias, std)?,
            activation,
        })
    }

    /// The block on the last axis of `x`.
    #[track_caller]
    pub fn forward(&self, x: &Array) -> Array {
        in_composition("mlp", || {
            let up = self.up.forward(x);
            let hidden = match (self.activation, &self.gate) {
                (Activation::Gelu, _) => crate::nn::gelu(&up),
                (Activation::GeluTanh, _) => crate::nn::gelu_tanh(&up),
                (Activation::Silu, _) => silu(&up),
                (Activation::SwiGlu, Some(gate)) => silu(&gate.forward(x)) * up,
                (Activation::SwiGlu, None) => Array::failed(Error::InvalidArgument {
                    at: None,
                    op: "mlp".into(),
                    detail: "a SwiGLU block needs its `gate` layer".into(),
                }),
            };
            self.proj.forward(&hidden)
        })
    }

    /// The block with every weight quantized in `format`.
    pub fn quantize(&self, format: QuantFormat) -> Result<Mlp> {
        Ok(Mlp {
            up: self.up.quantize(format)?,
            gate: self.gate.as_ref().map(|g| g.quantize(format)).transpose()?,
            proj: self.proj.quantize(format)?,
            activation: self.activation,
        })
    }
}
