//! Reverse-mode autodiff: a transformation of traced graphs. This file
//! holds the walk over the lazy graph (`backward`); the user-facing
//! transformations built on `compile` ([`crate::grad`],
//! [`crate::value_and_grad`], [`crate::vjp`]) are in `compile/grad.rs`.
//!
//! Each op family's vjp sits beside its shape rule (`Op::vjp`). `backward`
//! walks the lazy graph from the outputs back to the differentiated leaves
//! and builds the cotangents as ordinary lazy arrays, so a gradient is just
//! more graph: traced by [`crate::compile()`] together with the forward pass
//! (one cache entry), then fused, reinplaced, slot-planned and verified like
//! any graph. A cotangent that is structurally zero is `None` and never
//! materialised.
//!
//! [`crate::grad`] and [`crate::value_and_grad`] differentiate a function of any [`Tree`](crate::Tree);
//! gradients come back in the argument's own tree type. Called directly they
//! trace the function once on fresh tracers (so a value read inside it is an
//! error, not a silently constant branch); inside `compile` they differentiate
//! the trace they are part of. Errors (an integer leaf, a non-scalar loss, an
//! op without a vjp) are `Err`s naming the leaf path, the shape or the op.

use crate::error::Result;
use crate::handle::array::{Array, NodeKind};
use crate::hash::{fast_map, FastMap};
use crate::ops::Op;
use std::cell::RefCell;
use std::collections::HashSet;

/// The cotangent of each of `wrt` when `outputs` have the cotangents
/// `seeds` (`None` where an output's is zero); `None` where a cotangent is
/// structurally zero (no path from that leaf to a seeded output).
pub(crate) fn backward(
    outputs: &[Array],
    seeds: Vec<Option<Array>>,
    wrt: &[Array],
) -> Result<Vec<Option<Array>>> {
    if let Some(e) = outputs.iter().find_map(Array::error) {
        return Err(e.clone());
    }
    let order = topological_order(outputs);
    // Values that depend on a differentiated leaf, in schedule order.
    let mut active: HashSet<usize> = wrt.iter().map(Array::id).collect();
    for array in &order {
        if let NodeKind::Op { op, inputs, .. } = &array.node.kind {
            let depends = !matches!(op, Op::StopGradient)
                && inputs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .any(|input| active.contains(&input.id()));
            if depends {
                active.insert(array.id());
            }
        }
    }
    let mut cotangents: FastMap<usize, Array> = fast_map(order.len());
    for (output, seed) in outputs.iter().zip(seeds) {
        if let (Some(seed), true) = (seed, active.contains(&output.id())) {
            accumulate(&mut cotangents, output.id(), seed);
        }
    }
    // A control node's results' cotangents, by its id and result index.
    let mut results: FastMap<usize, Vec<Option<Array>>> = fast_map(4);
    for array in order.iter().rev() {
        let NodeKind::Op { op, inputs, .. } = &array.node.kind else {
            continue;
        };
        if !active.contains(&array.id()) {
            continue;
        }
        let inputs = inputs.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let grads = match op {
            Op::Get { index, .. } => {
                if let Some(cotangent) = cotangents.remove(&array.id()) {
                    let all = results
                        .entry(inputs[0].id())
                        .or_insert_with(|| vec![None; result_count(&inputs[0])]);
                    if let Some(slot) = all.get_mut(*index) {
                        *slot = Some(match slot.take() {
                            Some(so_far) => so_far + cotangent,
                            None => cotangent,
                        });
                    }
                }
                continue;
            }
            Op::Control(call) => {
                let Some(cts) = results.remove(&array.id()) else {
                    continue;
                };
                crate::transform::control::vjp(call, &inputs, cts, &backward)?
            }
            _ => {
                let Some(cotangent) = cotangents.remove(&array.id()) else {
                    continue;
                };
                op.vjp(&inputs, array, &cotangent, &backward)?
            }
        };
        for (input, grad) in inputs.iter().zip(grads) {
            if let (Some(grad), true) = (grad, active.contains(&input.id())) {
                accumulate(&mut cotangents, input.id(), grad);
            }
        }
    }
    let grads: Vec<Option<Array>> = wrt.iter().map(|w| cotangents.remove(&w.id())).collect();
    record_backward(&order, grads.iter().flatten());
    Ok(grads)
}

thread_local! {
    /// The backward values built while a `compile` trace runs, so its
    /// graph can mark them.
    static BACKWARD: RefCell<Option<Vec<Array>>> = const { RefCell::new(None) };
}

/// Runs `trace` collecting the values of every backward pass it builds
/// (kept alive, so their ids stay theirs while the trace is extracted).
pub(crate) fn collecting_backward<T>(trace: impl FnOnce() -> T) -> (T, Vec<Array>) {
    let outer = BACKWARD.with(|b| b.replace(Some(Vec::new())));
    let result = trace();
    let backward = BACKWARD.with(|b| b.replace(outer)).unwrap_or_default();
    (result, backward)
}

/// Adds to the collector, if one is active, every value below `grads` that
/// is not one of `forward`: the values the backward pass computes.
fn record_backward<'a>(forward: &[Array], grads: impl Iterator<Item = &'a Array>) {
    if BACKWARD.with(|b| b.borrow().is_none()) {
        return;
    }
    let forward: HashSet<usize> = forward.iter().map(Array::id).collect();
    let mut seen: HashSet<usize> = HashSet::new();
    let mut found: Vec<Array> = Vec::new();
    let mut stack: Vec<Array> = grads.cloned().collect();
    while let Some(array) = stack.pop() {
        if forward.contains(&array.id()) || !seen.insert(array.id()) {
            continue;
        }
        if let NodeKind::Op { inputs, .. } = &array.node.kind {
            stack.extend(
                inputs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .cloned(),
            );
        }
        found.push(array);
    }
    BACKWARD.with(|b| {
        if let Some(all) = b.borrow_mut().as_mut() {
            all.extend(found);
        }
    });
}

/// How many results the control node `token` has (0 for any other value).
fn result_count(token: &Array) -> usize {
    match &token.node.kind {
        NodeKind::Op {
            op: Op::Control(call),
            ..
        } => call.results.len(),
        _ => 0,
    }
}

/// Adds `grad` to the cotangent gathered so far for value `id`.
fn accumulate(cotangents: &mut FastMap<usize, Array>, id: usize, grad: Array) {
    let sum = match cotangents.remove(&id) {
        Some(so_far) => so_far + grad,
        None => grad,
    };
    cotangents.insert(id, sum);
}

/// Values of type `T` pushed forward through the lazy graph below
/// `outputs`, from `seeds` (value ids and their values): every op node
/// that depends on a seeded value, visited after its inputs, gets
/// `rule(op, inputs, node, the inputs' values)` (`None` where an input has
/// none), unless it is seeded itself. A rule's `None` leaves the node
/// without a value. Forward mode (tangents) and vmap (batched values) are
/// this walk with their rules; returns the outputs' values.
pub(crate) fn push_forward<T: Clone>(
    outputs: &[Array],
    seeds: impl IntoIterator<Item = (usize, T)>,
    mut rule: impl FnMut(&Op, &[Array], &Array, &[Option<T>]) -> Result<Option<T>>,
) -> Result<Vec<Option<T>>> {
    if let Some(e) = outputs.iter().find_map(Array::error) {
        return Err(e.clone());
    }
    let mut known: FastMap<usize, T> = seeds.into_iter().collect();
    for array in topological_order(outputs) {
        let NodeKind::Op { op, inputs, .. } = &array.node.kind else {
            continue;
        };
        if known.contains_key(&array.id()) {
            continue;
        }
        let inputs = inputs.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let values: Vec<Option<T>> = inputs.iter().map(|i| known.get(&i.id()).cloned()).collect();
        if values.iter().all(Option::is_none) {
            continue;
        }
        if let Some(value) = rule(op, &inputs, &array, &values)? {
            known.insert(array.id(), value);
        }
    }
    Ok(outputs
        .iter()
        .map(|o| known.get(&o.id()).cloned())
        .collect())
}

/// Every array `outputs` depend on, each after its inputs (an iterative
/// post-order walk: chains can be a hundred thousand ops long).
pub(crate) fn topological_order(outputs: &[Array]) -> Vec<Array> {
    let mut order = Vec::new();
    let mut seen: HashSet<usize> = HashSet::new();
    let mut stack: Vec<(Array, bool)> = outputs.iter().rev().map(|a| (a.clone(), false)).collect();
    while let Some((array, expanded)) = stack.pop() {
        if expanded {
            order.push(array);
            continue;
        }
        if !seen.insert(array.id()) {
            continue;
        }
        stack.push((array.clone(), true));
        if let NodeKind::Op { inputs, .. } = &array.node.kind {
            let inputs = inputs.lock().unwrap_or_else(|p| p.into_inner());
            for input in inputs.iter().rev() {
                if !seen.contains(&input.id()) {
                    stack.push((input.clone(), false));
                }
            }
        }
    }
    order
}

/// `x`, but no gradient flows through it: its cotangent is zero. It is an
/// identity op that the simplify pass removes, so no backend ever runs it.
///
/// ```
/// use kiln::{grad, stop_gradient, Array};
/// let f = grad(|x: Array| (&x * stop_gradient(&x)).sum_all());
/// let g = f.call(&Array::from_vec(vec![3.0f32], &[1])?)?;
/// assert_eq!(g.to_vec::<f32>()?, vec![3.0]);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn stop_gradient(x: &Array) -> Array {
    Array::apply(Op::StopGradient, vec![x.clone()])
}
