//! Kiln's API as Rhai functions: constructors, ops as methods and
//! operators, `nn::` functions, `compile`, node classes, and `show`.
//!
//! Every binding surfaces Kiln's errors at once, so a script error points
//! at the line that made the bad array, not at a later use of it.

use super::function::{JacobianKind, Options, ScriptCompiled, Transform};
use super::nodes::{register_node, NodeSpec, ScriptObject};
use super::values::{checked, kiln_result, parse_dtype, runtime_error, ScriptResult};
use super::{ScriptLimits, Shared};
use crate::format::numpy_repr;
use crate::source::{call_argument, function_definitions, offset_of};
use kiln::random::Key;
use kiln::{at_location, nn, Array, DType, HostData, SourceLocation};
use rhai::module_resolvers::DummyModuleResolver;
use rhai::{Dynamic, Engine, FnPtr, ImmutableString, Module, NativeCallContext, FLOAT, INT};
use std::rc::Rc;
use web_time::Instant;

/// How often (in Rhai operations) the wall-clock limit is checked: reading
/// the clock costs far more than an operation.
const CLOCK_EVERY: u64 = 4096;

/// An engine with every limit set and Kiln's API registered.
pub(super) fn engine(shared: &Rc<Shared>, limits: &ScriptLimits) -> Engine {
    let mut engine = Engine::new();
    engine
        .set_max_operations(limits.max_operations)
        .set_max_call_levels(limits.max_call_levels)
        .set_max_expr_depths(limits.max_expr_depth, limits.max_function_expr_depth)
        .set_max_string_size(limits.max_string_size)
        .set_max_array_size(limits.max_array_size)
        .set_max_map_size(limits.max_map_size)
        .set_max_variables(limits.max_variables)
        .set_max_functions(limits.max_functions)
        .set_max_modules(limits.max_modules)
        .set_max_strings_interned(limits.max_strings_interned)
        // A page has no files, and natively a script must not read them.
        .set_module_resolver(DummyModuleResolver::new());
    engine.disable_symbol("eval");
    {
        let deadline = Rc::downgrade(shared);
        let limit = limits.time_limit;
        engine.on_progress(move |operations| {
            if operations % CLOCK_EVERY != 0 {
                return None;
            }
            let shared = deadline.upgrade()?;
            match shared.deadline.get() {
                Some(deadline) if Instant::now() > deadline => Some(Dynamic::from(format!(
                    "the run took longer than its {} s limit and was stopped",
                    limit.as_secs_f64()
                ))),
                _ => None,
            }
        });
    }
    {
        let log = Rc::downgrade(shared);
        engine.on_print(move |line| {
            if let Some(shared) = log.upgrade() {
                shared.log.borrow_mut().push(line.to_string());
            }
        });
    }
    register_arrays(&mut engine);
    register_ops(&mut engine);
    super::numpy::register(&mut engine);
    engine.register_static_module("nn", nn_module().into());
    register_compile(&mut engine, shared);
    register_nodes(&mut engine);
    super::custom::register(&mut engine, shared);
    super::quant::register(&mut engine);
    super::control::register(&mut engine);
    {
        let shared = shared.clone();
        engine.register_fn(
            "show",
            move |ctx: NativeCallContext, label: ImmutableString, value: Dynamic| {
                shared.show(label.to_string(), value, ctx.call_position());
            },
        );
    }
    engine
}

/// Runs `build` with the script position of the call `ctx` describes as
/// Kiln's current location, so the arrays it makes (and, in a trace, their
/// graph nodes) name the script line and column that asked for them.
pub(super) fn at<T>(ctx: &NativeCallContext, build: impl FnOnce() -> T) -> T {
    let position = ctx.call_position();
    let location = position
        .line()
        .zip(position.position())
        .map(|(line, column)| SourceLocation {
            line: line as u32,
            column: column as u32,
        });
    at_location(location, build)
}

/// A shape from a script array of non-negative integers.
pub(super) fn shape(dims: &rhai::Array) -> ScriptResult<Vec<usize>> {
    dims.iter()
        .map(|d| match d.as_int() {
            Ok(n) if n >= 0 => Ok(n as usize),
            _ => Err(runtime_error(format!(
                "a shape holds non-negative integers, got {d} in {dims:?}"
            ))),
        })
        .collect()
}

/// Integers (axes, a reshape target) from a script array.
fn integers(values: &rhai::Array, what: &str) -> ScriptResult<Vec<i64>> {
    values
        .iter()
        .map(|d| {
            d.as_int()
                .map_err(|_| runtime_error(format!("{what} holds integers, got {d}")))
        })
        .collect()
}

pub(super) fn axes(values: &rhai::Array) -> ScriptResult<Vec<isize>> {
    Ok(integers(values, "an axis list")?
        .into_iter()
        .map(|a| a as isize)
        .collect())
}

/// A nested script array of numbers or booleans as an array of `dtype`.
fn array_from_list(list: &rhai::Array, dtype: DType) -> ScriptResult<Array> {
    fn walk(
        item: &Dynamic,
        depth: usize,
        shape: &mut Vec<usize>,
        values: &mut Vec<f64>,
    ) -> ScriptResult<()> {
        if let Some(items) = item.read_lock::<rhai::Array>() {
            match shape.get(depth) {
                None if values.is_empty() || depth < shape.len() => shape.push(items.len()),
                Some(&n) if n == items.len() => {}
                _ => {
                    return Err(runtime_error(format!(
                        "array(...) needs a rectangular list: a list at depth {depth} has {} \
                         items, its siblings {:?}",
                        items.len(),
                        shape.get(depth)
                    )))
                }
            }
            return items
                .iter()
                .try_for_each(|i| walk(i, depth + 1, shape, values));
        }
        if depth != shape.len() {
            return Err(runtime_error(format!(
                "array(...) needs a rectangular list: a number at depth {depth}, other \
                 numbers at depth {}",
                shape.len()
            )));
        }
        let value = if let Ok(b) = item.as_bool() {
            f64::from(u8::from(b))
        } else if let Ok(i) = item.as_int() {
            i as f64
        } else if let Ok(x) = item.as_float() {
            x
        } else {
            return Err(runtime_error(format!(
                "array(...) takes numbers and booleans, got a {}",
                item.type_name()
            )));
        };
        values.push(value);
        Ok(())
    }
    let mut dims = Vec::new();
    let mut values = Vec::new();
    walk(
        &Dynamic::from_array(list.clone()),
        0,
        &mut dims,
        &mut values,
    )?;
    let len = values.len();
    let data = kiln_result(
        "array",
        HostData::try_from_f64s("array", dtype, len, values.into_iter()),
    )?;
    kiln_result("array", Array::from_data(data, &dims))
}

fn register_arrays(engine: &mut Engine) {
    engine.register_type_with_name::<Array>("ndarray");
    let f32 = DType::F32;
    engine
        .register_fn("zeros", move |ctx: NativeCallContext, s: rhai::Array| {
            at(&ctx, || checked(Array::zeros(&shape(&s)?, f32)))
        })
        .register_fn(
            "zeros",
            |ctx: NativeCallContext, s: rhai::Array, d: &str| {
                at(&ctx, || checked(Array::zeros(&shape(&s)?, parse_dtype(d)?)))
            },
        )
        .register_fn("ones", move |ctx: NativeCallContext, s: rhai::Array| {
            at(&ctx, || checked(Array::ones(&shape(&s)?, f32)))
        })
        .register_fn("ones", |ctx: NativeCallContext, s: rhai::Array, d: &str| {
            at(&ctx, || checked(Array::ones(&shape(&s)?, parse_dtype(d)?)))
        })
        .register_fn(
            "full",
            move |ctx: NativeCallContext, s: rhai::Array, v: FLOAT| {
                at(&ctx, || checked(Array::full(&shape(&s)?, v, f32)))
            },
        )
        .register_fn(
            "full",
            |ctx: NativeCallContext, s: rhai::Array, v: FLOAT, d: &str| {
                at(&ctx, || {
                    checked(Array::full(&shape(&s)?, v, parse_dtype(d)?))
                })
            },
        )
        .register_fn(
            "arange",
            move |ctx: NativeCallContext, start: FLOAT, stop: FLOAT, step: FLOAT| {
                at(&ctx, || {
                    kiln_result("arange", Array::arange(start, stop, step, f32))
                })
            },
        )
        .register_fn(
            "arange",
            |ctx: NativeCallContext, start: FLOAT, stop: FLOAT, step: FLOAT, d: &str| {
                at(&ctx, || {
                    kiln_result("arange", Array::arange(start, stop, step, parse_dtype(d)?))
                })
            },
        )
        .register_fn("array", move |ctx: NativeCallContext, l: rhai::Array| {
            at(&ctx, || array_from_list(&l, f32))
        })
        .register_fn(
            "array",
            |ctx: NativeCallContext, l: rhai::Array, d: &str| {
                at(&ctx, || array_from_list(&l, parse_dtype(d)?))
            },
        )
        .register_fn("scalar", move |ctx: NativeCallContext, v: FLOAT| {
            at(&ctx, || checked(Array::scalar(v, f32)))
        })
        .register_fn(
            "random_normal",
            move |ctx: NativeCallContext, seed: INT, s: rhai::Array| {
                at(&ctx, || {
                    kiln_result(
                        "random_normal",
                        Array::random_normal(Key::new(seed as u64), &shape(&s)?, f32),
                    )
                })
            },
        )
        .register_fn(
            "random_uniform",
            move |ctx: NativeCallContext, seed: INT, s: rhai::Array, low: FLOAT, high: FLOAT| {
                at(&ctx, || {
                    kiln_result(
                        "random_uniform",
                        Array::random_uniform(Key::new(seed as u64), &shape(&s)?, low, high, f32),
                    )
                })
            },
        )
        .register_get("shape", |a: &mut Array| -> rhai::Array {
            match a.dims() {
                Some(dims) => dims
                    .into_iter()
                    .map(|d| Dynamic::from_int(d as INT))
                    .collect(),
                // A shapeless trace: symbolic dims print as their symbols.
                None => a
                    .shape()
                    .to_string()
                    .trim_matches(|c| c == '[' || c == ']')
                    .split(',')
                    .map(|d| Dynamic::from(d.trim().to_string()))
                    .collect(),
            }
        })
        .register_get("dtype", |a: &mut Array| a.dtype().name().to_string())
        .register_get("ndim", |a: &mut Array| a.ndim() as INT)
        .register_fn("item", |a: &mut Array| {
            kiln_result("item", a.item::<f32>()).map(|v| v as FLOAT)
        })
        .register_fn("to_string", |a: &mut Array| {
            numpy_repr(a).unwrap_or_else(|e| format!("Array(error: {e})"))
        })
        .register_fn("to_debug", |a: &mut Array| format!("{a:?}"));
}

/// An op of two arrays.
type Binary = fn(&Array, &Array) -> Array;

/// Registers `name` for array ⊕ array, array ⊕ number and number ⊕ array.
fn register_binary(engine: &mut Engine, name: &str, op: Binary) {
    let scalar_like = |v: f64, other: &Array| Array::scalar(v, other.dtype());
    engine
        .register_fn(
            name,
            move |ctx: NativeCallContext, a: &mut Array, b: Array| at(&ctx, || checked(op(a, &b))),
        )
        .register_fn(
            name,
            move |ctx: NativeCallContext, a: &mut Array, b: FLOAT| {
                at(&ctx, || checked(op(a, &scalar_like(b, a))))
            },
        )
        .register_fn(
            name,
            move |ctx: NativeCallContext, a: &mut Array, b: INT| {
                at(&ctx, || checked(op(a, &scalar_like(b as f64, a))))
            },
        )
        .register_fn(name, move |ctx: NativeCallContext, a: FLOAT, b: Array| {
            at(&ctx, || checked(op(&scalar_like(a, &b), &b)))
        })
        .register_fn(name, move |ctx: NativeCallContext, a: INT, b: Array| {
            at(&ctx, || checked(op(&scalar_like(a as f64, &b), &b)))
        });
}

fn register_ops(engine: &mut Engine) {
    type Unary = fn(&Array) -> Array;
    let unary: [(&str, Unary); 12] = [
        ("neg", Array::neg),
        ("abs", Array::abs),
        ("exp", Array::exp),
        ("log", Array::log),
        ("sin", Array::sin),
        ("cos", Array::cos),
        ("tanh", Array::tanh),
        ("sqrt", Array::sqrt),
        ("rsqrt", Array::rsqrt),
        ("sigmoid", Array::sigmoid),
        ("relu", Array::relu),
        ("erf", Array::erf),
    ];
    for (name, op) in unary {
        engine.register_fn(name, move |ctx: NativeCallContext, a: &mut Array| {
            at(&ctx, || checked(op(a)))
        });
    }
    engine.register_fn("-", |ctx: NativeCallContext, a: &mut Array| {
        at(&ctx, || checked(Array::neg(a)))
    });
    let binary: [(&str, Binary); 22] = [
        ("+", |a, b| a + b),
        ("-", |a, b| a - b),
        ("*", |a, b| a * b),
        ("/", |a, b| a / b),
        ("**", |a, b| a.pow(b)),
        ("pow", |a, b| a.pow(b)),
        ("maximum", |a, b| a.maximum(b)),
        ("minimum", |a, b| a.minimum(b)),
        ("==", |a, b| a.equal(b)),
        ("!=", |a, b| a.not_equal(b)),
        ("<", |a, b| a.less(b)),
        ("<=", |a, b| a.less_equal(b)),
        (">", |a, b| a.greater(b)),
        (">=", |a, b| a.greater_equal(b)),
        ("equal", |a, b| a.equal(b)),
        ("not_equal", |a, b| a.not_equal(b)),
        ("less", |a, b| a.less(b)),
        ("less_equal", |a, b| a.less_equal(b)),
        ("greater", |a, b| a.greater(b)),
        ("greater_equal", |a, b| a.greater_equal(b)),
        ("matmul", |a, b| a.matmul(b)),
        ("@", |a, b| a.matmul(b)),
    ];
    for (name, op) in binary {
        register_binary(engine, name, op);
    }
    engine
        .register_custom_operator("@", 180)
        .map(|_| ())
        .unwrap_or_else(|e| unreachable!("`@` is a reserved symbol Rhai lets operators take: {e}"));
    engine
        .register_fn(
            "select",
            |ctx: NativeCallContext, c: Array, t: Array, f: Array| {
                at(&ctx, || checked(kiln::select(&c, &t, &f)))
            },
        )
        .register_fn(
            "select",
            |ctx: NativeCallContext, c: Array, t: FLOAT, f: FLOAT| {
                at(&ctx, || checked(kiln::select(&c, t, f)))
            },
        )
        .register_fn("cast", |ctx: NativeCallContext, a: &mut Array, d: &str| {
            at(&ctx, || checked(a.cast(parse_dtype(d)?)))
        });
    for (name, op) in [
        ("sum", Array::sum as Reduce),
        ("max", Array::max),
        ("min", Array::min),
        ("mean", Array::mean),
    ] {
        register_reduction(engine, name, op);
    }
    engine
        .register_fn(
            "argmax",
            |ctx: NativeCallContext, a: &mut Array, axis: INT| {
                at(&ctx, || checked(a.argmax(axis as isize, false)))
            },
        )
        .register_fn(
            "argmax",
            |ctx: NativeCallContext, a: &mut Array, axis: INT, keep: bool| {
                at(&ctx, || checked(a.argmax(axis as isize, keep)))
            },
        )
        .register_fn(
            "reshape",
            |ctx: NativeCallContext, a: &mut Array, s: rhai::Array| {
                at(&ctx, || {
                    checked(a.reshape(&integers(&s, "a reshape target")?))
                })
            },
        )
        .register_fn(
            "permute",
            |ctx: NativeCallContext, a: &mut Array, p: rhai::Array| {
                at(&ctx, || checked(a.permute(&shape(&p)?)))
            },
        )
        .register_fn("transpose", |ctx: NativeCallContext, a: &mut Array| {
            at(&ctx, || checked(a.transpose()))
        })
        .register_get("T", |a: &mut Array| checked(a.transpose()))
        .register_fn(
            "swap_axes",
            |ctx: NativeCallContext, a: &mut Array, x: INT, y: INT| {
                at(&ctx, || checked(a.swap_axes(x as isize, y as isize)))
            },
        )
        .register_fn(
            "broadcast_to",
            |ctx: NativeCallContext, a: &mut Array, s: rhai::Array| {
                at(&ctx, || checked(a.broadcast_to(shape(&s)?.as_slice())))
            },
        )
        .register_fn(
            "slice",
            |ctx: NativeCallContext, a: &mut Array, axis: INT, start: INT, stop: INT| {
                at(&ctx, || {
                    checked(a.slice_axis(axis as isize, start, Some(stop), 1))
                })
            },
        )
        .register_fn(
            "slice",
            |ctx: NativeCallContext, a: &mut Array, axis: INT, start: INT, stop: INT, step: INT| {
                at(&ctx, || {
                    checked(a.slice_axis(axis as isize, start, Some(stop), step))
                })
            },
        )
        .register_fn(
            "expand_dims",
            |ctx: NativeCallContext, a: &mut Array, axis: INT| {
                at(&ctx, || checked(a.expand_dims(axis as isize)))
            },
        )
        .register_fn(
            "squeeze",
            |ctx: NativeCallContext, a: &mut Array, ax: rhai::Array| {
                at(&ctx, || checked(a.squeeze(&axes(&ax)?)))
            },
        )
        .register_fn(
            "take",
            |ctx: NativeCallContext, a: &mut Array, i: Array, axis: INT| {
                at(&ctx, || checked(a.take(&i, axis as isize)))
            },
        )
        .register_fn(
            "concat",
            |ctx: NativeCallContext, items: rhai::Array, axis: INT| {
                at(&ctx, || {
                    checked(kiln::concat(
                        &list_of_arrays("concat", items)?,
                        axis as isize,
                    ))
                })
            },
        );
}

/// The arrays of a script list, or an error naming `op` and the first
/// item that is not one.
/// A reduction over some axes of an array, keeping them or not.
pub(super) type Reduce = fn(&Array, &[isize], bool) -> Array;

/// Binds reduction `name` in its four script forms: over every axis,
/// over a list of axes (keeping them or not), and over one axis.
pub(super) fn register_reduction(engine: &mut Engine, name: &str, op: Reduce) {
    engine
        .register_fn(name, move |ctx: NativeCallContext, a: &mut Array| {
            at(&ctx, || {
                let all: Vec<isize> = (0..a.ndim() as isize).collect();
                checked(op(a, &all, false))
            })
        })
        .register_fn(
            name,
            move |ctx: NativeCallContext, a: &mut Array, ax: rhai::Array| {
                at(&ctx, || checked(op(a, &axes(&ax)?, false)))
            },
        )
        .register_fn(
            name,
            move |ctx: NativeCallContext, a: &mut Array, ax: rhai::Array, keep: bool| {
                at(&ctx, || checked(op(a, &axes(&ax)?, keep)))
            },
        )
        .register_fn(
            name,
            move |ctx: NativeCallContext, a: &mut Array, ax: INT| {
                at(&ctx, || checked(op(a, &[ax as isize], false)))
            },
        );
}

pub(super) fn list_of_arrays(op: &str, items: rhai::Array) -> ScriptResult<Vec<Array>> {
    items
        .into_iter()
        .map(|i| {
            let name = i.type_name();
            i.try_cast::<Array>()
                .ok_or_else(|| runtime_error(format!("{op} takes a list of arrays, got a {name}")))
        })
        .collect()
}

fn nn_module() -> Module {
    let mut module = Module::new();
    module.set_native_fn("softmax", |ctx: NativeCallContext, x: Array, axis: INT| {
        at(&ctx, || checked(nn::softmax(&x, axis as isize)))
    });
    module.set_native_fn(
        "log_softmax",
        |ctx: NativeCallContext, x: Array, axis: INT| {
            at(&ctx, || checked(nn::log_softmax(&x, axis as isize)))
        },
    );
    module.set_native_fn("gelu", |ctx: NativeCallContext, x: Array| {
        at(&ctx, || checked(nn::gelu(&x)))
    });
    module.set_native_fn("gelu_tanh", |ctx: NativeCallContext, x: Array| {
        at(&ctx, || checked(nn::gelu_tanh(&x)))
    });
    module.set_native_fn(
        "layer_norm",
        |ctx: NativeCallContext, x: Array, eps: FLOAT| {
            at(&ctx, || checked(nn::layer_norm(&x, None, None, eps)))
        },
    );
    module.set_native_fn(
        "layer_norm",
        |ctx: NativeCallContext, x: Array, w: Array, b: Array, eps: FLOAT| {
            at(&ctx, || {
                checked(nn::layer_norm(&x, Some(&w), Some(&b), eps))
            })
        },
    );
    register_nn_layers(&mut module);
    module
}

/// The `nn` functions models are built from, beyond the activations.
fn register_nn_layers(module: &mut Module) {
    module.set_native_fn("silu", |ctx: NativeCallContext, x: Array| {
        at(&ctx, || checked(nn::silu(&x)))
    });
    module.set_native_fn("causal_mask", |ctx: NativeCallContext, t: INT| {
        at(&ctx, || {
            let t = usize::try_from(t)
                .map_err(|_| runtime_error(format!("causal_mask takes a size ≥ 0, got {t}")))?;
            checked(nn::causal_mask(t))
        })
    });
    module.set_native_fn(
        "cross_entropy",
        |ctx: NativeCallContext, logits: Array, targets: Array| {
            at(&ctx, || checked(nn::cross_entropy(&logits, &targets, None)))
        },
    );
    module.set_native_fn(
        "rope",
        |ctx: NativeCallContext, x: Array, positions: Array, base: FLOAT| {
            at(&ctx, || checked(nn::rope(&x, &positions, base)))
        },
    );
    module.set_native_fn(
        "scaled_dot_product_attention",
        |ctx: NativeCallContext, q: Array, k: Array, v: Array| {
            at(&ctx, || {
                checked(nn::scaled_dot_product_attention(&q, &k, &v, None))
            })
        },
    );
    module.set_native_fn(
        "scaled_dot_product_attention",
        |ctx: NativeCallContext, q: Array, k: Array, v: Array, mask: Array| {
            at(&ctx, || {
                checked(nn::scaled_dot_product_attention(&q, &k, &v, Some(&mask)))
            })
        },
    );
}

/// `compile(|args| ...)` and the methods of its handle.
fn register_compile(engine: &mut Engine, shared: &Rc<Shared>) {
    engine.register_type_with_name::<ScriptCompiled>("Compiled");
    let make = |shared: &Rc<Shared>, transform: Transform| {
        let shared = shared.clone();
        move |ctx: &NativeCallContext, body: FnPtr| -> ScriptCompiled {
            let script = shared.source.borrow().clone();
            let position = ctx.call_position();
            let line = position.line().unwrap_or(0);
            // Falls back to the closure's name (a hash of its body) when
            // the call is not written `compile(...)`.
            let argument = position
                .position()
                .and_then(|column| offset_of(&script, line, column))
                .and_then(|at| call_argument(&script, at))
                .map(str::to_string)
                .unwrap_or_else(|| body.fn_name().to_string());
            let source = match transform {
                Transform::None => argument,
                _ => format!("{}({argument})", transform.name()),
            };
            ScriptCompiled {
                source: Rc::from(source),
                helpers: Rc::from(function_definitions(&script).join("\n")),
                line,
                body,
                options: Options {
                    transform: transform.clone(),
                    ..Options::default()
                },
            }
        }
    };
    {
        let compile = make(shared, Transform::None);
        engine.register_fn("compile", move |ctx: NativeCallContext, body: FnPtr| {
            compile(&ctx, body)
        });
    }
    // `compile(grad(f))` is `grad(f)`: a gradient is compiled already.
    engine.register_fn("compile", |h: ScriptCompiled| h);
    let first = vec![0];
    for (name, transform) in [
        (
            "grad",
            Transform::Grad {
                argnums: first.clone(),
            },
        ),
        (
            "value_and_grad",
            Transform::ValueAndGrad {
                argnums: first.clone(),
                has_aux: false,
            },
        ),
    ] {
        let plain = make(shared, transform.clone());
        engine.register_fn(name, move |ctx: NativeCallContext, body: FnPtr| {
            plain(&ctx, body)
        });
        let with_argnums = make(shared, transform);
        engine.register_fn(
            name,
            move |ctx: NativeCallContext, body: FnPtr, argnums: rhai::Array| {
                let argnums = shape(&argnums).map_err(|_| {
                    runtime_error(format!(
                        "{name}(f, argnums) takes argument positions like [0, 1], got {argnums:?}"
                    ))
                })?;
                if argnums.is_empty() {
                    return Err(runtime_error(format!(
                        "{name}(f, argnums) needs at least one argument position"
                    )));
                }
                let mut h = with_argnums(&ctx, body);
                match &mut h.options.transform {
                    Transform::Grad { argnums: a } | Transform::ValueAndGrad { argnums: a, .. } => {
                        *a = argnums
                    }
                    _ => {}
                }
                Ok::<_, Box<rhai::EvalAltResult>>(h)
            },
        );
    }
    register_transformations(engine, shared, &make);
    engine.register_fn("has_aux", |h: &mut ScriptCompiled| {
        let mut h = h.clone();
        match &mut h.options.transform {
            Transform::ValueAndGrad { has_aux, .. } => {
                *has_aux = true;
                Ok(h)
            }
            other => Err(runtime_error(format!(
                ".has_aux() applies to value_and_grad(...), not to {}(...)",
                other.name()
            ))),
        }
    });
    engine
        .register_fn("shapeless", |h: &mut ScriptCompiled| {
            let mut h = h.clone();
            h.options.shapeless = true;
            h
        })
        .register_fn("fusion", |h: &mut ScriptCompiled, enabled: bool| {
            let mut h = h.clone();
            h.options.fusion = enabled;
            h
        })
        .register_fn("donate", |h: &mut ScriptCompiled, paths: rhai::Array| {
            let mut h = h.clone();
            h.options.donate = paths
                .iter()
                .map(|p| {
                    p.clone().into_string().map_err(|t| {
                        runtime_error(format!(
                            "donate takes argument paths like \"args[0]\", got a {t}"
                        ))
                    })
                })
                .collect::<ScriptResult<Vec<_>>>()?;
            h.options.donate.sort();
            h.options.donate.dedup();
            Ok::<_, Box<rhai::EvalAltResult>>(h)
        })
        .register_fn("to_string", |h: &mut ScriptCompiled| {
            match h.options.transform {
                Transform::None => format!("compile({})", h.source),
                _ => h.source.to_string(),
            }
        });
    macro_rules! run_with {
        ($($arg:ident),*) => {{
            let shared = shared.clone();
            // The handle is taken by value: a closure capturing its own handle
            // must still read it while the call runs.
            engine.register_fn("run", move |h: ScriptCompiled, $($arg: Dynamic),*| {
                shared.function_for(&h).call(vec![$($arg),*])
            });
        }};
    }
    run_with!();
    run_with!(a);
    run_with!(a, b);
    run_with!(a, b, c);
    run_with!(a, b, c, d);
    run_with!(a, b, c, d, e);
}

/// `transform` applied to a function that is already a compiled or
/// transformed handle (`vmap(grad(f))`): its transform becomes the inner one.
fn wrapped(
    h: &ScriptCompiled,
    transform: impl FnOnce(Box<Transform>) -> Transform,
) -> ScriptCompiled {
    let mut h = h.clone();
    let inner = std::mem::take(&mut h.options.transform);
    let written = match inner {
        Transform::None => format!("compile({})", h.source),
        _ => h.source.to_string(),
    };
    h.options.transform = transform(Box::new(inner));
    h.source = Rc::from(format!("{}({written})", h.options.transform.name()));
    h
}

/// A script's `in_axes` (`[0, (), 1]`) or `out_axis` (`0` or `()`).
fn axis_of(value: &Dynamic, what: &str) -> ScriptResult<Option<i64>> {
    if value.is_unit() {
        return Ok(None);
    }
    value.as_int().map(Some).map_err(|t| {
        runtime_error(format!(
            "vmap's {what} holds axes (integers) or () for a shared argument, got a {t}"
        ))
    })
}

/// `vmap`, `jvp`, `jacfwd`, `jacrev` and `hessian`: of a closure, or of a
/// compiled or transformed function (they compose: `vmap(grad(f))`).
fn register_transformations<Make, Handle>(engine: &mut Engine, shared: &Rc<Shared>, make: &Make)
where
    Make: Fn(&Rc<Shared>, Transform) -> Handle,
    Handle: Fn(&NativeCallContext, FnPtr) -> ScriptCompiled + 'static,
{
    let vmap = |in_axes: Vec<Option<i64>>, out_axis: Option<i64>| {
        move |inner: Box<Transform>| Transform::Vmap {
            in_axes: in_axes.clone(),
            out_axis,
            inner,
        }
    };
    let axes = |list: &rhai::Array| -> ScriptResult<Vec<Option<i64>>> {
        list.iter().map(|a| axis_of(a, "in_axes")).collect()
    };
    let plain = make(shared, vmap(Vec::new(), Some(0))(Box::default()));
    engine.register_fn("vmap", move |ctx: NativeCallContext, f: FnPtr| {
        plain(&ctx, f)
    });
    engine.register_fn("vmap", move |h: ScriptCompiled| {
        wrapped(&h, vmap(Vec::new(), Some(0)))
    });
    let with_axes = make(shared, Transform::None);
    engine.register_fn(
        "vmap",
        move |ctx: NativeCallContext, f: FnPtr, in_axes: rhai::Array| {
            let mut h = with_axes(&ctx, f);
            h.options.transform = vmap(axes(&in_axes)?, Some(0))(Box::default());
            h.source = Rc::from(format!("vmap({})", h.source));
            Ok::<_, Box<rhai::EvalAltResult>>(h)
        },
    );
    engine.register_fn("vmap", move |h: ScriptCompiled, in_axes: rhai::Array| {
        Ok::<_, Box<rhai::EvalAltResult>>(wrapped(&h, vmap(axes(&in_axes)?, Some(0))))
    });
    let with_both = make(shared, Transform::None);
    engine.register_fn(
        "vmap",
        move |ctx: NativeCallContext, f: FnPtr, in_axes: rhai::Array, out_axis: Dynamic| {
            let mut h = with_both(&ctx, f);
            h.options.transform =
                vmap(axes(&in_axes)?, axis_of(&out_axis, "out_axis")?)(Box::default());
            h.source = Rc::from(format!("vmap({})", h.source));
            Ok::<_, Box<rhai::EvalAltResult>>(h)
        },
    );
    engine.register_fn(
        "vmap",
        move |h: ScriptCompiled, in_axes: rhai::Array, out_axis: Dynamic| {
            Ok::<_, Box<rhai::EvalAltResult>>(wrapped(
                &h,
                vmap(axes(&in_axes)?, axis_of(&out_axis, "out_axis")?),
            ))
        },
    );
    for (name, kind) in [
        ("jacfwd", JacobianKind::Forward),
        ("jacrev", JacobianKind::Reverse),
        ("hessian", JacobianKind::Hessian),
    ] {
        let of = move |inner: Box<Transform>| Transform::Jacobian { kind, inner };
        let plain = make(shared, of(Box::default()));
        engine.register_fn(name, move |ctx: NativeCallContext, f: FnPtr| plain(&ctx, f));
        engine.register_fn(name, move |h: ScriptCompiled| wrapped(&h, of));
    }
    // `jvp(f, primals, tangents)` runs now: `[f(primals), J·tangents]`.
    let jvp = |inner: Box<Transform>| Transform::Jvp { inner };
    let pushed = make(shared, jvp(Box::default()));
    let session = shared.clone();
    engine.register_fn(
        "jvp",
        move |ctx: NativeCallContext, f: FnPtr, primals: rhai::Array, tangents: rhai::Array| {
            let h = pushed(&ctx, f);
            session
                .function_for(&h)
                .call(vec![primals.into(), tangents.into()])
        },
    );
    let session = shared.clone();
    engine.register_fn(
        "jvp",
        move |h: ScriptCompiled, primals: rhai::Array, tangents: rhai::Array| {
            let h = wrapped(&h, jvp);
            session
                .function_for(&h)
                .call(vec![primals.into(), tangents.into()])
        },
    );
}

/// Script classes: `register_node`, `node`, and field access.
fn register_nodes(engine: &mut Engine) {
    let names = |list: rhai::Array, what: &str| -> ScriptResult<Vec<String>> {
        list.into_iter()
            .map(|n| {
                n.into_string().map_err(|t| {
                    runtime_error(format!(
                        "register_node takes {what} names as strings, got a {t}"
                    ))
                })
            })
            .collect()
    };
    engine
        .register_type_with_name::<ScriptObject>("Object")
        .register_fn(
            "register_node",
            move |name: &str, children: rhai::Array, aux: rhai::Array| {
                let spec = NodeSpec {
                    children: names(children, "child")?,
                    aux: names(aux, "aux")?,
                };
                register_node(name, spec).map_err(runtime_error)
            },
        )
        .register_fn("node", |class: &str, fields: rhai::Map| ScriptObject {
            class: class.into(),
            fields,
        })
        .register_indexer_get(|o: &mut ScriptObject, field: &str| {
            o.fields.get(field).cloned().ok_or_else(|| {
                runtime_error(format!(
                    "an object of class `{}` has no field `{field}`",
                    o.class
                ))
            })
        })
        .register_indexer_set(|o: &mut ScriptObject, field: &str, value: Dynamic| {
            o.fields.insert(field.into(), value);
        })
        .register_get("class", |o: &mut ScriptObject| o.class.to_string());
}
