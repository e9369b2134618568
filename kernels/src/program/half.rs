//! f16 and bf16 results of kernels that accumulate in f32: reductions,
//! matmuls, quantized ops and scatter_add write f32 words to scratch, and an
//! elementwise cast packs them into the result's two-per-word layout.

use super::loc::Loc;
use super::lowering::Lowering;
use crate::abi::storage_bytes;
use crate::spec::{KernelSpec, View};
use kiln::{DType, Op, Result};

/// True when the kernel of `op` writes f32 words for a result of `dtype`,
/// to be packed afterwards.
fn packs_after(op: Option<&Op>, dtype: DType) -> bool {
    crate::family::stores_f32(dtype)
        && matches!(
            op,
            Some(
                Op::Reduce { .. }
                    | Op::Matmul
                    | Op::TransposedMatmul { .. }
                    | Op::Quant(_)
                    | Op::ScatterAdd { .. }
            )
        )
}

impl Lowering<'_> {
    /// Records a kernel writing value `v` (at `out`) from `operands`;
    /// through f32 scratch and a packing cast where [`packs_after`] says
    /// so. `bad_input` as for [`Lowering::dispatch`].
    pub(super) fn kernel(
        &mut self,
        v: usize,
        out: Loc,
        spec: KernelSpec,
        operands: Vec<Loc>,
        bad_input: Option<String>,
    ) -> Result<()> {
        let node_op = self.node_op(v);
        let op = node_op.map_or_else(|| "value".to_string(), |op| op.name().to_string());
        let dtype = self.dtype(v);
        let packs = packs_after(node_op, dtype);
        let mut bound = Vec::with_capacity(spec.bound.len() + 1);
        for &k in &spec.bound {
            bound.push(*operands.get(k).ok_or_else(|| {
                self.err(format!(
                    "the `{op}` kernel binds operand {k} of {}",
                    operands.len()
                ))
            })?);
        }
        if !packs {
            let mut bindings = vec![out];
            bindings.extend(bound);
            return self.dispatch(&op, spec, bindings, bad_input);
        }
        let n = self.numel(v);
        let scratch = self.arena.scratch(storage_bytes(DType::F32, n));
        let mut bindings = vec![scratch];
        bindings.extend(bound);
        self.dispatch(&op, spec, bindings, bad_input)?;
        let shape = [n];
        let pack = crate::source::elementwise(
            &Op::Cast(dtype),
            &[View::contiguous(DType::F32, &shape)],
            &shape,
            dtype,
            self.target(),
        )
        .map_err(|e| self.err(e.to_string()))?;
        self.dispatch(&op, pack, vec![out, scratch], None)
    }
}
