//! Trace extraction: the graph of everything some lazy arrays depend on.

use crate::error::{Error, Result};
use crate::handle::array::{Array, NodeKind};
use crate::hash::{fast_map, FastMap};
use crate::ir::graph::{Graph, GraphNode, Literal, Operands, Origin, ValueId, ValueKind};
use std::collections::HashSet;

pub mod control;
mod custom;
use std::sync::atomic::{AtomicU64, Ordering};

/// A trace id no other trace of this process has: extraction tells a
/// trace's own tracers from every other's by it.
pub(crate) fn next_trace_id() -> u64 {
    static NEXT_TRACE: AtomicU64 = AtomicU64::new(1);
    NEXT_TRACE.fetch_add(1, Ordering::Relaxed)
}

/// How graph extraction treats the leaves it meets.
pub(crate) enum Leaves {
    /// Eager evaluation: every computed array becomes a graph input.
    Eager,
    /// Tracing: arguments of trace `id` are inputs; computed arrays are constants.
    Trace { id: u64, num_inputs: usize },
}

/// The graph of everything `outputs` depend on, plus (eager) the arrays that
/// became its inputs. Values whose arrays are in `backward` (by
/// [`Array::id`]) are marked as a gradient's backward pass.
pub(crate) fn extract(
    outputs: &[Array],
    leaves: Leaves,
    backward: &HashSet<usize>,
) -> Result<(Graph, Vec<Array>)> {
    let mut graph = Graph::default();
    let mut inputs: Vec<Array> = Vec::new();
    let mut ids: FastMap<usize, ValueId> = fast_map(outputs.len() * 8);
    // Iterative post-order DFS: chains can be tens of thousands of ops deep.
    let mut stack: Vec<(Array, bool)> = outputs.iter().rev().map(|a| (a.clone(), false)).collect();
    while let Some((array, expanded)) = stack.pop() {
        if ids.contains_key(&array.id()) {
            continue;
        }
        let node = &array.node;
        if array.is_computed() {
            let kind = match leaves {
                Leaves::Eager => {
                    inputs.push(array.clone());
                    ValueKind::Input(inputs.len() - 1)
                }
                // A constant of a trace is host data: a value kept on a
                // device is read back for it.
                Leaves::Trace { .. } => {
                    let value = array.host_value()?.ok_or_else(|| Error::ReadTracer {
                        aval: array.aval().to_string(),
                    })?;
                    ValueKind::Constant(Literal(value))
                }
            };
            push(
                &mut graph,
                &mut ids,
                &array,
                kind,
                Operands::new(),
                backward,
            );
            continue;
        }
        match &node.kind {
            NodeKind::Failed(e) => return Err(e.clone()),
            NodeKind::Data => unreachable!("data nodes are computed"),
            NodeKind::Param { trace, index } => match leaves {
                Leaves::Trace { id, .. } if id == *trace => {
                    push(
                        &mut graph,
                        &mut ids,
                        &array,
                        ValueKind::Input(*index),
                        Operands::new(),
                        backward,
                    );
                }
                _ => {
                    return Err(Error::ReadTracer {
                        aval: array.aval().to_string(),
                    })
                }
            },
            NodeKind::Op {
                op,
                inputs: operands,
                guards,
            } => {
                let operands = operands.lock().unwrap_or_else(|p| p.into_inner());
                if expanded {
                    let ins = operands.iter().map(|a| ids[&a.id()]).collect();
                    graph.guards.extend(guards.iter().cloned());
                    push(
                        &mut graph,
                        &mut ids,
                        &array,
                        ValueKind::Op(op.clone()),
                        ins,
                        backward,
                    );
                } else {
                    stack.push((array.clone(), true));
                    for operand in operands.iter().rev() {
                        if !ids.contains_key(&operand.id()) {
                            stack.push((operand.clone(), false));
                        }
                    }
                }
            }
        }
    }
    graph.outputs = outputs.iter().map(|a| ids[&a.id()]).collect();
    graph.num_inputs = match leaves {
        Leaves::Eager => inputs.len(),
        Leaves::Trace { num_inputs, .. } => num_inputs,
    };
    Ok((graph, inputs))
}

fn push(
    graph: &mut Graph,
    ids: &mut FastMap<usize, ValueId>,
    array: &Array,
    kind: ValueKind,
    inputs: Operands,
    backward: &HashSet<usize>,
) {
    let id = graph.nodes.len();
    ids.insert(array.id(), id);
    let node = GraphNode {
        kind,
        inputs,
        aval: array.aval().clone(),
    };
    let origin = Origin::traced(id, array.location()).within(array.composition());
    graph.push_node(node, backward.contains(&array.id()), origin);
}
