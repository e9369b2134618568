//! `compile(...)` in scripts: a handle with its options, and the compiled
//! functions a session keeps across runs, keyed by source text.

use super::values::{from_value, into_value, runtime_error, to_value, ScriptResult};
use super::Shared;
use crate::report::{CallTiming, FunctionReport};
use kiln::{Compiled, Value};
use rhai::{Dynamic, EvalAltResult, FnPtr};
use std::cell::{Cell, RefCell};
use std::collections::hash_map::DefaultHasher;
use std::fmt::Write;
use std::hash::{Hash, Hasher};
use std::rc::{Rc, Weak};
use web_time::Instant;

/// What `compile(f)` returns to a script: the function and its options.
/// Calling it finds (or creates) the session's compiled function for its
/// source text and options, so caches outlive the run that made them.
#[derive(Clone)]
pub struct ScriptCompiled {
    /// The argument of `compile(...)` as written.
    pub(super) source: Rc<str>,
    /// Every `fn` definition of the script: a compiled function may call
    /// them, so their text is part of its identity.
    pub(super) helpers: Rc<str>,
    /// The script line of the `compile(...)` call.
    pub(super) line: usize,
    pub(super) body: FnPtr,
    pub(super) options: Options,
}

/// The options a script sets on a compiled function.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Options {
    /// `.shapeless()`.
    pub shapeless: bool,
    /// `.fusion(b)`.
    pub fusion: bool,
    /// `.donate([...])`.
    pub donate: Vec<String>,
}

/// Options forced on every compiled function of a run: the memory view's
/// what-if toggles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WhatIf {
    /// Turns elementwise fusion off.
    pub fusion_off: bool,
    /// Drops every donation.
    pub donation_off: bool,
    /// Compiles shapeless.
    pub shapeless: bool,
}

impl WhatIf {
    /// The variants the memory view compares, by name.
    pub const VARIANTS: [(&'static str, WhatIf); 4] = [
        (
            "as written",
            WhatIf {
                fusion_off: false,
                donation_off: false,
                shapeless: false,
            },
        ),
        (
            "fusion off",
            WhatIf {
                fusion_off: true,
                donation_off: false,
                shapeless: false,
            },
        ),
        (
            "donation off",
            WhatIf {
                fusion_off: false,
                donation_off: true,
                shapeless: false,
            },
        ),
        (
            "shapeless",
            WhatIf {
                fusion_off: false,
                donation_off: false,
                shapeless: true,
            },
        ),
    ];

    /// `options` with this variant's changes.
    pub fn apply(self, options: &Options) -> Options {
        Options {
            shapeless: options.shapeless || self.shapeless,
            fusion: options.fusion && !self.fusion_off,
            donate: if self.donation_off {
                Vec::new()
            } else {
                options.donate.clone()
            },
        }
    }
}

impl Default for Options {
    fn default() -> Options {
        Options {
            shapeless: false,
            fusion: true,
            donate: Vec::new(),
        }
    }
}

impl ScriptCompiled {
    /// The identity of the compiled function this handle calls: source
    /// text, helper functions, options, and the values the closure captured
    /// (they are constants of its graph, so a new value needs a new cache).
    pub(super) fn key(&self) -> String {
        let mut key = format!("{:?}\n{}\n{}", self.options, self.source, self.helpers);
        for captured in self.body.curry() {
            key.push('\n');
            render_captured(&to_value(captured), &mut key);
        }
        key
    }
}

/// A captured value as it enters a key: arrays by aval and content hash.
fn render_captured(value: &Value, out: &mut String) {
    match value {
        Value::Array(a) => match a.data() {
            Ok(data) if !a.is_tracer() => {
                let mut hasher = DefaultHasher::new();
                for v in data.to_f64_vec() {
                    v.to_bits().hash(&mut hasher);
                }
                let _ = write!(out, "{}#{:016x}", a.aval(), hasher.finish());
            }
            _ => {
                let _ = write!(out, "{a:?}");
            }
        },
        Value::List(items) | Value::Tuple(items) => {
            out.push('[');
            for item in items {
                render_captured(item, out);
                out.push(',');
            }
            out.push(']');
        }
        Value::Map(map) => {
            out.push('{');
            for (k, v) in map {
                let _ = write!(out, "{k}:");
                render_captured(v, out);
                out.push(',');
            }
            out.push('}');
        }
        Value::Object { class, inner } => {
            let _ = write!(out, "{class}");
            render_captured(inner, out);
        }
        other => {
            let _ = write!(out, "{other:?}");
        }
    }
}

/// The traced function of a compiled script function.
type Traced = Box<dyn Fn(Value) -> Value>;

/// A compiled script function kept by a session across runs.
pub(super) struct ScriptFunction {
    compiled: Compiled<Value, Value, Traced>,
    source: Rc<str>,
    options: Options,
    line: Cell<usize>,
    /// The closure of the current run: what a trace calls.
    body: Rc<RefCell<FnPtr>>,
    /// The script error that made the last trace fail: Kiln only sees an
    /// output that is not a tree, the script wants the error itself.
    failure: Rc<RefCell<Option<Box<EvalAltResult>>>>,
    calls: RefCell<Vec<CallTiming>>,
    /// The run that last called it, to drop functions no run uses.
    pub(super) last_run: Cell<u64>,
}

impl ScriptFunction {
    pub(super) fn new(shared: &Rc<Shared>, handle: &ScriptCompiled) -> ScriptFunction {
        let body = Rc::new(RefCell::new(handle.body.clone()));
        let failure = Rc::new(RefCell::new(None));
        let traced: Traced = {
            let shared = Rc::downgrade(shared);
            let body = body.clone();
            let failure = failure.clone();
            Box::new(move |args: Value| match invoke(&shared, &body, args) {
                Ok(out) => out,
                Err(e) => {
                    *failure.borrow_mut() = Some(e);
                    Value::Opaque {
                        type_name: "failed script function".to_string(),
                    }
                }
            })
        };
        let options = handle.options.clone();
        let mut compiled = kiln::compile::<Value, Value, Traced, _>(traced).fusion(options.fusion);
        if options.shapeless {
            compiled = compiled.shapeless();
        }
        if !options.donate.is_empty() {
            compiled = compiled.donate(options.donate.clone());
        }
        ScriptFunction {
            compiled,
            source: handle.source.clone(),
            options,
            line: Cell::new(handle.line),
            body,
            failure,
            calls: RefCell::default(),
            last_run: Cell::new(0),
        }
    }

    /// Starts a run's use of this function: its calls so far belong to
    /// earlier runs.
    pub(super) fn begin_run(&self, run: u64, handle: &ScriptCompiled) {
        if self.last_run.get() != run {
            self.last_run.set(run);
            self.calls.borrow_mut().clear();
        }
        self.line.set(handle.line);
        *self.body.borrow_mut() = handle.body.clone();
    }

    /// Calls the compiled function on the script's arguments, which it
    /// takes over (so a donated temporary is written in place).
    pub(super) fn call(&self, args: Vec<Dynamic>) -> ScriptResult<Dynamic> {
        let args = Value::Tuple(args.into_iter().map(into_value).collect());
        let misses = self.compiled.cache().misses;
        let start = Instant::now();
        let result = self.compiled.call_owned(args);
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let traced = self.compiled.cache().misses > misses;
        self.calls.borrow_mut().push(CallTiming { traced, ms });
        let failure = self.failure.borrow_mut().take();
        // A failed trace is reported by the script's own error, whether
        // Kiln saw it fail (a trace) or returned the stand-in output (a
        // call inside another trace runs the function inline).
        match (failure, result) {
            (Some(script_error), _) => Err(script_error),
            (None, Ok(out)) => Ok(from_value(out)),
            (None, Err(e)) => Err(runtime_error(format!("compiled function: {e}"))),
        }
    }

    pub(super) fn report(&self) -> FunctionReport {
        FunctionReport {
            source: self.source.to_string(),
            line: self.line.get(),
            shapeless: self.options.shapeless,
            fusion: self.options.fusion,
            donate: self.options.donate.clone(),
            cache: self.compiled.cache(),
            calls: self.calls.borrow().clone(),
        }
    }
}

/// Runs the script closure on traced arguments.
fn invoke(shared: &Weak<Shared>, body: &RefCell<FnPtr>, mut args: Value) -> ScriptResult<Value> {
    let shared = shared
        .upgrade()
        .ok_or_else(|| runtime_error("the session of this compiled function has ended"))?;
    let (engine, ast) = shared.engine_and_ast()?;
    let _nested = shared.enter_nested()?;
    let args: Vec<Dynamic> = match &mut args {
        Value::Tuple(items) => std::mem::take(items).into_iter().map(from_value).collect(),
        _ => vec![from_value(args)],
    };
    let body = body.borrow().clone();
    let out: Dynamic = body.call(&engine, &ast, args)?;
    let value = into_value(out);
    if let Some(type_name) = first_opaque(&value) {
        return Err(runtime_error(format!(
            "a compiled function returns arrays, scalars, lists, maps and nodes; this one \
             returned a `{type_name}`"
        )));
    }
    Ok(value)
}

/// Describes the first returned value that cannot be a graph output.
fn first_opaque(value: &Value) -> Option<String> {
    match value {
        Value::Opaque { type_name } => Some(type_name.clone()),
        Value::List(items) | Value::Tuple(items) => items.iter().find_map(first_opaque),
        Value::Map(map) => map.values().find_map(first_opaque),
        Value::Object { inner, .. } => first_opaque(inner),
        _ => None,
    }
}
