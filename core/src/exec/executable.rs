//! Executables: a graph in schedule order with its slot plan, and the
//! per-call resolution of symbolic shapes that every backend runs through.

use crate::error::{Error, Result};
use crate::ir::graph::{Graph, ValueId, ValueKind};
use crate::limits::{check_call_bytes, check_shape};
use crate::ops::{Condition, Op};
use crate::plan::SlotPlan;
use crate::shape::{Dim, Shape, Symbol};
use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Where a symbol's size comes from: axis `axis` of argument leaf `leaf`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SymbolSource {
    /// The flattened argument leaf.
    pub leaf: usize,
    /// The axis of that leaf.
    pub axis: usize,
}

/// A compiled graph ready to run: the optimized graph in schedule order,
/// how to find concrete shapes, and the buffer plan every backend runs
/// through (which holds each value's lifetime).
#[derive(Debug)]
pub struct Executable {
    id: u64,
    graph: Graph,
    known_shapes: Option<Vec<Vec<usize>>>,
    symbols: Vec<(Symbol, SymbolSource)>,
    plan: SlotPlan,
    /// Per control-flow node, the executables of its subgraphs, each
    /// planned once and run every iteration.
    bodies: Vec<(ValueId, Vec<Arc<Executable>>)>,
}

impl Executable {
    /// Builds an executable from an optimized graph and plans its buffers.
    /// `symbols` tells where each symbol of a shapeless graph is read from;
    /// `donated[i]` whether argument leaf `i` may be overwritten; and
    /// `input_shapes` are the traced call's argument shapes. In debug builds
    /// the plan (and its arena for those shapes) is checked by the
    /// independent verifier.
    pub fn new(
        graph: Graph,
        symbols: Vec<(Symbol, SymbolSource)>,
        donated: &[bool],
        input_shapes: &[&[usize]],
    ) -> Result<Executable> {
        let known_shapes = graph
            .nodes
            .iter()
            .map(|n| n.aval.shape.as_known())
            .collect();
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let mut exe = Executable {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            graph,
            known_shapes,
            symbols,
            plan: SlotPlan::default(),
            bodies: Vec::new(),
        };
        let shapes = exe.representative_shapes(input_shapes);
        exe.plan = SlotPlan::build(&exe.graph, donated, &shapes);
        exe.bodies = build_bodies(&exe.graph, &shapes)?;
        if exe.known_shapes.is_some() {
            exe.check_call_bytes(&shapes)?;
        }
        if cfg!(debug_assertions) {
            exe.plan
                .verify(&exe.graph, &shapes)
                .map_err(|violation| Error::InvalidPlan {
                    detail: violation.to_string(),
                })?;
        }
        Ok(exe)
    }

    /// Every value's shape with symbols bound to `input_shapes`, without
    /// checking guards (a shapeless trace may be rejected for the very call
    /// that traced it); a dim that does not evaluate counts as 0, and a
    /// shape too large for [`crate::Limits`] as all zeros (a call with such
    /// sizes is rejected when it resolves its shapes).
    pub(crate) fn representative_shapes(&self, input_shapes: &[&[usize]]) -> Vec<Vec<usize>> {
        if let Some(known) = &self.known_shapes {
            return known.clone();
        }
        let bind = |s: Symbol| self.symbol_value(s, input_shapes);
        self.graph
            .nodes
            .iter()
            .map(|node| {
                let dims = node.aval.shape.dims();
                let shape: Vec<usize> = dims.iter().map(|d| d.eval(&bind).unwrap_or(0)).collect();
                match check_shape("plan", &shape, node.aval.dtype) {
                    Ok(_) => shape,
                    Err(_) => vec![0; dims.len()],
                }
            })
            .collect()
    }

    /// `Err` when one call with values of `shapes` needs more buffer bytes
    /// (every slot as large as its largest value) than [`crate::Limits`]
    /// allow.
    fn check_call_bytes(&self, shapes: &[Vec<usize>]) -> Result<()> {
        let bytes = self
            .plan
            .slot_bytes(&self.graph, shapes, crate::DType::size_bytes)
            .into_iter()
            .try_fold(0usize, usize::checked_add);
        check_call_bytes(bytes)
    }

    /// Symbol `s`'s size in a call with arguments of `input_shapes`.
    fn symbol_value(&self, s: Symbol, input_shapes: &[&[usize]]) -> Option<i64> {
        self.symbols
            .iter()
            .find(|(sym, _)| *sym == s)
            .and_then(|(_, src)| input_shapes.get(src.leaf)?.get(src.axis))
            .map(|&n| n as i64)
    }

    /// A number no other executable of this process has: backends key what
    /// they keep per executable by it (an address may be reused once an
    /// executable is dropped).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The executables of control-flow node `v`'s subgraphs (empty for any
    /// other value), in the order its kind gives.
    pub fn bodies(&self, v: ValueId) -> &[Arc<Executable>] {
        self.bodies
            .iter()
            .find(|(u, _)| *u == v)
            .map_or(&[], |(_, bodies)| bodies.as_slice())
    }

    /// The buffer plan: reinplace decisions, slots and lifetimes.
    pub fn plan(&self) -> &SlotPlan {
        &self.plan
    }

    /// The graph it runs.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// True when some shape depends on the call.
    pub fn is_shapeless(&self) -> bool {
        self.known_shapes.is_none()
    }

    /// `Ok` when this executable can run arguments of `input_shapes`: every
    /// guard holds and every argument has the shape it was traced for.
    pub fn accepts(&self, input_shapes: &[&[usize]]) -> Result<()> {
        match self.known_shapes {
            Some(_) => self.check_inputs(input_shapes, |shape| shape.as_known()),
            None => self.resolve_shapes(input_shapes).map(|_| ()),
        }
    }

    /// Checks each argument's shape against the shape its input node
    /// expects (`expected` evaluates a possibly symbolic shape).
    fn check_inputs(
        &self,
        input_shapes: &[&[usize]],
        expected: impl Fn(&Shape) -> Option<Vec<usize>>,
    ) -> Result<()> {
        for node in &self.graph.nodes {
            if let ValueKind::Input(i) = node.kind {
                let actual = input_shapes.get(i).copied().unwrap_or(&[]);
                if expected(&node.aval.shape).as_deref() != Some(actual) {
                    return Err(Error::ShapeGuard {
                        condition: format!("argument leaf {i} has shape {}", node.aval.shape),
                        op: "input".into(),
                        detail: format!("got {actual:?}"),
                    });
                }
            }
        }
        Ok(())
    }

    /// The concrete shape of every value for arguments of `input_shapes`,
    /// checking every guard the trace relied on and every argument's shape.
    /// An executable whose shapes are all known may be given no argument
    /// shapes (its cache key pinned them).
    pub fn resolve_shapes(&self, input_shapes: &[&[usize]]) -> Result<Cow<'_, [Vec<usize>]>> {
        if let Some(known) = &self.known_shapes {
            // A static entry's cache key already pinned the shapes (its
            // caller passes none); other callers get them checked.
            if !input_shapes.is_empty() {
                self.check_inputs(input_shapes, |shape| shape.as_known())?;
            }
            return Ok(Cow::Borrowed(known));
        }
        let bind = |s: Symbol| self.symbol_value(s, input_shapes);
        for guard in &self.graph.guards {
            let holds = match &guard.condition {
                Condition::Equal(a, b) => {
                    matches!((a.eval(&bind), b.eval(&bind)), (Some(x), Some(y)) if x == y)
                }
                Condition::AtLeast(a, k) => a.eval(&bind).is_some_and(|v| v >= *k),
            };
            if !holds {
                return Err(Error::ShapeGuard {
                    condition: guard.condition.to_string(),
                    op: guard.op.clone(),
                    detail: self.describe_binding(&bind),
                });
            }
        }
        let mut shapes = Vec::with_capacity(self.graph.nodes.len());
        for node in &self.graph.nodes {
            let shape = node
                .aval
                .shape
                .eval(&bind)
                .ok_or_else(|| Error::ShapeGuard {
                    condition: format!("{} has a non-negative integer size", node.aval.shape),
                    op: node_name(&node.kind),
                    detail: self.describe_binding(&bind),
                })?;
            check_shape(&node_name(&node.kind), &shape, node.aval.dtype)?;
            shapes.push(shape);
        }
        self.check_inputs(input_shapes, |shape| shape.eval(&bind))?;
        self.check_call_bytes(&shapes)?;
        Ok(Cow::Owned(shapes))
    }

    fn describe_binding(&self, bind: &dyn Fn(Symbol) -> Option<i64>) -> String {
        let parts: Vec<String> = self
            .symbols
            .iter()
            .map(|(s, _)| match bind(*s) {
                Some(v) => format!("{s}={v}"),
                None => format!("{s}=?"),
            })
            .collect();
        parts.join(", ")
    }
}

/// The executables of every control-flow node's subgraphs, for operands of
/// the representative `shapes` of the enclosing graph.
fn build_bodies(
    graph: &Graph,
    shapes: &[Vec<usize>],
) -> Result<Vec<(ValueId, Vec<Arc<Executable>>)>> {
    let mut bodies = Vec::new();
    for (v, node) in graph.nodes.iter().enumerate() {
        let ValueKind::Op(Op::Control(call)) = &node.kind else {
            continue;
        };
        let mut built = Vec::with_capacity(call.graphs().len());
        for (k, body) in call.graphs().iter().enumerate() {
            let inputs = call.subgraph_inputs(k);
            let in_shapes: Vec<&[usize]> = inputs
                .iter()
                .map(|input| {
                    let shape = &shapes[node.inputs[input.operand]][..];
                    if input.sliced {
                        shape.get(1..).unwrap_or(&[])
                    } else {
                        shape
                    }
                })
                .collect();
            let donated: Vec<bool> = inputs.iter().map(|input| input.donated).collect();
            let symbols = input_symbols(call.name(), body)?;
            built.push(Arc::new(Executable::new(
                body.clone(),
                symbols,
                &donated,
                &in_shapes,
            )?));
        }
        bodies.push((v, built));
    }
    Ok(bodies)
}

/// Where each symbol of a subgraph is read from: an input with the bare
/// symbol as a dim. A symbol that no input has as a whole dim is an `Err`
/// naming the control-flow op `op`.
fn input_symbols(op: &str, graph: &Graph) -> Result<Vec<(Symbol, SymbolSource)>> {
    let mut used: Vec<Symbol> = Vec::new();
    for node in &graph.nodes {
        for dim in node.aval.shape.dims() {
            if let Dim::Sym(e) = dim {
                e.symbols(&mut used);
            }
        }
    }
    used.sort();
    used.dedup();
    used.into_iter()
        .map(|s| {
            let bare = Dim::symbol(s);
            graph
                .nodes
                .iter()
                .find_map(|node| match node.kind {
                    ValueKind::Input(leaf) => node
                        .aval
                        .shape
                        .dims()
                        .iter()
                        .position(|d| *d == bare)
                        .map(|axis| (s, SymbolSource { leaf, axis })),
                    _ => None,
                })
                .ok_or_else(|| Error::ShapeGuard {
                    condition: format!("{s} is a whole dim of a value the body reads"),
                    op: op.to_string(),
                    detail: "a body's symbolic sizes must come from its operands' shapes".into(),
                })
        })
        .collect()
}

fn node_name(kind: &ValueKind) -> String {
    match kind {
        ValueKind::Input(i) => format!("input {i}"),
        ValueKind::Constant(_) => "constant".into(),
        ValueKind::Op(op) => op.name().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executables_of_equal_graphs_have_distinct_ids() {
        let build = || Executable::new(Graph::default(), Vec::new(), &[], &[]);
        let (a, b) = (build().unwrap(), build().unwrap());
        assert_eq!(a.graph(), b.graph());
        assert_ne!(a.id(), b.id());
    }
}
