//! Eager evaluation: pending arrays run through the same pipeline as a
//! compiled function (passes + the default device), cached by graph
//! structure.

use crate::buffer::{host_data, DeviceBuffer};
use crate::data::{HostData, HostElement};
use crate::error::{Error, Result};
use crate::exec::device::{default_device, read_back, Device};
use crate::exec::Executable;
use crate::handle::array::Array;
use crate::hash::FastMap;
use crate::ir::graph::Graph;
use crate::ir::passes::Passes;
use crate::trace::{extract, Leaves};
use crate::transform::implicit::optimize;
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
    /// By graph and by the passes the device asked for (a CPU executor's
    /// products read transposed operands, a GPU's do not).
    executables: FastMap<(Graph, Passes), Arc<Executable>>,
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

/// Computes every pending array of `arrays` in one executable run on this
/// thread's default device ([`crate::default_device`]). Results a device
/// keeps (GPU buffers) stay there until read.
pub fn eval(arrays: &[Array]) -> Result<()> {
    let pending: Vec<Array> = arrays
        .iter()
        .filter(|a| !a.is_computed())
        .cloned()
        .collect();
    if pending.is_empty() {
        return Ok(());
    }
    let (graph, leaves) = extract(&pending, Leaves::Eager, &HashSet::new())?;
    let device = default_device();
    // The passes `compile` runs for this device, so that eager and compiled
    // results have the same bits.
    let passes = Passes {
        transposed_operands: device.reads_transposed_operands(),
        ..Passes::default()
    };
    let key = (graph, passes);
    let cached = {
        let mut cache = cache().lock().unwrap_or_else(|p| p.into_inner());
        let found = cache.executables.get(&key).cloned();
        match found {
            Some(_) => cache.hits += 1,
            None => cache.misses += 1,
        }
        found
    };
    let exe = match cached {
        Some(exe) => exe,
        None => {
            let (optimized, _) = optimize(&key.0, passes)?;
            let exe = Arc::new(Executable::new(optimized, Vec::new(), &[], &[])?);
            let mut cache = cache().lock().unwrap_or_else(|p| p.into_inner());
            if cache.executables.len() >= EVAL_CACHE_CAPACITY {
                cache.executables.clear();
            }
            cache.executables.insert(key, exe.clone());
            exe
        }
    };
    let inputs = leaves
        .iter()
        .map(|leaf| device_buffer(device.as_ref(), leaf))
        .collect::<Result<Vec<_>>>()?;
    // Eager graphs are built from computed arrays, so every shape is known
    // and the executable resolves them without the arguments' shapes.
    let shapes = exe.resolve_shapes(&[])?;
    let outputs = device.run(&exe, inputs, &shapes)?;
    let kept = read_back(device.clone());
    for (array, buffer) in pending.iter().zip(outputs) {
        match host_data(&buffer) {
            Some(data) => array.set_value(data),
            None => array.set_resident(kept.clone(), buffer),
        }
    }
    Ok(())
}

/// `leaf`'s value as a buffer of `device`: the one it keeps, or host data
/// uploaded (read back first from another device that keeps it).
fn device_buffer(device: &dyn Device, leaf: &Array) -> Result<DeviceBuffer> {
    if let Some(buffer) = leaf.buffer_on(device.name()) {
        return Ok(buffer);
    }
    let data = leaf.host_value()?.ok_or_else(|| Error::ReadTracer {
        aval: leaf.aval().to_string(),
    })?;
    device.upload(&data)
}

/// Computes every pending array of `arrays` like [`eval`], then reads
/// every value a device keeps back to the host without blocking: the way to
/// read results in a browser, where a GPU readback completes only after the
/// page yields. Afterwards every array of `arrays` is materialized.
pub async fn eval_async(arrays: &[Array]) -> Result<()> {
    eval(arrays)?;
    for array in arrays {
        array.read_back().await?;
    }
    Ok(())
}

/// The readers that compute: they run the eager pipeline above, so they sit
/// here rather than beside the handle (which imports no executor).
impl Array {
    /// Computes the value if it is pending (through the cached eager
    /// pipeline: passes + the default device, see [`crate::device`]).
    pub fn eval(&self) -> Result<()> {
        crate::compile::eval::eval(std::slice::from_ref(self))
    }

    /// The computed host data, read back from the device if it is kept
    /// there (blocking: in a browser, [`crate::eval_async`] first).
    pub fn data(&self) -> Result<Arc<HostData>> {
        self.eval()?;
        self.host_value()?.ok_or_else(|| Error::ReadTracer {
            aval: self.aval().to_string(),
        })
    }

    /// The elements as `T`, which must be the array's dtype.
    pub fn to_vec<T: HostElement>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() && self.error().is_none() {
            return Err(Error::ReadBack {
                aval: self.aval().to_string(),
                requested: format!("Vec<{}>; cast it first", T::DTYPE),
            });
        }
        let data = self.data()?;
        Ok(T::slice(&data).map(<[T]>::to_vec).unwrap_or_default())
    }

    /// The single element of a size-1 array.
    pub fn item<T: HostElement>(&self) -> Result<T> {
        let values = self.to_vec::<T>()?;
        match values.as_slice() {
            [v] => Ok(*v),
            _ => Err(Error::ReadBack {
                aval: self.aval().to_string(),
                requested: format!("a single {}", T::DTYPE),
            }),
        }
    }
}
