//! Executables (ordered steps over values), per-call shape resolution, the
//! [`Backend`] trait and its first implementation, the CPU executor.

use crate::data::HostData;
use crate::error::{Error, Result};
use crate::graph::{Graph, ValueKind};
use crate::ops::Condition;
use crate::shape::{Shape, Symbol};
use smallvec::SmallVec;
use std::borrow::Cow;
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
/// when each value is last read, and how to find concrete shapes.
#[derive(Debug)]
pub struct Executable {
    graph: Graph,
    last_use: Vec<usize>,
    known_shapes: Option<Vec<Vec<usize>>>,
    symbols: Vec<(Symbol, SymbolSource)>,
}

/// Marks values read by nobody later (graph outputs live to the end).
const LIVE_TO_END: usize = usize::MAX;

impl Executable {
    /// Builds an executable from an optimized graph; `symbols` tells where
    /// each symbol of a shapeless graph is read from.
    pub fn new(graph: Graph, symbols: Vec<(Symbol, SymbolSource)>) -> Executable {
        let mut last_use = vec![0; graph.nodes.len()];
        for (i, node) in graph.nodes.iter().enumerate() {
            for &j in &node.inputs {
                last_use[j] = i;
            }
        }
        for &o in &graph.outputs {
            last_use[o] = LIVE_TO_END;
        }
        let known_shapes = graph
            .nodes
            .iter()
            .map(|n| n.aval.shape.as_known())
            .collect();
        Executable {
            graph,
            last_use,
            known_shapes,
            symbols,
        }
    }

    /// The graph it runs.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The step after which value `v` is no longer read (`usize::MAX` for outputs).
    pub fn last_use(&self, v: usize) -> usize {
        self.last_use[v]
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
    /// checking every guard the trace relied on.
    pub fn resolve_shapes(&self, input_shapes: &[&[usize]]) -> Result<Cow<'_, [Vec<usize>]>> {
        if let Some(known) = &self.known_shapes {
            return Ok(Cow::Borrowed(known));
        }
        let bind = |s: Symbol| {
            self.symbols
                .iter()
                .find(|(sym, _)| *sym == s)
                .and_then(|(_, src)| input_shapes.get(src.leaf)?.get(src.axis))
                .map(|&n| n as i64)
        };
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
            shapes.push(shape);
        }
        self.check_inputs(input_shapes, |shape| shape.eval(&bind))?;
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

fn node_name(kind: &ValueKind) -> String {
    match kind {
        ValueKind::Input(i) => format!("input {i}"),
        ValueKind::Constant(_) => "constant".into(),
        ValueKind::Op(op) => op.name().to_string(),
    }
}

/// A device that runs executables.
///
/// Buffers are the backend's own; `upload` and `download` move host data in
/// and out, and `run` executes every step of an executable, returning the
/// graph outputs.
pub trait Backend: Send + Sync + 'static {
    /// A device-resident buffer.
    type Buffer: Send + Sync;
    /// A short name that is part of every cache key (`cpu`, `wgpu:…`).
    fn name(&self) -> &str;
    /// Copies host data to the device.
    fn upload(&self, data: &Arc<HostData>) -> Result<Self::Buffer>;
    /// Copies a buffer back to the host.
    fn download(&self, buffer: Self::Buffer) -> Result<Arc<HostData>>;
    /// Runs `exe` on argument buffers; `shapes` is the concrete shape of
    /// every value of its graph, as [`Executable::resolve_shapes`] gives
    /// them for this call.
    fn run(
        &self,
        exe: &Executable,
        inputs: &[Self::Buffer],
        shapes: &[Vec<usize>],
    ) -> Result<Vec<Self::Buffer>>;
}

/// A value held by the CPU executor: shared with the caller (arguments,
/// constants) or computed and owned by this run.
enum CpuValue {
    Shared(Arc<HostData>),
    Owned(HostData),
}

impl CpuValue {
    fn data(&self) -> &HostData {
        match self {
            CpuValue::Shared(data) => data,
            CpuValue::Owned(data) => data,
        }
    }
}

/// The CPU executor: runs every step with the reference evaluation of its
/// op. It is the embedded default device and the oracle for other backends.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

impl Backend for CpuBackend {
    type Buffer = Arc<HostData>;

    fn name(&self) -> &str {
        "cpu"
    }

    fn upload(&self, data: &Arc<HostData>) -> Result<Arc<HostData>> {
        Ok(data.clone())
    }

    fn download(&self, buffer: Arc<HostData>) -> Result<Arc<HostData>> {
        Ok(buffer)
    }

    fn run(
        &self,
        exe: &Executable,
        inputs: &[Arc<HostData>],
        shapes: &[Vec<usize>],
    ) -> Result<Vec<Arc<HostData>>> {
        let graph = exe.graph();
        if shapes.len() != graph.nodes.len() {
            return Err(Error::Backend {
                backend: "cpu".into(),
                detail: format!(
                    "{} value shapes for a graph of {} values",
                    shapes.len(),
                    graph.nodes.len()
                ),
            });
        }
        let released = |step: usize, j: usize| Error::Backend {
            backend: "cpu".into(),
            detail: format!("step {step} reads value {j}, which is not live"),
        };
        let mut values: Vec<Option<CpuValue>> = Vec::with_capacity(graph.nodes.len());
        for (step, node) in graph.nodes.iter().enumerate() {
            let value = match &node.kind {
                ValueKind::Input(i) => {
                    CpuValue::Shared(inputs.get(*i).cloned().ok_or_else(|| Error::Backend {
                        backend: "cpu".into(),
                        detail: format!(
                            "executable reads argument {i}, {} were given",
                            inputs.len()
                        ),
                    })?)
                }
                ValueKind::Constant(literal) => CpuValue::Shared(literal.0.clone()),
                ValueKind::Op(op) => {
                    let mut operands: SmallVec<[&HostData; 4]> =
                        SmallVec::with_capacity(node.inputs.len());
                    let mut operand_shapes: SmallVec<[&[usize]; 4]> =
                        SmallVec::with_capacity(node.inputs.len());
                    for &j in &node.inputs {
                        operands.push(values[j].as_ref().ok_or_else(|| released(step, j))?.data());
                        operand_shapes.push(&shapes[j]);
                    }
                    CpuValue::Owned(op.eval(&operands, &operand_shapes, &shapes[step])?)
                }
            };
            values.push(Some(value));
            for &j in &node.inputs {
                if exe.last_use(j) == step {
                    values[j] = None;
                }
            }
        }
        graph
            .outputs
            .iter()
            .map(|&o| {
                // Share an owned output in place, so one returned twice is not copied.
                let shared = match values[o].take() {
                    Some(CpuValue::Owned(data)) => Arc::new(data),
                    Some(CpuValue::Shared(data)) => data,
                    None => return Err(released(graph.nodes.len(), o)),
                };
                values[o] = Some(CpuValue::Shared(shared.clone()));
                Ok(shared)
            })
            .collect()
    }
}
