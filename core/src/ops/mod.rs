//! The op families. Each family module holds everything about its ops: the
//! shape rule and the reference (CPU) evaluation, side by side, and the
//! `Array` handle's user methods for them (`impl Array` blocks). The handle
//! (`handle/array.rs`) and the families import each other: the one
//! deliberate circle of the crate, which keeps one place per op. Anything
//! else a family needs from a higher layer reaches it through a narrow
//! interface: reverse mode as a `Backward` argument of `Op::vjp`, a
//! custom op's tracing and executable through its `CustomRuntime`, the CPU
//! thread count from the base layer ([`crate::threads`]).

pub mod array_api;
pub(crate) mod batching;
pub mod binary;
pub mod cast;
pub mod control;
pub mod custom;
pub mod dynamic;
pub mod einsum;
pub mod fused;
pub mod implicit;
pub mod index;
pub mod kernel;
pub mod layout;
pub mod math;
pub mod matmul;
pub mod nn;
pub mod pad;
mod product;
mod qmm;
pub mod quant;
pub mod reduce;
#[cfg(any(target_arch = "wasm32", test))]
pub mod relaxed;
pub mod scatter;
pub mod select;
pub mod sort;
mod strided;
pub mod unary;

use crate::data::HostData;
use crate::error::Result;
use crate::handle::array::Array;
use crate::shape::{Aval, Dim, Shape};
use crate::DType;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

pub use binary::BinaryOp;
pub use control::{ControlCall, ControlKind};
pub use custom::{CustomCall, CustomOp, SchemaEntry};
pub use fused::{FusedArg, FusedKernel, FusedStep};
pub use implicit::ImplicitCall;
pub use kernel::{Kernel, KernelCall, TemplateValue};
pub use layout::SliceAxis;
pub use quant::{QuantFormat, QuantKind, QuantOp, QuantPart};
pub use reduce::ReduceOp;
#[cfg(test)]
pub(crate) use strided::proptest_config;
pub use unary::UnaryOp;

/// Reverse mode over the lazy graph, as the transform layer implements it
/// (`transform::autodiff::backward`): the cotangents of `wrt` when
/// `outputs` have the cotangents `seeds`. Handed to [`Op::vjp`] for the
/// rules that differentiate a composition (an implicit value's
/// materialization), so no family imports the transform layer.
pub(crate) type Backward<'a> =
    &'a dyn Fn(&[Array], Vec<Option<Array>>, &[Array]) -> Result<Vec<Option<Array>>>;

/// Forward mode over the lazy graph, as the transform layer implements it
/// (`transform::forward::push_tangents`): the tangents of `outputs` when
/// the values `wrt` have the tangents `tangents`. Handed to [`Op::jvp`] for
/// the rules that differentiate a composition, as [`Backward`] is.
pub(crate) type Forward<'a> =
    &'a dyn Fn(&[Array], &[Array], Vec<Option<Array>>) -> Result<Vec<Option<Array>>>;

/// Batching over the lazy graph, as the transform layer implements it
/// (`transform::batching::batch_values`): the batched values of `outputs`
/// (per-example values) when the per-example values `inputs` are batched
/// as `batched`, for `size` examples. Handed to [`Op::batch`] for the rules
/// that batch a composition (an implicit value's materialization).
pub(crate) type BatchWalk<'a> =
    &'a dyn Fn(&[Array], &[Array], Vec<batching::Batched>, &Dim) -> Result<Vec<batching::Batched>>;

/// An operation of the graph: a closed set of families plus one open
/// variant for custom kernels.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Elementwise one-operand math.
    Unary(UnaryOp),
    /// Elementwise two-operand math and comparisons, NumPy broadcasting.
    Binary(BinaryOp),
    /// `where(cond, a, b)`, broadcasting all three.
    Select,
    /// Elementwise conversion to a dtype.
    Cast(DType),
    /// Reduction over `axes` (sorted, unique).
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// Reduced axes, sorted ascending.
        axes: Vec<usize>,
        /// Keep reduced axes as size 1.
        keepdims: bool,
    },
    /// Index of the maximum along one axis (u32 result, first on ties).
    ArgMax {
        /// The reduced axis.
        axis: usize,
        /// Keep the axis as size 1.
        keepdims: bool,
    },
    /// The stable order (i32 indices) of each row along one axis, NaN
    /// above every number ([`sort`]).
    Argsort {
        /// The sorted axis.
        axis: usize,
        /// Largest first (ties still to the lower index).
        descending: bool,
    },
    /// Batched matrix product `[..., m, k] @ [..., k, n]` with broadcast batch dims.
    Matmul,
    /// [`Op::Matmul`] of operands stored with their last two axes swapped
    /// where marked: `a` as `[..., k, m]` when `transposed[0]`, `b` as
    /// `[..., n, k]` when `transposed[1]`. The `transposed_operands` pass
    /// ([`crate::passes::transposed_operands`]) makes it of a matmul fed by
    /// such a permute, for an executor that reads the operand in place.
    TransposedMatmul {
        /// Whether `a` and `b` are stored transposed.
        transposed: [bool; 2],
    },
    /// Same elements, new shape (element count preserved).
    Reshape(Shape),
    /// Permutes the axes: output axis `i` is input axis `perm[i]`.
    Permute(Vec<usize>),
    /// NumPy broadcast to a shape.
    BroadcastTo(Shape),
    /// Strided slice, one entry per axis.
    Slice(Vec<SliceAxis>),
    /// Concatenation along an axis.
    Concat {
        /// The joined axis.
        axis: usize,
    },
    /// NumPy `take`: select entries along `axis` by an integer index array.
    Take {
        /// The indexed axis.
        axis: usize,
    },
    /// Adds the update rows (operand 0) into zeros along `axis` at the
    /// positions an integer index array (operand 1) names: the transpose of
    /// `take`.
    ScatterAdd {
        /// The axis the indices address in the output.
        axis: usize,
        /// The output's size along `axis`.
        size: Dim,
    },
    /// Places the operand at a strided slice of zeros: the transpose of
    /// `slice`.
    PadSlice {
        /// One slice per axis of `shape`.
        axes: Vec<SliceAxis>,
        /// The output shape.
        shape: Shape,
    },
    /// The window of `sizes` of operand 0 at start indices computed at run
    /// time (operands 1.., one integer scalar per axis, clamped so the
    /// window fits; [`dynamic`]).
    DynamicSlice {
        /// The window's shape.
        sizes: Shape,
    },
    /// Operand 0 with operand 1 written at start indices computed at run
    /// time (operands 2.., clamped as for [`Op::DynamicSlice`]); may write
    /// over operand 0.
    DynamicUpdateSlice,
    /// A scalar holding the product of the operand's sizes over `axes`
    /// (the count a mean divides by, known only per call when shapeless).
    DimSize {
        /// The counted axes.
        axes: Vec<usize>,
        /// The result dtype.
        dtype: DType,
    },
    /// The positions `0..n` along `axis` of the operand (`n` its size
    /// there) as a vector of `dtype` ([`Array::iota`]): a range whose
    /// length may be symbolic, as `dim_size` is a count that may be.
    Iota {
        /// The counted axis.
        axis: usize,
        /// The result dtype.
        dtype: DType,
    },
    /// A group of elementwise ops fused into one (made by the `fuse` pass).
    Fused(Arc<FusedKernel>),
    /// The identity, through which no gradient flows
    /// ([`crate::stop_gradient`]); the simplify pass removes it.
    StopGradient,
    /// A user kernel ([`kernel::Kernel`]): its own shape rule, reference
    /// evaluation and WGSL.
    Kernel(KernelCall),
    /// A custom op over a tree of arguments ([`custom::CustomOp`]).
    Custom(CustomCall),
    /// An implicit array ([`crate::implicit`]): a value of its own kind
    /// until the lowering pass resolves the ops that read it.
    Implicit(ImplicitCall),
    /// Quantization: quantize, dequantize, quantized matmul and gather_qmm
    /// ([`quant`]).
    Quant(QuantOp),
    /// Control flow holding subgraphs: scan, while_loop, switch
    /// ([`control`]). Its value is a token; [`Op::Get`] reads its results.
    Control(Arc<ControlCall>),
    /// Result `index` of the control-flow node that is its operand.
    Get {
        /// Which result.
        index: usize,
        /// Its aval.
        aval: Aval,
    },
}

impl Op {
    /// The op's name as users write it: `add`, `exp`, `sum`, `matmul`, ...
    pub fn name(&self) -> &str {
        match self {
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Select => "where",
            Op::Cast(_) => "cast",
            Op::Reduce { op, .. } => op.name(),
            Op::ArgMax { .. } => "argmax",
            Op::Argsort { .. } => "argsort",
            Op::Matmul | Op::TransposedMatmul { .. } => "matmul",
            Op::Reshape(_) => "reshape",
            Op::StopGradient => "stop_gradient",
            Op::Permute(_) => "permute",
            Op::BroadcastTo(_) => "broadcast_to",
            Op::Slice(_) => "slice",
            Op::Concat { .. } => "concat",
            Op::Take { .. } => "take",
            Op::ScatterAdd { .. } => "scatter_add",
            Op::PadSlice { .. } => "pad_slice",
            Op::DynamicSlice { .. } => "dynamic_slice",
            Op::DynamicUpdateSlice => "dynamic_update_slice",
            Op::DimSize { .. } => "dim_size",
            Op::Iota { .. } => "iota",
            Op::Fused(_) => "fused",
            Op::Kernel(k) => k.kernel.name(),
            Op::Custom(c) => c.name(),
            Op::Implicit(i) => i.kind(),
            Op::Quant(q) => q.name(),
            Op::Control(c) => c.name(),
            Op::Get { .. } => "get",
        }
    }

    /// The op with its parameters, for reports: `sum(axes=[1], keepdims=false)`.
    pub fn describe(&self) -> String {
        match self {
            Op::Cast(d) => format!("cast({d})"),
            Op::Reduce { op, axes, keepdims } => {
                format!("{}(axes={axes:?}, keepdims={keepdims})", op.name())
            }
            Op::ArgMax { axis, keepdims } => format!("argmax(axis={axis}, keepdims={keepdims})"),
            Op::Argsort { axis, descending } => {
                format!("argsort(axis={axis}, descending={descending})")
            }
            Op::TransposedMatmul { transposed: [a, b] } => {
                let mark = |t: bool| if t { "ᵀ" } else { "" };
                format!("matmul(a{} @ b{})", mark(*a), mark(*b))
            }
            Op::Reshape(s) => format!("reshape({s})"),
            Op::Permute(p) => format!("permute({p:?})"),
            Op::BroadcastTo(s) => format!("broadcast_to({s})"),
            Op::Slice(axes) => {
                let parts: Vec<String> = axes.iter().map(|a| a.to_string()).collect();
                format!("slice[{}]", parts.join(", "))
            }
            Op::Concat { axis } => format!("concat(axis={axis})"),
            Op::Take { axis } => format!("take(axis={axis})"),
            Op::ScatterAdd { axis, size } => format!("scatter_add(axis={axis}, size={size})"),
            Op::PadSlice { axes, shape } => {
                let parts: Vec<String> = axes.iter().map(|a| a.to_string()).collect();
                format!("pad_slice[{}] into {shape}", parts.join(", "))
            }
            Op::DimSize { axes, dtype } => format!("dim_size(axes={axes:?}, {dtype})"),
            Op::Iota { axis, dtype } => format!("iota(axis={axis}, {dtype})"),
            Op::DynamicSlice { sizes } => format!("dynamic_slice(sizes={sizes})"),
            Op::Fused(k) => k.describe(),
            Op::Kernel(k) => k.describe(),
            Op::Custom(c) => c.describe(),
            Op::Implicit(i) => i.describe(),
            Op::Quant(q) => q.describe(),
            Op::Control(c) => c.describe(),
            Op::Get { index, .. } => format!("get({index})"),
            other => other.name().to_string(),
        }
    }

    /// True for ops computing each output element from the same-position
    /// (broadcast) elements of their operands.
    pub fn is_elementwise(&self) -> bool {
        matches!(
            self,
            Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast(_) | Op::Fused(_)
        )
    }

    /// True when the op may write its output over its operand at
    /// `position`: any operand of an elementwise op, and the declared
    /// in-place input of a kernel. The reinplace pass and the verifier
    /// decide whether it really does.
    pub fn may_write_over(&self, position: usize) -> bool {
        match self {
            Op::Kernel(k) => k.kernel.in_place() == Some(position),
            Op::DynamicUpdateSlice => position == 0,
            op => op.is_elementwise(),
        }
    }

    /// The output aval from the input avals; records in `cx` every equality
    /// it had to assume between symbolic dims.
    pub fn shape_rule(&self, inputs: &[&Aval], cx: &mut ShapeCx) -> Result<Aval> {
        self.check_arity(inputs.len())?;
        cx.op = self.name().to_string();
        match self {
            Op::Unary(u) => unary::shape_rule(*u, inputs[0]),
            Op::Binary(b) => binary::shape_rule(*b, inputs[0], inputs[1], cx),
            Op::Select => select::shape_rule(inputs[0], inputs[1], inputs[2], cx),
            Op::Cast(d) => Ok(cast::shape_rule(inputs[0], *d)),
            Op::Reduce { op, axes, keepdims } => {
                reduce::shape_rule(*op, axes, *keepdims, inputs[0])
            }
            Op::ArgMax { axis, keepdims } => reduce::argmax_shape_rule(*axis, *keepdims, inputs[0]),
            Op::Argsort { axis, .. } => sort::shape_rule(*axis, inputs[0]),
            Op::Matmul => matmul::shape_rule(inputs[0], inputs[1], cx),
            Op::TransposedMatmul { transposed } => {
                matmul::transposed_shape_rule(inputs[0], inputs[1], *transposed, cx)
            }
            Op::Reshape(s) => layout::reshape_shape_rule(s, inputs[0], cx),
            Op::StopGradient => Ok(inputs[0].clone()),
            Op::Permute(p) => layout::permute_shape_rule(p, inputs[0]),
            Op::BroadcastTo(s) => layout::broadcast_shape_rule(s, inputs[0], cx),
            Op::Slice(axes) => layout::slice_shape_rule(axes, inputs[0], cx),
            Op::Concat { axis } => layout::concat_shape_rule(*axis, inputs, cx),
            Op::Take { axis } => index::take_shape_rule(*axis, inputs[0], inputs[1]),
            Op::ScatterAdd { axis, size } => {
                scatter::scatter_add_shape_rule(*axis, size, inputs[0], inputs[1], cx)
            }
            Op::PadSlice { axes, shape } => pad::pad_slice_shape_rule(axes, shape, inputs[0], cx),
            Op::DimSize { axes, dtype } => layout::dim_size_shape_rule(axes, *dtype, inputs[0]),
            Op::Iota { axis, dtype } => layout::iota_shape_rule(*axis, *dtype, inputs[0]),
            Op::DynamicSlice { sizes } => dynamic::dynamic_slice_shape_rule(sizes, inputs, cx),
            Op::DynamicUpdateSlice => dynamic::dynamic_update_slice_shape_rule(inputs, cx),
            Op::Fused(k) => fused::shape_rule(k, inputs, cx),
            Op::Kernel(k) => k.shape_rule(inputs, cx),
            Op::Custom(c) => c.shape_rule(inputs, cx),
            Op::Implicit(i) => i.shape_rule(inputs, cx),
            Op::Quant(q) => q.shape_rule(inputs, cx),
            Op::Control(c) => c.shape_rule(inputs, cx),
            Op::Get { aval, .. } => control::get_shape_rule(aval, inputs[0]),
        }
    }

    /// `Err` unless `given` operands fit the op.
    fn check_arity(&self, given: usize) -> Result<()> {
        match self.arity() {
            Some(n) if n != given => Err(crate::error::arg_err(
                self.name(),
                format!("expects {n} operands, got {given}"),
            )),
            _ => Ok(()),
        }
    }

    /// Number of operands, when fixed.
    pub fn arity(&self) -> Option<usize> {
        match self {
            Op::Binary(_)
            | Op::Matmul
            | Op::TransposedMatmul { .. }
            | Op::Take { .. }
            | Op::ScatterAdd { .. } => Some(2),
            Op::Select => Some(3),
            Op::Concat { .. }
            | Op::Fused(_)
            | Op::Kernel(_)
            | Op::Custom(_)
            | Op::Implicit(_)
            | Op::DynamicSlice { .. }
            | Op::DynamicUpdateSlice
            | Op::Control(_) => None,
            Op::Quant(q) => Some(q.arity()),
            _ => Some(1),
        }
    }

    /// Reference evaluation on host data with concrete shapes, for operands
    /// whose avals the shape rule accepted (the operand count is checked).
    pub fn eval(
        &self,
        inputs: &[&HostData],
        in_shapes: &[&[usize]],
        out_shape: &[usize],
    ) -> Result<HostData> {
        self.check_arity(inputs.len())?;
        if in_shapes.len() != inputs.len() {
            return Err(crate::error::arg_err(
                self.name(),
                format!(
                    "{} operands but {} operand shapes",
                    inputs.len(),
                    in_shapes.len()
                ),
            ));
        }
        // Four bytes per element bound every dtype's storage.
        let out_bytes = out_shape
            .iter()
            .fold(4usize, |acc, &d| acc.saturating_mul(d));
        crate::limits::ensure_allocatable(self.name(), out_bytes)?;
        match self {
            Op::Unary(u) => unary::eval(*u, inputs[0]),
            Op::Binary(b) => binary::eval(
                *b,
                inputs[0],
                in_shapes[0],
                inputs[1],
                in_shapes[1],
                out_shape,
            ),
            Op::Select => select::eval(inputs, in_shapes, out_shape),
            Op::Cast(d) => Ok(cast::eval(inputs[0], *d)),
            Op::Reduce { op, axes, .. } => reduce::eval(*op, axes, inputs[0], in_shapes[0]),
            Op::ArgMax { axis, .. } => reduce::argmax_eval(*axis, inputs[0], in_shapes[0]),
            Op::Argsort { axis, descending } => {
                sort::eval(*axis, *descending, inputs[0], in_shapes[0])
            }
            Op::Matmul => matmul::eval(inputs[0], in_shapes[0], inputs[1], in_shapes[1], out_shape),
            Op::TransposedMatmul { transposed } => matmul::eval_transposed(
                inputs[0],
                in_shapes[0],
                inputs[1],
                in_shapes[1],
                *transposed,
                out_shape,
            ),
            Op::Reshape(_) | Op::StopGradient => Ok(crate::pool::copy(inputs[0])),
            Op::Permute(p) => Ok(layout::permute_eval(p, inputs[0], in_shapes[0])),
            Op::BroadcastTo(_) => Ok(layout::broadcast_eval(inputs[0], in_shapes[0], out_shape)),
            Op::Slice(axes) => Ok(layout::slice_eval(axes, inputs[0], in_shapes[0], out_shape)),
            Op::Concat { axis } => Ok(layout::concat_eval(*axis, inputs, in_shapes, out_shape)),
            Op::Take { axis } => {
                index::take_eval(*axis, inputs[0], in_shapes[0], inputs[1], out_shape)
            }
            Op::ScatterAdd { axis, .. } => {
                scatter::scatter_add_eval(*axis, inputs[0], in_shapes[0], inputs[1], out_shape)
            }
            Op::PadSlice { axes, .. } => {
                pad::pad_slice_eval(axes, inputs[0], in_shapes[0], out_shape)
            }
            Op::DimSize { axes, dtype } => Ok(layout::dim_size_eval(axes, *dtype, in_shapes[0])),
            Op::Iota { axis, dtype } => Ok(layout::iota_eval(*axis, *dtype, in_shapes[0])),
            Op::DynamicSlice { .. } => dynamic::dynamic_slice_eval(inputs, in_shapes, out_shape),
            Op::DynamicUpdateSlice => dynamic::dynamic_update_slice_eval(inputs, in_shapes),
            Op::Fused(k) => fused::eval(k, inputs, in_shapes, out_shape),
            Op::Kernel(k) => k.eval(inputs, in_shapes, out_shape),
            Op::Custom(c) => c.eval(inputs, in_shapes),
            Op::Implicit(i) => i.eval(inputs, in_shapes),
            Op::Quant(q) => q.eval(inputs, in_shapes),
            Op::Control(_) | Op::Get { .. } => Err(crate::error::arg_err(
                self.name(),
                "runs its subgraphs through an executor (the CPU executor or a GPU backend), \
                 not the single-op reference evaluation",
            )),
        }
    }

    /// The cotangents of `inputs` for the cotangent `g` of `output`, the
    /// value this op computed from them: one per operand, `None` where it is
    /// structurally zero or the operand takes no gradient (indices,
    /// conditions, integers). Each family's rule sits beside its shape rule.
    pub(crate) fn vjp(
        &self,
        inputs: &[Array],
        output: &Array,
        g: &Array,
        backward: Backward<'_>,
    ) -> Result<Vec<Option<Array>>> {
        Ok(match self {
            Op::Unary(u) => vec![Some(unary::vjp(*u, &inputs[0], output, g))],
            Op::Binary(b) => binary::vjp(*b, &inputs[0], &inputs[1], output, g).to_vec(),
            Op::Select => select::vjp(&inputs[0], &inputs[1], &inputs[2], g).to_vec(),
            Op::Cast(_) => vec![cast::vjp(&inputs[0], g)],
            Op::Reduce { op, axes, keepdims } => {
                vec![Some(reduce::vjp(
                    *op, axes, *keepdims, &inputs[0], output, g,
                ))]
            }
            Op::Matmul => matmul::vjp(&inputs[0], &inputs[1], g).to_vec(),
            Op::TransposedMatmul { transposed } => {
                matmul::transposed_vjp(&inputs[0], &inputs[1], *transposed, g).to_vec()
            }
            Op::Reshape(_)
            | Op::Permute(_)
            | Op::BroadcastTo(_)
            | Op::Concat { .. }
            | Op::DimSize { .. }
            | Op::Iota { .. } => layout::vjp(self, inputs, g)?,
            Op::Slice(axes) => vec![Some(g.pad_slice(axes, inputs[0].shape().clone()))],
            Op::Take { axis } => index::vjp(*axis, &inputs[0], &inputs[1], g).to_vec(),
            Op::ScatterAdd { axis, .. } => scatter::vjp(*axis, &inputs[1], g).to_vec(),
            Op::PadSlice { axes, .. } => vec![Some(pad::vjp(axes, g))],
            Op::DynamicSlice { .. } => dynamic::slice_vjp(inputs, g),
            Op::DynamicUpdateSlice => dynamic::update_vjp(inputs, g),
            Op::ArgMax { .. } | Op::Argsort { .. } | Op::StopGradient => vec![None; inputs.len()],
            Op::Custom(c) => c.vjp(inputs, output, g)?,
            Op::Implicit(i) => i.vjp(inputs, g, backward)?,
            Op::Quant(q) => q.vjp(inputs, g)?,
            Op::Kernel(_) => {
                return Err(crate::error::arg_err(
                    self.name(),
                    "is a kernel and has no vjp, so gradients cannot flow through it; wrap it \
                     in a `CustomOp` with a vjp",
                ))
            }
            Op::Fused(_) => {
                return Err(crate::error::arg_err(
                    self.name(),
                    "has no vjp, so gradients cannot flow through it",
                ))
            }
            Op::Control(_) | Op::Get { .. } => {
                return Err(crate::error::arg_err(
                    self.name(),
                    "has no vjp yet: gradients cannot flow through control flow",
                ))
            }
        })
    }

    /// The tangent of `output`, the value this op computed from `inputs`,
    /// when the inputs have the tangents `tangents` (one per operand,
    /// `None` where structurally zero): `None` where the output's tangent
    /// is structurally zero (no operand has one, or the output is not a
    /// float). Each family's rule sits beside its vjp; ops linear in their
    /// float operands apply themselves to the tangents.
    pub(crate) fn jvp(
        &self,
        inputs: &[Array],
        output: &Array,
        tangents: &[Option<Array>],
        forward: Forward<'_>,
    ) -> Result<Option<Array>> {
        if !output.dtype().is_float() || tangents.iter().all(Option::is_none) {
            return Ok(None);
        }
        let t = |i: usize| tangents[i].clone();
        Ok(match self {
            Op::Unary(u) => t(0).map(|t| unary::jvp(*u, &inputs[0], output, &t)),
            Op::Binary(b) => binary::jvp(*b, &inputs[0], &inputs[1], output, t(0), t(1)),
            Op::Select => select::jvp(&inputs[0], output, t(1), t(2)),
            Op::Cast(d) => t(0).and_then(|t| cast::jvp(&t, *d)),
            Op::Reduce { op, axes, keepdims } => {
                t(0).map(|t| reduce::jvp(*op, axes, *keepdims, &inputs[0], output, &t))
            }
            Op::Matmul => matmul::jvp(&inputs[0], &inputs[1], t(0), t(1)),
            Op::TransposedMatmul { transposed } => {
                let logical = |x: &Array, swap: bool| {
                    if swap {
                        x.swap_axes(-1, -2)
                    } else {
                        x.clone()
                    }
                };
                let [sa, sb] = *transposed;
                matmul::jvp(
                    &logical(&inputs[0], sa),
                    &logical(&inputs[1], sb),
                    t(0).map(|t| logical(&t, sa)),
                    t(1).map(|t| logical(&t, sb)),
                )
            }
            Op::Reshape(_)
            | Op::Permute(_)
            | Op::BroadcastTo(_)
            | Op::Slice(_)
            | Op::PadSlice { .. }
            | Op::Take { .. }
            | Op::ScatterAdd { .. } => t(0).map(|t| {
                let mut operands = inputs.to_vec();
                operands[0] = t;
                Array::apply(self.clone(), operands)
            }),
            Op::Concat { .. } => Some(Array::apply(
                self.clone(),
                inputs
                    .iter()
                    .zip(tangents)
                    .map(|(x, t)| t.clone().unwrap_or_else(|| x.zeros_like()))
                    .collect(),
            )),
            Op::DynamicSlice { .. } | Op::DynamicUpdateSlice => {
                dynamic::jvp(self, inputs, tangents)
            }
            Op::ArgMax { .. }
            | Op::Argsort { .. }
            | Op::DimSize { .. }
            | Op::Iota { .. }
            | Op::StopGradient => None,
            Op::Custom(c) => c.jvp(inputs, output, tangents)?,
            Op::Implicit(i) => i.jvp(inputs, tangents, forward)?,
            Op::Quant(q) => q.jvp(inputs, output, tangents)?,
            Op::Kernel(_) => {
                return Err(crate::error::arg_err(
                    self.name(),
                    "is a kernel and has no jvp, so forward-mode derivatives cannot flow \
                     through it; wrap it in a `CustomOp` with a jvp",
                ))
            }
            Op::Fused(_) => {
                return Err(crate::error::arg_err(
                    self.name(),
                    "has no jvp: fused groups only exist in optimized graphs",
                ))
            }
            Op::Control(_) | Op::Get { .. } => {
                return Err(crate::error::arg_err(
                    self.name(),
                    "has no jvp yet: forward-mode derivatives cannot flow through control flow",
                ))
            }
        })
    }

    /// The batched output of this op under vmap, from its per-example
    /// `inputs` and `output` and the batched operands (`size` examples).
    /// Each family's rule sits beside its vjp and jvp and moves a batch
    /// axis only when the op needs it in front; user kernels and custom
    /// ops without a rule of their own run once per example.
    pub(crate) fn batch(
        &self,
        inputs: &[Array],
        operands: &[batching::Batched],
        output: &Array,
        size: &Dim,
        walk: BatchWalk<'_>,
    ) -> Result<batching::Batched> {
        use batching::{per_example, Batched};
        if operands.iter().all(|b| b.axis.is_none()) {
            let values = operands.iter().map(|b| b.value.clone()).collect();
            return Ok(Batched::shared(Array::apply(self.clone(), values)));
        }
        let apply = |values: Vec<Array>| Array::apply(self.clone(), values);
        Ok(match self {
            // Elementwise on one operand: the batch axis stays where it is.
            Op::Unary(_) | Op::Cast(_) | Op::StopGradient => Batched {
                value: apply(vec![operands[0].value.clone()]),
                axis: operands[0].axis,
            },
            // Broadcasting: batched operands get their batch axis first and
            // the per-example rank of the output.
            Op::Binary(_) | Op::Select => {
                let rank = output.ndim();
                Batched::along(apply(operands.iter().map(|b| b.aligned(rank)).collect()), 0)
            }
            Op::Reduce { op, axes, keepdims } => reduce::batch(*op, axes, *keepdims, &operands[0]),
            Op::ArgMax { axis, keepdims } => Batched::along(
                Array::apply(
                    Op::ArgMax {
                        axis: axis + 1,
                        keepdims: *keepdims,
                    },
                    vec![operands[0].front()],
                ),
                0,
            ),
            Op::Argsort { axis, descending } => sort::batch(*axis, *descending, &operands[0]),
            Op::Matmul => matmul::batch(&operands[0], &operands[1], output),
            Op::TransposedMatmul { transposed } => {
                let logical = |b: &Batched, swap: bool| match (swap, b.axis) {
                    (false, _) => b.clone(),
                    (true, None) => Batched::shared(b.value.swap_axes(-1, -2)),
                    (true, Some(_)) => Batched::along(b.front().swap_axes(-1, -2), 0),
                };
                let [sa, sb] = *transposed;
                matmul::batch(
                    &logical(&operands[0], sa),
                    &logical(&operands[1], sb),
                    output,
                )
            }
            Op::Reshape(_)
            | Op::Permute(_)
            | Op::BroadcastTo(_)
            | Op::Slice(_)
            | Op::PadSlice { .. }
            | Op::Concat { .. }
            | Op::DimSize { .. }
            | Op::Iota { .. } => layout::batch(self, operands, size),
            Op::Take { axis } => index::batch(*axis, &operands[0], &operands[1], size),
            Op::ScatterAdd { axis, size: rows } => {
                scatter::batch(*axis, rows, &operands[0], &operands[1], size)
            }
            Op::DynamicSlice { .. } | Op::DynamicUpdateSlice => {
                dynamic::batch(self, operands, output, size)?
            }
            Op::Quant(q) => q.batch(operands, output, size),
            Op::Custom(c) => c.batch(self, operands, output, size)?,
            Op::Implicit(i) => i.batch(inputs, operands, size, walk)?,
            Op::Kernel(k) if k.kernel.batches_leading_dim() => {
                let values = operands.iter().map(|b| b.materialized(size)).collect();
                let batched = apply(values);
                if let Some(e) = batched.error() {
                    return Err(e.clone());
                }
                let mut want = vec![size.clone()];
                want.extend(output.shape().dims().iter().cloned());
                if !crate::symbolic::shapes_equal(batched.shape(), &Shape(want.clone())) {
                    return Err(crate::error::arg_err(
                        self.name(),
                        format!(
                            "batches its leading dim, but gave {} for {size} examples of {}",
                            batched.aval(),
                            output.aval()
                        ),
                    ));
                }
                Batched::along(batched, 0)
            }
            Op::Kernel(_) => per_example(
                self,
                operands,
                output,
                size,
                "a user kernel has no batching rule",
            )?,
            Op::Fused(_) => {
                return Err(crate::error::arg_err(
                    self.name(),
                    "has no batching rule: fused groups only exist in optimized graphs",
                ))
            }
            Op::Control(_) | Op::Get { .. } => {
                return Err(crate::error::arg_err(
                    self.name(),
                    "has no batching rule yet: vmap cannot batch control flow",
                ))
            }
        })
    }

    /// Evaluates an op into `target`, which the op may write over (see
    /// [`Op::may_write_over`]): the buffer of the operand
    /// at every position where `inputs` holds `None`, which has the
    /// output's shape and dtype (a reinplaced node). Unary, binary and
    /// tiled fused f32 groups update it element by element; the other
    /// elementwise ops evaluate and copy into it. Same bits as [`Op::eval`].
    pub fn eval_in_place(
        &self,
        inputs: &[Option<&HostData>],
        in_shapes: &[&[usize]],
        out_shape: &[usize],
        target: &mut HostData,
    ) -> Result<()> {
        self.check_arity(inputs.len())?;
        let numel: usize = out_shape.iter().product();
        let writable = inputs
            .iter()
            .enumerate()
            .filter(|(_, i)| i.is_none())
            .all(|(position, _)| self.may_write_over(position));
        if !writable || in_shapes.len() != inputs.len() || target.len() != numel {
            return Err(crate::error::arg_err(
                self.name(),
                format!(
                    "cannot run in place into {} elements for output shape {out_shape:?}",
                    target.len()
                ),
            ));
        }
        match self {
            Op::Unary(u) => return unary::eval_in_place(*u, target),
            Op::Binary(b) => {
                return binary::eval_in_place(
                    *b,
                    [inputs[0], inputs[1]],
                    [in_shapes[0], in_shapes[1]],
                    out_shape,
                    target,
                )
            }
            Op::Fused(k) if fused::eval_in_place(k, inputs, in_shapes, out_shape, target) => {
                return Ok(())
            }
            Op::DynamicUpdateSlice => {
                return dynamic::dynamic_update_slice_in_place(inputs, in_shapes, target)
            }
            _ => {}
        }
        let result = {
            let operands: SmallVec<[&HostData; 4]> =
                inputs.iter().map(|i| i.unwrap_or(&*target)).collect();
            self.eval(&operands, in_shapes, out_shape)?
        };
        target.copy_from(&result).map_err(|detail| {
            crate::error::arg_err(self.name(), format!("in-place result: {detail}"))
        })
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// A condition on symbolic dims that a shape rule had to assume.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Condition {
    /// The two dims are equal.
    Equal(Dim, Dim),
    /// The dim is at least this size.
    AtLeast(Dim, usize),
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Condition::Equal(a, b) => write!(f, "{a} == {b}"),
            Condition::AtLeast(a, k) => write!(f, "{a} >= {k}"),
        }
    }
}

/// A condition with the op that recorded it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Guard {
    /// The op's name.
    pub op: String,
    /// The condition every call must satisfy.
    pub condition: Condition,
}

/// The context a shape rule runs in: it collects the guards a shapeless
/// trace relies on. With known dims it never records anything.
#[derive(Debug, Default)]
pub struct ShapeCx {
    op: String,
    /// The guards recorded so far.
    pub guards: Vec<Guard>,
}

impl ShapeCx {
    /// A fresh context.
    pub fn new() -> ShapeCx {
        ShapeCx::default()
    }

    /// Unifies two dims that must be equal. Known and different → `None`
    /// (the rule reports the error); equal as written or by what the trace
    /// already assumed ([`crate::symbolic`]) → that dim; otherwise
    /// the equality is recorded as a guard and the known (or first) dim is
    /// returned.
    pub fn unify(&mut self, a: &Dim, b: &Dim) -> Option<Dim> {
        match (a, b) {
            (Dim::Known(x), Dim::Known(y)) => (x == y).then(|| a.clone()),
            _ if crate::symbolic::dims_equal(a, b) => Some(a.clone()),
            _ => {
                self.guards.push(Guard {
                    op: self.op.clone(),
                    condition: Condition::Equal(a.clone(), b.clone()),
                });
                Some(if b.known().is_some() {
                    b.clone()
                } else {
                    a.clone()
                })
            }
        }
    }

    /// NumPy broadcasting of two dims: a known 1 yields the other; otherwise
    /// they must unify.
    pub fn broadcast(&mut self, a: &Dim, b: &Dim) -> Option<Dim> {
        match (a, b) {
            (Dim::Known(1), _) => Some(b.clone()),
            (_, Dim::Known(1)) => Some(a.clone()),
            _ => self.unify(a, b),
        }
    }

    /// Records that `d` must be at least `k` (a no-op when `d` is known;
    /// known dims are checked by the rule itself).
    pub fn require_at_least(&mut self, d: &Dim, k: usize) {
        if d.known().is_none() && k > 0 {
            self.guards.push(Guard {
                op: self.op.clone(),
                condition: Condition::AtLeast(d.clone(), k),
            });
        }
    }
}

#[cfg(test)]
mod arity_tests {
    use super::*;

    #[test]
    fn eval_with_the_wrong_operand_count_is_an_error_not_a_panic() {
        let x = HostData::F32(vec![1.0]);
        let err = Op::Binary(BinaryOp::Add)
            .eval(&[&x], &[&[1]], &[1])
            .unwrap_err();
        assert!(
            err.to_string().contains("expects 2 operands, got 1"),
            "{err}"
        );
        let err = Op::Unary(UnaryOp::Exp).eval(&[&x], &[], &[1]).unwrap_err();
        assert!(err.to_string().contains("operand shapes"), "{err}");
    }
}
