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
use crate::handle::array::{Array, NodeKind};
use crate::hash::{fast_map, FastMap};
use crate::ops::batching::Batched;
use crate::shape::Dim;
use crate::transform::autodiff::topological_order;

/// The batched values of `outputs` (per-example values) when the
/// per-example values `inputs` stand for `batched`, for `size` examples.
/// An op on the way that cannot be batched is an `Err` naming it.
pub(crate) fn batch_values(
    outputs: &[Array],
    inputs: &[Array],
    batched: Vec<Batched>,
    size: &Dim,
) -> Result<Vec<Batched>> {
    if let Some(e) = outputs.iter().find_map(Array::error) {
        return Err(e.clone());
    }
    let mut known: FastMap<usize, Batched> = fast_map(inputs.len());
    for (input, value) in inputs.iter().zip(batched) {
        known.insert(input.id(), value);
    }
    for array in topological_order(outputs) {
        let NodeKind::Op { op, inputs, .. } = &array.node.kind else {
            continue;
        };
        if known.contains_key(&array.id()) {
            continue;
        }
        let inputs = inputs.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if !inputs.iter().any(|i| known.contains_key(&i.id())) {
            continue;
        }
        let operands: Vec<Batched> = inputs
            .iter()
            .map(|i| {
                known
                    .get(&i.id())
                    .cloned()
                    .unwrap_or_else(|| Batched::shared(i.clone()))
            })
            .collect();
        let value = op.batch(&inputs, &operands, &array, size, &batch_values)?;
        known.insert(array.id(), value);
    }
    Ok(outputs
        .iter()
        .map(|o| {
            known
                .get(&o.id())
                .cloned()
                .unwrap_or_else(|| Batched::shared(o.clone()))
        })
        .collect())
}
