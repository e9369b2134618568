//! Kernels of the quantization ops (`kiln::ops::quant`): quantize,
//! dequantize, and the quantized matmul and gather_qmm, which read the
//! packed codes directly. Float results are written as f32 words (packed
//! afterwards for f16 and bf16, see [`crate::stores_f32`]).

use crate::abi::{bindings, status_binding};
use crate::element::{buffer_type, load_fn};
use crate::source::{param, prelude};
use crate::spec::{checked, KernelError, KernelSpec, Target, View};
use kiln::{DType, QuantFormat, QuantPart};
use std::fmt::Write;

const COMMON: &str = include_str!("wgsl/quant_common.wgsl");
const CODE_AT: &str = include_str!("wgsl/quant_code_at.wgsl");
const DEQUANTIZE: &str = include_str!("wgsl/dequantize.wgsl");
const QUANTIZE: &str = include_str!("wgsl/quantize.wgsl");
const QMM: &str = include_str!("wgsl/qmm.wgsl");
const QMM_TILED: &str = include_str!("wgsl/qmm_tiled.wgsl");
const QMM_TILE_CODES: &str = include_str!("wgsl/qmm_tile_codes.wgsl");
const QMM_TILE_WORDS: &str = include_str!("wgsl/qmm_tile_words.wgsl");

/// Rows of x from which a product (`x @ wᵀ` or `x @ w`, quantized_matmul or
/// gather_qmm) runs on the tiled kernel (`qmm_tiled.wgsl`):
/// it decodes each code once per workgroup for 64 rows, so it pays once
/// several rows share a tile; below, a matrix times a few vectors streams
/// the codes through `qmm.wgsl`.
pub const QMM_TILED_MIN_ROWS: usize = 8;

/// ROWS of `qmm.wgsl` and its block types: four rows share each decoded
/// weight, except for products of fewer rows (a matrix times a vector),
/// which would load and multiply dead rows.
fn block(m: usize) -> (usize, &'static str) {
    if m >= 4 {
        (
            4,
            "const ROWS: u32 = 4u;\nalias V = vec4<f32>;\nalias VU = vec4<u32>;\n\
             fn block_rows(row0: u32, m: u32) -> VU {\n    \
             return min(VU(row0, row0 + 1u, row0 + 2u, row0 + 3u), VU(m - 1u));\n}\n\
             fn xs(i: VU) -> V {\n    \
             return V(load_x(i.x), load_x(i.y), load_x(i.z), load_x(i.w));\n}\n\
             fn lane(v: V, j: u32) -> f32 {\n    return v[j];\n}\n",
        )
    } else {
        (
            1,
            "const ROWS: u32 = 1u;\nalias V = f32;\nalias VU = u32;\n\
             fn block_rows(row0: u32, m: u32) -> VU {\n    return row0;\n}\n\
             fn xs(i: VU) -> V {\n    return load_x(i);\n}\n\
             fn lane(v: V, j: u32) -> f32 {\n    return v;\n}\n",
        )
    }
}

fn unsupported(op: &str, dtype: DType) -> KernelError {
    KernelError::Unsupported {
        op: op.into(),
        dtypes: dtype.to_string(),
    }
}

/// `fn round_t(x: f32) -> f32`: `x` rounded to `dtype` as stored.
fn round_t(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "fn round_t(x: f32) -> f32 {\n    return round_f16(x);\n}\n",
        DType::BF16 => "fn round_t(x: f32) -> f32 {\n    return round_bf16(x);\n}\n",
        _ => "fn round_t(x: f32) -> f32 {\n    return x;\n}\n",
    }
}

/// BITS, MASK and `decode(code, scale, bias)` (rounded to `dtype`).
fn format_part(format: QuantFormat, dtype: DType) -> String {
    let bits = format.bits();
    let value = match format {
        QuantFormat::Affine { .. } => "scale * f32(code) + bias",
        QuantFormat::Nf4 => "scale * NF4[code & 15u]",
        QuantFormat::Int8 => "scale * f32((i32(code) << 24u) >> 24u)",
    };
    format!(
        "const BITS: u32 = {bits}u;\nconst MASK: u32 = {}u;\n{COMMON}{}\
         fn decode(code: u32, scale: f32, bias: f32) -> f32 {{\n    return round_t({value});\n}}\n",
        (1u64 << bits) - 1,
        round_t(dtype)
    )
}

/// Prelude, bindings (`in_k` per operand, in `bound` order) and loads.
fn header(bound: &[(usize, &str)], target: Target) -> String {
    let mut source = prelude(target);
    source.push_str(&bindings(bound, "u32"));
    source
}

/// The float loads `load_scale` (operand `scales`) and `load_bias`
/// (operand `biases`, or 0).
fn scale_loads(scales: usize, biases: Option<usize>, dtype: DType, target: Target) -> String {
    let mut s = load_fn("load_scale", &format!("in_{scales}"), dtype, target, 1);
    match biases {
        Some(b) => s.push_str(&load_fn("load_bias", &format!("in_{b}"), dtype, target, 1)),
        None => s.push_str("fn load_bias(i: u32) -> f32 {\n    return 0.0;\n}\n"),
    }
    s
}

fn require_float(op: &str, dtype: DType) -> Result<(), KernelError> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(unsupported(op, dtype))
    }
}

/// Columns per scale of a weight with `cols` columns.
fn group_of(format: QuantFormat, cols: usize) -> usize {
    format.group_size().unwrap_or(cols).max(1)
}

/// Workgroups for `invocations` at `size` per workgroup.
fn workgroups(op: &str, invocations: usize, size: usize) -> Result<u64, KernelError> {
    param(op, invocations)?;
    Ok(invocations.div_ceil(size) as u64)
}

/// Bits of a packed stream, checked against 32-bit indexing.
fn check_bits(op: &str, elements: usize, format: QuantFormat) -> Result<(), KernelError> {
    let bits = elements.saturating_mul(format.bits() as usize);
    param(op, bits.saturating_add(32)).map(|_| ())
}

/// One part of `quantize` of a contiguous `dtype` weight with `elements`
/// elements in rows of `cols`.
pub fn quantize(
    format: QuantFormat,
    part: QuantPart,
    dtype: DType,
    elements: usize,
    cols: usize,
    target: Target,
) -> Result<KernelSpec, KernelError> {
    const OP: &str = "quantize";
    require_float(OP, dtype)?;
    check_bits(OP, elements, format)?;
    let group = group_of(format, cols);
    let bits = format.bits();
    let top = (1u32 << bits) - 1;
    let (part_id, outputs) = match part {
        QuantPart::Packed => (0, elements * bits as usize / 32),
        QuantPart::Scales => (1, elements / group),
        QuantPart::Biases => (2, elements / group),
    };
    let mut source = header(&[(0, buffer_type(dtype, target))], target);
    source.push_str(&format_part(format, dtype));
    source.push_str(&load_fn("load_w", "in_0", dtype, target, 1));
    let (scale, encode) = match format {
        QuantFormat::Affine { .. } => (
            format!("(hi - lo) / f32({top}u)"),
            format!(
                "if (scale == 0.0) {{\n        return 0u;\n    }}\n    \
                 return u32(clamp(round((v - bias) / scale), 0.0, {top}.0));"
            ),
        ),
        QuantFormat::Nf4 => (
            "absmax".to_string(),
            "let t = select(v / scale, 0.0, scale == 0.0);\n    var best = 0u;\n    \
             for (var i = 1u; i < 16u; i++) {\n        \
             if (abs(t - NF4[i]) < abs(t - NF4[best])) {\n            best = i;\n        }\n    }\n    \
             return best;"
                .to_string(),
        ),
        QuantFormat::Int8 => (
            "absmax / 127.0".to_string(),
            "if (scale == 0.0) {\n        return 0u;\n    }\n    \
             return u32(i32(clamp(round(v / scale), -127.0, 127.0))) & 0xffu;"
                .to_string(),
        ),
    };
    let bias = if format.has_biases() { "lo" } else { "0.0" };
    let _ = write!(
        source,
        "const PART: u32 = {part_id}u;\n\
         fn scale_of(lo: f32, hi: f32, absmax: f32) -> f32 {{\n    return {scale};\n}}\n\
         fn bias_of(lo: f32) -> f32 {{\n    return {bias};\n}}\n\
         fn encode(v: f32, scale: f32, bias: f32) -> u32 {{\n    {encode}\n}}\n{QUANTIZE}"
    );
    checked(
        OP,
        KernelSpec {
            source,
            params: vec![param(OP, outputs)?, param(OP, cols)?, param(OP, group)?],
            workgroups: workgroups(OP, outputs, 64)?,
            bound: vec![0],
            status: false,
            launch: None,
        },
    )
}

/// `dequantize` of a weight with `elements` elements in rows of `cols`
/// whose scales are `dtype`.
pub fn dequantize(
    format: QuantFormat,
    dtype: DType,
    elements: usize,
    cols: usize,
    target: Target,
) -> Result<KernelSpec, KernelError> {
    const OP: &str = "dequantize";
    require_float(OP, dtype)?;
    check_bits(OP, elements, format)?;
    let group = group_of(format, cols);
    let float = buffer_type(dtype, target);
    let biases = format.has_biases().then_some(2);
    let mut bound = vec![(0, "u32"), (1, float)];
    if biases.is_some() {
        bound.push((2, float));
    }
    // Operand k is bound as in_{k+1}: `code_at` reads the codes as in_1.
    let bound: Vec<(usize, &str)> = bound.into_iter().map(|(k, t)| (k + 1, t)).collect();
    let mut source = header(&bound, target);
    source.push_str(&format_part(format, dtype));
    source.push_str(CODE_AT);
    source.push_str(&scale_loads(2, biases.map(|b| b + 1), dtype, target));
    source.push_str(DEQUANTIZE);
    checked(
        OP,
        KernelSpec {
            source,
            params: vec![
                param(OP, elements)?,
                param(OP, cols.max(1))?,
                param(OP, group)?,
                param(OP, cols / group)?,
            ],
            workgroups: workgroups(OP, elements, 256)?,
            bound: (0..bound.len()).collect(),
            status: false,
            launch: None,
        },
    )
}

/// How the matrices of each output batch entry of a product are found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QmmBatch {
    /// `quantized_matmul`: the output's batch dims, with the x and w batch
    /// dims broadcast to them.
    Broadcast {
        /// The output's batch dims.
        batch: Vec<usize>,
        /// x's batch dims.
        x_batch: Vec<usize>,
        /// w's batch dims.
        w_batch: Vec<usize>,
    },
    /// `gather_qmm`: the broadcast index shape, the two index arrays'
    /// shapes and dtypes, and the numbers of x and w matrices.
    Gather {
        /// The output's batch dims (the broadcast of the index shapes).
        batch: Vec<usize>,
        /// Shape and dtype of `lhs_indices`.
        lhs: (Vec<usize>, DType),
        /// Shape and dtype of `rhs_indices`.
        rhs: (Vec<usize>, DType),
        /// x matrices.
        x_count: usize,
        /// w matrices.
        w_count: usize,
    },
}

/// The geometry of a quantized product.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QmmShape {
    /// Rows of x and of the output.
    pub m: usize,
    /// Columns of the output.
    pub n: usize,
    /// The inner dimension.
    pub k: usize,
    /// `x @ wᵀ` with w `[n, k]` when true, `x @ w` with w `[k, n]` when false.
    pub transpose: bool,
    /// The batch entries.
    pub batch: QmmBatch,
}

/// `quantized_matmul` or `gather_qmm` of contiguous operands `[x, packed,
/// scales, biases?, lhs?, rhs?]` with x and scales of `dtype`. For
/// `gather_qmm` an index out of range lowers the status word to the output
/// batch entry reading it (and is read clamped).
pub fn quantized_matmul(
    format: QuantFormat,
    dtype: DType,
    shape: &QmmShape,
    target: Target,
) -> Result<KernelSpec, KernelError> {
    let gather = matches!(shape.batch, QmmBatch::Gather { .. });
    let op = if gather {
        "gather_qmm"
    } else {
        "quantized_matmul"
    };
    require_float(op, dtype)?;
    let QmmShape {
        m, n, k, transpose, ..
    } = *shape;
    // The stored weight's columns (the quantized axis) and rows per matrix.
    let (cols, rows) = if transpose { (k, n) } else { (n, k) };
    let group = group_of(format, cols);
    let float = buffer_type(dtype, target);
    let biases = format.has_biases().then_some(3);
    let weight = 3 + usize::from(biases.is_some());
    let mut bound = vec![(0, float), (1, "u32"), (2, float)];
    if let Some(b) = biases {
        bound.push((b, float));
    }
    if gather {
        bound.push((weight, "u32"));
        bound.push((weight + 1, "u32"));
    }
    let mut source = header(&bound, target);
    if gather {
        source.push_str(&status_binding(bound.len() + 2));
    }
    source.push_str(&format_part(format, dtype));
    source.push_str(CODE_AT);
    source.push_str(&scale_loads(2, biases, dtype, target));
    source.push_str(&load_fn("load_x", "in_0", dtype, target, 1));
    let tiled = m >= QMM_TILED_MIN_ROWS;
    let (block_rows, block_part) = block(m);
    if !tiled {
        source.push_str(block_part);
    }
    let mut params = vec![
        0,
        param(op, m)?,
        param(op, n)?,
        param(op, k)?,
        param(op, group)?,
        param(op, cols / group)?,
    ];
    let batches = match &shape.batch {
        QmmBatch::Broadcast {
            batch,
            x_batch,
            w_batch,
        } => {
            let rank = batch.len();
            params.push(param(op, rank)?);
            for &d in batch {
                params.push(param(op, d)?);
            }
            for own in [x_batch, w_batch] {
                for &s in &View::broadcast(DType::F32, own, batch).strides {
                    params.push(param(op, s)?);
                }
            }
            source.push_str(
                "fn matrices(b: u32) -> vec2<u32> {\n    let rank = params[6];\n    \
                 var rem = b;\n    var mats = vec2<u32>(0u, 0u);\n    \
                 for (var d = rank; d > 0u; d--) {\n        let size = params[6u + d];\n        \
                 let c = rem % size;\n        rem /= size;\n        \
                 mats += c * vec2<u32>(params[6u + rank + d], params[6u + 2u * rank + d]);\n    }\n    \
                 return mats;\n}\n",
            );
            batch.iter().product::<usize>()
        }
        QmmBatch::Gather {
            batch,
            lhs,
            rhs,
            x_count,
            w_count,
        } => {
            let rank = batch.len();
            params.push(param(op, *x_count)?);
            params.push(param(op, *w_count)?);
            params.push(param(op, rank)?);
            for &d in batch {
                params.push(param(op, d)?);
            }
            for (shape, _) in [lhs, rhs] {
                for &s in &View::broadcast(DType::U32, shape, batch).strides {
                    params.push(param(op, s)?);
                }
            }
            for (name, k, (_, dtype)) in [("lhs", weight, lhs), ("rhs", weight + 1, rhs)] {
                let read = match dtype {
                    DType::I32 => {
                        format!("select(in_{k}[j], 0xffffffffu, bitcast<i32>(in_{k}[j]) < 0)")
                    }
                    DType::U32 => format!("in_{k}[j]"),
                    other => return Err(unsupported(op, *other)),
                };
                let _ = writeln!(
                    source,
                    "fn {name}_index(j: u32) -> u32 {{\n    return {read};\n}}"
                );
            }
            source.push_str(
                "fn matrices(b: u32) -> vec2<u32> {\n    let rank = params[8];\n    \
                 var rem = b;\n    var at = vec2<u32>(0u, 0u);\n    \
                 for (var d = rank; d > 0u; d--) {\n        let size = params[8u + d];\n        \
                 let c = rem % size;\n        rem /= size;\n        \
                 at += c * vec2<u32>(params[8u + rank + d], params[8u + 2u * rank + d]);\n    }\n    \
                 let mats = vec2<u32>(lhs_index(at.x), rhs_index(at.y));\n    \
                 if (mats.x >= params[6] || mats.y >= params[7]) {\n        \
                 report_bad_input(b);\n    }\n    \
                 return min(mats, vec2<u32>(params[6], params[7]) - vec2<u32>(1u));\n}\n",
            );
            batch.iter().product::<usize>()
        }
    };
    check_bits(op, batches.max(1) * rows * cols, format)?;
    param(op, batches * m * n)?;
    if tiled {
        source.push_str(QMM_TILED);
        // Whole words per row of w along k and per group: decode a word
        // at a time.
        let bits = format.bits() as usize;
        let words = transpose
            && 32usize.is_multiple_of(bits)
            && (k * bits).is_multiple_of(32)
            && (group * bits).is_multiple_of(32);
        if words {
            source.push_str(QMM_TILE_WORDS);
        } else {
            // Element (kk, col) of the logical [k, n] weight: stored [n, k]
            // (`x @ wᵀ`) or [k, n] (`x @ w`), quantized along its rows.
            let (row, at) = if transpose {
                ("w_mat * n + col", "kk")
            } else {
                ("w_mat * k + kk", "col")
            };
            let _ = write!(
                source,
                "fn weight(w_mat: u32, col: u32, kk: u32) -> f32 {{\n    \
                 let n = params[2];\n    let k = params[3];\n    \
                 if (col >= n || kk >= k) {{\n        return 0.0;\n    }}\n    \
                 let w_row = {row};\n    let g = w_row * params[5] + {at} / params[4];\n    \
                 let width = params[4] * params[5];\n    \
                 return decode(code_at((w_row * width + {at}) * BITS), load_scale(g), load_bias(g));\n}}\n"
            );
            source.push_str(QMM_TILE_CODES);
        }
        params[0] = param(op, batches)?;
        return checked(
            op,
            KernelSpec {
                source,
                params,
                workgroups: workgroups(op, batches * m.div_ceil(64) * n.div_ceil(32), 1)?,
                bound: bound.iter().map(|&(k, _)| k).collect(),
                status: gather,
                launch: None,
            },
        );
    }
    // The sum over k for one block of x rows (element offsets `x_rows`)
    // and one output column of w matrix `w`.
    let product = if transpose && 32 % format.bits() == 0 {
        // Whole words of codes, each decoded once per block.
        let per_word = 32 / format.bits();
        format!(
            "fn product(x_rows: VU, w: u32, col: u32) -> V {{\n    \
             let k = params[3];\n    let group = params[4];\n    let gpr = params[5];\n    \
             let row = w * params[2] + col;\n    var word_at = row * (k / {per_word}u);\n    \
             var acc = V(0.0);\n    \
             for (var g = 0u; g < gpr; g++) {{\n        \
             let scale = load_scale(row * gpr + g);\n        let bias = load_bias(row * gpr + g);\n        \
             for (var kk = g * group; kk < (g + 1u) * group; kk += {per_word}u) {{\n            \
             let word = in_1[word_at];\n            word_at++;\n            \
             for (var j = 0u; j < {per_word}u; j++) {{\n                \
             let v = decode((word >> (j * BITS)) & MASK, scale, bias);\n                \
             acc += xs(x_rows + VU(kk + j)) * v;\n            }}\n        }}\n    }}\n    \
             return acc;\n}}\n"
        )
    } else if transpose {
        "fn product(x_rows: VU, w: u32, col: u32) -> V {\n    \
         let k = params[3];\n    let group = params[4];\n    let gpr = params[5];\n    \
         let row = w * params[2] + col;\n    var acc = V(0.0);\n    \
         for (var g = 0u; g < gpr; g++) {\n        \
         let scale = load_scale(row * gpr + g);\n        let bias = load_bias(row * gpr + g);\n        \
         for (var kk = g * group; kk < (g + 1u) * group; kk++) {\n            \
         let v = decode(code_at((row * k + kk) * BITS), scale, bias);\n            \
         acc += xs(x_rows + VU(kk)) * v;\n        }\n    }\n    \
         return acc;\n}\n"
            .to_string()
    } else {
        "fn product(x_rows: VU, w: u32, col: u32) -> V {\n    \
         let n = params[2];\n    let k = params[3];\n    let group = params[4];\n    \
         let gpr = params[5];\n    var acc = V(0.0);\n    \
         for (var kk = 0u; kk < k; kk++) {\n        let row = w * k + kk;\n        \
         let g = row * gpr + col / group;\n        \
         let v = decode(code_at((row * n + col) * BITS), load_scale(g), load_bias(g));\n        \
         acc += xs(x_rows + VU(kk)) * v;\n    }\n    \
         return acc;\n}\n"
            .to_string()
    };
    source.push_str(&product);
    source.push_str(QMM);
    let invocations = batches * m.div_ceil(block_rows) * n;
    params[0] = param(op, invocations)?;
    checked(
        op,
        KernelSpec {
            source,
            params,
            workgroups: workgroups(op, invocations, 64)?,
            bound: bound.iter().map(|&(k, _)| k).collect(),
            status: gather,
            launch: None,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_and_kernel_validates() {
        let formats = [
            QuantFormat::affine(2, 32),
            QuantFormat::affine(3, 64),
            QuantFormat::affine(4, 64),
            QuantFormat::affine(5, 128),
            QuantFormat::affine(6, 32),
            QuantFormat::affine(8, 32),
            QuantFormat::Nf4,
            QuantFormat::Int8,
        ];
        for native_f16 in [false, true] {
            let target = Target { native_f16 };
            for format in formats {
                for dtype in [DType::F32, DType::F16, DType::BF16] {
                    for part in [QuantPart::Packed, QuantPart::Scales, QuantPart::Biases] {
                        quantize(format, part, dtype, 256, 128, target).unwrap();
                    }
                    dequantize(format, dtype, 256, 128, target).unwrap();
                    for (m, transpose) in [
                        (1, false),
                        (5, false),
                        (70, false),
                        (1, true),
                        (5, true),
                        (70, true),
                    ] {
                        let batch = QmmBatch::Broadcast {
                            batch: vec![2],
                            x_batch: vec![1],
                            w_batch: vec![2],
                        };
                        let shape = QmmShape {
                            m,
                            n: 128,
                            k: 128,
                            transpose,
                            batch,
                        };
                        quantized_matmul(format, dtype, &shape, target).unwrap();
                        let gather = QmmShape {
                            batch: QmmBatch::Gather {
                                batch: vec![2, 3],
                                lhs: (vec![2, 1], DType::I32),
                                rhs: (vec![3], DType::U32),
                                x_count: 2,
                                w_count: 3,
                            },
                            ..shape
                        };
                        quantized_matmul(format, dtype, &gather, target).unwrap();
                    }
                }
            }
        }
    }

    #[test]
    fn integer_activations_have_no_kernel() {
        let err = dequantize(QuantFormat::Nf4, DType::I32, 64, 64, Target::default()).unwrap_err();
        assert!(matches!(err, KernelError::Unsupported { .. }));
    }
}
