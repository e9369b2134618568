//! Reinplacing and buffer-slot planning.
//!
//! [`SlotPlan::build`] decides, per elementwise node (and kernel with an
//! in-place input), whether its output takes an operand's buffer ([`reinplace()`]), then gives every computed value a
//! slot and a lifetime (`plan::slots`). Backends run through the plan; the
//! independent [`verify_plan`] checks every plan in debug builds and tests.

mod reinplace;
mod slots;
mod verify;

pub use reinplace::{reinplace, OperandVerdict, Refusal, ReinplaceDecision};
pub use slots::{aligned, lifetimes, place_slots, Arena, Home, Lifetime, SlotId, SLOT_ALIGN};
pub use verify::{verify_plan, PlanViolation};

use crate::ir::graph::{Graph, ValueId, ValueKind};
use crate::shape::{Dim, SymExpr};
use crate::DType;
use serde::{Deserialize, Serialize};

/// How an executable's values are placed in buffers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlotPlan {
    decisions: Vec<ReinplaceDecision>,
    in_place: Vec<Option<ValueId>>,
    homes: Vec<Home>,
    lifetimes: Vec<Lifetime>,
    /// Per slot, the values it holds, in schedule order.
    slots: Vec<Vec<ValueId>>,
    /// Per slot, the steps it holds a value: sorted, disjoint lifetimes.
    busy: Vec<Vec<Lifetime>>,
    /// The slots placed for the traced call's sizes.
    traced_arena: Arena,
    donated: Vec<bool>,
}

/// Memory figures of a plan for one set of shapes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanMemory {
    /// The arena holding every slot: what a backend allocates.
    pub peak_bytes: usize,
    /// The most bytes of computed values live at any one step of this
    /// schedule: no plan for it can allocate less.
    pub lower_bound_bytes: usize,
    /// Bytes if every computed value had a buffer of its own.
    pub no_reuse_bytes: usize,
}

impl SlotPlan {
    /// Plans `graph` for values of `shapes` (the traced call's).
    /// `donated[i]` says whether argument leaf `i` may be written. The
    /// slots hold for every shape a shapeless executable accepts: their
    /// sizes, and where the arena places them, are resolved per set of
    /// shapes ([`SlotPlan::arena`]).
    pub fn build(graph: &Graph, donated: &[bool], shapes: &[Vec<usize>]) -> SlotPlan {
        let lifetimes = lifetimes(graph);
        let decisions = reinplace(graph, donated, &lifetimes);
        let mut in_place = vec![None; graph.nodes.len()];
        for decision in &decisions {
            in_place[decision.node] = decision.target();
        }
        let bytes: Vec<usize> = (0..graph.nodes.len())
            .map(|v| value_bytes(graph, shapes, v, DType::size_bytes))
            .collect();
        let (homes, slots, traced_arena) =
            slots::assign_slots(graph, &in_place, &lifetimes, &bytes);
        let busy = slots
            .iter()
            .map(|values| {
                let mut merged: Vec<Lifetime> = Vec::new();
                for &v in values {
                    let life = lifetimes[v];
                    match merged.last_mut() {
                        Some(last) if life.def <= last.last => last.last = last.last.max(life.last),
                        _ => merged.push(life),
                    }
                }
                merged
            })
            .collect();
        SlotPlan {
            decisions,
            in_place,
            homes,
            lifetimes,
            slots,
            busy,
            traced_arena,
            donated: donated.to_vec(),
        }
    }

    /// The reinplace decision of every node that may write over an operand,
    /// in schedule order.
    pub fn decisions(&self) -> &[ReinplaceDecision] {
        &self.decisions
    }

    /// The operand whose buffer value `v` is written into, if any.
    pub fn in_place_of(&self, v: ValueId) -> Option<ValueId> {
        self.in_place[v]
    }

    /// Where value `v` lives.
    pub fn home(&self, v: ValueId) -> Home {
        self.homes[v]
    }

    /// Every value's home.
    pub fn homes(&self) -> &[Home] {
        &self.homes
    }

    /// Value `v`'s lifetime over the schedule.
    pub fn lifetime(&self, v: ValueId) -> Lifetime {
        self.lifetimes[v]
    }

    /// Number of slots.
    pub fn num_slots(&self) -> usize {
        self.slots.len()
    }

    /// The values slot `s` holds, in schedule order.
    pub fn slot_values(&self, s: SlotId) -> &[ValueId] {
        &self.slots[s]
    }

    /// Which argument leaves were donated.
    pub fn donated(&self) -> &[bool] {
        &self.donated
    }

    /// Each slot's size in bytes for values of `shapes` (one per value),
    /// with `element_bytes` giving a backend's storage size per dtype:
    /// the largest value it holds, rounded up to [`SLOT_ALIGN`].
    pub fn slot_bytes(
        &self,
        graph: &Graph,
        shapes: &[Vec<usize>],
        element_bytes: impl Fn(DType) -> usize,
    ) -> Vec<usize> {
        self.slots
            .iter()
            .map(|values| {
                values
                    .iter()
                    .map(|&v| aligned(value_bytes(graph, shapes, v, &element_bytes)))
                    .max()
                    .unwrap_or(0)
            })
            .collect()
    }

    /// Slot `s`'s size as an expression of the symbols, like `4*s0*s1`
    /// (before rounding to [`SLOT_ALIGN`]).
    pub fn slot_bytes_expr(&self, graph: &Graph, s: SlotId) -> String {
        self.slots[s].first().map_or_else(
            || "0".to_string(),
            |&v| byte_expr(&graph.nodes[v].aval).to_string(),
        )
    }

    /// The steps during which slot `s` holds a value.
    pub fn slot_busy(&self, s: SlotId) -> &[Lifetime] {
        &self.busy[s]
    }

    /// The slots placed in one arena buffer for values of `shapes`, with
    /// `element_bytes` giving a backend's storage size per dtype: the
    /// traced placement when the sizes are the traced ones, else the slots
    /// placed again for these sizes.
    pub fn arena(
        &self,
        graph: &Graph,
        shapes: &[Vec<usize>],
        element_bytes: impl Fn(DType) -> usize,
    ) -> Arena {
        let bytes = self.slot_bytes(graph, shapes, element_bytes);
        if bytes == self.traced_arena.bytes {
            return self.traced_arena.clone();
        }
        place_slots(&self.busy, &bytes)
    }

    /// Peak, lower bound and no-reuse bytes for values of `shapes`.
    pub fn memory(&self, graph: &Graph, shapes: &[Vec<usize>]) -> PlanMemory {
        let arena = self.arena(graph, shapes, DType::size_bytes);
        let n = graph.nodes.len();
        // Bytes live at each step: a chain of in-place values counts once,
        // from its first definition to its last read.
        let mut delta = vec![0isize; n + 2];
        let mut no_reuse_bytes = 0;
        for (v, node) in graph.nodes.iter().enumerate() {
            if !matches!(node.kind, ValueKind::Op(_)) {
                continue;
            }
            let bytes = aligned(value_bytes(graph, shapes, v, DType::size_bytes));
            no_reuse_bytes += bytes;
            if !matches!(self.homes[v], Home::Slot(_)) {
                continue;
            }
            let life = self.lifetimes[v];
            // An in-place value starts where its operand ends: count the
            // shared step once.
            let start = if self.in_place[v].is_some() {
                life.def + 1
            } else {
                life.def
            };
            if start <= life.last {
                delta[start] += bytes as isize;
                delta[life.last + 1] -= bytes as isize;
            }
        }
        let mut live = 0isize;
        let mut lower_bound_bytes = 0isize;
        for d in &delta {
            live += d;
            lower_bound_bytes = lower_bound_bytes.max(live);
        }
        PlanMemory {
            peak_bytes: arena.size,
            lower_bound_bytes: lower_bound_bytes as usize,
            no_reuse_bytes,
        }
    }

    /// Runs [`verify_plan`] on this plan and its arena for values of `shapes`.
    pub fn verify(&self, graph: &Graph, shapes: &[Vec<usize>]) -> Result<(), PlanViolation> {
        let arena = self.arena(graph, shapes, DType::size_bytes);
        verify_plan(graph, &self.homes, &arena, &self.donated, shapes)
    }
}

/// Value `v`'s size in bytes for `shapes`, with `element_bytes` per dtype.
fn value_bytes(
    graph: &Graph,
    shapes: &[Vec<usize>],
    v: ValueId,
    element_bytes: impl Fn(DType) -> usize,
) -> usize {
    shapes[v].iter().product::<usize>() * element_bytes(graph.nodes[v].aval.dtype)
}

/// A value's size in bytes as an expression of the symbols.
fn byte_expr(aval: &crate::shape::Aval) -> SymExpr {
    let element = aval.dtype.size_bytes() as i64;
    match aval.shape.numel() {
        Dim::Known(n) => SymExpr::constant(n as i64 * element),
        Dim::Sym(e) => e.scale(element),
    }
}
