//! The vocabulary of batching rules ([`crate::vmap`]): a value under vmap
//! is an array with the batch axis somewhere in it, or the same array for
//! every example. The families' rules (`batch` beside each `vjp` and `jvp`)
//! use these helpers to move the batch axis only when an op needs it at
//! the front, and the per-example fallback for ops that have no rule of
//! their own (custom ops without `with_vmap`, kernels).

use super::Op;
use crate::error::{arg_err, Result};
use crate::handle::array::Array;
use crate::ops::layout::concat;
use crate::shape::{Dim, Shape};
use crate::DType;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;

/// A value under vmap: `value` holds every example's value along `axis`,
/// or (`axis` is `None`) is the one value all examples share.
#[derive(Clone, Debug)]
pub(crate) struct Batched {
    pub(crate) value: Array,
    pub(crate) axis: Option<usize>,
}

impl Batched {
    /// A value batched along `axis`.
    pub(crate) fn along(value: Array, axis: usize) -> Batched {
        Batched {
            value,
            axis: Some(axis),
        }
    }

    /// A value every example shares.
    pub(crate) fn shared(value: Array) -> Batched {
        Batched { value, axis: None }
    }

    /// The axis of `value` that is the per-example axis `axis` (past the
    /// batch axis when that comes first).
    pub(crate) fn operand_axis(&self, axis: usize) -> usize {
        match self.axis {
            Some(b) if b <= axis => axis + 1,
            _ => axis,
        }
    }

    /// The per-example rank.
    pub(crate) fn rank(&self) -> usize {
        self.value.ndim() - usize::from(self.axis.is_some())
    }

    /// The value with its batch axis first (unchanged when it already is,
    /// or when it has none).
    #[track_caller]
    pub(crate) fn front(&self) -> Array {
        match self.axis {
            Some(a) if a != 0 => {
                let mut perm = vec![a];
                perm.extend((0..self.value.ndim()).filter(|&i| i != a));
                self.value.permute(&perm)
            }
            _ => self.value.clone(),
        }
    }

    /// The value with its batch axis first and singleton axes after it so
    /// that its per-example rank is `rank`: it then broadcasts against
    /// per-example values of rank `rank` as the example did. A shared value
    /// is returned as is (it broadcasts from the right).
    #[track_caller]
    pub(crate) fn aligned(&self, rank: usize) -> Array {
        if self.axis.is_none() {
            return self.value.clone();
        }
        let front = self.front();
        let missing = rank.saturating_sub(self.rank());
        if missing == 0 {
            return front;
        }
        let dims = front.shape().dims();
        let mut shape = vec![dims[0].clone()];
        shape.extend(std::iter::repeat_n(Dim::Known(1), missing));
        shape.extend(dims[1..].iter().cloned());
        front.reshape_to(Shape(shape))
    }

    /// `product` of this batched value's examples folded into the rows of
    /// one matrix: the value (batch axis first) reshaped to `[rows, k]`, the
    /// `[rows, n]` result reshaped back to the leading dims and `n`. A
    /// per-example matrix-vector product against a shared matrix becomes
    /// one matrix product this way.
    #[track_caller]
    pub(crate) fn rows_folded(&self, product: impl FnOnce(Array) -> Array) -> Batched {
        let front = self.front();
        let dims = front.shape().dims();
        let (leading, k) = dims.split_at(dims.len() - 1);
        let rows = leading.iter().fold(Dim::Known(1), |acc, d| acc.mul(d));
        let result = product(front.reshape_to(Shape(vec![rows, k[0].clone()])));
        let mut out = leading.to_vec();
        out.extend(result.shape().dims().last().cloned());
        Batched::along(result.reshape_to(Shape(out)), 0)
    }

    /// The value with its batch axis first, a shared value broadcast to
    /// `size` examples.
    #[track_caller]
    pub(crate) fn materialized(&self, size: &Dim) -> Array {
        match self.axis {
            Some(_) => self.front(),
            None => {
                let mut shape = vec![size.clone()];
                shape.extend(self.value.shape().dims().iter().cloned());
                self.value.expand_dims(0).broadcast_to(Shape(shape))
            }
        }
    }
}

/// The index operand of an op that indexes an axis of `count` entries
/// (`take`, `scatter_add`, `gather_qmm`), rewritten for the axis of
/// `size·count` entries that folds the examples into it, example by
/// example: example `b`'s index `i` becomes `b·count + i`, with batch axis
/// first (a shared index array is broadcast to every example). With
/// `wrap_negative`, a negative i32 index first wraps once, as NumPy's
/// `take` does. An index still outside `[0, count)` becomes `size·count`,
/// out of range of the folded axis too, so the op reports bad input at run
/// time instead of reading another example's entry.
///
/// `count` is a scalar of the indices' dtype. The example positions come
/// from an `iota` over the batch axis and the folded length from a
/// `dim_size` of it, so `size` may be a symbolic dim.
#[track_caller]
pub(crate) fn folded_indices(
    indices: &Batched,
    count: &Array,
    size: &Dim,
    wrap_negative: bool,
) -> Array {
    let idx = indices.materialized(size);
    let dtype = idx.dtype();
    let signed = dtype == DType::I32;
    let mut example_shape = vec![size.clone()];
    example_shape.extend(std::iter::repeat_n(Dim::Known(1), idx.ndim() - 1));
    let example = idx.iota(0, dtype).reshape_to(Shape(example_shape));
    let examples = Array::apply(
        Op::DimSize {
            axes: vec![0],
            dtype,
        },
        vec![idx.clone()],
    );
    let out_of_range = &examples * count;
    let idx = if wrap_negative && signed {
        idx.less(0.0).select(&idx + count, &idx)
    } else {
        idx
    };
    let below = idx.less(count);
    let valid = if signed {
        below.select(idx.greater_equal(0.0), &below)
    } else {
        below
    };
    valid.select(&idx + &(&example * count), out_of_range)
}

/// `dim` as a scalar of `dtype`: a constant when known, else the `dim_size`
/// of a value that has it (known per call).
#[track_caller]
pub(crate) fn dim_scalar(dim: &Dim, dtype: DType) -> Array {
    match dim.known() {
        Some(n) => Array::scalar(n as f64, dtype),
        None => Array::apply(
            Op::DimSize {
                axes: vec![0],
                dtype,
            },
            vec![Array::scalar(0.0, dtype).broadcast_to(Shape(vec![dim.clone()]))],
        ),
    }
}

/// An op that vmap ran once per example because it has no batching rule
/// for its operands: what the [`Report`](crate::Report) lists, so a loop
/// hidden in a batched program is visible.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmapFallback {
    /// The op with its parameters, like `take(axis=0)`.
    pub op: String,
    /// How many times it runs (the batch size).
    pub examples: usize,
    /// Why it has no batching rule here.
    pub reason: String,
}

/// An implicit value ([`crate::implicit`]) that vmap batched by
/// materializing it: its leaves differ per example, and implicit lowering
/// resolves ops on the value's own kind, not on a batched one, so the
/// batched program reads the dense value instead (what the
/// [`Report`](crate::Report) lists beside [`VmapFallback`]s).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmapMaterialization {
    /// The implicit value's op, like `implicit low_rank(...)`.
    pub value: String,
    /// Why it was materialized.
    pub reason: String,
}

/// What vmap recorded while tracing: the ops it ran once per example and
/// the implicit values it materialized.
#[derive(Debug, Default)]
pub(crate) struct VmapRecords {
    pub(crate) fallbacks: Vec<VmapFallback>,
    pub(crate) materialized: Vec<VmapMaterialization>,
}

thread_local! {
    /// The records of the running compile trace, if one collects them.
    static RECORDS: RefCell<Option<VmapRecords>> = const { RefCell::new(None) };
}

/// Runs `trace` collecting what vmap records in it.
pub(crate) fn collecting_vmap_records<T>(trace: impl FnOnce() -> T) -> (T, VmapRecords) {
    let outer = RECORDS.with(|r| r.replace(Some(VmapRecords::default())));
    let result = trace();
    let records = RECORDS.with(|r| r.replace(outer)).unwrap_or_default();
    (result, records)
}

/// Adds `record` to the running trace's records, if one collects them.
fn record(record: impl FnOnce(&mut VmapRecords)) {
    RECORDS.with(|r| {
        if let Some(records) = r.borrow_mut().as_mut() {
            record(records);
        }
    });
}

/// Records that vmap batched the implicit value `value` (its op's
/// description) by materializing it.
pub(crate) fn record_materialization(value: String) {
    record(|records| {
        records.materialized.push(VmapMaterialization {
            value,
            reason: "its leaves differ per example and no handler reads a batched implicit \
                     value, so vmap batched its materialization (the dense value)"
                .to_string(),
        })
    });
}

/// `op` applied once per example, the results stacked along a new first
/// axis: the rule of ops without one of their own (`output` is the
/// per-example result; `reason` says why there is no rule). Needs a known
/// batch size (an `Err` naming the op otherwise). Recorded for the report.
pub(crate) fn per_example(
    op: &Op,
    operands: &[Batched],
    output: &Array,
    size: &Dim,
    reason: &str,
) -> Result<Batched> {
    let Some(n) = size.known() else {
        return Err(arg_err(
            op.name(),
            format!(
                "cannot be batched ({reason}), and running it once per example needs a known \
                 batch size, not {size}"
            ),
        ));
    };
    record(|records| {
        records.fallbacks.push(VmapFallback {
            op: op.describe(),
            examples: n,
            reason: reason.to_string(),
        })
    });
    if n == 0 {
        let mut shape = vec![Dim::Known(0)];
        shape.extend(output.shape().dims().iter().cloned());
        let empty = Array::scalar(0.0, output.dtype()).broadcast_to(Shape(shape));
        return Ok(Batched::along(empty, 0));
    }
    let results: Vec<Array> = (0..n)
        .map(|i| {
            let example: Vec<Array> = operands
                .iter()
                .map(|b| match b.axis {
                    Some(a) => {
                        let i = i as i64;
                        b.value
                            .slice_axis(a as isize, i, Some(i + 1), 1)
                            .squeeze(&[a as isize])
                    }
                    None => b.value.clone(),
                })
                .collect();
            Array::apply(op.clone(), example).expand_dims(0)
        })
        .collect();
    Ok(Batched::along(concat(&results, 0), 0))
}
