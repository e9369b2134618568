//! The graph walk: every value placed, every op lowered in schedule order,
//! then the steps resolved into a [`Program`].

use super::arena::ArenaBuilder;
use super::loc::{Cmd, Loc, Place};
use super::types::{Buffer, Caps, Check, Dispatch, OutputInfo, Program, Range, Step};
use crate::abi::{storage_bytes, to_words};
use crate::spec::{KernelSpec, Launch, Target};
use kiln::plan::{Arena, Home};
use kiln::{DType, Error, Executable, Op, QuantKind, Result, ValueKind};

/// Lowers `exe` for values of `shapes` (one per graph value, as
/// [`Executable::resolve_shapes`] gives them) to a [`Program`] within
/// `caps`. Values live at their planned slot offsets in the arena (an
/// in-place value in its operand's range); each output is written straight
/// into its output buffer. Ops without a kernel, sizes beyond the caps and
/// bad static input are `Err`s naming the op.
pub fn lower(exe: &Executable, shapes: &[Vec<usize>], caps: &Caps) -> Result<Program> {
    lower_with(exe, shapes, caps, false)
}

/// [`lower`] for a loop body or branch: an output the plan wrote in place
/// of a donated input (a carry updated in place) stays in that input's
/// range, and its copy to the output is a copy onto itself when the
/// caller gives the two one range.
pub(super) fn lower_body(exe: &Executable, shapes: &[Vec<usize>], caps: &Caps) -> Result<Program> {
    lower_with(exe, shapes, caps, true)
}

fn lower_with(
    exe: &Executable,
    shapes: &[Vec<usize>],
    caps: &Caps,
    outputs_stay_in_donated_inputs: bool,
) -> Result<Program> {
    let graph = exe.graph();
    if shapes.len() != graph.nodes.len() {
        return Err(lowering_err(
            caps,
            format!(
                "{} value shapes for a graph of {} values",
                shapes.len(),
                graph.nodes.len()
            ),
        ));
    }
    if caps.binding_offset_alignment as usize > kiln::plan::SLOT_ALIGN
        || !caps.binding_offset_alignment.is_power_of_two()
    {
        return Err(lowering_err(
            caps,
            format!(
                "binding offsets aligned to {} bytes; slots are aligned to {}",
                caps.binding_offset_alignment,
                kiln::plan::SLOT_ALIGN
            ),
        ));
    }
    let plan = exe.plan();
    let slots = plan.arena(graph, shapes, crate::abi::element_bytes);
    let mut lowering = Lowering {
        exe,
        shapes,
        caps,
        arena: ArenaBuilder::new(slots.size as u64),
        locs: vec![None; graph.nodes.len()],
        steps: Vec::new(),
        owners: Vec::new(),
        checks: Vec::new(),
    };
    // Each computed output value is written straight into its first output
    // buffer; every other output position gets a copy.
    let mut claimed: Vec<Option<usize>> = vec![None; graph.nodes.len()];
    for (o, &v) in graph.outputs.iter().enumerate() {
        let stays = outputs_stay_in_donated_inputs && matches!(plan.home(v), Home::Input(_));
        if matches!(graph.nodes[v].kind, ValueKind::Op(_)) && claimed[v].is_none() && !stays {
            claimed[v] = Some(o);
        }
    }
    for (v, node) in graph.nodes.iter().enumerate() {
        let bytes = lowering.value_bytes(v);
        if lowering.locs[v].is_some() {
            // A control node's result, placed when the node was lowered.
            continue;
        }
        let op = match &node.kind {
            ValueKind::Input(i) => {
                lowering.locs[v] = Some(Loc::at(Place::Input(*i), 0, bytes));
                continue;
            }
            ValueKind::Constant(literal) => {
                let words = to_words(&literal.0);
                lowering.locs[v] = Some(lowering.arena.constant(&words));
                continue;
            }
            ValueKind::Op(op) => op,
        };
        let out = lowering.place(v, op, claimed[v], &slots)?;
        if let Op::Control(call) = op {
            lowering.arena.new_op();
            let mut results: Vec<Option<(Loc, usize)>> = vec![None; call.results.len()];
            for (g, get) in graph.nodes.iter().enumerate() {
                if let ValueKind::Op(get_op @ Op::Get { index, .. }) = &get.kind {
                    if get.inputs[0] == v && *index < results.len() {
                        let loc = lowering.place(g, get_op, claimed[g], &slots)?;
                        lowering.locs[g] = Some(loc);
                        results[*index] = Some((loc, g));
                    }
                }
            }
            let operands = node
                .inputs
                .iter()
                .map(|&j| lowering.loc(j))
                .collect::<Result<Vec<_>>>()?;
            lowering.control_op(v, call, &operands, &results)?;
            // Every iteration's and branch's steps serve the control node.
            lowering.own_steps(v);
            lowering.locs[v] = Some(out);
            continue;
        }
        lowering.check_binding(op.name(), out.bytes)?;
        lowering.arena.new_op();
        lowering.lower_op(v, op, out)?;
        lowering.own_steps(v);
        lowering.locs[v] = Some(out);
    }
    let mut outputs = Vec::with_capacity(graph.outputs.len());
    for (o, &v) in graph.outputs.iter().enumerate() {
        let dtype = lowering.dtype(v);
        let len = lowering.numel(v);
        let bytes = storage_bytes(dtype, len);
        if claimed[v] != Some(o) && len > 0 {
            lowering.check_binding("output", bytes)?;
            let from = lowering.loc(v)?;
            lowering.copy(from, Loc::at(Place::Output(o), 0, bytes));
            lowering.own_steps(v);
        }
        outputs.push(OutputInfo { dtype, len, bytes });
    }
    lowering.finish(outputs)
}

/// The state of one lowering; the op-specific parts live beside it
/// (`op_kernel`, `fused`, `half`, `custom`) as methods.
pub(super) struct Lowering<'a> {
    pub(super) exe: &'a Executable,
    pub(super) shapes: &'a [Vec<usize>],
    pub(super) caps: &'a Caps,
    pub(super) arena: ArenaBuilder,
    pub(super) locs: Vec<Option<Loc>>,
    pub(super) steps: Vec<Cmd>,
    /// The graph value each of `steps` serves (filled in as each op is
    /// lowered).
    owners: Vec<usize>,
    pub(super) checks: Vec<(Loc, String, String)>,
}

/// A lowering error of the backend `caps` names.
fn lowering_err(caps: &Caps, detail: String) -> Error {
    Error::Backend {
        backend: caps.backend.clone(),
        detail,
    }
}

impl Lowering<'_> {
    pub(super) fn err(&self, detail: String) -> Error {
        lowering_err(self.caps, detail)
    }

    pub(super) fn dtype(&self, v: usize) -> DType {
        self.exe.graph().nodes[v].aval.dtype
    }

    pub(super) fn numel(&self, v: usize) -> usize {
        self.shapes[v].iter().product()
    }

    /// Bytes of value `v` in storage.
    pub(super) fn value_bytes(&self, v: usize) -> u64 {
        storage_bytes(self.dtype(v), self.numel(v))
    }

    pub(super) fn loc(&self, v: usize) -> Result<Loc> {
        self.locs[v].ok_or_else(|| self.err(format!("value {v} is read before it is computed")))
    }

    pub(super) fn node_op(&self, v: usize) -> Option<&Op> {
        match &self.exe.graph().nodes[v].kind {
            ValueKind::Op(op) => Some(op),
            _ => None,
        }
    }

    /// Where computed value `v` (of `op`) is written: its output buffer
    /// when it is output `claimed`, else its home in the plan's `slots`.
    fn place(&mut self, v: usize, op: &Op, claimed: Option<usize>, slots: &Arena) -> Result<Loc> {
        let bytes = self.value_bytes(v);
        let plan = self.exe.plan();
        Ok(match (claimed, plan.home(v)) {
            (Some(o), _) => Loc::at(Place::Output(o), 0, bytes),
            (None, Home::Input(i)) => Loc::at(Place::Input(i), 0, bytes),
            // An empty value has no bytes in its slot (where other slots
            // may lie); it is bound, never read, as a word of its own.
            (None, Home::Slot(_)) if self.numel(v) == 0 => self.arena.empty_word(),
            (None, Home::Slot(s)) => {
                let (offset, size) = (slots.offsets[s] as u64, slots.bytes[s] as u64);
                if bytes > size.max(4) {
                    return Err(self.err(format!(
                        "value {v} (`{}`) needs {bytes} bytes; its slot {s} has {size}",
                        op.name()
                    )));
                }
                Loc::at(Place::Arena, offset, bytes)
            }
            (None, Home::Constant) => {
                return Err(self.err(format!(
                    "the plan places computed value {v} (`{}`) in a constant",
                    op.name()
                )))
            }
        })
    }

    /// `Err` naming the size and the limit when `bytes` cannot be bound.
    pub(super) fn check_binding(&self, op: &str, bytes: u64) -> Result<()> {
        let limit = self.caps.max_binding_bytes.min(self.caps.max_buffer_bytes);
        if bytes > limit {
            return Err(self.err(format!(
                "`{op}` needs a buffer of {bytes} bytes, above the adapter's maximum storage \
                 binding size of {limit} bytes"
            )));
        }
        Ok(())
    }

    /// Lowers op value `v` into `out`.
    fn lower_op(&mut self, v: usize, op: &Op, out: Loc) -> Result<()> {
        let node = &self.exe.graph().nodes[v];
        match op {
            // The simplify pass removes stop_gradient; a copy if one remains.
            Op::Reshape(_) | Op::StopGradient => {
                if self.numel(v) > 0 {
                    let from = self.loc(node.inputs[0])?;
                    self.copy(from, out);
                }
                Ok(())
            }
            Op::DimSize { axes, dtype } => {
                let data =
                    kiln::ops::layout::dim_size_eval(axes, *dtype, &self.shapes[node.inputs[0]]);
                let from = self.arena.constant(&to_words(&data));
                self.copy(from, out);
                Ok(())
            }
            Op::Iota { axis, dtype } if self.numel(v) > 0 => {
                let data =
                    kiln::ops::layout::iota_eval(*axis, *dtype, &self.shapes[node.inputs[0]]);
                let from = self.arena.constant(&to_words(&data));
                self.copy(from, out);
                Ok(())
            }
            // An empty value needs no kernel; its dims may still be far
            // beyond what a kernel's 32-bit indexing could describe. Its
            // indices are still checked, as the reference checks them.
            _ if self.numel(v) == 0 => self.check_indices_of_empty(v, op),
            _ => {
                let mut operands = Vec::with_capacity(node.inputs.len());
                let mut aliased = Vec::with_capacity(node.inputs.len());
                for &j in &node.inputs {
                    let loc = self.loc(j)?;
                    let shares = loc.overlaps(&out);
                    if shares && self.exe.plan().in_place_of(v) != Some(j) {
                        return Err(self.err(format!(
                            "value {v} (`{}`) would overwrite its operand {j}, which the plan \
                             does not allow",
                            op.name()
                        )));
                    }
                    aliased.push(shares);
                    operands.push(loc);
                }
                if let Op::Custom(call) = op {
                    return self.custom_op(v, call, out, &operands);
                }
                let spec = self.spec(v, op, &aliased)?;
                if let Op::Kernel(call) = op {
                    // An in-place kernel finds its input in the output; when
                    // the plan gave the output its own range, copy it there.
                    if let Some(k) = call.kernel.in_place().filter(|&k| !aliased[k]) {
                        self.copy(operands[k], out);
                    }
                }
                if let Op::Fused(group) = op {
                    let limit = self.caps.max_storage_buffers_per_stage as usize;
                    if spec.bound.len() + 2 > limit {
                        return self.fused_in_steps(v, out, group, &operands, &aliased);
                    }
                }
                let bad_input = match op {
                    Op::Quant(q) if matches!(q.kind, QuantKind::GatherMatmul { .. }) => Some(
                        "lhs_indices or rhs_indices name a matrix out of range for output \
                         batch entry"
                            .to_string(),
                    ),
                    _ => self.indexed_axis(v, op).map(Self::out_of_range),
                };
                self.kernel(v, out, spec, operands, bad_input)
            }
        }
    }

    /// Marks the steps recorded since the last call as serving value `v`.
    fn own_steps(&mut self, v: usize) {
        self.owners.resize(self.steps.len(), v);
    }

    /// Records a copy of `from` into `to` (a copy kernel within the arena).
    pub(super) fn copy(&mut self, from: Loc, to: Loc) {
        if from != to {
            self.steps.push(Cmd::Copy { from, to });
        }
    }

    /// Records one dispatch of `spec` with `bindings` (output, then the
    /// bound operands); `bad_input` is the message for a kernel that
    /// reports bad input through a status word.
    pub(super) fn dispatch(
        &mut self,
        op: &str,
        spec: KernelSpec,
        mut bindings: Vec<Loc>,
        bad_input: Option<String>,
    ) -> Result<()> {
        if spec.workgroups == 0 {
            return Ok(());
        }
        let grid = match &spec.launch {
            None => split_grid(self.caps, op, spec.workgroups)?,
            Some(launch) => check_launch(self.caps, op, launch)?,
        };
        let limit = self.caps.max_storage_buffers_per_stage as usize;
        if bindings.len() + 1 + usize::from(spec.status) > limit {
            return Err(self.err(format!(
                "`{op}` reads {} buffers, more than the {limit} storage buffers the adapter \
                 allows per kernel (with parameters and output)",
                bindings.len() - 1,
            )));
        }
        if spec.status {
            let word = self.arena.status_word();
            self.checks.push((
                word,
                op.to_string(),
                bad_input.unwrap_or_else(|| format!("`{op}` reported bad input")),
            ));
            bindings.push(word);
        }
        let params = self.arena.params(&spec.params);
        bindings.insert(0, params);
        let entry_point = spec
            .launch
            .as_ref()
            .map_or_else(|| "main".to_string(), |l| l.entry_point.clone());
        self.steps.push(Cmd::Dispatch {
            op: op.to_string(),
            source: spec.source.into(),
            entry_point,
            bindings,
            grid,
        });
        Ok(())
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
        let check =
            crate::layout::check_indices(op.name(), self.dtype(indices), count, n, self.target())
                .map_err(|e| self.err(e.to_string()))?;
        let Some(spec) = check else {
            return Ok(());
        };
        let scratch = self.arena.scratch(storage_bytes(DType::U32, count));
        let read = self.loc(indices)?;
        self.dispatch(
            op.name(),
            spec,
            vec![scratch, read],
            Some(Self::out_of_range((axis, n))),
        )
    }

    pub(super) fn target(&self) -> Target {
        self.caps.target()
    }

    /// The finished program: copies resolved into copy steps or kernels,
    /// scratch placed after the rest of the arena, status words cleared
    /// first.
    fn finish(mut self, outputs: Vec<OutputInfo>) -> Result<Program> {
        let mut resolved = Vec::with_capacity(self.steps.len());
        // The value each resolved step serves, beside it.
        let mut resolved_owners = Vec::with_capacity(self.steps.len());
        let owners = std::mem::take(&mut self.owners);
        // Where each command's steps start among the resolved ones (loops
        // name commands until here).
        let mut starts = Vec::with_capacity(self.steps.len() + 1);
        for (c, cmd) in std::mem::take(&mut self.steps).into_iter().enumerate() {
            starts.push(resolved.len());
            let owner = owners.get(c).copied();
            match cmd {
                Cmd::Branch { .. } | Cmd::Jump { .. } => {
                    resolved_owners.push(owner);
                    resolved.push(cmd);
                }
                Cmd::Copy { from, to } => {
                    let cmds = self.copy_cmds(from, to)?;
                    resolved_owners.extend(std::iter::repeat_n(owner, cmds.len()));
                    resolved.extend(cmds);
                }
                Cmd::Dispatch {
                    op,
                    source,
                    entry_point,
                    mut bindings,
                    grid,
                } => {
                    // WebGPU rejects a dispatch binding overlapping ranges of
                    // a buffer when one is writable (all of ours are): an
                    // operand whose range another binding of the dispatch
                    // already covers (a custom op's forward given one value
                    // twice, `x @ x`) is read from a private copy.
                    for i in 2..bindings.len() {
                        if (1..i).any(|j| bindings[j].overlaps(&bindings[i])) {
                            let copy = self.arena.private_copy(bindings[i].bytes);
                            let cmds = self.copy_cmds(bindings[i], copy)?;
                            resolved_owners.extend(std::iter::repeat_n(owner, cmds.len()));
                            resolved.extend(cmds);
                            bindings[i] = copy;
                        }
                    }
                    resolved_owners.push(owner);
                    resolved.push(Cmd::Dispatch {
                        op,
                        source,
                        entry_point,
                        bindings,
                        grid,
                    });
                }
            }
        }
        starts.push(resolved.len());
        let scratch_base = self.arena.seal_scratch();
        let caps = self.caps;
        let range = |loc: Loc| -> Range {
            let (buffer, offset) = match loc.place {
                Place::Arena => (Buffer::Arena, loc.offset),
                Place::Params => (Buffer::Params, loc.offset),
                Place::Scratch => (Buffer::Arena, scratch_base + loc.offset),
                Place::Input(i) => (Buffer::Input(i), loc.offset),
                Place::Output(o) => (Buffer::Output(o), loc.offset),
            };
            Range {
                buffer,
                offset,
                bytes: loc.bytes.max(4),
            }
        };
        let mut steps: Vec<Step> = self
            .checks
            .iter()
            .map(|(word, _, _)| Step::Clear(range(*word)))
            .collect();
        let mut step_values = vec![None; steps.len()];
        step_values.extend(resolved_owners);
        let clears = steps.len();
        let step_of = |command: usize| clears + starts[command];
        for cmd in resolved {
            steps.push(match cmd {
                Cmd::Dispatch {
                    op,
                    source,
                    entry_point,
                    bindings,
                    grid,
                } => Step::Dispatch(Dispatch {
                    op,
                    source,
                    entry_point,
                    bindings: bindings.into_iter().map(range).collect(),
                    grid,
                }),
                Cmd::Copy { from, to } => Step::Copy {
                    from: range(from),
                    to: range(to),
                },
                Cmd::Branch { predicate, exit } => Step::Branch {
                    predicate: range(predicate),
                    exit: step_of(exit),
                },
                Cmd::Jump { to } => Step::Jump { to: step_of(to) },
            });
        }
        let checks = self
            .checks
            .into_iter()
            .map(|(word, op, detail)| Check {
                word: range(word),
                op,
                detail,
            })
            .collect();
        let finished = self.arena.finish();
        let ((arena_bytes, arena_init), (params_bytes, params_init)) =
            (finished.arena, finished.params);
        let arena_use = finished.arena_use;
        if arena_bytes > caps.max_buffer_bytes {
            return Err(lowering_err(
                caps,
                format!(
                    "the program's arena needs {arena_bytes} bytes ({arena_use:?}), above the \
                     adapter's maximum buffer size of {} bytes",
                    caps.max_buffer_bytes
                ),
            ));
        }
        let mut written_inputs: Vec<usize> = steps
            .iter()
            .filter_map(|step| match step {
                Step::Dispatch(d) => match d.bindings.get(1).map(|r| r.buffer) {
                    Some(Buffer::Input(i)) => Some(i),
                    _ => None,
                },
                Step::Copy {
                    to:
                        Range {
                            buffer: Buffer::Input(i),
                            ..
                        },
                    ..
                } => Some(*i),
                _ => None,
            })
            .collect();
        written_inputs.sort_unstable();
        written_inputs.dedup();
        Ok(Program {
            shapes: self.shapes.to_vec(),
            steps,
            arena_bytes,
            arena_init,
            params_bytes,
            params_init,
            arena_use,
            checks,
            outputs,
            written_inputs,
            step_values,
        })
    }

    /// The steps copying `from` into `to`: a copy between two buffers, a
    /// copy kernel within the arena.
    fn copy_cmds(&mut self, from: Loc, to: Loc) -> Result<Vec<Cmd>> {
        if from.in_arena() && to.in_arena() {
            self.copy_kernel(from, to)
        } else {
            Ok(vec![Cmd::Copy { from, to }])
        }
    }

    /// A copy within the arena as a kernel (no API copies a buffer onto
    /// itself): words, four per invocation where they divide.
    fn copy_kernel(&mut self, from: Loc, to: Loc) -> Result<Vec<Cmd>> {
        let words = (from.bytes.min(to.bytes) / 4) as usize;
        let shape = [words];
        let spec = crate::layout::copy(
            &crate::View::contiguous(DType::U32, &shape),
            &shape,
            self.target(),
        )
        .map_err(|e| self.err(e.to_string()))?;
        let before = std::mem::take(&mut self.steps);
        self.dispatch("copy", spec, vec![to, from], None)?;
        Ok(std::mem::replace(&mut self.steps, before))
    }
}

/// Splits `workgroups` over x, y and z, each at most the caps' limit.
fn split_grid(caps: &Caps, op: &str, workgroups: u64) -> Result<[u32; 3]> {
    let max = u64::from(caps.max_workgroups_per_dimension.max(1));
    let x = workgroups.min(max);
    let rest = workgroups.div_ceil(x.max(1));
    let y = rest.min(max);
    let z = rest.div_ceil(y.max(1));
    if z > max {
        return Err(lowering_err(
            caps,
            format!("`{op}` needs {workgroups} workgroups, more than {max}³"),
        ));
    }
    Ok([x as u32, y as u32, z as u32])
}

/// The grid of a user kernel, checked against the caps: an oversize
/// workgroup or grid is an `Err`, never a launch that runs part of the
/// kernel.
fn check_launch(caps: &Caps, op: &str, launch: &Launch) -> Result<[u32; 3]> {
    let [x, y, z] = launch.workgroup_size;
    let invocations = u64::from(x) * u64::from(y) * u64::from(z);
    let per_axis = caps.max_workgroup_size;
    if launch
        .workgroup_size
        .iter()
        .zip(per_axis)
        .any(|(&size, max)| size > max)
        || invocations > u64::from(caps.max_invocations_per_workgroup)
    {
        return Err(Error::Kernel {
            kernel: op.to_string(),
            detail: format!(
                "its @workgroup_size({x}, {y}, {z}) ({invocations} invocations) exceeds the \
                 adapter's limits: at most {per_axis:?} per axis and {} invocations",
                caps.max_invocations_per_workgroup
            ),
        });
    }
    let max = caps.max_workgroups_per_dimension;
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

/// The steps of an embedded program as commands to append after command
/// `base - 1`, each range through `relocate`. Its status words are the
/// caller's to clear, copies onto themselves vanish, and its loops' step
/// numbers become command numbers.
pub(super) fn spliced(
    steps: &[Step],
    base: usize,
    relocate: impl Fn(Range) -> Result<Loc>,
) -> Result<Vec<Cmd>> {
    // The command each embedded step starts at (a vanished step at the
    // next one's), and one past the last.
    let mut starts = Vec::with_capacity(steps.len() + 1);
    let mut cmds = Vec::with_capacity(steps.len());
    for step in steps {
        starts.push(base + cmds.len());
        cmds.push(match step {
            Step::Dispatch(d) => Cmd::Dispatch {
                op: d.op.clone(),
                source: d.source.clone(),
                entry_point: d.entry_point.clone(),
                bindings: d
                    .bindings
                    .iter()
                    .map(|&r| relocate(r))
                    .collect::<Result<_>>()?,
                grid: d.grid,
            },
            Step::Copy { from, to } => {
                let (from, to) = (relocate(*from)?, relocate(*to)?);
                if from == to {
                    continue;
                }
                Cmd::Copy { from, to }
            }
            Step::Clear(_) => continue,
            Step::Branch { predicate, exit } => Cmd::Branch {
                predicate: relocate(*predicate)?,
                exit: *exit,
            },
            Step::Jump { to } => Cmd::Jump { to: *to },
        });
    }
    starts.push(base + cmds.len());
    for cmd in &mut cmds {
        match cmd {
            Cmd::Branch { exit, .. } => *exit = starts[*exit],
            Cmd::Jump { to } => *to = starts[*to],
            Cmd::Dispatch { .. } | Cmd::Copy { .. } => {}
        }
    }
    Ok(cmds)
}
