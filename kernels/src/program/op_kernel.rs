//! Which kernel, with which parameters, serves each op: the one place
//! that matches on op variants for the GPU.

use super::loc::Loc;
use super::lowering::Lowering;
use crate::abi::to_words;
use crate::family::MatmulVariant;
use crate::quant::{QmmBatch, QmmShape};
use crate::spec::{KernelError, KernelSpec, Target, View};
use kiln::{DType, Op, QuantKind, QuantOp, Result, ValueKind};

impl Lowering<'_> {
    /// The kernel computing op value `v`; `aliased[k]` marks operands that
    /// share the output's buffer (the plan reinplaced `v` into them).
    pub(super) fn spec(&self, v: usize, op: &Op, aliased: &[bool]) -> Result<KernelSpec> {
        let node = &self.exe.graph().nodes[v];
        let out_shape = &self.shapes[v];
        let dtype = node.aval.dtype;
        let in_shape = |k: usize| &self.shapes[node.inputs[k]][..];
        let in_dtype = |k: usize| self.dtype(node.inputs[k]);
        let kernel_err = |e: crate::KernelError| self.err(e.to_string());
        let target = self.target();
        if let Some(k) = (0..aliased.len()).find(|&k| aliased[k] && !op.may_write_over(k)) {
            return Err(self.err(format!(
                "`{}` cannot run in place of its operand {k} on {}",
                op.name(),
                self.caps.backend
            )));
        }
        let spec = match op {
            Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast(_) | Op::Fused(_) => {
                let mut views: Vec<View> = (0..node.inputs.len())
                    .map(|k| match self.scalar_constant(node.inputs[k]) {
                        Some(word) => View::inline(in_dtype(k), word),
                        None => View {
                            aliases_output: aliased.get(k) == Some(&true),
                            ..View::broadcast(in_dtype(k), in_shape(k), out_shape)
                        },
                    })
                    .collect();
                let locs = node
                    .inputs
                    .iter()
                    .map(|&j| self.loc(j))
                    .collect::<Result<Vec<_>>>()?;
                bind_once(&mut views, &locs);
                crate::source::elementwise(op, &views, out_shape, dtype, target)
            }
            Op::Permute(perm) => {
                let strides = kiln::shape::row_major_strides(in_shape(0));
                let permuted = perm.iter().map(|&p| strides[p]).collect();
                crate::layout::copy(
                    &View::strided(dtype, 0, permuted, out_shape),
                    out_shape,
                    target,
                )
            }
            Op::BroadcastTo(_) => crate::layout::copy(
                &View::broadcast(dtype, in_shape(0), out_shape),
                out_shape,
                target,
            ),
            Op::Slice(axes) => {
                let (offset, stepped) = kiln::ops::layout::slice_view(axes, in_shape(0));
                crate::layout::copy(
                    &View::strided(dtype, offset, stepped, out_shape),
                    out_shape,
                    target,
                )
            }
            Op::Concat { axis } => {
                let shapes: Vec<&[usize]> = (0..node.inputs.len()).map(in_shape).collect();
                crate::layout::concat(dtype, &shapes, *axis, out_shape, target)
            }
            Op::Take { axis } => crate::layout::take(
                dtype,
                in_shape(0),
                in_dtype(1),
                in_shape(1).iter().product(),
                *axis,
                out_shape,
                target,
            ),
            Op::ScatterAdd { axis, .. } => crate::scatter::scatter_add(
                dtype,
                in_dtype(1),
                in_shape(1).iter().product(),
                *axis,
                out_shape,
                target,
            ),
            Op::PadSlice { axes, .. } => crate::pad::pad_slice(dtype, axes, out_shape, target),
            Op::DynamicSlice { .. } => {
                let starts: Vec<DType> = (1..node.inputs.len()).map(in_dtype).collect();
                crate::dynamic::dynamic_slice(dtype, in_shape(0), &starts, out_shape, target)
            }
            Op::DynamicUpdateSlice => {
                let starts: Vec<DType> = (2..node.inputs.len()).map(in_dtype).collect();
                if aliased.first() == Some(&true) {
                    let window = crate::dynamic::dynamic_update_window(
                        dtype,
                        in_shape(0),
                        in_shape(1),
                        &starts,
                        target,
                    )
                    .map_err(kernel_err)?;
                    if let Some(window) = window {
                        return Ok(window);
                    }
                }
                crate::dynamic::dynamic_update_slice(
                    dtype,
                    in_shape(0),
                    in_shape(1),
                    &starts,
                    aliased.first() == Some(&true),
                    target,
                )
            }
            Op::Reduce {
                op: reduce, axes, ..
            } => {
                kiln::ops::reduce::check_nonempty(*reduce, axes, in_shape(0))?;
                crate::family::reduce(*reduce, in_dtype(0), in_shape(0), axes, target)
            }
            Op::ArgMax { axis, .. } => {
                kiln::ops::reduce::check_argmax_nonempty(*axis, in_shape(0))?;
                crate::family::argmax(in_dtype(0), in_shape(0), *axis, target)
            }
            Op::Argsort { axis, descending } => {
                crate::family::argsort(in_dtype(0), in_shape(0), *axis, *descending, target)
            }
            Op::Matmul | Op::TransposedMatmul { .. } => {
                let transposed = match op {
                    Op::TransposedMatmul { transposed } => *transposed,
                    _ => [false, false],
                };
                let a = in_shape(0);
                // k is a's last axis, or its second to last when transposed.
                let k_axis = a.len().wrapping_sub(if transposed[0] { 2 } else { 1 });
                let k = a.get(k_axis).copied().unwrap_or(0);
                let variant = self
                    .caps
                    .forced_matmul
                    .unwrap_or_else(|| MatmulVariant::choose(out_shape.iter().product(), k));
                let b = in_shape(1);
                crate::family::matmul(variant, dtype, a, b, out_shape, transposed, target)
            }
            Op::Kernel(call) => {
                let shapes: Vec<&[usize]> = (0..node.inputs.len()).map(in_shape).collect();
                let dtypes: Vec<DType> = (0..node.inputs.len()).map(in_dtype).collect();
                crate::user::user_kernel(call, &dtypes, &shapes, out_shape, dtype)
            }
            Op::Quant(q) => {
                let shapes: Vec<&[usize]> = (0..node.inputs.len()).map(in_shape).collect();
                quant_spec(q, &shapes, in_dtype, out_shape, target)
            }
            other => {
                return Err(self.err(format!(
                    "op `{}` has no {} kernel",
                    other.describe(),
                    self.caps.backend
                )))
            }
        };
        spec.map_err(kernel_err)
    }

    /// The storage word of value `v` when it is a one-element constant
    /// (inlined into a kernel's parameters instead of bound).
    pub(super) fn scalar_constant(&self, v: usize) -> Option<u32> {
        match &self.exe.graph().nodes[v].kind {
            ValueKind::Constant(literal) if literal.0.len() == 1 => {
                to_words(&literal.0).first().copied()
            }
            _ => None,
        }
    }

    /// The indexed axis of `take` or `scatter_add` value `v` and its size:
    /// the operand's axis for `take`, the output's for `scatter_add`.
    pub(super) fn indexed_axis(&self, v: usize, op: &Op) -> Option<(usize, usize)> {
        let (axis, shape) = match op {
            Op::Take { axis } => (*axis, &self.shapes[self.exe.graph().nodes[v].inputs[0]]),
            Op::ScatterAdd { axis, .. } => (*axis, &self.shapes[v]),
            _ => return None,
        };
        Some((axis, shape.get(axis).copied().unwrap_or(0)))
    }

    /// The message of an index out of range for `(axis, size)`.
    pub(super) fn out_of_range((axis, n): (usize, usize)) -> String {
        format!("an index is out of range for axis {axis} of size {n}")
    }
}

/// Marks each bound view whose range an earlier bound view already reads
/// (`x + x`) to be read through that one's binding: no dispatch binds
/// overlapping ranges.
pub(super) fn bind_once(views: &mut [View], locs: &[Loc]) {
    for k in 0..views.len().min(locs.len()) {
        let bound = |view: &View| !view.aliases_output && view.inline.is_none();
        if !bound(&views[k]) {
            continue;
        }
        let earlier =
            (0..k).find(|&j| bound(&views[j]) && views[j].same_as.is_none() && locs[j] == locs[k]);
        if let Some(j) = earlier.filter(|&j| views[j] == views[k]) {
            views[k].same_as = Some(j);
        }
    }
}

/// The kernel of quantization op `q` over contiguous operands of `shapes`
/// (dtypes from `in_dtype`) into `out_shape`.
fn quant_spec(
    q: &QuantOp,
    shapes: &[&[usize]],
    in_dtype: impl Fn(usize) -> DType,
    out_shape: &[usize],
    target: Target,
) -> std::result::Result<KernelSpec, KernelError> {
    let numel = |s: &[usize]| s.iter().product::<usize>();
    let last = |s: &[usize]| s.last().copied().unwrap_or(0);
    let batch = |s: &[usize]| s[..s.len().saturating_sub(2)].to_vec();
    let format = q.format;
    let weight = 2 + usize::from(format.has_biases());
    // The stored weight's [..., rows, cols] from packed codes and scales.
    let cols = |packed: &[usize], scales: &[usize]| match format.group_size() {
        Some(g) => last(scales) * g,
        None => last(packed) * 4,
    };
    let product = |k_shapes: &[&[usize]], transpose: bool, batch| {
        let (x, packed) = (k_shapes[0], k_shapes[1]);
        let rank = packed.len();
        let rows = packed.get(rank.wrapping_sub(2)).copied().unwrap_or(1);
        let c = cols(packed, k_shapes[2]);
        QmmShape {
            m: x.get(x.len().wrapping_sub(2)).copied().unwrap_or(1),
            k: last(x),
            n: if transpose { rows } else { c },
            transpose,
            batch,
        }
    };
    match q.kind {
        QuantKind::Quantize(part) => crate::quant::quantize(
            format,
            part,
            in_dtype(0),
            numel(shapes[0]),
            last(shapes[0]),
            target,
        ),
        QuantKind::Dequantize => crate::quant::dequantize(
            format,
            in_dtype(1),
            numel(out_shape),
            cols(shapes[0], shapes[1]),
            target,
        ),
        QuantKind::Matmul { transpose } => {
            let out_batch = batch(out_shape);
            let geometry = product(
                shapes,
                transpose,
                QmmBatch::Broadcast {
                    batch: out_batch,
                    x_batch: batch(shapes[0]),
                    w_batch: batch(shapes[1]),
                },
            );
            crate::quant::quantized_matmul(format, in_dtype(0), &geometry, target)
        }
        QuantKind::GatherMatmul { transpose } => {
            let geometry = product(
                shapes,
                transpose,
                QmmBatch::Gather {
                    batch: batch(out_shape),
                    lhs: (shapes[weight + 1].to_vec(), in_dtype(weight + 1)),
                    rhs: (shapes[weight + 2].to_vec(), in_dtype(weight + 2)),
                    x_count: numel(&batch(shapes[0])),
                    w_count: numel(&batch(shapes[1])),
                },
            );
            crate::quant::quantized_matmul(format, in_dtype(0), &geometry, target)
        }
    }
}
