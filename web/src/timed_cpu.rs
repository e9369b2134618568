//! The CPU executor as the playground runs it: every run timed per op step
//! ([`CpuBackend::run_timed`], read from the page's clock), so the Kernels
//! view can give each step's time. It is the CPU executor in all else: the
//! same name (`cpu`, so caches and the header see the CPU), buffers and
//! results.
//!
//! A browser's clock ticks coarsely (`performance.now()` in a page that is
//! not cross-origin isolated: 100 µs in Chromium), so one run of a small
//! program reads 0 for most steps. A call shorter than
//! [`TIMING_TICKS`] ticks is therefore run again, on the same inputs,
//! until the executable's runs in this run of the script add up to that
//! many ticks; every figure is the mean over the runs, and the view says
//! which figures are still below the tick over the runs. An executable's
//! first run, when short, is not counted but always repeated: it pays for
//! compiling the code the browser compiles lazily, on first call.

use crate::report::DeviceTime;
use kiln::{Backend, CpuBackend, Executable, HostData, KernelList, Result};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use web_time::Instant;

/// Runs kept untaken at most (the oldest go first).
const MAX_KEPT_RUNS: usize = 256;

/// Clock ticks an executable's timed runs add up to, per script run,
/// before its calls stop being repeated: its steps' mean times resolve a
/// twentieth of a tick (5 µs of Chromium's 100 µs) or better, for at most
/// 2 ms of repeated work per executable and script run there.
pub const TIMING_TICKS: f64 = 20.0;

/// A first run at least this long (milliseconds) counts: compiling the
/// code it needs is then a small part of it, and running it again would
/// cost the user as much again.
const COUNTED_FIRST_RUN_MS: f64 = 100.0;

/// The most runs one call is repeated to time it: a program of a few
/// nanoseconds stops here rather than spin for its ticks.
const MAX_TIMING_RUNS: u32 = 10_000;

/// Readings of the clock that measure its tick: each waits for the next
/// tick, so this bounds the cost to a few ticks.
const TICK_SAMPLES: usize = 4;

/// Readings one tick sample waits at most (a clock that never moves
/// reads as ticking in nanoseconds rather than hanging the worker).
const MAX_SPIN_READINGS: usize = 10_000_000;

/// The CPU executor, timing every run's steps. Clones share the times.
#[derive(Clone)]
pub struct TimedCpu {
    origin: Instant,
    /// The clock's tick in milliseconds, measured once.
    tick_ms: f64,
    runs: Arc<AtomicU64>,
    times: Arc<Mutex<Vec<DeviceTime>>>,
    /// The executables run so far (a short first run is not counted).
    seen: Arc<Mutex<HashSet<u64>>>,
}

impl Default for TimedCpu {
    fn default() -> TimedCpu {
        let origin = Instant::now();
        TimedCpu::with_tick(clock_tick(|| origin.elapsed().as_secs_f64() * 1e3))
    }
}

/// The smallest step between two differing readings of `clock`, over
/// [`TICK_SAMPLES`] samples.
fn clock_tick(clock: impl Fn() -> f64) -> f64 {
    let mut tick = f64::INFINITY;
    for _ in 0..TICK_SAMPLES {
        let start = clock();
        for _ in 0..MAX_SPIN_READINGS {
            let now = clock();
            if now != start {
                tick = tick.min(now - start);
                break;
            }
        }
    }
    if tick.is_finite() {
        tick
    } else {
        1e-6
    }
}

impl TimedCpu {
    /// The executor timing by a clock that ticks every `tick_ms`: how
    /// much a call is repeated depends on it (see [`TIMING_TICKS`]).
    pub fn with_tick(tick_ms: f64) -> TimedCpu {
        TimedCpu {
            origin: Instant::now(),
            tick_ms,
            runs: Arc::default(),
            times: Arc::default(),
            seen: Arc::default(),
        }
    }

    /// Milliseconds the runs of `executable` timed since the times were
    /// last taken add up to.
    fn timed_ms(&self, executable: u64) -> f64 {
        let times = self.times.lock().unwrap_or_else(PoisonError::into_inner);
        times
            .iter()
            .filter(|t| t.executable == executable)
            .map(|t| t.total_ms * f64::from(t.runs))
            .sum()
    }

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
        let wanted_ms = TIMING_TICKS * self.tick_ms;
        let timed_before = self.timed_ms(exe.id());
        let first = self
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(exe.id());
        // Kept for repeats only while the executable is short of its
        // ticks: a donated argument is then copied rather than taken.
        let again = (first || timed_before < wanted_ms).then(|| inputs.clone());
        let (outputs, steps) = CpuBackend.run_timed(exe, inputs, shapes, &clock)?;
        // A short first run's time is mostly the browser compiling code:
        // only its repeats count.
        let warm_up = first && steps.iter().sum::<f64>() < COUNTED_FIRST_RUN_MS;
        let (mut sums, mut runs) = if warm_up {
            (vec![0.0; steps.len()], 0)
        } else {
            (steps, 1)
        };
        let repeat_start = clock();
        let mut repeated = false;
        if let Some(inputs) = again {
            while runs == 0
                || (timed_before + sums.iter().sum::<f64>() < wanted_ms && runs < MAX_TIMING_RUNS)
            {
                let (_, steps) = CpuBackend.run_timed(exe, inputs.clone(), shapes, &clock)?;
                for (sum, step) in sums.iter_mut().zip(steps) {
                    *sum += step;
                }
                runs += 1;
                repeated = true;
            }
        }
        let repeat_ms = if repeated {
            clock() - repeat_start
        } else {
            0.0
        };
        let mean = |ms: f64| ms / f64::from(runs);
        let call = self.runs.fetch_add(1, Ordering::Relaxed);
        let mut times = self.times.lock().unwrap_or_else(PoisonError::into_inner);
        if times.len() >= MAX_KEPT_RUNS {
            times.remove(0);
        }
        times.push(DeviceTime {
            call,
            executable: exe.id(),
            total_ms: mean(sums.iter().sum()),
            steps_ms: sums.into_iter().map(|ms| Some(mean(ms))).collect(),
            runs,
            tick_ms: self.tick_ms,
            repeat_ms,
        });
        Ok(outputs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::Session;
    use std::rc::Rc;

    /// Two calls of one compiled function, run on `cpu` with its calls
    /// counted.
    fn two_calls_on(cpu: &TimedCpu) -> crate::report::RunReport {
        kiln::with_default_device(Arc::new(cpu.clone()), || {
            let mut session = Session::new();
            let counter = cpu.clone();
            session.count_device_calls(Some(Rc::new(move || counter.runs())));
            session.run("let f = compile(|x| x.exp().sum()); f.run(ones([4])); f.run(ones([4]))")
        })
    }

    #[test]
    fn a_cpu_run_gives_every_kernel_step_a_time() {
        let cpu = TimedCpu::default();
        let mut report = two_calls_on(&cpu);
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

    #[test]
    fn a_call_shorter_than_the_ticks_is_repeated_and_its_figures_are_means() {
        // A clock of 50 µs ticks, as a browser's: a call of four elements
        // takes far less, so it is run again until its runs add up to
        // TIMING_TICKS ticks (or the most runs).
        let tick_ms = 0.05;
        let cpu = TimedCpu::with_tick(tick_ms);
        let mut report = two_calls_on(&cpu);
        assert_eq!(report.error, None);
        let times = cpu.take_times();
        let [first, second] = times.as_slice() else {
            panic!("one time per call: {times:?}");
        };
        assert!(first.runs > 1, "a short call is repeated: {first:?}");
        let timed = first.total_ms * f64::from(first.runs);
        assert!(timed >= TIMING_TICKS * tick_ms || first.runs == MAX_TIMING_RUNS);
        assert!(first.repeat_ms > 0.0);
        assert_eq!(second.runs, 1, "the first call's runs already add up");
        report.attach_device_times(&times);
        let kernels = &report.functions[0].kernels[0];
        assert_eq!(kernels.timed_runs, first.runs + 1);
        assert_eq!(kernels.resolution_ms, tick_ms / f64::from(first.runs + 1));
    }

    #[test]
    fn repeats_read_a_tick_longer_than_their_call_leave_no_time_not_a_negative_one() {
        // On a coarse clock the call around the repeats can read one tick
        // while the repeats read two.
        let cpu = TimedCpu::with_tick(0.1);
        let mut report = two_calls_on(&cpu);
        let mut times = cpu.take_times();
        for (time, call) in times.iter_mut().zip(&report.functions[0].calls) {
            time.repeat_ms = call.ms + 0.1;
        }
        report.total_ms = 0.1;
        report.attach_device_times(&times);
        assert!(report.functions[0].calls.iter().all(|c| c.ms == 0.0));
        assert_eq!(report.total_ms, 0.0);
    }
}
