//! Element semantics in WGSL: how each dtype is held in a word and in a
//! register, and the expression of every elementwise op as a call into the
//! op library `wgsl/ops.wgsl`, which mirrors the reference evaluation in
//! `kiln::ops` (wrapping integers, division by zero giving 0,
//! NaN-propagating maximum, saturating casts).

use crate::spec::{KernelError, Target};
use kiln::{BinaryOp, DType, UnaryOp};
use std::collections::HashSet;
use std::sync::OnceLock;

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

/// The type `lanes` elements of `dtype` are computed in: the scalar
/// [`value_type`], or a vec4 of it.
pub(crate) fn lane_type(dtype: DType, lanes: usize) -> String {
    if lanes == 1 {
        value_type(dtype).to_string()
    } else {
        format!("vec{lanes}<{}>", value_type(dtype))
    }
}

/// The lane aliases the op library (`wgsl/ops.wgsl`) is written against.
pub(crate) fn lane_aliases(lanes: usize) -> String {
    [DType::F32, DType::I32, DType::U32, DType::Bool]
        .iter()
        .map(|&d| format!("alias v{} = {};\n", kind(d), lane_type(d, lanes)))
        .collect()
}

/// The operand kind naming the op library's functions: f16 and bf16
/// compute as f32, u8 as u32.
fn kind(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => "f32",
        DType::I32 => "i32",
        DType::U32 | DType::U8 => "u32",
        DType::Bool => "bool",
    }
}

/// A WGSL function `name(i: u32)` reading `lanes` elements of `dtype` at
/// `i` of `buffer`: element `i` of an array declared with [`buffer_type`]
/// for one lane, vec4 `i` of an `array<vec4<u32>>` for four (one-word
/// dtypes only).
pub(crate) fn load_fn(
    name: &str,
    buffer: &str,
    dtype: DType,
    target: Target,
    lanes: usize,
) -> String {
    let body = if lanes > 1 {
        let words = format!("{buffer}[i]");
        match dtype {
            DType::F32 | DType::I32 => format!("bitcast<{}>({words})", lane_type(dtype, lanes)),
            DType::Bool => format!("{words} != vec{lanes}<u32>(0u)"),
            _ => words,
        }
    } else {
        match dtype {
            DType::F16 if target.native_f16 => format!("f32({buffer}[i])"),
            DType::F32 => format!("bitcast<f32>({buffer}[i])"),
            DType::I32 => format!("bitcast<i32>({buffer}[i])"),
            DType::U32 | DType::U8 => format!("{buffer}[i]"),
            DType::Bool => format!("{buffer}[i] != 0u"),
            DType::F16 => format!("unpack2x16float({buffer}[i >> 1u])[i & 1u]"),
            DType::BF16 => format!("bf16_to_f32(half_bits({buffer}[i >> 1u], i))"),
        }
    };
    format!(
        "fn {name}(i: u32) -> {} {{\n    return {body};\n}}\n",
        lane_type(dtype, lanes)
    )
}

/// A WGSL expression of the element whose storage word is `word` (the
/// low half for f16 and bf16); `None` for non-finite floats, which WGSL
/// constant expressions cannot hold, and for float zeros: WGSL leaves a
/// float division by zero indeterminate, and with the zero a constant a
/// compiler may fold `x / 0.0` to anything (lavapipe gave 0 and garbage
/// for `0.0 / 0.0`, so the mean over an empty axis was not NaN), while a
/// zero read at run time divides as IEEE 754 does.
pub(crate) fn literal(dtype: DType, word: u32) -> Option<String> {
    let f32_bits = match dtype {
        DType::F32 => word,
        DType::BF16 => (word & 0xffff) << 16,
        DType::F16 => half::f16::from_bits(word as u16).to_f32().to_bits(),
        DType::I32 => return Some(format!("bitcast<i32>({word:#x}u)")),
        DType::U32 | DType::U8 => return Some(format!("{word:#x}u")),
        DType::Bool => return Some((word != 0).to_string()),
    };
    let value = f32::from_bits(f32_bits);
    (value.is_finite() && value != 0.0).then(|| format!("bitcast<f32>({f32_bits:#x}u)"))
}

/// WGSL functions storing a computed value: `store_value(v)` for the
/// dtypes stored one per element (`lanes` of them into a vec4 of words for
/// four lanes), `store_pair(low, high) -> u32` for f16 and bf16 packed two
/// per word.
pub(crate) fn store_fn(dtype: DType, target: Target, lanes: usize) -> String {
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
            let words = lane_type(DType::U32, lanes);
            let body = match dtype {
                DType::F32 | DType::I32 => format!("bitcast<{words}>(v)"),
                DType::Bool => format!("select({words}(0u), {words}(1u), v)"),
                DType::U8 => format!("v & {words}(0xffu)"),
                _ => "v".to_string(),
            };
            format!(
                "fn store_value(v: {}) -> {words} {{\n    return {body};\n}}\n",
                lane_type(dtype, lanes)
            )
        }
    }
}

/// `x` rounded to the precision of `dtype` (f16 and bf16 values are
/// computed in f32 and rounded after every op, as the reference does; u8 in
/// u32, wrapping to 8 bits).
fn round_to(dtype: DType, x: String) -> String {
    match dtype {
        DType::F16 => format!("round_f16({x})"),
        DType::BF16 => format!("round_bf16({x})"),
        DType::U8 => format!("({x} & vu32(0xffu))"),
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

/// The op library: every elementwise op's meaning in WGSL.
pub(crate) const OPS: &str = include_str!("wgsl/ops.wgsl");

/// True when the op library defines function `name`.
fn defined(name: &str) -> bool {
    static NAMES: OnceLock<HashSet<&'static str>> = OnceLock::new();
    NAMES
        .get_or_init(|| {
            OPS.split("fn ")
                .skip(1)
                .filter_map(|rest| rest.split('(').next())
                .collect()
        })
        .contains(name)
}

/// A call of the op library's `name` on `args`, if it defines one.
fn call(name: &str, args: &[&str]) -> Option<String> {
    defined(name).then(|| format!("{name}({})", args.join(", ")))
}

/// The expression of unary `op` on `x` of `dtype`.
pub(crate) fn unary(op: UnaryOp, dtype: DType, x: &str) -> Result<String, KernelError> {
    let expr = call(&format!("{}_{}", op.name(), kind(dtype)), &[x])
        .ok_or_else(|| unsupported(op.name(), &[dtype]))?;
    Ok(round_to(dtype, expr))
}

/// The expression of binary `op` on `a` and `b` of operand dtype `dtype`.
pub(crate) fn binary(op: BinaryOp, dtype: DType, a: &str, b: &str) -> Result<String, KernelError> {
    let expr = call(&format!("{}_{}", op.name(), kind(dtype)), &[a, b])
        .ok_or_else(|| unsupported(op.name(), &[dtype, dtype]))?;
    Ok(if op.is_comparison() {
        expr
    } else {
        round_to(dtype, expr)
    })
}

/// The expression choosing `t` where `c` holds, else `f` (of `dtype`).
pub(crate) fn select(dtype: DType, c: &str, t: &str, f: &str) -> String {
    format!("where_{}({c}, {t}, {f})", kind(dtype))
}

/// The expression converting `x` from `from` to `to` with the reference's
/// cast semantics: saturating to u8, and rounding integers to f16/bf16 once
/// (the op library's `cast_i32_to_bf16`, ...), not through f32.
pub(crate) fn cast(from: DType, to: DType, x: &str) -> Result<String, KernelError> {
    let target = match to {
        DType::U8 => "u8",
        DType::F16 | DType::BF16 if from.is_integer() => to.name(),
        _ => kind(to),
    };
    if from == to || kind(from) == target {
        // Same computed type: at most a rounding to the narrower float.
        return Ok(round_to(to, x.to_string()));
    }
    let expr = call(&format!("cast_{}_to_{target}", kind(from)), &[x])
        .ok_or_else(|| unsupported("cast", &[from, to]))?;
    Ok(round_to(to, expr))
}
