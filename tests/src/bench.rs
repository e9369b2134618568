//! The harness of the benchmark program (`kiln-bench`): machine description,
//! timing helpers, name selection and the JSON report `cargo xtask bench` writes to
//! `target/kiln-bench.json`.
//!
//! ```
//! use kiln_tests::bench::{median_micros, selected, BenchReport};
//!
//! let selection: Vec<String> = Vec::new(); // no names given: run everything
//! let mut report = BenchReport::new();
//! if selected("sum_1k", &selection) {
//!     let data: Vec<f32> = (0..1000).map(|i| i as f32).collect();
//!     let micros = median_micros(100, || {
//!         std::hint::black_box(data.iter().sum::<f32>());
//!     });
//!     report.record("sum_1k", micros, "us");
//! }
//! assert!(report.to_json().contains("\"sum_1k\""));
//! ```

use serde::{Serialize, Serializer};
use std::collections::BTreeMap;
use std::time::Instant;

/// One benchmark run: where it ran and what it measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BenchReport {
    /// CPU model and core count, e.g. `AMD EPYC 7B13 (2 cores)`.
    pub machine: String,
    /// The GPU adapter the figures were taken on, if any (omitted from the JSON when `None`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
    /// Figures by benchmark name, in name order.
    pub results: BTreeMap<String, Measurement>,
}

/// One figure and its unit (`us`, `ms`, `bytes`, ...).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Measurement {
    /// The figure; integral values are written without a fraction (`19922944`, not `19922944.0`).
    #[serde(serialize_with = "serialize_figure")]
    pub value: f64,
    /// Its unit, as the issue that asks for the benchmark names it.
    pub unit: String,
}

impl Default for BenchReport {
    fn default() -> Self {
        Self::new()
    }
}

impl BenchReport {
    /// An empty report for this machine, with no adapter.
    pub fn new() -> Self {
        Self {
            machine: machine_description(),
            adapter: None,
            results: BTreeMap::new(),
        }
    }

    /// Records a figure under `name`, replacing an earlier one of the same name.
    ///
    /// A figure that is not finite was not measured: it is left out of the report
    /// (with a note on stderr) rather than written as a fake number.
    pub fn record(&mut self, name: impl Into<String>, value: f64, unit: impl Into<String>) {
        let name = name.into();
        if !value.is_finite() {
            eprintln!("kiln-bench: `{name}` measured {value}; left out of the report");
            return;
        }
        let unit = unit.into();
        self.results.insert(name, Measurement { value, unit });
    }

    /// The report as the JSON document of DESIGN.md (Benchmarks):
    /// `{ "machine": …, "adapter": …, "results": { name: { "value": …, "unit": … } } }`.
    pub fn to_json(&self) -> String {
        // Serializing cannot fail: every map key is a string and every number finite.
        serde_json::to_string_pretty(self).expect("a BenchReport always serializes to JSON")
    }
}

fn serialize_figure<S: Serializer>(value: &f64, serializer: S) -> Result<S::Ok, S::Error> {
    // Every integer below 2^53 is exact in an f64, so the conversion loses nothing.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    if value.fract() == 0.0 && value.abs() < EXACT {
        serializer.serialize_i64(*value as i64)
    } else {
        serializer.serialize_f64(*value)
    }
}

/// `"<cpu model> (<n> cores)"`, from /proc/cpuinfo on Linux, sysctl on macOS, and the
/// architecture and OS elsewhere.
pub fn machine_description() -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = cpu_model()
        .unwrap_or_else(|| format!("{} {}", std::env::consts::ARCH, std::env::consts::OS));
    format!("{model} ({cores} cores)")
}

fn cpu_model() -> Option<String> {
    let model = if cfg!(target_os = "macos") {
        let output = std::process::Command::new("sysctl")
            .args(["-n", "machdep.cpu.brand_string"])
            .output()
            .ok()?;
        String::from_utf8(output.stdout).ok()?
    } else {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
        let line = cpuinfo
            .lines()
            .find(|line| line.starts_with("model name"))?;
        line.split_once(':')?.1.to_string()
    };
    let model = model.split_whitespace().collect::<Vec<_>>().join(" ");
    (!model.is_empty()).then_some(model)
}

/// Whether benchmark `name` runs under `selection` (the names given on the command
/// line): all run when it is empty, otherwise those equal to or starting with one of them.
///
/// ```
/// use kiln_tests::bench::selected;
/// let selection = vec!["dispatch".to_string()];
/// assert!(selected("dispatch_10", &selection));
/// assert!(!selected("plan_mlp4_peak_bytes", &selection));
/// ```
pub fn selected(name: &str, selection: &[String]) -> bool {
    selection.is_empty()
        || selection
            .iter()
            .any(|prefix| name.starts_with(prefix.as_str()))
}

/// The median time of one call of `f`, in microseconds, over `iterations` calls
/// (at least one) timed one by one after a warm-up of a tenth as many calls.
///
/// Keep the work observable (`std::hint::black_box`) so the optimiser cannot drop it.
pub fn median_micros(iterations: usize, mut f: impl FnMut()) -> f64 {
    let iterations = iterations.max(1);
    for _ in 0..(iterations / 10).max(1) {
        f();
    }
    let mut micros: Vec<f64> = (0..iterations)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    micros.sort_by(f64::total_cmp);
    // The two middle elements coincide when the count is odd.
    let n = micros.len();
    (micros[(n - 1) / 2] + micros[n / 2]) / 2.0
}

/// The median CPU time of one call of `f` on the calling thread, in
/// microseconds, over `iterations` calls (at least one) after a warm-up of
/// a tenth as many. Unlike [`median_micros`] it does not count the time
/// other processes hold the core, so single-thread figures stay stable on
/// a shared machine; work `f` hands to other threads is not counted. Where
/// the thread's CPU clock cannot be read (not Unix), it is wall time.
pub fn median_cpu_micros(iterations: usize, f: impl FnMut()) -> f64 {
    let micros = sorted_cpu_micros(iterations, f);
    let n = micros.len();
    (micros[(n - 1) / 2] + micros[n / 2]) / 2.0
}

/// The least CPU time of one call of `f` on the calling thread, in
/// microseconds, timed as [`median_cpu_micros`] times it: for a rate the
/// core can reach, such as its arithmetic peak, whose calls run slower
/// only while the core's clock is down.
pub fn fastest_cpu_micros(iterations: usize, f: impl FnMut()) -> f64 {
    sorted_cpu_micros(iterations, f)[0]
}

/// The CPU times of `iterations` calls of `f` (at least one) after a
/// warm-up of a tenth as many, in microseconds, fastest first (see
/// [`median_cpu_micros`]).
fn sorted_cpu_micros(iterations: usize, mut f: impl FnMut()) -> Vec<f64> {
    let iterations = iterations.max(1);
    for _ in 0..(iterations / 10).max(1) {
        f();
    }
    let mut micros: Vec<f64> = (0..iterations)
        .map(|_| {
            let start = thread_cpu_seconds();
            let wall = Instant::now();
            f();
            match (start, thread_cpu_seconds()) {
                (Some(a), Some(b)) => (b - a) * 1e6,
                _ => wall.elapsed().as_secs_f64() * 1e6,
            }
        })
        .collect();
    micros.sort_by(f64::total_cmp);
    micros
}

/// The calling thread's CPU time in seconds, where the OS tells it.
fn thread_cpu_seconds() -> Option<f64> {
    #[cfg(unix)]
    {
        let mut time = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec through the pointer,
        // which points at a live local.
        let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time) };
        (status == 0).then_some(time.tv_sec as f64 + time.tv_nsec as f64 * 1e-9)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// The time of one call of `f` (no warm-up: first-call costs like compiling are the
/// point), in milliseconds.
pub fn time_once_ms(f: impl FnOnce()) -> f64 {
    let start = Instant::now();
    f();
    start.elapsed().as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn parse(report: &BenchReport) -> Value {
        serde_json::from_str(&report.to_json()).expect("to_json writes valid JSON")
    }

    #[test]
    fn report_json_has_machine_adapter_and_results() {
        let mut report = BenchReport::new();
        report.adapter = Some("llvmpipe (LLVM 15.0.6, 256 bits) / Vulkan".to_string());
        report.record("dispatch_10", 1.7, "us");
        report.record("plan_mlp4_peak_bytes", 19_922_944.0, "bytes");

        let json = parse(&report);
        assert_eq!(json["machine"], json!(report.machine));
        assert_eq!(
            json["adapter"],
            json!("llvmpipe (LLVM 15.0.6, 256 bits) / Vulkan")
        );
        assert_eq!(
            json["results"],
            json!({
                "dispatch_10": { "value": 1.7, "unit": "us" },
                "plan_mlp4_peak_bytes": { "value": 19922944, "unit": "bytes" },
            })
        );
        assert_eq!(json.as_object().map(|fields| fields.len()), Some(3));
    }

    #[test]
    fn report_json_omits_adapter_when_none() {
        let json = parse(&BenchReport::new());
        assert!(json.get("adapter").is_none());
        assert_eq!(json["results"], json!({}));
    }

    #[test]
    fn integral_figures_are_written_without_fraction() {
        let mut report = BenchReport::new();
        report.record("bytes", 4096.0, "bytes");
        assert!(report.to_json().contains("\"value\": 4096,"));
    }

    #[test]
    fn record_leaves_out_figures_that_are_not_finite() {
        let mut report = BenchReport::new();
        report.record("nan", f64::NAN, "us");
        report.record("inf", f64::INFINITY, "us");
        assert!(report.results.is_empty());
    }

    #[test]
    fn record_replaces_an_earlier_figure_of_the_same_name() {
        let mut report = BenchReport::new();
        report.record("dispatch_10", 2.0, "us");
        report.record("dispatch_10", 1.5, "us");
        assert_eq!(report.results["dispatch_10"].value, 1.5);
    }

    #[test]
    fn machine_names_the_core_count() {
        let machine = BenchReport::new().machine;
        assert!(machine.ends_with(" cores)"), "{machine}");
    }

    #[test]
    fn empty_selection_selects_everything() {
        assert!(selected("dispatch_10", &[]));
    }

    #[test]
    fn selection_matches_exact_names_and_prefixes() {
        let selection = vec!["plan_".to_string(), "dispatch_10".to_string()];
        assert!(selected("dispatch_10", &selection));
        assert!(selected("plan_mlp4_peak_bytes", &selection));
        assert!(!selected("dispatch_1", &selection));
        assert!(!selected("compile_mlp4", &selection));
    }

    #[test]
    fn median_micros_is_the_middle_call_time() {
        let mut calls = 0;
        let median = median_micros(9, || calls += 1);
        assert_eq!(calls, 9 + 1, "one warm-up call, then nine timed calls");
        assert!((0.0..1e6).contains(&median), "{median}");
    }

    #[test]
    fn median_micros_measures_slow_calls() {
        let median = median_micros(3, || {
            std::thread::sleep(std::time::Duration::from_millis(2))
        });
        assert!(median >= 2_000.0, "{median}");
    }

    #[test]
    fn median_cpu_micros_counts_work_not_sleep() {
        let mut calls = 0;
        let sleeping = median_cpu_micros(3, || {
            calls += 1;
            std::thread::sleep(std::time::Duration::from_millis(20))
        });
        assert_eq!(calls, 3 + 1, "one warm-up call, then three timed calls");
        assert!(sleeping < 10_000.0, "{sleeping}");
    }

    /// Spins until this thread has run `seconds` of CPU time, however long
    /// other processes keep the core.
    #[cfg(unix)]
    fn spin_cpu(seconds: f64) {
        let start = thread_cpu_seconds().expect("Unix has a thread CPU clock");
        while thread_cpu_seconds().expect("Unix has a thread CPU clock") - start < seconds {
            std::hint::black_box(0);
        }
    }

    #[cfg(unix)]
    #[test]
    fn median_cpu_micros_counts_the_threads_work() {
        let spinning = median_cpu_micros(3, || spin_cpu(0.005));
        assert!((5_000.0..50_000.0).contains(&spinning), "{spinning}");
    }

    #[cfg(unix)]
    #[test]
    fn fastest_cpu_micros_is_the_quickest_timed_call() {
        // The warm-up call, then timed calls of 12, 2 and 12 ms.
        let mut call = 0;
        let fastest = fastest_cpu_micros(3, || {
            spin_cpu(if call == 2 { 0.002 } else { 0.012 });
            call += 1;
        });
        assert_eq!(call, 3 + 1);
        assert!((2_000.0..12_000.0).contains(&fastest), "{fastest}");
    }

    #[test]
    fn time_once_ms_measures_one_call() {
        let ms = time_once_ms(|| std::thread::sleep(std::time::Duration::from_millis(5)));
        assert!(ms >= 5.0, "{ms}");
    }
}
