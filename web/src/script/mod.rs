//! Running Rhai scripts over Kiln's API.
//!
//! A [`Session`] owns one Rhai engine with Kiln's API registered
//! and the compiled functions of every run so far: a function whose
//! source text and options are unchanged keeps its cache across edits, so
//! changing an input shape and re-running shows a miss and why.
//!
//! ```
//! let mut session = kiln_web::script::Session::new();
//! let report = session.run("let f = compile(|x| x * 2.0); f.run(ones([2]))");
//! assert_eq!(report.error, None);
//! assert_eq!(report.outputs[0].text, "array([2., 2.], dtype=float32)");
//! assert_eq!(report.functions[0].cache.misses, 1);
//! ```

mod api;
mod control;
mod custom;
mod errors;
mod function;
mod nodes;
mod numpy;
mod quant;
mod values;

pub use errors::script_message;
pub use function::{Options, Transform, WhatIf};
pub use nodes::{register_node, NodeSpec, ScriptObject};

use crate::format::numpy_repr;
use crate::report::{
    CallClock, Comparison, Output, RunReport, ScriptError, VariantFigures, Verification,
};
use function::{RunFunction, ScriptFunction};
use rhai::{Dynamic, Engine, EvalAltResult, ParseError, Position, Scope, AST};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::Duration;
use values::{runtime_error, ScriptResult};
use web_time::Instant;

/// Every limit a script runs under. Rhai's own limits are all set from
/// here (its defaults differ between debug and release builds), and
/// Kiln's size limits are set to [`ScriptLimits::kiln`] for the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScriptLimits {
    /// Rhai operations one evaluation may take (a trace of a compiled
    /// function is an evaluation of its own).
    pub max_operations: u64,
    /// Wall-clock time of a whole run, traces included.
    pub time_limit: Duration,
    /// Nested script function calls.
    pub max_call_levels: usize,
    /// Expression nesting at the top level.
    pub max_expr_depth: usize,
    /// Expression nesting inside functions.
    pub max_function_expr_depth: usize,
    /// Characters of one string.
    pub max_string_size: usize,
    /// Elements of one script array (shapes, data literals).
    pub max_array_size: usize,
    /// Entries of one script map.
    pub max_map_size: usize,
    /// Variables in scope at once.
    pub max_variables: usize,
    /// Script functions (closures included) in one script.
    pub max_functions: usize,
    /// Modules a script may import: none, a page has no files to load.
    pub max_modules: usize,
    /// Strings Rhai keeps interned.
    pub max_strings_interned: usize,
    /// Compiled functions called inside one another's traces.
    pub max_nested_compiled_calls: usize,
    /// Kiln's array and call size limits.
    pub kiln: kiln::Limits,
}

impl ScriptLimits {
    /// The playground's limits: a second or two of script work, arrays of
    /// at most 64 MiB and calls of at most 256 MiB (a browser tab's memory
    /// is far below Kiln's wasm32 defaults).
    pub const PLAYGROUND: ScriptLimits = ScriptLimits {
        max_operations: 20_000_000,
        time_limit: Duration::from_secs(20),
        max_call_levels: 32,
        max_expr_depth: 64,
        max_function_expr_depth: 32,
        max_string_size: 1 << 16,
        max_array_size: 100_000,
        max_map_size: 10_000,
        max_variables: 1_000,
        max_functions: 1_000,
        max_modules: 0,
        max_strings_interned: 1_024,
        max_nested_compiled_calls: 8,
        kiln: kiln::Limits {
            max_array_bytes: 64 << 20,
            max_call_bytes: 256 << 20,
        },
    };
}

/// A session: an engine and the compiled functions of its runs.
pub struct Session {
    engine: Rc<Engine>,
    shared: Rc<Shared>,
    limits: ScriptLimits,
    /// The compiled functions as the last run (not a what-if or a
    /// verification's CPU run) left them, in order of first call: what
    /// each function of the next run is diffed against.
    previous: Vec<RunFunction>,
}

/// Compiled functions are dropped after this many runs without a call.
const KEEP_UNUSED_RUNS: u64 = 20;

/// State the registered functions share with the session.
pub(crate) struct Shared {
    engine: RefCell<Weak<Engine>>,
    /// The AST of the current run: traces call its closures.
    ast: RefCell<Option<Rc<AST>>>,
    source: RefCell<Rc<str>>,
    run: Cell<u64>,
    functions: RefCell<HashMap<String, Rc<ScriptFunction>>>,
    /// Keys of the functions this run called, in order of first call.
    called: RefCell<Vec<String>>,
    /// Values shown so far, rendered when the run has read them back.
    shown: RefCell<Vec<Shown>>,
    log: RefCell<Vec<String>>,
    nesting: Cell<usize>,
    max_nesting: usize,
    /// Options forced on this run's compiled functions.
    what_if: Cell<WhatIf>,
    deadline: Cell<Option<Instant>>,
    /// Counts the device calls timed so far (see
    /// [`Session::count_device_calls`]).
    device_calls: RefCell<Option<DeviceCallCounter>>,
}

/// Counts a backend's timed calls: a compiled call made those it added.
pub type DeviceCallCounter = Rc<dyn Fn() -> u64>;

/// A value a script showed, with where: rendered after the run, once
/// every array in it is read back from the device.
struct Shown {
    label: String,
    value: Dynamic,
    line: Option<usize>,
    column: Option<usize>,
}

impl Shown {
    fn render(&self) -> Result<Output, ScriptError> {
        render(&self.value)
            .map(|text| Output {
                label: self.label.clone(),
                text,
            })
            .map_err(|e| ScriptError {
                message: eval_error(&e).message,
                line: self.line,
                column: self.column,
            })
    }
}

/// Every array inside a shown value.
fn arrays_in(value: &Dynamic, out: &mut Vec<kiln::Array>) {
    if let Some(a) = value.read_lock::<kiln::Array>() {
        out.push(a.clone());
    } else if let Some(items) = value.read_lock::<rhai::Array>() {
        items.iter().for_each(|i| arrays_in(i, out));
    } else if let Some(map) = value.read_lock::<rhai::Map>() {
        map.values().for_each(|v| arrays_in(v, out));
    } else if let Some(object) = value.read_lock::<ScriptObject>() {
        object.fields.values().for_each(|v| arrays_in(v, out));
    }
}

/// Where a value was shown.
struct At {
    line: Option<usize>,
    column: Option<usize>,
}

impl At {
    /// `e`, which reading the value back gave, at this position.
    fn error(&self, e: kiln::Error) -> ScriptError {
        ScriptError {
            message: script_message(&e),
            line: self.line,
            column: self.column,
        }
    }
}

/// A run whose script has finished and whose shown values may still be
/// on the device.
struct Executed {
    start: Instant,
    error: Option<ScriptError>,
}

/// Leaves a nested compiled call when dropped.
pub(crate) struct Nested<'a>(&'a Cell<usize>);

impl Drop for Nested<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

impl Shared {
    fn engine_and_ast(&self) -> ScriptResult<(Rc<Engine>, Rc<AST>)> {
        let engine = self.engine.borrow().upgrade();
        let ast = self.ast.borrow().clone();
        engine
            .zip(ast)
            .ok_or_else(|| runtime_error("a compiled function was called outside of a run"))
    }

    fn enter_nested(&self) -> ScriptResult<Nested<'_>> {
        if self.nesting.get() >= self.max_nesting {
            return Err(runtime_error(format!(
                "compiled functions are nested more than {} deep",
                self.max_nesting
            )));
        }
        self.nesting.set(self.nesting.get() + 1);
        Ok(Nested(&self.nesting))
    }

    /// The session's compiled function for `handle`, created on first use.
    fn function_for(self: &Rc<Self>, handle: &function::ScriptCompiled) -> Rc<ScriptFunction> {
        let mut forced = handle.clone();
        forced.options = self.what_if.get().apply(&handle.options);
        let handle = &forced;
        // A function runs on the device it was made for: another device
        // is another function, with a cache of its own.
        let key = format!("{}\n{}", kiln::default_device().name(), handle.key());
        let function = self
            .functions
            .borrow_mut()
            .entry(key.clone())
            .or_insert_with(|| Rc::new(ScriptFunction::new(self, handle)))
            .clone();
        let mut called = self.called.borrow_mut();
        if !called.contains(&key) {
            called.push(key);
        }
        function.begin_run(self.run.get(), handle);
        function
    }

    fn show(&self, label: String, value: Dynamic, position: Position) {
        let (line, column) = position_parts(position);
        self.shown.borrow_mut().push(Shown {
            label,
            value,
            line,
            column,
        });
    }
}

/// A value as the outputs view prints it: arrays the NumPy way.
fn render(value: &Dynamic) -> ScriptResult<String> {
    if let Some(a) = value.read_lock::<kiln::Array>() {
        return numpy_repr(&a).map_err(|e| runtime_error(script_message(&e)));
    }
    if let Some(items) = value.read_lock::<rhai::Array>() {
        let items = items.iter().map(render).collect::<ScriptResult<Vec<_>>>()?;
        return Ok(format!("[{}]", items.join(", ")));
    }
    if let Some(map) = value.read_lock::<rhai::Map>() {
        return render_fields(&map).map(|f| format!("#{{{f}}}"));
    }
    if let Some(object) = value.read_lock::<ScriptObject>() {
        return render_fields(&object.fields).map(|f| format!("{} {{{f}}}", object.class));
    }
    Ok(value.to_string())
}

fn render_fields(map: &rhai::Map) -> ScriptResult<String> {
    let fields = map
        .iter()
        .map(|(k, v)| render(v).map(|v| format!("{k}: {v}")))
        .collect::<ScriptResult<Vec<_>>>()?;
    Ok(fields.join(", "))
}

impl Default for Session {
    fn default() -> Session {
        Session::new()
    }
}

impl Session {
    /// A session under [`ScriptLimits::PLAYGROUND`].
    pub fn new() -> Session {
        Session::with_limits(ScriptLimits::PLAYGROUND)
    }

    /// A session under `limits`; puts `limits.kiln` in force for the
    /// process (Kiln's limits are process-wide).
    pub fn with_limits(limits: ScriptLimits) -> Session {
        kiln::Limits::set(limits.kiln);
        let shared = Rc::new(Shared {
            engine: RefCell::new(Weak::new()),
            ast: RefCell::default(),
            source: RefCell::new(Rc::from("")),
            run: Cell::new(0),
            functions: RefCell::default(),
            called: RefCell::default(),
            shown: RefCell::default(),
            log: RefCell::default(),
            nesting: Cell::new(0),
            max_nesting: limits.max_nested_compiled_calls,
            what_if: Cell::new(WhatIf::default()),
            deadline: Cell::new(None),
            device_calls: RefCell::new(None),
        });
        let engine = Rc::new(api::engine(&shared, &limits));
        *shared.engine.borrow_mut() = Rc::downgrade(&engine);
        Session {
            engine,
            shared,
            limits,
            previous: Vec::new(),
        }
    }

    /// Numbers each compiled call's device work by `counter` (the
    /// backend's count of timed calls; `None` stops), so that
    /// [`RunReport::attach_device_times`] can give each call its time.
    pub fn count_device_calls(&mut self, counter: Option<DeviceCallCounter>) {
        *self.shared.device_calls.borrow_mut() = counter;
    }

    /// Runs `script` and reports what it did. A failed run reports its
    /// error with the line and column, and what it did before; the next
    /// run starts afresh, with the caches of the compiled functions. Shown
    /// values are read back blocking: in a browser, on WebGPU, use
    /// [`Session::run_async`].
    pub fn run(&mut self, script: &str) -> RunReport {
        let report = self.run_with(script, WhatIf::default());
        self.remember_run();
        report
    }

    /// Runs `script` like [`Session::run`], reading the shown values back
    /// from the device without blocking: the way to run on WebGPU in a
    /// browser, where the script's compiled calls and eager ops leave
    /// their results on the GPU and a readback completes only after the
    /// worker yields.
    pub async fn run_async(&mut self, script: &str) -> RunReport {
        let executed = self.execute(script, WhatIf::default());
        let mut read_error = None;
        for (arrays, at) in self.shown_groups() {
            if let Err(e) = kiln::eval_async(&arrays).await {
                read_error = Some(at.error(e));
                break;
            }
        }
        let report = self.finish(executed, read_error);
        self.remember_run();
        report
    }

    /// Runs `script` on the default device, then again on the CPU
    /// executor, and reports the device run with the largest difference
    /// between the values the two runs showed.
    pub async fn verify(&mut self, script: &str) -> (RunReport, Verification) {
        let backend = kiln::default_device().name().to_string();
        let report = self.run_async(script).await;
        let on_device = self.shown_arrays();
        let on_cpu = kiln::with_default_device(Arc::new(kiln::CpuBackend), || {
            let cpu = self.run_with(script, WhatIf::default());
            cpu.error
                .map_or_else(|| Ok(self.shown_arrays()), |e| Err(e.to_string()))
        });
        let verification = match (&report.error, on_cpu) {
            (Some(e), _) => Verification::failed(backend, format!("the run failed: {e}")),
            (None, Err(e)) => Verification::failed(backend, format!("the CPU run failed: {e}")),
            (None, Ok(on_cpu)) => Verification::compare(backend, &on_device, &on_cpu),
        };
        (report, verification)
    }

    /// Runs `script` once per [`WhatIf::VARIANTS`] and reports each
    /// variant's plan figures, for the memory view to show side by side.
    /// Each variant has caches of its own (options are part of a compiled
    /// function's identity). Nothing is read back from the device.
    pub fn compare(&mut self, script: &str) -> Vec<Comparison> {
        WhatIf::VARIANTS
            .iter()
            .map(|&(variant, what_if)| {
                let executed = self.execute(script, what_if);
                self.shared.shown.borrow_mut().clear();
                let report = self.finish(executed, None);
                Comparison {
                    variant: variant.to_string(),
                    functions: report
                        .functions
                        .iter()
                        .filter_map(|f| {
                            f.cache.reports.last().map(|r| VariantFigures {
                                line: f.line,
                                nodes: r.nodes.len(),
                                reinplaced: r.plan.reinplaced,
                                memory: r.plan.memory,
                            })
                        })
                        .collect(),
                    error: report.error,
                }
            })
            .collect()
    }

    /// Runs `script` with `what_if` forced on its compiled functions,
    /// reading shown values back blocking.
    pub fn run_with(&mut self, script: &str, what_if: WhatIf) -> RunReport {
        let executed = self.execute(script, what_if);
        let read_error = self
            .shown_groups()
            .into_iter()
            .find_map(|(arrays, at)| kiln::eval(&arrays).err().map(|e| at.error(e)));
        self.finish(executed, read_error)
    }

    /// Per shown value, its arrays and where it was shown.
    fn shown_groups(&self) -> Vec<(Vec<kiln::Array>, At)> {
        self.shared
            .shown
            .borrow()
            .iter()
            .map(|shown| {
                let mut arrays = Vec::new();
                arrays_in(&shown.value, &mut arrays);
                let at = At {
                    line: shown.line,
                    column: shown.column,
                };
                (arrays, at)
            })
            .collect()
    }

    /// The arrays of the last run's shown values, in order, flattened,
    /// each with its value's label (and its place, where a value holds
    /// several).
    fn shown_arrays(&self) -> Vec<(String, kiln::Array)> {
        let mut labelled = Vec::new();
        for shown in self.shared.shown.borrow().iter() {
            let mut arrays = Vec::new();
            arrays_in(&shown.value, &mut arrays);
            let several = arrays.len() > 1;
            labelled.extend(arrays.into_iter().enumerate().map(|(k, a)| {
                let label = match several {
                    true => format!("{} (array {})", shown.label, k + 1),
                    false => shown.label.clone(),
                };
                (label, a)
            }));
        }
        labelled
    }

    /// Runs the script itself; shown values are kept unrendered.
    fn execute(&mut self, script: &str, what_if: WhatIf) -> Executed {
        self.shared.what_if.set(what_if);
        let start = Instant::now();
        let shared = &self.shared;
        shared.run.set(shared.run.get() + 1);
        *shared.source.borrow_mut() = Rc::from(script);
        shared.called.borrow_mut().clear();
        shared.shown.borrow_mut().clear();
        shared.log.borrow_mut().clear();
        shared.nesting.set(0);
        shared.deadline.set(Some(start + self.limits.time_limit));
        let error = match self.engine.compile(script) {
            Err(e) => Some(parse_error(&e)),
            Ok(ast) => {
                let ast = Rc::new(ast);
                *shared.ast.borrow_mut() = Some(ast.clone());
                let result = self
                    .engine
                    .eval_ast_with_scope::<Dynamic>(&mut Scope::new(), &ast);
                let error = match result {
                    Ok(value) if value.is_unit() => None,
                    Ok(value) => {
                        shared.show("result".to_string(), value, Position::NONE);
                        None
                    }
                    Err(e) => Some(eval_error_in(&e, Some((script, &ast)))),
                };
                *shared.ast.borrow_mut() = None;
                error
            }
        };
        shared.deadline.set(None);
        Executed { start, error }
    }

    /// The report of an executed run whose shown values were read back
    /// (or failed to be: `read_error`, a device's error such as an index
    /// out of range found by a kernel).
    fn finish(&mut self, executed: Executed, read_error: Option<ScriptError>) -> RunReport {
        let shared = &self.shared;
        let mut error = executed.error;
        let mut outputs = Vec::new();
        match read_error {
            Some(e) => {
                error.get_or_insert(e);
            }
            None => {
                for shown in shared.shown.borrow().iter() {
                    match shown.render() {
                        Ok(output) => outputs.push(output),
                        Err(e) => {
                            error.get_or_insert(e);
                            break;
                        }
                    }
                }
            }
        }
        let functions = {
            let all = shared.functions.borrow();
            let called = shared.called.borrow();
            called
                .iter()
                .enumerate()
                .filter_map(|(order, key)| {
                    let function = all.get(key)?;
                    let mut report = function.report();
                    report.previous = self
                        .previous_of(key, order, &called)
                        .map(|previous| function.against(previous));
                    Some(report)
                })
                .collect()
        };
        let run = shared.run.get();
        shared
            .functions
            .borrow_mut()
            .retain(|_, f| f.last_run.get() + KEEP_UNUSED_RUNS > run);
        RunReport {
            script: shared.source.borrow().to_string(),
            outputs,
            log: shared.log.take(),
            functions,
            backend: kiln::default_device().name().to_string(),
            total_ms: executed.start.elapsed().as_secs_f64() * 1e3,
            clock: CallClock::default(),
            error,
            gpu_work_abandoned: false,
        }
    }

    /// The function the previous run had in place of this run's function
    /// `key`, compiled `order`th: the same function, else the previous
    /// run's `order`th unless this run calls that one too (then the edit
    /// moved it, and it has its own match).
    fn previous_of(&self, key: &str, order: usize, called: &[String]) -> Option<&RunFunction> {
        self.previous
            .iter()
            .find(|p| p.identity == key)
            .or_else(|| {
                self.previous
                    .get(order)
                    .filter(|p| !called.contains(&p.identity))
            })
    }

    /// Keeps the functions as this run left them, for the next run's diff;
    /// a run that compiled nothing (one that failed to parse) keeps the
    /// run before it.
    fn remember_run(&mut self) {
        let all = self.shared.functions.borrow();
        let left: Vec<RunFunction> = self
            .shared
            .called
            .borrow()
            .iter()
            .filter_map(|key| all.get(key)?.as_left(key))
            .collect();
        if !left.is_empty() {
            self.previous = left;
        }
    }

    /// How many compiled functions the session keeps.
    pub fn cached_functions(&self) -> usize {
        self.shared.functions.borrow().len()
    }
}

fn position_parts(position: Position) -> (Option<usize>, Option<usize>) {
    (position.line(), position.position())
}

fn parse_error(e: &ParseError) -> ScriptError {
    let (line, column) = position_parts(e.1);
    ScriptError {
        message: format!("syntax error: {}", e.0),
        line,
        column,
    }
}

/// The innermost error (inside the function call that failed) with its
/// position; the outer positions only say which call it was.
fn eval_error(e: &EvalAltResult) -> ScriptError {
    eval_error_in(e, None)
}

/// [`eval_error`] of a run of `script` (parsed as the AST): a function
/// not found is said in script terms.
fn eval_error_in(e: &EvalAltResult, run: Option<(&str, &AST)>) -> ScriptError {
    let inner = e.unwrap_inner();
    let position = match inner.position() {
        p if p.is_none() => e.position(),
        p => p,
    };
    let message = match inner {
        EvalAltResult::ErrorRuntime(value, _) | EvalAltResult::ErrorTerminated(value, _) => {
            value.to_string()
        }
        other => {
            let in_script_terms = match (other, run) {
                (EvalAltResult::ErrorFunctionNotFound(signature, _), Some((script, ast))) => {
                    errors::function_not_found(signature, script, ast)
                }
                _ => None,
            };
            in_script_terms.unwrap_or_else(|| {
                // Rhai appends the position; the report carries it apart.
                let text = other.to_string();
                match text.strip_suffix(&format!(" ({})", inner.position())) {
                    Some(bare) => bare.to_string(),
                    None => text,
                }
            })
        }
    };
    let (line, column) = position_parts(position);
    ScriptError {
        message,
        line,
        column,
    }
}

// The table the reference prints, which only its generation (a test) reads.
#[cfg(test)]
mod catalog;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
