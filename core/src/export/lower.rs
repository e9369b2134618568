//! Each op family as StableHLO, with Kiln's meaning where StableHLO's op
//! means something else (integer division by zero, saturating casts,
//! half-precision math computed in f32 and rounded once, a switch index
//! clamped to its branches).

use super::mlir::{join, tensor_type, unsupported, Emitter, Value};
use crate::data::HostData;
use crate::error::Result;
use crate::ir::graph::{Graph, ValueId, ValueKind};
use crate::ops::control::{ControlCall, ControlKind};
use crate::ops::fused::{step_avals, FusedArg, FusedKernel};
use crate::ops::quant::{QuantFormat, QuantKind, QuantPart, NF4_LEVELS};
use crate::ops::{BinaryOp, Op, ReduceOp, ShapeCx, SliceAxis, UnaryOp};
use crate::shape::{Aval, Dim};
use crate::DType;

/// Lowers `graph` with its inputs bound to `inputs`; returns its outputs.
pub(crate) fn lower_graph(
    e: &mut Emitter<'_>,
    graph: &Graph,
    inputs: &[Value],
) -> Result<Vec<Value>> {
    // Per value its StableHLO values: one, or a control node's results.
    let mut values: Vec<Vec<Value>> = Vec::with_capacity(graph.nodes.len());
    for (id, node) in graph.nodes.iter().enumerate() {
        let lowered = match &node.kind {
            ValueKind::Input(i) => vec![inputs.get(*i).cloned().ok_or_else(|| {
                unsupported(format!(
                    "value {id} reads argument {i}, which the graph lacks"
                ))
            })?],
            ValueKind::Constant(literal) => vec![e.constant(&literal.0, node.aval.shape.dims())?],
            ValueKind::Op(Op::Get { index, .. }) => {
                let results = &values[node.inputs[0]];
                vec![results.get(*index).cloned().ok_or_else(|| {
                    unsupported(format!(
                        "value {id} reads result {index} of a control op without it"
                    ))
                })?]
            }
            ValueKind::Op(op) => {
                let operands: Vec<Value> =
                    node.inputs.iter().map(|&i| values[i][0].clone()).collect();
                lower_op(e, op, &operands, &node.aval, id)?
            }
        };
        values.push(lowered);
    }
    Ok(graph
        .outputs
        .iter()
        .map(|&o| values[o][0].clone())
        .collect())
}

/// One op of value `id` over `x` (its lowered operands), giving `out`:
/// one arm per op family, each short or a call, so the whole mapping
/// reads in one place (hence longer than a function usually is).
fn lower_op(
    e: &mut Emitter<'_>,
    op: &Op,
    x: &[Value],
    out: &Aval,
    id: ValueId,
) -> Result<Vec<Value>> {
    let dims = out.shape.dims();
    let one = |v: Value| Ok(vec![v]);
    match op {
        Op::Unary(u) => one(unary(e, *u, &x[0])?),
        Op::Binary(b) => one(binary(e, *b, &x[0], &x[1], dims)?),
        Op::Select => {
            let c = e.broadcast(&x[0], dims)?;
            let a = e.broadcast(&x[1], dims)?;
            let b = e.broadcast(&x[2], dims)?;
            one(e.select(&c, &a, &b))
        }
        Op::Cast(d) => one(cast(e, &x[0], *d)?),
        Op::Reduce { op, axes, keepdims } => one(reduce(e, *op, axes, *keepdims, &x[0], dims)?),
        Op::ArgMax { axis, .. } => one(argmax(e, *axis, &x[0], dims)?),
        Op::Argsort { axis, descending } => one(argsort(e, *axis, *descending, &x[0])?),
        Op::Matmul => one(matmul(e, &x[0], &x[1], [false, false], dims)?),
        Op::TransposedMatmul { transposed } => one(matmul(e, &x[0], &x[1], *transposed, dims)?),
        Op::Reshape(_) => one(e.reshape(&x[0], dims)?),
        Op::StopGradient => one(x[0].clone()),
        Op::Permute(p) => {
            let rhs = format!(
                "stablehlo.transpose {}, dims = [{}] : ({}) -> {}",
                x[0].name,
                join(p),
                x[0].ty(),
                tensor_type(dims, out.dtype)
            );
            one(e.op(&rhs, dims, out.dtype))
        }
        Op::BroadcastTo(_) => one(e.broadcast(&x[0], dims)?),
        Op::Slice(axes) => one(slice(e, axes, &x[0], dims)?),
        Op::Concat { axis } => {
            let names: Vec<&str> = x.iter().map(|v| v.name.as_str()).collect();
            let types: Vec<String> = x.iter().map(Value::ty).collect();
            let rhs = format!(
                "stablehlo.concatenate {}, dim = {axis} : ({}) -> {}",
                names.join(", "),
                types.join(", "),
                tensor_type(dims, out.dtype)
            );
            one(e.op(&rhs, dims, out.dtype))
        }
        Op::Take { axis } => one(take(e, *axis, &x[0], &x[1], dims)?),
        Op::ScatterAdd { axis, .. } => one(scatter_add(e, *axis, &x[0], &x[1], dims)?),
        Op::PadSlice { axes, .. } => one(pad_slice(e, axes, &x[0], dims)?),
        Op::DynamicSlice { sizes } => {
            let starts = start_indices(e, &x[1..])?;
            let rhs = format!(
                "stablehlo.dynamic_slice {}, {}, sizes = [{}] : ({}, {}) -> {}",
                x[0].name,
                names(&starts),
                join(&known_dims(sizes.dims(), "dynamic_slice's window")?),
                x[0].ty(),
                types(&starts),
                tensor_type(dims, out.dtype)
            );
            one(e.op(&rhs, dims, out.dtype))
        }
        Op::DynamicUpdateSlice => {
            let starts = start_indices(e, &x[2..])?;
            let rhs = format!(
                "stablehlo.dynamic_update_slice {}, {}, {} : ({}, {}, {}) -> {}",
                x[0].name,
                x[1].name,
                names(&starts),
                x[0].ty(),
                x[1].ty(),
                types(&starts),
                x[0].ty()
            );
            one(e.op(&rhs, dims, out.dtype))
        }
        Op::DimSize { axes, dtype } => {
            let mut count = e.scalar(1.0, DType::I32);
            for &a in axes {
                let d = e.dim_value(&x[0].dims[a])?;
                count = e.binary("multiply", &count, &d);
            }
            one(e.convert(&count, *dtype))
        }
        Op::Iota { dtype, .. } => one(iota(e, 0, dims, *dtype)?),
        Op::Fused(kernel) => one(fused(e, kernel, x)?),
        Op::Kernel(k) => Err(unsupported(format!(
            "value {id} is the user kernel `{}`, whose WGSL has no StableHLO form; \
             write it as a composition of Kiln ops (or a custom op over one) to export it",
            k.kernel.name()
        ))),
        Op::Custom(c) => {
            let avals = avals_of(x);
            let body = c.forward_graph(&avals.iter().collect::<Vec<_>>())?;
            lower_graph(e, &body, x)
        }
        Op::Control(call) => control(e, call, x),
        Op::Implicit(i) => Err(unsupported(format!(
            "value {id} is the implicit value `{}`, which implicit lowering left in the graph",
            i.kind()
        ))),
        Op::Quant(q) => match q.kind {
            QuantKind::Dequantize => one(dequantize(e, q.format, x)?),
            QuantKind::Matmul { transpose } => {
                let w = dequantize(e, q.format, &x[1..])?;
                one(matmul(e, &x[0], &w, [false, transpose], dims)?)
            }
            QuantKind::GatherMatmul { transpose } => {
                let weight = 2 + usize::from(q.format.has_biases());
                let w = dequantize(e, q.format, &x[1..=weight])?;
                let indices = [&x[weight + 1], &x[weight + 2]];
                one(gather_matmul(e, &x[0], &w, indices, transpose, dims)?)
            }
            QuantKind::Quantize(part) => one(quantize(e, q.format, part, &x[0], dims)?),
        },
        Op::Get { .. } => Err(unsupported(format!(
            "value {id}: a `get` outside its graph"
        ))),
    }
}

/// The avals of lowered values.
fn avals_of(values: &[Value]) -> Vec<Aval> {
    values
        .iter()
        .map(|v| Aval::new(crate::shape::Shape(v.dims.clone()), v.dtype))
        .collect()
}

fn names(values: &[Value]) -> String {
    values
        .iter()
        .map(|v| v.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn types(values: &[Value]) -> String {
    values.iter().map(Value::ty).collect::<Vec<_>>().join(", ")
}

/// The sizes of `dims`, which StableHLO needs static (`what` says where).
fn known_dims(dims: &[Dim], what: &str) -> Result<Vec<usize>> {
    dims.iter()
        .map(|d| {
            d.known().ok_or_else(|| {
                unsupported(format!(
                    "{what} has the symbolic size {d}, which StableHLO needs static"
                ))
            })
        })
        .collect()
}

/// True for the half-precision dtypes Kiln computes in f32.
fn is_half(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
}

/// `f` computed in f32 for half-precision operands and rounded once back,
/// as Kiln's executors compute them.
fn via_f32(
    e: &mut Emitter<'_>,
    x: &[&Value],
    f: impl FnOnce(&mut Emitter<'_>, &[Value]) -> Result<Value>,
) -> Result<Value> {
    let dtype = x[0].dtype;
    if !is_half(dtype) {
        let owned: Vec<Value> = x.iter().map(|v| (*v).clone()).collect();
        return f(e, &owned);
    }
    let wide: Vec<Value> = x.iter().map(|v| e.convert(v, DType::F32)).collect();
    let r = f(e, &wide)?;
    Ok(if r.dtype == DType::F32 {
        e.convert(&r, dtype)
    } else {
        r
    })
}

fn unary(e: &mut Emitter<'_>, op: UnaryOp, x: &Value) -> Result<Value> {
    let unsigned = matches!(x.dtype, DType::U32 | DType::U8);
    via_f32(e, &[x], |e, v| {
        let x = &v[0];
        Ok(match op {
            UnaryOp::Neg => e.unary("negate", x),
            UnaryOp::Abs if unsigned => x.clone(),
            UnaryOp::Abs => e.unary("abs", x),
            UnaryOp::Exp => e.unary("exponential", x),
            UnaryOp::Log => e.unary("log", x),
            UnaryOp::Sin => e.unary("sine", x),
            UnaryOp::Cos => e.unary("cosine", x),
            UnaryOp::Tanh => e.unary("tanh", x),
            UnaryOp::Sqrt => e.unary("sqrt", x),
            UnaryOp::Rsqrt => e.unary("rsqrt", x),
            UnaryOp::Sigmoid => e.unary("logistic", x),
            UnaryOp::Relu => {
                let zero = e.splat_like(0.0, x)?;
                e.binary("maximum", x, &zero)
            }
            UnaryOp::Erf => {
                let rhs = format!("chlo.erf {} : {} -> {}", x.name, x.ty(), x.ty());
                e.op(&rhs, &x.dims, x.dtype)
            }
        })
    })
}

fn binary(e: &mut Emitter<'_>, op: BinaryOp, a: &Value, b: &Value, dims: &[Dim]) -> Result<Value> {
    let a = e.broadcast(a, dims)?;
    let b = e.broadcast(b, dims)?;
    let direction = match op {
        BinaryOp::Eq => Some("EQ"),
        BinaryOp::Ne => Some("NE"),
        BinaryOp::Lt => Some("LT"),
        BinaryOp::Le => Some("LE"),
        BinaryOp::Gt => Some("GT"),
        BinaryOp::Ge => Some("GE"),
        _ => None,
    };
    if let Some(direction) = direction {
        return Ok(e.compare(direction, &a, &b));
    }
    if a.dtype == DType::Bool {
        // Bool takes only maximum and minimum: "or" and "and".
        let name = if op == BinaryOp::Maximum { "or" } else { "and" };
        return Ok(e.binary(name, &a, &b));
    }
    let float = a.dtype.is_float();
    via_f32(e, &[&a, &b], |e, v| {
        let (a, b) = (&v[0], &v[1]);
        Ok(match op {
            BinaryOp::Add => e.binary("add", a, b),
            BinaryOp::Sub => e.binary("subtract", a, b),
            BinaryOp::Mul => e.binary("multiply", a, b),
            BinaryOp::Div if float => e.binary("divide", a, b),
            BinaryOp::Div => integer_divide(e, a, b)?,
            BinaryOp::Pow => e.binary("power", a, b),
            BinaryOp::Maximum => e.binary("maximum", a, b),
            _ => e.binary("minimum", a, b),
        })
    })
}

/// Kiln's integer division: truncates toward zero and yields 0 where the
/// divisor is 0 (StableHLO leaves division by zero to the implementation).
fn integer_divide(e: &mut Emitter<'_>, a: &Value, b: &Value) -> Result<Value> {
    let zero = e.splat_like(0.0, b)?;
    let one = e.splat_like(1.0, b)?;
    let by_zero = e.compare("EQ", b, &zero);
    let safe = e.select(&by_zero, &one, b);
    let q = e.binary("divide", a, &safe);
    Ok(e.select(&by_zero, &zero, &q))
}

/// Kiln's cast: floats round to nearest; float → integer truncates toward
/// zero, saturates, and maps NaN to 0; integer → integer saturates;
/// anything → bool is `x != 0`. StableHLO's `convert` leaves out-of-range
/// values to the implementation, so they are clamped first.
pub(crate) fn cast(e: &mut Emitter<'_>, x: &Value, to: DType) -> Result<Value> {
    let from = x.dtype;
    if from == to {
        return Ok(x.clone());
    }
    if to == DType::Bool {
        return e.compare_scalar("NE", x, 0.0);
    }
    if is_half(to) && matches!(from, DType::I32 | DType::U32) {
        return integer_to_half(e, x, to);
    }
    if from == DType::Bool || to.is_float() {
        return Ok(e.convert(x, to));
    }
    if from.is_float() {
        return float_to_integer(e, x, to);
    }
    // Integer to integer: clamp to the target's range in the source type.
    let (low, high) = match to {
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        DType::U32 => (0.0, u32::MAX as f64),
        _ => (0.0, u8::MAX as f64),
    };
    let (src_low, src_high) = match from {
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        DType::U32 => (0.0, u32::MAX as f64),
        _ => (0.0, u8::MAX as f64),
    };
    let mut v = x.clone();
    if low > src_low {
        let l = e.splat_like(low, &v)?;
        v = e.binary("maximum", &v, &l);
    }
    if high < src_high {
        let h = e.splat_like(high, &v)?;
        v = e.binary("minimum", &v, &h);
    }
    Ok(e.convert(&v, to))
}

/// An i32 or u32 rounded once to f16 or bf16. XLA converts through f32,
/// rounding twice (16_842_753 → 16_842_752 → 16_777_216 in bf16, where
/// Kiln gives 16_908_288), so the f32 step rounds to odd instead: the
/// nearest f32 with an odd last bit when the integer is not exact in f32,
/// which then rounds to nearest as the exact integer would.
fn integer_to_half(e: &mut Emitter<'_>, x: &Value, to: DType) -> Result<Value> {
    // StableHLO has i64, which holds every i32, u32 and f32-rounded one.
    let t64 = tensor_type(&x.dims, DType::I32).replace("i32>", "i64>");
    let to_i64 = |e: &mut Emitter<'_>, v: &Value| {
        let name = e.fresh();
        e.line(&format!(
            "{name} = stablehlo.convert {} : ({}) -> {t64}",
            v.name,
            v.ty()
        ));
        name
    };
    let exact = to_i64(e, x);
    let f = e.convert(x, DType::F32);
    let back = to_i64(e, &f);
    let residual = e.fresh();
    e.line(&format!(
        "{residual} = stablehlo.subtract {exact}, {back} : {t64}"
    ));
    let zero64 = e.fresh();
    e.line(&format!(
        "{zero64} = stablehlo.constant dense<0> : tensor<i64>"
    ));
    let zeros64 = e.fresh();
    e.line(&format!(
        "{zeros64} = stablehlo.broadcast_in_dim {zero64}, dims = [] : (tensor<i64>) -> {t64}"
    ));
    let compare = |e: &mut Emitter<'_>, dir: &str| {
        let rhs = format!(
            "stablehlo.compare {dir}, {residual}, {zeros64}, SIGNED : ({t64}, {t64}) -> {}",
            tensor_type(&x.dims, DType::Bool)
        );
        e.op(&rhs, &x.dims, DType::Bool)
    };
    let inexact = compare(e, "NE");
    let above = compare(e, "GT");
    let rhs = format!(
        "stablehlo.bitcast_convert {} : ({}) -> {}",
        f.name,
        f.ty(),
        tensor_type(&x.dims, DType::I32)
    );
    let bits = e.op(&rhs, &x.dims, DType::I32);
    let one = e.splat_like(1.0, &bits)?;
    let odd_bit = e.binary("and", &bits, &one);
    let even = e.compare_scalar("EQ", &odd_bit, 0.0)?;
    // The other f32 neighbour of the integer: one ulp away from zero when
    // the residual has the integer's sign (f is nearer zero), else toward.
    let negative = e.compare_scalar("LT", &f, 0.0)?;
    let away = e.compare("NE", &above, &negative);
    let up = e.binary("add", &bits, &one);
    let down = e.binary("subtract", &bits, &one);
    let neighbour = e.select(&away, &up, &down);
    let fix = e.binary("and", &inexact, &even);
    let odd = e.select(&fix, &neighbour, &bits);
    let rhs = format!(
        "stablehlo.bitcast_convert {} : ({}) -> {}",
        odd.name,
        odd.ty(),
        f.ty()
    );
    let rounded = e.op(&rhs, &x.dims, DType::F32);
    Ok(e.convert(&rounded, to))
}

fn float_to_integer(e: &mut Emitter<'_>, x: &Value, to: DType) -> Result<Value> {
    let xf = e.convert(x, DType::F32);
    // The largest f32 below the target's maximum (which f32 may not hold),
    // and the first f32 past it, from which the result saturates.
    let (low, high, past, max) = match to {
        DType::I32 => (
            -2_147_483_648.0,
            2_147_483_520.0,
            2_147_483_648.0,
            i32::MAX as f64,
        ),
        DType::U32 => (0.0, 4_294_967_040.0, 4_294_967_296.0, u32::MAX as f64),
        _ => (0.0, 255.0, 256.0, 255.0),
    };
    let l = e.splat_like(low, &xf)?;
    let h = e.splat_like(high, &xf)?;
    let clamped = {
        let rhs = format!(
            "stablehlo.clamp {}, {}, {} : {}",
            l.name,
            xf.name,
            h.name,
            xf.ty()
        );
        e.op(&rhs, &xf.dims, DType::F32)
    };
    let mut r = e.convert(&clamped, to);
    let beyond = e.compare_scalar("GE", &xf, past)?;
    let saturated = e.splat_like(max, &r)?;
    r = e.select(&beyond, &saturated, &r);
    let nan = e.compare("NE", &xf, &xf);
    let zero = e.splat_like(0.0, &r)?;
    Ok(e.select(&nan, &zero, &r))
}

/// The identity of `op` over `dtype` and the StableHLO op combining two.
fn reducer(op: ReduceOp, dtype: DType) -> (f64, &'static str) {
    let (low, high) = match dtype {
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        DType::U32 => (0.0, u32::MAX as f64),
        DType::U8 => (0.0, 255.0),
        DType::Bool => (0.0, 1.0),
        _ => (f64::NEG_INFINITY, f64::INFINITY),
    };
    match (op, dtype) {
        (ReduceOp::Sum, _) => (0.0, "add"),
        (ReduceOp::Max, DType::Bool) => (0.0, "or"),
        (ReduceOp::Min, DType::Bool) => (1.0, "and"),
        (ReduceOp::Max, _) => (low, "maximum"),
        (ReduceOp::Min, _) => (high, "minimum"),
    }
}

fn reduce(
    e: &mut Emitter<'_>,
    op: ReduceOp,
    axes: &[usize],
    keepdims: bool,
    x: &Value,
    out: &[Dim],
) -> Result<Value> {
    let kept: Vec<Dim> = x
        .dims
        .iter()
        .enumerate()
        .filter(|(i, _)| !axes.contains(i))
        .map(|(_, d)| d.clone())
        .collect();
    let reduced = via_f32(e, &[x], |e, v| {
        let x = &v[0];
        let (identity, combine) = reducer(op, x.dtype);
        let init = e.scalar(identity, x.dtype);
        let rhs = format!(
            "stablehlo.reduce({} init: {}) applies stablehlo.{combine} across dimensions = [{}] : ({}, {}) -> {}",
            x.name,
            init.name,
            join(axes),
            x.ty(),
            init.ty(),
            tensor_type(&kept, x.dtype)
        );
        Ok(e.op(&rhs, &kept, x.dtype))
    })?;
    if keepdims {
        e.reshape(&reduced, out)
    } else {
        Ok(reduced)
    }
}

/// `iota` along `axis` of `dims` (the dynamic form for symbolic dims).
fn iota(e: &mut Emitter<'_>, axis: usize, dims: &[Dim], dtype: DType) -> Result<Value> {
    let ty = tensor_type(dims, dtype);
    if dims.iter().all(|d| d.known().is_some()) {
        return Ok(e.op(&format!("stablehlo.iota dim = {axis} : {ty}"), dims, dtype));
    }
    let shape = e.shape_tensor(dims)?;
    let rhs = format!(
        "stablehlo.dynamic_iota {}, dim = {axis} : ({}) -> {ty}",
        shape.name,
        shape.ty()
    );
    Ok(e.op(&rhs, dims, dtype))
}

/// The first index of the maximum along `axis`, NaN counting as the
/// maximum: a two-operand reduction of (value, index) pairs.
fn argmax(e: &mut Emitter<'_>, axis: usize, x: &Value, out: &[Dim]) -> Result<Value> {
    let index = iota(e, axis, &x.dims, DType::I32)?;
    let kept: Vec<Dim> = x
        .dims
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != axis)
        .map(|(_, d)| d.clone())
        .collect();
    let lowest = match x.dtype {
        DType::I32 => i32::MIN as f64,
        DType::U32 | DType::U8 | DType::Bool => 0.0,
        _ => f64::NEG_INFINITY,
    };
    let init = e.scalar(lowest, x.dtype);
    let init_index = e.scalar(0.0, DType::I32);
    let name = e.fresh();
    let (a, b, ia, ib) = (e.fresh(), e.fresh(), e.fresh(), e.fresh());
    let st = tensor_type(&[], x.dtype);
    let it = tensor_type(&[], DType::I32);
    e.line(&format!(
        "{name}:2 = stablehlo.reduce({} init: {}), ({} init: {}) across dimensions = [{axis}] : ({}, {}, {st}, {it}) -> ({}, {})",
        x.name,
        init.name,
        index.name,
        init_index.name,
        x.ty(),
        index.ty(),
        tensor_type(&kept, x.dtype),
        tensor_type(&kept, DType::I32)
    ));
    e.line(&format!(
        " reducer({a}: {st}, {b}: {st}) ({ia}: {it}, {ib}: {it}) {{"
    ));
    e.nested(|e| {
        let av = Value::block_scalar(a, x.dtype);
        let bv = Value::block_scalar(b, x.dtype);
        let iav = Value::block_scalar(ia, DType::I32);
        let ibv = Value::block_scalar(ib, DType::I32);
        let greater = e.compare("GT", &av, &bv);
        let wins = if x.dtype.is_float() {
            let nan = e.compare("NE", &av, &av);
            e.binary("or", &greater, &nan)
        } else {
            greater
        };
        let equal = e.compare("EQ", &av, &bv);
        let earlier = e.compare("LT", &iav, &ibv);
        let tie = e.binary("and", &equal, &earlier);
        let take_a = e.binary("or", &wins, &tie);
        let value = e.select(&wins, &av, &bv);
        let idx = e.select(&take_a, &iav, &ibv);
        e.line(&format!(
            "stablehlo.return {}, {} : {st}, {it}",
            value.name, idx.name
        ));
    });
    e.line("}");
    let result = Value {
        name: format!("{name}#1"),
        dims: kept,
        dtype: DType::I32,
    };
    let result = e.convert(&result, DType::U32);
    e.reshape(&result, out)
}

/// The `i32` indices that sort `x` along `axis`, as Kiln's argsort: a
/// stable two-operand `stablehlo.sort` of (value, index), whose comparator
/// puts NaN after every number (before, largest first) and compares as
/// numbers otherwise, so `-0` and `0` tie and keep their order.
fn argsort(e: &mut Emitter<'_>, axis: usize, descending: bool, x: &Value) -> Result<Value> {
    let index = iota(e, axis, &x.dims, DType::I32)?;
    let name = e.fresh();
    let (a, b, ia, ib) = (e.fresh(), e.fresh(), e.fresh(), e.fresh());
    let st = tensor_type(&[], x.dtype);
    let it = tensor_type(&[], DType::I32);
    e.line(&format!(
        "{name}:2 = \"stablehlo.sort\"({}, {}) <{{dimension = {axis} : i64, is_stable = true}}> ({{",
        x.name, index.name
    ));
    e.line(&format!(
        "^bb0({a}: {st}, {b}: {st}, {ia}: {it}, {ib}: {it}):"
    ));
    e.nested(|e| {
        let (av, bv) = (
            Value::block_scalar(a, x.dtype),
            Value::block_scalar(b, x.dtype),
        );
        let (first, second) = if descending { (&bv, &av) } else { (&av, &bv) };
        // `first < second`, NaN above every number.
        let mut before = e.compare("LT", first, second);
        if x.dtype.is_float() {
            let first_number = e.compare("EQ", first, first);
            let second_nan = e.compare("NE", second, second);
            let only_second_nan = e.binary("and", &first_number, &second_nan);
            before = e.binary("or", &before, &only_second_nan);
        }
        e.line(&format!(
            "stablehlo.return {} : {}",
            before.name,
            tensor_type(&[], DType::Bool)
        ));
    });
    e.line(&format!(
        "}}) : ({}, {}) -> ({}, {})",
        x.ty(),
        index.ty(),
        x.ty(),
        index.ty()
    ));
    Ok(Value {
        name: format!("{name}#1"),
        dims: x.dims.clone(),
        dtype: DType::I32,
    })
}

/// `[…, m, k] @ […, k, n]` with broadcast batch dims as one `dot_general`
/// (operands stored with their last two axes swapped where `transposed`
/// says). Half precision multiplies in f32 and rounds once, as Kiln does.
fn matmul(
    e: &mut Emitter<'_>,
    a: &Value,
    b: &Value,
    transposed: [bool; 2],
    out: &[Dim],
) -> Result<Value> {
    let batch = &out[..out.len() - 2];
    let nb = batch.len();
    let with_batch = |x: &Value| -> Vec<Dim> {
        let r = x.dims.len();
        batch.iter().chain(&x.dims[r - 2..]).cloned().collect()
    };
    let (a_dims, b_dims) = (with_batch(a), with_batch(b));
    let a = e.broadcast(a, &a_dims)?;
    let b = e.broadcast(b, &b_dims)?;
    let ka = if transposed[0] { nb } else { nb + 1 };
    let kb = if transposed[1] { nb + 1 } else { nb };
    let batch_dims: Vec<usize> = (0..nb).collect();
    via_f32(e, &[&a, &b], |e, v| {
        let (a, b) = (&v[0], &v[1]);
        let batching = if nb > 0 {
            let list = join(&batch_dims);
            format!("batching_dims = [{list}] x [{list}], ")
        } else {
            String::new()
        };
        let rhs = format!(
            "stablehlo.dot_general {}, {}, {batching}contracting_dims = [{ka}] x [{kb}], precision = [HIGHEST, HIGHEST] : ({}, {}) -> {}",
            a.name,
            b.name,
            a.ty(),
            b.ty(),
            tensor_type(out, a.dtype)
        );
        Ok(e.op(&rhs, out, a.dtype))
    })
}

/// The concrete (start, length, step) of `axis` on an axis of size `n`.
fn static_bounds(axis: &SliceAxis, n: usize) -> (usize, usize, usize) {
    let (start, len) = axis.resolve(n);
    (start, len, axis.step.max(1) as usize)
}

/// One past the last index a slice of `len` from `start` by `step` reads.
fn limit(start: usize, len: usize, step: usize) -> usize {
    if len == 0 {
        start
    } else {
        start + (len - 1) * step + 1
    }
}

/// `axis` normalized on an axis of symbolic size `dim` at run time, as
/// [`SliceAxis::resolve`] does: the start and the limit (`i32` scalars)
/// of `real_dynamic_slice`, whose size `ceil((limit - start) / step)` is
/// then the slice's length.
fn dynamic_bounds(e: &mut Emitter<'_>, axis: &SliceAxis, dim: &Dim) -> Result<(Value, Value)> {
    let n = e.dim_value(dim)?;
    let zero = e.scalar(0.0, DType::I32);
    let clamp = |e: &mut Emitter<'_>, i: i64| {
        let v = e.scalar(i as f64, DType::I32);
        if i < 0 {
            let from_end = e.binary("add", &v, &n);
            e.binary("maximum", &from_end, &zero)
        } else {
            e.binary("minimum", &v, &n)
        }
    };
    let start = clamp(e, axis.start);
    let stop = match axis.stop {
        Some(stop) => clamp(e, stop),
        None => n.clone(),
    };
    let limit = e.binary("maximum", &stop, &start);
    Ok((start, limit))
}

/// A strided slice: `stablehlo.slice`, or `real_dynamic_slice` with
/// bounds computed at run time when an axis is symbolic.
fn slice(e: &mut Emitter<'_>, axes: &[SliceAxis], x: &Value, out: &[Dim]) -> Result<Value> {
    if let Some(sizes) = x
        .dims
        .iter()
        .map(Dim::known)
        .collect::<Option<Vec<usize>>>()
    {
        let parts: Vec<String> = axes
            .iter()
            .zip(&sizes)
            .map(|(axis, &n)| {
                let (start, len, step) = static_bounds(axis, n);
                format!("{start}:{}:{step}", limit(start, len, step))
            })
            .collect();
        let rhs = format!(
            "stablehlo.slice {} [{}] : ({}) -> {}",
            x.name,
            parts.join(", "),
            x.ty(),
            tensor_type(out, x.dtype)
        );
        return Ok(e.op(&rhs, out, x.dtype));
    }
    let (mut starts, mut limits, mut strides) = (Vec::new(), Vec::new(), Vec::new());
    for (axis, dim) in axes.iter().zip(&x.dims) {
        let (start, stop) = dynamic_bounds(e, axis, dim)?;
        starts.push(start);
        limits.push(stop);
        strides.push(e.scalar(axis.step.max(1) as f64, DType::I32));
    }
    let starts = e.vector(&starts)?;
    let limits = e.vector(&limits)?;
    let strides = e.vector(&strides)?;
    let rhs = format!(
        "stablehlo.real_dynamic_slice {}, {}, {}, {} : ({}, {}, {}, {}) -> {}",
        x.name,
        starts.name,
        limits.name,
        strides.name,
        x.ty(),
        starts.ty(),
        limits.ty(),
        strides.ty(),
        tensor_type(out, x.dtype)
    );
    Ok(e.op(&rhs, out, x.dtype))
}

/// Kiln's index wrapping: a negative i32 index counts from the end of an
/// axis of size `n` (once); other integer dtypes are never negative.
fn wrap_negative(e: &mut Emitter<'_>, index: &Value, n: &Dim) -> Result<Value> {
    if index.dtype != DType::I32 {
        return Ok(index.clone());
    }
    let negative = e.compare_scalar("LT", index, 0.0)?;
    let n = e.dim_value(n)?;
    let n = e.broadcast(&n, &index.dims)?;
    let wrapped = e.binary("add", index, &n);
    Ok(e.select(&negative, &wrapped, index))
}

/// The `index_vector_dim` form of an index array: a trailing axis of 1.
fn index_vectors(e: &mut Emitter<'_>, index: &Value) -> Result<Value> {
    let mut dims = index.dims.clone();
    dims.push(Dim::Known(1));
    e.reshape(index, &dims)
}

/// The dims of an operand of rank `rank` that are not `axis`, placed in a
/// gather's result (or a scatter's updates) around `q` index dims.
fn window_dims(rank: usize, axis: usize, q: usize) -> Vec<usize> {
    (0..axis).chain(axis + q..rank - 1 + q).collect()
}

/// NumPy `take` as a `gather`. An index out of range is an error in Kiln
/// and clamped by XLA's gather.
fn take(e: &mut Emitter<'_>, axis: usize, x: &Value, index: &Value, out: &[Dim]) -> Result<Value> {
    if x.dims[axis].known() == Some(0) {
        // A gather's one-row window cannot fit an empty axis: taking
        // nothing from it is the empty result; taking anything is Kiln's
        // run-time `Err`, which a module cannot raise.
        if out.iter().any(|d| d.known() == Some(0)) {
            let zero = e.scalar(0.0, x.dtype);
            return e.broadcast(&zero, out);
        }
        return Err(unsupported(format!(
            "take of {} indices from an empty axis {axis} of {}",
            index.ty(),
            x.ty()
        )));
    }
    let wrapped = wrap_negative(e, index, &x.dims[axis])?;
    let vectors = index_vectors(e, &wrapped)?;
    let q = index.dims.len();
    let mut slice_sizes = known_dims(&x.dims, "a taken array")?;
    slice_sizes[axis] = 1;
    let rhs = format!(
        "\"stablehlo.gather\"({}, {}) <{{dimension_numbers = #stablehlo.gather<offset_dims = [{}], collapsed_slice_dims = [{axis}], start_index_map = [{axis}], index_vector_dim = {q}>, indices_are_sorted = false, slice_sizes = array<i64: {}>}}> : ({}, {}) -> {}",
        x.name,
        vectors.name,
        join(&window_dims(x.dims.len(), axis, q)),
        join(&slice_sizes),
        x.ty(),
        vectors.ty(),
        tensor_type(out, x.dtype)
    );
    Ok(e.op(&rhs, out, x.dtype))
}

/// `scatter_add` as a `scatter` into zeros with an adding body; half
/// precision accumulates in f32 and rounds once, as Kiln does.
fn scatter_add(
    e: &mut Emitter<'_>,
    axis: usize,
    updates: &Value,
    index: &Value,
    out: &[Dim],
) -> Result<Value> {
    let wrapped = wrap_negative(e, index, &out[axis])?;
    let vectors = index_vectors(e, &wrapped)?;
    let q = index.dims.len();
    let rank = out.len();
    via_f32(e, &[updates], |e, v| {
        let updates = &v[0];
        let zero = e.scalar(0.0, updates.dtype);
        let zeros = e.broadcast(&zero, out)?;
        let name = e.fresh();
        let (a, b) = (e.fresh(), e.fresh());
        let st = tensor_type(&[], updates.dtype);
        e.line(&format!(
            "{name} = \"stablehlo.scatter\"({}, {}, {}) <{{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [{}], inserted_window_dims = [{axis}], scatter_dims_to_operand_dims = [{axis}], index_vector_dim = {q}>, unique_indices = false}}> ({{",
            zeros.name,
            vectors.name,
            updates.name,
            join(&window_dims(rank, axis, q))
        ));
        e.line(&format!("^bb0({a}: {st}, {b}: {st}):"));
        e.nested(|e| {
            let av = Value::block_scalar(a, updates.dtype);
            let bv = Value::block_scalar(b, updates.dtype);
            let sum = e.binary("add", &av, &bv);
            e.line(&format!("stablehlo.return {} : {st}", sum.name));
        });
        e.line(&format!(
            "}}) : ({}, {}, {}) -> {}",
            zeros.ty(),
            vectors.ty(),
            updates.ty(),
            zeros.ty()
        ));
        Ok(Value {
            name,
            dims: out.to_vec(),
            dtype: updates.dtype,
        })
    })
}

/// The operand placed at a strided slice of zeros: a `pad` whose interior
/// padding is the stride's gap.
fn pad_slice(e: &mut Emitter<'_>, axes: &[SliceAxis], x: &Value, out: &[Dim]) -> Result<Value> {
    let sizes = known_dims(out, "pad_slice's result")?;
    let zero = e.scalar(0.0, x.dtype);
    let (mut low, mut high, mut interior) = (Vec::new(), Vec::new(), Vec::new());
    for (axis, &n) in axes.iter().zip(&sizes) {
        let (start, len, step) = static_bounds(axis, n);
        if len == 0 {
            return e.broadcast(&zero, out);
        }
        low.push(start);
        interior.push(step - 1);
        high.push(n - limit(start, len, step));
    }
    let rhs = format!(
        "stablehlo.pad {}, {}, low = [{}], high = [{}], interior = [{}] : ({}, {}) -> {}",
        x.name,
        zero.name,
        join(&low),
        join(&high),
        join(&interior),
        x.ty(),
        zero.ty(),
        tensor_type(out, x.dtype)
    );
    Ok(e.op(&rhs, out, x.dtype))
}

/// Run-time start indices as `i32` scalars (u32 ones saturate at
/// `i32::MAX`; XLA then clamps the window inside the array, as Kiln does).
fn start_indices(e: &mut Emitter<'_>, starts: &[Value]) -> Result<Vec<Value>> {
    starts.iter().map(|s| cast(e, s, DType::I32)).collect()
}

/// A fused group written as its members.
fn fused(e: &mut Emitter<'_>, kernel: &FusedKernel, x: &[Value]) -> Result<Value> {
    let avals = avals_of(x);
    let refs: Vec<&Aval> = avals.iter().collect();
    let steps = kernel.steps();
    let step_out = step_avals(steps, &refs, &mut ShapeCx::default())?;
    let mut done: Vec<Value> = Vec::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        let operands: Vec<Value> = step
            .args
            .iter()
            .map(|a| match a {
                FusedArg::Input(k) => x[*k].clone(),
                FusedArg::Step(k) => done[*k].clone(),
            })
            .collect();
        let mut v = lower_op(e, &step.op, &operands, &step_out[i], i)?;
        done.push(v.remove(0));
    }
    done.pop()
        .ok_or_else(|| unsupported("a fused group without steps"))
}

/// A control-flow op: `while` and `scan` as `stablehlo.while`, `switch`
/// as `stablehlo.case`.
fn control(e: &mut Emitter<'_>, call: &ControlCall, x: &[Value]) -> Result<Vec<Value>> {
    let graphs = call.graphs();
    match &call.kind {
        ControlKind::While => {
            let [cond, body] = graphs else {
                return Err(unsupported("a while loop without a condition and a body"));
            };
            let n_consts = call.num_consts;
            let results = while_loop(
                e,
                x,
                |e, carried| {
                    let cond_out = lower_graph(e, cond, carried)?;
                    Ok(cond_out[0].clone())
                },
                |e, carried| {
                    let mut next = carried[..n_consts].to_vec();
                    next.extend(lower_graph(e, body, carried)?);
                    Ok(next)
                },
            )?;
            Ok(results[n_consts..].to_vec())
        }
        ControlKind::Scan { length, reverse } => scan(e, call, length, *reverse, x),
        ControlKind::Switch => switch(e, call, x),
    }
}

/// A `stablehlo.while` over the values `init`: `cond` gives the predicate
/// and `body` the next values from the current ones. Returns the final
/// values.
fn while_loop(
    e: &mut Emitter<'_>,
    init: &[Value],
    cond: impl FnOnce(&mut Emitter<'_>, &[Value]) -> Result<Value>,
    body: impl FnOnce(&mut Emitter<'_>, &[Value]) -> Result<Vec<Value>>,
) -> Result<Vec<Value>> {
    let name = e.fresh();
    let iters: Vec<Value> = init
        .iter()
        .map(|v| Value {
            name: e.fresh(),
            dims: v.dims.clone(),
            dtype: v.dtype,
        })
        .collect();
    let bindings: Vec<String> = iters
        .iter()
        .zip(init)
        .map(|(it, v)| format!("{} = {}", it.name, v.name))
        .collect();
    e.line(&format!(
        "{name}:{} = stablehlo.while({}) : {}",
        init.len(),
        bindings.join(", "),
        types(init)
    ));
    e.line("cond {");
    e.nested(|e| -> Result<()> {
        let p = cond(e, &iters)?;
        e.line(&format!("stablehlo.return {} : {}", p.name, p.ty()));
        Ok(())
    })?;
    e.line("} do {");
    e.nested(|e| -> Result<()> {
        let next = body(e, &iters)?;
        e.line(&format!(
            "stablehlo.return {} : {}",
            names(&next),
            types(&next)
        ));
        Ok(())
    })?;
    e.line("}");
    Ok(init
        .iter()
        .enumerate()
        .map(|(i, v)| Value {
            name: format!("{name}#{i}"),
            dims: v.dims.clone(),
            dtype: v.dtype,
        })
        .collect())
}

/// `scan` as a counted `while` that slices each scanned array at the step
/// and writes each per-step output into its stacked result.
fn scan(
    e: &mut Emitter<'_>,
    call: &ControlCall,
    length: &Dim,
    reverse: bool,
    x: &[Value],
) -> Result<Vec<Value>> {
    let [body] = call.graphs() else {
        return Err(unsupported("a scan without one body"));
    };
    let (nc, nk) = (call.num_consts, call.num_carry);
    let ys_avals = &call.results[nk..];
    let mut init = vec![e.scalar(0.0, DType::I32)];
    init.extend(x.iter().cloned());
    for aval in ys_avals {
        let zero = e.scalar(0.0, aval.dtype);
        init.push(e.broadcast(&zero, aval.shape.dims())?);
    }
    let n_ops = x.len();
    let final_values = while_loop(
        e,
        &init,
        |e, v| {
            let n = e.dim_value(length)?;
            Ok(e.compare("LT", &v[0], &n))
        },
        |e, v| {
            let step = &v[0];
            let at = if reverse {
                let n = e.dim_value(length)?;
                let one = e.scalar(1.0, DType::I32);
                let last = e.binary("subtract", &n, &one);
                e.binary("subtract", &last, step)
            } else {
                step.clone()
            };
            let zero = e.scalar(0.0, DType::I32);
            let mut inputs: Vec<Value> = v[1..=nc + nk].to_vec();
            for xs in &v[1 + nc + nk..=n_ops] {
                let mut window = known_dims(&xs.dims, "a scanned array")?;
                window[0] = 1;
                let mut starts = vec![at.name.clone()];
                starts.extend(std::iter::repeat_n(zero.name.clone(), window.len() - 1));
                let window_dims: Vec<Dim> = window.iter().map(|&n| Dim::Known(n)).collect();
                let rhs = format!(
                    "stablehlo.dynamic_slice {}, {}, sizes = [{}] : ({}, {}) -> {}",
                    xs.name,
                    starts.join(", "),
                    join(&window),
                    xs.ty(),
                    vec!["tensor<i32>"; window.len()].join(", "),
                    tensor_type(&window_dims, xs.dtype)
                );
                let slab = e.op(&rhs, &window_dims, xs.dtype);
                inputs.push(e.reshape(&slab, &xs.dims[1..])?);
            }
            let outs = lower_graph(e, body, &inputs)?;
            let one = e.scalar(1.0, DType::I32);
            let mut next = vec![e.binary("add", step, &one)];
            next.extend(v[1..=nc].iter().cloned());
            next.extend(outs[..nk].iter().cloned());
            next.extend(v[1 + nc + nk..=n_ops].iter().cloned());
            for (acc, y) in v[1 + n_ops..].iter().zip(&outs[nk..]) {
                let mut dims = vec![Dim::Known(1)];
                dims.extend(y.dims.iter().cloned());
                let y1 = e.reshape(y, &dims)?;
                let mut starts = vec![at.name.clone()];
                starts.extend(std::iter::repeat_n(zero.name.clone(), dims.len() - 1));
                let rhs = format!(
                    "stablehlo.dynamic_update_slice {}, {}, {} : ({}, {}, {}) -> {}",
                    acc.name,
                    y1.name,
                    starts.join(", "),
                    acc.ty(),
                    y1.ty(),
                    vec!["tensor<i32>"; dims.len()].join(", "),
                    acc.ty()
                );
                next.push(e.op(&rhs, &acc.dims, acc.dtype));
            }
            Ok(next)
        },
    )?;
    let mut results: Vec<Value> = final_values[1 + nc..1 + nc + nk].to_vec();
    results.extend(final_values[1 + n_ops..].iter().cloned());
    Ok(results)
}

/// `switch` as `stablehlo.case` on the index clamped to the branches (as
/// Kiln and JAX clamp it; `case` would run the last branch for any index
/// out of range, negative ones included).
fn switch(e: &mut Emitter<'_>, call: &ControlCall, x: &[Value]) -> Result<Vec<Value>> {
    let branches = call.graphs();
    let index = cast(e, &x[0], DType::I32)?;
    let low = e.scalar(0.0, DType::I32);
    let high = e.scalar(branches.len().saturating_sub(1) as f64, DType::I32);
    let clamped = {
        let rhs = format!(
            "stablehlo.clamp {}, {}, {} : tensor<i32>",
            low.name, index.name, high.name
        );
        e.op(&rhs, &[], DType::I32)
    };
    let operands = &x[1..];
    let result_types: Vec<String> = call
        .results
        .iter()
        .map(|a| tensor_type(a.shape.dims(), a.dtype))
        .collect();
    let name = e.fresh();
    let count = call.results.len();
    let lhs = if count == 1 {
        name.clone()
    } else {
        format!("{name}:{count}")
    };
    e.line(&format!("{lhs} = \"stablehlo.case\"({}) ({{", clamped.name));
    for (i, branch) in branches.iter().enumerate() {
        if i > 0 {
            e.line("}, {");
        }
        e.nested(|e| -> Result<()> {
            let outs = lower_graph(e, branch, operands)?;
            e.line(&format!(
                "stablehlo.return {} : {}",
                names(&outs),
                types(&outs)
            ));
            Ok(())
        })?;
    }
    let results = if count == 1 {
        result_types[0].clone()
    } else {
        format!("({})", result_types.join(", "))
    };
    e.line(&format!("}}) : (tensor<i32>) -> {results}"));
    Ok(call
        .results
        .iter()
        .enumerate()
        .map(|(i, a)| Value {
            name: if count == 1 {
                name.clone()
            } else {
                format!("{name}#{i}")
            },
            dims: a.shape.dims().to_vec(),
            dtype: a.dtype,
        })
        .collect())
}

/// A quantized weight's values (`parts`: packed codes, scales, biases for
/// the affine format) in the scales' dtype: each code cut from its row's
/// bit stream (two words shifted together, for codes that straddle them),
/// decoded in f32 as Kiln decodes it and rounded once to the dtype.
fn dequantize(e: &mut Emitter<'_>, format: QuantFormat, parts: &[Value]) -> Result<Value> {
    let (packed, scales) = (&parts[0], &parts[1]);
    let rank = packed.dims.len();
    let last = rank - 1;
    let words = known_dims(&packed.dims[last..], "a quantized weight's row")?[0];
    let groups = known_dims(&scales.dims[last..], "a quantized weight's scales")?[0];
    let bits = format.bits() as usize;
    let cols = words * 32 / bits;
    let mut dims = packed.dims.clone();
    dims[last] = Dim::Known(cols);
    let column = |j: usize| (j * bits / 32, (j * bits % 32) as u32);
    let index = |e: &mut Emitter<'_>, next: usize| {
        let data = HostData::I32(
            (0..cols)
                .map(|j| (column(j).0 + next).min(words - 1) as i32)
                .collect(),
        );
        e.constant(&data, &[Dim::Known(cols)])
    };
    let (lo_index, hi_index) = (index(e, 0)?, index(e, 1)?);
    let lo = take(e, last, packed, &lo_index, &dims)?;
    let hi = take(e, last, packed, &hi_index, &dims)?;
    let shifts = HostData::U32((0..cols).map(|j| column(j).1).collect());
    let shift = e.constant(&shifts, &[Dim::Known(cols)])?;
    let shift = e.broadcast(&shift, &dims)?;
    let width = e.splat_like(32.0, &shift)?;
    let back = e.binary("subtract", &width, &shift);
    // StableHLO shifts by 32 or more give 0: a code within one word takes
    // nothing from the next.
    let low_bits = e.binary("shift_right_logical", &lo, &shift);
    let high_bits = e.binary("shift_left", &hi, &back);
    let joined = e.binary("or", &low_bits, &high_bits);
    let mask = e.splat_like(((1u64 << bits) - 1) as f64, &joined)?;
    let code = e.binary("and", &joined, &mask);
    let level = match format {
        QuantFormat::Affine { .. } => e.convert(&code, DType::F32),
        QuantFormat::Nf4 => {
            let table = e.constant(&HostData::F32(NF4_LEVELS.to_vec()), &[Dim::Known(16)])?;
            let code = e.convert(&code, DType::I32);
            take(e, 0, &table, &code, &dims)?
        }
        QuantFormat::Int8 => {
            // The byte is two's complement.
            let code = e.convert(&code, DType::I32);
            let negative = e.compare_scalar("GE", &code, 128.0)?;
            let offset = e.splat_like(256.0, &code)?;
            let wrapped = e.binary("subtract", &code, &offset);
            let signed = e.select(&negative, &wrapped, &code);
            e.convert(&signed, DType::F32)
        }
    };
    // One scale (and bias) per group of columns, repeated over the group.
    let per_column = |e: &mut Emitter<'_>, v: &Value| -> Result<Value> {
        let v = e.convert(v, DType::F32);
        let mut grouped = v.dims.clone();
        grouped.push(Dim::Known(cols / groups));
        let mapping: Vec<usize> = (0..rank).collect();
        let spread = e.broadcast_in_dim(&v, &grouped, &mapping)?;
        e.reshape(&spread, &dims)
    };
    let scale = per_column(e, scales)?;
    let mut value = e.binary("multiply", &scale, &level);
    if let QuantFormat::Affine { .. } = format {
        let bias = per_column(e, &parts[2])?;
        value = e.binary("add", &value, &bias);
    }
    Ok(e.convert(&value, scales.dtype))
}

/// `gather_qmm` of the dequantized weight `w`: output batch entry `b` is
/// `x[lhs[b]] @ w[rhs[b]](ᵀ)`, the indices addressing the flattened batch
/// dims and broadcast together; two `gather`s of whole matrices and one
/// batched `dot_general`.
fn gather_matmul(
    e: &mut Emitter<'_>,
    x: &Value,
    w: &Value,
    [lhs, rhs]: [&Value; 2],
    transpose: bool,
    out: &[Dim],
) -> Result<Value> {
    let batch = &out[..out.len() - 2];
    let count = batch.iter().fold(Dim::Known(1), |n, d| n.mul(d));
    let matrices = |v: &Value| -> Vec<Dim> {
        let r = v.dims.len();
        let n = v.dims[..r - 2].iter().fold(Dim::Known(1), |n, d| n.mul(d));
        vec![n, v.dims[r - 2].clone(), v.dims[r - 1].clone()]
    };
    let mut picked = Vec::with_capacity(2);
    for (v, index) in [(x, lhs), (w, rhs)] {
        let stacked = e.reshape(v, &matrices(v))?;
        let index = e.broadcast(index, batch)?;
        let index = e.reshape(&index, std::slice::from_ref(&count))?;
        let mut dims = matrices(v);
        dims[0] = count.clone();
        picked.push(take(e, 0, &stacked, &index, &dims)?);
    }
    let mut product = vec![count.clone()];
    product.extend(out[out.len() - 2..].iter().cloned());
    let p = matmul(e, &picked[0], &picked[1], [false, transpose], &product)?;
    e.reshape(&p, out)
}

/// One part of `w`'s quantization, as Kiln computes it: per group the
/// scale (and the affine bias) from the group's extremes, rounded to the
/// dtype; the codes from the rounded scale and bias (ties to even,
/// clamped; NF4's nearest level, the lower on a tie); the codes packed
/// into each row's bit stream by adding (their bits are disjoint) each
/// code's shifted low and high parts into its words.
fn quantize(
    e: &mut Emitter<'_>,
    format: QuantFormat,
    part: QuantPart,
    w: &Value,
    out: &[Dim],
) -> Result<Value> {
    let last = w.dims.len() - 1;
    let cols = known_dims(&w.dims[last..], "a quantized weight's row")?[0];
    let group = format.group_size().unwrap_or(cols).max(1);
    let bits = format.bits() as usize;
    let wf = e.convert(w, DType::F32);
    let mut grouped_dims = w.dims[..last].to_vec();
    grouped_dims.extend([Dim::Known(cols / group), Dim::Known(group)]);
    let grouped = e.reshape(&wf, &grouped_dims)?;
    let group_dims = grouped_dims[..=last].to_vec();
    let extreme = |e: &mut Emitter<'_>, op: ReduceOp, v: &Value| {
        reduce(e, op, &[last + 1], false, v, &group_dims)
    };
    let (scale, bias) = match format {
        QuantFormat::Affine { bits, .. } => {
            let max = extreme(e, ReduceOp::Max, &grouped)?;
            let min = extreme(e, ReduceOp::Min, &grouped)?;
            let range = e.binary("subtract", &max, &min);
            let levels = e.splat_like(((1u32 << bits) - 1) as f64, &range)?;
            (divide_by_constant(e, &range, &levels), min)
        }
        QuantFormat::Nf4 | QuantFormat::Int8 => {
            let magnitude = e.unary("abs", &grouped);
            let absmax = extreme(e, ReduceOp::Max, &magnitude)?;
            let zero = e.splat_like(0.0, &absmax)?;
            let scale = if format == QuantFormat::Int8 {
                let d = e.splat_like(127.0, &absmax)?;
                divide_by_constant(e, &absmax, &d)
            } else {
                absmax
            };
            (scale, zero)
        }
    };
    // As stored: rounded to the dtype.
    let (scale, bias) = (e.convert(&scale, w.dtype), e.convert(&bias, w.dtype));
    match part {
        QuantPart::Scales => return e.reshape(&scale, out),
        QuantPart::Biases => return e.reshape(&bias, out),
        QuantPart::Packed => {}
    }
    let spread = |e: &mut Emitter<'_>, v: &Value| {
        let v = e.convert(v, DType::F32);
        let mapping: Vec<usize> = (0..=last).collect();
        e.broadcast_in_dim(&v, &grouped_dims, &mapping)
    };
    let (s, b) = (spread(e, &scale)?, spread(e, &bias)?);
    let codes = encode(e, format, &grouped, &s, &b)?;
    let mut code_dims = w.dims.clone();
    code_dims[last] = Dim::Known(cols);
    let codes = e.reshape(&codes, &code_dims)?;
    pack(e, &codes, bits, out)
}

/// `a / d` (f32) rounded as an f32 division rounds. XLA rewrites a
/// division by a constant as a product with its reciprocal, which may
/// differ in the last bit; in f64 that product is close enough to the
/// quotient that rounding it to f32 gives the f32 quotient.
fn divide_by_constant(e: &mut Emitter<'_>, a: &Value, d: &Value) -> Value {
    let wide = a.ty().replace("f32>", "f64>");
    let widen = |e: &mut Emitter<'_>, v: &Value| {
        let name = e.fresh();
        e.line(&format!(
            "{name} = stablehlo.convert {} : ({}) -> {wide}",
            v.name,
            v.ty()
        ));
        name
    };
    let (a64, d64) = (widen(e, a), widen(e, d));
    let q = e.fresh();
    e.line(&format!("{q} = stablehlo.divide {a64}, {d64} : {wide}"));
    let rhs = format!("stablehlo.convert {q} : ({wide}) -> {}", a.ty());
    e.op(&rhs, &a.dims, DType::F32)
}

/// Each element's code (u32) under its group's scale `s` and bias `b`.
fn encode(
    e: &mut Emitter<'_>,
    format: QuantFormat,
    v: &Value,
    s: &Value,
    b: &Value,
) -> Result<Value> {
    let zero = e.splat_like(0.0, v)?;
    let no_scale = e.compare("EQ", s, &zero);
    let shifted = e.binary("subtract", v, b);
    let ratio = e.binary("divide", &shifted, s);
    let ratio = e.select(&no_scale, &zero, &ratio);
    let (low, high) = match format {
        QuantFormat::Affine { bits, .. } => (0.0, ((1u32 << bits) - 1) as f64),
        QuantFormat::Int8 => (-127.0, 127.0),
        QuantFormat::Nf4 => return nearest_level(e, &ratio),
    };
    let rounded = e.unary("round_nearest_even", &ratio);
    let (l, h) = (e.splat_like(low, &rounded)?, e.splat_like(high, &rounded)?);
    let rhs = format!(
        "stablehlo.clamp {}, {}, {} : {}",
        l.name,
        rounded.name,
        h.name,
        rounded.ty()
    );
    let clamped = e.op(&rhs, &rounded.dims, DType::F32);
    // Int8 stores the two's complement byte.
    let signed = e.convert(&clamped, DType::I32);
    let byte = e.splat_like(255.0, &signed)?;
    let masked = e.binary("and", &signed, &byte);
    Ok(e.convert(&masked, DType::U32))
}

/// The index of the NF4 level nearest `t`, the lower one on a tie.
fn nearest_level(e: &mut Emitter<'_>, t: &Value) -> Result<Value> {
    let distance = |e: &mut Emitter<'_>, level: f32| -> Result<Value> {
        let l = e.splat_like(f64::from(level), t)?;
        let d = e.binary("subtract", t, &l);
        Ok(e.unary("abs", &d))
    };
    let mut best_distance = distance(e, NF4_LEVELS[0])?;
    let mut best = {
        let zero = e.scalar(0.0, DType::U32);
        e.broadcast(&zero, &t.dims)?
    };
    for (i, &level) in NF4_LEVELS.iter().enumerate().skip(1) {
        let d = distance(e, level)?;
        let closer = e.compare("LT", &d, &best_distance);
        let index = e.splat_like(i as f64, &best)?;
        best = e.select(&closer, &index, &best);
        best_distance = e.select(&closer, &d, &best_distance);
    }
    Ok(best)
}

/// `codes` (u32, `bits` each) packed along the last axis into words of
/// `out`: code `j` at bit `j·bits` of its row's stream.
fn pack(e: &mut Emitter<'_>, codes: &Value, bits: usize, out: &[Dim]) -> Result<Value> {
    let last = codes.dims.len() - 1;
    let cols = known_dims(&codes.dims[last..], "a quantized weight's row")?[0];
    let words = known_dims(&out[last..], "packed codes")?[0];
    let column = |j: usize| (j * bits / 32, (j * bits % 32) as u32);
    let shifts = HostData::U32((0..cols).map(|j| column(j).1).collect());
    let shift = e.constant(&shifts, &[Dim::Known(cols)])?;
    let shift = e.broadcast(&shift, &codes.dims)?;
    let width = e.splat_like(32.0, &shift)?;
    let back = e.binary("subtract", &width, &shift);
    // Shifts by 32 give 0: a code within one word adds nothing to the next.
    let low = e.binary("shift_left", codes, &shift);
    let high = e.binary("shift_right_logical", codes, &back);
    let mut packed: Option<Value> = None;
    for (part, next) in [(low, 0), (high, 1)] {
        let index = HostData::I32(
            (0..cols)
                .map(|j| (column(j).0 + next).min(words - 1) as i32)
                .collect(),
        );
        let index = e.constant(&index, &[Dim::Known(cols)])?;
        let words = scatter_add(e, last, &part, &index, out)?;
        packed = Some(match packed {
            Some(p) => e.binary("add", &p, &words),
            None => words,
        });
    }
    packed.ok_or_else(|| unsupported("packing without parts"))
}
