//! Eager evaluation: pending arrays run through the same pipeline as a
//! compiled function (passes + CPU executor), cached by graph structure.

use crate::array::Array;
use crate::error::Result;
use crate::exec::{Backend, CpuBackend, Executable};
use crate::graph::Graph;
use crate::hash::FastMap;
use crate::passes::{optimize, Passes};
use crate::trace::{extract, Leaves};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};

/// Counters of the eager-evaluation cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvalCacheStats {
    /// Distinct graph structures compiled.
    pub entries: usize,
    /// Evaluations that reused a cached executable.
    pub hits: u64,
    /// Evaluations that compiled a new one.
    pub misses: u64,
}

#[derive(Default)]
struct EvalCache {
    executables: FastMap<Graph, Arc<Executable>>,
    hits: u64,
    misses: u64,
}

/// Beyond this many structures the cache starts over, so a program that
/// builds ever-new graphs cannot grow it without bound.
const EVAL_CACHE_CAPACITY: usize = 4096;

fn cache() -> &'static Mutex<EvalCache> {
    static CACHE: OnceLock<Mutex<EvalCache>> = OnceLock::new();
    CACHE.get_or_init(Mutex::default)
}

/// The eager cache's counters (process-wide).
pub fn eval_cache_stats() -> EvalCacheStats {
    let cache = cache().lock().unwrap_or_else(|p| p.into_inner());
    EvalCacheStats {
        entries: cache.executables.len(),
        hits: cache.hits,
        misses: cache.misses,
    }
}

/// Computes every pending array of `arrays` in one executable run.
pub fn eval(arrays: &[Array]) -> Result<()> {
    let pending: Vec<Array> = arrays
        .iter()
        .filter(|a| !a.is_materialized())
        .cloned()
        .collect();
    if pending.is_empty() {
        return Ok(());
    }
    let (graph, leaves) = extract(&pending, Leaves::Eager, &HashSet::new())?;
    let cached = {
        let mut cache = cache().lock().unwrap_or_else(|p| p.into_inner());
        let found = cache.executables.get(&graph).cloned();
        match found {
            Some(_) => cache.hits += 1,
            None => cache.misses += 1,
        }
        found
    };
    let exe = match cached {
        Some(exe) => exe,
        None => {
            let (optimized, _) = optimize(&graph, Passes::default())?;
            let exe = Arc::new(Executable::new(optimized, Vec::new(), &[], &[])?);
            let mut cache = cache().lock().unwrap_or_else(|p| p.into_inner());
            if cache.executables.len() >= EVAL_CACHE_CAPACITY {
                cache.executables.clear();
            }
            cache.executables.insert(graph, exe.clone());
            exe
        }
    };
    let inputs: Vec<_> = leaves.iter().filter_map(|a| a.value().cloned()).collect();
    // Eager graphs are built from computed arrays, so every shape is known
    // and the executable resolves them without the arguments' shapes.
    let shapes = exe.resolve_shapes(&[])?;
    let outputs = CpuBackend.run(&exe, inputs, &shapes)?;
    for (array, value) in pending.iter().zip(outputs) {
        array.set_value(value);
    }
    Ok(())
}
