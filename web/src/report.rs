//! What one run of a script produced, as the page receives it: outputs,
//! printed lines, per compiled function its cache with Kiln's own reports,
//! timings, and the error if the run failed.
//!
//! Everything here is serde data copied from Kiln ([`CacheInfo`] holds the
//! [`kiln::Report`] of every entry); the views render it and derive no
//! compiler facts of their own.

use kiln::{CacheInfo, KernelList, MissReason, PlanMemory, Report};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The result of one run of a script.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunReport {
    /// The script that ran: an exported report opens it in the editor.
    /// Reports exported before it was kept have none.
    #[serde(default)]
    pub script: String,
    /// Values the script showed with `show(label, value)`, then its final
    /// value (labelled `result`) when it has one.
    pub outputs: Vec<Output>,
    /// Lines the script printed with `print`.
    pub log: Vec<String>,
    /// Every compiled function the run called, in order of first call.
    pub functions: Vec<FunctionReport>,
    /// The backend calls ran on (`cpu`, or the wgpu adapter's name).
    pub backend: String,
    /// Wall-clock milliseconds of the whole run, parsing included.
    pub total_ms: f64,
    /// What the calls' times measure.
    #[serde(default)]
    pub clock: CallClock,
    /// Why the run stopped early, if it did.
    pub error: Option<ScriptError>,
    /// Whether the run was stopped at its time limit while the GPU still
    /// worked: the page then replaces the worker, which drops the device
    /// and the work it still holds.
    #[serde(default)]
    pub gpu_work_abandoned: bool,
}

impl RunReport {
    /// The report of `script`'s run stopped at its limit of `limit_ms`
    /// while it waited for the GPU: the script itself finished, its GPU
    /// work did not.
    pub fn past_gpu_limit(script: &str, limit_ms: f64) -> RunReport {
        RunReport {
            script: script.to_string(),
            outputs: Vec::new(),
            log: Vec::new(),
            functions: Vec::new(),
            backend: kiln::default_device().name().to_string(),
            total_ms: limit_ms,
            clock: CallClock::default(),
            error: Some(ScriptError {
                message: format!(
                    "the run took longer than its {} s limit, its GPU work included, and was \
                     stopped",
                    limit_ms / 1e3
                ),
                line: None,
                column: None,
            }),
            gpu_work_abandoned: true,
        }
    }

    /// Gives each call the device time of the device calls it made
    /// (summed) and takes the runs repeated to time them out of its wall
    /// time and the run's; gives each listed entry its per-step times, the
    /// mean over every measured run of it (`times` in call order, as the
    /// backend read them). The wall times and the repeats are read from a
    /// clock of coarse ticks at different moments, so the repeats can read
    /// a tick longer than the call around them: what is left is then no
    /// time at all, not a negative one.
    pub fn attach_device_times(&mut self, times: &[DeviceTime]) {
        self.total_ms = (self.total_ms - times.iter().map(|t| t.repeat_ms).sum::<f64>()).max(0.0);
        for function in &mut self.functions {
            for call in &mut function.calls {
                if let Some((first, end)) = call.device_calls {
                    let made: Vec<&DeviceTime> = times
                        .iter()
                        .filter(|t| (first..end).contains(&t.call))
                        .collect();
                    if !made.is_empty() {
                        call.device_ms = Some(made.iter().map(|t| t.total_ms).sum());
                        let repeats = made.iter().map(|t| t.repeat_ms).sum::<f64>();
                        call.ms = (call.ms - repeats).max(0.0);
                    }
                }
            }
            for kernels in &mut function.kernels {
                let Some(list) = &kernels.list else { continue };
                let measured: Vec<&DeviceTime> = times
                    .iter()
                    .filter(|t| {
                        t.executable == list.executable && t.steps_ms.len() == list.steps.len()
                    })
                    .collect();
                let runs: u32 = measured.iter().map(|t| t.runs).sum();
                if runs == 0 {
                    continue;
                }
                kernels.steps_ms = (0..list.steps.len())
                    .map(|step| {
                        let mut sum = None;
                        for t in &measured {
                            if let Some(ms) = t.steps_ms[step] {
                                *sum.get_or_insert(0.0) += ms * f64::from(t.runs);
                            }
                        }
                        sum.map(|sum: f64| sum / f64::from(runs))
                    })
                    .collect();
                kernels.timed_runs = runs;
                let tick = measured.iter().map(|t| t.tick_ms).fold(0.0, f64::max);
                kernels.resolution_ms = tick / f64::from(runs);
            }
        }
    }
}

/// One shown value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Output {
    /// The label it was shown under.
    pub label: String,
    /// The value printed: arrays as NumPy prints them, other values as
    /// Rhai prints them.
    pub text: String,
}

/// A compiled function of the script and what its cache holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FunctionReport {
    /// The function's source text: the argument of `compile(...)`.
    pub source: String,
    /// The script line of the `compile(...)` call in this run.
    pub line: usize,
    /// Whether dims are symbolic (`.shapeless()`).
    pub shapeless: bool,
    /// Whether elementwise fusion is on (`.fusion(b)`).
    pub fusion: bool,
    /// Donated argument paths (`.donate([...])`).
    pub donate: Vec<String>,
    /// The cache as Kiln reports it: entries with their [`kiln::Report`]s,
    /// hits, misses and why each miss happened. It spans every run whose
    /// function had this source text and these options.
    pub cache: CacheInfo,
    /// This run's calls, in order.
    pub calls: Vec<CallTiming>,
    /// What the backend runs for each cache entry, beside
    /// [`CacheInfo::reports`] (reports exported before they were listed
    /// have none).
    #[serde(default)]
    pub kernels: Vec<EntryKernels>,
    /// What differs between the cache keys of each ordered pair of its
    /// latest [`KEY_DIFF_ENTRIES`] entries ([`kiln::Compiled::key_difference`]),
    /// for the diff view.
    #[serde(default)]
    pub key_diffs: Vec<KeyDiff>,
    /// The same function as the run before this one left it, for the
    /// diff view's "previous run"; `None` in a first run.
    #[serde(default)]
    pub previous: Option<PreviousRun>,
}

/// A compiled function as the previous run left it: the entry it showed
/// (its latest), to diff against this run's entries. "The same function"
/// is the one of equal source text and options, else the one compiled in
/// the same order (the function whose text the edit changed).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PreviousRun {
    /// The script line of its `compile(...)` call in that run.
    pub line: usize,
    /// Whether its source text, options or captured values differ from
    /// this run's function's.
    pub source_changed: bool,
    /// The report of its latest entry in that run.
    pub report: Arc<Report>,
    /// What differs from that entry's cache key to each of this
    /// function's latest [`KEY_DIFF_ENTRIES`] entries' keys
    /// ([`kiln::CacheKey::differences`]; `before` is the previous run's
    /// entry).
    pub key_diffs: Vec<KeyDiff>,
}

/// Entries of a function whose keys the report compares pairwise (the
/// latest ones): a function called with ever-new shapes must not send a
/// comparison per pair of hundreds.
pub const KEY_DIFF_ENTRIES: usize = 12;

/// What differs between two entries' cache keys.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyDiff {
    /// The entry compared from.
    pub before: usize,
    /// The entry compared to.
    pub after: usize,
    /// Kiln's explanation, as a miss gives it.
    pub reasons: Vec<MissReason>,
}

/// The kernels the backend runs for one cache entry
/// ([`kiln::Compiled::kernels`]), or why they could not be listed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EntryKernels {
    /// The cache entry.
    pub entry: usize,
    /// Its steps, when the backend listed them.
    pub list: Option<KernelList>,
    /// Why it did not.
    pub error: Option<String>,
    /// Milliseconds per step, beside [`KernelList::steps`]: the mean over
    /// the run's [`EntryKernels::timed_runs`] measured runs of the entry;
    /// empty when none was measured.
    #[serde(default)]
    pub steps_ms: Vec<Option<f64>>,
    /// How many runs of the entry the step times average (calls, and on
    /// the CPU the runs repeated to time steps shorter than the clock's
    /// tick).
    #[serde(default)]
    pub timed_runs: u32,
    /// The smallest step time the figures resolve: the clock's tick over
    /// [`EntryKernels::timed_runs`]. A step under it reads `< that`, never
    /// a measured 0. Zero for GPU timestamps (nanosecond ticks).
    #[serde(default)]
    pub resolution_ms: f64,
}

impl EntryKernels {
    /// The list of `entry`, or its error.
    pub fn of(entry: usize, listed: kiln::Result<KernelList>) -> EntryKernels {
        match listed {
            Ok(list) => EntryKernels {
                entry,
                list: Some(list),
                error: None,
                steps_ms: Vec::new(),
                timed_runs: 0,
                resolution_ms: 0.0,
            },
            Err(e) => EntryKernels {
                entry,
                list: None,
                error: Some(e.to_string()),
                steps_ms: Vec::new(),
                timed_runs: 0,
                resolution_ms: 0.0,
            },
        }
    }
}

/// One call of a compiled function.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallTiming {
    /// Whether this call missed the cache and traced.
    pub traced: bool,
    /// Wall-clock milliseconds of the call, tracing included (on a GPU,
    /// the time to record and submit its work: see [`CallClock`]).
    pub ms: f64,
    /// Milliseconds its work took on the device, from GPU timestamps.
    #[serde(default)]
    pub device_ms: Option<f64>,
    /// The device calls it made, as the worker's counter of timed calls
    /// numbers them (first, end): how [`RunReport::attach_device_times`]
    /// finds its times. Not sent.
    #[serde(skip)]
    pub device_calls: Option<(u64, u64)>,
}

/// What a run's call times measure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallClock {
    /// The call's wall time is its work (the CPU executor runs it before
    /// returning).
    #[default]
    Wall,
    /// A GPU call returns once its work is submitted: its wall time is
    /// submit time, and the work's time comes from GPU timestamps.
    GpuTimestamps,
    /// Submit time only: the adapter has no timestamp queries.
    SubmitOnly,
}

/// One device call's measured time: from the backend's timestamps, or
/// on the CPU from the page's clock, averaged over repeated runs when the
/// call is shorter than the clock's tick.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceTime {
    /// The call's number on the backend's counter of timed calls.
    pub call: u64,
    /// The executable called ([`kiln::KernelList::executable`]).
    pub executable: u64,
    /// Milliseconds per step of its kernel list, the mean over `runs`;
    /// `None` where unmeasured.
    pub steps_ms: Vec<Option<f64>>,
    /// Milliseconds from its first kernel's start to its last one's end,
    /// the mean over `runs`.
    pub total_ms: f64,
    /// How many runs the figures average: 1, or more where the CPU
    /// executor repeated a short call to time it.
    pub runs: u32,
    /// The tick of the clock that timed it (0 for GPU timestamps).
    pub tick_ms: f64,
    /// Wall milliseconds spent repeating the call to time it: not the
    /// call's own time.
    pub repeat_ms: f64,
}

/// An error that stopped a run, with where in the script it happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScriptError {
    /// What went wrong, without the position.
    pub message: String,
    /// The 1-based script line, when known.
    pub line: Option<usize>,
    /// The 1-based column, when known.
    pub column: Option<usize>,
}

impl std::fmt::Display for ScriptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.line, self.column) {
            (Some(line), Some(column)) => {
                write!(f, "line {line}, column {column}: {}", self.message)
            }
            (Some(line), None) => write!(f, "line {line}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

/// What the Verify button found: the values a run showed on its device
/// against the same script's on the CPU executor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verification {
    /// The device the run was checked on.
    pub backend: String,
    /// Array elements compared.
    pub compared: usize,
    /// The largest absolute difference of two compared elements (0 when
    /// none were compared).
    pub max_abs_diff: f64,
    /// The largest difference relative to the CPU's value (to 1 where
    /// the value is smaller): float rounding grows with magnitude.
    pub max_rel_diff: f64,
    /// Where the largest absolute difference is, when there is one.
    #[serde(default)]
    pub largest: Option<Difference>,
    /// Why the values could not be compared, if they could not.
    pub error: Option<String>,
}

/// The element where a device's value and the CPU's differ the most.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Difference {
    /// The shown value it is in: its output label (with the array's
    /// place when the value holds several).
    pub label: String,
    /// The element's index, one entry per dim.
    pub index: Vec<usize>,
    /// The element on the device.
    pub device: f64,
    /// The element on the CPU.
    pub cpu: f64,
}

impl Verification {
    /// A verification that could not compare.
    pub fn failed(backend: String, error: String) -> Verification {
        Verification {
            backend,
            compared: 0,
            max_abs_diff: 0.0,
            max_rel_diff: 0.0,
            largest: None,
            error: Some(error),
        }
    }

    /// Compares the arrays of two runs, each with the label of the shown
    /// value it is in, in order: same count, shapes and dtypes, then
    /// element by element (as f64; NaN against NaN is equal, NaN against a
    /// number an infinite difference).
    pub fn compare(
        backend: String,
        device: &[(String, kiln::Array)],
        cpu: &[(String, kiln::Array)],
    ) -> Verification {
        if device.len() != cpu.len() {
            return Verification::failed(
                backend,
                format!(
                    "{} arrays on the device, {} on the CPU",
                    device.len(),
                    cpu.len()
                ),
            );
        }
        let mut compared = 0;
        let mut max_abs_diff = 0f64;
        let mut max_rel_diff = 0f64;
        let mut largest = None;
        for (i, ((label, d), (_, c))) in device.iter().zip(cpu).enumerate() {
            if d.aval() != c.aval() {
                return Verification::failed(
                    backend,
                    format!(
                        "array {i} is {} on the device, {} on the CPU",
                        d.aval(),
                        c.aval()
                    ),
                );
            }
            let dims = c.dims().unwrap_or_default();
            let (d, c) = match (d.data(), c.data()) {
                (Ok(d), Ok(c)) => (d.to_f64_vec(), c.to_f64_vec()),
                (Err(e), _) | (_, Err(e)) => {
                    return Verification::failed(backend, format!("array {i}: {e}"))
                }
            };
            for (flat, (x, y)) in d.iter().zip(&c).enumerate() {
                let diff = match (x.is_nan(), y.is_nan()) {
                    (true, true) => 0.0,
                    (false, false) if x == y => 0.0,
                    (false, false) => (x - y).abs(),
                    _ => f64::INFINITY,
                };
                if diff > max_abs_diff || (diff > 0.0 && largest.is_none()) {
                    largest = Some(Difference {
                        label: label.clone(),
                        index: unravel(flat, &dims),
                        device: *x,
                        cpu: *y,
                    });
                }
                max_abs_diff = max_abs_diff.max(diff);
                max_rel_diff = max_rel_diff.max(diff / y.abs().max(1.0));
            }
            compared += d.len();
        }
        Verification {
            backend,
            compared,
            max_abs_diff,
            max_rel_diff,
            largest,
            error: None,
        }
    }
}

/// The index, one entry per dim, of the element at `flat` in row-major
/// order.
fn unravel(mut flat: usize, dims: &[usize]) -> Vec<usize> {
    let mut index = vec![0; dims.len()];
    for (i, &d) in dims.iter().enumerate().rev() {
        if d > 0 {
            index[i] = flat % d;
            flat /= d;
        }
    }
    index
}

/// One what-if variant of a run: the same script with options forced on
/// every compiled function, and what the plans became.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Comparison {
    /// The variant, like `fusion off`.
    pub variant: String,
    /// Per compiled function (in order of first call), its latest entry's
    /// figures.
    pub functions: Vec<VariantFigures>,
    /// Why the variant's run failed, if it did.
    pub error: Option<ScriptError>,
}

/// A compiled function's figures in one variant, from its latest entry's
/// [`kiln::Report`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VariantFigures {
    /// The script line of its `compile(...)`.
    pub line: usize,
    /// Nodes of the optimized graph.
    pub nodes: usize,
    /// Elementwise nodes written in place of an operand.
    pub reinplaced: usize,
    /// Peak, lower bound and no-reuse bytes.
    pub memory: PlanMemory,
}
