//! The graph IR: values in schedule order. `trace` extracts graphs from
//! lazy arrays and `passes` rewrites them; the IR itself knows neither.

use crate::data::HostData;
use crate::implicit::ImplicitDecision;
use crate::ops::{Guard, Op};
use crate::shape::Aval;
use smallvec::SmallVec;
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
}

impl Graph {
    /// True when value `v` belongs to a gradient's backward pass.
    pub fn is_backward(&self, v: ValueId) -> bool {
        self.backward.get(v).copied().unwrap_or(false)
    }

    /// Appends `node`, of the backward pass when `backward` (the flags stay
    /// empty until a backward value arrives).
    pub(crate) fn push_node(&mut self, node: GraphNode, backward: bool) {
        if backward && self.backward.is_empty() {
            self.backward = vec![false; self.nodes.len()];
        }
        if !self.backward.is_empty() {
            self.backward.push(backward);
        }
        self.nodes.push(node);
    }
}
