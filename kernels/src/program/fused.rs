//! A fused group that binds more buffers than a kernel may: run one member
//! op per kernel, the intermediate values in scratch.

use super::loc::Loc;
use super::lowering::Lowering;
use super::op_kernel::bind_once;
use crate::abi::storage_bytes;
use crate::source::step_dtypes;
use crate::spec::View;
use kiln::ops::{FusedArg, FusedKernel};
use kiln::Result;

impl Lowering<'_> {
    /// Runs fused group `v` step by step into `out`; `operands` and
    /// `aliased` are the group's, as for [`Lowering::spec`].
    pub(super) fn fused_in_steps(
        &mut self,
        v: usize,
        out: Loc,
        group: &FusedKernel,
        operands: &[Loc],
        aliased: &[bool],
    ) -> Result<()> {
        let inputs = self.exe.graph().nodes[v].inputs.clone();
        let out_shape = &self.shapes[v];
        let input_views: Vec<View> = inputs
            .iter()
            .map(|&j| View::broadcast(self.dtype(j), &self.shapes[j], out_shape))
            .collect();
        let steps = group.steps();
        let dtypes = step_dtypes("fused", steps, &input_views, out_shape)
            .map_err(|e| self.err(e.to_string()))?;
        let mut done: Vec<(Loc, Vec<usize>)> = Vec::with_capacity(steps.len());
        for (j, step) in steps.iter().enumerate() {
            let last = j + 1 == steps.len();
            let mut args: Vec<(Loc, Vec<usize>, kiln::DType, Option<usize>)> = Vec::new();
            for arg in &step.args {
                args.push(match *arg {
                    FusedArg::Input(k) => {
                        let (Some(&value), Some(&loc)) = (inputs.get(k), operands.get(k)) else {
                            return Err(self.err(format!("fused group {v} reads operand {k}")));
                        };
                        (loc, self.shapes[value].clone(), self.dtype(value), Some(k))
                    }
                    FusedArg::Step(i) => {
                        let Some((loc, shape)) = done.get(i).cloned() else {
                            return Err(
                                self.err(format!("fused group {v} reads step {i} before it"))
                            );
                        };
                        (loc, shape, dtypes[i], None)
                    }
                });
            }
            let shapes: Vec<&[usize]> = args.iter().map(|a| &a.1[..]).collect();
            let shape = kiln::shape::broadcast_shape(&shapes);
            let mut views: Vec<View> = args
                .iter()
                .map(|(_, arg_shape, arg_dtype, input)| {
                    match input.and_then(|k| self.scalar_constant(inputs[k])) {
                        Some(word) => View::inline(*arg_dtype, word),
                        None => View {
                            // Only the last step writes the group's range.
                            aliases_output: last
                                && input.is_some_and(|k| aliased.get(k) == Some(&true)),
                            ..View::broadcast(*arg_dtype, arg_shape, &shape)
                        },
                    }
                })
                .collect();
            let locs: Vec<Loc> = args.iter().map(|a| a.0).collect();
            bind_once(&mut views, &locs);
            let spec =
                crate::source::elementwise(&step.op, &views, &shape, dtypes[j], self.target())
                    .map_err(|e| self.err(e.to_string()))?;
            let step_out = if last {
                out
            } else {
                let numel = shape.iter().product();
                self.arena.scratch(storage_bytes(dtypes[j], numel))
            };
            self.kernel(v, step_out, spec, locs, None)?;
            done.push((step_out, shape));
        }
        Ok(())
    }
}
