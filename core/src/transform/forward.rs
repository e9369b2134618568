//! Forward-mode autodiff: tangents pushed through the lazy graph. The
//! user-facing transformations built on it ([`crate::jvp`],
//! [`crate::linearize`], [`crate::jacfwd`], [`crate::hessian`]) are in
//! `compile/forward.rs`.
//!
//! Each op family's jvp rule sits beside its vjp (`Op::jvp`). The walk
//! visits every value the outputs depend on after its inputs and builds
//! each tangent as ordinary lazy arrays, so a tangent is more graph, traced
//! with the primal computation into one cache entry and optimized like any
//! graph. A structurally zero tangent is `None` and never materialised;
//! only values that depend on a leaf with a tangent get one.

use crate::error::Result;
use crate::handle::array::{Array, NodeKind};
use crate::hash::{fast_map, FastMap};
use crate::transform::autodiff::topological_order;

/// The tangents of `outputs` when the values `wrt` have the tangents
/// `tangents` (`None` where zero): `None` where an output's tangent is
/// structurally zero (it does not depend on a leaf with a tangent, or is
/// not a float). An op without a jvp rule on the way is an `Err` naming it.
pub(crate) fn push_tangents(
    outputs: &[Array],
    wrt: &[Array],
    tangents: Vec<Option<Array>>,
) -> Result<Vec<Option<Array>>> {
    if let Some(e) = outputs.iter().find_map(Array::error) {
        return Err(e.clone());
    }
    let mut known: FastMap<usize, Array> = fast_map(wrt.len());
    for (leaf, tangent) in wrt.iter().zip(tangents) {
        if let Some(tangent) = tangent {
            known.insert(leaf.id(), tangent);
        }
    }
    for array in topological_order(outputs) {
        let NodeKind::Op { op, inputs, .. } = &array.node.kind else {
            continue;
        };
        if known.contains_key(&array.id()) {
            // A differentiated leaf that is itself computed: its tangent
            // was given, whatever its inputs' are.
            continue;
        }
        let inputs = inputs.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let in_tangents: Vec<Option<Array>> =
            inputs.iter().map(|i| known.get(&i.id()).cloned()).collect();
        if in_tangents.iter().all(Option::is_none) {
            continue;
        }
        if let Some(tangent) = op.jvp(&inputs, &array, &in_tangents, &push_tangents)? {
            known.insert(array.id(), tangent);
        }
    }
    Ok(outputs
        .iter()
        .map(|o| known.get(&o.id()).cloned())
        .collect())
}
