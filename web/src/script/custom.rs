//! `custom_op(...)` and `kernel(...)` in scripts: Kiln's custom ops and user
//! kernels with script closures as their forward, vjp, shape rule,
//! reference and grid.
//!
//! Kiln calls these closures while it traces or evaluates, on the thread
//! that runs the script. The closures Kiln holds carry only the number of
//! a slot in a thread-local table; the slot holds the session and the
//! script closures of the latest run. An op or kernel is kept per
//! definition (name, closures, source), so a compiled function cached by
//! an earlier run still finds it, with this run's closures.

use super::values::{checked, from_value, into_value, runtime_error, to_value, ScriptResult};
use super::Shared;
use kiln::ops::kernel::{GridArgs, ReferenceArgs};
use kiln::{
    with_default_device, Array, Aval, CpuBackend, CustomOp, Dim, Error, HostData, Kernel,
    TemplateValue, Value,
};
use rhai::{Dynamic, Engine, FnPtr, Map, FLOAT, INT};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::sync::Arc;

/// The script side of one custom op or kernel.
struct Slot {
    shared: Weak<Shared>,
    /// The closures, by role (see the users of [`call_slot`]).
    closures: Vec<Option<FnPtr>>,
}

thread_local! {
    static SLOTS: RefCell<Vec<Slot>> = const { RefCell::new(Vec::new()) };
    static OPS: RefCell<HashMap<String, (usize, ScriptCustomOp)>> = RefCell::new(HashMap::new());
    static KERNELS: RefCell<HashMap<String, (usize, ScriptKernel)>> = RefCell::new(HashMap::new());
}

/// Definitions kept per thread; past this the tables start over.
const MAX_DEFINITIONS: usize = 256;

/// Stores the closures of a definition and returns its slot.
fn slot_for(existing: Option<usize>, shared: &Rc<Shared>, closures: Vec<Option<FnPtr>>) -> usize {
    SLOTS.with(|slots| {
        let mut slots = slots.borrow_mut();
        let slot = Slot {
            shared: Rc::downgrade(shared),
            closures,
        };
        match existing {
            Some(id) => {
                slots[id] = slot;
                id
            }
            None => {
                slots.push(slot);
                slots.len() - 1
            }
        }
    })
}

/// Calls closure `role` of slot `id` with `args`.
fn call_slot(id: usize, role: usize, args: Vec<Dynamic>) -> ScriptResult<Dynamic> {
    let (shared, closure) = SLOTS
        .with(|slots| {
            let slots = slots.borrow();
            let slot = slots.get(id)?;
            Some((slot.shared.upgrade()?, slot.closures.get(role)?.clone()?))
        })
        .ok_or_else(|| runtime_error("this definition's script is no longer running"))?;
    let (engine, ast) = shared.engine_and_ast()?;
    let _nested = shared.enter_nested()?;
    closure.call(&engine, &ast, args)
}

/// A script error as a Kiln error of `op`.
fn kiln_error(op: &str, e: Box<rhai::EvalAltResult>) -> Error {
    Error::InvalidArgument {
        op: op.to_string(),
        detail: format!("script error: {e}"),
        at: None,
    }
}

/// What `custom_op(...)` returns to a script.
#[derive(Clone)]
pub struct ScriptCustomOp {
    op: CustomOp<Value>,
    statics: Vec<String>,
}

/// What `kernel(...)` returns to a script.
#[derive(Clone)]
pub struct ScriptKernel {
    kernel: Kernel,
}

/// Registers `custom_op`, `kernel` and their `apply` methods (`call` is
/// Rhai's own method of function pointers).
pub(super) fn register(engine: &mut Engine, shared: &Rc<Shared>) {
    engine.register_type_with_name::<ScriptCustomOp>("CustomOp");
    engine.register_type_with_name::<ScriptKernel>("Kernel");
    {
        let shared = shared.clone();
        engine.register_fn("custom_op", move |name: &str, forward: FnPtr| {
            custom_op(&shared, name, forward, None, rhai::Array::new())
        });
    }
    {
        let shared = shared.clone();
        engine.register_fn(
            "custom_op",
            move |name: &str, forward: FnPtr, statics: rhai::Array| {
                custom_op(&shared, name, forward, None, statics)
            },
        );
    }
    {
        let shared = shared.clone();
        engine.register_fn(
            "custom_op",
            move |name: &str, forward: FnPtr, statics: rhai::Array, vjp: FnPtr| {
                custom_op(&shared, name, forward, Some(vjp), statics)
            },
        );
    }
    engine.register_fn("apply", |op: &mut ScriptCustomOp, args: Dynamic| {
        call_custom_op(op, args)
    });
    engine.register_fn("to_string", |op: &mut ScriptCustomOp| {
        format!("custom_op({})", op.op.name())
    });
    {
        let shared = shared.clone();
        engine.register_fn("kernel", move |spec: Map| kernel(&shared, spec));
    }
    macro_rules! call_kernel_with {
        ($($arg:ident),+) => {
            engine.register_fn("apply", |k: &mut ScriptKernel, $($arg: Array),+| {
                checked(k.kernel.call(&[$(&$arg),+]))
            });
        };
    }
    call_kernel_with!(a);
    call_kernel_with!(a, b);
    call_kernel_with!(a, b, c);
    call_kernel_with!(a, b, c, d);
    engine.register_fn("to_string", |k: &mut ScriptKernel| {
        format!("kernel({})", k.kernel.name())
    });
}

/// `custom_op(name, |args| ..., statics, |args, out, g| ...)`: the op over
/// one argument (a map, usually), whose fields at `statics` must be
/// static values (numbers, bools, strings).
fn custom_op(
    shared: &Rc<Shared>,
    name: &str,
    forward: FnPtr,
    vjp: Option<FnPtr>,
    statics: rhai::Array,
) -> ScriptResult<ScriptCustomOp> {
    let statics: Vec<String> = statics
        .into_iter()
        .map(|s| {
            s.into_string().map_err(|t| {
                runtime_error(format!(
                    "custom_op takes its static fields as paths like \"cfg.scale\", got a {t}"
                ))
            })
        })
        .collect::<ScriptResult<_>>()?;
    let key = format!(
        "{name}\n{}\n{}\n{statics:?}",
        forward.fn_name(),
        vjp.as_ref().map_or("", |v| v.fn_name())
    );
    let closures = vec![Some(forward), vjp.clone()];
    if let Some((id, op)) = OPS.with(|ops| ops.borrow().get(&key).cloned()) {
        slot_for(Some(id), shared, closures);
        return Ok(op);
    }
    let id = slot_for(None, shared, closures);
    let op_name = name.to_string();
    let mut op = CustomOp::new(name, move |args: &Value| {
        let out = call_slot(id, 0, vec![from_value(args.clone())])
            .map_err(|e| kiln_error(&op_name, e))?;
        match &into_value(out) {
            Value::Array(a) => Ok(a.clone()),
            other => Err(Error::InvalidArgument {
                op: op_name.clone(),
                detail: format!("the forward must return an array, it returned {other:?}"),
                at: None,
            }),
        }
    });
    if vjp.is_some() {
        let op_name = name.to_string();
        op = op.with_vjp(move |args: &Value, out: &Array, g: &Array| {
            let args = vec![
                from_value(args.clone()),
                Dynamic::from(out.clone()),
                Dynamic::from(g.clone()),
            ];
            let cotangent = call_slot(id, 1, args).map_err(|e| kiln_error(&op_name, e))?;
            Ok(into_value(cotangent))
        });
    }
    let handle = ScriptCustomOp { op, statics };
    OPS.with(|ops| {
        let mut ops = ops.borrow_mut();
        if ops.len() >= MAX_DEFINITIONS {
            ops.clear();
        }
        ops.insert(key, (id, handle.clone()));
    });
    Ok(handle)
}

/// `op.apply(args)`, checking the declared static fields first.
fn call_custom_op(op: &ScriptCustomOp, args: Dynamic) -> ScriptResult<Array> {
    let args = to_value(&args);
    for path in &op.statics {
        let mut at = &args;
        for field in path.split('.') {
            at = match at {
                Value::Map(map) => map.get(field),
                Value::Object { inner, .. } => match &**inner {
                    Value::Map(map) => map.get(field),
                    _ => None,
                },
                _ => None,
            }
            .ok_or_else(|| {
                runtime_error(format!(
                    "custom op `{}`: its arguments have no field `{path}`",
                    op.op.name()
                ))
            })?;
        }
        if !matches!(
            at,
            Value::Bool(_) | Value::Int(_) | Value::Float(_) | Value::Str(_)
        ) {
            return Err(runtime_error(format!(
                "custom op `{}`: `{path}` must be a static value (a number, bool or string), \
                 got {}",
                op.op.name(),
                match at {
                    Value::Array(a) => format!("an array {}", a.aval()),
                    other => format!("{other:?}"),
                }
            )));
        }
    }
    checked(op.op.call(&args))
}

/// A script shape: known dims as ints, symbolic ones as their names.
fn script_shape(aval: &Aval) -> Dynamic {
    let dims: rhai::Array = aval
        .shape
        .dims()
        .iter()
        .map(|d| match d.known() {
            Some(n) => Dynamic::from(n as INT),
            None => Dynamic::from(d.to_string()),
        })
        .collect();
    Dynamic::from(dims)
}

/// The dims a shape rule returned: ints, or names of the inputs' dims.
fn dims_from_script(kernel: &str, value: Dynamic, inputs: &[&Aval]) -> kiln::Result<Vec<Dim>> {
    let bad = |detail: String| Error::Kernel {
        kernel: kernel.to_string(),
        detail,
    };
    let list = value
        .try_cast::<rhai::Array>()
        .ok_or_else(|| bad("its shape rule must return a list of dims".into()))?;
    list.into_iter()
        .map(|d| {
            if let Ok(n) = d.as_int() {
                return usize::try_from(n)
                    .map(Dim::Known)
                    .map_err(|_| bad(format!("its shape rule returned the dim {n}")));
            }
            let name = d
                .into_string()
                .map_err(|t| bad(format!("its shape rule returned a {t} as a dim")))?;
            inputs
                .iter()
                .flat_map(|a| a.shape.dims())
                .find(|dim| dim.to_string() == name)
                .cloned()
                .ok_or_else(|| bad(format!("its shape rule returned `{name}`, no input's dim")))
        })
        .collect()
}

/// `kernel(#{ name, inputs, wgsl, shape, reference, grid?, templates?,
/// in_place? })`.
fn kernel(shared: &Rc<Shared>, spec: Map) -> ScriptResult<ScriptKernel> {
    let text = |key: &str| -> ScriptResult<String> {
        spec.get(key)
            .and_then(|v| v.clone().into_string().ok())
            .ok_or_else(|| runtime_error(format!("kernel(#{{...}}) needs `{key}` as a string")))
    };
    let closure = |key: &str| spec.get(key).and_then(|v| v.clone().try_cast::<FnPtr>());
    let name = text("name")?;
    let wgsl = text("wgsl")?;
    let inputs: Vec<String> = spec
        .get("inputs")
        .and_then(|v| v.clone().try_cast::<rhai::Array>())
        .ok_or_else(|| runtime_error("kernel(#{...}) needs `inputs`, a list of names"))?
        .into_iter()
        .map(|n| {
            n.into_string()
                .map_err(|t| runtime_error(format!("an input name is a {t}")))
        })
        .collect::<ScriptResult<_>>()?;
    let shape = closure("shape").ok_or_else(|| {
        runtime_error("kernel(#{...}) needs `shape`, its shape rule |shapes| ...")
    })?;
    let reference = closure("reference").ok_or_else(|| {
        runtime_error("kernel(#{...}) needs `reference`, its CPU evaluation |inputs...| ...")
    })?;
    let grid = closure("grid");
    let mut templates: Vec<(String, TemplateValue)> = Vec::new();
    if let Some(map) = spec
        .get("templates")
        .and_then(|v| v.clone().try_cast::<Map>())
    {
        for (k, v) in map {
            let value = if let Ok(b) = v.as_bool() {
                TemplateValue::Bool(b)
            } else if let Ok(i) = v.as_int() {
                TemplateValue::I32(i32::try_from(i).map_err(|_| {
                    runtime_error(format!("template `{k}` = {i} does not fit an i32"))
                })?)
            } else if let Ok(x) = v.as_float() {
                TemplateValue::F32(x as f32)
            } else {
                return Err(runtime_error(format!(
                    "template `{k}` must be a number or a bool"
                )));
            };
            templates.push((k.to_string(), value));
        }
    }
    let in_place = spec
        .get("in_place")
        .and_then(|v| v.clone().into_string().ok());
    let key = format!(
        "{name}\n{wgsl}\n{inputs:?}\n{}\n{}\n{}\n{templates:?}\n{in_place:?}",
        shape.fn_name(),
        reference.fn_name(),
        grid.as_ref().map_or("", |g| g.fn_name())
    );
    let closures = vec![Some(shape), Some(reference), grid.clone()];
    if let Some((id, kernel)) = KERNELS.with(|k| k.borrow().get(&key).cloned()) {
        slot_for(Some(id), shared, closures);
        return Ok(kernel);
    }
    let id = slot_for(None, shared, closures);
    let mut builder = Kernel::builder(name.clone(), inputs);
    {
        let name = name.clone();
        builder = builder.shape_rule(move |avals: &[&Aval], _| {
            let shapes: rhai::Array = avals.iter().map(|a| script_shape(a)).collect();
            let out =
                call_slot(id, 0, vec![Dynamic::from(shapes)]).map_err(|e| kiln_error(&name, e))?;
            let dims = dims_from_script(&name, out, avals)?;
            let dtype = avals.first().map_or(kiln::DType::F32, |a| a.dtype);
            Ok(Aval::new(dims, dtype))
        });
    }
    {
        let name = name.clone();
        builder = builder.reference(move |call: &ReferenceArgs| {
            // The reference is the CPU oracle: its eager ops run on the CPU
            // whatever the session's device.
            with_default_device(Arc::new(CpuBackend), || {
                let args = call
                    .inputs
                    .iter()
                    .zip(call.shapes)
                    .map(|(data, shape)| {
                        Array::from_data((*data).clone(), shape).map(Dynamic::from)
                    })
                    .collect::<kiln::Result<Vec<_>>>()?;
                let out = call_slot(id, 1, args).map_err(|e| kiln_error(&name, e))?;
                let array = out.try_cast::<Array>().ok_or_else(|| Error::Kernel {
                    kernel: name.clone(),
                    detail: "its reference must return an array".into(),
                })?;
                let data = array.cast(call.out_dtype).data()?;
                Ok(HostData::clone(&data))
            })
        });
    }
    if grid.is_some() {
        builder = builder.grid(move |call: &GridArgs| {
            let output: rhai::Array = call
                .output
                .iter()
                .map(|&d| Dynamic::from(d as INT))
                .collect();
            // A grid closure that fails or returns something else makes a
            // grid no adapter runs, so the plan is rejected (never a
            // launch that covers part of the output).
            let Some(groups) = call_slot(id, 2, vec![Dynamic::from(output)])
                .ok()
                .and_then(|v| v.try_cast::<rhai::Array>())
            else {
                return [u32::MAX; 3];
            };
            let mut grid = [1u32; 3];
            for (slot, g) in grid.iter_mut().zip(groups) {
                // A grid the adapter cannot run is rejected when the plan is
                // built; a bad value becomes such a grid, never a smaller one.
                *slot = g
                    .as_int()
                    .ok()
                    .or_else(|| g.as_float().ok().map(|f: FLOAT| f.ceil() as INT))
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or(u32::MAX);
            }
            grid
        });
    }
    for (k, v) in templates {
        builder = builder.template(k, v);
    }
    if let Some(input) = in_place {
        builder = builder.in_place(input);
    }
    let kernel = ScriptKernel {
        kernel: builder
            .wgsl(wgsl)
            .build()
            .map_err(|e| runtime_error(e.to_string()))?,
    };
    KERNELS.with(|k| {
        let mut k = k.borrow_mut();
        if k.len() >= MAX_DEFINITIONS {
            k.clear();
        }
        k.insert(key, (id, kernel.clone()));
    });
    Ok(kernel)
}
