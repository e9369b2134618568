//! The CPU executor: every step runs the reference evaluation of its op,
//! through the executable's slot plan.

use super::control::run_control;
use super::kernels::{KernelList, KernelStep, StepBinding, StepKind};
use super::{Backend, Executable};
use crate::data::HostData;
use crate::error::{Error, Result};
use crate::hash::FastMap;
use crate::ir::graph::{Graph, ValueKind};
use crate::ops::Op;
use crate::plan::Home;
use smallvec::SmallVec;
use std::sync::Arc;

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

impl Drop for CpuBuffers {
    /// The slots' buffers go to the host pool, for the next call's outputs
    /// of their sizes: a large one would otherwise go back to the system
    /// and fault in again.
    fn drop(&mut self) {
        for dead in self.slots.drain(..).flatten() {
            crate::pool::give_back(dead);
        }
    }
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

    /// Value `v`'s buffer shared with a control node's bodies. An
    /// argument's is shared, not copied (a decode loop's constants are a
    /// model's weights); when this step is `v`'s last reader, a slot's or a
    /// donated argument's buffer moves out, so a body may write it in
    /// place; otherwise a slot's is copied.
    fn share(
        &mut self,
        graph: &Graph,
        step: usize,
        home: Home,
        v: usize,
        last: bool,
    ) -> Result<Arc<HostData>> {
        if let Home::Input(i) = home {
            self.check_holder(step, home, v)?;
            let argument = std::mem::replace(&mut self.arguments[i], CpuArgument::Taken);
            let data = match argument {
                CpuArgument::Shared(data) => data,
                CpuArgument::Owned(data) => Arc::new(data),
                CpuArgument::Taken => {
                    return Err(Error::InvalidPlan {
                        detail: format!("step {step} reads %{v}, whose buffer is empty"),
                    })
                }
            };
            if !last {
                self.arguments[i] = CpuArgument::Shared(data.clone());
            }
            return Ok(data);
        }
        if last && matches!(home, Home::Slot(_)) {
            return self.take(step, home, v).map(Arc::new);
        }
        self.read(graph, step, home, v)
            .map(|data| Arc::new(data.clone()))
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

    /// Stores value `v`'s data in its home; the dead value a slot held goes
    /// to the host pool.
    fn put(&mut self, home: Home, v: usize, data: HostData) -> Result<()> {
        let b = self.index(home).ok_or_else(|| Error::InvalidPlan {
            detail: format!("%{v} is computed but placed in a constant"),
        })?;
        match home {
            Home::Slot(s) => {
                if let Some(dead) = self.slots[s].replace(data) {
                    crate::pool::give_back(dead);
                }
            }
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

    /// Its products read operands through strides.
    fn reads_transposed_operands(&self) -> bool {
        true
    }

    fn download(&self, buffer: Arc<HostData>) -> Result<Arc<HostData>> {
        Ok(buffer)
    }

    /// One step per op node, in schedule order: the node's op evaluated
    /// into its home (an in-place node's is its operand's), reading its
    /// operands' homes. Inputs and constants need no step.
    fn kernels(&self, exe: &Executable, shapes: &[Vec<usize>]) -> Result<KernelList> {
        let graph = exe.graph();
        let plan = exe.plan();
        let bytes = |v: usize| -> u64 {
            let numel: usize = shapes.get(v).map_or(0, |s| s.iter().product());
            (numel * graph.nodes[v].aval.dtype.size_bytes()) as u64
        };
        let binding = |v: usize| StepBinding {
            buffer: match plan.home(v) {
                Home::Slot(s) => format!("slot {s}"),
                Home::Input(i) => format!("input {i}"),
                Home::Constant => "constant".to_string(),
            },
            offset: 0,
            bytes: bytes(v),
        };
        let steps = graph
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(v, node)| match &node.kind {
                ValueKind::Op(op) => Some(KernelStep {
                    kind: StepKind::Evaluate,
                    op: op.describe(),
                    nodes: vec![v],
                    source: None,
                    entry_point: None,
                    bindings: std::iter::once(v)
                        .chain(node.inputs.iter().copied())
                        .map(binding)
                        .collect(),
                    grid: None,
                }),
                _ => None,
            })
            .collect();
        Ok(KernelList {
            backend: "cpu".to_string(),
            executable: exe.id(),
            steps,
            sources: Vec::new(),
            arena_bytes: None,
        })
    }

    fn run(
        &self,
        exe: &Executable,
        inputs: Vec<Arc<HostData>>,
        shapes: &[Vec<usize>],
    ) -> Result<Vec<Arc<HostData>>> {
        run_steps(exe, inputs, shapes, &mut ())
    }
}

/// Told when each op step of a CPU run is done: the untimed run's `()`
/// does nothing (and compiles to nothing).
trait StepObserver {
    fn step_done(&mut self);
}

impl StepObserver for () {
    #[inline(always)]
    fn step_done(&mut self) {}
}

/// Milliseconds per op step, read from a caller's clock.
struct StepTimer<'c> {
    clock: &'c dyn Fn() -> f64,
    last: f64,
    steps: Vec<f64>,
}

impl StepObserver for StepTimer<'_> {
    fn step_done(&mut self) {
        let now = (self.clock)();
        self.steps.push(now - self.last);
        self.last = now;
    }
}

impl CpuBackend {
    /// Runs `exe` like [`Backend::run`] and times each op step with
    /// `clock` (milliseconds from any origin; the page's
    /// `performance.now()`, `Instant` natively): the outputs, and each op
    /// step's milliseconds in the order [`Backend::kernels`] lists them.
    /// A plain run reads no clock.
    ///
    /// ```
    /// use kiln::{compile, Array, Backend, CpuBackend, DType};
    /// let f = compile(|x: Array| x.exp().sum(&[0], false));
    /// let x = Array::ones(&[8], DType::F32);
    /// let exe = f.executable(&x)?;
    /// let shapes = exe.resolve_shapes(&[])?;
    /// let start = std::time::Instant::now();
    /// let clock = || start.elapsed().as_secs_f64() * 1e3;
    /// let (out, steps) = CpuBackend.run_timed(&exe, vec![x.data()?], &shapes, &clock)?;
    /// assert_eq!(steps.len(), CpuBackend.kernels(&exe, &shapes)?.steps.len());
    /// assert_eq!(out.len(), 1);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn run_timed(
        &self,
        exe: &Executable,
        inputs: Vec<Arc<HostData>>,
        shapes: &[Vec<usize>],
        clock: &dyn Fn() -> f64,
    ) -> Result<(Vec<Arc<HostData>>, Vec<f64>)> {
        let mut timer = StepTimer {
            clock,
            last: clock(),
            steps: Vec::new(),
        };
        let outputs = run_steps(exe, inputs, shapes, &mut timer)?;
        Ok((outputs, timer.steps))
    }
}

/// The CPU executor's run, telling `observer` of each op step done.
fn run_steps<O: StepObserver>(
    exe: &Executable,
    inputs: Vec<Arc<HostData>>,
    shapes: &[Vec<usize>],
    observer: &mut O,
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
    // Each control node's results: its `get` values and their indices.
    let mut results_of: FastMap<usize, SmallVec<[(usize, usize); 4]>> = FastMap::default();
    for (v, node) in graph.nodes.iter().enumerate() {
        if let ValueKind::Op(Op::Get { index, .. }) = node.kind {
            results_of
                .entry(node.inputs[0])
                .or_default()
                .push((v, index));
        }
    }
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
            // Its control node wrote it.
            ValueKind::Op(Op::Get { .. }) => {
                observer.step_done();
                continue;
            }
            ValueKind::Op(op) => op,
        };
        let mut operand_shapes: SmallVec<[&[usize]; 4]> =
            SmallVec::with_capacity(node.inputs.len());
        for &j in &node.inputs {
            operand_shapes.push(&shapes[j]);
        }
        if let Op::Control(call) = op {
            let results = {
                let mut operands = Vec::with_capacity(node.inputs.len());
                for &j in &node.inputs {
                    let once = node.inputs.iter().filter(|&&i| i == j).count() == 1;
                    // The plan's lifetime ends at the last reading step
                    // (past the schedule for an output).
                    let last = once && plan.lifetime(j).last == step;
                    operands.push(buffers.share(graph, step, plan.home(j), j, last)?);
                }
                run_control(
                    call,
                    exe.bodies(step),
                    operands,
                    &operand_shapes,
                    &|body, inputs, shapes| CpuBackend.run(body, inputs, shapes),
                )?
            };
            buffers.put(plan.home(step), step, HostData::U8(Vec::new()))?;
            // Each result moves into its `get`'s buffer: a loop's final
            // carries (a whole cache) are not copied again; a result two
            // `get`s read is copied for all but the last.
            let mut results: Vec<Option<Arc<HostData>>> = results.into_iter().map(Some).collect();
            let gets = results_of.get(&step).map_or(&[][..], |g| g.as_slice());
            for (k, &(get, index)) in gets.iter().enumerate() {
                let missing = || Error::InvalidPlan {
                    detail: format!("%{get} reads result {index} of `{}`", call.name()),
                };
                let read_again = gets[k + 1..].iter().any(|&(_, i)| i == index);
                let data = match results.get_mut(index).ok_or_else(missing)? {
                    slot if read_again => slot.clone().ok_or_else(missing)?,
                    slot => slot.take().ok_or_else(missing)?,
                };
                let owned = Arc::try_unwrap(data).unwrap_or_else(|shared| (*shared).clone());
                buffers.put(plan.home(get), get, owned)?;
            }
            observer.step_done();
            continue;
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
        observer.step_done();
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
