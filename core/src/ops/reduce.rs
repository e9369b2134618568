//! Reductions (sum, max, min) and argmax: shape rules and reference
//! evaluation.

use super::batching::Batched;
use super::math::simd_dispatch;
use super::strided::{
    check_axes, eval_dtype_err, for_each_offset, nan_max, nan_min, narrow, numel,
    row_major_strides, widen, WrappingInt,
};
use crate::data::HostData;
use crate::error::{arg_err, dtype_err, shape_err, Error, Result};
use crate::handle::array::Array;
use crate::ops::Op;
use crate::shape::{Aval, Dim, Shape};
use crate::DType;
use serde::{Deserialize, Serialize};

impl Array {
    #[track_caller]
    fn reduce(&self, op: ReduceOp, axes: &[isize], keepdims: bool) -> Array {
        match self.normalize_axes(op.name(), axes) {
            Ok(axes) => Array::apply(Op::Reduce { op, axes, keepdims }, vec![self.clone()]),
            Err(e) => Array::failed(e),
        }
    }

    fn all_axes(&self) -> Vec<isize> {
        (0..self.ndim() as isize).collect()
    }

    /// Sum over `axes` (negative counts from the end).
    #[track_caller]
    pub fn sum(&self, axes: &[isize], keepdims: bool) -> Array {
        self.reduce(ReduceOp::Sum, axes, keepdims)
    }
    /// Sum of every element (a scalar).
    #[track_caller]
    pub fn sum_all(&self) -> Array {
        self.sum(&self.all_axes(), false)
    }
    /// Maximum over `axes`.
    #[track_caller]
    pub fn max(&self, axes: &[isize], keepdims: bool) -> Array {
        self.reduce(ReduceOp::Max, axes, keepdims)
    }
    /// Minimum over `axes`.
    #[track_caller]
    pub fn min(&self, axes: &[isize], keepdims: bool) -> Array {
        self.reduce(ReduceOp::Min, axes, keepdims)
    }
    /// Mean over `axes`: the sum divided by the element count (known per
    /// call in a shapeless compile); NaN over an empty axis.
    ///
    /// As in JAX, integer and bool arrays average to f32, and f16/bf16 sum
    /// and divide in f32 and round once at the end, so neither a sum above
    /// the 16-bit range (65,504 for f16) nor a count above it (or above 255
    /// for u8) spoils the result.
    ///
    /// ```
    /// use kiln::{Array, DType};
    /// let bytes = Array::full(&[300], 200.0, DType::U8);
    /// assert_eq!(bytes.mean_all().to_vec::<f32>().unwrap(), [200.0]);
    /// ```
    #[track_caller]
    pub fn mean(&self, axes: &[isize], keepdims: bool) -> Array {
        match self.normalize_axes("mean", axes) {
            Ok(norm) => {
                let count = Array::apply(
                    Op::DimSize {
                        axes: norm,
                        dtype: DType::F32,
                    },
                    vec![self.clone()],
                );
                let wide = match self.dtype() {
                    DType::F32 => self.clone(),
                    _ => self.cast(DType::F32),
                };
                let mean = wide.sum(axes, keepdims) / count;
                match self.dtype() {
                    DType::F16 | DType::BF16 => mean.cast(self.dtype()),
                    _ => mean,
                }
            }
            Err(e) => Array::failed(e),
        }
    }
    /// Mean of every element.
    #[track_caller]
    pub fn mean_all(&self) -> Array {
        self.mean(&self.all_axes(), false)
    }
    /// Index (u32) of the maximum along `axis`, first on ties.
    #[track_caller]
    pub fn argmax(&self, axis: isize, keepdims: bool) -> Array {
        match self.normalize_axis("argmax", axis) {
            Ok(axis) => Array::apply(Op::ArgMax { axis, keepdims }, vec![self.clone()]),
            Err(e) => Array::failed(e),
        }
    }
}

/// A reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReduceOp {
    /// Sum (integers wrap; f16/bf16 accumulate in f32).
    Sum,
    /// Maximum (NaN propagates; bool is "any").
    Max,
    /// Minimum (NaN propagates; bool is "all").
    Min,
}

impl ReduceOp {
    /// The op's name: `sum`, `max` or `min`.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }
}

/// The operand's shape without `axes` (or with them set to 1 under
/// `keepdims`).
fn reduced_shape(shape: &Shape, axes: &[usize], keepdims: bool) -> Shape {
    let dims = shape
        .dims()
        .iter()
        .enumerate()
        .filter_map(|(i, d)| match axes.contains(&i) {
            false => Some(d.clone()),
            true if keepdims => Some(Dim::Known(1)),
            true => None,
        });
    Shape(dims.collect())
}

/// The output aval of reducing `axes` (sorted, unique, below the rank).
/// `sum` rejects bool; `max`/`min` over a known size-0 axis have no value.
pub fn shape_rule(op: ReduceOp, axes: &[usize], keepdims: bool, aval: &Aval) -> Result<Aval> {
    check_axes(op.name(), axes, aval.shape.rank())?;
    if op == ReduceOp::Sum && aval.dtype == DType::Bool {
        return Err(dtype_err(
            op.name(),
            &[aval],
            "expects a numeric dtype, got bool",
        ));
    }
    if op != ReduceOp::Sum {
        if let Some(&axis) = axes
            .iter()
            .find(|&&a| aval.shape.dims()[a] == Dim::Known(0))
        {
            return Err(shape_err(
                op.name(),
                &[aval],
                format!("axis {axis} has size 0, so there is no {}", op.name()),
            ));
        }
    }
    Ok(Aval::new(
        reduced_shape(&aval.shape, axes, keepdims),
        aval.dtype,
    ))
}

/// `Err` when `op` over `axes` of a concrete `shape` has no value: a max or
/// min over an empty axis with outputs to fill (a sum of nothing is 0).
/// Every backend asks this before it reduces.
pub fn check_nonempty(op: ReduceOp, axes: &[usize], shape: &[usize]) -> Result<()> {
    let group: usize = axes.iter().filter_map(|&a| shape.get(a)).product();
    let outputs: usize = (0..shape.len())
        .filter(|d| !axes.contains(d))
        .map(|d| shape[d])
        .product();
    if op != ReduceOp::Sum && group == 0 && outputs > 0 {
        return Err(Error::Runtime {
            op: op.name().to_string(),
            detail: format!(
                "cannot take the {} of an empty axis (shape {shape:?}, axes {axes:?})",
                op.name()
            ),
        });
    }
    Ok(())
}

/// `Err` when argmax along `axis` of a concrete `shape` has no value: an
/// empty axis with outputs to fill. Every backend asks this first.
pub fn check_argmax_nonempty(axis: usize, shape: &[usize]) -> Result<()> {
    let outputs: usize = (0..shape.len())
        .filter(|&d| d != axis)
        .map(|d| shape[d])
        .product();
    if shape.get(axis) == Some(&0) && outputs > 0 {
        return Err(Error::Runtime {
            op: "argmax".to_string(),
            detail: format!("cannot take the argmax of an empty axis {axis} (shape {shape:?})"),
        });
    }
    Ok(())
}

/// Reference evaluation of reducing `axes` of contiguous `data` of `shape`.
pub fn eval(op: ReduceOp, axes: &[usize], data: &HostData, shape: &[usize]) -> Result<HostData> {
    check_axes(op.name(), axes, shape.len())?;
    check_nonempty(op, axes, shape)?;
    let plan = ReduceGeometry::new(axes, shape);
    let floats = |v: &[f32]| match op {
        // An f64 accumulator rounds once per output: a running f32 sum of a
        // million 0.1s is 1% off (NumPy sums pairwise for the same reason).
        ReduceOp::Sum => plan.sum_f32(v),
        ReduceOp::Max => plan.run(v, f32::NEG_INFINITY, nan_max),
        ReduceOp::Min => plan.run(v, f32::INFINITY, nan_min),
    };
    Ok(match data {
        HostData::F32(v) => HostData::F32(floats(v)),
        HostData::F16(v) => HostData::F16(narrow(&floats(&widen(v)))),
        HostData::BF16(v) => HostData::BF16(narrow(&floats(&widen(v)))),
        HostData::I32(v) => HostData::I32(plan.int(op, v)),
        HostData::U32(v) => HostData::U32(plan.int(op, v)),
        HostData::U8(v) => HostData::U8(plan.int(op, v)),
        HostData::Bool(v) => HostData::Bool(match op {
            ReduceOp::Sum => {
                return Err(eval_dtype_err(op.name(), &[DType::Bool], "cannot sum bool"))
            }
            ReduceOp::Max => plan.run(v, false, |a, b| a | b),
            ReduceOp::Min => plan.run(v, true, |a, b| a & b),
        }),
    })
}

/// How a reduction walks its input.
struct ReduceGeometry {
    /// The input shape.
    shape: Vec<usize>,
    /// Per input axis, the output stride (0 on reduced axes).
    out_strides: Vec<usize>,
    /// Elements folded into each output element.
    group: usize,
    /// Output elements.
    outputs: usize,
    /// The reduced axes are a trailing suffix, so each group is contiguous.
    trailing: bool,
    /// Where the reduced axes are one run of adjacent axes followed by kept
    /// ones, the elements of those kept axes: the input is then blocks of
    /// `group` rows this long, each block folding row by row into as many
    /// outputs (one block for a bias gradient's sum over the batch, one per
    /// sequence for a mean over its positions).
    row: Option<usize>,
}

impl ReduceGeometry {
    fn new(axes: &[usize], shape: &[usize]) -> ReduceGeometry {
        let mut sorted = axes.to_vec();
        sorted.sort_unstable();
        let adjacent = sorted.windows(2).all(|w| w[1] == w[0] + 1);
        let row = match sorted.last() {
            Some(&last) if adjacent && last + 1 < shape.len() => Some(numel(&shape[last + 1..])),
            _ => None,
        };
        let kept: Vec<usize> = (0..shape.len()).filter(|i| !axes.contains(i)).collect();
        let kept_shape: Vec<usize> = kept.iter().map(|&i| shape[i]).collect();
        let kept_strides = row_major_strides(&kept_shape);
        let mut out_strides = vec![0; shape.len()];
        for (&axis, &stride) in kept.iter().zip(&kept_strides) {
            out_strides[axis] = stride;
        }
        ReduceGeometry {
            shape: shape.to_vec(),
            out_strides,
            group: axes.iter().map(|&a| shape[a]).product(),
            outputs: numel(&kept_shape),
            trailing: axes
                .iter()
                .enumerate()
                .all(|(i, &a)| a == shape.len() - axes.len() + i),
            row,
        }
    }

    /// Folds each group with `f` starting from `init`.
    fn run<T: Copy, A: Copy>(&self, data: &[T], init: A, f: impl Fn(A, T) -> A) -> Vec<A> {
        if self.trailing {
            if self.group == 0 {
                return vec![init; self.outputs];
            }
            return data
                .chunks_exact(self.group)
                .map(|g| g.iter().fold(init, |a, &b| f(a, b)))
                .collect();
        }
        let mut out = vec![init; self.outputs];
        if let Some(row) = self.row.filter(|&row| row > 0 && self.group > 0) {
            // Row by row: each output folds its elements in the same order
            // as the general walk below, a vector's width at a time.
            let blocks = data.chunks_exact(self.group * row);
            for (block, out) in blocks.zip(out.chunks_exact_mut(row)) {
                for row in block.chunks_exact(row) {
                    for (o, &x) in out.iter_mut().zip(row) {
                        *o = f(*o, x);
                    }
                }
            }
            return out;
        }
        // One sequential pass over the input, folding each element into its
        // output slot: no per-group allocation, and memory is read in order.
        let mut values = data.iter();
        for_each_offset(&self.shape, [&self.out_strides], |[o]| {
            if let Some(&x) = values.next() {
                out[o] = f(out[o], x);
            }
        });
        out
    }

    /// Sums of f32 groups in f64, each rounded once. A contiguous group
    /// (a loss's sum over every element) is summed in [`SUM_LANES`]
    /// interleaved partial sums: one running sum waits a whole add's
    /// latency per element. Each partial sum adds in order and they are
    /// added in a fixed order, so the bits are the same on every
    /// instruction set. A sum over a run of adjacent axes followed by kept
    /// ones adds row by row, in the order of [`ReduceGeometry::run`].
    fn sum_f32(&self, data: &[f32]) -> Vec<f32> {
        if self.trailing && self.group > 0 {
            return data
                .chunks_exact(self.group)
                .map(|g| {
                    let mut sum = 0.0;
                    lane_sum(g, &mut sum);
                    sum as f32
                })
                .collect();
        }
        if let Some(row) = self.row.filter(|&row| row > 0 && self.group > 0) {
            let mut sums = vec![0.0f64; self.outputs];
            let blocks = data.chunks_exact(self.group * row);
            for (block, sums) in blocks.zip(sums.chunks_exact_mut(row)) {
                for row in block.chunks_exact(row) {
                    add_row(row, sums);
                }
            }
            return sums.into_iter().map(|s| s as f32).collect();
        }
        self.run(data, 0.0f64, |a, b| a + f64::from(b))
            .into_iter()
            .map(|s| s as f32)
            .collect()
    }

    fn int<T: WrappingInt>(&self, op: ReduceOp, data: &[T]) -> Vec<T> {
        match op {
            ReduceOp::Sum => self.run(data, T::ZERO, T::add),
            ReduceOp::Max => self.run(data, T::MIN, Ord::max),
            ReduceOp::Min => self.run(data, T::MAX, Ord::min),
        }
    }
}

/// Partial sums of [`ReduceGeometry::sum_f32`]'s contiguous groups.
const SUM_LANES: usize = 16;

simd_dispatch! {
    /// `Σ x` in f64: element `i` added, in order, to partial sum
    /// `i mod SUM_LANES`, the partial sums then added in order.
    fn lane_sum(x: &[f32], sum: &mut f64) {
        let mut lanes = [0.0f64; SUM_LANES];
        let whole = x.chunks_exact(SUM_LANES);
        let tail = whole.remainder();
        for chunk in whole {
            for (lane, &v) in lanes.iter_mut().zip(chunk) {
                *lane += f64::from(v);
            }
        }
        for (lane, &v) in lanes.iter_mut().zip(tail) {
            *lane += f64::from(v);
        }
        *sum = lanes.iter().sum();
    }
}

simd_dispatch! {
    /// `sums[j] += row[j]` in f64: one row of a sum over adjacent axes
    /// followed by kept ones (a bias gradient's sum over the batch).
    fn add_row(row: &[f32], sums: &mut [f64]) {
        for (sum, &v) in sums.iter_mut().zip(row) {
            *sum += f64::from(v);
        }
    }
}

/// The output aval of argmax along `axis`: u32 indices.
pub fn argmax_shape_rule(axis: usize, keepdims: bool, aval: &Aval) -> Result<Aval> {
    let rank = aval.shape.rank();
    if axis >= rank {
        return Err(arg_err(
            "argmax",
            format!("axis {axis} is out of range for rank {rank}"),
        ));
    }
    if aval.shape.dims()[axis] == Dim::Known(0) {
        return Err(shape_err(
            "argmax",
            &[aval],
            format!("axis {axis} has size 0, so there is no maximum"),
        ));
    }
    Ok(Aval::new(
        reduced_shape(&aval.shape, &[axis], keepdims),
        DType::U32,
    ))
}

/// Reference argmax along `axis`: the first index of the maximum, where NaN
/// counts as the maximum (the first NaN wins).
pub fn argmax_eval(axis: usize, data: &HostData, shape: &[usize]) -> Result<HostData> {
    let runtime = |detail: String| Error::Runtime {
        op: "argmax".to_string(),
        detail,
    };
    if axis >= shape.len() {
        return Err(runtime(format!(
            "axis {axis} is out of range for shape {shape:?}"
        )));
    }
    check_argmax_nonempty(axis, shape)?;
    let outer = numel(&shape[..axis]);
    let n = shape[axis];
    let inner = numel(&shape[axis + 1..]);
    if u32::try_from(n).is_err() {
        return Err(runtime(format!(
            "axis {axis} of size {n} does not fit u32 indices"
        )));
    }
    let out = crate::with_host_data!(data, v => argmax_typed(v, outer, n, inner));
    Ok(HostData::U32(out))
}

/// Argmax over the middle axis of a `[outer, n, inner]` view, scanning
/// whole rows so memory is read contiguously.
fn argmax_typed<T: Copy + PartialOrd>(v: &[T], outer: usize, n: usize, inner: usize) -> Vec<u32> {
    // x != x only for NaN; integers and bool never match.
    #[allow(clippy::eq_op)]
    fn is_nan<T: PartialOrd>(x: &T) -> bool {
        x.partial_cmp(x).is_none()
    }
    let mut out = Vec::with_capacity(outer * inner);
    if n == 0 || inner == 0 {
        return out;
    }
    for block in v.chunks_exact(n * inner).take(outer) {
        let mut best: Vec<T> = block[..inner].to_vec();
        let mut index = vec![0u32; inner];
        for (k, row) in block.chunks_exact(inner).enumerate().skip(1) {
            for ((b, i), &x) in best.iter_mut().zip(&mut index).zip(row) {
                if !is_nan(b) && (is_nan(&x) || x > *b) {
                    *b = x;
                    *i = k as u32;
                }
            }
        }
        out.extend(index);
    }
    out
}

/// The cotangent of `x` for the cotangent `g` of `y = op(x)` over `axes`:
/// a sum spreads `g` over the reduced elements; a maximum or minimum gives
/// it to the elements equal to the result, split evenly between ties.
#[track_caller]
pub(crate) fn vjp(
    op: ReduceOp,
    axes: &[usize],
    keepdims: bool,
    x: &Array,
    y: &Array,
    g: &Array,
) -> Array {
    let kept = |a: &Array| {
        if keepdims {
            a.clone()
        } else {
            a.reshape_to(reduced_shape(x.shape(), axes, true))
        }
    };
    let spread = kept(g).broadcast_to(x.shape().clone());
    match op {
        ReduceOp::Sum => spread,
        ReduceOp::Max | ReduceOp::Min => {
            let hit = x
                .equal(kept(y).broadcast_to(x.shape().clone()))
                .cast(x.dtype());
            let axes: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
            let ties = hit.sum(&axes, true).broadcast_to(x.shape().clone());
            spread * hit / ties
        }
    }
}

/// The tangent of `y = op(x)` over `axes` for the tangent `t` of `x`: a sum
/// sums `t`; a maximum or minimum takes the mean of `t` over the elements
/// equal to the result (the ties [`vjp`] splits the cotangent between).
#[track_caller]
pub(crate) fn jvp(
    op: ReduceOp,
    axes: &[usize],
    keepdims: bool,
    x: &Array,
    y: &Array,
    t: &Array,
) -> Array {
    let axes_i: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
    match op {
        ReduceOp::Sum => t.sum(&axes_i, keepdims),
        ReduceOp::Max | ReduceOp::Min => {
            let kept = if keepdims {
                y.clone()
            } else {
                y.reshape_to(reduced_shape(x.shape(), axes, true))
            };
            let hit = x
                .equal(kept.broadcast_to(x.shape().clone()))
                .cast(x.dtype());
            let ties = hit.sum(&axes_i, keepdims);
            (t * hit).sum(&axes_i, keepdims) / ties
        }
    }
}

/// The batched reduction: the batch axis first, the reduced axes after it.
pub(crate) fn batch(op: ReduceOp, axes: &[usize], keepdims: bool, x: &Batched) -> Batched {
    Batched::along(
        Array::apply(
            Op::Reduce {
                op,
                axes: axes.iter().map(|a| a + 1).collect(),
                keepdims,
            },
            vec![x.front()],
        ),
        0,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::strided::proptest_config;
    use crate::shape::Symbol;
    use half::{bf16, f16};
    use proptest::prelude::*;

    fn f32s(v: &[f32]) -> HostData {
        HostData::F32(v.to_vec())
    }

    #[test]
    fn sum_over_last_axis() {
        let d = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(
            eval(ReduceOp::Sum, &[1], &d, &[2, 3]),
            Ok(f32s(&[6.0, 15.0]))
        );
    }

    #[test]
    fn a_long_f32_sum_rounds_once_like_numpy_not_per_element() {
        // A running f32 sum of a million 0.1s drifts to about 100958.
        let d = f32s(&vec![0.1; 1_000_000]);
        let HostData::F32(sum) = eval(ReduceOp::Sum, &[0], &d, &[1_000_000]).unwrap() else {
            panic!("an f32 sum");
        };
        assert_eq!(sum, vec![(1_000_000.0 * f64::from(0.1f32)) as f32]);
    }

    #[test]
    fn sum_over_first_axis() {
        let d = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(
            eval(ReduceOp::Sum, &[0], &d, &[2, 3]),
            Ok(f32s(&[5.0, 7.0, 9.0]))
        );
    }

    #[test]
    fn max_and_min_over_middle_axis() {
        let d = HostData::I32((0..12).map(|x| (x * 7) % 12).collect());
        // [[0,7,2],[9,4,11]] , [[6,1,8],[3,10,5]] as shape [2,2,3]
        assert_eq!(
            eval(ReduceOp::Max, &[1], &d, &[2, 2, 3]),
            Ok(HostData::I32(vec![9, 7, 11, 6, 10, 8]))
        );
        assert_eq!(
            eval(ReduceOp::Min, &[1], &d, &[2, 2, 3]),
            Ok(HostData::I32(vec![0, 4, 2, 3, 1, 5]))
        );
    }

    #[test]
    fn reduce_all_axes_gives_scalar() {
        let d = HostData::U8(vec![200, 100, 1]);
        assert_eq!(
            eval(ReduceOp::Sum, &[0], &d, &[3]),
            Ok(HostData::U8(vec![45]))
        );
        let rule = shape_rule(ReduceOp::Sum, &[0, 1], false, &Aval::new([2, 3], DType::U8));
        assert_eq!(rule, Ok(Aval::new([], DType::U8)));
    }

    #[test]
    fn integer_sum_wraps() {
        let d = HostData::I32(vec![i32::MAX, 1]);
        assert_eq!(
            eval(ReduceOp::Sum, &[0], &d, &[2]),
            Ok(HostData::I32(vec![i32::MIN]))
        );
    }

    #[test]
    fn max_propagates_nan_and_bool_max_is_any() {
        let HostData::F32(v) =
            eval(ReduceOp::Max, &[0], &f32s(&[1.0, f32::NAN, 3.0]), &[3]).unwrap()
        else {
            panic!()
        };
        assert!(v[0].is_nan());
        let b = HostData::Bool(vec![false, true, false, false]);
        assert_eq!(
            eval(ReduceOp::Max, &[1], &b, &[2, 2]),
            Ok(HostData::Bool(vec![true, false]))
        );
        assert_eq!(
            eval(ReduceOp::Min, &[1], &b, &[2, 2]),
            Ok(HostData::Bool(vec![false, false]))
        );
    }

    #[test]
    fn halves_accumulate_in_f32_and_round_once() {
        // 2048 + 1 + 1 in f16 steps would stay 2048; in f32 it reaches 2050.
        let h: Vec<f16> = [2048.0f32, 1.0, 1.0]
            .iter()
            .map(|&x| f16::from_f32(x))
            .collect();
        assert_eq!(
            eval(ReduceOp::Sum, &[0], &HostData::F16(h), &[3]),
            Ok(HostData::F16(vec![f16::from_f32(2050.0)]))
        );
        let xs = [0.1f32, 0.2, 0.7];
        let b: Vec<bf16> = xs.iter().map(|&x| bf16::from_f32(x)).collect();
        let want: f32 = widen(&b).iter().sum();
        assert_eq!(
            eval(ReduceOp::Sum, &[0], &HostData::BF16(b), &[3]),
            Ok(HostData::BF16(vec![bf16::from_f32(want)]))
        );
    }

    #[test]
    fn keepdims_sets_reduced_axes_to_one() {
        let out = shape_rule(ReduceOp::Max, &[1], true, &Aval::new([2, 3, 4], DType::F32));
        assert_eq!(out, Ok(Aval::new([2, 1, 4], DType::F32)));
    }

    #[test]
    fn size_zero_axes() {
        assert_eq!(
            eval(ReduceOp::Sum, &[1], &f32s(&[]), &[2, 0]),
            Ok(f32s(&[0.0, 0.0]))
        );
        assert_eq!(
            eval(ReduceOp::Max, &[1], &f32s(&[]), &[0, 3]),
            Ok(f32s(&[]))
        );
        assert!(matches!(
            eval(ReduceOp::Max, &[1], &f32s(&[]), &[2, 0]),
            Err(Error::Runtime { .. })
        ));
        let err =
            shape_rule(ReduceOp::Min, &[1], false, &Aval::new([2, 0], DType::F32)).unwrap_err();
        assert!(matches!(err, Error::Shape { .. }) && format!("{err}").contains("f32[2,0]"));
    }

    #[test]
    fn symbolic_axis_is_allowed_for_max() {
        let a = Aval::new(
            Shape(vec![Dim::symbol(Symbol(0)), Dim::Known(3)]),
            DType::F32,
        );
        assert_eq!(
            shape_rule(ReduceOp::Max, &[0], false, &a),
            Ok(Aval::new([3], DType::F32))
        );
    }

    #[test]
    fn invalid_axes_name_op_axes_and_rank() {
        let a = Aval::new([2, 3], DType::F32);
        for axes in [vec![2], vec![1, 0], vec![0, 0]] {
            let err = shape_rule(ReduceOp::Sum, &axes, false, &a).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument { .. }));
            let msg = format!("{err}");
            assert!(
                msg.contains("sum") && msg.contains(&format!("{axes:?}")) && msg.contains('2'),
                "{msg}"
            );
        }
        let err = shape_rule(ReduceOp::Sum, &[0], false, &Aval::new([2], DType::Bool)).unwrap_err();
        assert!(matches!(err, Error::DType { .. }));
    }

    #[test]
    fn argmax_takes_first_maximum_and_first_nan() {
        let d = f32s(&[1.0, 3.0, 3.0, f32::NAN, 2.0, f32::NAN]);
        assert_eq!(argmax_eval(1, &d, &[2, 3]), Ok(HostData::U32(vec![1, 0])));
        assert_eq!(
            argmax_eval(0, &d, &[2, 3]),
            Ok(HostData::U32(vec![1, 0, 1]))
        );
        let i = HostData::I32(vec![-5, -1, -1]);
        assert_eq!(argmax_eval(0, &i, &[3]), Ok(HostData::U32(vec![1])));
    }

    #[test]
    fn argmax_shape_rule_and_empty_axis() {
        let a = Aval::new([2, 3], DType::F16);
        assert_eq!(
            argmax_shape_rule(1, false, &a),
            Ok(Aval::new([2], DType::U32))
        );
        assert_eq!(
            argmax_shape_rule(0, true, &a),
            Ok(Aval::new([1, 3], DType::U32))
        );
        assert!(matches!(
            argmax_shape_rule(2, false, &a),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            argmax_eval(1, &f32s(&[]), &[2, 0]),
            Err(Error::Runtime { .. })
        ));
        assert_eq!(
            argmax_eval(1, &f32s(&[]), &[0, 3]),
            Ok(HostData::U32(vec![]))
        );
    }

    proptest! {
        #![proptest_config(proptest_config())]
        #[test]
        fn sum_over_all_axes_equals_sum_of_elements(shape in prop::collection::vec(0usize..4, 0..4), seed in any::<i32>()) {
            let n: usize = shape.iter().product();
            let v: Vec<i32> = (0..n as i32).map(|i| i.wrapping_mul(seed)).collect();
            let axes: Vec<usize> = (0..shape.len()).collect();
            let want = v.iter().fold(0i32, |a, &b| a.wrapping_add(b));
            prop_assert_eq!(eval(ReduceOp::Sum, &axes, &HostData::I32(v), &shape), Ok(HostData::I32(vec![want])));
        }

        /// Multiples of 2⁻¹⁰ below 2¹⁴ sum exactly in f64 in any order, so
        /// each sum, over trailing axes (whatever its length against the
        /// partial sums' count) or leading ones, is the exact sum rounded
        /// once to f32.
        #[test]
        fn f32_sums_are_the_exact_sum_rounded_once(
            groups in 1usize..4,
            group in 0usize..100,
            seed in any::<u64>(),
        ) {
            let v: Vec<f32> = (0..(groups * group) as u64)
                .map(|i| {
                    let bits = (i ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 39;
                    (bits as i64 - (1 << 24)) as f32 / 1024.0
                })
                .collect();
            let want: Vec<f32> = (0..groups)
                .map(|g| v[g * group..(g + 1) * group].iter().map(|&x| f64::from(x)).sum::<f64>() as f32)
                .collect();
            prop_assert_eq!(
                eval(ReduceOp::Sum, &[1], &HostData::F32(v.clone()), &[groups, group]),
                Ok(HostData::F32(want))
            );
            // The same values as `group` rows of `groups` columns.
            let columns: Vec<f32> = (0..groups)
                .map(|j| (0..group).map(|i| f64::from(v[i * groups + j])).sum::<f64>() as f32)
                .collect();
            prop_assert_eq!(
                eval(ReduceOp::Sum, &[0], &HostData::F32(v), &[group, groups]),
                Ok(HostData::F32(columns))
            );
        }

        /// A reduction over a run of adjacent axes with kept axes on both
        /// sides folds block by block: every output is the fold of the
        /// elements its index picks out, found by index (sums of
        /// multiples of 2⁻¹⁰ are exact in f64, so the order cannot hide a
        /// misplaced element).
        #[test]
        fn reductions_over_middle_axes_fold_the_elements_each_output_indexes(
            outer in 1usize..4,
            middle in prop::collection::vec(0usize..4, 1..3),
            inner in 1usize..6,
            seed in any::<u64>(),
        ) {
            let group: usize = middle.iter().product();
            let shape: Vec<usize> = std::iter::once(outer).chain(middle.iter().copied()).chain([inner]).collect();
            let axes: Vec<usize> = (1..=middle.len()).collect();
            let n = outer * group * inner;
            let v: Vec<f32> = (0..n as u64)
                .map(|i| {
                    let bits = (i ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 39;
                    (bits as i64 - (1 << 24)) as f32 / 1024.0
                })
                .collect();
            let at = |o: usize, m: usize, j: usize| v[(o * group + m) * inner + j];
            let outputs = || (0..outer).flat_map(|o| (0..inner).map(move |j| (o, j)));
            let sums: Vec<f32> = outputs()
                .map(|(o, j)| (0..group).map(|m| f64::from(at(o, m, j))).sum::<f64>() as f32)
                .collect();
            prop_assert_eq!(
                eval(ReduceOp::Sum, &axes, &HostData::F32(v.clone()), &shape),
                Ok(HostData::F32(sums))
            );
            if group > 0 {
                let maxima: Vec<f32> = outputs()
                    .map(|(o, j)| (0..group).map(|m| at(o, m, j)).fold(f32::NEG_INFINITY, f32::max))
                    .collect();
                prop_assert_eq!(
                    eval(ReduceOp::Max, &axes, &HostData::F32(v.clone()), &shape),
                    Ok(HostData::F32(maxima))
                );
            }
            let ints: Vec<i32> = v.iter().map(|&x| (x * 1024.0) as i32).collect();
            let int_sums: Vec<i32> = outputs()
                .map(|(o, j)| (0..group).map(|m| ints[(o * group + m) * inner + j]).fold(0i32, i32::wrapping_add))
                .collect();
            prop_assert_eq!(
                eval(ReduceOp::Sum, &axes, &HostData::I32(ints), &shape),
                Ok(HostData::I32(int_sums))
            );
        }

        #[test]
        fn any_axis_subset_matches_trailing_reduction_after_permute(shape in prop::collection::vec(1usize..4, 1..4), mask in any::<u8>()) {
            let rank = shape.len();
            let axes: Vec<usize> = (0..rank).filter(|i| mask & (1 << i) != 0).collect();
            let n: usize = shape.iter().product();
            let v: Vec<i32> = (0..n as i32).collect();
            // Move kept axes first, reduced axes last: the contiguous path is the oracle.
            let perm: Vec<usize> = (0..rank).filter(|i| !axes.contains(i)).chain(axes.iter().copied()).collect();
            let permuted = crate::ops::layout::permute_eval(&perm, &HostData::I32(v.clone()), &shape);
            let pshape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let trailing: Vec<usize> = (rank - axes.len()..rank).collect();
            prop_assert_eq!(
                eval(ReduceOp::Max, &axes, &HostData::I32(v), &shape),
                eval(ReduceOp::Max, &trailing, &permuted, &pshape)
            );
        }
    }

    use crate::compile::rule_checks as rules;

    #[test]
    fn sum_max_min_and_mean_jvps_match_central_differences() {
        let x = rules::normal(10, &[3, 4]);
        rules::assert_jvp_matches_central_difference(
            "sum",
            |x| x[0].sum(&[1], false),
            std::slice::from_ref(&x),
        );
        rules::assert_jvp_matches_central_difference(
            "max",
            |x| x[0].max(&[0], true),
            std::slice::from_ref(&x),
        );
        rules::assert_jvp_matches_central_difference(
            "min",
            |x| x[0].min(&[0, 1], false),
            std::slice::from_ref(&x),
        );
        rules::assert_jvp_matches_central_difference("mean", |x| x[0].mean(&[1], false), &[x]);
    }

    #[test]
    fn reductions_and_argmax_batch_with_their_axes_past_the_batch() {
        let xs = rules::normal(11, &[3, 4, 5]);
        let f = |x: Vec<Array>| {
            let m = x[0].max(&[0], false) + x[0].sum(&[1], false).sum(&[0], true);
            m + x[0].argmax(1, false).cast(DType::F32).sum(&[0], false)
        };
        let report = rules::assert_batches_like_stacking("reductions", f, &[xs]);
        assert!(
            report.vmap_fallbacks.is_empty(),
            "{:?}",
            report.vmap_fallbacks
        );
    }

    #[test]
    fn argmax_has_no_tangent() {
        let x = rules::normal(12, &[4]);
        let (_, t) = crate::jvp(|x: Array| x.argmax(0, false), &x, &x).unwrap();
        assert_eq!(t.to_vec::<u32>().unwrap(), [0]);
    }
}
