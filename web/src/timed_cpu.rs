//! The CPU executor as the playground runs it: every run timed per op step
//! ([`CpuBackend::run_timed`], read from the page's clock), so the Kernels
//! view can give each step's time. It is the CPU executor in all else: the
//! same name (`cpu`, so caches and the header see the CPU), buffers and
//! results.

use crate::report::DeviceTime;
use kiln::{Backend, CpuBackend, Executable, HostData, KernelList, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use web_time::Instant;

/// Runs kept untaken at most (the oldest go first).
const MAX_KEPT_RUNS: usize = 256;

/// The CPU executor, timing every run's steps. Clones share the times.
#[derive(Clone)]
pub struct TimedCpu {
    origin: Instant,
    runs: Arc<AtomicU64>,
    times: Arc<Mutex<Vec<DeviceTime>>>,
}

impl Default for TimedCpu {
    fn default() -> TimedCpu {
        TimedCpu {
            origin: Instant::now(),
            runs: Arc::default(),
            times: Arc::default(),
        }
    }
}

impl TimedCpu {
    /// Runs made so far: a compiled call made those it added.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }

    /// The times of the runs not taken yet, in run order (each step's
    /// milliseconds as [`Backend::kernels`] lists the steps).
    pub fn take_times(&self) -> Vec<DeviceTime> {
        std::mem::take(&mut *self.times.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Backend for TimedCpu {
    type Buffer = Arc<HostData>;

    fn name(&self) -> &str {
        CpuBackend.name()
    }

    fn upload(&self, data: &Arc<HostData>) -> Result<Arc<HostData>> {
        CpuBackend.upload(data)
    }

    fn reads_transposed_operands(&self) -> bool {
        CpuBackend.reads_transposed_operands()
    }

    fn download(&self, buffer: Arc<HostData>) -> Result<Arc<HostData>> {
        CpuBackend.download(buffer)
    }

    fn kernels(&self, exe: &Executable, shapes: &[Vec<usize>]) -> Result<KernelList> {
        CpuBackend.kernels(exe, shapes)
    }

    fn run(
        &self,
        exe: &Executable,
        inputs: Vec<Arc<HostData>>,
        shapes: &[Vec<usize>],
    ) -> Result<Vec<Arc<HostData>>> {
        let origin = self.origin;
        let clock = move || origin.elapsed().as_secs_f64() * 1e3;
        let (outputs, steps) = CpuBackend.run_timed(exe, inputs, shapes, &clock)?;
        let call = self.runs.fetch_add(1, Ordering::Relaxed);
        let mut times = self.times.lock().unwrap_or_else(PoisonError::into_inner);
        if times.len() >= MAX_KEPT_RUNS {
            times.remove(0);
        }
        times.push(DeviceTime {
            call,
            executable: exe.id(),
            total_ms: steps.iter().sum(),
            steps_ms: steps.into_iter().map(Some).collect(),
        });
        Ok(outputs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::Session;
    use std::rc::Rc;

    #[test]
    fn a_cpu_run_gives_every_kernel_step_a_time() {
        let cpu = TimedCpu::default();
        let mut report = kiln::with_default_device(Arc::new(cpu.clone()), || {
            let mut session = Session::new();
            let counter = cpu.clone();
            session.count_device_calls(Some(Rc::new(move || counter.runs())));
            session.run("let f = compile(|x| x.exp().sum()); f.run(ones([4])); f.run(ones([4]))")
        });
        assert_eq!(report.error, None);
        report.attach_device_times(&cpu.take_times());
        let function = &report.functions[0];
        let kernels = &function.kernels[0];
        let steps = kernels.list.as_ref().map_or(0, |l| l.steps.len());
        assert!(steps >= 1);
        assert_eq!(kernels.steps_ms.len(), steps);
        assert!(kernels
            .steps_ms
            .iter()
            .all(|t| t.is_some_and(|ms| ms >= 0.0)));
        assert!(function.calls.iter().all(|c| c.device_ms.is_some()));
        assert!(cpu.take_times().is_empty(), "times are taken once");
    }
}
