//! The graph IR: values in schedule order. `trace` extracts graphs from
//! lazy arrays and `passes` rewrites them; the IR itself knows neither.

use crate::data::HostData;
use crate::location::SourceLocation;
use crate::ops::{Condition, Guard, Op};
use crate::shape::Aval;
use crate::symbolic::DimFacts;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// Index of a value in a [`Graph`].
pub type ValueId = usize;

/// Constant data embedded in a graph. Equal when it is the same buffer or,
/// for small constants, the same bits; this is what lets CSE merge the `2.0`
/// literals a program writes in many places.
#[derive(Clone, Debug)]
pub struct Literal(pub Arc<HostData>);

/// Constants up to this many elements are compared by value.
const LITERAL_VALUE_LIMIT: usize = 64;

impl Literal {
    /// True when the constant is small enough to compare by value.
    fn by_value(&self) -> bool {
        self.0.len() <= LITERAL_VALUE_LIMIT
    }
}

impl PartialEq for Literal {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
            || (self.by_value()
                && self.0.dtype() == other.0.dtype()
                && self.0.len() == other.0.len()
                && (0..self.0.len())
                    .all(|i| self.0.get_f64(i).to_bits() == other.0.get_f64(i).to_bits()))
    }
}

impl Eq for Literal {}

impl Hash for Literal {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.dtype().hash(state);
        self.0.len().hash(state);
        if self.by_value() {
            for i in 0..self.0.len() {
                self.0.get_f64(i).to_bits().hash(state);
            }
        }
    }
}

/// What a value of the graph is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ValueKind {
    /// Argument `i` of the call (leaf `i` of the flattened arguments).
    Input(usize),
    /// Constant data.
    Constant(Literal),
    /// The result of an op on the `inputs` of the [`GraphNode`].
    Op(Op),
}

/// The operands of a graph value; up to three are stored inline, since
/// graphs are rebuilt by every pass and nearly every op has at most three.
pub type Operands = SmallVec<[ValueId; 3]>;

/// One value of the graph.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GraphNode {
    /// How the value is produced.
    pub kind: ValueKind,
    /// Operands (values earlier in the schedule).
    pub inputs: Operands,
    /// Shape and dtype (symbolic in a shapeless compile).
    pub aval: Aval,
}

/// A dataflow graph whose node order is a valid schedule.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Graph {
    /// Values in schedule order.
    pub nodes: Vec<GraphNode>,
    /// The values returned, in order.
    pub outputs: Vec<ValueId>,
    /// Number of call arguments.
    pub num_inputs: usize,
    /// Conditions on symbolic dims the shape rules assumed.
    pub guards: Vec<Guard>,
    /// Per value, whether it belongs to a gradient's backward pass; empty
    /// when the graph computes no gradient.
    pub backward: Vec<bool>,
    /// How implicit lowering resolved the ops reading implicit values
    /// (empty before it runs, and for graphs without them).
    pub implicit: Vec<ImplicitDecision>,
    /// Per value, where it came from. Graph equality and hashing ignore it.
    pub provenance: Provenance,
}

/// Where one value of a graph came from: the values of the traced graph
/// (before the passes) it computes, and the program location that made it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origin {
    /// The traced values this value computes: itself in a traced graph;
    /// after the passes, every value CSE merged into it or an identity op
    /// forwarded to it, and for a fused op all of its members'.
    pub traced: SmallVec<[ValueId; 1]>,
    /// For a fused op, per step (in step order), the traced values that
    /// step computes; empty for any other value.
    pub steps: Vec<SmallVec<[ValueId; 1]>>,
    /// Where the user's program made it (for a merged value, the first
    /// made; for a fused op, its root's), when the front end said.
    pub location: Option<SourceLocation>,
    /// The `nn` composition that made it (for a merged value, the first
    /// made's), if one did.
    pub composition: Option<&'static str>,
}

impl Origin {
    /// The origin of traced value `id`, made at `location`.
    pub fn traced(id: ValueId, location: Option<SourceLocation>) -> Origin {
        Origin {
            traced: SmallVec::from_elem(id, 1),
            steps: Vec::new(),
            location,
            composition: None,
        }
    }

    /// This origin, made by composition `composition`.
    pub fn within(mut self, composition: Option<&'static str>) -> Origin {
        self.composition = composition;
        self
    }

    /// Adds the traced values of `other` (a value merged into this one).
    pub fn absorb(&mut self, other: &Origin) {
        self.traced.extend(other.traced.iter().copied());
        self.location = self.location.or(other.location);
        self.composition = self.composition.or(other.composition);
    }
}

/// The [`Origin`] of every value of a graph, in schedule order (shorter
/// than the graph when values were added without one).
///
/// It records history, not meaning: two graphs computing the same thing
/// are equal however they were written, which is what lets the eager cache
/// find a graph built from another line of a program. So every
/// `Provenance` compares equal and hashes to nothing.
#[derive(Clone, Debug, Default)]
pub struct Provenance(pub Vec<Origin>);

impl PartialEq for Provenance {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Provenance {}

impl Hash for Provenance {
    fn hash<H: Hasher>(&self, _: &mut H) {}
}

impl Graph {
    /// What the guards' equalities imply about its symbolic dims: the
    /// passes and the planner compare shapes through it, as the trace did.
    pub fn dim_facts(&self) -> DimFacts {
        DimFacts::from_equalities(self.guards.iter().filter_map(|g| match &g.condition {
            Condition::Equal(a, b) => Some((g.op.as_str(), a, b)),
            Condition::AtLeast(..) => None,
        }))
    }

    /// The step at which value `v` is written: its own, except for a
    /// control-flow result ([`Op::Get`]), which its control node writes
    /// when it runs.
    pub fn written_at(&self, v: ValueId) -> usize {
        match &self.nodes[v].kind {
            ValueKind::Op(Op::Get { .. }) => self.nodes[v].inputs[0],
            _ => v,
        }
    }

    /// True when value `v` belongs to a gradient's backward pass.
    pub fn is_backward(&self, v: ValueId) -> bool {
        self.backward.get(v).copied().unwrap_or(false)
    }

    /// Where value `v` came from, when recorded.
    pub fn origin(&self, v: ValueId) -> Option<&Origin> {
        self.provenance.0.get(v)
    }

    /// Appends `node`, of the backward pass when `backward` (the flags stay
    /// empty until a backward value arrives), coming from `origin`.
    pub(crate) fn push_node(&mut self, node: GraphNode, backward: bool, origin: Origin) {
        if backward && self.backward.is_empty() {
            self.backward = vec![false; self.nodes.len()];
        }
        if !self.backward.is_empty() {
            self.backward.push(backward);
        }
        // Values pushed without an origin (hand-built graphs) leave gaps.
        self.provenance
            .0
            .resize_with(self.nodes.len(), Origin::default);
        self.provenance.0.push(origin);
        self.nodes.push(node);
    }
}

/// How the lowering resolved one op or value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum ImplicitDecision {
    /// A handler rewrote the op.
    Handled {
        /// The op's value in the traced graph.
        node: ValueId,
        /// The op, as reports show it.
        op: String,
        /// The operand kinds it matched, like `dense, nf4`.
        operands: String,
        /// The handler.
        handler: String,
    },
    /// An implicit value was materialized.
    Materialized {
        /// The implicit value in the traced graph.
        node: ValueId,
        /// Its kind.
        kind: String,
        /// The op that forced it (`output` when returned as is).
        forced_by: String,
        /// That op's value in the traced graph, if it is one.
        consumer: Option<ValueId>,
    },
}

impl fmt::Display for ImplicitDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImplicitDecision::Handled {
                node,
                op,
                operands,
                handler,
            } => write!(f, "%{node} {op} over ({operands}): handler `{handler}`"),
            ImplicitDecision::Materialized {
                node,
                kind,
                forced_by,
                ..
            } => write!(f, "%{node} {kind} materialized, forced by `{forced_by}`"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::FastHasher;
    use crate::location::SourceLocation;
    use crate::shape::Shape;
    use crate::DType;

    fn input_graph(location: Option<SourceLocation>) -> Graph {
        let mut graph = Graph {
            num_inputs: 1,
            ..Graph::default()
        };
        let node = GraphNode {
            kind: ValueKind::Input(0),
            inputs: Operands::new(),
            aval: Aval::new(Shape::from(vec![2]), DType::F32),
        };
        graph.push_node(node, false, Origin::traced(0, location));
        graph.outputs = vec![0];
        graph
    }

    #[test]
    fn graphs_made_at_different_lines_are_equal_and_hash_alike() {
        let here = input_graph(Some(SourceLocation { line: 1, column: 1 }));
        let there = input_graph(Some(SourceLocation { line: 9, column: 4 }));
        assert_ne!(here.origin(0), there.origin(0));
        assert_eq!(here, there);
        let hash = |g: &Graph| {
            let mut state = FastHasher::default();
            g.hash(&mut state);
            state.finish()
        };
        assert_eq!(hash(&here), hash(&there));
    }

    #[test]
    fn an_absorbed_origin_adds_its_traced_values_and_fills_a_missing_location() {
        let line = Some(SourceLocation { line: 3, column: 2 });
        let mut kept = Origin::traced(1, None);
        kept.absorb(&Origin::traced(4, line));
        assert_eq!(kept.traced.to_vec(), vec![1, 4]);
        assert_eq!(kept.location, line);
    }
}
