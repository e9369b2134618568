//! Element semantics in WGSL: how each dtype is held in a word and in a
//! register, and the expression of every elementwise op. These mirror the
//! reference evaluation in `kiln::ops` (wrapping integers, division by zero
//! giving 0, NaN-propagating maximum, saturating casts).

use crate::{KernelError, Target};
use kiln::{BinaryOp, DType, UnaryOp};

/// The WGSL type an element is computed in: f16 and bf16 compute in f32,
/// u8 in u32 (masked back to 8 bits), bool as `bool`.
pub(crate) fn value_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => "f32",
        DType::I32 => "i32",
        DType::U32 | DType::U8 => "u32",
        DType::Bool => "bool",
    }
}

/// True for the dtypes a kernel for `target` reads and writes two per word.
pub(crate) fn is_packed(dtype: DType, target: Target) -> bool {
    match dtype {
        DType::F16 => !target.native_f16,
        DType::BF16 => true,
        _ => false,
    }
}

/// The element type of a buffer holding `dtype`: `f16` for f16 on a
/// native-f16 target, words otherwise.
pub(crate) fn buffer_type(dtype: DType, target: Target) -> &'static str {
    if dtype == DType::F16 && target.native_f16 {
        "f16"
    } else {
        "u32"
    }
}

/// A WGSL function `name(i: u32) -> T` reading element `i` of `buffer`
/// (declared with [`buffer_type`] for `target`).
pub(crate) fn load_fn(name: &str, buffer: &str, dtype: DType, target: Target) -> String {
    let body = match dtype {
        DType::F16 if target.native_f16 => format!("f32({buffer}[i])"),
        DType::F32 => format!("bitcast<f32>({buffer}[i])"),
        DType::I32 => format!("bitcast<i32>({buffer}[i])"),
        DType::U32 | DType::U8 => format!("{buffer}[i]"),
        DType::Bool => format!("{buffer}[i] != 0u"),
        DType::F16 => format!("unpack2x16float({buffer}[i >> 1u])[i & 1u]"),
        DType::BF16 => format!("bf16_to_f32(half_bits({buffer}[i >> 1u], i))"),
    };
    format!(
        "fn {name}(i: u32) -> {} {{\n    return {body};\n}}\n",
        value_type(dtype)
    )
}

/// A WGSL expression of the element whose storage word is `word` (the
/// low half for f16 and bf16); `None` for non-finite floats, which WGSL
/// constant expressions cannot hold.
pub(crate) fn literal(dtype: DType, word: u32) -> Option<String> {
    let f32_bits = match dtype {
        DType::F32 => word,
        DType::BF16 => (word & 0xffff) << 16,
        DType::F16 => half::f16::from_bits(word as u16).to_f32().to_bits(),
        DType::I32 => return Some(format!("bitcast<i32>({word:#x}u)")),
        DType::U32 | DType::U8 => return Some(format!("{word:#x}u")),
        DType::Bool => return Some((word != 0).to_string()),
    };
    f32::from_bits(f32_bits)
        .is_finite()
        .then(|| format!("bitcast<f32>({f32_bits:#x}u)"))
}

/// WGSL functions storing a computed value: `store_value(v)` for the
/// dtypes stored one per element, `store_pair(low, high) -> u32` for f16
/// and bf16 packed two per word.
pub(crate) fn store_fn(dtype: DType, target: Target) -> String {
    let ty = value_type(dtype);
    match dtype {
        DType::F16 if target.native_f16 => {
            "fn store_value(v: f32) -> f16 {\n    return f16(v);\n}\n".to_string()
        }
        DType::F16 => "fn store_pair(low: f32, high: f32) -> u32 {\n    \
                       return pack2x16float(vec2<f32>(low, high));\n}\n"
            .to_string(),
        DType::BF16 => "fn store_pair(low: f32, high: f32) -> u32 {\n    \
                        return bf16_bits(low) | (bf16_bits(high) << 16u);\n}\n"
            .to_string(),
        _ => {
            let body = match dtype {
                DType::F32 | DType::I32 => "bitcast<u32>(v)",
                DType::Bool => "select(0u, 1u, v)",
                DType::U8 => "v & 0xffu",
                _ => "v",
            };
            format!("fn store_value(v: {ty}) -> u32 {{\n    return {body};\n}}\n")
        }
    }
}

/// `x` rounded to the precision of `dtype` (f16 and bf16 values are
/// computed in f32 and rounded after every op, as the reference does).
pub(crate) fn round_to(dtype: DType, x: String) -> String {
    match dtype {
        DType::F16 => format!("round_f16({x})"),
        DType::BF16 => format!("round_bf16({x})"),
        DType::U8 => format!("(({x}) & 0xffu)"),
        _ => x,
    }
}

fn unsupported(op: &str, dtypes: &[DType]) -> KernelError {
    KernelError::Unsupported {
        op: op.to_string(),
        dtypes: dtypes
            .iter()
            .map(|d| d.name())
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// The expression of unary `op` on `x` of `dtype`.
pub(crate) fn unary(op: UnaryOp, dtype: DType, x: &str) -> Result<String, KernelError> {
    let expr = if dtype.is_float() {
        match op {
            UnaryOp::Neg => format!("-{x}"),
            UnaryOp::Abs => format!("abs({x})"),
            UnaryOp::Exp => format!("exp({x})"),
            UnaryOp::Log => format!("log({x})"),
            UnaryOp::Sin => format!("sin({x})"),
            UnaryOp::Cos => format!("cos({x})"),
            UnaryOp::Tanh => format!("kiln_tanh({x})"),
            UnaryOp::Sqrt => format!("sqrt({x})"),
            UnaryOp::Rsqrt => format!("1.0 / sqrt({x})"),
            UnaryOp::Sigmoid => format!("kiln_sigmoid({x})"),
            UnaryOp::Relu => format!("select({x}, 0.0, {x} < 0.0)"),
            UnaryOp::Erf => format!("kiln_erf({x})"),
        }
    } else {
        match (op, dtype) {
            (UnaryOp::Neg, DType::I32) => format!("-{x}"),
            (UnaryOp::Abs, DType::I32) => format!("abs({x})"),
            (UnaryOp::Relu, DType::I32) => format!("max({x}, 0)"),
            (UnaryOp::Abs | UnaryOp::Relu, DType::U32 | DType::U8) => x.to_string(),
            _ => return Err(unsupported(op.name(), &[dtype])),
        }
    };
    Ok(round_to(dtype, expr))
}

/// The expression of binary `op` on `a` and `b` of operand dtype `dtype`.
pub(crate) fn binary(op: BinaryOp, dtype: DType, a: &str, b: &str) -> Result<String, KernelError> {
    if op.is_comparison() {
        // bool has no ordering in WGSL: compare as 0/1.
        let (a, b) = if dtype == DType::Bool {
            (
                format!("select(0u, 1u, {a})"),
                format!("select(0u, 1u, {b})"),
            )
        } else {
            (a.to_string(), b.to_string())
        };
        return Ok(match op {
            BinaryOp::Eq => format!("({a} == {b})"),
            // `!(==)` so that NaN compares unequal whatever the compiler assumes.
            BinaryOp::Ne => format!("!({a} == {b})"),
            BinaryOp::Lt => format!("({a} < {b})"),
            BinaryOp::Le => format!("({a} <= {b})"),
            BinaryOp::Gt => format!("({a} > {b})"),
            _ => format!("({a} >= {b})"),
        });
    }
    let zero = match dtype {
        DType::I32 => "0",
        _ => "0u",
    };
    let expr = match dtype {
        DType::F32 | DType::F16 | DType::BF16 => match op {
            BinaryOp::Add => format!("({a} + {b})"),
            BinaryOp::Sub => format!("({a} - {b})"),
            BinaryOp::Mul => format!("({a} * {b})"),
            BinaryOp::Div => format!("({a} / {b})"),
            BinaryOp::Pow => format!("kiln_pow({a}, {b})"),
            BinaryOp::Maximum => format!("nan_max({a}, {b})"),
            _ => format!("nan_min({a}, {b})"),
        },
        DType::I32 | DType::U32 | DType::U8 => match op {
            BinaryOp::Add => format!("({a} + {b})"),
            BinaryOp::Sub => format!("({a} - {b})"),
            BinaryOp::Mul => format!("({a} * {b})"),
            BinaryOp::Div => format!("select({a} / {b}, {zero}, {b} == {zero})"),
            BinaryOp::Maximum => format!("max({a}, {b})"),
            BinaryOp::Minimum => format!("min({a}, {b})"),
            _ => return Err(unsupported(op.name(), &[dtype, dtype])),
        },
        DType::Bool => match op {
            BinaryOp::Maximum => format!("({a} || {b})"),
            BinaryOp::Minimum => format!("({a} && {b})"),
            _ => return Err(unsupported(op.name(), &[dtype, dtype])),
        },
    };
    Ok(round_to(dtype, expr))
}

/// The expression converting `x` from `from` to `to` with the reference's
/// cast semantics.
pub(crate) fn cast(from: DType, to: DType, x: &str) -> String {
    if from == to {
        return x.to_string();
    }
    match to {
        DType::F32 | DType::F16 | DType::BF16 => {
            let wide = match from {
                DType::Bool => format!("select(0.0, 1.0, {x})"),
                DType::I32 | DType::U32 | DType::U8 => format!("f32({x})"),
                _ => x.to_string(),
            };
            round_to(to, wide)
        }
        DType::I32 => match from {
            DType::Bool => format!("select(0, 1, {x})"),
            DType::U32 => format!("i32(min({x}, 2147483647u))"),
            DType::U8 => format!("i32({x})"),
            _ => format!("f32_to_i32({x})"),
        },
        DType::U32 => match from {
            DType::Bool => format!("select(0u, 1u, {x})"),
            DType::I32 => format!("u32(max({x}, 0))"),
            DType::U8 => x.to_string(),
            _ => format!("f32_to_u32({x})"),
        },
        DType::U8 => match from {
            DType::Bool => format!("select(0u, 1u, {x})"),
            DType::I32 => format!("u32(clamp({x}, 0, 255))"),
            DType::U32 => format!("min({x}, 255u)"),
            _ => format!("f32_to_u8({x})"),
        },
        DType::Bool => match from {
            DType::I32 => format!("({x} != 0)"),
            DType::U32 | DType::U8 => format!("({x} != 0u)"),
            _ => format!("!({x} == 0.0)"),
        },
    }
}
