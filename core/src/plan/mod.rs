//! Reinplacing and buffer-slot planning.
//!
//! [`Plan::build`] decides, per elementwise node, whether its output takes
//! an operand's buffer ([`reinplace`]), then gives every computed value a
//! slot and a lifetime ([`slots`]). Backends run through the plan; the
//! independent [`verify_plan`] checks every plan in debug builds and tests.

mod reinplace;
mod slots;
mod verify;

pub use reinplace::{reinplace, OperandVerdict, Refusal, ReinplaceDecision};
pub use slots::{aligned, lifetimes, Home, Lifetime, SlotId, SLOT_ALIGN};
pub use verify::{verify_plan, PlanViolation};

use crate::graph::{Graph, ValueId, ValueKind};
use crate::shape::{Dim, SymExpr};
use crate::DType;
use serde::{Deserialize, Serialize};

/// How an executable's values are placed in buffers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    decisions: Vec<ReinplaceDecision>,
    in_place: Vec<Option<ValueId>>,
    homes: Vec<Home>,
    lifetimes: Vec<Lifetime>,
    /// Per slot, the values it holds, in schedule order.
    slots: Vec<Vec<ValueId>>,
    donated: Vec<bool>,
}

/// Memory figures of a plan for one set of shapes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanMemory {
    /// Bytes of all slots together: what a backend allocates.
    pub peak_bytes: usize,
    /// The most bytes of computed values live at any one step of this
    /// schedule: no plan for it can allocate less.
    pub lower_bound_bytes: usize,
    /// Bytes if every computed value had a buffer of its own.
    pub no_reuse_bytes: usize,
}

impl Plan {
    /// Plans `graph`. `donated[i]` says whether argument leaf `i` may be
    /// written; `shapes` are representative concrete shapes of every value
    /// (the trace's), which order the packing. Slot sizes themselves are
    /// resolved per call, so the plan holds for every shape a shapeless
    /// executable accepts.
    pub fn build(graph: &Graph, donated: &[bool], shapes: &[Vec<usize>]) -> Plan {
        let decisions = reinplace(graph, donated);
        let mut in_place = vec![None; graph.nodes.len()];
        for decision in &decisions {
            in_place[decision.node] = decision.target();
        }
        let lifetimes = lifetimes(graph);
        let bytes = value_bytes(graph, shapes);
        let (homes, slots) = slots::assign_slots(graph, &in_place, &lifetimes, &bytes);
        Plan {
            decisions,
            in_place,
            homes,
            lifetimes,
            slots,
            donated: donated.to_vec(),
        }
    }

    /// The reinplace decision of every elementwise node, in schedule order.
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
                    .map(|&v| {
                        let numel: usize = shapes[v].iter().product();
                        aligned(numel * element_bytes(graph.nodes[v].aval.dtype))
                    })
                    .max()
                    .unwrap_or(0)
            })
            .collect()
    }

    /// Slot `s`'s size as an expression of the symbols (`4*s0*s1`, or
    /// `max(…)` when its values' sizes are not provably equal), before
    /// rounding.
    pub fn slot_bytes_expr(&self, graph: &Graph, s: SlotId) -> String {
        let mut sizes: Vec<SymExpr> = Vec::new();
        for &v in &self.slots[s] {
            let aval = &graph.nodes[v].aval;
            let bytes = match aval.shape.numel() {
                Dim::Known(n) => SymExpr::constant((n * aval.dtype.size_bytes()) as i64),
                Dim::Sym(e) => e.scale(aval.dtype.size_bytes() as i64),
            };
            if !sizes.contains(&bytes) {
                sizes.push(bytes);
            }
        }
        match sizes.as_slice() {
            [one] => one.to_string(),
            many => {
                let parts: Vec<String> = many.iter().map(|e| e.to_string()).collect();
                format!("max({})", parts.join(", "))
            }
        }
    }

    /// Peak, lower bound and no-reuse bytes for values of `shapes`.
    pub fn memory(&self, graph: &Graph, shapes: &[Vec<usize>]) -> PlanMemory {
        let slot_bytes = self.slot_bytes(graph, shapes, DType::size_bytes);
        let n = graph.nodes.len();
        // Bytes live at each step: a chain of in-place values counts once,
        // from its first definition to its last read.
        let mut delta = vec![0isize; n + 2];
        let mut no_reuse_bytes = 0;
        for (v, node) in graph.nodes.iter().enumerate() {
            if !matches!(node.kind, ValueKind::Op(_)) {
                continue;
            }
            let numel: usize = shapes[v].iter().product();
            let bytes = aligned(numel * node.aval.dtype.size_bytes());
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
            peak_bytes: slot_bytes.iter().sum(),
            lower_bound_bytes: lower_bound_bytes as usize,
            no_reuse_bytes,
        }
    }

    /// Runs [`verify_plan`] on this plan for values of `shapes`.
    pub fn verify(&self, graph: &Graph, shapes: &[Vec<usize>]) -> Result<(), PlanViolation> {
        let slot_bytes = self.slot_bytes(graph, shapes, DType::size_bytes);
        verify_plan(graph, &self.homes, &slot_bytes, &self.donated, shapes)
    }
}

/// Each value's bytes at `shapes`.
fn value_bytes(graph: &Graph, shapes: &[Vec<usize>]) -> Vec<usize> {
    graph
        .nodes
        .iter()
        .zip(shapes)
        .map(|(node, shape)| shape.iter().product::<usize>() * node.aval.dtype.size_bytes())
        .collect()
}
