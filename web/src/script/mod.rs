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
mod function;
mod nodes;
mod values;

pub use function::{Options, WhatIf};
pub use nodes::{register_node, NodeSpec, ScriptObject};

use crate::format::numpy_repr;
use crate::report::{Comparison, Output, RunReport, ScriptError, VariantFigures};
use function::ScriptFunction;
use rhai::{Dynamic, Engine, EvalAltResult, ParseError, Position, Scope, AST};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
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
    outputs: RefCell<Vec<Output>>,
    log: RefCell<Vec<String>>,
    nesting: Cell<usize>,
    max_nesting: usize,
    /// Options forced on this run's compiled functions.
    what_if: Cell<WhatIf>,
    deadline: Cell<Option<Instant>>,
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
        let key = handle.key();
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

    fn show(&self, label: String, value: &Dynamic) -> ScriptResult<()> {
        let text = render(value)?;
        self.outputs.borrow_mut().push(Output { label, text });
        Ok(())
    }
}

/// A value as the outputs view prints it: arrays the NumPy way.
fn render(value: &Dynamic) -> ScriptResult<String> {
    if let Some(a) = value.read_lock::<kiln::Array>() {
        return numpy_repr(&a).map_err(|e| runtime_error(e.to_string()));
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
            outputs: RefCell::default(),
            log: RefCell::default(),
            nesting: Cell::new(0),
            max_nesting: limits.max_nested_compiled_calls,
            what_if: Cell::new(WhatIf::default()),
            deadline: Cell::new(None),
        });
        let engine = Rc::new(api::engine(&shared, &limits));
        *shared.engine.borrow_mut() = Rc::downgrade(&engine);
        Session {
            engine,
            shared,
            limits,
        }
    }

    /// Runs `script` and reports what it did. A failed run reports its
    /// error with the line and column, and what it did before; the next
    /// run starts afresh, with the caches of the compiled functions.
    pub fn run(&mut self, script: &str) -> RunReport {
        self.run_with(script, WhatIf::default())
    }

    /// Runs `script` once per [`WhatIf::VARIANTS`] and reports each
    /// variant's plan figures, for the memory view to show side by side.
    /// Each variant has caches of its own (options are part of a compiled
    /// function's identity).
    pub fn compare(&mut self, script: &str) -> Vec<Comparison> {
        WhatIf::VARIANTS
            .iter()
            .map(|&(variant, what_if)| {
                let report = self.run_with(script, what_if);
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

    /// Runs `script` with `what_if` forced on its compiled functions.
    pub fn run_with(&mut self, script: &str, what_if: WhatIf) -> RunReport {
        self.shared.what_if.set(what_if);
        let start = Instant::now();
        let shared = &self.shared;
        shared.run.set(shared.run.get() + 1);
        *shared.source.borrow_mut() = Rc::from(script);
        shared.called.borrow_mut().clear();
        shared.outputs.borrow_mut().clear();
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
                    Ok(value) => shared
                        .show("result".to_string(), &value)
                        .err()
                        .map(|e| eval_error(&e)),
                    Err(e) => Some(eval_error(&e)),
                };
                *shared.ast.borrow_mut() = None;
                error
            }
        };
        shared.deadline.set(None);
        let functions = {
            let all = shared.functions.borrow();
            shared
                .called
                .borrow()
                .iter()
                .filter_map(|key| all.get(key).map(|f| f.report()))
                .collect()
        };
        let run = shared.run.get();
        shared
            .functions
            .borrow_mut()
            .retain(|_, f| f.last_run.get() + KEEP_UNUSED_RUNS > run);
        RunReport {
            outputs: shared.outputs.take(),
            log: shared.log.take(),
            functions,
            backend: "cpu".to_string(),
            total_ms: start.elapsed().as_secs_f64() * 1e3,
            error,
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
            // Rhai appends the position; the report carries it apart.
            let text = other.to_string();
            match text.strip_suffix(&format!(" ({})", inner.position())) {
                Some(bare) => bare.to_string(),
                None => text,
            }
        }
    };
    let (line, column) = position_parts(position);
    ScriptError {
        message,
        line,
        column,
    }
}

#[cfg(test)]
mod tests;
