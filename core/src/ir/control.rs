//! The subgraphs of control-flow ops ([`crate::ops::control`]): the IR
//! holds them for the op family, which sees them only through
//! [`Subgraphs`].

use crate::hash::FastHasher;
use crate::ir::graph::Graph;
use crate::ops::control::{ControlCall, ControlKind, Subgraphs};
use crate::ops::Guard;
use crate::shape::Aval;
use std::any::Any;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// The graphs of one control-flow op, in the order its kind gives
/// (scan: the body; while: the condition, then the body; switch: the
/// branches).
#[derive(Debug, PartialEq, Eq, Hash)]
struct Bodies(Vec<Graph>);

impl Subgraphs for Bodies {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn equals(&self, other: &dyn Subgraphs) -> bool {
        other.as_any().downcast_ref::<Bodies>() == Some(self)
    }

    fn hash_into(&self, state: &mut dyn Hasher) {
        let mut own = FastHasher::default();
        self.0.hash(&mut own);
        state.write_u64(own.finish());
    }
}

impl ControlCall {
    /// A control-flow op of `kind` over `graphs`, whose operands must have
    /// the avals `operands` and whose results have the avals `results`;
    /// the graphs' guards become the op's.
    pub fn new(
        kind: ControlKind,
        num_consts: usize,
        num_carry: usize,
        operands: Vec<Aval>,
        results: Vec<Aval>,
        graphs: Vec<Graph>,
    ) -> ControlCall {
        let mut guards: Vec<Guard> = Vec::new();
        for guard in graphs.iter().flat_map(|g| &g.guards) {
            if !guards.contains(guard) {
                guards.push(guard.clone());
            }
        }
        ControlCall {
            kind,
            num_consts,
            num_carry,
            operands,
            results,
            guards,
            graphs: Arc::new(Bodies(graphs)),
        }
    }

    /// Its graphs, in the order its kind gives.
    pub fn graphs(&self) -> &[Graph] {
        match self.graphs.as_any().downcast_ref::<Bodies>() {
            Some(bodies) => &bodies.0,
            None => &[],
        }
    }

    /// The same op over other graphs (the passes rewrite bodies this way;
    /// their operands and results keep their avals).
    pub fn with_graphs(&self, graphs: Vec<Graph>) -> ControlCall {
        ControlCall {
            graphs: Arc::new(Bodies(graphs)),
            ..self.clone()
        }
    }
}
