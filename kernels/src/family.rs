//! Reductions, argmax and matmul: static algorithms in `wgsl/` with the
//! dtype-specific prelude generated here.
//!
//! These kernels write one element per invocation. For f16 and bf16 results
//! they write f32 words instead (see [`stores_f32`]), which a backend packs
//! with an elementwise cast, so no two invocations share an output word.

use crate::abi::bindings;
use crate::element::{buffer_type, load_fn, value_type};
use crate::source::{param, prelude};
use crate::spec::{KernelError, KernelSpec, Target, View};
use kiln::shape::row_major_strides;
use kiln::{DType, ReduceOp};
use std::fmt::Write;

const REDUCE_AXES: &str = include_str!("wgsl/reduce_axes.wgsl");
const REDUCE: &str = include_str!("wgsl/reduce.wgsl");
const ARGMAX: &str = include_str!("wgsl/argmax.wgsl");
const ARGSORT: &str = include_str!("wgsl/argsort.wgsl");
const MATMUL_COMMON: &str = include_str!("wgsl/matmul_common.wgsl");
const MATMUL_TILED: &str = include_str!("wgsl/matmul_tiled.wgsl");
const MATMUL_SKINNY: &str = include_str!("wgsl/matmul_skinny.wgsl");
const MATMUL_NAIVE: &str = include_str!("wgsl/matmul_naive.wgsl");

/// True when [`reduce`], [`matmul`] and [`crate::scatter_add`] write f32 words for a result of
/// `dtype` (f16 and bf16), to be packed by an elementwise cast.
pub fn stores_f32(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
}

/// The type reductions and products accumulate in: f32 for the floats,
/// u32 for bool (0/1) and u8.
pub(crate) fn accumulator(dtype: DType) -> &'static str {
    match dtype {
        DType::Bool => "u32",
        other => value_type(other),
    }
}

/// `store_value(v: T) -> u32` for an accumulator of `dtype`.
pub(crate) fn store_accumulator(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 | DType::I32 => {
            "fn store_value(v: T) -> u32 {\n    return bitcast<u32>(v);\n}\n"
        }
        DType::U8 => "fn store_value(v: T) -> u32 {\n    return v & 0xffu;\n}\n",
        DType::U32 | DType::Bool => "fn store_value(v: T) -> u32 {\n    return v;\n}\n",
    }
}

/// Loads element `i` of operand `k` as the accumulator type.
fn load_accumulated(name: &str, k: usize, dtype: DType, target: Target) -> String {
    if dtype == DType::Bool {
        format!("fn {name}(i: u32) -> u32 {{\n    return in_{k}[i];\n}}\n")
    } else {
        load_fn(name, &format!("in_{k}"), dtype, target, 1)
    }
}

/// Prelude and bindings of `operands` operands of `dtype`; the output is
/// words (f32 for f16 and bf16 results, see [`stores_f32`]).
fn header(operands: usize, dtype: DType, target: Target) -> String {
    let bound: Vec<(usize, &str)> = (0..operands)
        .map(|k| (k, buffer_type(dtype, target)))
        .collect();
    header_bound(&bound, dtype, target)
}

/// [`header`] with each operand's buffer element type given.
fn header_bound(bound: &[(usize, &str)], dtype: DType, target: Target) -> String {
    let mut source = prelude(target);
    source.push_str(&bindings(bound, "u32"));
    let _ = writeln!(source, "alias T = {};", accumulator(dtype));
    source
}

/// The buffer element type through which operands of `dtype` are read
/// four elements at a time, where that is one aligned load: one-word
/// dtypes as vec4 words, f16 on a native-f16 target as `vec4<f16>`.
fn vec4_buffer(dtype: DType, target: Target) -> Option<&'static str> {
    match dtype {
        DType::F32 | DType::I32 | DType::U32 | DType::U8 => Some("vec4<u32>"),
        DType::F16 if target.native_f16 => Some("vec4<f16>"),
        _ => None,
    }
}

/// `{name}(base, r, c, valid) -> vec4<T>`: elements `(r, c..c+4)` of the
/// matrix of operand `k` starting at element `base`, of which the first
/// `valid` exist and the rest read as zero. Through a `vec4_buffer`
/// binding (`vector`: the four are contiguous, `base + at(r, c)` is a
/// multiple of four and all four exist) it is one load; otherwise `valid`
/// scalar loads by `scalar`, each element placed by `at` (`a_at`, `b_at`).
fn load_four(name: &str, scalar: &str, at: &str, k: usize, dtype: DType, vector: bool) -> String {
    if !vector {
        return format!(
            "fn {name}(base: u32, r: u32, c: u32, valid: u32) -> vec4<T> {{\n    \
             var v = vec4<T>(zero());\n    \
             for (var j = 0u; j < valid; j++) {{\n        v[j] = {scalar}(base + {at}(r, c + j));\n    }}\n    \
             return v;\n}}\n"
        );
    }
    let value = match dtype {
        DType::F32 => "bitcast<vec4<f32>>(w)",
        DType::I32 => "bitcast<vec4<i32>>(w)",
        DType::F16 => "vec4<f32>(w)",
        _ => "w",
    };
    format!(
        "fn {name}(base: u32, r: u32, c: u32, valid: u32) -> vec4<T> {{\n    \
         let w = in_{k}[(base + {at}(r, c)) >> 2u];\n    return {value};\n}}\n"
    )
}

fn workgroups_of(op: &str, n: usize) -> Result<u64, KernelError> {
    param(op, n).map(u64::from)
}

/// Kept and reduced axes as [kept rank, reduced rank, kept shape, kept
/// strides, reduced shape, reduced strides] of a contiguous input.
fn axis_params(op: &str, shape: &[usize], reduced: &[usize]) -> Result<Vec<u32>, KernelError> {
    let strides = row_major_strides(shape);
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !reduced.contains(d)).collect();
    let mut params = vec![param(op, kept.len())?, param(op, reduced.len())?];
    for axes in [&kept[..], reduced] {
        for &d in axes {
            params.push(param(op, shape[d])?);
        }
        for &d in axes {
            params.push(param(op, strides[d])?);
        }
    }
    Ok(params)
}

/// A reduction of contiguous `shape` over `axes` (sorted, unique): one
/// workgroup per output element with a tree reduction in shared memory.
pub fn reduce(
    op: ReduceOp,
    dtype: DType,
    shape: &[usize],
    axes: &[usize],
    target: Target,
) -> Result<KernelSpec, KernelError> {
    let (identity, combine) = match (dtype, op) {
        (DType::Bool, ReduceOp::Sum) => {
            return Err(KernelError::Unsupported {
                op: op.name().into(),
                dtypes: dtype.name().into(),
            })
        }
        (d, ReduceOp::Sum) if d.is_float() => ("0.0", "a + b"),
        (d, ReduceOp::Max) if d.is_float() => ("-pos_inf()", "maximum_f32(a, b)"),
        (d, ReduceOp::Min) if d.is_float() => ("pos_inf()", "minimum_f32(a, b)"),
        (DType::I32, ReduceOp::Sum) => ("0", "a + b"),
        (DType::I32, ReduceOp::Max) => ("-2147483647 - 1", "max(a, b)"),
        (DType::I32, ReduceOp::Min) => ("2147483647", "min(a, b)"),
        (DType::U8, ReduceOp::Sum) => ("0u", "(a + b) & 0xffu"),
        (DType::U8, ReduceOp::Min) => ("255u", "min(a, b)"),
        (DType::Bool, ReduceOp::Min) => ("1u", "min(a, b)"),
        (_, ReduceOp::Sum) => ("0u", "a + b"),
        (_, ReduceOp::Max) => ("0u", "max(a, b)"),
        (_, ReduceOp::Min) => ("4294967295u", "min(a, b)"),
    };
    let name = op.name();
    let mut source = header(1, dtype, target);
    let _ = write!(
        source,
        "fn identity() -> T {{\n    return {identity};\n}}\n\
         fn combine(a: T, b: T) -> T {{\n    return {combine};\n}}\n"
    );
    source.push_str(&load_accumulated("load_in", 0, dtype, target));
    source.push_str(store_accumulator(dtype));
    source.push_str(REDUCE_AXES);
    source.push_str(REDUCE);
    let outputs: usize = (0..shape.len())
        .filter(|d| !axes.contains(d))
        .map(|d| shape[d])
        .product();
    let group: usize = axes.iter().map(|&d| shape[d]).product();
    let mut params = vec![param(name, outputs)?, param(name, group)?];
    params.extend(axis_params(name, shape, axes)?);
    Ok(KernelSpec {
        source,
        params,
        workgroups: workgroups_of(name, outputs)?,
        bound: vec![0],
        status: false,
        launch: None,
    })
}

/// Index (u32) of the first maximum of contiguous `shape` along `axis`;
/// the first NaN counts as the maximum.
pub fn argmax(
    dtype: DType,
    shape: &[usize],
    axis: usize,
    target: Target,
) -> Result<KernelSpec, KernelError> {
    let (lowest, nan_of) = match dtype {
        d if d.is_float() => ("-pos_inf()", "is_nan_f32(v)"),
        DType::I32 => ("-2147483647 - 1", "false"),
        _ => ("0u", "false"),
    };
    let mut source = header(1, dtype, target);
    let _ = write!(
        source,
        "fn lowest() -> T {{\n    return {lowest};\n}}\n\
         fn nan_of(v: T) -> bool {{\n    return {nan_of};\n}}\n"
    );
    source.push_str(&load_accumulated("load_in", 0, dtype, target));
    source.push_str(REDUCE_AXES);
    source.push_str(ARGMAX);
    let outputs: usize = (0..shape.len())
        .filter(|&d| d != axis)
        .map(|d| shape[d])
        .product();
    let group = shape.get(axis).copied().unwrap_or(1);
    let mut params = vec![param("argmax", outputs)?, param("argmax", group)?];
    params.extend(axis_params("argmax", shape, &[axis])?);
    Ok(KernelSpec {
        source,
        params,
        workgroups: workgroups_of("argmax", outputs)?,
        bound: vec![0],
        status: false,
        launch: None,
    })
}

/// The stable order (i32 indices) of contiguous `shape` along `axis`,
/// ascending or descending, NaN above every number: one invocation per
/// element counts the elements of its row that sort before it and writes
/// its index at that place, so a row of `n` costs `n²` comparisons spread
/// over `n` invocations, with no scratch memory.
pub fn argsort(
    dtype: DType,
    shape: &[usize],
    axis: usize,
    descending: bool,
    target: Target,
) -> Result<KernelSpec, KernelError> {
    let nan_of = if dtype.is_float() {
        "is_nan_f32(v)"
    } else {
        "false"
    };
    let mut source = header(1, dtype, target);
    let _ = write!(
        source,
        "const DESCENDING: bool = {descending};\n\
         fn nan_of(v: T) -> bool {{\n    return {nan_of};\n}}\n"
    );
    source.push_str(&load_accumulated("load_in", 0, dtype, target));
    source.push_str(REDUCE_AXES);
    source.push_str(ARGSORT);
    let elements: usize = shape.iter().product();
    let n = shape.get(axis).copied().unwrap_or(1);
    let mut params = vec![param("argsort", elements)?, param("argsort", n)?];
    params.extend(axis_params("argsort", shape, &[axis])?);
    Ok(KernelSpec {
        source,
        params,
        // The kernel's workgroups hold 64 invocations, one per element.
        workgroups: workgroups_of("argsort", elements.div_ceil(64))?,
        bound: vec![0],
        status: false,
        launch: None,
    })
}

/// Which matmul kernel computes a product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatmulVariant {
    /// 64×32 output blocks, 8×4 per invocation, staged through workgroup
    /// memory as vec4s (read from the operands a vec4 at a time where the
    /// inner and output widths are multiples of four).
    Tiled,
    /// One workgroup per output element splitting the inner dimension:
    /// for few outputs and a long inner dimension.
    Skinny,
    /// One invocation per output element reading global memory (a
    /// baseline for benchmarks).
    Naive,
}

impl MatmulVariant {
    /// The variant suited to `outputs` output elements and inner size `k`.
    pub fn choose(outputs: usize, k: usize) -> MatmulVariant {
        if outputs <= 4096 && k >= 256 {
            MatmulVariant::Skinny
        } else {
            MatmulVariant::Tiled
        }
    }
}

/// A batched product `[..., m, k] @ [..., k, n]` of contiguous operands
/// with broadcast batch dims, into contiguous `out_shape`. An operand
/// marked in `transposed` is stored with its last two axes swapped
/// (`[..., k, m]` for a, `[..., n, k]` for b) and read in place through
/// its strides, so `g·wᵀ` and `xᵀ·g` need no transposed copy.
pub fn matmul(
    variant: MatmulVariant,
    dtype: DType,
    a_shape: &[usize],
    b_shape: &[usize],
    out_shape: &[usize],
    transposed: [bool; 2],
    target: Target,
) -> Result<KernelSpec, KernelError> {
    let bad = || KernelError::Unsupported {
        op: "matmul".into(),
        dtypes: format!("{dtype} of shapes {a_shape:?} @ {b_shape:?}"),
    };
    if a_shape.len() < 2 || b_shape.len() < 2 || out_shape.len() < 2 || dtype == DType::Bool {
        return Err(bad());
    }
    let (ra, rb, ro) = (a_shape.len(), b_shape.len(), out_shape.len());
    // The logical `[m, k]` and `[k, n]` of the stored matrices.
    let (m, k) = match transposed[0] {
        false => (a_shape[ra - 2], a_shape[ra - 1]),
        true => (a_shape[ra - 1], a_shape[ra - 2]),
    };
    let n = match transposed[1] {
        false => b_shape[rb - 1],
        true => b_shape[rb - 2],
    };
    let batch_shape = &out_shape[..ro - 2];
    let batches: usize = batch_shape.iter().product();
    let a_batch = View::broadcast(dtype, &a_shape[..ra - 2], batch_shape);
    let b_batch = View::broadcast(dtype, &b_shape[..rb - 2], batch_shape);
    let mut params = vec![
        param("matmul", m)?,
        param("matmul", n)?,
        param("matmul", k)?,
        param("matmul", batches)?,
        param("matmul", batch_shape.len())?,
    ];
    for &d in batch_shape {
        params.push(param("matmul", d)?);
    }
    for (view, size) in [(&a_batch, m * k), (&b_batch, k * n)] {
        for &s in &view.strides {
            params.push(param("matmul", s * size)?);
        }
    }
    // The tiled kernel reads a row four elements at a time: one vec4 load
    // where rows (and so batch matrices) start at multiples of four and
    // the four are contiguous (not along a transposed operand's k). An
    // empty operand keeps its word binding (a vec4 binding needs 16 bytes).
    let vector = |shape: &[usize], width: usize, transposed: bool| {
        let tiled = variant == MatmulVariant::Tiled;
        let nonempty = shape.iter().all(|&d| d > 0);
        vec4_buffer(dtype, target)
            .filter(|_| tiled && nonempty && !transposed && width.is_multiple_of(4))
    };
    let (a_vec, b_vec) = (
        vector(a_shape, k, transposed[0]),
        vector(b_shape, n, transposed[1]),
    );
    let scalar = buffer_type(dtype, target);
    let mut source = header_bound(
        &[(0, a_vec.unwrap_or(scalar)), (1, b_vec.unwrap_or(scalar))],
        dtype,
        target,
    );
    let zero = match dtype {
        d if d.is_float() => "0.0",
        DType::I32 => "0",
        _ => "0u",
    };
    let _ = writeln!(source, "fn zero() -> T {{\n    return {zero};\n}}");
    source.push_str(store_accumulator(dtype));
    // Element (r, c) of a's `[m, k]` matrix and of b's `[k, n]` matrix,
    // counted from the matrix's first element (params: m, n, k).
    let (a_at, b_at) = (
        if transposed[0] {
            "c * params[0] + r"
        } else {
            "r * params[2] + c"
        },
        if transposed[1] {
            "c * params[2] + r"
        } else {
            "r * params[1] + c"
        },
    );
    let _ = writeln!(
        source,
        "fn a_at(r: u32, c: u32) -> u32 {{\n    return {a_at};\n}}\n\
         fn b_at(r: u32, c: u32) -> u32 {{\n    return {b_at};\n}}"
    );
    source.push_str(MATMUL_COMMON);
    let outputs = batches * m * n;
    let workgroups = match variant {
        MatmulVariant::Tiled => {
            for (name, k, vector) in [("a", 0, a_vec), ("b", 1, b_vec)] {
                if vector.is_none() {
                    source.push_str(&load_accumulated(&format!("load_{name}"), k, dtype, target));
                }
                let four = format!("load_{name}4");
                let scalar = format!("load_{name}");
                let at = format!("{name}_at");
                source.push_str(&load_four(&four, &scalar, &at, k, dtype, vector.is_some()));
            }
            source.push_str(MATMUL_TILED);
            batches * m.div_ceil(64) * n.div_ceil(32)
        }
        MatmulVariant::Skinny => {
            source.push_str(&load_accumulated("load_a", 0, dtype, target));
            source.push_str(&load_accumulated("load_b", 1, dtype, target));
            source.push_str(MATMUL_SKINNY);
            outputs
        }
        MatmulVariant::Naive => {
            source.push_str(&load_accumulated("load_a", 0, dtype, target));
            source.push_str(&load_accumulated("load_b", 1, dtype, target));
            source.push_str(MATMUL_NAIVE);
            outputs.div_ceil(256)
        }
    };
    param("matmul", outputs)?;
    Ok(KernelSpec {
        source,
        params,
        workgroups: workgroups_of("matmul", workgroups)?,
        bound: vec![0, 1],
        status: false,
        launch: None,
    })
}
