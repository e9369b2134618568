//! Custom ops' runtime: their forward traced, optimized and built into a
//! small executable per set of operand shapes, run by the CPU executor for
//! the reference evaluation. It implements the op family's
//! `CustomRuntime`, so the family (below the executors) never builds an
//! executable itself.

use crate::data::HostData;
use crate::error::Result;
use crate::exec::{Backend, CpuBackend, Executable};
use crate::ir::graph::Graph;
use crate::ir::passes::{PassRecord, Passes};
use crate::ops::custom::{CustomCall, CustomRuntime};
use crate::ops::Guard;
use crate::shape::{Aval, Shape};
use crate::tree::def::TreeDef;
use crate::DType;
use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Executables of one op's forward, by the arguments' structure (statics
/// included: they change what the forward computes) and the dtypes and
/// shapes of the operands they were built for.
type BodyCache = HashMap<(TreeDef, Vec<(DType, Vec<usize>)>), Arc<Executable>>;

/// Distinct operand shapes whose executables an op keeps; past this the
/// cache starts over (a shapeless program calling an op at ever new sizes
/// must not grow without bound).
const BODY_CACHE_LIMIT: usize = 64;

/// The whole graph pipeline a body goes through: implicit lowering, then
/// the passes (`transform::implicit::optimize`). Handed in by the
/// constructors, because implicit kinds are custom ops too.
pub(crate) type Optimize = fn(&Graph, Passes) -> Result<(Graph, Vec<PassRecord>)>;

/// The runtime of one custom op: its executables, one per distinct set of
/// operand dtypes and shapes.
pub(crate) struct Bodies {
    optimize: Optimize,
    cache: Mutex<BodyCache>,
}

impl Bodies {
    /// A runtime with no executables yet, building them through `optimize`.
    pub(crate) fn runtime(optimize: Optimize) -> Arc<dyn CustomRuntime> {
        Arc::new(Bodies {
            optimize,
            cache: Mutex::default(),
        })
    }
}

impl CustomRuntime for Bodies {
    fn trace_aval(&self, call: &CustomCall, inputs: &[&Aval]) -> Result<(Aval, Vec<Guard>)> {
        let graph = call.forward_graph(inputs)?;
        let out = graph.outputs[0];
        Ok((graph.nodes[out].aval.clone(), graph.guards))
    }

    fn eval(
        &self,
        call: &CustomCall,
        inputs: &[&HostData],
        in_shapes: &[&[usize]],
    ) -> Result<HostData> {
        let operands: Vec<(DType, &[usize])> = inputs
            .iter()
            .zip(in_shapes)
            .map(|(data, &shape)| (data.dtype(), shape))
            .collect();
        let exe = call.body(&operands)?;
        let shapes = exe.resolve_shapes(in_shapes)?.into_owned();
        let buffers = inputs.iter().map(|&d| Arc::new(d.clone())).collect();
        let mut outputs = CpuBackend.run(&exe, buffers, &shapes)?;
        let out = outputs
            .pop()
            .ok_or_else(|| call.error("its forward returned no value"))?;
        Ok(Arc::try_unwrap(out).unwrap_or_else(|shared| (*shared).clone()))
    }
}

impl CustomCall {
    /// The executable computing the forward for operands of these dtypes
    /// and concrete shapes, built once per distinct set.
    pub fn body(&self, operands: &[(DType, &[usize])]) -> Result<Arc<Executable>> {
        let key = (
            self.args.clone(),
            operands.iter().map(|(d, s)| (*d, s.to_vec())).collect(),
        );
        let bodies = (&*self.def.runtime as &dyn Any)
            .downcast_ref::<Bodies>()
            .ok_or_else(|| self.error("its runtime keeps no executables"))?;
        let cached = bodies
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            .cloned();
        if let Some(exe) = cached {
            return Ok(exe);
        }
        let avals: Vec<Aval> = operands
            .iter()
            .map(|(d, s)| Aval::new(Shape::known(s), *d))
            .collect();
        let graph = self.forward_graph(&avals.iter().collect::<Vec<_>>())?;
        let (graph, _) = (bodies.optimize)(&graph, Passes::default())?;
        let shapes: Vec<&[usize]> = operands.iter().map(|(_, s)| *s).collect();
        let exe = Arc::new(Executable::new(
            graph,
            Vec::new(),
            &vec![false; operands.len()],
            &shapes,
        )?);
        let mut cache = bodies.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= BODY_CACHE_LIMIT {
            cache.clear();
        }
        cache.insert(key, exe.clone());
        Ok(exe)
    }
}
