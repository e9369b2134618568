//! `compile(...)` in scripts: a handle with its options, and the compiled
//! functions a session keeps across runs, keyed by source text.

use super::values::{from_value, into_value, runtime_error, to_value, ScriptResult};
use super::{script_message, Shared};
use crate::report::{
    CallTiming, EntryKernels, FunctionReport, KeyDiff, PreviousRun, KEY_DIFF_ENTRIES,
};
use kiln::{AnyBackend, Array, CacheKey, Compiled, DType, Function, Report, Value, ValueParts};
use rhai::{Dynamic, EvalAltResult, FnPtr};
use std::cell::{Cell, RefCell};
use std::collections::hash_map::DefaultHasher;
use std::fmt::Write;
use std::hash::{Hash, Hasher};
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
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

/// The transformation a compiled script function applies to its closure:
/// `grad(f)`, `value_and_grad(f)`, `vmap(f)`, `jvp(f, ..)`, `jacfwd(f)`,
/// `jacrev(f)` and `hessian(f)` in scripts. The last four also take a
/// transformed function (`vmap(grad(f))`), which becomes their `inner`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Transform {
    /// The closure itself (`compile(f)`).
    #[default]
    None,
    /// `grad(f)` or `grad(f, argnums)`: the gradient with respect to the
    /// arguments at `argnums` (one gradient, or a list of them).
    Grad {
        /// The differentiated argument positions.
        argnums: Vec<usize>,
    },
    /// `value_and_grad(f)`: `[loss, gradient]`; with `.has_aux()` the
    /// closure returns `[loss, aux]` and the result is
    /// `[[loss, aux], gradient]`.
    ValueAndGrad {
        /// The differentiated argument positions.
        argnums: Vec<usize>,
        /// Whether the closure returns `[loss, aux]`.
        has_aux: bool,
    },
    /// `vmap(f, in_axes, out_axis)`: `f` mapped over a batch axis of each
    /// argument (`None`: shared by every example).
    Vmap {
        /// Per argument position, its batch axis (missing positions: 0).
        in_axes: Vec<Option<i64>>,
        /// Where the outputs get the batch axis (`None`: shared).
        out_axis: Option<i64>,
        /// What `f` already is.
        inner: Box<Transform>,
    },
    /// `jvp(f, primals, tangents)`: `[f(primals), J·tangents]`; its
    /// arguments are the list of primals and the list of tangents.
    Jvp {
        /// What `f` already is.
        inner: Box<Transform>,
    },
    /// `jacfwd(f)`, `jacrev(f)` or `hessian(f)` with respect to argument 0.
    Jacobian {
        /// Which one.
        kind: JacobianKind,
        /// What `f` already is.
        inner: Box<Transform>,
    },
}

/// The Jacobians scripts take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JacobianKind {
    /// `jacfwd(f)`: forward mode.
    Forward,
    /// `jacrev(f)`: reverse mode.
    Reverse,
    /// `hessian(f)`: `jacfwd(jacrev(f))`.
    Hessian,
}

impl Transform {
    /// The name scripts call it by (`compile`, `grad`, `value_and_grad`).
    pub fn name(&self) -> &'static str {
        match self {
            Transform::None => "compile",
            Transform::Grad { .. } => "grad",
            Transform::ValueAndGrad { .. } => "value_and_grad",
            Transform::Vmap { .. } => "vmap",
            Transform::Jvp { .. } => "jvp",
            Transform::Jacobian { kind, .. } => match kind {
                JacobianKind::Forward => "jacfwd",
                JacobianKind::Reverse => "jacrev",
                JacobianKind::Hessian => "hessian",
            },
        }
    }
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
    /// `grad(...)` or `value_and_grad(...)` instead of `compile(...)`.
    pub transform: Transform,
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
            transform: options.transform.clone(),
        }
    }
}

impl Default for Options {
    fn default() -> Options {
        Options {
            shapeless: false,
            fusion: true,
            donate: Vec::new(),
            transform: Transform::None,
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
        // Reading a value back from a GPU inside a run is not possible in
        // a browser: such a capture makes a key of its own, so the
        // function gets a fresh cache rather than another value's graph.
        Value::Array(a) if a.device_name().is_some() => {
            static UNIQUE: AtomicU64 = AtomicU64::new(0);
            let _ = write!(
                out,
                "{}@device#{}",
                a.aval(),
                UNIQUE.fetch_add(1, Ordering::Relaxed)
            );
        }
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
    /// Runs on the default device the session had when it was made (the
    /// device is part of the session's key for it).
    compiled: Compiled<Value, Value, Traced, AnyBackend>,
    source: Rc<str>,
    options: Options,
    line: Cell<usize>,
    /// The closure of the current run: what a trace calls.
    body: Rc<RefCell<FnPtr>>,
    /// The script error that made the last trace fail: Kiln only sees an
    /// output that is not a tree, the script wants the error itself.
    failure: Rc<RefCell<Option<Box<EvalAltResult>>>>,
    calls: RefCell<Vec<CallTiming>>,
    /// The session: its counter of timed device calls, if any.
    session: Weak<Shared>,
    /// The run that last called it, to drop functions no run uses.
    pub(super) last_run: Cell<u64>,
}

impl ScriptFunction {
    pub(super) fn new(shared: &Rc<Shared>, handle: &ScriptCompiled) -> ScriptFunction {
        let body = Rc::new(RefCell::new(handle.body.clone()));
        let failure = Rc::new(RefCell::new(None));
        let options = handle.options.clone();
        let traced: Traced = {
            let shared = Rc::downgrade(shared);
            let body = body.clone();
            let failure = failure.clone();
            let transform = options.transform.clone();
            Box::new(move |args: Value| {
                let call = |args: Value| invoke(&shared, &body, args);
                match transformed(&transform, args, &call) {
                    Ok(out) => out,
                    Err(e) => {
                        failure.borrow_mut().get_or_insert(e);
                        Value::Opaque {
                            type_name: "failed script function".to_string(),
                        }
                    }
                }
            })
        };
        let mut compiled = kiln::compile::<Value, Value, Traced, _>(traced)
            .fusion(options.fusion)
            .with_backend(AnyBackend::default_device());
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
            session: Rc::downgrade(shared),
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
    /// takes over (so a donated temporary is written in place). The results
    /// stay on the device until the run reads them (a GPU's readback
    /// completes only after a browser worker yields).
    pub(super) fn call(&self, args: Vec<Dynamic>) -> ScriptResult<Dynamic> {
        let args = Value::Tuple(args.into_iter().map(into_value).collect());
        let misses = self.compiled.cache().misses;
        let counter = self
            .session
            .upgrade()
            .and_then(|s| s.device_calls.borrow().clone());
        let first = counter.as_ref().map(|count| count());
        let start = Instant::now();
        let result = self.compiled.call_deferred(args);
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let traced = self.compiled.cache().misses > misses;
        let device_calls = first.zip(counter.map(|count| count()));
        self.calls.borrow_mut().push(CallTiming {
            traced,
            ms,
            device_ms: None,
            device_calls,
        });
        let failure = self.failure.borrow_mut().take();
        // A failed trace is reported by the script's own error, whether
        // Kiln saw it fail (a trace) or returned the stand-in output (a
        // call inside another trace runs the function inline).
        match (failure, result) {
            (Some(script_error), _) => Err(script_error),
            (None, Ok(out)) => Ok(from_value(out)),
            (None, Err(e)) => Err(runtime_error(format!(
                "compiled function: {}",
                script_message(&e)
            ))),
        }
    }

    /// The function as this run leaves it (stored under `identity`), for
    /// the next run's diff; `None` while its cache is empty.
    pub(super) fn as_left(&self, identity: &str) -> Option<RunFunction> {
        let report = self.compiled.cache().reports.last()?.clone();
        let key = self.compiled.entry_key(report.entry).ok()?;
        Some(RunFunction {
            identity: identity.to_string(),
            source: self.source.clone(),
            options: self.options.clone(),
            line: self.line.get(),
            key,
            report,
        })
    }

    /// How this function differs from `previous`'s latest entry, per
    /// latest entry of its own: the [`PreviousRun`] its report carries.
    pub(super) fn against(&self, previous: &RunFunction) -> PreviousRun {
        let latest = self.compiled.cache().reports;
        let key_diffs = latest
            .iter()
            .rev()
            .take(KEY_DIFF_ENTRIES)
            .filter_map(|r| {
                let key = self.compiled.entry_key(r.entry).ok()?;
                Some(KeyDiff {
                    before: previous.report.entry,
                    after: r.entry,
                    reasons: previous.key.differences(&key),
                })
            })
            .collect();
        PreviousRun {
            line: previous.line,
            source_changed: *previous.source != *self.source || previous.options != self.options,
            report: previous.report.clone(),
            key_diffs,
        }
    }

    pub(super) fn report(&self) -> FunctionReport {
        let cache = self.compiled.cache();
        let kernels = cache
            .reports
            .iter()
            .map(|r| EntryKernels::of(r.entry, self.compiled.kernels(r.entry)))
            .collect();
        let latest: Vec<usize> = cache
            .reports
            .iter()
            .rev()
            .take(KEY_DIFF_ENTRIES)
            .map(|r| r.entry)
            .collect();
        let key_diffs = latest
            .iter()
            .flat_map(|&before| latest.iter().map(move |&after| (before, after)))
            .filter(|(before, after)| before != after)
            .filter_map(|(before, after)| {
                let reasons = self.compiled.key_difference(before, after).ok()?;
                Some(KeyDiff {
                    before,
                    after,
                    reasons,
                })
            })
            .collect();
        FunctionReport {
            source: self.source.to_string(),
            line: self.line.get(),
            shapeless: self.options.shapeless,
            fusion: self.options.fusion,
            donate: self.options.donate.clone(),
            cache,
            calls: self.calls.borrow().clone(),
            kernels,
            key_diffs,
            previous: None,
        }
    }
}

/// A compiled function as a run left it: what the next run's diff view
/// compares against.
pub(super) struct RunFunction {
    /// The session's key of the function (device, source text, options,
    /// captured values).
    pub(super) identity: String,
    source: Rc<str>,
    options: Options,
    /// The script line of its `compile(...)` call in that run.
    line: usize,
    /// Its latest entry's cache key and report.
    key: CacheKey,
    report: Arc<Report>,
}

/// `call` (the script closure) under `transform`, on traced arguments.
fn transformed(
    transform: &Transform,
    args: Value,
    call: &dyn Fn(Value) -> ScriptResult<Value>,
) -> ScriptResult<Value> {
    let (argnums, has_aux) = match transform {
        Transform::None => return call(args),
        Transform::Grad { argnums } => (argnums, false),
        Transform::ValueAndGrad { argnums, has_aux } => (argnums, *has_aux),
        Transform::Vmap {
            in_axes,
            out_axis,
            inner,
        } => return mapped(in_axes, *out_axis, inner, args, call),
        Transform::Jvp { inner } => return pushed_forward(inner, args, call),
        Transform::Jacobian { kind, inner } => return jacobian(*kind, inner, args, call),
    };
    let name = transform.name();
    // The first script error inside the differentiated closure; Kiln sees
    // a stand-in loss meanwhile (its result is dropped for the error).
    let failure = RefCell::new(None);
    let fail = |e: Box<EvalAltResult>| -> Array {
        failure.borrow_mut().get_or_insert(e);
        Array::scalar(0.0, DType::F32)
    };
    let wrt: Vec<String> = argnums.iter().map(|i| format!("args[{i}]")).collect();
    let result = match transform {
        Transform::Grad { .. } => {
            let loss = |args: Value| {
                call(args)
                    .and_then(|v| loss_array(name, v))
                    .unwrap_or_else(fail)
            };
            kiln::grad(loss)
                .wrt(wrt)
                .apply(args)
                .map(|g| pick(g, argnums))
        }
        _ if has_aux => {
            let loss = |args: Value| match call(args).and_then(|v| loss_and_aux(name, v)) {
                Ok(pair) => pair,
                Err(e) => (fail(e), Value::None),
            };
            kiln::value_and_grad(loss)
                .wrt(wrt)
                .has_aux()
                .apply(args)
                .map(|((loss, aux), g)| {
                    Value::List(vec![
                        Value::List(vec![Value::Array(loss), aux]),
                        pick(g, argnums),
                    ])
                })
        }
        _ => {
            let loss = |args: Value| {
                call(args)
                    .and_then(|v| loss_array(name, v))
                    .unwrap_or_else(fail)
            };
            kiln::value_and_grad(loss)
                .wrt(wrt)
                .apply(args)
                .map(|(loss, g)| Value::List(vec![Value::Array(loss), pick(g, argnums)]))
        }
    };
    if let Some(e) = failure.into_inner() {
        return Err(e);
    }
    result.map_err(|e| runtime_error(format!("{name}: {}", script_message(&e))))
}

/// Runs `f` (the closure `call` under `inner`) inside a Kiln transformation
/// that calls it on traced values: the first script error it raises is
/// kept, and the transformation sees a stand-in meanwhile.
struct Inner<'a> {
    inner: &'a Transform,
    call: &'a dyn Fn(Value) -> ScriptResult<Value>,
    failure: RefCell<Option<Box<EvalAltResult>>>,
}

impl<'a> Inner<'a> {
    fn new(inner: &'a Transform, call: &'a dyn Fn(Value) -> ScriptResult<Value>) -> Self {
        Inner {
            inner,
            call,
            failure: RefCell::new(None),
        }
    }

    /// `f(args)`, or `stand_in` after keeping the error.
    fn value(&self, args: Value, stand_in: impl FnOnce() -> Value) -> Value {
        match transformed(self.inner, args, self.call) {
            Ok(v) => v,
            Err(e) => {
                self.failure.borrow_mut().get_or_insert(e);
                stand_in()
            }
        }
    }

    /// `f(args)` as one array (what a Jacobian differentiates).
    fn array(&self, name: &str, args: Value) -> Array {
        match self.value(args, || Value::None).into_parts() {
            ValueParts::Array(a) => a,
            ValueParts::None => Array::scalar(0.0, DType::F32),
            other => {
                let e = runtime_error(format!(
                    "{name} takes a function returning one array, this one returned {}",
                    describe(&Value::from(other))
                ));
                self.failure.borrow_mut().get_or_insert(e);
                Array::scalar(0.0, DType::F32)
            }
        }
    }

    /// The script error if `f` raised one, else Kiln's result.
    fn finish(self, name: &str, result: kiln::Result<Value>) -> ScriptResult<Value> {
        if let Some(e) = self.failure.into_inner() {
            return Err(e);
        }
        result.map_err(|e| runtime_error(format!("{name}: {}", script_message(&e))))
    }
}

/// `vmap(f, in_axes, out_axis)` on traced arguments.
fn mapped(
    in_axes: &[Option<i64>],
    out_axis: Option<i64>,
    inner: &Transform,
    args: Value,
    call: &dyn Fn(Value) -> ScriptResult<Value>,
) -> ScriptResult<Value> {
    let f = Inner::new(inner, call);
    let spec: Vec<(String, Option<isize>)> = in_axes
        .iter()
        .enumerate()
        .map(|(i, a)| (format!("args[{i}]"), a.map(|a| a as isize)))
        .collect();
    let result = kiln::vmap(|a: Value| f.value(a, || Value::None))
        .in_axes(spec)
        .out_axes([("out", out_axis.map(|a| a as isize))])
        .apply(args);
    f.finish("vmap", result)
}

/// `jvp(f, primals, tangents)` on traced arguments: `[out, tangent]`.
fn pushed_forward(
    inner: &Transform,
    args: Value,
    call: &dyn Fn(Value) -> ScriptResult<Value>,
) -> ScriptResult<Value> {
    let as_args = |v: Value| match v.into_parts() {
        ValueParts::List(items) | ValueParts::Tuple(items) => Value::Tuple(items),
        one => Value::Tuple(vec![Value::from(one)]),
    };
    let ValueParts::Tuple(mut halves) = args.into_parts() else {
        return Err(runtime_error("jvp(f, primals, tangents) takes two lists"));
    };
    if halves.len() != 2 {
        return Err(runtime_error("jvp(f, primals, tangents) takes two lists"));
    }
    let tangents = as_args(halves.pop().unwrap_or(Value::None));
    let primals = as_args(halves.pop().unwrap_or(Value::None));
    let f = Inner::new(inner, call);
    let result = kiln::jvp(|p: Value| f.value(p, || Value::None), &primals, &tangents)
        .map(|(out, tangent)| Value::List(vec![out, tangent]));
    f.finish("jvp", result)
}

/// `jacfwd(f)`, `jacrev(f)` or `hessian(f)` with respect to argument 0.
fn jacobian(
    kind: JacobianKind,
    inner: &Transform,
    args: Value,
    call: &dyn Fn(Value) -> ScriptResult<Value>,
) -> ScriptResult<Value> {
    let name = Transform::Jacobian {
        kind,
        inner: Box::default(),
    }
    .name();
    let f = Inner::new(inner, call);
    let ValueParts::Tuple(items) = args.into_parts() else {
        return Err(runtime_error(format!("{name} takes a function of arrays")));
    };
    let result = match kind {
        JacobianKind::Forward => kiln::jacfwd(|a: Value| f.array(name, a))
            .apply(Value::Tuple(items))
            .map(|j| pick(j, &[0])),
        JacobianKind::Reverse => kiln::jacrev(|a: Value| f.array(name, a))
            .apply(Value::Tuple(items))
            .map(|j| pick(j, &[0])),
        JacobianKind::Hessian => {
            let Some(Value::Array(x)) = items.first() else {
                return Err(runtime_error(
                    "hessian(f) differentiates an array argument 0",
                ));
            };
            let rest = items[1..].to_vec();
            kiln::hessian(|x: Array| {
                let mut all = vec![Value::Array(x)];
                all.extend(rest.iter().cloned());
                f.array(name, Value::Tuple(all))
            })
            .apply(x.clone())
            .map(Value::Array)
        }
    };
    f.finish(name, result)
}

/// The gradients of the arguments at `argnums`: one, or a list.
fn pick(mut gradient: Value, argnums: &[usize]) -> Value {
    let Value::Tuple(items) = &mut gradient else {
        return gradient;
    };
    let mut items = std::mem::take(items);
    match argnums {
        [one] if *one < items.len() => items.swap_remove(*one),
        _ => {
            let picked = argnums
                .iter()
                .filter_map(|&i| items.get_mut(i).map(|g| std::mem::replace(g, Value::None)))
                .collect();
            Value::List(picked)
        }
    }
}

/// The loss a differentiated closure returned: a scalar array.
fn loss_array(name: &str, value: Value) -> ScriptResult<Array> {
    match &value {
        Value::Array(a) => Ok(a.clone()),
        other => Err(runtime_error(format!(
            "{name} differentiates a closure returning a scalar array, this one returned {}",
            describe(other)
        ))),
    }
}

/// The `[loss, aux]` a closure of `value_and_grad(...).has_aux()` returned.
fn loss_and_aux(name: &str, mut value: Value) -> ScriptResult<(Array, Value)> {
    if let Value::List(items) | Value::Tuple(items) = &mut value {
        if let [Value::Array(loss), aux] = items.as_mut_slice() {
            return Ok((loss.clone(), std::mem::replace(aux, Value::None)));
        }
    }
    Err(runtime_error(format!(
        "{name}(...).has_aux() needs a closure returning [loss, aux], this one returned {}",
        describe(&value)
    )))
}

fn describe(value: &Value) -> String {
    match value {
        Value::Array(a) => format!("an array {}", a.aval()),
        Value::List(items) | Value::Tuple(items) => format!("a list of {}", items.len()),
        Value::Map(_) => "a map".to_string(),
        Value::Object { class, .. } => format!("a `{class}`"),
        Value::None => "nothing".to_string(),
        other => format!("{other:?}"),
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
