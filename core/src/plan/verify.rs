//! An independent checker for slot plans. It shares no code with the
//! planner: it recomputes who reads what from the graph alone and replays
//! the schedule buffer by buffer, so a planner bug cannot hide behind the
//! planner's own bookkeeping.

use super::{Arena, Home};
use crate::ir::graph::{Graph, ValueId, ValueKind};
use crate::symbolic::DimFacts;
use std::collections::HashMap;
use std::fmt;

/// A way a plan is wrong; the verifier reports the first it meets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanViolation {
    /// The plan gives homes to a different number of values than the graph has.
    WrongLength {
        /// Values in the graph.
        values: usize,
        /// Homes in the plan.
        homes: usize,
    },
    /// An input or constant is placed somewhere other than its own buffer.
    MisplacedLeaf {
        /// The value.
        value: ValueId,
    },
    /// A computed value is placed in a constant.
    WriteToConstant {
        /// The value.
        value: ValueId,
    },
    /// A step reads a value whose buffer was overwritten.
    ReadAfterOverwrite {
        /// The reading step.
        step: usize,
        /// The value it needs.
        value: ValueId,
        /// The value the buffer holds instead (`None`: never written).
        holds: Option<ValueId>,
    },
    /// A step writes its output over an operand it reads, but is not an
    /// op that may write over it (elementwise, or a kernel's in-place
    /// input) with that operand's dtype and a provably equal shape.
    InvalidInPlace {
        /// The writing step.
        step: usize,
        /// The operand overwritten.
        operand: ValueId,
    },
    /// A caller's argument buffer is written though it was not donated.
    UndonatedInputWritten {
        /// The writing step.
        step: usize,
        /// The argument leaf.
        leaf: usize,
    },
    /// A value does not fit its slot.
    SlotTooSmall {
        /// The value.
        value: ValueId,
        /// The slot.
        slot: usize,
        /// The value's bytes.
        needs: usize,
        /// The slot's bytes.
        has: usize,
    },
    /// Two values live at a common step occupy overlapping arena bytes.
    SharedBytes {
        /// The value being defined.
        value: ValueId,
        /// The live value whose bytes it overlaps.
        live: ValueId,
    },
    /// A value lives in a slot the plan does not size.
    UnknownSlot {
        /// The value.
        value: ValueId,
        /// The slot.
        slot: usize,
    },
}

impl fmt::Display for PlanViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanViolation::WrongLength { values, homes } => {
                write!(f, "{homes} homes for {values} values")
            }
            PlanViolation::MisplacedLeaf { value } => {
                write!(f, "input or constant %{value} is not in its own buffer")
            }
            PlanViolation::WriteToConstant { value } => {
                write!(f, "%{value} is written into a constant")
            }
            PlanViolation::ReadAfterOverwrite { step, value, holds } => match holds {
                Some(h) => write!(f, "step {step} reads %{value}, but its buffer holds %{h}"),
                None => write!(f, "step {step} reads %{value}, but its buffer was never written"),
            },
            PlanViolation::InvalidInPlace { step, operand } => write!(
                f,
                "step {step} writes over its operand %{operand}, which is not a valid in-place operand"
            ),
            PlanViolation::UndonatedInputWritten { step, leaf } => {
                write!(f, "step {step} writes argument leaf {leaf}, which was not donated")
            }
            PlanViolation::SlotTooSmall {
                value,
                slot,
                needs,
                has,
            } => write!(f, "%{value} needs {needs} bytes, slot {slot} has {has}"),
            PlanViolation::SharedBytes { value, live } => {
                write!(f, "%{value} overlaps the arena bytes of %{live}, which is still live")
            }
            PlanViolation::UnknownSlot { value, slot } => {
                write!(f, "%{value} lives in slot {slot}, which the plan does not size")
            }
        }
    }
}

/// The buffer a home names (constants are never buffers one writes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Buffer {
    Input(usize),
    Slot(usize),
}

/// Checks `homes` (one per value) and the `arena` placing the slots
/// against `graph` run on values of `shapes`, replaying the schedule: every
/// read (and every output at the end) finds its value still in its buffer,
/// so no two live values ever share one; a step writes over an operand it
/// reads only as a valid in-place continuation (elementwise, or a kernel's
/// declared in-place input); only `donated`
/// arguments are written; every value fits its slot; and values live at a
/// common step in different slots never share arena bytes.
pub fn verify_plan(
    graph: &Graph,
    homes: &[Home],
    arena: &Arena,
    donated: &[bool],
    shapes: &[Vec<usize>],
) -> Result<(), PlanViolation> {
    let n = graph.nodes.len();
    if homes.len() != n || shapes.len() != n {
        return Err(PlanViolation::WrongLength {
            values: n,
            homes: homes.len(),
        });
    }
    let facts = graph.dim_facts();
    let mut needed_until = vec![0usize; n];
    for (step, node) in graph.nodes.iter().enumerate() {
        for &j in &node.inputs {
            needed_until[j] = needed_until[j].max(step);
        }
    }
    for &o in &graph.outputs {
        needed_until[o] = n;
    }
    // Arguments are in their buffers before the first step.
    let mut holder: HashMap<Buffer, ValueId> = HashMap::new();
    for (v, node) in graph.nodes.iter().enumerate() {
        if let ValueKind::Input(i) = node.kind {
            holder.insert(Buffer::Input(i), v);
        }
    }
    let buffer_of = |v: ValueId| match homes[v] {
        Home::Input(i) => Some(Buffer::Input(i)),
        Home::Slot(s) => Some(Buffer::Slot(s)),
        Home::Constant => None,
    };
    let reads = |step: usize, v: ValueId, holder: &HashMap<Buffer, ValueId>| match buffer_of(v) {
        None => Ok(()),
        Some(buffer) => match holder.get(&buffer) {
            Some(&h) if h == v => Ok(()),
            holds => Err(PlanViolation::ReadAfterOverwrite {
                step,
                value: v,
                holds: holds.copied(),
            }),
        },
    };
    // A control node writes its results (`get` values) when it runs.
    let mut results: HashMap<ValueId, Vec<ValueId>> = HashMap::new();
    for v in 0..n {
        if graph.written_at(v) != v {
            results.entry(graph.written_at(v)).or_default().push(v);
        }
    }
    for (step, node) in graph.nodes.iter().enumerate() {
        for &j in &node.inputs {
            reads(step, j, &holder)?;
        }
        if graph.written_at(step) != step {
            continue;
        }
        match &node.kind {
            ValueKind::Input(i) => {
                if homes[step] != Home::Input(*i) {
                    return Err(PlanViolation::MisplacedLeaf { value: step });
                }
                continue;
            }
            ValueKind::Constant(_) => {
                if homes[step] != Home::Constant {
                    return Err(PlanViolation::MisplacedLeaf { value: step });
                }
                continue;
            }
            ValueKind::Op(_) => {}
        }
        let buffer = buffer_of(step).ok_or(PlanViolation::WriteToConstant { value: step })?;
        if let Buffer::Input(leaf) = buffer {
            if !donated.get(leaf).copied().unwrap_or(false) {
                return Err(PlanViolation::UndonatedInputWritten { step, leaf });
            }
        }
        // Overwriting a value read later shows up at that read; here, only
        // the operands this very step reads.
        if let Some(&previous) = holder.get(&buffer) {
            if needed_until[previous] == step && !continues_in_place(&facts, graph, step, previous)
            {
                return Err(PlanViolation::InvalidInPlace {
                    step,
                    operand: previous,
                });
            }
        }
        holder.insert(buffer, step);
        for &result in results.get(&step).into_iter().flatten() {
            let buffer =
                buffer_of(result).ok_or(PlanViolation::WriteToConstant { value: result })?;
            // A result never takes the buffer of a value its node reads.
            if let Some(&previous) = holder.get(&buffer) {
                if needed_until[previous] >= step {
                    return Err(PlanViolation::InvalidInPlace {
                        step,
                        operand: previous,
                    });
                }
            }
            holder.insert(buffer, result);
        }
    }
    for &o in &graph.outputs {
        reads(n, o, &holder)?;
    }
    for (v, home) in homes.iter().enumerate() {
        if let Home::Slot(slot) = *home {
            let has = *arena
                .bytes
                .get(slot)
                .filter(|_| slot < arena.offsets.len())
                .ok_or(PlanViolation::UnknownSlot { value: v, slot })?;
            let aval = &graph.nodes[v].aval;
            let needs = shapes[v].iter().product::<usize>() * aval.dtype.size_bytes();
            if needs > has {
                return Err(PlanViolation::SlotTooSmall {
                    value: v,
                    slot,
                    needs,
                    has,
                });
            }
        }
    }
    // Sweep the schedule with the slot values still live.
    let region = |slot: usize| (arena.offsets[slot], arena.offsets[slot] + arena.bytes[slot]);
    let mut live: Vec<(ValueId, usize)> = Vec::new();
    let mut by_write: Vec<ValueId> = (0..n).collect();
    by_write.sort_by_key(|&v| (graph.written_at(v), v));
    for v in by_write {
        let Home::Slot(slot) = homes[v] else { continue };
        let written = graph.written_at(v);
        live.retain(|&(u, _)| needed_until[u] >= written);
        let (start, end) = region(slot);
        if let Some(&(u, _)) = live.iter().find(|&&(_, other)| {
            let (s, e) = region(other);
            other != slot && start < e && s < end
        }) {
            return Err(PlanViolation::SharedBytes { value: v, live: u });
        }
        live.push((v, slot));
    }
    Ok(())
}

/// True when step `step` may write its output over operand `operand`,
/// which it reads for the last time: an op that may write over it
/// ([`crate::Op::may_write_over`]) and whose output has the operand's dtype
/// and a provably equal shape (dim by dim).
fn continues_in_place(facts: &DimFacts, graph: &Graph, step: usize, operand: ValueId) -> bool {
    let node = &graph.nodes[step];
    let writable = matches!(&node.kind, ValueKind::Op(op)
        if node.inputs.iter().enumerate().any(|(p, &j)| j == operand && op.may_write_over(p)));
    let source = &graph.nodes[operand].aval;
    writable && facts.avals_equal(source, &node.aval)
}
