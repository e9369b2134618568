//! Control flow in scripts: `scan`, `fori_loop`, `while_loop`, `cond`,
//! `branch` (Kiln's `switch`: `switch` is a Rhai keyword), and the
//! `dynamic_slice` / `dynamic_update_slice` methods.
//! Bodies are script closures, traced once into one control-flow node of
//! the compiled graph (see `kiln::scan`). A closure's own error keeps its
//! script position: it is kept aside while Kiln unwinds and returned as
//! it was raised.

use super::values::{checked, from_value, kiln_result, runtime_error, to_value, ScriptResult};
use kiln::{Array, Branch, DType, ScanOptions, Value};
use rhai::{Dynamic, Engine, EvalAltResult, FnPtr, NativeCallContext, INT};
use std::cell::RefCell;

/// Calls the script closures of one construct, keeping the first script
/// error aside so that it reaches the script unchanged.
struct Caller<'a> {
    ctx: &'a NativeCallContext<'a>,
    op: &'static str,
    error: RefCell<Option<Box<EvalAltResult>>>,
}

impl<'a> Caller<'a> {
    fn new(ctx: &'a NativeCallContext<'a>, op: &'static str) -> Caller<'a> {
        Caller {
            ctx,
            op,
            error: RefCell::new(None),
        }
    }

    /// `f(args)` as a Kiln value; a script error becomes a Kiln error
    /// (and is kept for [`Caller::finish`]).
    fn call(&self, f: &FnPtr, args: Vec<Dynamic>) -> kiln::Result<Value> {
        match f.call_raw(self.ctx, None, args) {
            Ok(out) => Ok(to_value(&out)),
            Err(e) => {
                let message = e.to_string();
                self.error.borrow_mut().get_or_insert(e);
                Err(kiln::Error::InvalidArgument {
                    op: self.op.to_string(),
                    detail: format!("its closure failed: {message}"),
                    at: None,
                })
            }
        }
    }

    /// `f(args)` as a `[first, second]` pair, which a scan body returns.
    fn call_pair(&self, f: &FnPtr, args: Vec<Dynamic>, what: &str) -> kiln::Result<(Value, Value)> {
        let wrong = |got: &str| kiln::Error::InvalidArgument {
            op: self.op.to_string(),
            detail: format!("{what} must return [carry, y], got {got}"),
            at: None,
        };
        match self.call(f, args)?.into_list() {
            Ok(items) if items.len() == 2 => {
                let mut items = items.into_iter();
                let first = items.next().unwrap_or_default();
                Ok((first, items.next().unwrap_or_default()))
            }
            Ok(items) => Err(wrong(&format!("a list of {}", items.len()))),
            Err(other) => Err(wrong(&format!("a {}", other.type_name()))),
        }
    }

    /// The construct's result, or the script error a closure raised.
    fn finish<T>(self, result: kiln::Result<T>) -> ScriptResult<T> {
        match (result, self.error.into_inner()) {
            (Ok(value), _) => Ok(value),
            (Err(_), Some(script)) => Err(script),
            (Err(e), None) => kiln_result(self.op, Err(e)),
        }
    }
}

/// An integer scalar array from a script start: an array, or an integer.
fn start(value: &Dynamic) -> ScriptResult<Array> {
    if let Some(a) = value.read_lock::<Array>() {
        return Ok(a.clone());
    }
    match value.as_int() {
        Ok(i) => Ok(Array::scalar(i as f64, DType::I32)),
        Err(t) => Err(runtime_error(format!(
            "a start index is an integer or an integer scalar array, got a {t}"
        ))),
    }
}

fn starts(values: &rhai::Array) -> ScriptResult<Vec<Array>> {
    values.iter().map(start).collect()
}

/// Registers the control-flow functions and dynamic slicing methods.
pub(super) fn register(engine: &mut Engine) {
    engine.register_fn(
        "scan",
        |ctx: NativeCallContext, f: FnPtr, init: Dynamic, xs: Dynamic| {
            scan(&ctx, &f, &init, &xs, rhai::Map::new())
        },
    );
    engine.register_fn(
        "scan",
        |ctx: NativeCallContext, f: FnPtr, init: Dynamic, xs: Dynamic, options: rhai::Map| {
            scan(&ctx, &f, &init, &xs, options)
        },
    );
    engine.register_fn(
        "fori_loop",
        |ctx: NativeCallContext, lo: INT, hi: INT, f: FnPtr, init: Dynamic| {
            let caller = Caller::new(&ctx, "fori_loop");
            let bound = |v: INT| {
                i32::try_from(v).map_err(|_| {
                    runtime_error(format!("fori_loop bound {v} is not a 32-bit integer"))
                })
            };
            let result = kiln::fori_loop(
                bound(lo)?,
                bound(hi)?,
                |i, c: Value| caller.call(&f, vec![Dynamic::from(i), from_value(c)]),
                &to_value(&init),
            );
            caller.finish(result).map(from_value)
        },
    );
    engine.register_fn(
        "while_loop",
        |ctx: NativeCallContext, cond: FnPtr, body: FnPtr, init: Dynamic| {
            let caller = Caller::new(&ctx, "while_loop");
            let result = kiln::while_loop(
                |c: Value| match &caller.call(&cond, vec![from_value(c)])? {
                    Value::Array(pred) => Ok(pred.clone()),
                    other => Err(kiln::Error::InvalidArgument {
                        op: "while_loop".into(),
                        detail: format!(
                            "its condition must return a bool scalar array, got a {}",
                            other.type_name()
                        ),
                        at: None,
                    }),
                },
                |c: Value| caller.call(&body, vec![from_value(c)]),
                &to_value(&init),
            );
            caller.finish(result).map(from_value)
        },
    );
    engine.register_fn(
        "cond",
        |ctx: NativeCallContext, pred: Array, yes: FnPtr, no: FnPtr, operands: Dynamic| {
            let caller = Caller::new(&ctx, "cond");
            let result = kiln::cond(
                &checked(pred)?,
                |x: Value| caller.call(&yes, vec![from_value(x)]),
                |x: Value| caller.call(&no, vec![from_value(x)]),
                &to_value(&operands),
            );
            caller.finish(result).map(from_value)
        },
    );
    engine.register_fn(
        "branch",
        |ctx: NativeCallContext, index: Dynamic, branches: rhai::Array, operands: Dynamic| {
            let caller = Caller::new(&ctx, "switch");
            let fns: Vec<FnPtr> = branches
                .into_iter()
                .map(|b| {
                    let t = b.type_name();
                    b.try_cast::<FnPtr>().ok_or_else(|| {
                        runtime_error(format!("branch's branches are closures, got a {t}"))
                    })
                })
                .collect::<ScriptResult<_>>()?;
            let index = start(&index)?;
            let branches: Vec<Branch<Value, Value>> = fns
                .iter()
                .map(|f| {
                    let caller = &caller;
                    Box::new(move |x: Value| caller.call(f, vec![from_value(x)]))
                        as Branch<Value, Value>
                })
                .collect();
            let result = kiln::switch(&index, branches, &to_value(&operands));
            caller.finish(result).map(from_value)
        },
    );
    engine.register_fn(
        "dynamic_slice",
        |x: Array, at: rhai::Array, sizes: rhai::Array| -> ScriptResult<Array> {
            let sizes = sizes
                .iter()
                .map(|s| {
                    s.as_int()
                        .ok()
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or_else(|| {
                            runtime_error("dynamic_slice sizes are non-negative integers")
                        })
                })
                .collect::<ScriptResult<Vec<usize>>>()?;
            checked(x.dynamic_slice(&starts(&at)?, &sizes))
        },
    );
    engine.register_fn(
        "dynamic_update_slice",
        |x: Array, update: Array, at: rhai::Array| -> ScriptResult<Array> {
            checked(x.dynamic_update_slice(&update, &starts(&at)?))
        },
    );
}

/// `scan(f, init, xs, #{length, reverse})`: `[final carry, stacked ys]`.
fn scan(
    ctx: &NativeCallContext,
    f: &FnPtr,
    init: &Dynamic,
    xs: &Dynamic,
    options: rhai::Map,
) -> ScriptResult<Dynamic> {
    let mut scan_options = ScanOptions::default();
    for (key, value) in options {
        match key.as_str() {
            "length" => {
                let n = value
                    .as_int()
                    .ok()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| runtime_error("scan's length is a non-negative integer"))?;
                scan_options.length = Some(n);
            }
            "reverse" => {
                scan_options.reverse = value
                    .as_bool()
                    .map_err(|_| runtime_error("scan's reverse is true or false"))?;
            }
            other => {
                return Err(runtime_error(format!(
                    "scan has no option `{other}`; it takes `length` and `reverse`"
                )))
            }
        }
    }
    let caller = Caller::new(ctx, "scan");
    let result = kiln::scan_with(
        |c: Value, x: Value| caller.call_pair(f, vec![from_value(c), from_value(x)], "scan's body"),
        &to_value(init),
        &to_value(xs),
        scan_options,
    );
    let (carry, ys) = caller.finish(result)?;
    Ok(Dynamic::from_array(vec![from_value(carry), from_value(ys)]))
}
