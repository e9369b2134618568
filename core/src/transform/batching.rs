//! Batching: per-example values replayed as batched ones through the lazy
//! graph. The user-facing [`crate::vmap`] is in `compile/vmap.rs`.
//!
//! `vmap` runs the function once on per-example placeholders; this walk
//! then visits every value the outputs depend on after its inputs and
//! rebuilds each one that depends on a batched input by its op's batching
//! rule (`Op::batch`, beside each family's vjp and jvp), as ordinary lazy
//! arrays: the batched program is more graph, traced into one cache entry
//! and optimized like any other. Values that depend on no batched input
//! are shared by every example and kept as they are.

use crate::error::Result;
use crate::handle::array::Array;
use crate::hash::{fast_map, FastMap};
use crate::ops::batching::Batched;
use crate::ops::Op;
use crate::shape::Dim;
use crate::transform::autodiff::push_forward;

/// The batched values of `outputs` (per-example values) when the
/// per-example values `inputs` stand for `batched`, for `size` examples.
/// An op on the way that cannot be batched is an `Err` naming it.
pub(crate) fn batch_values(
    outputs: &[Array],
    inputs: &[Array],
    batched: Vec<Batched>,
    size: &Dim,
) -> Result<Vec<Batched>> {
    let seeds = inputs.iter().map(Array::id).zip(batched);
    // A control node's batched results, by its id; the node itself gets
    // its token as a marker so that its `get`s are visited.
    let mut results: FastMap<usize, Vec<Batched>> = fast_map(4);
    let values = push_forward(outputs, seeds, |op, inputs, output, values| {
        let operands: Vec<Batched> = inputs
            .iter()
            .zip(values)
            .map(|(i, v)| v.clone().unwrap_or_else(|| Batched::shared(i.clone())))
            .collect();
        match op {
            Op::Control(call) => {
                let all = crate::transform::control::batch(call, &operands, size, &batch_values)?;
                results.insert(output.id(), all);
                Ok(Some(Batched::shared(output.clone())))
            }
            Op::Get { index, .. } => Ok(results
                .get(&inputs[0].id())
                .and_then(|all| all.get(*index).cloned())),
            _ => op
                .batch(inputs, &operands, output, size, &batch_values)
                .map(Some),
        }
    })?;
    Ok(outputs
        .iter()
        .zip(values)
        .map(|(o, v)| v.unwrap_or_else(|| Batched::shared(o.clone())))
        .collect())
}
