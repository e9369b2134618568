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
use crate::handle::array::Array;
use crate::hash::{fast_map, FastMap};
use crate::ops::Op;
use crate::transform::autodiff::push_forward;

/// The tangents of `outputs` when the values `wrt` have the tangents
/// `tangents` (`None` where zero): `None` where an output's tangent is
/// structurally zero (it does not depend on a leaf with a tangent, or is
/// not a float). An op without a jvp rule on the way is an `Err` naming it.
pub(crate) fn push_tangents(
    outputs: &[Array],
    wrt: &[Array],
    tangents: Vec<Option<Array>>,
) -> Result<Vec<Option<Array>>> {
    // A differentiated leaf that is itself computed keeps the tangent it
    // was given, whatever its inputs' are.
    let seeds = wrt
        .iter()
        .zip(tangents)
        .filter_map(|(leaf, tangent)| Some((leaf.id(), tangent?)));
    // A control node's results' tangents, by its id; the node itself
    // carries its token as a marker so that its `get`s are visited.
    let mut results: FastMap<usize, Vec<Option<Array>>> = fast_map(4);
    push_forward(outputs, seeds, |op, inputs, output, tangents| match op {
        Op::Control(call) => {
            let all = crate::transform::control::jvp(call, inputs, tangents, &push_tangents)?;
            results.insert(output.id(), all);
            Ok(Some(output.clone()))
        }
        Op::Get { index, .. } => Ok(results
            .get(&inputs[0].id())
            .and_then(|all| all.get(*index).cloned().flatten())),
        _ => op.jvp(inputs, output, tangents, &push_tangents),
    })
}
