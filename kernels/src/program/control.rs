//! Control flow on the GPU. A control node's subgraphs were planned once
//! (their executables hang off the enclosing one); each is lowered once
//! for its shapes into a program whose arena is embedded in the caller's,
//! and its steps are spliced in with its inputs and outputs relocated.
//!
//! * **scan**: the trip count is known when the program is lowered (the
//!   shapes are), so the body's steps are recorded once per iteration
//!   into the one step list (one command encoder). A carry lives in its
//!   result's range for the whole loop. When the body's plan writes a
//!   carry in place of its own input, the body reads and writes that one
//!   range every iteration; otherwise the new value goes to a second range
//!   and is copied back after the iteration (double-buffered, as the
//!   report says). Each iteration reads its slice of a scanned array in
//!   place when the slice starts at a bindable offset, else from a copy;
//!   its per-iteration results go straight into their rows the same way,
//!   else into aligned rows packed once after the loop.
//! * **switch**: every branch runs and a select kernel picks each result
//!   from the branch the index names (no readback stalls the queue; a
//!   branch costs its work even when not taken).
//! * **while_loop**: its trip count is known only when it runs. The test's
//!   steps write the predicate into a word, a branch step
//!   ([`Step::Branch`](super::types::Step::Branch)) leaves the loop when
//!   the executor reads it back as zero, and a jump after the body's steps
//!   goes back to the test: one readback per iteration, which waits for
//!   the device each time (a browser cannot wait inside a synchronous
//!   call: there it is an `Err`). The carries live as a scan's do.

use super::loc::{Cmd, Loc, Place};
use super::lowering::{lower_body, spliced, Lowering};
use super::types::{Buffer, Program, Range};
use crate::abi::{element_bytes, storage_bytes};
use crate::spec::View;
use kiln::plan::Home;
use kiln::shape::row_major_strides;
use kiln::{ControlCall, ControlKind, DType, Executable, Result};

/// A subgraph's program embedded in the caller's arena.
struct Embedded {
    program: Program,
    arena_base: u64,
    params_base: u64,
}

impl Lowering<'_> {
    /// Lowers control node `v` over `operands`, writing result `r` into
    /// `results[r]`, the range of the `get` value it names (`None`: no
    /// value reads it).
    pub(super) fn control_op(
        &mut self,
        v: usize,
        call: &ControlCall,
        operands: &[Loc],
        results: &[Option<(Loc, usize)>],
    ) -> Result<()> {
        match &call.kind {
            ControlKind::Scan { reverse, .. } => self.scan(v, call, *reverse, operands, results),
            ControlKind::Switch => self.switch(v, call, operands, results),
            ControlKind::While => self.while_loop(v, call, operands, results),
        }
    }

    /// The operand shapes subgraph `k` of control node `v` reads.
    fn subgraph_shapes(&self, v: usize, call: &ControlCall, k: usize) -> Vec<Vec<usize>> {
        let node = &self.exe.graph().nodes[v];
        call.subgraph_inputs(k)
            .iter()
            .map(|input| {
                let shape = &self.shapes[node.inputs[input.operand]];
                if input.sliced {
                    shape.get(1..).unwrap_or(&[]).to_vec()
                } else {
                    shape.clone()
                }
            })
            .collect()
    }

    /// Subgraph `body` lowered for inputs of `in_shapes` and embedded.
    fn embed_body(&mut self, body: &Executable, in_shapes: &[Vec<usize>]) -> Result<Embedded> {
        let refs: Vec<&[usize]> = in_shapes.iter().map(Vec::as_slice).collect();
        let shapes = body.resolve_shapes(&refs)?;
        let program = lower_body(body, &shapes, self.caps)?;
        let (arena_base, params_base) = self.arena.embed(
            (program.arena_bytes, &program.arena_init),
            (program.params_bytes, &program.params_init),
        );
        Ok(Embedded {
            program,
            arena_base,
            params_base,
        })
    }

    /// Splices `sub`'s steps (checks once, with `first`), its inputs at
    /// `inputs` and outputs at `outputs`.
    fn splice(
        &mut self,
        sub: &Embedded,
        inputs: &[Loc],
        outputs: &[Loc],
        first: bool,
    ) -> Result<()> {
        let relocate = |range: Range| -> Result<Loc> {
            let base = |loc: Option<&Loc>, what: String| {
                loc.map(|l| Loc::at(l.place, l.offset + range.offset, range.bytes))
                    .ok_or_else(|| {
                        self.err(format!("a loop body reads {what}, which it was not given"))
                    })
            };
            match range.buffer {
                Buffer::Arena => Ok(Loc::at(
                    Place::Arena,
                    sub.arena_base + range.offset,
                    range.bytes,
                )),
                Buffer::Params => Ok(Loc::at(
                    Place::Params,
                    sub.params_base + range.offset,
                    range.bytes,
                )),
                Buffer::Input(i) => base(inputs.get(i), format!("input {i}")),
                Buffer::Output(o) => base(outputs.get(o), format!("output {o}")),
            }
        };
        let cmds = spliced(&sub.program.steps, self.steps.len(), relocate)?;
        let mut checks = Vec::new();
        if first {
            for check in &sub.program.checks {
                checks.push((
                    relocate(check.word)?,
                    check.op.clone(),
                    check.detail.clone(),
                ));
            }
        }
        self.checks.extend(checks);
        self.steps.extend(cmds);
        Ok(())
    }

    /// A strided copy kernel: `shape` elements of `dtype` read from `from`
    /// at element `offset` with `strides`, written contiguously to `to`.
    fn strided_copy(
        &mut self,
        dtype: DType,
        from: Loc,
        offset: usize,
        strides: Vec<usize>,
        shape: &[usize],
        to: Loc,
    ) -> Result<()> {
        let spec = crate::layout::copy(
            &View::strided(dtype, offset, strides, shape),
            shape,
            self.target(),
        )
        .map_err(|e| self.err(e.to_string()))?;
        self.dispatch("scan", spec, vec![to, from], None)
    }

    /// Where the carries of loop `call` live: each in its result's range
    /// (scratch when nothing reads it), initialized from its operand; and
    /// where `body` writes each new value: the same range when its plan
    /// writes the carry in place of its input, else a second range copied
    /// back after every iteration (double-buffered, as the report says).
    fn carries(
        &mut self,
        call: &ControlCall,
        body: &Executable,
        operands: &[Loc],
        results: &[Option<(Loc, usize)>],
    ) -> (Vec<Loc>, Vec<Loc>) {
        let mut carry_locs = Vec::with_capacity(call.num_carry);
        for (c, operand) in call.carry_operands().enumerate() {
            let bytes = operands[operand].bytes;
            let loc = match results.get(c).copied().flatten() {
                Some((loc, _)) => loc,
                None => self.arena.scratch(bytes),
            };
            self.copy(operands[operand], loc);
            carry_locs.push(loc);
        }
        let graph = body.graph();
        let carry_out = carry_locs
            .iter()
            .enumerate()
            .map(|(c, &loc)| {
                let value = graph.outputs[c];
                let input = call.num_consts + c;
                let own = body.plan().home(value) == Home::Input(input)
                    || matches!(graph.nodes[value].kind, kiln::ValueKind::Input(i) if i == input);
                if own {
                    loc
                } else {
                    self.arena.scratch(loc.bytes)
                }
            })
            .collect();
        (carry_locs, carry_out)
    }

    /// A `while_loop`: the test writes the predicate, a branch leaves the
    /// loop when it reads zero, the body writes the new carries and a jump
    /// goes back to the test.
    fn while_loop(
        &mut self,
        v: usize,
        call: &ControlCall,
        operands: &[Loc],
        results: &[Option<(Loc, usize)>],
    ) -> Result<()> {
        let bodies = self.exe.bodies(v).to_vec();
        let [test, body] = bodies.as_slice() else {
            return Err(self.err("a while_loop without its test and body".into()));
        };
        let (carry_locs, carry_out) = self.carries(call, body, operands, results);
        let test_shapes = self.subgraph_shapes(v, call, 0);
        let test = self.embed_body(test, &test_shapes)?;
        let body_shapes = self.subgraph_shapes(v, call, 1);
        let body = self.embed_body(body, &body_shapes)?;
        // Test and body read the consts, then the carries where they live.
        let ins: Vec<Loc> = (call.first_const()..call.carry_operands().start)
            .map(|j| operands[j])
            .chain(carry_locs.iter().copied())
            .collect();
        let predicate = self.arena.scratch(4);
        let head = self.steps.len();
        self.splice(&test, &ins, &[predicate], true)?;
        let branch = self.steps.len();
        self.steps.push(Cmd::Branch { predicate, exit: 0 });
        self.splice(&body, &ins, &carry_out, true)?;
        for (&to, &from) in carry_locs.iter().zip(&carry_out) {
            self.copy(from, to);
        }
        self.steps.push(Cmd::Jump { to: head });
        let exit = self.steps.len();
        if let Some(Cmd::Branch { exit: target, .. }) = self.steps.get_mut(branch) {
            *target = exit;
        }
        Ok(())
    }

    fn scan(
        &mut self,
        v: usize,
        call: &ControlCall,
        reverse: bool,
        operands: &[Loc],
        results: &[Option<(Loc, usize)>],
    ) -> Result<()> {
        let node = &self.exe.graph().nodes[v];
        let body = self
            .exe
            .bodies(v)
            .first()
            .cloned()
            .ok_or_else(|| self.err("a scan without its body".into()))?;
        let inputs = call.subgraph_inputs(0);
        let in_shapes = self.subgraph_shapes(v, call, 0);
        let carries = call.carry_operands();
        let k = carries.len();
        let length = match inputs.iter().find(|i| i.sliced) {
            Some(x) => self.shapes[node.inputs[x.operand]][0],
            None => match &call.kind {
                ControlKind::Scan { length, .. } => length.known().unwrap_or(0),
                _ => 0,
            },
        };
        let sub = self.embed_body(&body, &in_shapes)?;
        let align = u64::from(self.caps.binding_offset_alignment.max(4));
        let dtype_of = |j: usize| self.exe.graph().nodes[node.inputs[j]].aval.dtype;
        let (carry_locs, carry_out) = self.carries(call, &body, operands, results);
        // Scanned slices: bound in place at aligned rows, else copied.
        struct Scanned {
            operand: Loc,
            row_elems: usize,
            row_bytes: u64,
            shape: Vec<usize>,
            dtype: DType,
            staging: Option<Loc>,
        }
        let mut scanned = Vec::new();
        for (input, shape) in inputs.iter().zip(&in_shapes).filter(|(i, _)| i.sliced) {
            let dtype = dtype_of(input.operand);
            let row_elems: usize = shape.iter().product();
            let row_bytes = storage_bytes(dtype, row_elems);
            let operand = operands[input.operand];
            let direct = row_bytes.is_multiple_of(align) && operand.offset.is_multiple_of(align);
            let staging = (!direct).then(|| self.arena.scratch(row_bytes));
            scanned.push(Scanned {
                operand,
                row_elems,
                row_bytes,
                shape: shape.clone(),
                dtype,
                staging,
            });
        }
        // Per-iteration results: into their rows, or aligned staging rows.
        struct Stacked {
            result: Option<Loc>,
            row_elems: usize,
            row_bytes: u64,
            stride_bytes: u64,
            shape: Vec<usize>,
            dtype: DType,
            staging: Option<Loc>,
        }
        let mut stacked = Vec::new();
        for (r, aval) in call.results.iter().enumerate().skip(k) {
            let (result, row_shape) = match results.get(r).copied().flatten() {
                Some((loc, get)) => (Some(loc), self.shapes[get][1..].to_vec()),
                None => (None, Vec::new()),
            };
            let row_elems: usize = row_shape.iter().product();
            let row_bytes = storage_bytes(aval.dtype, row_elems);
            let direct = result
                .is_some_and(|l| row_bytes.is_multiple_of(align) && l.offset.is_multiple_of(align));
            let stride_bytes = if direct {
                row_bytes
            } else {
                row_bytes.div_ceil(align) * align
            };
            let staging = match (result, direct) {
                (Some(_), true) => None,
                (Some(_), false) => Some(self.arena.scratch(stride_bytes * length as u64)),
                // Unread: every iteration writes one scratch row, as large
                // as the body's output (no `get` gives its shape).
                (None, _) => Some(self.arena.scratch(sub.program.outputs[r].bytes.max(4))),
            };
            stacked.push(Stacked {
                result,
                row_elems,
                row_bytes,
                stride_bytes,
                shape: row_shape,
                dtype: aval.dtype,
                staging,
            });
        }
        let consts: Vec<Loc> = (call.first_const()..carries.start)
            .map(|j| operands[j])
            .collect();
        for step in 0..length {
            let row = if reverse { length - 1 - step } else { step };
            let mut ins = consts.clone();
            ins.extend(&carry_locs);
            for x in &scanned {
                ins.push(match x.staging {
                    None => Loc::at(
                        x.operand.place,
                        x.operand.offset + row as u64 * x.row_bytes,
                        x.row_bytes,
                    ),
                    Some(staging) => {
                        let strides = row_major_strides(&x.shape);
                        self.strided_copy(
                            x.dtype,
                            x.operand,
                            row * x.row_elems,
                            strides,
                            &x.shape,
                            staging,
                        )?;
                        staging
                    }
                });
            }
            let mut outs = carry_out.clone();
            for y in &stacked {
                outs.push(match (y.result, y.staging) {
                    (Some(result), None) => Loc::at(
                        result.place,
                        result.offset + row as u64 * y.row_bytes,
                        y.row_bytes,
                    ),
                    (Some(_), Some(staging)) => Loc::at(
                        staging.place,
                        staging.offset + row as u64 * y.stride_bytes,
                        y.row_bytes,
                    ),
                    (None, Some(staging)) => staging,
                    (None, None) => return Err(self.err("a scan result without a range".into())),
                });
            }
            self.splice(&sub, &ins, &outs, step == 0)?;
            for (&to, &from) in carry_locs.iter().zip(&carry_out) {
                self.copy(from, to);
            }
        }
        // Rows written to aligned staging are packed into their results.
        for y in &stacked {
            if let (Some(result), Some(staging)) = (y.result, y.staging) {
                if length == 0 || y.row_elems == 0 {
                    continue;
                }
                let per_row = (y.stride_bytes / element_bytes(y.dtype) as u64) as usize;
                let mut strides = vec![per_row];
                strides.extend(row_major_strides(&y.shape));
                let mut shape = vec![length];
                shape.extend(&y.shape);
                self.strided_copy(y.dtype, staging, 0, strides, &shape, result)?;
            }
        }
        Ok(())
    }

    fn switch(
        &mut self,
        v: usize,
        call: &ControlCall,
        operands: &[Loc],
        results: &[Option<(Loc, usize)>],
    ) -> Result<()> {
        let bodies = self.exe.bodies(v).to_vec();
        let limit = self.caps.max_storage_buffers_per_stage as usize;
        // Parameters, output and index take three bindings.
        if bodies.len() + 3 > limit {
            return Err(self.err(format!(
                "`switch` with {} branches needs {} bindings to select a result, more than the \
                 {limit} the adapter allows",
                bodies.len(),
                bodies.len() + 3
            )));
        }
        let index = operands[0];
        let index_dtype = self.dtype(self.exe.graph().nodes[v].inputs[0]);
        let ins: Vec<Loc> = operands[1..].to_vec();
        let mut branch_results: Vec<Vec<Loc>> = Vec::with_capacity(bodies.len());
        for (b, body) in bodies.iter().enumerate() {
            let in_shapes = self.subgraph_shapes(v, call, b);
            let sub = self.embed_body(body, &in_shapes)?;
            let outs: Vec<Loc> = sub
                .program
                .outputs
                .iter()
                .map(|o| self.arena.scratch(o.bytes.max(4)))
                .collect();
            self.splice(&sub, &ins, &outs, true)?;
            branch_results.push(outs);
        }
        for (r, result) in results.iter().enumerate() {
            let Some((out, get)) = *result else { continue };
            let shape = self.shapes[get].clone();
            if shape.iter().product::<usize>() == 0 {
                continue;
            }
            let dtype = call.results[r].dtype;
            let spec = crate::dynamic::select_branch(
                dtype,
                index_dtype,
                bodies.len(),
                &shape,
                self.target(),
            )
            .map_err(|e| self.err(e.to_string()))?;
            let mut bindings = vec![out, index];
            bindings.extend(branch_results.iter().map(|outs| outs[r]));
            self.dispatch("switch", spec, bindings, None)?;
        }
        Ok(())
    }
}
