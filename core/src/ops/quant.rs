//! Quantized weights: `quantize`, `dequantize`, `quantized_matmul` and
//! `gather_qmm` in three formats ([`QuantFormat`]): shape rules (total over
//! symbolic dims), reference evaluation and vjps, side by side.
//!
//! Every format stores a weight `w[..., c]` quantized along its last axis as
//! a packed code array, `u32[..., c·bits/32]`, plus one scale (and for the
//! affine format one bias) per group of columns, of `w`'s float dtype:
//!
//! * the codes of a row form one bit stream, lowest bits first: code `j`
//!   occupies bits `j·bits .. (j+1)·bits` of the row, bit `b` being bit
//!   `b % 32` of word `b / 32` (MLX's layout; 3-, 5- and 6-bit codes
//!   straddle words);
//! * **affine** (MLX): per group of `group_size` columns, `scale = (max −
//!   min)/(2^bits − 1)`, `bias = min`, `code = round((w − bias)/scale)`
//!   (ties to even, clamped to `0 .. 2^bits − 1`; 0 where `scale` is 0) and
//!   `w ≈ scale·code + bias`, within `scale/2`;
//! * **NF4** (QLoRA): per block of 64 columns, `scale = max |w|` and the
//!   code indexes the nearest of the 16 normal-float levels [`NF4_LEVELS`]
//!   of `w/scale`; `w ≈ scale·level`;
//! * **int8**: symmetric, one scale per row (an output channel of a
//!   `[n, k]` weight), `scale = max |w| / 127`, `code = round(w/scale)` in
//!   `−127 ..= 127` stored as a two's complement byte; `w ≈ scale·code`.
//!
//! `quantized_matmul(x, w, transpose)` is `x @ wᵀ` (`w: [..., n, k]`, the
//! usual layout) or `x @ w` (`w: [..., k, n]`) for the dequantized `w`,
//! with NumPy batch broadcasting; `gather_qmm` picks, per output batch
//! entry, the `x` matrix `lhs_indices` names and the `w` matrix
//! `rhs_indices` names (indices broadcast together; output
//! `broadcast(lhs, rhs).shape + [m, n]`). The reference evaluation decodes
//! the packed codes as it goes and never materializes the dequantized
//! matrix (the kernels are in `qmm`); it rounds each decoded weight to the
//! dtype (f16/bf16) and accumulates in f32. For f32 weights the kernels may
//! take each group's bias out of its sum (`Σ (s·c + b)·x = s·Σ c·x + b·Σ x`,
//! as MLX does: one multiply-add per code instead of two), so the result
//! agrees with dequantize → matmul within
//! `error_bound(k + 4, Σ (|s·c| + |b|)·|x|)` ([`super::matmul::error_bound`]):
//! `matmul`'s per-k bound, its sum taken over `|s·c| + |b|` in place of
//! `|w|` (for NF4 and int8, `|s·level|`, which is `|w|`) and its k widened
//! by the decoding's two roundings and the scale's and bias's products.
//!
//! ```
//! use kiln::{quantize, quantized_matmul, Array, QuantFormat};
//!
//! let w = Array::from_vec((0..128).map(|i| i as f32 / 64.0 - 1.0).collect(), &[2, 64]).unwrap();
//! let q = quantize(&w, QuantFormat::affine(4, 64));
//! assert_eq!(q.packed.dims(), Some(vec![2, 8]));
//! let x = Array::ones(&[3, 64], kiln::DType::F32);
//! let y = quantized_matmul(&x, &q, true);
//! assert_eq!(y.dims(), Some(vec![3, 2]));
//! let exact = x.matmul(&q.dequantize().transpose()).to_vec::<f32>().unwrap();
//! for (got, want) in y.to_vec::<f32>().unwrap().iter().zip(&exact) {
//!     assert!((got - want).abs() <= 1e-4 * want.abs().max(1.0));
//! }
//! ```

use super::batching::{folded_indices, Batched};
use super::qmm;
use super::strided::{broadcast_shapes, broadcast_strides, for_each_offset, numel};
use super::{Op, ShapeCx};
use crate::data::HostData;
use crate::error::{arg_err, dtype_err, shape_err, Error, Result};
use crate::handle::array::Array;
use crate::shape::{Aval, Dim, Shape};
use crate::DType;
use half::{bf16, f16};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fmt;

/// The 16 NF4 levels of QLoRA (bitsandbytes), ascending: quantiles of a
/// standard normal scaled to `[-1, 1]`, with an exact zero.
pub const NF4_LEVELS: [f32; 16] = [
    -1.0,
    -0.696_192_8,
    -0.525_073_05,
    -0.394_917_5,
    -0.284_441_38,
    -0.184_773_43,
    -0.091_050_036,
    0.0,
    0.079_580_3,
    0.160_930_2,
    0.246_112_3,
    0.337_915_24,
    0.440_709_83,
    0.562_617,
    0.722_956_84,
    1.0,
];

/// Bit widths of the affine format.
pub const AFFINE_BITS: [u32; 6] = [2, 3, 4, 5, 6, 8];

/// Group sizes of the affine format.
pub const AFFINE_GROUP_SIZES: [usize; 3] = [32, 64, 128];

/// Columns per NF4 block.
pub const NF4_BLOCK: usize = 64;

/// How a quantized weight encodes its values (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum QuantFormat {
    /// MLX's affine format: `w ≈ scale·code + bias` per group of columns.
    Affine {
        /// Bits per code: 2, 3, 4, 5, 6 or 8.
        bits: u32,
        /// Columns per group: 32, 64 or 128.
        group_size: usize,
    },
    /// QLoRA's NF4: 4-bit codes of 16 normal-float levels, absmax scale
    /// per block of 64 columns.
    Nf4,
    /// Symmetric int8 with one scale per row.
    Int8,
}

impl QuantFormat {
    /// The affine format with `bits` per code and `group_size` columns per
    /// group (checked when an op uses it).
    pub fn affine(bits: u32, group_size: usize) -> QuantFormat {
        QuantFormat::Affine { bits, group_size }
    }

    /// Bits per code.
    pub fn bits(self) -> u32 {
        match self {
            QuantFormat::Affine { bits, .. } => bits,
            QuantFormat::Nf4 => 4,
            QuantFormat::Int8 => 8,
        }
    }

    /// Columns sharing one scale; `None` for int8, whose scale covers a
    /// whole row.
    pub fn group_size(self) -> Option<usize> {
        match self {
            QuantFormat::Affine { group_size, .. } => Some(group_size),
            QuantFormat::Nf4 => Some(NF4_BLOCK),
            QuantFormat::Int8 => None,
        }
    }

    /// True when the format has a bias per group (affine).
    pub fn has_biases(self) -> bool {
        matches!(self, QuantFormat::Affine { .. })
    }

    /// `Err` naming `op` unless the bit width and group size are supported.
    pub fn check(self, op: &str) -> Result<()> {
        if let QuantFormat::Affine { bits, group_size } = self {
            if !AFFINE_BITS.contains(&bits) {
                return Err(arg_err(
                    op,
                    format!("affine quantization takes bits {AFFINE_BITS:?}, got {bits}"),
                ));
            }
            if !AFFINE_GROUP_SIZES.contains(&group_size) {
                return Err(arg_err(
                    op,
                    format!(
                        "affine quantization takes group sizes {AFFINE_GROUP_SIZES:?}, got \
                         {group_size}"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Columns a row must be a multiple of: the group size, or for int8
    /// the four codes of one word.
    fn column_multiple(self) -> usize {
        self.group_size().unwrap_or(4)
    }

    /// The value of `code` under `scale` and `bias`, in f32.
    #[inline]
    pub fn decode(self, code: u32, scale: f32, bias: f32) -> f32 {
        match self {
            QuantFormat::Affine { .. } => scale * code as f32 + bias,
            QuantFormat::Nf4 => scale * NF4_LEVELS[(code & 15) as usize],
            QuantFormat::Int8 => scale * f32::from(code as u8 as i8),
        }
    }
}

impl fmt::Display for QuantFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuantFormat::Affine { bits, group_size } => {
                write!(f, "affine(bits={bits}, group_size={group_size})")
            }
            QuantFormat::Nf4 => f.write_str("nf4"),
            QuantFormat::Int8 => f.write_str("int8"),
        }
    }
}

/// Which output of `quantize` a node computes (each is its own node; the
/// three share their input).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum QuantPart {
    /// The packed codes, u32.
    Packed,
    /// The scales.
    Scales,
    /// The biases (affine only).
    Biases,
}

/// What a quantization op computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum QuantKind {
    /// One part of the quantization of `w`: operands `[w]`.
    Quantize(QuantPart),
    /// The weight back: operands `[packed, scales, biases?]`.
    Dequantize,
    /// `x @ w(ᵀ)`: operands `[x, packed, scales, biases?]`.
    Matmul {
        /// `x @ wᵀ` for `w: [..., n, k]` when true, `x @ w` for `w:
        /// [..., k, n]` when false.
        transpose: bool,
    },
    /// The gathered product: operands `[x, packed, scales, biases?,
    /// lhs_indices, rhs_indices]`.
    GatherMatmul {
        /// As for [`QuantKind::Matmul`].
        transpose: bool,
    },
}

/// A quantization op: what it computes, in which format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct QuantOp {
    /// What it computes.
    pub kind: QuantKind,
    /// The weight's format.
    pub format: QuantFormat,
}

impl QuantOp {
    /// The op's name: `quantize`, `dequantize`, `quantized_matmul` or
    /// `gather_qmm`.
    pub fn name(&self) -> &'static str {
        match self.kind {
            QuantKind::Quantize(_) => "quantize",
            QuantKind::Dequantize => "dequantize",
            QuantKind::Matmul { .. } => "quantized_matmul",
            QuantKind::GatherMatmul { .. } => "gather_qmm",
        }
    }

    /// The op with its parameters, for reports.
    pub fn describe(&self) -> String {
        let format = self.format;
        match self.kind {
            QuantKind::Quantize(part) => format!("quantize({format}, {part:?})"),
            QuantKind::Dequantize => format!("dequantize({format})"),
            QuantKind::Matmul { transpose } => {
                format!("quantized_matmul({format}, transpose={transpose})")
            }
            QuantKind::GatherMatmul { transpose } => {
                format!("gather_qmm({format}, transpose={transpose})")
            }
        }
    }

    /// Operand count.
    pub fn arity(&self) -> usize {
        let weight = 2 + usize::from(self.format.has_biases());
        match self.kind {
            QuantKind::Quantize(_) => 1,
            QuantKind::Dequantize => weight,
            QuantKind::Matmul { .. } => 1 + weight,
            QuantKind::GatherMatmul { .. } => 3 + weight,
        }
    }

    /// The output aval from the operand avals (see the module docs).
    pub fn shape_rule(&self, inputs: &[&Aval], cx: &mut ShapeCx) -> Result<Aval> {
        let op = self.name();
        self.format.check(op)?;
        let weight = 2 + usize::from(self.format.has_biases());
        match self.kind {
            QuantKind::Quantize(part) => quantize_rule(op, self.format, part, inputs[0], cx),
            QuantKind::Dequantize => dequantized_aval(op, self.format, inputs, cx),
            QuantKind::Matmul { transpose } => {
                let x = inputs[0];
                let w = dequantized_aval(op, self.format, &inputs[1..], cx)?;
                let (m, n, batch) = product_dims(op, x, &w, transpose, cx)?;
                let w_batch = Aval::new(
                    Shape(w.shape.dims()[..w.shape.rank() - 2].to_vec()),
                    x.dtype,
                );
                let mut dims = broadcast_shapes(op, &[&batch, &w_batch], cx)
                    .map_err(|e| batch_err(op, e, &[x, inputs[1]]))?
                    .0;
                dims.extend([m, n]);
                Ok(Aval::new(Shape(dims), x.dtype))
            }
            QuantKind::GatherMatmul { transpose } => {
                let x = inputs[0];
                let w = dequantized_aval(op, self.format, &inputs[1..1 + weight], cx)?;
                let (m, n, _) = product_dims(op, x, &w, transpose, cx)?;
                let (lhs, rhs) = (inputs[1 + weight], inputs[2 + weight]);
                for indices in [lhs, rhs] {
                    if !matches!(indices.dtype, DType::I32 | DType::U32) {
                        return Err(dtype_err(
                            op,
                            &[lhs, rhs],
                            format!("indices must be i32 or u32, got {}", indices.dtype),
                        ));
                    }
                }
                let mut dims = broadcast_shapes(op, &[lhs, rhs], cx)
                    .map_err(|e| batch_err(op, e, &[lhs, rhs]))?
                    .0;
                dims.extend([m, n]);
                Ok(Aval::new(Shape(dims), x.dtype))
            }
        }
    }

    /// Reference evaluation on concrete shapes.
    pub fn eval(&self, inputs: &[&HostData], in_shapes: &[&[usize]]) -> Result<HostData> {
        let op = self.name();
        let format = self.format;
        let weight = 2 + usize::from(format.has_biases());
        match self.kind {
            QuantKind::Quantize(part) => quantize_eval(op, format, part, inputs[0], in_shapes[0]),
            QuantKind::Dequantize => {
                let w = Weight::new(op, format, inputs, in_shapes)?;
                let mut out = crate::pool::zeroed_f32(w.rows * w.cols);
                for (r, row) in out.chunks_exact_mut(w.cols.max(1)).enumerate() {
                    w.decode_cols(r, 0, row);
                }
                Ok(from_f32(w.dtype, out))
            }
            QuantKind::Matmul { transpose } => {
                let w = Weight::new(op, format, &inputs[1..], &in_shapes[1..])?;
                let x = Lhs::new(op, inputs[0], in_shapes[0], &w, transpose)?;
                let (xb, wb) = (&in_shapes[0][..in_shapes[0].len() - 2], &w.batch[..]);
                let out_batch = broadcast_known(xb, wb);
                let mut pairs = Vec::with_capacity(numel(&out_batch));
                for_each_offset(
                    &out_batch,
                    [
                        &broadcast_strides(xb, &out_batch),
                        &broadcast_strides(wb, &out_batch),
                    ],
                    |[i, j]| pairs.push((i, j)),
                );
                Ok(from_f32(
                    w.dtype,
                    qmm::product(&x.values, (x.m, x.k), &w, transpose, &pairs),
                ))
            }
            QuantKind::GatherMatmul { transpose } => {
                let w = Weight::new(
                    op,
                    format,
                    &inputs[1..1 + weight],
                    &in_shapes[1..1 + weight],
                )?;
                let x = Lhs::new(op, inputs[0], in_shapes[0], &w, transpose)?;
                let (lhs, rhs) = (1 + weight, 2 + weight);
                let x_count = numel(&in_shapes[0][..in_shapes[0].len() - 2]);
                let w_count = numel(&w.batch);
                let lhs_idx = indices(op, "lhs_indices", inputs[lhs], x_count)?;
                let rhs_idx = indices(op, "rhs_indices", inputs[rhs], w_count)?;
                let out_batch = broadcast_known(in_shapes[lhs], in_shapes[rhs]);
                let mut pairs = Vec::with_capacity(numel(&out_batch));
                for_each_offset(
                    &out_batch,
                    [
                        &broadcast_strides(in_shapes[lhs], &out_batch),
                        &broadcast_strides(in_shapes[rhs], &out_batch),
                    ],
                    |[i, j]| pairs.push((lhs_idx[i], rhs_idx[j])),
                );
                Ok(from_f32(
                    w.dtype,
                    qmm::product(&x.values, (x.m, x.k), &w, transpose, &pairs),
                ))
            }
        }
    }

    /// The cotangents of the operands for the cotangent `g` of the output.
    pub(crate) fn vjp(&self, inputs: &[Array], g: &Array) -> Result<Vec<Option<Array>>> {
        let format = self.format;
        let biases = format.has_biases();
        match self.kind {
            QuantKind::Quantize(QuantPart::Packed) => Ok(vec![None]),
            QuantKind::Quantize(_) => Err(arg_err(
                "quantize",
                "its scales and biases have no gradient; differentiate through the \
                 dequantized weight instead (a straight-through estimator)",
            )),
            QuantKind::Dequantize => {
                let mut out = vec![None];
                out.extend(weight_vjp(format, &inputs[0], &inputs[1], biases, g));
                Ok(out)
            }
            QuantKind::Matmul { transpose } => {
                let (x, packed, scales) = (&inputs[0], &inputs[1], &inputs[2]);
                let w = Quantized {
                    packed: packed.clone(),
                    scales: scales.clone(),
                    biases: inputs.get(3).filter(|_| biases).cloned(),
                    format,
                };
                let gx = quantized_matmul(g, &w, !transpose);
                let gw = if transpose {
                    g.swap_axes(-1, -2).matmul(x)
                } else {
                    x.swap_axes(-1, -2).matmul(g)
                };
                let w_shape = w.dequantize().shape().clone();
                let gw = crate::ops::binary::unbroadcast(&gw, &w_shape);
                let mut out = vec![Some(crate::ops::binary::unbroadcast(&gx, x.shape())), None];
                out.extend(weight_vjp(format, packed, scales, biases, &gw));
                Ok(out)
            }
            QuantKind::GatherMatmul { transpose } => {
                let weight = 2 + usize::from(biases);
                let (x, packed, scales) = (&inputs[0], &inputs[1], &inputs[2]);
                let (lhs, rhs) = (&inputs[1 + weight], &inputs[2 + weight]);
                Ok(gather_vjp(
                    format,
                    transpose,
                    x,
                    packed,
                    scales,
                    inputs.get(3).filter(|_| biases),
                    lhs,
                    rhs,
                    g,
                ))
            }
        }
    }
}

impl QuantOp {
    /// The tangent of the output for the operands' tangents (`None` where
    /// zero). The dequantized weight is linear in its scales and biases
    /// together, so its tangent is the same codes dequantized with the
    /// tangent scales and biases; a product's tangent adds `x`'s term (the
    /// quantized product of `ẋ`) and the weight's (a dense product with the
    /// weight's tangent).
    pub(crate) fn jvp(
        &self,
        inputs: &[Array],
        output: &Array,
        tangents: &[Option<Array>],
    ) -> Result<Option<Array>> {
        let biases = self.format.has_biases();
        // The tangent of the dequantized weight whose packed codes are
        // operand `at`, `None` when neither scales nor biases have one.
        let weight_tangent = |at: usize| -> Option<Array> {
            let (ts, tb) = (&tangents[at + 1], tangents.get(at + 2).filter(|_| biases));
            if ts.is_none() && tb.is_none_or(Option::is_none) {
                return None;
            }
            let scales = &inputs[at + 1];
            let mut operands = vec![
                inputs[at].clone(),
                ts.clone().unwrap_or_else(|| scales.zeros_like()),
            ];
            if biases {
                operands.push(tb.cloned().flatten().unwrap_or_else(|| scales.zeros_like()));
            }
            Some(Array::apply(
                Op::Quant(QuantOp {
                    kind: QuantKind::Dequantize,
                    format: self.format,
                }),
                operands,
            ))
        };
        let with_tangent_x = |tx: &Array| {
            let mut operands = inputs.to_vec();
            operands[0] = tx.clone();
            Array::apply(Op::Quant(*self), operands)
        };
        let sum = |a: Option<Array>, b: Option<Array>| match (a, b) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        match self.kind {
            QuantKind::Quantize(QuantPart::Packed) => Ok(None),
            QuantKind::Quantize(_) => Err(arg_err(
                "quantize",
                "its scales and biases have no derivative; differentiate through the \
                 dequantized weight instead (a straight-through estimator)",
            )),
            QuantKind::Dequantize => Ok(weight_tangent(0)),
            QuantKind::Matmul { transpose } => {
                let x = &inputs[0];
                let through_x = tangents[0].as_ref().map(with_tangent_x);
                let through_w = weight_tangent(1).map(|tw| {
                    let tw = if transpose { tw.swap_axes(-1, -2) } else { tw };
                    crate::ops::binary::broadcast_like(x.matmul(&tw), output)
                });
                Ok(sum(through_x, through_w))
            }
            QuantKind::GatherMatmul { transpose } => {
                let weight = 2 + usize::from(biases);
                let (x, lhs, rhs) = (&inputs[0], &inputs[1 + weight], &inputs[2 + weight]);
                let through_x = tangents[0].as_ref().map(with_tangent_x);
                let through_w = weight_tangent(1).map(|tw| {
                    // Each output batch entry's product with the gathered
                    // tangent matrices, as `gather_qmm` gathers the codes.
                    let batch_rank = output.ndim() - 2;
                    let batch = Shape(output.shape().dims()[..batch_rank].to_vec());
                    let flat_index =
                        |i: &Array| flatten_lead(&i.broadcast_to(batch.clone()), batch_rank);
                    let xs = flatten_lead(x, x.ndim() - 2).take(&flat_index(lhs), 0);
                    let tws = flatten_lead(&tw, tw.ndim() - 2).take(&flat_index(rhs), 0);
                    let tws = if transpose {
                        tws.swap_axes(-1, -2)
                    } else {
                        tws
                    };
                    xs.matmul(&tws).reshape_to(output.shape().clone())
                });
                Ok(sum(through_x, through_w))
            }
        }
    }
}

impl QuantOp {
    /// The batched op under vmap: quantize and dequantize treat the batch
    /// as one more leading dim; a product with a shared 2-D weight folds
    /// the examples into the rows of `x` (one product), otherwise the
    /// batch becomes a broadcast batch dim. `gather_qmm` folds the
    /// examples into the matrices its indices pick from: a batched `x`
    /// becomes `B·X` matrices and `lhs_indices` are offset to each
    /// example's own, a batched weight likewise with `rhs_indices`
    /// ([`folded_indices`]); the indices then carry the batch.
    pub(crate) fn batch(&self, operands: &[Batched], output: &Array, size: &Dim) -> Batched {
        let apply = |values: Vec<Array>| Array::apply(Op::Quant(*self), values);
        match self.kind {
            QuantKind::Quantize(_) => Batched::along(apply(vec![operands[0].front()]), 0),
            QuantKind::Dequantize => Batched::along(
                apply(operands.iter().map(|b| b.materialized(size)).collect()),
                0,
            ),
            QuantKind::Matmul { .. } => {
                let (x, weight) = (&operands[0], &operands[1..]);
                let shared_weight = weight.iter().all(|b| b.axis.is_none());
                if shared_weight && weight[0].value.ndim() == 2 {
                    return x.rows_folded(|rows| {
                        let mut values = vec![rows];
                        values.extend(weight.iter().map(|b| b.value.clone()));
                        apply(values)
                    });
                }
                let rank = output.ndim();
                let mut values = vec![x.aligned(rank)];
                values.extend(weight.iter().map(|b| {
                    if shared_weight {
                        b.value.clone()
                    } else {
                        Batched::along(b.materialized(size), 0).aligned(rank)
                    }
                }));
                Batched::along(apply(values), 0)
            }
            QuantKind::GatherMatmul { .. } => {
                let weight = 2 + usize::from(self.format.has_biases());
                let (x, w) = (&operands[0], &operands[1..1 + weight]);
                let (lhs, rhs) = (&operands[1 + weight], &operands[2 + weight]);
                // The matrices of `matrices` (each batched, batch first)
                // flattened to `B·count` and the indices offset into them.
                let fold = |matrices: Vec<Array>, indices: &Batched| {
                    let lead = matrices[0].ndim() - 2;
                    let count = Array::apply(
                        Op::DimSize {
                            axes: (1..lead).collect(),
                            dtype: indices.value.dtype(),
                        },
                        vec![matrices[0].clone()],
                    );
                    let flat: Vec<Array> = matrices.iter().map(|m| flatten_lead(m, lead)).collect();
                    let offsets = folded_indices(indices, &count, size, false);
                    (flat, Batched::along(offsets, 0))
                };
                let (x, lhs) = match x.axis {
                    Some(_) => {
                        let (mut flat, lhs) = fold(vec![x.front()], lhs);
                        (flat.remove(0), lhs)
                    }
                    None => (x.value.clone(), lhs.clone()),
                };
                let (w, rhs) = if w.iter().any(|b| b.axis.is_some()) {
                    fold(w.iter().map(|b| b.materialized(size)).collect(), rhs)
                } else {
                    (w.iter().map(|b| b.value.clone()).collect(), rhs.clone())
                };
                let batch_rank = output.ndim() - 2;
                let mut values = vec![x];
                values.extend(w);
                values.extend([lhs.aligned(batch_rank), rhs.aligned(batch_rank)]);
                Batched::along(apply(values), 0)
            }
        }
    }
}

/// `a` with its leading `lead` dims flattened into one.
#[track_caller]
fn flatten_lead(a: &Array, lead: usize) -> Array {
    let dims = a.shape().dims();
    let count = dims[..lead].iter().fold(Dim::Known(1), |acc, d| acc.mul(d));
    let mut flat = vec![count];
    flat.extend(dims[lead..].iter().cloned());
    a.reshape_to(Shape(flat))
}

/// The cotangents of `gather_qmm`'s operands: each output batch entry's
/// share is computed on the gathered matrices and added back at the
/// matrix its index named (x through `lhs`, the weight through `rhs`).
#[allow(clippy::too_many_arguments)]
fn gather_vjp(
    format: QuantFormat,
    transpose: bool,
    x: &Array,
    packed: &Array,
    scales: &Array,
    biases: Option<&Array>,
    lhs: &Array,
    rhs: &Array,
    g: &Array,
) -> Vec<Option<Array>> {
    let batch_rank = g.ndim() - 2;
    let batch = Shape(g.shape().dims()[..batch_rank].to_vec());
    let flat_index = |i: &Array| flatten_lead(&i.broadcast_to(batch.clone()), batch_rank);
    let (lhs, rhs) = (flat_index(lhs), flat_index(rhs));
    let g = flatten_lead(g, batch_rank);
    let x_rank = x.ndim() - 2;
    let w_rank = packed.ndim() - 2;
    let xs = flatten_lead(x, x_rank);
    let pick = |a: &Array| flatten_lead(a, w_rank).take(&rhs, 0);
    let picked = Quantized {
        packed: pick(packed),
        scales: pick(scales),
        biases: biases.map(pick),
        format,
    };
    let gx = quantized_matmul(&g, &picked, !transpose)
        .scatter_add(&lhs, 0, xs.shape().dims()[0].clone())
        .reshape_to(x.shape().clone());
    let xg = xs.take(&lhs, 0);
    let gw = if transpose {
        g.swap_axes(-1, -2).matmul(&xg)
    } else {
        xg.swap_axes(-1, -2).matmul(&g)
    };
    let w = Quantized {
        packed: packed.clone(),
        scales: scales.clone(),
        biases: biases.cloned(),
        format,
    };
    let w_flat = flatten_lead(&w.dequantize(), w_rank);
    let gw = gw
        .scatter_add(&rhs, 0, w_flat.shape().dims()[0].clone())
        .reshape_to(w.dequantize().shape().clone());
    let mut out = vec![Some(gx), None];
    out.extend(weight_vjp(format, packed, scales, biases.is_some(), &gw));
    out.extend([None, None]);
    out
}

/// The cotangents of scales (and biases) of a dequantized weight whose
/// cotangent is `g`: per group, the sum of `g` times the unit-scale decoded
/// codes (and the sum of `g`).
fn weight_vjp(
    format: QuantFormat,
    packed: &Array,
    scales: &Array,
    biases: bool,
    g: &Array,
) -> Vec<Option<Array>> {
    let ones = Array::scalar(1.0, scales.dtype()).broadcast_to(scales.shape().clone());
    let mut operands = vec![packed.clone(), ones.clone()];
    if biases {
        operands.push(&ones * 0.0);
    }
    let unit = Array::apply(
        Op::Quant(QuantOp {
            kind: QuantKind::Dequantize,
            format,
        }),
        operands,
    );
    let grouped = |v: Array| {
        let mut dims = scales.shape().dims().to_vec();
        let group = match format.group_size() {
            Some(size) => Dim::Known(size),
            None => g.shape().dims().last().cloned().unwrap_or(Dim::Known(1)),
        };
        dims.push(group);
        v.reshape_to(Shape(dims)).sum(&[-1], false)
    };
    let mut out = vec![Some(grouped(g * &unit))];
    if biases {
        out.push(Some(grouped(g.clone())));
    }
    out
}

/// `[m, n]` of the product and `x`'s batch dims, after checking `x`
/// against the dequantized weight `w` and unifying the inner dims.
fn product_dims(
    op: &str,
    x: &Aval,
    w: &Aval,
    transpose: bool,
    cx: &mut ShapeCx,
) -> Result<(Dim, Dim, Aval)> {
    let (rx, rw) = (x.shape.rank(), w.shape.rank());
    if rx < 2 || rw < 2 {
        return Err(shape_err(
            op,
            &[x, w],
            format!("needs x and w of rank >= 2, got ranks {rx} and {rw}"),
        ));
    }
    if x.dtype != w.dtype {
        return Err(dtype_err(
            op,
            &[x, w],
            format!("x is {} but the scales are {}", x.dtype, w.dtype),
        ));
    }
    let (xd, wd) = (x.shape.dims(), w.shape.dims());
    let (wk, wn) = if transpose {
        (&wd[rw - 1], &wd[rw - 2])
    } else {
        (&wd[rw - 2], &wd[rw - 1])
    };
    if cx.unify(&xd[rx - 1], wk).is_none() {
        return Err(shape_err(
            op,
            &[x, w],
            format!(
                "inner dims differ: x has k={} but the weight (transpose={transpose}) has {wk}",
                xd[rx - 1]
            ),
        ));
    }
    let batch = Aval::new(Shape(xd[..rx - 2].to_vec()), x.dtype);
    Ok((xd[rx - 2].clone(), wn.clone(), batch))
}

fn batch_err(op: &str, e: Error, avals: &[&Aval]) -> Error {
    match e {
        Error::Shape { detail, .. } => shape_err(op, avals, format!("batch dims: {detail}")),
        other => other,
    }
}

/// `Err` unless `dim` is a multiple of `m`; a symbolic dim records the
/// guard `dim == floor(dim / m)·m`.
fn require_multiple(
    op: &str,
    aval: &Aval,
    dim: &Dim,
    m: usize,
    what: &str,
    cx: &mut ShapeCx,
) -> Result<()> {
    match dim.known() {
        Some(n) if n % m != 0 => Err(shape_err(
            op,
            &[aval],
            format!("{what} {n} is not a multiple of {m}"),
        )),
        Some(_) => Ok(()),
        None => {
            let whole = Dim::from_expr(dim.to_expr().floor_div(m as u64).scale(m as i64));
            cx.unify(dim, &whole);
            Ok(())
        }
    }
}

fn quantize_rule(
    op: &str,
    format: QuantFormat,
    part: QuantPart,
    w: &Aval,
    cx: &mut ShapeCx,
) -> Result<Aval> {
    if !w.dtype.is_float() {
        return Err(dtype_err(
            op,
            &[w],
            format!("quantizes floats, got {}", w.dtype),
        ));
    }
    let Some(cols) = w.shape.dims().last() else {
        return Err(shape_err(op, &[w], "needs an array of rank >= 1"));
    };
    require_multiple(
        op,
        w,
        cols,
        format.column_multiple(),
        &format!("the quantized (last) axis of {format} has length"),
        cx,
    )?;
    let mut dims = w.shape.dims().to_vec();
    let rank = dims.len();
    let bits = i64::from(format.bits());
    match part {
        QuantPart::Packed => {
            // Whole groups (or int8's four-code words) of whole words.
            let multiple = format.column_multiple();
            let words = (multiple as i64 * bits) / 32;
            dims[rank - 1] = Dim::from_expr(cols.to_expr().floor_div(multiple as u64).scale(words));
            Ok(Aval::new(Shape(dims), DType::U32))
        }
        QuantPart::Biases if !format.has_biases() => {
            Err(arg_err(op, format!("the {format} format has no biases")))
        }
        QuantPart::Scales | QuantPart::Biases => {
            dims[rank - 1] = match format.group_size() {
                Some(g) => Dim::from_expr(cols.to_expr().floor_div(g as u64)),
                None => Dim::Known(1),
            };
            Ok(Aval::new(Shape(dims), w.dtype))
        }
    }
}

/// The aval of the dequantized weight of `[packed, scales, biases?]`.
fn dequantized_aval(
    op: &str,
    format: QuantFormat,
    parts: &[&Aval],
    cx: &mut ShapeCx,
) -> Result<Aval> {
    let (packed, scales) = (parts[0], parts[1]);
    if packed.dtype != DType::U32 {
        return Err(dtype_err(
            op,
            &[packed],
            format!("packed codes must be u32, got {}", packed.dtype),
        ));
    }
    if !scales.dtype.is_float() {
        return Err(dtype_err(
            op,
            &[scales],
            format!("scales must be floats, got {}", scales.dtype),
        ));
    }
    let rank = packed.shape.rank();
    if rank == 0 || scales.shape.rank() != rank {
        return Err(shape_err(
            op,
            &[packed, scales],
            "packed codes and scales need one rank, at least 1",
        ));
    }
    if format.has_biases() {
        let biases = parts[2];
        let same_rank = biases.shape.rank() == rank;
        let unified = same_rank
            && biases
                .shape
                .dims()
                .iter()
                .zip(scales.shape.dims())
                .all(|(b, s)| cx.unify(b, s).is_some());
        if !unified || biases.dtype != scales.dtype {
            return Err(shape_err(
                op,
                &[scales, biases],
                "biases must have the shape and dtype of the scales",
            ));
        }
    }
    let (pd, sd) = (packed.shape.dims(), scales.shape.dims());
    let mut dims = Vec::with_capacity(rank);
    for (a, (p, s)) in pd[..rank - 1].iter().zip(&sd[..rank - 1]).enumerate() {
        match cx.unify(p, s) {
            Some(d) => dims.push(d),
            None => {
                return Err(shape_err(
                    op,
                    &[packed, scales],
                    format!("packed codes and scales differ at axis {a}: {p} vs {s}"),
                ))
            }
        }
    }
    let (words, groups) = (&pd[rank - 1], &sd[rank - 1]);
    let cols = match format.group_size() {
        Some(g) => Dim::from_expr(groups.to_expr().scale(g as i64)),
        None => {
            if cx.unify(groups, &Dim::Known(1)).is_none() {
                return Err(shape_err(
                    op,
                    &[packed, scales],
                    format!("int8 has one scale per row, got {groups} along the last axis"),
                ));
            }
            Dim::from_expr(words.to_expr().scale(4))
        }
    };
    let bits = i64::from(format.bits());
    let needed = Dim::from_expr(cols.to_expr().scale(bits));
    let given = Dim::from_expr(words.to_expr().scale(32));
    if cx.unify(&needed, &given).is_none() {
        return Err(shape_err(
            op,
            &[packed, scales],
            format!(
                "{groups} groups of {format} hold {cols} columns, which need {} words of \
                 packed codes, not {words}",
                needed.known().unwrap_or(0) / 32
            ),
        ));
    }
    dims.push(cols);
    Ok(Aval::new(Shape(dims), scales.dtype))
}

/// The NumPy broadcast of two concrete shapes the shape rule accepted.
fn broadcast_known(a: &[usize], b: &[usize]) -> Vec<usize> {
    let rank = a.len().max(b.len());
    (0..rank)
        .map(|d| {
            let at = |s: &[usize]| s.len().checked_sub(rank - d).map_or(1, |i| s[i]);
            let (x, y) = (at(a), at(b));
            if x == 1 {
                y
            } else {
                x
            }
        })
        .collect()
}

/// Float data widened to f32.
/// `data` as f32 values: borrowed when it is f32 already, so a product
/// does not copy its scales on every call.
fn to_f32<'d>(op: &str, data: &'d HostData) -> Result<Cow<'d, [f32]>> {
    match data {
        HostData::F32(v) => Ok(Cow::Borrowed(v)),
        HostData::F16(v) => Ok(Cow::Owned(v.iter().map(|x| x.to_f32()).collect())),
        HostData::BF16(v) => Ok(Cow::Owned(v.iter().map(|x| x.to_f32()).collect())),
        other => Err(arg_err(
            op,
            format!("expects float data, got {}", other.dtype()),
        )),
    }
}

/// f32 values as data of `dtype` (rounded to nearest for the halves).
fn from_f32(dtype: DType, values: Vec<f32>) -> HostData {
    match dtype {
        DType::F16 => HostData::F16(values.into_iter().map(f16::from_f32).collect()),
        DType::BF16 => HostData::BF16(values.into_iter().map(bf16::from_f32).collect()),
        _ => HostData::F32(values),
    }
}

/// Rounding of an f32 to `dtype` and back: what storing a decoded weight
/// in a `dtype` array does to it.
fn rounding(dtype: DType) -> fn(f32) -> f32 {
    match dtype {
        DType::F16 => |x| f16::from_f32(x).to_f32(),
        DType::BF16 => |x| bf16::from_f32(x).to_f32(),
        _ => |x| x,
    }
}

/// Checked indices into `count` matrices.
fn indices(op: &str, what: &str, data: &HostData, count: usize) -> Result<Vec<usize>> {
    let values: Vec<i64> = match data {
        HostData::I32(v) => v.iter().map(|&i| i64::from(i)).collect(),
        HostData::U32(v) => v.iter().map(|&i| i64::from(i)).collect(),
        other => {
            return Err(arg_err(
                op,
                format!("{what} must be i32 or u32, got {}", other.dtype()),
            ))
        }
    };
    values
        .into_iter()
        .map(|i| {
            usize::try_from(i)
                .ok()
                .filter(|&i| i < count)
                .ok_or_else(|| Error::Runtime {
                    op: op.to_string(),
                    detail: format!("{what} holds {i}, out of range for {count} matrices"),
                })
        })
        .collect()
}

/// A packed weight with concrete shapes, ready to decode.
pub(super) struct Weight<'a> {
    pub format: QuantFormat,
    pub dtype: DType,
    pub words: &'a [u32],
    pub scales: Cow<'a, [f32]>,
    pub biases: Option<Cow<'a, [f32]>>,
    /// Batch dims (all but the last two of the dequantized shape).
    batch: Vec<usize>,
    /// Rows over every batch entry, and rows of one matrix.
    rows: usize,
    pub rows_per_matrix: usize,
    pub cols: usize,
    pub groups_per_row: usize,
    round: fn(f32) -> f32,
}

impl<'a> Weight<'a> {
    fn new(
        op: &str,
        format: QuantFormat,
        parts: &[&'a HostData],
        shapes: &[&[usize]],
    ) -> Result<Weight<'a>> {
        let HostData::U32(words) = parts[0] else {
            return Err(arg_err(op, "packed codes must be u32"));
        };
        let (ps, ss) = (shapes[0], shapes[1]);
        let rank = ps.len();
        let groups_per_row = ss.last().copied().unwrap_or(1);
        let cols = match format.group_size() {
            Some(g) => groups_per_row * g,
            None => ps.last().copied().unwrap_or(0) * 4,
        };
        let rows = numel(&ps[..rank.saturating_sub(1)]);
        let scales = to_f32(op, parts[1])?;
        let biases = match format.has_biases() {
            true => Some(to_f32(op, parts[2])?),
            false => None,
        };
        let fits = words.len() == numel(ps)
            && scales.len() == numel(ss)
            && rows * cols * format.bits() as usize == words.len() * 32
            && scales.len() == rows * groups_per_row
            && biases.as_ref().is_none_or(|b| b.len() == scales.len());
        if !fits {
            return Err(arg_err(
                op,
                format!("packed codes {ps:?} and scales {ss:?} do not describe one weight"),
            ));
        }
        Ok(Weight {
            format,
            dtype: parts[1].dtype(),
            words,
            scales,
            biases,
            batch: ps[..rank.saturating_sub(2)].to_vec(),
            rows,
            rows_per_matrix: if rank >= 2 { ps[rank - 2] } else { rows },
            cols,
            groups_per_row,
            round: rounding(parts[1].dtype()),
        })
    }

    /// Writes the decoded values of row `r`, columns `first_col ..
    /// first_col + out.len()`, into `out`; `first_col` is a multiple of the
    /// group size (for int8, of 4).
    pub fn decode_cols(&self, r: usize, first_col: usize, out: &mut [f32]) {
        match self.format {
            QuantFormat::Affine { .. } => {
                self.decode_with(r, first_col, out, |code, s, b| s * code as f32 + b)
            }
            QuantFormat::Nf4 => self.decode_with(r, first_col, out, |code, s, _| {
                s * NF4_LEVELS[(code & 15) as usize]
            }),
            QuantFormat::Int8 => self.decode_with(r, first_col, out, |code, s, _| {
                s * f32::from(code as u8 as i8)
            }),
        }
        if self.dtype != DType::F32 {
            out.iter_mut().for_each(|v| *v = (self.round)(*v));
        }
    }

    /// [`Weight::decode_cols`] with the format's `value(code, scale,
    /// bias)` inlined: whole words at a time where codes never straddle
    /// them.
    #[inline(always)]
    fn decode_with(
        &self,
        r: usize,
        first_col: usize,
        out: &mut [f32],
        value: impl Fn(u32, f32, f32) -> f32,
    ) {
        let bits = self.format.bits() as usize;
        let mask = ((1u64 << bits) - 1) as u32;
        // Int8's one scale covers the row: one group from column 0.
        let group = self.format.group_size().unwrap_or(self.cols).max(1);
        let row_words = self.cols * bits / 32;
        let words = &self.words[r * row_words..(r + 1) * row_words];
        let scale_at = r * self.groups_per_row;
        let mut col = first_col;
        let mut rest = out;
        while !rest.is_empty() {
            let (values, after) = rest.split_at_mut((group - col % group).min(rest.len()));
            let g = col / group;
            let scale = self.scales[scale_at + g];
            let bias = self.biases.as_ref().map_or(0.0, |b| b[scale_at + g]);
            if 32 % bits == 0 {
                let per_word = 32 / bits;
                for (chunk, &word) in values.chunks_mut(per_word).zip(&words[col / per_word..]) {
                    for (j, v) in chunk.iter_mut().enumerate() {
                        *v = value((word >> (j * bits)) & mask, scale, bias);
                    }
                }
            } else {
                for (c, v) in values.iter_mut().enumerate() {
                    let bit = (col + c) * bits;
                    let (word, shift) = (bit / 32, bit % 32);
                    let pair = u64::from(words[word])
                        | words.get(word + 1).map_or(0, |&w| u64::from(w) << 32);
                    *v = value((pair >> shift) as u32 & mask, scale, bias);
                }
            }
            col += values.len();
            rest = after;
        }
    }
}

/// The left operand of a product, widened to f32.
struct Lhs {
    values: Vec<f32>,
    m: usize,
    k: usize,
}

impl Lhs {
    fn new(op: &str, x: &HostData, shape: &[usize], w: &Weight, transpose: bool) -> Result<Lhs> {
        let rank = shape.len();
        if rank < 2 {
            return Err(arg_err(op, format!("x {shape:?} needs rank >= 2")));
        }
        let (m, k) = (shape[rank - 2], shape[rank - 1]);
        let wk = if transpose { w.cols } else { w.rows_per_matrix };
        if k != wk || x.dtype() != w.dtype {
            return Err(arg_err(
                op,
                format!("x {shape:?} ({}) does not fit the weight", x.dtype()),
            ));
        }
        Ok(Lhs {
            values: to_f32(op, x)?.into_owned(),
            m,
            k,
        })
    }
}

/// Reference `quantize`: one part of the quantization of `w`.
fn quantize_eval(
    op: &str,
    format: QuantFormat,
    part: QuantPart,
    w: &HostData,
    shape: &[usize],
) -> Result<HostData> {
    let values = to_f32(op, w)?;
    let cols = shape.last().copied().unwrap_or(0);
    if cols % format.column_multiple() != 0 || values.len() != numel(shape) {
        return Err(arg_err(
            op,
            format!("{shape:?} does not split into whole {format} groups"),
        ));
    }
    let group = format.group_size().unwrap_or(cols).max(1);
    let bits = format.bits();
    let round = rounding(w.dtype());
    let mut words = vec![0u32; values.len() * bits as usize / 32];
    let groups = values.len() / group;
    let (mut scales, mut biases) = (Vec::with_capacity(groups), Vec::with_capacity(groups));
    for (g, chunk) in values.chunks_exact(group).enumerate() {
        // Codes are computed from the scale and bias as stored (rounded to
        // the dtype), the values dequantize reads back.
        let (scale, bias) = group_params(format, chunk);
        let (scale, bias) = (round(scale), round(bias));
        scales.push(scale);
        biases.push(bias);
        for (c, &v) in chunk.iter().enumerate() {
            let code = encode(format, v, scale, bias);
            let bit = (g * group + c) * bits as usize;
            let (word, shift) = (bit / 32, bit % 32);
            let wide = u64::from(code) << shift;
            words[word] |= wide as u32;
            if shift + bits as usize > 32 {
                words[word + 1] |= (wide >> 32) as u32;
            }
        }
    }
    Ok(match part {
        QuantPart::Packed => HostData::U32(words),
        QuantPart::Scales => from_f32(w.dtype(), scales),
        QuantPart::Biases => from_f32(w.dtype(), biases),
    })
}

/// `(scale, bias)` of one group.
pub fn group_params(format: QuantFormat, group: &[f32]) -> (f32, f32) {
    let absmax = group.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    match format {
        QuantFormat::Affine { bits, .. } => {
            let max = group.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let min = group.iter().copied().fold(f32::INFINITY, f32::min);
            ((max - min) / ((1u32 << bits) - 1) as f32, min)
        }
        QuantFormat::Nf4 => (absmax, 0.0),
        QuantFormat::Int8 => (absmax / 127.0, 0.0),
    }
}

/// The code of `v` under `scale` and `bias`.
pub fn encode(format: QuantFormat, v: f32, scale: f32, bias: f32) -> u32 {
    match format {
        QuantFormat::Affine { bits, .. } => {
            if scale == 0.0 {
                return 0;
            }
            let top = ((1u32 << bits) - 1) as f32;
            ((v - bias) / scale).round_ties_even().clamp(0.0, top) as u32
        }
        QuantFormat::Nf4 => {
            let t = if scale == 0.0 { 0.0 } else { v / scale };
            // The nearest level; on a tie, the lower one.
            let mut best = 0;
            for (i, level) in NF4_LEVELS.iter().enumerate() {
                if (t - level).abs() < (t - NF4_LEVELS[best]).abs() {
                    best = i;
                }
            }
            best as u32
        }
        QuantFormat::Int8 => {
            let q = if scale == 0.0 {
                0.0
            } else {
                (v / scale).round_ties_even().clamp(-127.0, 127.0)
            };
            u32::from(q as i8 as u8)
        }
    }
}

/// A quantized weight: packed codes, scales, biases (affine only) and its
/// format, as [`quantize`] returns it.
#[derive(Clone, Debug)]
pub struct Quantized {
    /// Packed codes, `u32[..., cols·bits/32]`.
    pub packed: Array,
    /// One scale per group, `[..., cols/group]` (`[..., 1]` for int8).
    pub scales: Array,
    /// One bias per group (affine only), shaped like `scales`.
    pub biases: Option<Array>,
    /// The format.
    pub format: QuantFormat,
}

impl Quantized {
    /// The weight's parts as operands: `[packed, scales, biases?]`.
    fn operands(&self) -> Vec<Array> {
        let mut out = vec![self.packed.clone(), self.scales.clone()];
        if self.format.has_biases() {
            out.push(self.biases.clone().unwrap_or_else(|| {
                Array::failed(arg_err(
                    "dequantize",
                    format!("the {} format needs biases", self.format),
                ))
            }));
        }
        out
    }

    /// The dequantized weight.
    #[track_caller]
    pub fn dequantize(&self) -> Array {
        Array::apply(
            Op::Quant(QuantOp {
                kind: QuantKind::Dequantize,
                format: self.format,
            }),
            self.operands(),
        )
    }
}

/// Quantizes `w` along its last axis in `format` (see the module docs).
pub fn quantize(w: &Array, format: QuantFormat) -> Quantized {
    let part = |part| {
        Array::apply(
            Op::Quant(QuantOp {
                kind: QuantKind::Quantize(part),
                format,
            }),
            vec![w.clone()],
        )
    };
    Quantized {
        packed: part(QuantPart::Packed),
        scales: part(QuantPart::Scales),
        biases: format.has_biases().then(|| part(QuantPart::Biases)),
        format,
    }
}

/// The weight of `packed` codes, `scales` and (affine) `biases` in
/// `format`, dequantized.
#[track_caller]
pub fn dequantize(
    packed: &Array,
    scales: &Array,
    biases: Option<&Array>,
    format: QuantFormat,
) -> Array {
    Quantized {
        packed: packed.clone(),
        scales: scales.clone(),
        biases: biases.cloned(),
        format,
    }
    .dequantize()
}

/// `x @ wᵀ` (`transpose`, `w: [..., n, k]`) or `x @ w` (`w: [..., k, n]`)
/// of the dequantized `w`, reading the packed codes directly; batch dims
/// broadcast.
#[track_caller]
pub fn quantized_matmul(x: &Array, w: &Quantized, transpose: bool) -> Array {
    let mut operands = vec![x.clone()];
    operands.extend(w.operands());
    Array::apply(
        Op::Quant(QuantOp {
            kind: QuantKind::Matmul { transpose },
            format: w.format,
        }),
        operands,
    )
}

/// MLX's `gather_qmm`: output batch entry `b` is `x[lhs[b]] @ w[rhs[b]]ᵀ`
/// (or without the transpose), where `lhs_indices` index `x`'s flattened
/// batch dims, `rhs_indices` `w`'s, and the two broadcast together: the
/// output is `broadcast(lhs, rhs).shape + [m, n]`. An index out of range is
/// an `Err` when the product runs.
#[track_caller]
pub fn gather_qmm(
    x: &Array,
    w: &Quantized,
    lhs_indices: &Array,
    rhs_indices: &Array,
    transpose: bool,
) -> Array {
    let mut operands = vec![x.clone()];
    operands.extend(w.operands());
    operands.extend([lhs_indices.clone(), rhs_indices.clone()]);
    Array::apply(
        Op::Quant(QuantOp {
            kind: QuantKind::GatherMatmul { transpose },
            format: w.format,
        }),
        operands,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::qmm;
    use crate::ops::strided::proptest_config;
    use crate::shape::Symbol;
    use proptest::prelude::*;

    fn f32s(a: &Array) -> Vec<f32> {
        a.data().expect("evaluates").to_vec()
    }

    fn matrix(values: Vec<f32>, shape: &[usize]) -> Array {
        Array::from_vec(values, shape).expect("sized")
    }

    /// Deterministic values in [-scale, scale).
    fn wavy(n: usize, seed: u32, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32 ^ seed)
                    .wrapping_mul(2_654_435_761)
                    .rotate_left(13);
                (h % 20_001) as f32 / 10_000.0 * scale - scale
            })
            .collect()
    }

    #[test]
    fn four_bit_codes_pack_eight_per_word_lowest_bits_first() {
        let w = matrix((0..32).map(|j| (j % 16) as f32).collect(), &[1, 32]);
        let q = quantize(&w, QuantFormat::affine(4, 32));
        assert_eq!(
            *q.packed.data().unwrap(),
            HostData::U32(vec![0x7654_3210, 0xfedc_ba98, 0x7654_3210, 0xfedc_ba98])
        );
        assert_eq!(f32s(&q.scales), vec![1.0]);
        assert_eq!(f32s(q.biases.as_ref().unwrap()), vec![0.0]);
    }

    #[test]
    fn three_bit_codes_form_one_bit_stream_across_words() {
        let codes: Vec<u32> = (0..32).map(|j| (j * 5 % 8) as u32).collect();
        let mut w: Vec<f32> = codes.iter().map(|&c| c as f32).collect();
        // min 0 and max 7 over the group make scale 1, bias 0.
        w[31] = 7.0;
        let q = quantize(&matrix(w.clone(), &[1, 32]), QuantFormat::affine(3, 32));
        let HostData::U32(words) = &*q.packed.data().unwrap() else {
            panic!("packed codes are u32")
        };
        assert_eq!(words.len(), 3);
        for (j, &v) in w.iter().enumerate() {
            let bits: u32 = (0..3)
                .map(|b| {
                    let at = 3 * j + b;
                    ((words[at / 32] >> (at % 32)) & 1) << b
                })
                .sum();
            assert_eq!(bits, v as u32, "code {j}");
        }
        // Code 10 straddles words 0 and 1: its low two bits end word 0.
        assert_eq!(words[0] >> 30, (w[10] as u32) & 3);
    }

    #[test]
    fn nf4_decodes_exactly_to_its_levels() {
        let levels: Vec<f32> = (0..64).map(|i| NF4_LEVELS[i % 16] * 2.5).collect();
        let q = quantize(&matrix(levels.clone(), &[1, 64]), QuantFormat::Nf4);
        assert_eq!(f32s(&q.scales), vec![2.5]);
        assert_eq!(f32s(&q.dequantize()), levels);
        let unit = dequantize(
            &q.packed,
            &Array::ones(&[1, 1], DType::F32),
            None,
            QuantFormat::Nf4,
        );
        let want: Vec<f32> = (0..64).map(|i| NF4_LEVELS[i % 16]).collect();
        assert_eq!(f32s(&unit), want);
    }

    #[test]
    fn nf4_picks_the_nearest_level() {
        let mut w = wavy(128, 7, 3.0);
        w[0] = 3.0;
        w[64] = -3.0;
        let q = quantize(&matrix(w.clone(), &[2, 64]), QuantFormat::Nf4);
        let got = f32s(&q.dequantize());
        for (i, (&v, &d)) in w.iter().zip(&got).enumerate() {
            let best = NF4_LEVELS
                .iter()
                .map(|l| (v / 3.0 - l).abs())
                .fold(f32::INFINITY, f32::min);
            assert!(
                (v / 3.0 - d / 3.0).abs() <= best + 1e-6,
                "element {i}: {v} -> {d}"
            );
        }
    }

    #[test]
    fn int8_is_symmetric_per_row() {
        let w = matrix(vec![1.27, -0.5, 0.0, 0.01, -2.54, 1.0, 2.0, 0.3], &[2, 4]);
        let q = quantize(&w, QuantFormat::Int8);
        assert!(q.biases.is_none());
        assert_eq!(q.scales.dims(), Some(vec![2, 1]));
        assert_eq!(f32s(&q.scales), vec![0.01, 0.02]);
        let HostData::U32(words) = &*q.packed.data().unwrap() else {
            panic!("u32")
        };
        // 127, -50, 0, 1 as bytes, lowest first; then -127, 50, 100, 15.
        assert_eq!(words[0], 0x0100_ce7f);
        assert_eq!(words[1], 0x0f64_3281);
    }

    proptest! {
        #![proptest_config(proptest_config())]

        #[test]
        fn affine_round_trip_is_within_half_a_scale(
            bits in prop::sample::select(AFFINE_BITS.to_vec()),
            group in prop::sample::select(AFFINE_GROUP_SIZES.to_vec()),
            rows in 1usize..4,
            groups in 1usize..3,
            seed in any::<u32>(),
            spread in 0.01f32..100.0,
        ) {
            let cols = group * groups;
            let w = wavy(rows * cols, seed, spread);
            let q = quantize(&matrix(w.clone(), &[rows, cols]), QuantFormat::affine(bits, group));
            prop_assert_eq!(q.packed.dims(), Some(vec![rows, cols * bits as usize / 32]));
            let (back, scales) = (f32s(&q.dequantize()), f32s(&q.scales));
            for (i, (&v, &d)) in w.iter().zip(&back).enumerate() {
                let half = scales[i / group] / 2.0;
                prop_assert!((v - d).abs() <= half * (1.0 + 1e-5) + spread * 1e-6,
                    "element {}: {} -> {} (scale {})", i, v, d, scales[i / group]);
            }
        }

        #[test]
        fn int8_and_nf4_round_trips_are_bounded(rows in 1usize..4, seed in any::<u32>()) {
            let w = wavy(rows * 64, seed, 2.0);
            let q = quantize(&matrix(w.clone(), &[rows, 64]), QuantFormat::Int8);
            let (back, scales) = (f32s(&q.dequantize()), f32s(&q.scales));
            for (i, (&v, &d)) in w.iter().zip(&back).enumerate() {
                // q·scale rounds to half an ulp of the value.
                prop_assert!((v - d).abs() <= scales[i / 64] * 0.5 * (1.0 + 1e-5) + v.abs() * 1e-6);
            }
            let q = quantize(&matrix(w.clone(), &[rows, 64]), QuantFormat::Nf4);
            let (back, scales) = (f32s(&q.dequantize()), f32s(&q.scales));
            // The widest gap between NF4 levels is −0.6962 − (−1).
            for (i, (&v, &d)) in w.iter().zip(&back).enumerate() {
                prop_assert!((v - d).abs() <= scales[i / 64] * 0.1520 + 1e-6);
            }
        }

        #[test]
        fn quantized_matmul_is_within_the_per_k_bound_of_an_f64_product(
            m in 0usize..7,
            n in 1usize..40,
            // A few groups (all in the kernels' tails), or enough for a
            // full run of 16 code units and a tail.
            groups in prop_oneof![1usize..4, 16usize..18],
            batch in 1usize..3,
            transpose in any::<bool>(),
            format in prop::sample::select(vec![
                QuantFormat::affine(2, 32), QuantFormat::affine(2, 64),
                QuantFormat::affine(3, 32), QuantFormat::affine(3, 128),
                QuantFormat::affine(4, 32), QuantFormat::affine(4, 64),
                QuantFormat::affine(5, 32), QuantFormat::affine(5, 64),
                QuantFormat::affine(6, 64), QuantFormat::affine(8, 128),
                QuantFormat::Nf4, QuantFormat::Int8,
            ]),
            seed in any::<u32>(),
            // The widest vector unit the kernels may take, so that each
            // unit's kernels meet the draws (a CPU without it runs the
            // widest it has).
            isa in prop::sample::select(qmm::ISAS.to_vec()),
        ) {
            // Int8's one group a row: 24 columns a draw, so that some rows
            // are a whole number of the widening kernel's 32-code steps and
            // some are not.
            let cols = groups * format.group_size().unwrap_or(24);
            let rows = if transpose { n } else { 5 };
            let w = matrix(wavy(batch * rows * cols, seed, 1.0), &[batch, rows, cols]);
            let q = quantize(&w, format);
            let k = if transpose { cols } else { rows };
            let x = matrix(wavy(m * k, seed ^ 1, 1.0), &[1, m, k]);
            let deq = decoded(&q, transpose);
            let (mut dims, mut got) = (None, Vec::new());
            with_widest_isa(isa, || {
                let product = quantized_matmul(&x, &q, transpose);
                (dims, got) = (product.dims(), f32s(&product));
            });
            let n_out = if transpose { n } else { cols };
            prop_assert_eq!(dims, Some(vec![batch, m, n_out]));
            let checked = within_bound(&f32s(&x), &deq, &got, (batch, m, k));
            prop_assert!(checked.is_ok(), "{:?}", checked);
        }

        #[test]
        fn masking_codes_in_place_gives_the_shifting_kernels_bits(
            format in prop::sample::select(vec![
                QuantFormat::affine(2, 32), QuantFormat::affine(2, 64),
                QuantFormat::affine(2, 128), QuantFormat::affine(4, 32),
                QuantFormat::affine(4, 64), QuantFormat::affine(4, 128),
            ]),
            // Groups that fill blocks of eight words, and groups after them.
            groups in 1usize..6,
            seed in any::<u32>(),
            // Rows of tiny values, where a value that lost bits in scaling
            // would show in the output, some below the range that scaling
            // keeps exact and some subnormal.
            scale in prop::sample::select(vec![1.0f32, 1e-3, 1e-30, 1e-36, 1e-40, 1e30]),
            // A value below that range, and a zero, each somewhere or
            // nowhere.
            tiny in prop::option::of((any::<prop::sample::Index>(), -1e-34f32..1e-34)),
            zero in prop::option::of(any::<prop::sample::Index>()),
        ) {
            // The portable kernels (wasm32's) with the row's layout for codes
            // masked in place, against the same kernels shifting each code
            // down: every product is the same real number `c·x`, so every
            // output has the same bits, and a row with a value too small to
            // scale exactly keeps the shifting kernel.
            let k = groups * format.group_size().unwrap_or(32);
            let n = 3;
            let q = quantize(&matrix(wavy(n * k, seed, 1.0), &[n, k]), format);
            let (parts, shapes) = weight_parts(&q);
            let w = weight(format, &parts, &shapes);
            let mut x = wavy(k, seed ^ 1, scale);
            if let Some((at, value)) = tiny {
                x[at.index(k)] = value;
            }
            if let Some(at) = zero {
                x[at.index(k)] = 0.0;
            }
            let in_place = qmm::PermutedRow::new(&x, format, qmm::Isa::Portable);
            let smallest = 2f32.powi(3 * format.bits() as i32 - 126);
            let scalable = x.iter().all(|v| *v == 0.0 || v.abs() >= smallest);
            prop_assert_eq!(in_place.masks_codes_in_place(), scalable);
            let shifting = in_place.shifting_codes_only();
            for row in 0..n {
                let masked = qmm::fused_dot(qmm::Isa::Portable, &w, row, &in_place);
                let shifted = qmm::fused_dot(qmm::Isa::Portable, &w, row, &shifting);
                prop_assert_eq!(masked.to_bits(), shifted.to_bits(), "row {}", row);
            }
        }
    }

    #[test]
    fn every_format_is_within_the_bound_through_full_register_runs_and_threads() {
        // k = 1024 fills whole runs of 16 code units for every width, and
        // 1088 output columns split across threads.
        let (k, n) = (1024, 1088);
        let formats = AFFINE_BITS
            .iter()
            .map(|&bits| QuantFormat::affine(bits, 64))
            .chain([QuantFormat::Nf4, QuantFormat::Int8]);
        for format in formats {
            for (m, transpose) in [(1, true), (2, true), (5, true), (1, false), (5, false)] {
                let shape = if transpose { [1, n, k] } else { [1, k, n] };
                let q = quantize(&matrix(wavy(n * k, 3, 1.0), &shape), format);
                let x = matrix(wavy(m * k, 4, 1.0), &[1, m, k]);
                let deq = decoded(&q, transpose);
                let got = quantized_matmul(&x, &q, transpose);
                let checked = within_bound(&f32s(&x), &deq, &f32s(&got), (1, m, k));
                assert!(
                    checked.is_ok(),
                    "{format} m={m} transpose={transpose}: {checked:?}"
                );
            }
        }
    }

    #[test]
    fn decoded_panels_cover_ragged_blocks_and_depths_within_the_bound() {
        // Under the split threshold one band holds every output column, so
        // the panels of `x @ wᵀ` end in a ragged block of weight rows (600
        // = 9·64 + 24) and a short run of columns (320 = 256 + 64), and
        // those of `x @ w` in a ragged block of columns (576 = 2·256 + 64)
        // and of rows of w.
        let k = 320;
        let formats = [
            QuantFormat::affine(4, 64),
            QuantFormat::affine(3, 32),
            QuantFormat::Nf4,
            QuantFormat::Int8,
        ];
        for format in formats {
            for (transpose, n) in [(true, 600), (false, 576)] {
                let shape = if transpose { [1, n, k] } else { [1, k, n] };
                let q = quantize(&matrix(wavy(n * k, 8, 1.0), &shape), format);
                let deq = decoded(&q, transpose);
                for m in [4, 5] {
                    let x = matrix(wavy(m * k, 9, 1.0), &[1, m, k]);
                    let got = quantized_matmul(&x, &q, transpose);
                    let checked = within_bound(&f32s(&x), &deq, &f32s(&got), (1, m, k));
                    assert!(
                        checked.is_ok(),
                        "{format} m={m} transpose={transpose}: {checked:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_format_and_group_size_is_within_the_bound_on_every_vector_unit() {
        // Each group size gives the in-register kernels a different word
        // layout: groups of two or four words (2-bit groups of 32 and 64,
        // 4-bit groups of 32) share a block of eight words (on AVX2, 2-bit
        // groups of 32 run two groups a vector, and k = 800 an odd one
        // after them; 4-bit groups of 32 one group a vector, its words in
        // both halves), larger ones fill blocks, and 3-, 5- and 6-bit
        // codes run in units of `bits` words (k = 768: one full run of 16
        // units, then a tail). One group more leaves groups after the last
        // full block (one code at a time) and a shorter tail.
        let n = 40;
        let formats = AFFINE_BITS
            .iter()
            .flat_map(|&bits| AFFINE_GROUP_SIZES.map(|group| QuantFormat::affine(bits, group)))
            .chain([QuantFormat::Nf4, QuantFormat::Int8]);
        // Every kernel this build has (the portable ones are what a CPU
        // without AVX-512 or AVX2 runs).
        for &isa in qmm::ISAS {
            with_widest_isa(isa, || {
                for format in formats.clone() {
                    for k in [768, 768 + format.group_size().unwrap_or(64)] {
                        let q = quantize(&matrix(wavy(n * k, 5, 1.0), &[1, n, k]), format);
                        let deq = decoded(&q, true);
                        for m in [1, 3, 5] {
                            let x = matrix(wavy(m * k, 6, 1.0), &[1, m, k]);
                            let got = quantized_matmul(&x, &q, true);
                            let checked = within_bound(&f32s(&x), &deq, &f32s(&got), (1, m, k));
                            assert!(checked.is_ok(), "{format} k={k} m={m} {isa:?}: {checked:?}");
                        }
                    }
                }
            });
        }
    }

    #[test]
    fn four_bit_rows_decode_bit_identically_on_every_isa() {
        // The table kernels build each group's values as the reference
        // does (a product, then a sum), so panels hold the same weights;
        // a panel decodes a run of whole groups, here every one from
        // each group boundary to the row's end and one group alone.
        let (rows, cols) = (3, 256);
        for format in AFFINE_GROUP_SIZES
            .map(|group| QuantFormat::affine(4, group))
            .into_iter()
            .chain([QuantFormat::Nf4])
        {
            let q = quantize(&matrix(wavy(rows * cols, 7, 1.5), &[rows, cols]), format);
            let (parts, shapes) = weight_parts(&q);
            let w = weight(format, &parts, &shapes);
            for row in 0..rows {
                let mut reference = vec![0.0f32; cols];
                w.decode_cols(row, 0, &mut reference);
                let group = format.group_size().expect("grouped");
                let runs = (0..cols)
                    .step_by(group)
                    .flat_map(|first| [first..cols, first..first + group]);
                for (&isa, run) in qmm::ISAS
                    .iter()
                    .flat_map(|isa| runs.clone().map(move |r| (isa, r)))
                {
                    let mut decoded = vec![f32::NAN; run.len()];
                    qmm::decode_row(isa, &w, row, run.start, &mut decoded);
                    let same = decoded
                        .iter()
                        .zip(&reference[run.clone()])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{format} row {row} columns {run:?} {isa:?}: {decoded:?} vs {:?}",
                        &reference[run.clone()]
                    );
                }
            }
        }
    }

    #[test]
    fn the_relaxed_row_dot_is_within_the_bound_for_every_format_it_takes() {
        // The relaxed kernel module's `affine_codes_dot` (natively on array lanes
        // with fused multiply-adds, as the browser's `relaxed_madd` on a
        // processor with FMA) on Kiln's permuted x and weight rows. k = 768
        // holds whole groups of every size.
        let (k, n) = (768, 24);
        let x = wavy(k, 6, 1.0);
        let formats = AFFINE_BITS
            .iter()
            .flat_map(|&bits| AFFINE_GROUP_SIZES.map(|group| QuantFormat::affine(bits, group)))
            .chain([QuantFormat::Nf4, QuantFormat::Int8]);
        let mut taken = Vec::new();
        for format in formats {
            let q = quantize(&matrix(wavy(n * k, 5, 1.0), &[n, k]), format);
            let (parts, shapes) = weight_parts(&q);
            let w = weight(format, &parts, &shapes);
            let xp = qmm::PermutedRow::new(&x, format, qmm::Isa::Portable);
            let got = (0..n)
                .map(|row| {
                    qmm::relaxed_affine_dot(kiln_relaxed_kernel::affine_codes_dot, &w, row, &xp)
                })
                .collect::<Option<Vec<f32>>>();
            let Some(got) = got else {
                continue;
            };
            taken.push(format.to_string());
            let checked = within_bound(&x, &decoded(&q, true), &got, (1, 1, k));
            assert!(checked.is_ok(), "{format}: {checked:?}");
        }
        // Groups of a multiple of four words: all but 2-bit groups of 32.
        let expected = [
            (2, 64),
            (2, 128),
            (4, 32),
            (4, 64),
            (4, 128),
            (8, 32),
            (8, 64),
            (8, 128),
        ]
        .map(|(bits, group)| QuantFormat::affine(bits, group).to_string());
        assert_eq!(taken, expected);
    }

    /// The parts of `q` as host data, and their shapes.
    fn weight_parts(q: &Quantized) -> (Vec<std::sync::Arc<HostData>>, Vec<Vec<usize>>) {
        let arrays = [&q.packed, &q.scales].into_iter().chain(q.biases.as_ref());
        arrays
            .map(|a| {
                let data = a.data().expect("evaluates");
                (data, a.shape().as_known().expect("known"))
            })
            .unzip()
    }

    /// The weight of [`weight_parts`].
    fn weight<'a>(
        format: QuantFormat,
        parts: &'a [std::sync::Arc<HostData>],
        shapes: &[Vec<usize>],
    ) -> Weight<'a> {
        Weight::new(
            "test",
            format,
            &parts.iter().map(|p| &**p).collect::<Vec<_>>(),
            &shapes.iter().map(Vec::as_slice).collect::<Vec<_>>(),
        )
        .expect("one weight")
    }

    /// Runs `f` with the kernels no wider than `isa`, one test at a time
    /// (the cap is global).
    fn with_widest_isa(isa: qmm::Isa, f: impl FnOnce()) {
        static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _held = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        qmm::WIDEST_ISA.store(isa as u8, std::sync::atomic::Ordering::Relaxed);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        qmm::WIDEST_ISA.store(u8::MAX, std::sync::atomic::Ordering::Relaxed);
        if let Err(panic) = result {
            std::panic::resume_unwind(panic);
        }
    }

    /// The decoded weights of `q` and the magnitudes the stated bound sums
    /// (`|s·c| + |b|` affine, `|s·level|` otherwise), each `[batch, k, n]`
    /// (`q`'s matrices transposed where `transpose`). The magnitudes are
    /// `q` decoded with `|s|` and `|b|` (affine codes are not negative),
    /// then made positive.
    fn decoded(q: &Quantized, transpose: bool) -> [Vec<f32>; 2] {
        let magnitudes = Quantized {
            packed: q.packed.clone(),
            scales: q.scales.abs(),
            biases: q.biases.as_ref().map(Array::abs),
            format: q.format,
        };
        [q.dequantize(), magnitudes.dequantize().abs()]
            .map(|w| f32s(&if transpose { w.swap_axes(-1, -2) } else { w }))
    }

    /// `got` (`[batch, m, n]`) against the f64 product of `x` (`[m, k]`)
    /// and each decoded `w` (`[batch, k, n]`, with its magnitudes: see
    /// [`decoded`]): within the stated bound,
    /// `error_bound(k + 4, Σ (|s·c| + |b|)·|x|)`, its k widened by two
    /// more for the magnitudes' own rounding.
    fn within_bound(
        x: &[f32],
        [w, magnitudes]: &[Vec<f32>; 2],
        got: &[f32],
        (batch, m, k): (usize, usize, usize),
    ) -> std::result::Result<(), String> {
        let n = got.len() / (batch * m).max(1);
        for b in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let (mut exact, mut abs_sum) = (0.0f64, 0.0f64);
                    for p in 0..k {
                        let (xv, at) = (f64::from(x[i * k + p]), (b * k + p) * n + j);
                        exact += xv * f64::from(w[at]);
                        abs_sum += xv.abs() * f64::from(magnitudes[at]);
                    }
                    let bound = crate::ops::matmul::error_bound(k + 6, abs_sum);
                    let g = f64::from(got[(b * m + i) * n + j]);
                    if (g - exact).abs() > bound {
                        return Err(format!("({b}, {i}, {j}): {g} vs {exact}, bound {bound}"));
                    }
                }
            }
        }
        Ok(())
    }

    fn close(a: &Array, b: &Array) {
        let (a, b) = (f32s(a), f32s(b));
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                "element {i}: {x} vs {y}"
            );
        }
    }

    #[test]
    fn gradients_through_quantized_matmul_equal_those_through_the_dequantized_weight() {
        type Args = (Array, Array, Array, Array);
        for (format, transpose) in [
            (QuantFormat::affine(4, 32), true),
            (QuantFormat::affine(3, 32), false),
            (QuantFormat::Nf4, false),
            (QuantFormat::Int8, true),
        ] {
            let w = matrix(wavy(2 * 6 * 64, 21, 1.0), &[2, 6, 64]);
            let q = quantize(&w, format);
            let k = if transpose { 64 } else { 6 };
            let x = matrix(wavy(3 * k, 22, 1.0), &[3, k]);
            let biases = q.biases.clone().unwrap_or_else(|| q.scales.clone());
            let args: Args = (x, q.packed.clone(), q.scales.clone(), biases);
            let weight = move |(_, packed, scales, biases): &Args| Quantized {
                packed: packed.clone(),
                scales: scales.clone(),
                biases: format.has_biases().then(|| biases.clone()),
                format,
            };
            let loss_q =
                move |a: Args| (quantized_matmul(&a.0, &weight(&a), transpose).sin()).sum_all();
            let loss_d = move |a: Args| {
                let w = weight(&a).dequantize();
                let w = if transpose { w.swap_axes(-1, -2) } else { w };
                a.0.matmul(&w).sin().sum_all()
            };
            let wrt = ["args[0]", "args[2]", "args[3]"];
            let got = crate::grad(loss_q).wrt(wrt).call(&args).unwrap();
            let want = crate::grad(loss_d).wrt(wrt).call(&args).unwrap();
            close(&got.0, &want.0);
            close(&got.2, &want.2);
            close(&got.3, &want.3);
            assert!(
                f32s(&got.2).iter().any(|&v| v != 0.0),
                "{format}: scales get a gradient"
            );
        }
    }

    #[test]
    fn gradients_through_gather_qmm_equal_those_through_take_and_matmul() {
        type Args = (Array, Array, Array, Array);
        let format = QuantFormat::affine(4, 32);
        let w = matrix(wavy(3 * 5 * 64, 31, 1.0), &[3, 5, 64]);
        let q = quantize(&w, format);
        let x = matrix(wavy(2 * 2 * 64, 32, 1.0), &[2, 2, 64]);
        let args: Args = (
            x,
            q.packed.clone(),
            q.scales.clone(),
            q.biases.clone().unwrap(),
        );
        let lhs = Array::from_vec(vec![1u32, 0, 1], &[3, 1]).unwrap();
        let rhs = Array::from_vec(vec![2u32, 2], &[1, 2]).unwrap();
        let weight = |a: &Args| Quantized {
            packed: a.1.clone(),
            scales: a.2.clone(),
            biases: Some(a.3.clone()),
            format,
        };
        let (l, r) = (lhs.clone(), rhs.clone());
        let loss_q = move |a: Args| gather_qmm(&a.0, &weight(&a), &l, &r, true).sin().sum_all();
        let loss_d = move |a: Args| {
            let (l, r) = (
                lhs.broadcast_to([3, 2]).reshape(&[-1]),
                rhs.broadcast_to([3, 2]).reshape(&[-1]),
            );
            let w = weight(&a).dequantize().take(&r, 0).swap_axes(-1, -2);
            a.0.take(&l, 0).matmul(&w).sin().sum_all()
        };
        let wrt = ["args[0]", "args[2]", "args[3]"];
        let got = crate::grad(loss_q).wrt(wrt).call(&args).unwrap();
        let want = crate::grad(loss_d).wrt(wrt).call(&args).unwrap();
        close(&got.0, &want.0);
        close(&got.2, &want.2);
        close(&got.3, &want.3);
    }

    #[test]
    fn gather_qmm_matches_take_then_matmul_with_broadcast_indices() {
        let format = QuantFormat::affine(4, 32);
        let w = matrix(wavy(3 * 4 * 32, 11, 1.0), &[3, 4, 32]);
        let q = quantize(&w, format);
        let x = matrix(wavy(2 * 2 * 32, 12, 1.0), &[2, 2, 32]);
        let lhs = Array::from_vec(vec![1u32, 0], &[2, 1]).unwrap();
        let rhs = Array::from_vec(vec![2u32, 0, 1], &[1, 3]).unwrap();
        let got = gather_qmm(&x, &q, &lhs, &rhs, true);
        assert_eq!(got.dims(), Some(vec![2, 3, 2, 4]));
        // Each matrix's decoded `[32, 4]` weight, transposed.
        let deq = decoded(&q, true);
        let got = f32s(&got);
        for (a, &l) in [1usize, 0].iter().enumerate() {
            for (b, &r) in [2usize, 0, 1].iter().enumerate() {
                let xm = x
                    .slice_axis(0, l as i64, Some(l as i64 + 1), 1)
                    .squeeze(&[0]);
                let wm = deq.each_ref().map(|d| d[r * 128..(r + 1) * 128].to_vec());
                let at = (a * 3 + b) * 8;
                let checked = within_bound(&f32s(&xm), &wm, &got[at..at + 8], (1, 2, 32));
                assert!(checked.is_ok(), "batch ({a}, {b}): {checked:?}");
            }
        }
        let bad = Array::from_vec(vec![3u32], &[1]).unwrap();
        let err = gather_qmm(&x, &q, &lhs, &bad, true).data().unwrap_err();
        assert!(
            err.to_string()
                .contains("rhs_indices holds 3, out of range for 3 matrices"),
            "{err}"
        );
    }

    #[test]
    fn bad_formats_and_shapes_are_errors_naming_the_problem() {
        let w = Array::zeros(&[2, 64], DType::F32);
        let err = quantize(&w, QuantFormat::affine(7, 64))
            .packed
            .data()
            .unwrap_err();
        assert!(
            err.to_string().contains("bits [2, 3, 4, 5, 6, 8], got 7"),
            "{err}"
        );
        let err = quantize(&w, QuantFormat::affine(4, 48))
            .scales
            .data()
            .unwrap_err();
        assert!(err.to_string().contains("got 48"), "{err}");
        let err = quantize(
            &Array::zeros(&[2, 40], DType::F32),
            QuantFormat::affine(4, 32),
        )
        .packed
        .data()
        .unwrap_err();
        assert!(
            err.to_string().contains("40 is not a multiple of 32"),
            "{err}"
        );
        let q = quantize(&w, QuantFormat::affine(4, 32));
        let x = Array::zeros(&[3, 32], DType::F32);
        let err = quantized_matmul(&x, &q, true).data().unwrap_err();
        assert!(
            err.to_string()
                .contains("x has k=32 but the weight (transpose=true) has 64"),
            "{err}"
        );
        let err = quantized_matmul(&x.cast(DType::F16), &q, false)
            .data()
            .unwrap_err();
        assert!(
            err.to_string().contains("x is f16 but the scales are f32"),
            "{err}"
        );
        let err = dequantize(&q.packed, &q.scales, None, QuantFormat::affine(4, 32))
            .data()
            .unwrap_err();
        assert!(err.to_string().contains("needs biases"), "{err}");
        let int8 = quantize(&w, QuantFormat::Int8);
        assert!(int8.biases.is_none());
        let part = Op::Quant(QuantOp {
            kind: QuantKind::Quantize(QuantPart::Biases),
            format: QuantFormat::Int8,
        });
        let err = Array::apply(part, vec![w]).data().unwrap_err();
        assert!(
            err.to_string().contains("int8 format has no biases"),
            "{err}"
        );
    }

    #[test]
    fn direct_evaluation_of_unfitting_shapes_is_an_error_not_a_panic() {
        let format = QuantFormat::affine(4, 32);
        let op = |kind| Op::Quant(QuantOp { kind, format });
        let w = HostData::F32(vec![0.5; 40]);
        let err = op(QuantKind::Quantize(QuantPart::Packed))
            .eval(&[&w], &[&[1, 40]], &[1, 5])
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("whole affine(bits=4, group_size=32) groups"),
            "{err}"
        );
        let (packed, scales) = (HostData::U32(vec![0; 4]), HostData::F32(vec![1.0]));
        let x = HostData::F32(vec![1.0; 32]);
        let err = op(QuantKind::Matmul { transpose: true })
            .eval(
                &[&x, &packed, &scales, &scales],
                &[&[32], &[1, 4], &[1, 1], &[1, 1]],
                &[1],
            )
            .unwrap_err();
        assert!(err.to_string().contains("needs rank >= 2"), "{err}");
        let err = op(QuantKind::Dequantize)
            .eval(
                &[&packed, &scales, &scales],
                &[&[1, 3], &[1, 1], &[1, 1]],
                &[1, 32],
            )
            .unwrap_err();
        assert!(
            err.to_string().contains("do not describe one weight"),
            "{err}"
        );
    }

    #[test]
    fn symbolic_rows_and_batches_pass_through_and_columns_are_guarded() {
        let s = |i| Dim::symbol(Symbol(i));
        let format = QuantFormat::affine(4, 64);
        let op = |kind| QuantOp { kind, format };
        let x = Aval::new(Shape(vec![s(0), s(1), Dim::Known(128)]), DType::F32);
        let packed = Aval::new(Shape(vec![s(2), Dim::Known(16)]), DType::U32);
        let scales = Aval::new(Shape(vec![s(2), Dim::Known(2)]), DType::F32);
        let mut cx = ShapeCx::new();
        let out = op(QuantKind::Matmul { transpose: true })
            .shape_rule(&[&x, &packed, &scales, &scales], &mut cx)
            .unwrap();
        assert_eq!(out, Aval::new(Shape(vec![s(0), s(1), s(2)]), DType::F32));
        assert!(cx.guards.is_empty(), "{:?}", cx.guards);
        // Symbolic columns: the packed length follows, the group is a guard.
        let w = Aval::new(Shape(vec![s(2), s(3)]), DType::F32);
        let mut cx = ShapeCx::new();
        let packed = op(QuantKind::Quantize(QuantPart::Packed))
            .shape_rule(&[&w], &mut cx)
            .unwrap();
        assert_eq!(packed.shape.dims()[1].to_string(), "8*(s3)/64");
        assert_eq!(cx.guards.len(), 1);
        let lhs = Aval::new(Shape(vec![s(4), Dim::Known(1)]), DType::U32);
        let rhs = Aval::new(Shape(vec![s(5)]), DType::U32);
        let gathered = op(QuantKind::GatherMatmul { transpose: false })
            .shape_rule(
                &[
                    &Aval::new(Shape(vec![s(0), s(1), Dim::Known(7)]), DType::F32),
                    &Aval::new(Shape(vec![s(2), Dim::Known(7), Dim::Known(8)]), DType::U32),
                    &Aval::new(Shape(vec![s(2), Dim::Known(7), Dim::Known(1)]), DType::F32),
                    &Aval::new(Shape(vec![s(2), Dim::Known(7), Dim::Known(1)]), DType::F32),
                    &lhs,
                    &rhs,
                ],
                &mut ShapeCx::new(),
            )
            .unwrap();
        assert_eq!(
            gathered.shape,
            Shape(vec![s(4), s(5), s(1), Dim::Known(64)])
        );
    }

    use crate::compile::rule_checks as rules;

    #[test]
    fn quantized_matmul_jvp_is_the_dequantized_products() {
        // Linear in x and in the scales (the codes stay), so the central
        // difference is exact up to rounding.
        let format = QuantFormat::affine(4, 32);
        let q = quantize(&rules::normal(31, &[4, 32]), format);
        let (packed, biases) = (q.packed.clone(), q.biases.clone());
        let f = move |x: Vec<Array>| {
            let w = Quantized {
                packed: packed.clone(),
                scales: x[1].clone(),
                biases: biases.clone(),
                format,
            };
            quantized_matmul(&x[0], &w, true)
        };
        let xs = [rules::normal(32, &[2, 32]), q.scales.clone()];
        rules::assert_jvp_matches_central_difference("quantized_matmul", f, &xs);
    }

    #[test]
    fn quantize_scales_have_no_jvp_and_say_so() {
        let w = rules::normal(33, &[2, 32]);
        let result = crate::jvp(
            |w: Array| quantize(&w, QuantFormat::affine(4, 32)).scales,
            &w,
            &w,
        );
        rules::assert_err_names(result, "quantize", "no derivative");
    }

    #[test]
    fn gather_qmm_batches_x_and_indices_without_a_loop() {
        let format = QuantFormat::affine(4, 32);
        let q = quantize(&rules::normal(34, &[3, 4, 32]), format);
        let f = move |x: Vec<Array>| {
            let lhs = x[1].cast(DType::U32);
            gather_qmm(&x[0], &q, &lhs, &lhs.clone().reshape(&[2, 1]), true)
        };
        let xs = rules::normal(35, &[2, 3, 1, 32]);
        let idx = matrix(vec![0.0, 2.0, 1.0, 1.0], &[2, 2]);
        let report = rules::assert_batches_like_stacking("gather_qmm", f, &[xs, idx]);
        assert!(
            report.vmap_fallbacks.is_empty(),
            "{:?}",
            report.vmap_fallbacks
        );
    }
}
