//! Tracing a custom op's forward into a graph of its own.

use super::{extract, next_trace_id, Leaves};
use crate::error::{Error, Result};
use crate::handle::array::Array;
use crate::ir::graph::Graph;
use crate::ops::custom::CustomCall;
use crate::shape::Aval;
use std::collections::HashSet;

impl CustomCall {
    /// The forward's graph over operands of `avals` (the trace's inputs):
    /// what its shape rule reads, what its executable is built from, and
    /// what implicit lowering splices in.
    pub(crate) fn forward_graph(&self, avals: &[&Aval]) -> Result<Graph> {
        let id = next_trace_id();
        let params = avals
            .iter()
            .enumerate()
            .map(|(i, &a)| Array::param(id, i, a.clone()))
            .collect();
        let out = (self.def.forward)(&self.args, params)?;
        let (graph, _) = extract(
            &[out],
            Leaves::Trace {
                id,
                num_inputs: avals.len(),
            },
            &HashSet::new(),
        )
        .map_err(|e| match e {
            Error::ReadTracer { aval } => self.error(format!(
                "its forward reads a traced value ({aval}) or uses an array traced outside it; \
                 pass every array it needs as an argument"
            )),
            other => other,
        })?;
        Ok(graph)
    }
}
