//! What one executable does on the device for one set of resolved shapes:
//! the kernel of every step with its parameter buffer, and the buffers of
//! its intermediate values. Built on the first call with those shapes and
//! replayed by every later one.

use crate::buffer::{byte_size, to_words};
use crate::Shared;
use kiln::ops::{FusedArg, FusedKernel};
use kiln::plan::Home;
use kiln::{
    CustomCall, DType, Error, Executable, HostData, Op, QuantKind, QuantOp, Result, ValueKind,
};
use kiln_kernels::{KernelSpec, Launch, MatmulVariant, QmmBatch, QmmShape, View};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Where a value's elements live during a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loc {
    /// Argument buffer `i`.
    Input(usize),
    /// Buffer `t` the plan owns (constants, intermediates, scratch).
    Temp(usize),
    /// The buffer returned as output `o`, taken from the pool per call.
    Output(usize),
}

/// One command of a call.
pub(crate) enum Command {
    /// A compute dispatch: bindings are [params, output, operands...].
    Dispatch {
        pipeline: Arc<wgpu::ComputePipeline>,
        layout: Arc<wgpu::BindGroupLayout>,
        params: wgpu::Buffer,
        bindings: Vec<Loc>,
        workgroups: [u32; 3],
        /// Made once when every binding is plan-owned.
        bind_group: Option<wgpu::BindGroup>,
    },
    /// A buffer copy of `bytes`.
    Copy { from: Loc, to: Loc, bytes: u64 },
}

/// A status word a kernel lowers from `u32::MAX` to the first position of
/// bad input (see `KernelSpec::status`).
pub(crate) struct Check {
    /// The plan-owned buffer holding it.
    pub temp: usize,
    /// The op that checks.
    pub op: String,
    /// What went wrong, before the position.
    pub detail: String,
}

/// The device program of one executable for one shape set.
pub(crate) struct Plan {
    /// The shapes it was built for.
    pub shapes: Vec<Vec<usize>>,
    pub commands: Vec<Command>,
    pub temps: Vec<wgpu::Buffer>,
    /// Per output: dtype and element count.
    pub outputs: Vec<(DType, usize)>,
    /// Arguments some kernel writes in place (donated ones).
    pub written_inputs: Vec<usize>,
    /// Status words, copied out by every call and read back with its
    /// outputs (shared with each call's [`crate::buffer::StatusWords`]).
    pub checks: Arc<[Check]>,
    /// Bind groups of dispatches naming argument or output buffers.
    pub bind_groups: Mutex<CallBindGroups>,
}

/// A plan's bind groups over call buffers, by command index and the
/// buffers bound. Each group holds its buffers, so the groups are dropped
/// whenever the pool has released buffers since they were made
/// (`pool_evictions` is the pool's count then): a released buffer's memory
/// is freed only once no group names it.
#[derive(Default)]
pub(crate) struct CallBindGroups {
    pub groups: HashMap<(usize, Vec<wgpu::Buffer>), wgpu::BindGroup>,
    pub pool_evictions: u64,
}

fn backend_err(detail: String) -> Error {
    Error::Backend {
        backend: "wgpu".into(),
        detail,
    }
}

/// Splits `workgroups` over x, y and z, each at most `max`.
fn split(op: &str, workgroups: u64, max: u32) -> Result<[u32; 3]> {
    let max = u64::from(max.max(1));
    let x = workgroups.min(max);
    let rest = workgroups.div_ceil(x.max(1));
    let y = rest.min(max);
    let z = rest.div_ceil(y.max(1));
    if z > max {
        return Err(backend_err(format!(
            "`{op}` needs {workgroups} workgroups, more than {max}³"
        )));
    }
    Ok([x as u32, y as u32, z as u32])
}

/// The grid of a user kernel, checked against the adapter's limits: an
/// oversize workgroup or grid is an `Err`, never a launch that runs part
/// of the kernel.
fn check_launch(op: &str, launch: &Launch, limits: &wgpu::Limits) -> Result<[u32; 3]> {
    let [x, y, z] = launch.workgroup_size;
    let invocations = u64::from(x) * u64::from(y) * u64::from(z);
    let per_axis = [
        limits.max_compute_workgroup_size_x,
        limits.max_compute_workgroup_size_y,
        limits.max_compute_workgroup_size_z,
    ];
    if launch
        .workgroup_size
        .iter()
        .zip(per_axis)
        .any(|(&size, max)| size > max)
        || invocations > u64::from(limits.max_compute_invocations_per_workgroup)
    {
        return Err(Error::Kernel {
            kernel: op.to_string(),
            detail: format!(
                "its @workgroup_size({x}, {y}, {z}) ({invocations} invocations) exceeds the \
                 adapter's limits: at most {per_axis:?} per axis and {} invocations",
                limits.max_compute_invocations_per_workgroup
            ),
        });
    }
    let max = limits.max_compute_workgroups_per_dimension;
    if launch.grid.iter().any(|&g| g > max) {
        return Err(Error::Kernel {
            kernel: op.to_string(),
            detail: format!(
                "its grid {:?} has more than the adapter's {max} workgroups per dimension",
                launch.grid
            ),
        });
    }
    Ok(launch.grid)
}

struct Builder<'a> {
    shared: &'a Shared,
    exe: &'a Executable,
    shapes: &'a [Vec<usize>],
    locs: Vec<Option<Loc>>,
    commands: Vec<Command>,
    temps: Vec<wgpu::Buffer>,
    checks: Vec<Check>,
}

impl Builder<'_> {
    fn dtype(&self, v: usize) -> DType {
        self.exe.graph().nodes[v].aval.dtype
    }

    fn numel(&self, v: usize) -> usize {
        self.shapes[v].iter().product()
    }

    /// A new plan-owned buffer of `bytes`, checked against the device limits.
    fn temp(&mut self, op: &str, bytes: u64) -> Result<Loc> {
        self.shared.check_size(op, bytes)?;
        self.temps.push(self.shared.new_buffer(bytes));
        Ok(Loc::Temp(self.temps.len() - 1))
    }

    /// A plan-owned buffer holding `data`.
    fn upload_temp(&mut self, op: &str, data: &HostData) -> Result<Loc> {
        let loc = self.temp(op, byte_size(data.dtype(), data.len()))?;
        if let (Loc::Temp(t), false) = (loc, data.is_empty()) {
            self.shared.gpu.queue.write_buffer(
                &self.temps[t],
                0,
                bytemuck::cast_slice(&to_words(data)),
            );
        }
        Ok(loc)
    }

    fn loc(&self, v: usize) -> Result<Loc> {
        self.locs[v].ok_or_else(|| backend_err(format!("value {v} is read before it is computed")))
    }

    /// Records one dispatch; `bad_input` is the message for a kernel that
    /// reports bad input through a status word.
    fn dispatch(
        &mut self,
        op: &str,
        spec: KernelSpec,
        mut bindings: Vec<Loc>,
        bad_input: Option<String>,
    ) -> Result<()> {
        if spec.workgroups == 0 {
            return Ok(());
        }
        let limits = &self.shared.gpu.limits;
        let max = limits.max_compute_workgroups_per_dimension;
        let workgroups = match &spec.launch {
            None => split(op, spec.workgroups, max)?,
            Some(launch) => check_launch(op, launch, limits)?,
        };
        let operands = bindings.len() - 1;
        if spec.status {
            let word = self.temp(op, 4)?;
            if let Loc::Temp(t) = word {
                self.checks.push(Check {
                    temp: t,
                    op: op.to_string(),
                    detail: bad_input.unwrap_or_else(|| format!("`{op}` reported bad input")),
                });
            }
            bindings.push(word);
        }
        let entry_point = spec.launch.as_ref().map_or("main", |l| &l.entry_point);
        let (pipeline, layout) =
            self.shared
                .pipeline(op, &spec.source, entry_point, operands, spec.status)?;
        let params = self.shared.new_buffer(4 * spec.params.len().max(1) as u64);
        self.shared
            .gpu
            .queue
            .write_buffer(&params, 0, bytemuck::cast_slice(&spec.params));
        let bind_group = bindings.iter().all(|l| matches!(l, Loc::Temp(_))).then(|| {
            let buffers: Vec<&wgpu::Buffer> = bindings
                .iter()
                .filter_map(|l| match l {
                    Loc::Temp(t) => self.temps.get(*t),
                    _ => None,
                })
                .collect();
            self.shared.bind_group(&layout, &params, &buffers)
        });
        self.commands.push(Command::Dispatch {
            pipeline,
            layout,
            params,
            bindings,
            workgroups,
            bind_group,
        });
        Ok(())
    }

    /// Records a kernel writing value `v` (at `out`) from `operands`; for
    /// kernels that write f32 words for f16/bf16 results, through a scratch
    /// buffer and a packing cast. `bad_input` as for [`Self::dispatch`].
    fn kernel(
        &mut self,
        v: usize,
        out: Loc,
        spec: KernelSpec,
        operands: Vec<Loc>,
        bad_input: Option<String>,
    ) -> Result<()> {
        let op = self.op_name(v);
        let dtype = self.dtype(v);
        let packs = kiln_kernels::stores_f32(dtype)
            && matches!(
                self.node_op(v),
                Some(Op::Reduce { .. } | Op::Matmul | Op::Quant(_))
            );
        let mut bound = Vec::with_capacity(spec.bound.len());
        for &k in &spec.bound {
            bound.push(*operands.get(k).ok_or_else(|| {
                backend_err(format!(
                    "the `{op}` kernel binds operand {k} of {}",
                    operands.len()
                ))
            })?);
        }
        let storage_limit = self.shared.gpu.limits.max_storage_buffers_per_shader_stage as usize;
        if bound.len() + 2 + usize::from(spec.status) > storage_limit {
            return Err(backend_err(format!(
                "`{op}` reads {} buffers, more than the {} storage buffers the adapter allows \
                 per kernel (with parameters and output)",
                bound.len(),
                storage_limit
            )));
        }
        if !packs {
            let mut bindings = vec![out];
            bindings.extend(bound);
            return self.dispatch(&op, spec, bindings, bad_input);
        }
        let n = self.numel(v);
        let scratch = self.temp(&op, byte_size(DType::F32, n))?;
        let mut bindings = vec![scratch];
        bindings.extend(bound);
        self.dispatch(&op, spec, bindings, bad_input)?;
        let shape = [n];
        let pack = kiln_kernels::elementwise(
            &Op::Cast(dtype),
            &[View::contiguous(DType::F32, &shape)],
            &shape,
            dtype,
            self.shared.target,
        )
        .map_err(|e| backend_err(e.to_string()))?;
        self.dispatch(&op, pack, vec![out, scratch], None)
    }

    /// Records custom op `v`: the commands of its forward's executable for
    /// these operand shapes, built as a plan of its own and spliced in, its
    /// arguments read from `operands` and its result written to `out`.
    fn custom_op(&mut self, v: usize, call: &CustomCall, out: Loc, operands: &[Loc]) -> Result<()> {
        let node = &self.exe.graph().nodes[v];
        let body_operands: Vec<(DType, &[usize])> = node
            .inputs
            .iter()
            .map(|&j| (self.dtype(j), &self.shapes[j][..]))
            .collect();
        let body = call.body(&body_operands)?;
        let in_shapes: Vec<&[usize]> = body_operands.iter().map(|(_, s)| *s).collect();
        let shapes = body.resolve_shapes(&in_shapes)?;
        let sub = build(self.shared, &body, &shapes)?;
        let offset = self.temps.len();
        let relocate = |loc: Loc| -> Result<Loc> {
            match loc {
                Loc::Input(i) => operands.get(i).copied().ok_or_else(|| {
                    backend_err(format!(
                        "`{}` reads argument {i} of its forward",
                        call.name()
                    ))
                }),
                Loc::Temp(t) => Ok(Loc::Temp(t + offset)),
                Loc::Output(0) => Ok(out),
                Loc::Output(o) => Err(backend_err(format!(
                    "the forward of `{}` has output {o}; a custom op returns one array",
                    call.name()
                ))),
            }
        };
        for command in sub.commands {
            self.commands.push(match command {
                Command::Dispatch {
                    pipeline,
                    layout,
                    params,
                    bindings,
                    workgroups,
                    bind_group,
                } => Command::Dispatch {
                    pipeline,
                    layout,
                    params,
                    bindings: bindings.into_iter().map(relocate).collect::<Result<_>>()?,
                    workgroups,
                    bind_group,
                },
                Command::Copy { from, to, bytes } => Command::Copy {
                    from: relocate(from)?,
                    to: relocate(to)?,
                    bytes,
                },
            });
        }
        self.temps.extend(sub.temps);
        self.checks.extend(sub.checks.iter().map(|check| Check {
            temp: check.temp + offset,
            op: check.op.clone(),
            detail: check.detail.clone(),
        }));
        Ok(())
    }

    /// Runs fused group `v` one member op per kernel, through buffers of
    /// its own for the intermediate values: for a group reading more
    /// buffers than the adapter lets one kernel bind. `operands` and
    /// `aliased` are the group's, as for [`Self::spec`].
    fn fused_in_steps(
        &mut self,
        v: usize,
        out: Loc,
        group: &FusedKernel,
        operands: &[Loc],
        aliased: &[bool],
    ) -> Result<()> {
        let inputs = self.exe.graph().nodes[v].inputs.clone();
        let target = self.shared.target;
        let steps = group.steps();
        let mut done: Vec<(Loc, Vec<usize>, DType)> = Vec::with_capacity(steps.len());
        for (j, step) in steps.iter().enumerate() {
            let last = j + 1 == steps.len();
            let mut args: Vec<(Loc, Vec<usize>, DType, Option<usize>)> = Vec::new();
            for arg in &step.args {
                args.push(match *arg {
                    FusedArg::Input(k) => {
                        let value = *inputs.get(k).ok_or_else(|| {
                            backend_err(format!("fused group {v} reads operand {k}"))
                        })?;
                        let loc = *operands.get(k).ok_or_else(|| {
                            backend_err(format!("fused group {v} reads operand {k}"))
                        })?;
                        (loc, self.shapes[value].clone(), self.dtype(value), Some(k))
                    }
                    FusedArg::Step(i) => {
                        let (loc, shape, dtype) = done.get(i).cloned().ok_or_else(|| {
                            backend_err(format!("fused group {v} reads step {i} before it"))
                        })?;
                        (loc, shape, dtype, None)
                    }
                });
            }
            let shapes: Vec<&[usize]> = args.iter().map(|a| &a.1[..]).collect();
            let shape = broadcast_shape(&shapes);
            let dtype = match &step.op {
                Op::Binary(b) if b.is_comparison() => DType::Bool,
                Op::Cast(d) => *d,
                Op::Select => args.get(1).map_or(DType::F32, |a| a.2),
                _ => args.first().map_or(DType::F32, |a| a.2),
            };
            let views: Vec<View> = args
                .iter()
                .map(|(_, arg_shape, arg_dtype, input)| {
                    let constant = input.and_then(|k| self.scalar_constant(inputs[k]));
                    match constant {
                        Some(word) => View::inline(*arg_dtype, word),
                        None => View {
                            // Only the last step writes the group's buffer.
                            aliases_output: last
                                && input.is_some_and(|k| aliased.get(k) == Some(&true)),
                            ..View::broadcast(*arg_dtype, arg_shape, &shape)
                        },
                    }
                })
                .collect();
            let spec = kiln_kernels::elementwise(&step.op, &views, &shape, dtype, target)
                .map_err(|e| backend_err(e.to_string()))?;
            let step_out = if last {
                out
            } else {
                let numel = shape.iter().product();
                self.temp(step.op.name(), byte_size(dtype, numel))?
            };
            let locs: Vec<Loc> = args.iter().map(|a| a.0).collect();
            self.kernel(v, step_out, spec, locs, None)?;
            done.push((step_out, shape, dtype));
        }
        Ok(())
    }

    /// The storage word of value `v` when it is a one-element constant.
    fn scalar_constant(&self, v: usize) -> Option<u32> {
        match &self.exe.graph().nodes[v].kind {
            ValueKind::Constant(literal) if literal.0.len() == 1 => {
                to_words(&literal.0).first().copied()
            }
            _ => None,
        }
    }

    fn node_op(&self, v: usize) -> Option<&Op> {
        match &self.exe.graph().nodes[v].kind {
            ValueKind::Op(op) => Some(op),
            _ => None,
        }
    }

    fn op_name(&self, v: usize) -> String {
        self.node_op(v)
            .map_or_else(|| "value".to_string(), |op| op.name().to_string())
    }

    /// The indexed axis of `take` or `scatter_add` value `v` and its size:
    /// the operand's axis for `take`, the output's for `scatter_add`.
    fn indexed_axis(&self, v: usize, op: &Op) -> Option<(usize, usize)> {
        let (axis, shape) = match op {
            Op::Take { axis } => (*axis, &self.shapes[self.exe.graph().nodes[v].inputs[0]]),
            Op::ScatterAdd { axis, .. } => (*axis, &self.shapes[v]),
            _ => return None,
        };
        Some((axis, shape.get(axis).copied().unwrap_or(0)))
    }

    /// Checks the indices of `take` or `scatter_add` value `v`, which has
    /// no elements, so its own kernel (which checks them) never runs.
    fn check_indices_of_empty(&mut self, v: usize, op: &Op) -> Result<()> {
        let Some((axis, n)) = self.indexed_axis(v, op) else {
            return Ok(());
        };
        let indices = self.exe.graph().nodes[v].inputs[1];
        let count = self.numel(indices);
        if count == 0 {
            return Ok(());
        }
        let check = kiln_kernels::check_indices(
            op.name(),
            self.dtype(indices),
            count,
            n,
            self.shared.target,
        )
        .map_err(|e| backend_err(e.to_string()))?;
        let Some(spec) = check else {
            return Ok(());
        };
        let scratch = self.temp(op.name(), byte_size(DType::U32, count))?;
        let read = self.loc(indices)?;
        self.dispatch(
            op.name(),
            spec,
            vec![scratch, read],
            Some(out_of_range((axis, n))),
        )
    }

    /// The kernel computing op value `v`; `aliased[k]` marks operands that
    /// share the output's buffer (the plan reinplaced `v` into them).
    fn spec(&self, v: usize, op: &Op, aliased: &[bool]) -> Result<KernelSpec> {
        let node = &self.exe.graph().nodes[v];
        let out_shape = &self.shapes[v];
        let dtype = node.aval.dtype;
        let in_shape = |k: usize| &self.shapes[node.inputs[k]][..];
        let in_dtype = |k: usize| self.dtype(node.inputs[k]);
        let kernel_err = |e: kiln_kernels::KernelError| backend_err(e.to_string());
        let target = self.shared.target;
        if let Some(k) = (0..aliased.len()).find(|&k| aliased[k] && !op.may_write_over(k)) {
            return Err(backend_err(format!(
                "`{}` cannot run in place of its operand {k} on wgpu",
                op.name()
            )));
        }
        let spec = match op {
            Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast(_) | Op::Fused(_) => {
                let views: Vec<View> = (0..node.inputs.len())
                    .map(|k| match self.scalar_constant(node.inputs[k]) {
                        Some(word) => View::inline(in_dtype(k), word),
                        None => View {
                            aliases_output: aliased.get(k) == Some(&true),
                            ..View::broadcast(in_dtype(k), in_shape(k), out_shape)
                        },
                    })
                    .collect();
                kiln_kernels::elementwise(op, &views, out_shape, dtype, target)
            }
            Op::Permute(perm) => {
                let strides = kiln_kernels::row_major_strides(in_shape(0));
                let permuted = perm.iter().map(|&p| strides[p]).collect();
                kiln_kernels::copy(
                    &View::strided(dtype, 0, permuted, out_shape),
                    out_shape,
                    target,
                )
            }
            Op::BroadcastTo(_) => kiln_kernels::copy(
                &View::broadcast(dtype, in_shape(0), out_shape),
                out_shape,
                target,
            ),
            Op::Slice(axes) => {
                let (offset, stepped) = kiln::ops::layout::slice_view(axes, in_shape(0));
                kiln_kernels::copy(
                    &View::strided(dtype, offset, stepped, out_shape),
                    out_shape,
                    target,
                )
            }
            Op::Concat { axis } => {
                let shapes: Vec<&[usize]> = (0..node.inputs.len()).map(in_shape).collect();
                kiln_kernels::concat(dtype, &shapes, *axis, out_shape, target)
            }
            Op::Take { axis } => kiln_kernels::take(
                dtype,
                in_shape(0),
                in_dtype(1),
                in_shape(1).iter().product(),
                *axis,
                out_shape,
                target,
            ),
            Op::ScatterAdd { axis, .. } => kiln_kernels::scatter_add(
                dtype,
                in_dtype(1),
                in_shape(1).iter().product(),
                *axis,
                out_shape,
                target,
            ),
            Op::PadSlice { axes, .. } => kiln_kernels::pad_slice(dtype, axes, out_shape, target),
            Op::Reduce {
                op: reduce, axes, ..
            } => {
                let group: usize = axes.iter().map(|&a| in_shape(0)[a]).product();
                if *reduce != kiln::ReduceOp::Sum && group == 0 && !out_shape.contains(&0) {
                    return Err(Error::Runtime {
                        op: reduce.name().to_string(),
                        detail: format!(
                            "cannot take the {} of an empty axis (shape {:?}, axes {axes:?})",
                            reduce.name(),
                            in_shape(0)
                        ),
                    });
                }
                kiln_kernels::reduce(*reduce, in_dtype(0), in_shape(0), axes, target)
            }
            Op::ArgMax { axis, .. } => {
                if in_shape(0).get(*axis) == Some(&0) && !out_shape.contains(&0) {
                    return Err(Error::Runtime {
                        op: "argmax".into(),
                        detail: format!(
                            "cannot take the argmax of an empty axis {axis} (shape {:?})",
                            in_shape(0)
                        ),
                    });
                }
                kiln_kernels::argmax(in_dtype(0), in_shape(0), *axis, target)
            }
            Op::Matmul => {
                let a = in_shape(0);
                let k = a.get(a.len().wrapping_sub(1)).copied().unwrap_or(0);
                let variant = self
                    .shared
                    .matmul_variant
                    .unwrap_or_else(|| MatmulVariant::choose(out_shape.iter().product(), k));
                kiln_kernels::matmul(variant, dtype, a, in_shape(1), out_shape, target)
            }
            Op::Kernel(call) => {
                let shapes: Vec<&[usize]> = (0..node.inputs.len()).map(in_shape).collect();
                let dtypes: Vec<DType> = (0..node.inputs.len()).map(in_dtype).collect();
                kiln_kernels::user_kernel(call, &dtypes, &shapes, out_shape, dtype)
            }
            Op::Quant(q) => {
                let shapes: Vec<&[usize]> = (0..node.inputs.len()).map(in_shape).collect();
                quant_spec(q, &shapes, in_dtype, out_shape, target)
            }
            other => {
                return Err(backend_err(format!(
                    "op `{}` has no wgpu kernel",
                    other.describe()
                )))
            }
        };
        spec.map_err(kernel_err)
    }
}

/// The kernel of quantization op `q` over contiguous operands of `shapes`
/// (dtypes from `in_dtype`) into `out_shape`.
fn quant_spec(
    q: &QuantOp,
    shapes: &[&[usize]],
    in_dtype: impl Fn(usize) -> DType,
    out_shape: &[usize],
    target: kiln_kernels::Target,
) -> std::result::Result<KernelSpec, kiln_kernels::KernelError> {
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
        QuantKind::Quantize(part) => kiln_kernels::quantize(
            format,
            part,
            in_dtype(0),
            numel(shapes[0]),
            last(shapes[0]),
            target,
        ),
        QuantKind::Dequantize => kiln_kernels::dequantize(
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
            kiln_kernels::quantized_matmul(format, in_dtype(0), &geometry, target)
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
            kiln_kernels::quantized_matmul(format, in_dtype(0), &geometry, target)
        }
    }
}

/// The message of an index out of range for `(axis, size)`.
fn out_of_range((axis, n): (usize, usize)) -> String {
    format!("an index is out of range for axis {axis} of size {n}")
}

/// The NumPy broadcast of `shapes`.
fn broadcast_shape(shapes: &[&[usize]]) -> Vec<usize> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    (0..rank)
        .map(|d| {
            shapes
                .iter()
                .filter_map(|s| s.len().checked_sub(rank - d).map(|i| s[i]))
                .find(|&n| n != 1)
                .unwrap_or(1)
        })
        .collect()
}

/// Host data of a `dim_size` value.
fn dim_size(axes: &[usize], dtype: DType, in_shape: &[usize]) -> HostData {
    let count: usize = axes.iter().map(|&a| in_shape[a]).product();
    HostData::from_f64s(dtype, std::iter::once(count as f64))
}

/// Bytes of one element in a slot: f16 and bf16 are packed two per word,
/// every other dtype takes a word.
fn slot_element_bytes(dtype: DType) -> usize {
    if matches!(dtype, DType::F16 | DType::BF16) {
        2
    } else {
        4
    }
}

/// Builds the device program of `exe` for `shapes`: every computed value
/// lives in the buffer of its plan slot (an in-place value in its
/// operand's), except outputs, which are written straight into the
/// buffers returned to the caller.
pub(crate) fn build(shared: &Shared, exe: &Executable, shapes: &[Vec<usize>]) -> Result<Plan> {
    let graph = exe.graph();
    let slot_plan = exe.plan();
    let mut b = Builder {
        shared,
        exe,
        shapes,
        locs: vec![None; graph.nodes.len()],
        commands: Vec::new(),
        temps: Vec::new(),
        checks: Vec::new(),
    };
    let slot_bytes = slot_plan.slot_bytes(graph, shapes, slot_element_bytes);
    let mut slot_locs: Vec<Option<Loc>> = vec![None; slot_bytes.len()];
    // Each computed output value is written straight into its first output
    // buffer; every other output position gets a copy.
    let mut claimed: Vec<Option<usize>> = vec![None; graph.nodes.len()];
    for (o, &v) in graph.outputs.iter().enumerate() {
        if matches!(graph.nodes[v].kind, ValueKind::Op(_)) && claimed[v].is_none() {
            claimed[v] = Some(o);
        }
    }
    for (v, node) in graph.nodes.iter().enumerate() {
        let bytes = byte_size(node.aval.dtype, b.numel(v));
        let op = match &node.kind {
            ValueKind::Input(i) => {
                b.locs[v] = Some(Loc::Input(*i));
                continue;
            }
            ValueKind::Constant(literal) => {
                let loc = b.upload_temp("constant", &literal.0)?;
                b.locs[v] = Some(loc);
                continue;
            }
            ValueKind::Op(op) => op,
        };
        let out = match (claimed[v], slot_plan.home(v)) {
            (Some(o), _) => {
                shared.check_size(op.name(), bytes)?;
                Loc::Output(o)
            }
            (None, Home::Input(i)) => Loc::Input(i),
            (None, Home::Slot(s)) => match slot_locs.get(s).copied().flatten() {
                Some(loc) => loc,
                None => {
                    let size = slot_bytes.get(s).copied().unwrap_or(0).max(16) as u64;
                    let loc = b.temp(op.name(), size.max(bytes))?;
                    if let Some(entry) = slot_locs.get_mut(s) {
                        *entry = Some(loc);
                    }
                    loc
                }
            },
            (None, Home::Constant) => {
                return Err(backend_err(format!(
                    "the plan places computed value {v} (`{}`) in a constant",
                    op.name()
                )))
            }
        };
        match op {
            // The simplify pass removes stop_gradient; a copy if one remains.
            Op::Reshape(_) | Op::StopGradient => {
                let from = b.loc(node.inputs[0])?;
                b.commands.push(Command::Copy {
                    from,
                    to: out,
                    bytes,
                });
            }
            Op::DimSize { axes, dtype } => {
                let data = dim_size(axes, *dtype, &shapes[node.inputs[0]]);
                let from = b.upload_temp("dim_size", &data)?;
                b.commands.push(Command::Copy {
                    from,
                    to: out,
                    bytes,
                });
            }
            // An empty value needs no kernel; its dims may still be far
            // beyond what a kernel's 32-bit indexing could describe. Its
            // indices are still checked, as the reference checks them.
            _ if b.numel(v) == 0 => b.check_indices_of_empty(v, op)?,
            _ => {
                let mut operands = Vec::with_capacity(node.inputs.len());
                let mut aliased = Vec::with_capacity(node.inputs.len());
                for &j in &node.inputs {
                    let loc = b.loc(j)?;
                    let shares = loc == out;
                    if shares && slot_plan.in_place_of(v) != Some(j) {
                        return Err(backend_err(format!(
                            "value {v} (`{}`) would overwrite its operand {j}, which the plan \
                             does not allow",
                            op.name()
                        )));
                    }
                    aliased.push(shares);
                    operands.push(loc);
                }
                if let Op::Custom(call) = op {
                    b.custom_op(v, call, out, &operands)?;
                    b.locs[v] = Some(out);
                    continue;
                }
                let spec = b.spec(v, op, &aliased)?;
                if let Op::Kernel(call) = op {
                    // An in-place kernel finds its input in the output; when
                    // the plan gave the output its own buffer, copy it there.
                    if let Some(k) = call.kernel.in_place().filter(|&k| !aliased[k]) {
                        b.commands.push(Command::Copy {
                            from: operands[k],
                            to: out,
                            bytes,
                        });
                    }
                }
                if let Op::Fused(group) = op {
                    let limit = shared.gpu.limits.max_storage_buffers_per_shader_stage as usize;
                    if spec.bound.len() + 2 > limit {
                        b.fused_in_steps(v, out, group, &operands, &aliased)?;
                        b.locs[v] = Some(out);
                        continue;
                    }
                }
                let bad_input = match op {
                    Op::Quant(q) if matches!(q.kind, QuantKind::GatherMatmul { .. }) => Some(
                        "lhs_indices or rhs_indices name a matrix out of range for output \
                         batch entry"
                            .to_string(),
                    ),
                    _ => b.indexed_axis(v, op).map(out_of_range),
                };
                b.kernel(v, out, spec, operands, bad_input)?;
            }
        }
        b.locs[v] = Some(out);
    }
    let mut outputs = Vec::with_capacity(graph.outputs.len());
    for (o, &v) in graph.outputs.iter().enumerate() {
        let dtype = b.dtype(v);
        let len = b.numel(v);
        let bytes = byte_size(dtype, len);
        if claimed[v] != Some(o) {
            let from = b.loc(v)?;
            shared.check_size("output", bytes)?;
            b.commands.push(Command::Copy {
                from,
                to: Loc::Output(o),
                bytes,
            });
        }
        outputs.push((dtype, len));
    }
    let mut written_inputs: Vec<usize> = b
        .commands
        .iter()
        .filter_map(|command| match command {
            Command::Dispatch { bindings, .. } => match bindings.first() {
                Some(Loc::Input(i)) => Some(*i),
                _ => None,
            },
            Command::Copy {
                to: Loc::Input(i), ..
            } => Some(*i),
            Command::Copy { .. } => None,
        })
        .collect();
    written_inputs.sort_unstable();
    written_inputs.dedup();
    Ok(Plan {
        shapes: shapes.to_vec(),
        commands: b.commands,
        temps: b.temps,
        outputs,
        written_inputs,
        checks: b.checks.into(),
        bind_groups: Mutex::default(),
    })
}
