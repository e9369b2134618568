//! `scatter_add`, the transpose of `take`: adds update rows into zeros
//! along one axis at integer positions. The user method, shape rule and
//! reference evaluation.

use super::batching::{dim_scalar, folded_indices, Batched};
use super::index::resolve_indices;
use super::strided::{eval_dtype_err, narrow, numel, widen, WrappingInt};
use super::{Op, ShapeCx};
use crate::data::HostData;
use crate::error::{arg_err, dtype_err, shape_err, Result};
use crate::handle::array::Array;
use crate::shape::{Aval, Dim, Shape};
use crate::DType;

const OP: &str = "scatter_add";

impl Array {
    /// Adds `self` (the updates) into zeros along `axis`, at `indices`: the
    /// transpose of [`Array::take`].
    ///
    /// `self.shape == out.shape[..axis] ++ indices.shape ++ out.shape[axis+1..]`,
    /// where `out.shape` is that with `indices.shape` replaced by `size`.
    /// Repeated indices accumulate; negative i32 indices wrap once as in
    /// `take`; an index out of range is a runtime error as in `take`. Bool
    /// updates are an error (a sum of bools is one in `sum` too).
    ///
    /// ```
    /// use kiln::Array;
    /// let updates = Array::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap();
    /// let indices = Array::from_vec(vec![2i32, 0, -1], &[3]).unwrap();
    /// // -1 is row 2, so rows 2 and -1 both add into it.
    /// let out = updates.scatter_add(&indices, 0, 3);
    /// assert_eq!(out.to_vec::<f32>().unwrap(), [2.0, 0.0, 4.0]);
    /// ```
    #[track_caller]
    pub fn scatter_add(&self, indices: &Array, axis: usize, size: impl Into<Dim>) -> Array {
        if indices.error().is_some() && self.error().is_none() {
            return indices.clone();
        }
        Array::apply(
            Op::ScatterAdd {
                axis,
                size: size.into(),
            },
            vec![self.clone(), indices.clone()],
        )
    }
}

/// The output aval: the updates' shape with the `indices.shape` block at
/// `axis` replaced by `size`; that block must equal `indices.shape` (a
/// guard where dims are symbolic). Indices must be i32 or u32, updates any
/// dtype but bool.
pub fn scatter_add_shape_rule(
    axis: usize,
    size: &Dim,
    updates: &Aval,
    indices: &Aval,
    cx: &mut ShapeCx,
) -> Result<Aval> {
    if !matches!(indices.dtype, DType::I32 | DType::U32) {
        return Err(dtype_err(
            OP,
            &[updates, indices],
            format!("indices must be i32 or u32, got {}", indices.dtype),
        ));
    }
    if updates.dtype == DType::Bool {
        return Err(dtype_err(
            OP,
            &[updates, indices],
            "cannot add bool updates",
        ));
    }
    let dims = updates.shape.dims();
    let index_dims = indices.shape.dims();
    let Some(end) = axis
        .checked_add(index_dims.len())
        .filter(|&end| end <= dims.len())
    else {
        return Err(shape_err(
            OP,
            &[updates, indices],
            format!(
                "axis {axis} with {} index dims does not fit updates of rank {}",
                index_dims.len(),
                dims.len()
            ),
        ));
    };
    for (k, (d, i)) in dims[axis..end].iter().zip(index_dims).enumerate() {
        if cx.unify(d, i).is_none() {
            return Err(shape_err(
                OP,
                &[updates, indices],
                format!(
                    "updates dim {d} at axis {} differs from index dim {i}",
                    axis + k
                ),
            ));
        }
    }
    let out = dims[..axis]
        .iter()
        .chain(std::iter::once(size))
        .chain(&dims[end..])
        .cloned()
        .collect();
    Ok(Aval::new(Shape(out), updates.dtype))
}

/// Reference scatter_add: for each outer block, index position `j` in
/// order and inner offset, adds the update into the output row the index
/// names. f16 and bf16 accumulate in f32 and round once (as `sum` does);
/// integers wrap.
pub fn scatter_add_eval(
    axis: usize,
    updates: &HostData,
    updates_shape: &[usize],
    indices: &HostData,
    out_shape: &[usize],
) -> Result<HostData> {
    let Some(&n) = out_shape.get(axis) else {
        return Err(arg_err(
            OP,
            format!("axis {axis} is out of range for output shape {out_shape:?}"),
        ));
    };
    let positions = resolve_indices(OP, axis, n, updates.dtype(), indices)?;
    let outer = numel(&out_shape[..axis]);
    let inner = numel(&out_shape[axis + 1..]);
    let rows = Rows {
        positions: &positions,
        outer,
        n,
        inner,
    };
    let expected = outer
        .checked_mul(positions.len())
        .and_then(|x| x.checked_mul(inner));
    if expected != Some(updates.len()) {
        return Err(arg_err(
            OP,
            format!(
                "{} updates of shape {updates_shape:?} do not fit {} indices into output {out_shape:?}",
                updates.len(),
                positions.len()
            ),
        ));
    }
    Ok(match updates {
        HostData::F32(v) => HostData::F32(rows.scatter(v, 0.0, |a, b| a + b)),
        HostData::F16(v) => HostData::F16(narrow(&rows.scatter(&widen(v), 0.0, |a, b| a + b))),
        HostData::BF16(v) => HostData::BF16(narrow(&rows.scatter(&widen(v), 0.0, |a, b| a + b))),
        HostData::I32(v) => HostData::I32(rows.scatter(v, 0, WrappingInt::add)),
        HostData::U32(v) => HostData::U32(rows.scatter(v, 0, WrappingInt::add)),
        HostData::U8(v) => HostData::U8(rows.scatter(v, 0, WrappingInt::add)),
        HostData::Bool(_) => {
            return Err(eval_dtype_err(
                OP,
                &[DType::Bool, indices.dtype()],
                "cannot add bool updates",
            ))
        }
    })
}

/// The `[outer, n, inner]` view of the output and the row each of the
/// updates' `[outer, positions.len(), inner]` rows adds into.
struct Rows<'a> {
    positions: &'a [usize],
    outer: usize,
    n: usize,
    inner: usize,
}

impl Rows<'_> {
    /// Sums `updates` into zeros; every output element receives its
    /// updates in increasing index position, the order the WGSL kernel
    /// adds them in, so f32 results agree bit for bit.
    fn scatter<T: Copy>(&self, updates: &[T], zero: T, add: impl Fn(T, T) -> T) -> Vec<T> {
        let Rows {
            positions,
            outer,
            n,
            inner,
        } = *self;
        let mut out = vec![zero; outer * n * inner];
        for o in 0..outer {
            for (j, &p) in positions.iter().enumerate() {
                let src = (o * positions.len() + j) * inner;
                let dst = (o * n + p) * inner;
                for r in 0..inner {
                    out[dst + r] = add(out[dst + r], updates[src + r]);
                }
            }
        }
        out
    }
}

/// The cotangents of `scatter_add(updates, indices)`: `g` taken back at the
/// indices, none for the indices.
pub(crate) fn vjp(axis: usize, indices: &Array, g: &Array) -> [Option<Array>; 2] {
    [Some(g.take(indices, axis as isize)), None]
}

/// The batched scatter_add: batched updates with shared indices scatter
/// along the shifted axis. When the indices are batched, the examples fold
/// into the output's scattered axis: each example's indices are offset to
/// its own `size` rows ([`folded_indices`]), the updates (index dims moved
/// next to the batch) scatter once into `B·size` rows, and those unfold
/// back to `[B, .., size, ..]`.
pub(crate) fn batch(
    axis: usize,
    rows: &Dim,
    updates: &Batched,
    indices: &Batched,
    size: &Dim,
) -> Batched {
    if indices.axis.is_none() {
        return Batched::along(
            Array::apply(
                Op::ScatterAdd {
                    axis: axis + 1,
                    size: rows.clone(),
                },
                vec![updates.front(), indices.value.clone()],
            ),
            0,
        );
    }
    let dtype = indices.value.dtype();
    let offsets = folded_indices(indices, &dim_scalar(rows, dtype), size, true);
    let index_rank = indices.rank();
    // [B, pre.., k.., rest..] → [B, k.., pre.., rest..]
    let values = updates.materialized(size);
    let mut perm = vec![0];
    perm.extend(1 + axis..1 + axis + index_rank);
    perm.extend(1..1 + axis);
    perm.extend(1 + axis + index_rank..values.ndim());
    let scattered = Array::apply(
        Op::ScatterAdd {
            axis: 0,
            size: size.mul(rows),
        },
        vec![values.permute(&perm), offsets],
    );
    // [B·rows, pre.., rest..] → [B, rows, pre.., rest..] → [B, pre.., rows, rest..]
    let mut unfolded = vec![size.clone(), rows.clone()];
    unfolded.extend(scattered.shape().dims()[1..].iter().cloned());
    let unfolded = scattered.reshape_to(Shape(unfolded));
    let mut back = vec![0];
    back.extend(2..2 + axis);
    back.push(1);
    back.extend(2 + axis..unfolded.ndim());
    Batched::along(unfolded.permute(&back), 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::ops::index::{take_eval, take_shape_rule};
    use crate::ops::strided::proptest_config;
    use crate::ops::{Condition, Guard};
    use crate::shape::Symbol;
    use proptest::prelude::*;

    fn sym(i: u32) -> Dim {
        Dim::symbol(Symbol(i))
    }

    #[test]
    fn repeated_and_negative_indices_accumulate() {
        let updates = HostData::F32(vec![1.0, 2.0, 3.0, 4.0]);
        let idx = HostData::I32(vec![1, -3, 1, 0]);
        assert_eq!(
            scatter_add_eval(0, &updates, &[4], &idx, &[3]),
            Ok(HostData::F32(vec![6.0, 4.0, 0.0]))
        );
    }

    #[test]
    fn scatters_columns_of_a_non_trailing_axis() {
        // updates [2, 2, 3] into out [2, 4, 3] along axis 1.
        let updates = HostData::I32((1..=12).collect());
        let idx = HostData::U32(vec![3, 0]);
        let out = scatter_add_eval(1, &updates, &[2, 2, 3], &idx, &[2, 4, 3]).unwrap();
        let want = vec![
            4, 5, 6, 0, 0, 0, 0, 0, 0, 1, 2, 3, //
            10, 11, 12, 0, 0, 0, 0, 0, 0, 7, 8, 9,
        ];
        assert_eq!(out, HostData::I32(want));
    }

    #[test]
    fn half_floats_accumulate_in_f32_and_round_once() {
        // 2048 + 1 + 1 in f16 steps would stay 2048; in f32 it reaches 2050.
        let h = [2048.0f32, 1.0, 1.0].map(half::f16::from_f32).to_vec();
        let out = scatter_add_eval(0, &HostData::F16(h), &[3], &HostData::I32(vec![0; 3]), &[1]);
        assert_eq!(out, Ok(HostData::F16(vec![half::f16::from_f32(2050.0)])));
    }

    #[test]
    fn integers_wrap() {
        let out = scatter_add_eval(
            0,
            &HostData::U8(vec![200, 100]),
            &[2],
            &HostData::I32(vec![0, 0]),
            &[1],
        );
        assert_eq!(out, Ok(HostData::U8(vec![44])));
    }

    #[test]
    fn empty_indices_give_zeros() {
        let out = scatter_add_eval(
            0,
            &HostData::F32(vec![]),
            &[0, 2],
            &HostData::I32(vec![]),
            &[3, 2],
        );
        assert_eq!(out, Ok(HostData::F32(vec![0.0; 6])));
    }

    #[test]
    fn out_of_range_index_is_a_runtime_error_naming_scatter_add() {
        let err = scatter_add_eval(
            0,
            &HostData::F32(vec![1.0]),
            &[1],
            &HostData::I32(vec![-4]),
            &[3],
        )
        .unwrap_err();
        assert_eq!(
            err,
            Error::Runtime {
                op: "scatter_add".into(),
                detail: "index -4 out of range for axis 0 of size 3".into()
            }
        );
    }

    #[test]
    fn shape_rule_replaces_the_index_block_by_size() {
        let updates = Aval::new([4, 2, 3, 5], DType::BF16);
        let idx = Aval::new([2, 3], DType::I32);
        let mut cx = ShapeCx::new();
        let out = scatter_add_shape_rule(1, &sym(0), &updates, &idx, &mut cx).unwrap();
        let want = Shape(vec![Dim::Known(4), sym(0), Dim::Known(5)]);
        assert_eq!(out, Aval::new(want, DType::BF16));
        assert!(cx.guards.is_empty());
    }

    #[test]
    fn shape_rule_guards_a_symbolic_index_count() {
        let updates = Aval::new(Shape(vec![sym(1), Dim::Known(4)]), DType::F32);
        let idx = Aval::new(Shape(vec![sym(2)]), DType::I32);
        let mut cx = ShapeCx::new();
        let out = scatter_add_shape_rule(0, &Dim::Known(7), &updates, &idx, &mut cx).unwrap();
        assert_eq!(out, Aval::new([7, 4], DType::F32));
        assert_eq!(
            cx.guards,
            vec![Guard {
                op: String::new(),
                condition: Condition::Equal(sym(1), sym(2))
            }]
        );
    }

    #[test]
    fn shape_rule_rejects_bool_updates_float_indices_and_mismatches() {
        let idx = Aval::new([2], DType::I32);
        let mut cx = ShapeCx::new();
        let size = Dim::Known(3);
        let err = scatter_add_shape_rule(0, &size, &Aval::new([2], DType::Bool), &idx, &mut cx)
            .unwrap_err();
        assert!(matches!(err, Error::DType { .. }), "{err}");
        assert!(err.to_string().contains("scatter_add"), "{err}");
        let err = scatter_add_shape_rule(
            0,
            &size,
            &Aval::new([2], DType::F32),
            &Aval::new([2], DType::F32),
            &mut cx,
        )
        .unwrap_err();
        assert!(matches!(err, Error::DType { .. }), "{err}");
        let err = scatter_add_shape_rule(0, &size, &Aval::new([3, 4], DType::F32), &idx, &mut cx)
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, Error::Shape { .. }) && msg.contains("f32[3,4], i32[2]"),
            "{msg}"
        );
        let err = scatter_add_shape_rule(2, &size, &Aval::new([3, 2], DType::F32), &idx, &mut cx)
            .unwrap_err();
        assert!(err.to_string().contains("axis 2"), "{err}");
    }

    /// An `[outer, n, inner]` problem: shapes, positions in range (as i32,
    /// some written negative) and integer-valued data.
    fn problem() -> impl Strategy<Value = (usize, usize, usize, Vec<i32>)> {
        (0usize..4, 1usize..6, 0usize..4).prop_flat_map(|(outer, n, inner)| {
            let index =
                (0..n as i32, any::<bool>())
                    .prop_map(move |(i, negative)| if negative { i - n as i32 } else { i });
            (
                Just(outer),
                Just(n),
                Just(inner),
                prop::collection::vec(index, 0..8),
            )
        })
    }

    fn ints(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7 + seed) % 11) as f32 - 5.0)
            .collect()
    }

    proptest! {
        #![proptest_config(proptest_config())]
        #[test]
        fn scatter_add_matches_a_naive_loop((outer, n, inner, idx) in problem()) {
            let k = idx.len();
            let updates = ints(outer * k * inner, 3);
            let out = scatter_add_eval(
                1,
                &HostData::F32(updates.clone()),
                &[outer, k, inner],
                &HostData::I32(idx.clone()),
                &[outer, n, inner],
            ).unwrap();
            let mut want = vec![0.0f32; outer * n * inner];
            for o in 0..outer {
                for (j, &i) in idx.iter().enumerate() {
                    let p = i.rem_euclid(n as i32) as usize;
                    for r in 0..inner {
                        want[(o * n + p) * inner + r] += updates[(o * k + j) * inner + r];
                    }
                }
            }
            prop_assert_eq!(out, HostData::F32(want));
        }

        /// `<take(x, i), g> == <x, scatter_add(g, i)>` with integer data,
        /// exact in f32 at these sizes.
        #[test]
        fn scatter_add_is_the_transpose_of_take((outer, n, inner, idx) in problem()) {
            let k = idx.len();
            let x = ints(outer * n * inner, 1);
            let g = ints(outer * k * inner, 4);
            let indices = HostData::I32(idx);
            let taken = take_eval(1, &HostData::F32(x.clone()), &[outer, n, inner], &indices, &[outer, k, inner]).unwrap();
            let scattered = scatter_add_eval(1, &HostData::F32(g.clone()), &[outer, k, inner], &indices, &[outer, n, inner]).unwrap();
            let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum::<f64>();
            prop_assert_eq!(dot(&taken.to_vec::<f32>(), &g), dot(&x, &scattered.to_vec::<f32>()));
        }

        /// The shape rules are transposes too: scattering take's output
        /// shape back with `size = n` gives the operand's shape.
        #[test]
        fn shape_rule_inverts_takes((outer, n, inner, idx) in problem()) {
            let x = Aval::new([outer, n, inner], DType::F32);
            let indices = Aval::new([idx.len()], DType::I32);
            let taken = take_shape_rule(1, &x, &indices).unwrap();
            let back = scatter_add_shape_rule(1, &Dim::Known(n), &taken, &indices, &mut ShapeCx::new());
            prop_assert_eq!(back, Ok(x));
        }
    }

    use crate::compile::rule_checks as rules;

    #[test]
    fn scatter_add_jvp_scatters_the_tangent() {
        let idx = Array::from_vec(vec![1i32, 1, -1], &[3]).unwrap();
        let f = move |x: Vec<Array>| x[0].scatter_add(&idx, 0, 4);
        rules::assert_jvp_matches_central_difference(
            "scatter_add",
            f,
            &[rules::normal(27, &[3, 2])],
        );
    }

    #[test]
    fn scatter_add_batches_per_example_indices_without_a_loop() {
        let ups = rules::normal(28, &[3, 2, 2]);
        let idx = Array::from_vec(vec![0i32, 4, -1, 2, 3, 3], &[3, 2]).unwrap();
        let f = |x: Vec<Array>| x[0].scatter_add(&x[1].cast(DType::I32), 1, 5);
        let report =
            rules::assert_batches_like_stacking("scatter_add", f, &[ups, idx.cast(DType::F32)]);
        assert!(
            report.vmap_fallbacks.is_empty(),
            "{:?}",
            report.vmap_fallbacks
        );
    }
}
