//! A custom op on the GPU: its forward's own executable, lowered for the
//! operands' shapes into a program of its own whose arena is embedded in
//! the caller's, whose arguments are the op's operands and whose output is
//! the op's value.

use super::loc::{Loc, Place};
use super::lowering::{lower, spliced, Lowering};
use super::types::{Buffer, Range};
use kiln::{CustomCall, DType, Result};

impl Lowering<'_> {
    /// Splices custom op `v`'s forward, reading `operands` and writing `out`.
    pub(super) fn custom_op(
        &mut self,
        v: usize,
        call: &CustomCall,
        out: Loc,
        operands: &[Loc],
    ) -> Result<()> {
        let node = &self.exe.graph().nodes[v];
        let body_operands: Vec<(DType, &[usize])> = node
            .inputs
            .iter()
            .map(|&j| (self.dtype(j), &self.shapes[j][..]))
            .collect();
        let body = call.body(&body_operands)?;
        let in_shapes: Vec<&[usize]> = body_operands.iter().map(|(_, s)| *s).collect();
        let shapes = body.resolve_shapes(&in_shapes)?;
        let sub = lower(&body, &shapes, self.caps)?;
        let (base, params_base) = self.arena.embed(
            (sub.arena_bytes, &sub.arena_init),
            (sub.params_bytes, &sub.params_init),
        );
        let relocate = |range: Range| -> Result<Loc> {
            match range.buffer {
                Buffer::Arena => Ok(Loc::at(Place::Arena, base + range.offset, range.bytes)),
                Buffer::Params => Ok(Loc::at(
                    Place::Params,
                    params_base + range.offset,
                    range.bytes,
                )),
                Buffer::Input(i) => operands
                    .get(i)
                    .map(|operand| Loc::at(operand.place, operand.offset, range.bytes))
                    .ok_or_else(|| {
                        self.err(format!(
                            "`{}` reads argument {i} of its forward",
                            call.name()
                        ))
                    }),
                Buffer::Output(0) => Ok(Loc::at(out.place, out.offset, range.bytes)),
                Buffer::Output(o) => Err(self.err(format!(
                    "the forward of `{}` has output {o}; a custom op returns one array",
                    call.name()
                ))),
            }
        };
        let cmds = spliced(&sub.steps, self.steps.len(), relocate)?;
        let mut checks = Vec::with_capacity(sub.checks.len());
        for check in sub.checks {
            checks.push((relocate(check.word)?, check.op, check.detail));
        }
        self.steps.extend(cmds);
        self.checks.extend(checks);
        Ok(())
    }
}
