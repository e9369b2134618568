//! The everyday `jax.numpy` names as Rhai functions: the compositions of
//! `kiln::ops::array_api` and `kiln::einsum`, the triangle, one-hot and
//! gather helpers, integer `arange`, and `x[i]` / `x[a..b]` indexing.

use super::api::{at, axes, list_of_arrays, register_reduction, shape};
use super::values::{checked, kiln_result, parse_dtype, runtime_error, ScriptResult};
use kiln::random::Key;
use kiln::{Array, DType};
use rhai::{Dynamic, Engine, NativeCallContext, FLOAT, INT};

pub(super) fn register(engine: &mut Engine) {
    register_constructors(engine);
    register_elementwise(engine);
    register_reductions(engine);
    register_layout(engine);
    register_indexing(engine);
}

fn register_constructors(engine: &mut Engine) {
    engine
        .register_fn("arange", |ctx: NativeCallContext, stop: INT| {
            at(&ctx, || {
                kiln_result("arange", Array::arange_i32(0, stop, 1))
            })
        })
        .register_fn("arange", |ctx: NativeCallContext, start: INT, stop: INT| {
            at(&ctx, || {
                kiln_result("arange", Array::arange_i32(start, stop, 1))
            })
        })
        .register_fn(
            "arange",
            |ctx: NativeCallContext, start: INT, stop: INT, step: INT| {
                at(&ctx, || {
                    kiln_result("arange", Array::arange_i32(start, stop, step))
                })
            },
        )
        .register_fn("arange", |ctx: NativeCallContext, stop: FLOAT| {
            at(&ctx, || {
                kiln_result("arange", Array::arange(0.0, stop, 1.0, DType::F32))
            })
        })
        .register_fn(
            "linspace",
            |ctx: NativeCallContext, start: FLOAT, stop: FLOAT, num: INT| {
                at(&ctx, || {
                    let num = count(num, "linspace")?;
                    kiln_result(
                        "linspace",
                        Array::linspace(start, stop, num, true, DType::F32),
                    )
                })
            },
        )
        .register_fn(
            "linspace",
            |ctx: NativeCallContext, start: FLOAT, stop: FLOAT, num: INT, endpoint: bool| {
                at(&ctx, || {
                    let num = count(num, "linspace")?;
                    kiln_result(
                        "linspace",
                        Array::linspace(start, stop, num, endpoint, DType::F32),
                    )
                })
            },
        )
        .register_fn("eye", |ctx: NativeCallContext, n: INT| {
            at(&ctx, || {
                checked(Array::eye(count(n, "eye")?, None, 0, DType::F32))
            })
        })
        .register_fn(
            "eye",
            |ctx: NativeCallContext, n: INT, m: INT, k: INT, dtype: &str| {
                at(&ctx, || {
                    let (n, m) = (count(n, "eye")?, count(m, "eye")?);
                    checked(Array::eye(n, Some(m), k, parse_dtype(dtype)?))
                })
            },
        )
        .register_fn(
            "random_randint",
            |ctx: NativeCallContext, seed: INT, s: rhai::Array, low: INT, high: INT| {
                at(&ctx, || {
                    kiln_result(
                        "random_randint",
                        Array::random_randint(
                            Key::new(seed as u64),
                            &shape(&s)?,
                            low,
                            high,
                            DType::I32,
                        ),
                    )
                })
            },
        )
        .register_fn("zeros_like", |ctx: NativeCallContext, a: &mut Array| {
            at(&ctx, || checked(a.zeros_like()))
        })
        .register_fn("ones_like", |ctx: NativeCallContext, a: &mut Array| {
            at(&ctx, || checked(a.ones_like()))
        })
        .register_fn(
            "where",
            |ctx: NativeCallContext, c: Array, t: Array, f: Array| {
                at(&ctx, || checked(kiln::select(&c, &t, &f)))
            },
        )
        .register_fn(
            "where",
            |ctx: NativeCallContext, c: Array, t: Array, f: FLOAT| {
                at(&ctx, || checked(kiln::select(&c, &t, f)))
            },
        )
        .register_fn(
            "where",
            |ctx: NativeCallContext, c: Array, t: FLOAT, f: Array| {
                at(&ctx, || checked(kiln::select(&c, t, &f)))
            },
        )
        .register_fn(
            "where",
            |ctx: NativeCallContext, c: Array, t: FLOAT, f: FLOAT| {
                at(&ctx, || checked(kiln::select(&c, t, f)))
            },
        );
}

/// A non-negative count from a script integer.
fn count(n: INT, what: &str) -> ScriptResult<usize> {
    usize::try_from(n).map_err(|_| runtime_error(format!("{what} takes a count ≥ 0, got {n}")))
}

/// An optional bound from a script value: a number, or `()` for none.
fn bound(value: &Dynamic, what: &str) -> ScriptResult<Option<f64>> {
    if value.is_unit() {
        return Ok(None);
    }
    value
        .as_float()
        .or_else(|_| value.as_int().map(|i| i as f64))
        .map(Some)
        .map_err(|_| {
            runtime_error(format!(
                "{what} takes numbers or () for no bound, got a {}",
                value.type_name()
            ))
        })
}

fn register_elementwise(engine: &mut Engine) {
    type Unary = fn(&Array) -> Array;
    let unary: [(&str, Unary); 7] = [
        ("square", Array::square),
        ("tan", Array::tan),
        ("sign", Array::sign),
        ("floor", Array::floor),
        ("round", Array::round),
        ("log1p", Array::log1p),
        ("flatten", Array::flatten),
    ];
    for (name, op) in unary {
        engine.register_fn(name, move |ctx: NativeCallContext, a: &mut Array| {
            at(&ctx, || checked(op(a)))
        });
    }
    engine.register_fn(
        "clip",
        |ctx: NativeCallContext, a: &mut Array, min: Dynamic, max: Dynamic| {
            at(&ctx, || {
                checked(a.clip(bound(&min, "clip")?, bound(&max, "clip")?))
            })
        },
    );
    type Triangle = fn(&Array, i64) -> Array;
    for (name, op) in [("tril", Array::tril as Triangle), ("triu", Array::triu)] {
        engine
            .register_fn(name, move |ctx: NativeCallContext, a: &mut Array| {
                at(&ctx, || checked(op(a, 0)))
            })
            .register_fn(
                name,
                move |ctx: NativeCallContext, a: &mut Array, k: INT| at(&ctx, || checked(op(a, k))),
            );
    }
}

fn register_reductions(engine: &mut Engine) {
    register_reduction(engine, "logsumexp", Array::logsumexp);
    register_reduction(engine, "prod", Array::prod);
    type Moment = fn(&Array, &[isize], usize, bool) -> Array;
    // `var` is a Rhai keyword, so JAX's `var` is `variance` in scripts.
    for (name, op) in [("variance", Array::var as Moment), ("std", Array::std)] {
        engine
            .register_fn(name, move |ctx: NativeCallContext, a: &mut Array| {
                at(&ctx, || {
                    let all: Vec<isize> = (0..a.ndim() as isize).collect();
                    checked(op(a, &all, 0, false))
                })
            })
            .register_fn(
                name,
                move |ctx: NativeCallContext, a: &mut Array, ax: rhai::Array| {
                    at(&ctx, || checked(op(a, &axes(&ax)?, 0, false)))
                },
            )
            .register_fn(
                name,
                move |ctx: NativeCallContext,
                      a: &mut Array,
                      ax: rhai::Array,
                      ddof: INT,
                      keep: bool| {
                    at(&ctx, || {
                        checked(op(a, &axes(&ax)?, count(ddof, name)?, keep))
                    })
                },
            );
    }
    engine
        .register_fn(
            "argmin",
            |ctx: NativeCallContext, a: &mut Array, axis: INT| {
                at(&ctx, || checked(a.argmin(axis as isize, false)))
            },
        )
        .register_fn(
            "argmin",
            |ctx: NativeCallContext, a: &mut Array, axis: INT, keep: bool| {
                at(&ctx, || checked(a.argmin(axis as isize, keep)))
            },
        )
        .register_fn(
            "cumsum",
            |ctx: NativeCallContext, a: &mut Array, axis: INT| {
                at(&ctx, || checked(a.cumsum(axis as isize)))
            },
        )
        .register_fn("sort", |ctx: NativeCallContext, a: &mut Array| {
            at(&ctx, || checked(a.sort(-1)))
        })
        .register_fn(
            "sort",
            |ctx: NativeCallContext, a: &mut Array, axis: INT| {
                at(&ctx, || checked(a.sort(axis as isize)))
            },
        )
        .register_fn(
            "argsort",
            |ctx: NativeCallContext, a: &mut Array, axis: INT| {
                at(&ctx, || checked(a.argsort(axis as isize, false)))
            },
        )
        .register_fn(
            "argsort",
            |ctx: NativeCallContext, a: &mut Array, axis: INT, descending: bool| {
                at(&ctx, || checked(a.argsort(axis as isize, descending)))
            },
        )
        .register_fn("top_k", |ctx: NativeCallContext, a: &mut Array, k: INT| {
            at(&ctx, || -> ScriptResult<rhai::Array> {
                let (values, indices) = a.top_k(count(k, "top_k")?);
                Ok(vec![
                    Dynamic::from(checked(values)?),
                    Dynamic::from(checked(indices)?),
                ])
            })
        });
}

fn register_layout(engine: &mut Engine) {
    engine
        .register_fn(
            "transpose",
            |ctx: NativeCallContext, a: &mut Array, p: rhai::Array| {
                at(&ctx, || checked(a.permute(&shape(&p)?)))
            },
        )
        .register_fn(
            "stack",
            |ctx: NativeCallContext, items: rhai::Array, axis: INT| {
                at(&ctx, || {
                    checked(kiln::stack(&list_of_arrays("stack", items)?, axis as isize))
                })
            },
        )
        .register_fn(
            "split",
            |ctx: NativeCallContext, a: &mut Array, sections: INT, axis: INT| {
                at(&ctx, || {
                    parts(a.split(count(sections, "split")?, axis as isize))
                })
            },
        )
        .register_fn(
            "split",
            |ctx: NativeCallContext, a: &mut Array, indices: rhai::Array, axis: INT| {
                at(&ctx, || parts(a.split_at(&shape(&indices)?, axis as isize)))
            },
        )
        .register_fn(
            "tile",
            |ctx: NativeCallContext, a: &mut Array, reps: rhai::Array| {
                at(&ctx, || checked(a.tile(&shape(&reps)?)))
            },
        )
        .register_fn(
            "repeat",
            |ctx: NativeCallContext, a: &mut Array, n: INT, axis: INT| {
                at(&ctx, || {
                    checked(a.repeat(count(n, "repeat")?, axis as isize))
                })
            },
        )
        .register_fn(
            "pad",
            |ctx: NativeCallContext, a: &mut Array, w: rhai::Array| {
                at(&ctx, || checked(a.pad(&widths(&w)?, 0.0)))
            },
        )
        .register_fn(
            "pad",
            |ctx: NativeCallContext, a: &mut Array, w: rhai::Array, value: FLOAT| {
                at(&ctx, || checked(a.pad(&widths(&w)?, value)))
            },
        )
        .register_fn(
            "one_hot",
            |ctx: NativeCallContext, a: &mut Array, n: INT| {
                at(&ctx, || {
                    checked(a.one_hot(count(n, "one_hot")?, DType::F32))
                })
            },
        )
        .register_fn(
            "one_hot",
            |ctx: NativeCallContext, a: &mut Array, n: INT, dtype: &str| {
                at(&ctx, || {
                    checked(a.one_hot(count(n, "one_hot")?, parse_dtype(dtype)?))
                })
            },
        )
        .register_fn(
            "take_along_axis",
            |ctx: NativeCallContext, a: &mut Array, indices: Array, axis: INT| {
                at(&ctx, || checked(a.take_along_axis(&indices, axis as isize)))
            },
        )
        .register_fn(
            "einsum",
            |ctx: NativeCallContext, subscripts: &str, a: Array| {
                at(&ctx, || checked(kiln::einsum(subscripts, &[&a])))
            },
        )
        .register_fn(
            "einsum",
            |ctx: NativeCallContext, subscripts: &str, a: Array, b: Array| {
                at(&ctx, || checked(kiln::einsum(subscripts, &[&a, &b])))
            },
        );
}

/// The parts of a split as a script list, or the split's error.
fn parts(result: kiln::Result<Vec<Array>>) -> ScriptResult<rhai::Array> {
    let parts = kiln_result("split", result)?;
    parts
        .into_iter()
        .map(|p| checked(p).map(Dynamic::from))
        .collect()
}

/// `[[before, after], ...]` from a script list of pairs.
fn widths(pairs: &rhai::Array) -> ScriptResult<Vec<(usize, usize)>> {
    pairs
        .iter()
        .map(|pair| {
            let pair = pair
                .read_lock::<rhai::Array>()
                .map(|p| shape(&p))
                .transpose()?;
            match pair.as_deref() {
                Some(&[before, after]) => Ok((before, after)),
                _ => Err(runtime_error(
                    "pad takes a list of [before, after] pairs of counts, one per axis",
                )),
            }
        })
        .collect()
}

/// `x[i]` (the row at `i`, negative from the end) and `x[a..b]`,
/// `x[a..=b]` (rows `a` to `b`), along the first axis, as NumPy's basic
/// indexing; Rhai writes a range `a..b` where Python writes `a:b`.
fn register_indexing(engine: &mut Engine) {
    engine
        .register_indexer_get(|a: &mut Array, i: INT| -> ScriptResult<Array> {
            let n = first_axis(a)?;
            let row = if i < 0 { i + n } else { i };
            if !(0..n).contains(&row) {
                return Err(runtime_error(format!(
                    "index {i} is out of range for the first axis of size {n}"
                )));
            }
            checked(a.slice_axis(0, row, Some(row + 1), 1).squeeze(&[0]))
        })
        .register_indexer_get(
            |a: &mut Array, r: std::ops::Range<INT>| -> ScriptResult<Array> {
                has_rows(a)?;
                checked(a.slice_axis(0, r.start, Some(r.end), 1))
            },
        )
        .register_indexer_get(
            |a: &mut Array, r: std::ops::RangeInclusive<INT>| -> ScriptResult<Array> {
                has_rows(a)?;
                // `a..=-1` runs to the end, as `-1` is the last row.
                let end = match *r.end() {
                    -1 => None,
                    last => Some(last.saturating_add(1)),
                };
                checked(a.slice_axis(0, *r.start(), end, 1))
            },
        );
}

/// `Err` for a 0-d array, which has no rows to slice (a range of rows
/// needs no known size: a slice takes symbolic ones).
fn has_rows(a: &Array) -> ScriptResult<()> {
    match a.ndim() {
        0 => Err(runtime_error("cannot index a 0-d array")),
        _ => Ok(()),
    }
}

/// The known size of `a`'s first axis, or why a row of it cannot be
/// picked (a negative index needs the size).
fn first_axis(a: &Array) -> ScriptResult<INT> {
    match a.shape().dims().first() {
        Some(kiln::Dim::Known(n)) => Ok(*n as INT),
        Some(d) => Err(runtime_error(format!(
            "cannot index a first axis of symbolic size {d}; use slice or dynamic_slice"
        ))),
        None => Err(runtime_error("cannot index a 0-d array")),
    }
}
