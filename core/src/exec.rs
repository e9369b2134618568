//! Executables (ordered steps over values), per-call shape resolution, the
//! [`Backend`] trait and its first implementation, the CPU executor.

use crate::data::HostData;
use crate::device::DeviceBuffer;
use crate::error::{Error, Result};
use crate::graph::{Graph, ValueKind};
use crate::limits::{check_call_bytes, check_shape};
use crate::ops::Condition;
use crate::plan::{Home, SlotPlan};
use crate::shape::{Shape, Symbol};
use smallvec::SmallVec;
use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
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
        };
        let shapes = exe.representative_shapes(input_shapes);
        exe.plan = SlotPlan::build(&exe.graph, donated, &shapes);
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

fn node_name(kind: &ValueKind) -> String {
    match kind {
        ValueKind::Input(i) => format!("input {i}"),
        ValueKind::Constant(_) => "constant".into(),
        ValueKind::Op(op) => op.name().to_string(),
    }
}

/// The readback of [`Backend::download_async`].
pub type DownloadFuture<'a> = Pin<Box<dyn Future<Output = Result<Arc<HostData>>> + 'a>>;

/// A device that runs executables.
///
/// Buffers are the backend's own; `upload` and `download` move host data in
/// and out, and `run` executes every step of an executable, returning the
/// graph outputs.
pub trait Backend: Send + Sync + 'static {
    /// A device-resident buffer; a clone shares it (an array whose value
    /// stays on the device holds one).
    type Buffer: Clone + Send + Sync + 'static;
    /// A short name that is part of every cache key (`cpu`, `wgpu:…`).
    fn name(&self) -> &str;
    /// Copies host data to the device.
    fn upload(&self, data: &Arc<HostData>) -> Result<Self::Buffer>;
    /// Copies a buffer back to the host.
    fn download(&self, buffer: Self::Buffer) -> Result<Arc<HostData>>;
    /// Copies a buffer back to the host without blocking, for a browser,
    /// where a GPU readback completes only after the page yields. By
    /// default it completes at once through [`Backend::download`].
    fn download_async(&self, buffer: Self::Buffer) -> DownloadFuture<'_> {
        Box::pin(std::future::ready(self.download(buffer)))
    }
    /// Runs `exe` on argument buffers through its [`SlotPlan`]; `shapes` is
    /// the concrete shape of every value of its graph, as
    /// [`Executable::resolve_shapes`] gives them for this call. The
    /// buffers are given up: an argument the plan writes in place (a
    /// donated one) may be reused when nothing else holds it.
    fn run(
        &self,
        exe: &Executable,
        inputs: Vec<Self::Buffer>,
        shapes: &[Vec<usize>],
    ) -> Result<Vec<Self::Buffer>>;
    /// `buffer` type-erased, as a [`crate::Device`] and an array kept on
    /// the device hold it.
    fn share(buffer: Self::Buffer) -> DeviceBuffer {
        Arc::new(buffer)
    }
    /// A buffer of this backend back from [`Backend::share`]; `None` for
    /// another backend's.
    fn unshare(buffer: &DeviceBuffer) -> Option<Self::Buffer> {
        buffer.downcast_ref::<Self::Buffer>().cloned()
    }
}

/// The environment variable that sets how many threads the CPU executor
/// splits work across.
pub const THREADS_VAR: &str = "KILN_THREADS";

/// How many threads the CPU executor splits work across: [`THREADS_VAR`]
/// (`KILN_THREADS`) when it holds a positive integer, otherwise every core
/// the process may use. Read once per process, at the first split; a value
/// that is not a positive integer is reported on stderr and ignored.
/// wasm32 always runs on one thread.
///
/// ```
/// assert!(kiln::exec::cpu_threads() >= 1);
/// ```
pub fn cpu_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| {
        let cores = || std::thread::available_parallelism().map_or(1, |n| n.get());
        match std::env::var(THREADS_VAR) {
            Err(_) => cores(),
            Ok(value) => parse_thread_count(&value).unwrap_or_else(|err| {
                let cores = cores();
                eprintln!("kiln: {err}; using all {cores} cores");
                cores
            }),
        }
    })
}

/// A thread count as [`THREADS_VAR`] spells it: a positive integer
/// (surrounding spaces allowed).
pub fn parse_thread_count(value: &str) -> Result<usize> {
    match value.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(Error::InvalidArgument {
            op: THREADS_VAR.into(),
            detail: format!("expects a positive number of threads, got `{value}`"),
        }),
    }
}

/// An argument buffer of the CPU executor: still shared with the caller,
/// or owned after the plan wrote a donated argument in place.
enum CpuArgument {
    Shared(Arc<HostData>),
    Owned(HostData),
    /// Taken out for an in-place write that is under way.
    Taken,
}

/// The CPU executor: runs every step with the reference evaluation of its
/// op, through the executable's plan: each computed value lives in its
/// slot, and a reinplaced node writes into its operand's buffer. It is the
/// embedded default device and the oracle for other backends.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

/// The buffers of one CPU run: slots, then argument buffers, and which
/// value each holds now (checked on every read, so a wrong plan is an
/// `Err`, never a wrong answer).
struct CpuBuffers {
    slots: Vec<Option<HostData>>,
    arguments: Vec<CpuArgument>,
    holder: Vec<usize>,
}

/// Marks a buffer that holds no value yet.
const EMPTY: usize = usize::MAX;

impl CpuBuffers {
    fn index(&self, home: Home) -> Option<usize> {
        match home {
            Home::Slot(s) => Some(s),
            Home::Input(i) => Some(self.slots.len() + i),
            Home::Constant => None,
        }
    }

    fn check_holder(&self, step: usize, home: Home, value: usize) -> Result<()> {
        let Some(b) = self.index(home) else {
            return Ok(());
        };
        match self.holder.get(b) {
            Some(&h) if h == value => Ok(()),
            holds => Err(Error::InvalidPlan {
                detail: format!(
                    "step {step} reads %{value} from {home:?}, which holds {}",
                    match holds {
                        Some(&EMPTY) | None => "nothing".to_string(),
                        Some(h) => format!("%{h}"),
                    }
                ),
            }),
        }
    }

    /// Value `v`'s data (it lives in `home`; constants in `graph`).
    fn read<'a>(
        &'a self,
        graph: &'a Graph,
        step: usize,
        home: Home,
        v: usize,
    ) -> Result<&'a HostData> {
        self.check_holder(step, home, v)?;
        let missing = || Error::InvalidPlan {
            detail: format!("step {step} reads %{v}, whose buffer is empty"),
        };
        match home {
            Home::Slot(s) => self.slots[s].as_ref().ok_or_else(missing),
            Home::Input(i) => match &self.arguments[i] {
                CpuArgument::Shared(data) => Ok(data),
                CpuArgument::Owned(data) => Ok(data),
                CpuArgument::Taken => Err(missing()),
            },
            Home::Constant => match &graph.nodes[v].kind {
                ValueKind::Constant(literal) => Ok(&literal.0),
                _ => Err(missing()),
            },
        }
    }

    /// Takes value `v`'s buffer out to write it in place; a donated
    /// argument still shared with someone else is copied first.
    fn take(&mut self, step: usize, home: Home, v: usize) -> Result<HostData> {
        self.check_holder(step, home, v)?;
        let taken = match home {
            Home::Slot(s) => self.slots[s].take(),
            Home::Input(i) => match std::mem::replace(&mut self.arguments[i], CpuArgument::Taken) {
                CpuArgument::Shared(data) => {
                    Some(Arc::try_unwrap(data).unwrap_or_else(|shared| (*shared).clone()))
                }
                CpuArgument::Owned(data) => Some(data),
                CpuArgument::Taken => None,
            },
            Home::Constant => None,
        };
        taken.ok_or_else(|| Error::InvalidPlan {
            detail: format!("step {step} writes %{v}'s buffer in place, but it has none"),
        })
    }

    /// Stores value `v`'s data in its home.
    fn put(&mut self, home: Home, v: usize, data: HostData) -> Result<()> {
        let b = self.index(home).ok_or_else(|| Error::InvalidPlan {
            detail: format!("%{v} is computed but placed in a constant"),
        })?;
        match home {
            Home::Slot(s) => self.slots[s] = Some(data),
            Home::Input(i) => self.arguments[i] = CpuArgument::Owned(data),
            Home::Constant => {}
        }
        self.holder[b] = v;
        Ok(())
    }
}

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
        inputs: Vec<Arc<HostData>>,
        shapes: &[Vec<usize>],
    ) -> Result<Vec<Arc<HostData>>> {
        let graph = exe.graph();
        let plan = exe.plan();
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
        let num_buffers = plan.num_slots() + inputs.len();
        let mut buffers = CpuBuffers {
            slots: (0..plan.num_slots()).map(|_| None).collect(),
            arguments: inputs.into_iter().map(CpuArgument::Shared).collect(),
            holder: vec![EMPTY; num_buffers],
        };
        for (step, node) in graph.nodes.iter().enumerate() {
            let op = match &node.kind {
                ValueKind::Input(i) => {
                    if *i >= buffers.arguments.len() {
                        return Err(Error::Backend {
                            backend: "cpu".into(),
                            detail: format!(
                                "executable reads argument {i}, {} were given",
                                buffers.arguments.len()
                            ),
                        });
                    }
                    let b = plan.home(step);
                    if let Some(b) = buffers.index(b) {
                        buffers.holder[b] = step;
                    }
                    continue;
                }
                ValueKind::Constant(_) => continue,
                ValueKind::Op(op) => op,
            };
            let mut operand_shapes: SmallVec<[&[usize]; 4]> =
                SmallVec::with_capacity(node.inputs.len());
            for &j in &node.inputs {
                operand_shapes.push(&shapes[j]);
            }
            let value = match plan.in_place_of(step) {
                Some(target) => {
                    let mut buffer = buffers.take(step, plan.home(target), target)?;
                    let mut operands: SmallVec<[Option<&HostData>; 4]> =
                        SmallVec::with_capacity(node.inputs.len());
                    for &j in &node.inputs {
                        operands.push(if j == target {
                            None
                        } else {
                            Some(buffers.read(graph, step, plan.home(j), j)?)
                        });
                    }
                    op.eval_in_place(&operands, &operand_shapes, &shapes[step], &mut buffer)?;
                    buffer
                }
                None => {
                    let mut operands: SmallVec<[&HostData; 4]> =
                        SmallVec::with_capacity(node.inputs.len());
                    for &j in &node.inputs {
                        operands.push(buffers.read(graph, step, plan.home(j), j)?);
                    }
                    op.eval(&operands, &operand_shapes, &shapes[step])?
                }
            };
            buffers.put(plan.home(step), step, value)?;
        }
        let end = graph.nodes.len();
        let mut returned: Vec<Option<Arc<HostData>>> = vec![None; num_buffers];
        graph
            .outputs
            .iter()
            .map(|&o| {
                let home = plan.home(o);
                let Some(b) = buffers.index(home) else {
                    return match &graph.nodes[o].kind {
                        ValueKind::Constant(literal) => Ok(literal.0.clone()),
                        _ => Err(Error::InvalidPlan {
                            detail: format!("output %{o} is computed but placed in a constant"),
                        }),
                    };
                };
                buffers.check_holder(end, home, o)?;
                // One buffer returned twice is shared, not copied.
                if let Some(shared) = &returned[b] {
                    return Ok(shared.clone());
                }
                let shared = match home {
                    Home::Slot(s) => buffers.slots[s].take().map(Arc::new),
                    Home::Input(i) => {
                        match std::mem::replace(&mut buffers.arguments[i], CpuArgument::Taken) {
                            CpuArgument::Shared(data) => Some(data),
                            CpuArgument::Owned(data) => Some(Arc::new(data)),
                            CpuArgument::Taken => None,
                        }
                    }
                    Home::Constant => None,
                }
                .ok_or_else(|| Error::InvalidPlan {
                    detail: format!("output %{o} has no buffer at the end of the run"),
                })?;
                returned[b] = Some(shared.clone());
                Ok(shared)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_counts_are_positive_integers() {
        assert_eq!(parse_thread_count("1"), Ok(1));
        assert_eq!(parse_thread_count(" 12 "), Ok(12));
        for bad in ["0", "-2", "two", "", "1.5"] {
            let err = parse_thread_count(bad).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains("KILN_THREADS") && text.contains(&format!("`{bad}`")),
                "{text}"
            );
        }
    }

    #[test]
    fn executables_of_equal_graphs_have_distinct_ids() {
        let build = || Executable::new(Graph::default(), Vec::new(), &[], &[]);
        let (a, b) = (build().unwrap(), build().unwrap());
        assert_eq!(a.graph(), b.graph());
        assert_ne!(a.id(), b.id());
    }
}
