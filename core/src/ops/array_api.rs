//! The everyday `jax.numpy` functions a model author reaches for, each a
//! named composition of Kiln's op families (`argsort` aside, the one op
//! they add: [`crate::ops::sort`]), so each one differentiates, runs
//! forward-mode, batches, runs on every backend and (unless its doc says
//! otherwise) takes symbolic dims, through its parts.
//! Where JAX documents a choice (rounding, NaN, ties, result dtypes) the
//! method's doc states the one Kiln makes.

use crate::error::{arg_err, dtype_err, shape_err, Result};
use crate::handle::array::{normalize_axis, Array};
use crate::location::in_composition;
use crate::ops::binary::Operand;
use crate::ops::layout::concat;
use crate::ops::Op;
use crate::shape::{Dim, Shape};
use crate::DType;

/// `x` with no gradient (the `stop_gradient` identity): the families
/// cannot import the transform layer's function, so they build its node.
fn no_gradient(x: &Array) -> Array {
    Array::apply(Op::StopGradient, vec![x.clone()])
}

/// The product of `x`'s sizes over `axes` as a scalar of `dtype` (known
/// only per call in a shapeless compile).
fn count(x: &Array, axes: Vec<usize>, dtype: DType) -> Array {
    Array::apply(Op::DimSize { axes, dtype }, vec![x.clone()])
}

/// `Err` naming `op` unless `x` holds floats.
fn require_float(op: &str, x: &Array) -> Result<()> {
    x.first_error()?;
    match x.dtype().is_float() {
        true => Ok(()),
        false => Err(dtype_err(
            op,
            &[x.aval()],
            format!("expects a float dtype, got {}", x.dtype()),
        )),
    }
}

/// `Err` naming `op` when `x` is bool.
fn require_numeric(op: &str, x: &Array) -> Result<()> {
    x.first_error()?;
    match x.dtype() {
        DType::Bool => Err(dtype_err(
            op,
            &[x.aval()],
            "expects a numeric dtype, got bool",
        )),
        _ => Ok(()),
    }
}

/// Floats with an integral value from 2^23 up: every f32 that large is
/// already an integer, and every smaller one converts to i32 exactly.
const INTEGRAL_FROM: f64 = 8_388_608.0;

/// How [`Array::floor`] and [`Array::round`] pick the integer.
#[derive(Clone, Copy)]
enum Rounding {
    Floor,
    HalfToEven,
}

/// Elementwise compositions.
impl Array {
    /// `x * x`, for any numeric dtype (integers wrap), as `jax.numpy.square`.
    ///
    /// ```
    /// use kiln::Array;
    /// let x = Array::from_vec(vec![-3i32, 2], &[2])?;
    /// assert_eq!(x.square().to_vec::<i32>()?, [9, 4]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn square(&self) -> Array {
        in_composition("square", || self * self)
    }

    /// The tangent, `sin(x) / cos(x)` (floats; within a few ulps of the
    /// quotient of the two), as `jax.numpy.tan`.
    #[track_caller]
    pub fn tan(&self) -> Array {
        in_composition("tan", || self.sin() / self.cos())
    }

    /// `-1`, `0` or `1` by the sign of each element, as `jax.numpy.sign`:
    /// zeros keep their sign (`sign(-0.0)` is `-0.0`), NaN stays NaN,
    /// unsigned integers give `0` or `1`, bool fails. Its gradient is zero.
    ///
    /// ```
    /// use kiln::Array;
    /// let x = Array::from_vec(vec![-2.5f32, 0.0, 4.0], &[3])?;
    /// assert_eq!(x.sign().to_vec::<f32>()?, [-1.0, 0.0, 1.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn sign(&self) -> Array {
        in_composition("sign", || {
            if let Err(e) = require_numeric("sign", self) {
                return Array::failed(e);
            }
            let x = no_gradient(self);
            let positive = x.greater(0);
            match self.dtype().is_signed() {
                true => positive.select(1, x.less(0).select(-1, &x)),
                false => positive.select(1, &x),
            }
        })
    }

    /// The largest integer not above each element, as `jax.numpy.floor`:
    /// `floor(-0.0)` is `-0.0`, NaN and infinities stay; integer arrays
    /// come back unchanged (NumPy 2 and JAX do the same), bool fails. Its
    /// gradient is zero.
    #[track_caller]
    pub fn floor(&self) -> Array {
        in_composition("floor", || self.integral("floor", Rounding::Floor))
    }

    /// The nearest integer, halves to the even one (`round(2.5)` is `2`,
    /// `round(-0.5)` is `-0.0`), as `jax.numpy.round` with no decimals:
    /// NaN and infinities stay; integer arrays come back unchanged, bool
    /// fails. Its gradient is zero.
    ///
    /// ```
    /// use kiln::Array;
    /// let x = Array::from_vec(vec![0.5f32, 1.5, 2.5, -1.6], &[4])?;
    /// assert_eq!(x.round().to_vec::<f32>()?, [0.0, 2.0, 2.0, -2.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn round(&self) -> Array {
        in_composition("round", || self.integral("round", Rounding::HalfToEven))
    }

    /// Floor or round through an exact i32 conversion: f16 and bf16 widen
    /// to f32 (their integers are f32's), values from 2^23 up are already
    /// integers and pass through with NaN and the infinities.
    #[track_caller]
    fn integral(&self, op: &str, rounding: Rounding) -> Array {
        if let Err(e) = require_numeric(op, self) {
            return Array::failed(e);
        }
        if !self.dtype().is_float() {
            return self.clone();
        }
        let x = no_gradient(&self.cast(DType::F32));
        let small = x.abs().less(INTEGRAL_FROM);
        let truncated = small.select(&x, 0.0).cast(DType::I32).cast(DType::F32);
        let rounded = match rounding {
            Rounding::Floor => truncated.greater(&x).select(&truncated - 1.0, &truncated),
            Rounding::HalfToEven => {
                let fraction = (&x - &truncated).abs();
                let half = &truncated * 0.5;
                let odd = half.cast(DType::I32).cast(DType::F32).not_equal(&half);
                let tie_up = fraction.equal(0.5).select(odd, false_like(&x));
                let up = fraction.greater(0.5).select(true_like(&x), tie_up);
                let away = x.less(0.0).select(-1.0, 1.0);
                up.select(&truncated + &away, &truncated)
            }
        };
        // A zero result takes the sign of the input, as IEEE rounding does.
        let signed = rounded.equal(0.0).select(&x * 0.0, &rounded);
        small.select(&signed, &x).cast(self.dtype())
    }

    /// `log(1 + x)`, accurate for small `x` (floats), as `jax.numpy.log1p`:
    /// where `u = 1 + x` rounds, `log(u) · x / (u − 1)` cancels the
    /// rounding (Goldberg's identity), and where `u` rounds to 1, `x` is the
    /// answer. Its derivatives are those of `log(1 + x)`, `1 / (1 + x)` and
    /// on; at `x ≤ -1`, `+inf` and NaN (where `log1p` is not finite) the
    /// gradient is zero.
    ///
    /// ```
    /// use kiln::Array;
    /// let x = Array::from_vec(vec![1e-10f32], &[1])?;
    /// assert_eq!(x.log1p().to_vec::<f32>()?, [1e-10]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn log1p(&self) -> Array {
        in_composition("log1p", || {
            if let Err(e) = require_float("log1p", self) {
                return Array::failed(e);
            }
            let x = no_gradient(self);
            let u = &x + 1.0;
            let below = &u - 1.0;
            let goldberg = below.equal(0.0).select(&x, u.log() * (&x / &below));
            // At x = +inf the ratio is inf / inf; log(u) is the answer.
            let accurate = u.less(f64::INFINITY).select(goldberg, &u);
            // `plain − no_gradient(plain)` is exactly 0 and carries the
            // derivatives of log(1 + x); where 1 + x is not a positive
            // finite number it is log(1) = 0 with no gradient, so no 0 · ∞
            // reaches a cotangent.
            let shifted = self + 1.0;
            let finite = shifted.less(f64::INFINITY).select(&shifted, 1.0);
            let positive = shifted.greater(0.0).select(&finite, 1.0);
            let plain = positive.log();
            accurate + (&plain - no_gradient(&plain))
        })
    }

    /// Each element limited to `[min, max]` (either bound optional), as
    /// `jax.numpy.clip`: `minimum(maximum(x, min), max)`, so a NaN element
    /// (or a NaN bound) gives NaN, and `min > max` gives `max`. A bound that
    /// an integer dtype cannot hold fails.
    ///
    /// ```
    /// use kiln::Array;
    /// let x = Array::from_vec(vec![-2.0f32, 0.5, 3.0], &[3])?;
    /// assert_eq!(x.clip(Some(0.0), Some(1.0)).to_vec::<f32>()?, [0.0, 0.5, 1.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn clip(&self, min: Option<f64>, max: Option<f64>) -> Array {
        in_composition("clip", || {
            let low = match min {
                Some(m) => self.maximum(m),
                None => self.clone(),
            };
            match max {
                Some(m) => low.minimum(m),
                None => low,
            }
        })
    }
}

/// A bool scalar broadcast like `x` (a branch of a `select` on bools).
fn true_like(x: &Array) -> Array {
    Array::scalar(1.0, DType::Bool).broadcast_to(x.shape().clone())
}

/// See [`true_like`].
fn false_like(x: &Array) -> Array {
    Array::scalar(0.0, DType::Bool).broadcast_to(x.shape().clone())
}

/// Reductions.
impl Array {
    /// The variance over `axes`: the mean squared deviation from the mean,
    /// divided by `N − ddof` (`N` the element count, known per call when
    /// shapeless; `N ≤ ddof` divides by 0: inf or NaN), as
    /// `jax.numpy.var`. Integers and bool give f32; f16 and bf16 compute
    /// in f32 and round once, as [`Array::mean`].
    ///
    /// ```
    /// use kiln::Array;
    /// let x = Array::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4])?;
    /// assert_eq!(x.var(&[0], 0, false).to_vec::<f32>()?, [1.25]);
    /// assert_eq!(x.var(&[0], 1, false).item::<f32>()?, 5.0 / 3.0);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn var(&self, axes: &[isize], ddof: usize, keepdims: bool) -> Array {
        in_composition("var", || {
            self.variance("var", axes, ddof, keepdims)
                .unwrap_or_else(Array::failed)
        })
    }

    /// The standard deviation over `axes`: the square root of
    /// [`Array::var`] with the same `ddof`, as `jax.numpy.std`.
    #[track_caller]
    pub fn std(&self, axes: &[isize], ddof: usize, keepdims: bool) -> Array {
        in_composition("std", || {
            self.variance("std", axes, ddof, keepdims)
                .map(|v| v.sqrt())
                .unwrap_or_else(Array::failed)
        })
    }

    fn variance(&self, op: &str, axes: &[isize], ddof: usize, keepdims: bool) -> Result<Array> {
        self.first_error()?;
        let norm = self.normalize_axes(op, axes)?;
        let wide = match self.dtype() {
            DType::F32 => self.clone(),
            _ => self.cast(DType::F32),
        };
        let deviation = &wide - wide.mean(axes, true);
        let divisor = (count(self, norm, DType::F32) - ddof as f64).maximum(0.0);
        let variance = deviation.square().sum(axes, keepdims) / divisor;
        Ok(match self.dtype() {
            DType::F16 | DType::BF16 => variance.cast(self.dtype()),
            _ => variance,
        })
    }

    /// `log(Σ exp(x))` over `axes` (floats), as
    /// `jax.nn.logsumexp`/`jax.scipy.special.logsumexp`: computed as
    /// `m + log(Σ exp(x − m))` with `m` the maximum (held without
    /// gradient), so large values do not overflow; a group whose maximum
    /// is infinite shifts by 0, so all `-inf` gives `-inf` and a `+inf`
    /// gives `+inf`. Its gradient is the softmax. An empty axis fails.
    ///
    /// ```
    /// use kiln::Array;
    /// let x = Array::from_vec(vec![1000.0f32, 1000.0], &[2])?;
    /// let want = 1000.0 + 2f32.ln();
    /// assert!((x.logsumexp(&[0], false).item::<f32>()? - want).abs() < 1e-3);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn logsumexp(&self, axes: &[isize], keepdims: bool) -> Array {
        in_composition("logsumexp", || {
            if let Err(e) = require_float("logsumexp", self) {
                return Array::failed(e);
            }
            let peak = no_gradient(&self.max(axes, true));
            let shift = peak.abs().less(f64::INFINITY).select(&peak, 0.0);
            let total = (self - &shift).exp().sum(axes, true).log() + &shift;
            match keepdims {
                true => total,
                false => total.squeeze(axes),
            }
        })
    }

    /// The product over `axes`, as `jax.numpy.prod`; integers wrap, an
    /// empty axis gives 1, bool fails. Multiplied in pairs (halves of the
    /// axis, then halves of those), so a float product may differ from a
    /// left-to-right one in its last bits; it needs the reduced sizes
    /// known when traced (a symbolic reduced axis fails in a shapeless
    /// compile).
    ///
    /// ```
    /// use kiln::Array;
    /// let x = Array::from_vec(vec![1i32, 2, 3, 4, 5, 6], &[2, 3])?;
    /// assert_eq!(x.prod(&[1], false).to_vec::<i32>()?, [6, 120]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn prod(&self, axes: &[isize], keepdims: bool) -> Array {
        in_composition("prod", || {
            self.product(axes, keepdims).unwrap_or_else(Array::failed)
        })
    }

    fn product(&self, axes: &[isize], keepdims: bool) -> Result<Array> {
        require_numeric("prod", self)?;
        let norm = self.normalize_axes("prod", axes)?;
        let mut x = self.clone();
        for &axis in &norm {
            x = x.product_along(axis)?;
        }
        Ok(match keepdims {
            true => x,
            false => x.squeeze(axes),
        })
    }

    /// The product along `axis`, kept as a size-1 axis.
    fn product_along(&self, axis: usize) -> Result<Array> {
        let Dim::Known(mut n) = self.shape().dims()[axis] else {
            return Err(shape_err(
                "prod",
                &[self.aval()],
                format!("axis {axis} is symbolic; prod multiplies halves, so it needs its size when traced"),
            ));
        };
        if n == 0 {
            let mut dims = self.shape().dims().to_vec();
            dims[axis] = Dim::Known(1);
            return Ok(Array::scalar(1.0, self.dtype()).broadcast_to(Shape(dims)));
        }
        let mut x = self.clone();
        let axis = axis as isize;
        while n > 1 {
            let half = (n / 2) as i64;
            let first = x.slice_axis(axis, 0, Some(half), 1);
            let second = x.slice_axis(axis, half, Some(2 * half), 1);
            let paired = first * second;
            x = match n % 2 {
                0 => paired,
                _ => concat(&[paired, x.slice_axis(axis, 2 * half, None, 1)], axis),
            };
            n -= n / 2;
        }
        Ok(x)
    }

    /// Index (u32) of the minimum along `axis`, the first on ties and the
    /// first NaN if any, as `jax.numpy.argmin`. Built as [`Array::argmax`]
    /// of an order-reversing map that keeps ties and NaN: `-x` for floats,
    /// `-1 − x` for i32 (no overflow, unlike `-x` at `i32::MIN`), `MAX − x`
    /// for unsigned integers, `1 − x` for bool.
    ///
    /// ```
    /// use kiln::Array;
    /// let x = Array::from_vec(vec![3i32, i32::MIN, 5, i32::MIN], &[4])?;
    /// assert_eq!(x.argmin(0, false).to_vec::<u32>()?, [1]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn argmin(&self, axis: isize, keepdims: bool) -> Array {
        in_composition("argmin", || {
            let reversed = match self.dtype() {
                d if d.is_float() => self.neg(),
                DType::I32 => Array::scalar(-1.0, DType::I32) - self,
                DType::U32 => Array::scalar(f64::from(u32::MAX), DType::U32) - self,
                DType::U8 => Array::scalar(255.0, DType::U8) - self,
                _ => Array::scalar(1.0, DType::U8) - self.cast(DType::U8),
            };
            reversed.argmax(axis, keepdims)
        })
    }

    /// Running sums along `axis`: element `j` is the sum of elements `0..=j`,
    /// as `jax.numpy.cumsum` with an axis. Integers wrap and keep their
    /// dtype (as Kiln's [`Array::sum`]; JAX widens u8 to u32), bool counts
    /// as i32. Computed as a product with the upper-triangular ones (`n²`
    /// multiply-adds per row of length `n`), and for a known `n` above 256
    /// in blocks of `√n` (about `2·n^1.5`), so it runs on every matmul
    /// kernel; floats accumulate as matmul does (f16/bf16 in f32). A
    /// symbolic axis takes the single `n × n` mask, which counts against
    /// [`crate::Limits`]: tens of thousands are refused with an `Err`.
    ///
    /// ```
    /// use kiln::Array;
    /// let x = Array::from_vec(vec![1i32, 2, 3, 4], &[2, 2])?;
    /// assert_eq!(x.cumsum(0).to_vec::<i32>()?, [1, 2, 4, 6]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn cumsum(&self, axis: isize) -> Array {
        in_composition("cumsum", || {
            self.running_sum(axis).unwrap_or_else(Array::failed)
        })
    }

    fn running_sum(&self, axis: isize) -> Result<Array> {
        self.first_error()?;
        let axis = self.normalize_axis("cumsum", axis)? as isize;
        let x = match self.dtype() {
            DType::Bool => self.cast(DType::I32),
            _ => self.clone(),
        };
        let last = x.swap_axes(axis, -1);
        let sums = match last.shape().dims().last() {
            Some(Dim::Known(n)) if *n > BLOCKED_FROM => blocked_prefix_sums(&last, *n),
            _ => prefix_sums(&last),
        };
        Ok(sums.swap_axes(axis, -1))
    }
}

/// Axes longer than this sum in blocks ([`blocked_prefix_sums`]).
const BLOCKED_FROM: usize = 256;

/// Running sums along the last axis of `x`, as `x @ mask` with the
/// upper-triangular ones: `n²` multiply-adds for a row of `n`.
fn prefix_sums(x: &Array) -> Array {
    let positions = x.iota(-1, DType::I32);
    // mask[i, j] = 1 where i ≤ j: output j sums inputs 0..=j.
    let mask = positions
        .expand_dims(-1)
        .less_equal(&positions)
        .cast(x.dtype());
    x.expand_dims(-2).matmul(&mask).squeeze(&[-2])
}

/// Running sums along the last axis (of known size `n`) in √n blocks of
/// √n: the sums within each block, plus the running sum of the blocks'
/// totals before it, so a row costs about `2·n^1.5` multiply-adds and
/// masks of `√n × √n` (a vocabulary of 50,257 in blocks of 225).
fn blocked_prefix_sums(x: &Array, n: usize) -> Array {
    let width = (n as f64).sqrt().ceil() as usize;
    let blocks = n.div_ceil(width);
    let mut dims = x.shape().dims().to_vec();
    let last = dims.len() - 1;
    // Zeros after the end fill the last block; they add nothing.
    dims[last] = Dim::Known(blocks * width - n);
    let filled = concat(
        &[
            x.clone(),
            Array::scalar(0.0, x.dtype()).broadcast_to(Shape(dims.clone())),
        ],
        -1,
    );
    dims[last] = Dim::Known(blocks);
    dims.push(Dim::Known(width));
    let within = prefix_sums(&filled.reshape_to(Shape(dims.clone())));
    let totals = within.slice_axis(-1, width as i64 - 1, None, 1);
    let before = prefix_sums(&totals.squeeze(&[-1])).expand_dims(-1) - &totals;
    dims.pop();
    dims[last] = Dim::Known(blocks * width);
    (within + before)
        .reshape_to(Shape(dims))
        .slice_axis(-1, 0, Some(n as i64), 1)
}

/// Sorting: the `argsort` op ([`crate::ops::sort`]) and a gather by its
/// order.
impl Array {
    /// The indices (i32, as JAX gives) that sort `self` along `axis`,
    /// ascending or descending, stably: equal elements keep their order,
    /// so ties go to the lower index either way. NaN sorts above `+inf`
    /// (last ascending, first descending), `-0.0` equals `0.0`. As
    /// `jax.numpy.argsort(x, axis, stable=True, descending=…)`; no
    /// gradient (integer indices).
    ///
    /// The GPU kernel places each element by counting the elements of its
    /// row that sort before it: `n²` comparisons for a row of `n` over `n`
    /// invocations; the CPU sorts each row.
    ///
    /// ```
    /// use kiln::Array;
    /// let x = Array::from_vec(vec![3.0f32, 1.0, 3.0, f32::NAN, 2.0], &[5])?;
    /// assert_eq!(x.argsort(0, false).to_vec::<i32>()?, [1, 4, 0, 2, 3]);
    /// assert_eq!(x.argsort(0, true).to_vec::<i32>()?, [3, 0, 2, 4, 1]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn argsort(&self, axis: isize, descending: bool) -> Array {
        match self.normalize_axis("argsort", axis) {
            Ok(axis) => Array::apply(Op::Argsort { axis, descending }, vec![self.clone()]),
            Err(e) => Array::failed(e),
        }
    }

    /// `self` sorted ascending along `axis`, stably, with NaN last, as
    /// `jax.numpy.sort`; see [`Array::argsort`] for the order. The values
    /// are gathered by the order (`take` of the flattened rows), so the
    /// gradient reaches each element at its sorted place.
    ///
    /// ```
    /// use kiln::Array;
    /// let x = Array::from_vec(vec![3i32, -1, 2, 0], &[2, 2])?;
    /// assert_eq!(x.sort(-1).to_vec::<i32>()?, [-1, 3, 0, 2]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn sort(&self, axis: isize) -> Array {
        in_composition("sort", || {
            let order = self.argsort(axis, false);
            match self.normalize_axis("sort", axis) {
                Ok(a) => self
                    .swap_axes(a as isize, -1)
                    .gather_rows(&order.swap_axes(a as isize, -1))
                    .swap_axes(a as isize, -1),
                Err(e) => Array::failed(e),
            }
        })
    }

    /// The `k` largest elements along the last axis, largest first, and
    /// their indices (i32), as `jax.lax.top_k`: ties go to the lower index,
    /// NaN counts as the largest. `k` above the axis' size fails. See
    /// [`Array::argsort`] for the cost.
    ///
    /// ```
    /// use kiln::Array;
    /// let x = Array::from_vec(vec![1.0f32, 5.0, 3.0, 5.0], &[4])?;
    /// let (values, indices) = x.top_k(2);
    /// assert_eq!(values.to_vec::<f32>()?, [5.0, 5.0]);
    /// assert_eq!(indices.to_vec::<i32>()?, [1, 3]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn top_k(&self, k: usize) -> (Array, Array) {
        in_composition("top_k", || match self.largest(k) {
            Ok(indices) => (self.gather_rows(&indices), indices),
            Err(e) => (Array::failed(e.clone()), Array::failed(e)),
        })
    }

    fn largest(&self, k: usize) -> Result<Array> {
        self.first_error()?;
        if self.ndim() == 0 {
            return Err(shape_err(
                "top_k",
                &[self.aval()],
                "needs at least one axis",
            ));
        }
        let n = &self.shape().dims()[self.ndim() - 1];
        if let Dim::Known(n) = n {
            if k > *n {
                return Err(arg_err(
                    "top_k",
                    format!("k = {k} is above the last axis' size {n}"),
                ));
            }
        }
        let k = i64::try_from(k).unwrap_or(i64::MAX);
        Ok(self.argsort(-1, true).slice_axis(-1, 0, Some(k), 1))
    }

    /// The entries of each row (last axis) at the i32 positions of the
    /// same row of `positions` (`[.., k]` against `self: [.., n]`): `take`
    /// of the flattened array at each row's start plus the position, so it
    /// costs one read per output, where `take_along_axis` builds a one-hot
    /// mask of `k × n` per row.
    fn gather_rows(&self, positions: &Array) -> Array {
        let flat = self.flatten();
        let offsets = flat.iota(0, DType::I32).reshape_to(self.shape().clone());
        let row_starts = (offsets - self.iota(-1, DType::I32)).slice_axis(-1, 0, Some(1), 1);
        let at = (row_starts + positions).flatten();
        flat.take(&at, 0).reshape_to(positions.shape().clone())
    }
}

/// Layout compositions.
impl Array {
    /// The elements in one axis, row-major (a 0-d array gives one
    /// element), as `jax.numpy.ravel`.
    #[track_caller]
    pub fn flatten(&self) -> Array {
        in_composition("flatten", || {
            self.reshape_to(Shape(vec![self.shape().numel()]))
        })
    }

    /// `self` split along `axis` into `sections` equal parts, as
    /// `jax.numpy.split(x, sections, axis)`: `Err` when the size is not a
    /// multiple of `sections` (or unknown at trace time) or `sections` is
    /// 0.
    #[track_caller]
    pub fn split(&self, sections: usize, axis: isize) -> Result<Vec<Array>> {
        in_composition("split", || {
            self.first_error()?;
            let a = self.normalize_axis("split", axis)?;
            let n = match &self.shape().dims()[a] {
                // An empty axis splits into one part only: NumPy's parts of
                // nothing would be as many empty arrays as asked for.
                Dim::Known(n) if sections > 0 && sections <= *n.max(&1) && n % sections == 0 => *n,
                d => {
                    return Err(arg_err(
                        "split",
                        format!("cannot split axis {a} of size {d} into {sections} equal parts"),
                    ))
                }
            };
            let step = n / sections;
            let cuts: Vec<usize> = (1..sections).map(|s| s * step).collect();
            self.split_at(&cuts, axis)
        })
    }

    /// `self` cut along `axis` before each of `indices`, as
    /// `jax.numpy.split(x, indices, axis)`: `len(indices) + 1` parts, an
    /// index past the end clamps (an empty part), as NumPy does.
    ///
    /// ```
    /// use kiln::Array;
    /// let x = Array::from_vec(vec![0i32, 1, 2, 3, 4], &[5])?;
    /// let parts = x.split_at(&[1, 3], 0)?;
    /// assert_eq!(parts[1].to_vec::<i32>()?, [1, 2]);
    /// assert_eq!(parts[2].to_vec::<i32>()?, [3, 4]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn split_at(&self, indices: &[usize], axis: isize) -> Result<Vec<Array>> {
        in_composition("split", || {
            self.first_error()?;
            self.normalize_axis("split", axis)?;
            // An index beyond i64 is past every end, as i64::MAX is.
            let index = |i: usize| i64::try_from(i).unwrap_or(i64::MAX);
            let starts = std::iter::once(0).chain(indices.iter().map(|&i| index(i)));
            let stops = indices.iter().map(|&i| Some(index(i))).chain([None]);
            Ok(starts
                .zip(stops)
                .map(|(start, stop)| {
                    let stop = stop.map(|s| s.max(start));
                    self.slice_axis(axis, start, stop, 1)
                })
                .collect())
        })
    }

    /// `self` repeated `reps[i]` times along axis `i`, as
    /// `jax.numpy.tile`: a shorter `reps` applies to the last axes, a
    /// longer one adds leading axes.
    ///
    /// ```
    /// use kiln::Array;
    /// let x = Array::from_vec(vec![1i32, 2], &[2])?;
    /// assert_eq!(x.tile(&[2, 2]).to_vec::<i32>()?, [1, 2, 1, 2, 1, 2, 1, 2]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn tile(&self, reps: &[usize]) -> Array {
        in_composition("tile", || {
            let rank = self.ndim().max(reps.len());
            let mut dims = vec![Dim::Known(1); rank - self.ndim()];
            dims.extend(self.shape().dims().iter().cloned());
            let mut reps_full = vec![1; rank - reps.len()];
            reps_full.extend_from_slice(reps);
            // [1, d0, 1, d1, ..] broadcast to [r0, d0, r1, d1, ..] and merged.
            let spread: Vec<Dim> = dims
                .iter()
                .flat_map(|d| [Dim::Known(1), d.clone()])
                .collect();
            let wide: Vec<Dim> = dims
                .iter()
                .zip(&reps_full)
                .flat_map(|(d, &r)| [Dim::Known(r), d.clone()])
                .collect();
            let merged: Vec<Dim> = dims
                .iter()
                .zip(&reps_full)
                .map(|(d, &r)| d.mul(&Dim::Known(r)))
                .collect();
            self.reshape_to(Shape(spread))
                .broadcast_to(Shape(wide))
                .reshape_to(Shape(merged))
        })
    }

    /// Each element repeated `repeats` times along `axis`, as
    /// `jax.numpy.repeat(x, repeats, axis)`.
    ///
    /// ```
    /// use kiln::Array;
    /// let x = Array::from_vec(vec![1i32, 2], &[2])?;
    /// assert_eq!(x.repeat(2, 0).to_vec::<i32>()?, [1, 1, 2, 2]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn repeat(&self, repeats: usize, axis: isize) -> Array {
        in_composition("repeat", || {
            let a = match self
                .first_error()
                .and_then(|()| self.normalize_axis("repeat", axis))
            {
                Ok(a) => a,
                Err(e) => return Array::failed(e),
            };
            let dims = self.shape().dims();
            let mut wide = dims.to_vec();
            wide.insert(a + 1, Dim::Known(repeats));
            let mut merged = dims.to_vec();
            merged[a] = dims[a].mul(&Dim::Known(repeats));
            self.expand_dims(a as isize + 1)
                .broadcast_to(Shape(wide))
                .reshape_to(Shape(merged))
        })
    }

    /// `self` with `widths[i] = (before, after)` elements of `value` added
    /// around axis `i`, as `jax.numpy.pad(x, widths, constant_values=value)`
    /// (constant mode): a concatenation with filled edges, per axis. One
    /// pair per axis, and a `value` the dtype holds, else `Err`.
    ///
    /// ```
    /// use kiln::Array;
    /// let x = Array::from_vec(vec![1i32, 2], &[2])?;
    /// assert_eq!(x.pad(&[(1, 2)], 9.0).to_vec::<i32>()?, [9, 1, 2, 9, 9]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn pad(&self, widths: &[(usize, usize)], value: f64) -> Array {
        in_composition("pad", || {
            if let Err(e) = self.first_error() {
                return Array::failed(e);
            }
            if widths.len() != self.ndim() {
                return Array::failed(arg_err(
                    "pad",
                    format!(
                        "needs one (before, after) pair per axis: {} for rank {}",
                        widths.len(),
                        self.ndim()
                    ),
                ));
            }
            let mut padded = self.clone();
            // The padded shape so far, from `self`'s (a failed concat's
            // array has no shape to read).
            let mut dims = self.shape().dims().to_vec();
            for (axis, &(before, after)) in widths.iter().enumerate() {
                let edge = |n: usize| {
                    let mut edge = dims.clone();
                    edge[axis] = Dim::Known(n);
                    value.into_array(self.dtype()).broadcast_to(Shape(edge))
                };
                let mut parts = Vec::with_capacity(3);
                if before > 0 {
                    parts.push(edge(before));
                }
                parts.push(padded.clone());
                if after > 0 {
                    parts.push(edge(after));
                }
                if parts.len() > 1 {
                    padded = concat(&parts, axis as isize);
                }
                dims[axis] = dims[axis].add(&Dim::Known(before.saturating_add(after)));
            }
            padded
        })
    }
}

/// `arrays` (one shape) stacked along a new `axis`, as `jax.numpy.stack`;
/// no arrays, or arrays of different shapes, fail.
///
/// ```
/// use kiln::Array;
/// let a = Array::from_vec(vec![1i32, 2], &[2])?;
/// let b = Array::from_vec(vec![3i32, 4], &[2])?;
/// assert_eq!(kiln::stack(&[a.clone(), b.clone()], 1).to_vec::<i32>()?, [1, 3, 2, 4]);
/// # Ok::<(), kiln::Error>(())
/// ```
#[track_caller]
pub fn stack(arrays: &[Array], axis: isize) -> Array {
    in_composition("stack", || {
        let Some(first) = arrays.first() else {
            return Array::failed(arg_err("stack", "needs at least one array"));
        };
        if let Some(e) = arrays.iter().find_map(|a| a.first_error().err()) {
            return Array::failed(e);
        }
        if arrays.iter().any(|a| a.shape() != first.shape()) {
            let avals: Vec<_> = arrays.iter().map(Array::aval).collect();
            return Array::failed(shape_err("stack", &avals, "needs arrays of one shape"));
        }
        match normalize_axis("stack", axis, first.ndim() + 1) {
            Ok(a) => {
                let expanded: Vec<Array> =
                    arrays.iter().map(|x| x.expand_dims(a as isize)).collect();
                concat(&expanded, a as isize)
            }
            Err(e) => Array::failed(e),
        }
    })
}

/// Arrays from constructors JAX infers from its arguments.
impl Array {
    /// Ones with this array's shape (symbolic dims included) and dtype, as
    /// `jax.numpy.ones_like`; see [`Array::zeros_like`].
    #[track_caller]
    pub fn ones_like(&self) -> Array {
        Array::scalar(1.0, self.dtype()).broadcast_to(self.shape().clone())
    }

    /// `start, start + step, …` below `stop` (above, for a negative step)
    /// as i32, as `jax.numpy.arange` with integer arguments (JAX's default
    /// integer is int32); `Err` for a zero step or a value outside i32.
    ///
    /// ```
    /// use kiln::Array;
    /// assert_eq!(Array::arange_i32(0, 5, 2)?.to_vec::<i32>()?, [0, 2, 4]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn arange_i32(start: i64, stop: i64, step: i64) -> Result<Array> {
        let fits = |v: i64| i32::try_from(v).is_ok();
        if step == 0 || !fits(start) || !fits(stop) {
            return Err(arg_err(
                "arange",
                format!("needs i32 bounds and a non-zero step, got start={start} stop={stop} step={step}"),
            ));
        }
        // In i128: `-step` of i64::MIN and the span of the bounds fit.
        let (span, step) = (i128::from(stop) - i128::from(start), i128::from(step));
        let len = match (span > 0, step > 0) {
            (true, true) | (false, false) if span != 0 => {
                (span.abs() + step.abs() - 1) / step.abs()
            }
            _ => 0,
        };
        // At most 2^32 values lie between two i32 bounds.
        let len = len as usize;
        crate::limits::check_shape("arange", &[len], DType::I32)?;
        let values: Vec<i32> = (0..len as i128)
            .map(|i| (i128::from(start) + i * step) as i32)
            .collect();
        Array::from_vec(values, &[len])
    }

    /// `num` evenly spaced values from `start` to `stop` (included when
    /// `endpoint`), as `jax.numpy.linspace`; computed in f64 as `start +
    /// i·step` (the last one exactly `stop`) and converted to `dtype` once.
    ///
    /// ```
    /// use kiln::{Array, DType};
    /// let x = Array::linspace(0.0, 1.0, 5, true, DType::F32)?;
    /// assert_eq!(x.to_vec::<f32>()?, [0.0, 0.25, 0.5, 0.75, 1.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn linspace(
        start: f64,
        stop: f64,
        num: usize,
        endpoint: bool,
        dtype: DType,
    ) -> Result<Array> {
        if !start.is_finite() || !stop.is_finite() {
            return Err(arg_err(
                "linspace",
                format!("needs finite bounds, got start={start} stop={stop}"),
            ));
        }
        crate::limits::check_shape("linspace", &[num], dtype)?;
        let intervals = match endpoint {
            true => num.saturating_sub(1).max(1),
            false => num.max(1),
        };
        let step = (stop - start) / intervals as f64;
        let values = (0..num).map(|i| match endpoint && i + 1 == num && num > 1 {
            true => stop,
            false => start + step * i as f64,
        });
        let data = crate::data::HostData::try_from_f64s("linspace", dtype, num, values)?;
        Array::from_data(data, &[num])
    }

    /// The `n × m` matrix (`m = n` when `None`) with ones on diagonal `k`
    /// (`k > 0` above the main one, `k < 0` below) and zeros elsewhere, as
    /// `jax.numpy.eye`.
    ///
    /// ```
    /// use kiln::{Array, DType};
    /// let i = Array::eye(2, Some(3), 1, DType::I32);
    /// assert_eq!(i.to_vec::<i32>()?, [0, 1, 0, 0, 0, 1]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn eye(n: usize, m: Option<usize>, k: i64, dtype: DType) -> Array {
        in_composition("eye", || {
            let grid = Array::scalar(0.0, DType::Bool).broadcast_to([n, m.unwrap_or(n)]);
            let rows = grid.iota(0, DType::I32).expand_dims(-1);
            let cols = grid.iota(1, DType::I32);
            // A `k` beyond i32 hits no entry, and neither does the clamped one.
            let k = k.clamp(i32::MIN.into(), i32::MAX.into());
            (cols - rows).equal(k).cast(dtype)
        })
    }
}

/// Each composition against a host reference written as plain loops (on
/// the CPU executor; `tests/tests/conformance.rs` runs them on wgpu too),
/// with its dtypes, empty and 0-d operands and errors; jvp against central
/// differences and vmap against stacking per example.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::rule_checks as rules;
    use crate::Error;
    use proptest::prelude::*;

    fn f32s(a: &Array) -> Vec<f32> {
        a.to_vec::<f32>().unwrap_or_else(|e| panic!("{e}"))
    }

    fn vec_f32(values: &[f32]) -> Array {
        rules::array(values, &[values.len()])
    }

    /// Bitwise equality, every NaN alike (signed zeros told apart).
    fn assert_bits(got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let same = (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits();
            assert!(same, "element {i}: got {g:?}, want {w:?}");
        }
    }

    /// Values that exercise rounding: halves, near-halves, signed zeros,
    /// large and non-finite values.
    const EDGES: [f32; 18] = [
        0.5,
        1.5,
        2.5,
        -0.5,
        -1.5,
        -2.5,
        0.49999997,
        -0.3,
        -0.0,
        0.0,
        1.7,
        -1.7,
        8_388_607.5,
        16_777_216.0,
        -3.0e9,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ];

    #[test]
    fn floor_and_round_match_std_bit_for_bit_with_half_to_even() {
        let x = vec_f32(&EDGES);
        let floor: Vec<f32> = EDGES.iter().map(|v| v.floor()).collect();
        let round: Vec<f32> = EDGES.iter().map(|v| v.round_ties_even()).collect();
        assert_bits(&f32s(&x.floor()), &floor);
        assert_bits(&f32s(&x.round()), &round);
    }

    #[test]
    fn floor_and_round_keep_half_floats_and_integers() {
        let halves = vec_f32(&[2.5, -1.5, 3.7]).cast(DType::F16);
        let got = halves.round().cast(DType::F32);
        assert_eq!(halves.round().dtype(), DType::F16);
        assert_eq!(f32s(&got), [2.0, -2.0, 4.0]);
        let ints = Array::from_vec(vec![-3i32, 7], &[2]).unwrap();
        assert_eq!(ints.floor().to_vec::<i32>().unwrap(), [-3, 7]);
        let err = Array::scalar(1.0, DType::Bool).round().check().unwrap_err();
        assert!(
            matches!(&err, Error::DType { op, .. } if op == "round"),
            "{err}"
        );
    }

    #[test]
    fn sign_keeps_signed_zeros_and_nan_and_unsigned_gives_zero_or_one() {
        let x = vec_f32(&[-2.0, -0.0, 0.0, 3.0, f32::NAN, f32::NEG_INFINITY]);
        assert_bits(&f32s(&x.sign()), &[-1.0, -0.0, 0.0, 1.0, f32::NAN, -1.0]);
        let i = Array::from_vec(vec![-5i32, 0, 9], &[3]).unwrap();
        assert_eq!(i.sign().to_vec::<i32>().unwrap(), [-1, 0, 1]);
        let u = Array::from_vec(vec![0u8, 200], &[2]).unwrap();
        assert_eq!(u.sign().to_vec::<u8>().unwrap(), [0, 1]);
    }

    #[test]
    fn log1p_is_accurate_where_log_of_one_plus_x_is_not() {
        let values = [
            1e-10f32,
            -1e-7,
            3e-5,
            0.5,
            -0.5,
            10.0,
            -1.0,
            -2.0,
            f32::INFINITY,
        ];
        let got = f32s(&vec_f32(&values).log1p());
        for (&x, g) in values.iter().zip(got) {
            let want = f64::from(x).ln_1p();
            if want.is_nan() {
                assert!(g.is_nan(), "log1p({x}) = {g}");
            } else if want.is_infinite() {
                assert_eq!(f64::from(g), want, "log1p({x})");
            } else {
                let error = (f64::from(g) - want).abs() / want.abs();
                assert!(
                    error < 4.0 * f64::from(f32::EPSILON),
                    "log1p({x}) = {g}, want {want}"
                );
            }
        }
    }

    #[test]
    fn square_tan_and_clip_match_loops() {
        let values = [-2.0f32, -0.25, 0.0, 0.7, 1.5];
        let x = vec_f32(&values);
        let square: Vec<f32> = values.iter().map(|v| v * v).collect();
        assert_eq!(f32s(&x.square()), square);
        for (g, v) in f32s(&x.tan()).iter().zip(values) {
            assert!((g - v.tan()).abs() <= 4.0 * f32::EPSILON * v.tan().abs().max(1.0));
        }
        let clipped: Vec<f32> = values.iter().map(|v| v.clamp(-0.5, 1.0)).collect();
        assert_eq!(f32s(&x.clip(Some(-0.5), Some(1.0))), clipped);
        assert_eq!(f32s(&x.clip(None, Some(0.0))), [-2.0, -0.25, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn clip_propagates_nan_and_rejects_bounds_an_integer_cannot_hold() {
        let x = vec_f32(&[f32::NAN, 3.0]);
        let got = f32s(&x.clip(Some(0.0), Some(1.0)));
        assert!(got[0].is_nan() && got[1] == 1.0);
        let bytes = Array::from_vec(vec![5u8, 250], &[2]).unwrap();
        assert_eq!(
            bytes.clip(Some(10.0), Some(200.0)).to_vec::<u8>().unwrap(),
            [10, 200]
        );
        assert!(bytes.clip(Some(-1.0), None).check().is_err());
    }

    #[test]
    fn compositions_take_zero_d_and_empty_arrays() {
        let scalar = Array::scalar(-2.5, DType::F32);
        assert_eq!(f32s(&scalar.round()), [-2.0]);
        assert_eq!(f32s(&scalar.square()), [6.25]);
        assert_eq!(scalar.sign().dims(), Some(vec![]));
        assert_eq!(f32s(&scalar.flatten()), [-2.5]);
        assert_eq!(scalar.flatten().dims(), Some(vec![1]));
        let empty = Array::zeros(&[0, 3], DType::F32);
        assert_eq!(empty.log1p().dims(), Some(vec![0, 3]));
        assert_eq!(empty.cumsum(0).dims(), Some(vec![0, 3]));
        assert_eq!(empty.sort(0).dims(), Some(vec![0, 3]));
        assert_eq!(f32s(&empty.prod(&[0], false)), [1.0, 1.0, 1.0]);
        assert_eq!(f32s(&empty.sum(&[0], false)), [0.0, 0.0, 0.0]);
        assert_eq!(empty.tile(&[2, 1]).dims(), Some(vec![0, 3]));
        assert!(scalar.cumsum(0).check().is_err());
        assert!(scalar.argsort(0, false).check().is_err());
    }

    /// `[rows, n]` row-major `x` reduced along axis 1 by `f`, in f64.
    fn rows(x: &[f32], n: usize, f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
        x.chunks(n.max(1))
            .map(|r| f(&r.iter().map(|&v| f64::from(v)).collect::<Vec<_>>()))
            .collect()
    }

    fn assert_near(got: &[f32], want: &[f64], tolerance: f64) {
        assert_eq!(got.len(), want.len());
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!(
                (f64::from(g) - w).abs() <= tolerance * w.abs().max(1.0),
                "element {i}: {g} vs {w}"
            );
        }
    }

    #[test]
    fn var_std_and_logsumexp_match_loops() {
        let x = rules::normal(1, &[3, 5]);
        let v = f32s(&x);
        let variance = |ddof: f64| {
            move |r: &[f64]| {
                let mean = r.iter().sum::<f64>() / r.len() as f64;
                r.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / (r.len() as f64 - ddof)
            }
        };
        assert_near(
            &f32s(&x.var(&[1], 0, false)),
            &rows(&v, 5, variance(0.0)),
            1e-5,
        );
        let std1: Vec<f64> = rows(&v, 5, variance(1.0))
            .iter()
            .map(|a| a.sqrt())
            .collect();
        assert_near(&f32s(&x.std(&[-1], 1, false)), &std1, 1e-5);
        assert_eq!(x.var(&[1], 0, true).dims(), Some(vec![3, 1]));
        let lse = rows(&v, 5, |r| r.iter().map(|a| a.exp()).sum::<f64>().ln());
        assert_near(&f32s(&x.logsumexp(&[1], false)), &lse, 1e-5);
        let ints = Array::from_vec(vec![1i32, 2, 3, 4], &[4]).unwrap();
        assert_eq!(f32s(&ints.var(&[0], 0, false)), [1.25]);
    }

    #[test]
    fn logsumexp_of_large_and_infinite_values_stays_finite_or_exact() {
        let x = rules::array(
            &[
                1000.0,
                1000.0,
                f32::NEG_INFINITY,
                f32::NEG_INFINITY,
                1.0,
                f32::INFINITY,
            ],
            &[3, 2],
        );
        let got = f32s(&x.logsumexp(&[1], false));
        assert!((got[0] - (1000.0 + 2f32.ln())).abs() < 1e-3);
        assert_eq!(got[1..], [f32::NEG_INFINITY, f32::INFINITY]);
    }

    #[test]
    fn prod_matches_loops_for_any_axis_length_and_wraps_integers() {
        for n in 0..8 {
            let values: Vec<i32> = (0..3 * n as i32).map(|i| (i % 5) - 2).collect();
            let x = Array::from_vec(values.clone(), &[3, n]).unwrap();
            let want: Vec<i32> = (0..3)
                .map(|r| {
                    values[r * n..(r + 1) * n]
                        .iter()
                        .fold(1i32, |a, &b| a.wrapping_mul(b))
                })
                .collect();
            assert_eq!(
                x.prod(&[1], false).to_vec::<i32>().unwrap(),
                want,
                "n = {n}"
            );
        }
        let big = Array::full(&[40], 3.0, DType::I32);
        assert_eq!(
            big.prod(&[0], false).to_vec::<i32>().unwrap(),
            [3i32.wrapping_pow(40)]
        );
        let f = rules::normal(2, &[2, 3, 4]);
        let want = rows(&f32s(&f.permute(&[1, 0, 2])), 8, |r| r.iter().product());
        assert_near(&f32s(&f.prod(&[0, 2], false)), &want, 1e-5);
    }

    #[test]
    fn argmin_takes_the_first_minimum_and_the_first_nan_in_every_dtype() {
        let f = vec_f32(&[3.0, -1.0, -1.0, 2.0]);
        assert_eq!(f.argmin(0, false).to_vec::<u32>().unwrap(), [1]);
        let nan = vec_f32(&[3.0, f32::NAN, -5.0, f32::NAN]);
        assert_eq!(nan.argmin(0, false).to_vec::<u32>().unwrap(), [1]);
        let i = Array::from_vec(vec![i32::MAX, i32::MIN, 0, i32::MIN], &[4]).unwrap();
        assert_eq!(i.argmin(0, true).to_vec::<u32>().unwrap(), [1]);
        let u = Array::from_vec(vec![7u32, u32::MAX, 0, 0], &[4]).unwrap();
        assert_eq!(u.argmin(0, false).to_vec::<u32>().unwrap(), [2]);
        let b = Array::from_vec(vec![true, false, false, true], &[2, 2]).unwrap();
        assert_eq!(b.argmin(1, false).to_vec::<u32>().unwrap(), [1, 0]);
        let h = rules::array(&[2.0, 1.0, 1.0], &[3]).cast(DType::BF16);
        assert_eq!(h.argmin(0, false).to_vec::<u32>().unwrap(), [1]);
    }

    #[test]
    fn cumsum_matches_running_sums_along_each_axis() {
        let x = rules::normal(3, &[2, 3, 4]);
        let v = f32s(&x);
        for axis in 0..3 {
            let dims = [2usize, 3, 4];
            let strides = [12usize, 4, 1];
            let mut want = vec![0.0f64; 24];
            for (flat, w) in want.iter_mut().enumerate() {
                let position = (flat / strides[axis]) % dims[axis];
                let start = flat - position * strides[axis];
                *w = (0..=position)
                    .map(|p| f64::from(v[start + p * strides[axis]]))
                    .sum();
            }
            assert_near(&f32s(&x.cumsum(axis as isize)), &want, 1e-5);
        }
        let ints = Array::from_vec(vec![i32::MAX, 1, true as i32], &[3]).unwrap();
        assert_eq!(
            ints.cumsum(0).to_vec::<i32>().unwrap(),
            [i32::MAX, i32::MIN, i32::MIN + 1]
        );
        let bools = Array::from_vec(vec![true, false, true], &[3]).unwrap();
        assert_eq!(bools.cumsum(-1).to_vec::<i32>().unwrap(), [1, 1, 2]);
    }

    #[test]
    fn cumsum_of_long_axes_sums_in_blocks_exactly_for_integers() {
        for n in [257, 1000, 50_257] {
            let values: Vec<i32> = (0..n as i32).map(|i| (i * 7919) % 13 - 6).collect();
            let x = Array::from_vec(values.clone(), &[1, n]).unwrap();
            let want: Vec<i32> = values
                .iter()
                .scan(0i32, |sum, &v| {
                    *sum = sum.wrapping_add(v);
                    Some(*sum)
                })
                .collect();
            assert_eq!(x.cumsum(1).to_vec::<i32>().unwrap(), want, "n = {n}");
        }
        let f = rules::normal(50, &[300, 2]);
        let want: Vec<f64> = (0..600)
            .map(|flat| {
                let (row, col) = (flat / 2, flat % 2);
                (0..=row).map(|r| rules::values(&f)[r * 2 + col]).sum()
            })
            .collect();
        assert_near(&f32s(&f.cumsum(0)), &want, 1e-4);
        let f = |x: Vec<Array>| x[0].cumsum(-1);
        rules::assert_jvp_matches_central_difference(
            "blocked cumsum",
            f,
            &[rules::normal(51, &[2, 300])],
        );
        rules::assert_batches_like_stacking(
            "blocked cumsum",
            f,
            &[rules::normal(52, &[2, 3, 260])],
        );
    }

    /// The stable order of `row`, NaN above every number.
    fn argsort_reference(row: &[f32], descending: bool) -> Vec<i32> {
        let mut order: Vec<usize> = (0..row.len()).collect();
        let key = |v: f32| {
            if v.is_nan() {
                f64::INFINITY
            } else {
                f64::from(v)
            }
        };
        let nan_rank = |v: f32| v.is_nan() as u8;
        order.sort_by(|&a, &b| {
            let by = (nan_rank(row[a]), key(row[a])).partial_cmp(&(nan_rank(row[b]), key(row[b])));
            let by = by.unwrap_or(std::cmp::Ordering::Equal);
            if descending {
                by.reverse()
            } else {
                by
            }
        });
        order.into_iter().map(|i| i as i32).collect()
    }

    proptest! {
        #![proptest_config(crate::ops::proptest_config())]
        #[test]
        fn argsort_sort_and_top_k_match_a_stable_sort(
            row in prop::collection::vec(prop_oneof![Just(f32::NAN), Just(-0.0f32), (-3i8..3).prop_map(f32::from)], 1..9),
            descending in any::<bool>(),
        ) {
            let n = row.len();
            let x = vec_f32(&row);
            let want = argsort_reference(&row, descending);
            prop_assert_eq!(x.argsort(0, descending).to_vec::<i32>().unwrap(), want.clone());
            let ascending = argsort_reference(&row, false);
            let sorted: Vec<f32> = ascending.iter().map(|&i| row[i as usize]).collect();
            assert_bits(&f32s(&x.sort(0)), &sorted);
            let k = n.div_ceil(2);
            let (values, indices) = x.top_k(k);
            let top = argsort_reference(&row, true)[..k].to_vec();
            prop_assert_eq!(indices.to_vec::<i32>().unwrap(), top.clone());
            let top_values: Vec<f32> = top.iter().map(|&i| row[i as usize]).collect();
            assert_bits(&f32s(&values), &top_values);
        }
    }

    #[test]
    fn sort_works_along_any_axis_for_integers_and_bool() {
        let x = Array::from_vec(vec![3i32, 1, -2, 0, 5, -7], &[2, 3]).unwrap();
        assert_eq!(x.sort(0).to_vec::<i32>().unwrap(), [0, 1, -7, 3, 5, -2]);
        assert_eq!(
            x.argsort(1, true).to_vec::<i32>().unwrap(),
            [0, 1, 2, 1, 0, 2]
        );
        let b = Array::from_vec(vec![true, false, true, false], &[4]).unwrap();
        assert_eq!(
            b.sort(0).to_vec::<bool>().unwrap(),
            [false, false, true, true]
        );
        let err = vec_f32(&[1.0, 2.0]).top_k(3).0.check().unwrap_err();
        assert!(
            matches!(&err, Error::InvalidArgument { op, .. } if op == "top_k"),
            "{err}"
        );
    }

    #[test]
    fn stack_split_tile_repeat_and_pad_match_loops() {
        let a = Array::from_vec(vec![1i32, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
        let b = &a * 10;
        assert_eq!(
            stack(&[a.clone(), b.clone()], 1).to_vec::<i32>().unwrap(),
            [1, 2, 3, 10, 20, 30, 4, 5, 6, 40, 50, 60]
        );
        assert_eq!(
            stack(&[a.clone(), b.clone()], -1).dims(),
            Some(vec![2, 3, 2])
        );
        let parts = a.split(3, 1).unwrap();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[2].to_vec::<i32>().unwrap(), [3, 6]);
        let uneven = a.split_at(&[2, 9], 1).unwrap();
        assert_eq!(uneven[0].to_vec::<i32>().unwrap(), [1, 2, 4, 5]);
        assert_eq!(uneven[2].dims(), Some(vec![2, 0]));
        assert_eq!(
            a.tile(&[2]).to_vec::<i32>().unwrap(),
            [1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6]
        );
        assert_eq!(a.tile(&[2, 1, 1]).dims(), Some(vec![2, 2, 3]));
        assert_eq!(
            a.repeat(2, 0).to_vec::<i32>().unwrap(),
            [1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6]
        );
        assert_eq!(
            a.repeat(2, -1).to_vec::<i32>().unwrap(),
            [1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6]
        );
        let padded = a.pad(&[(1, 0), (0, 1)], -1.0);
        assert_eq!(
            padded.to_vec::<i32>().unwrap(),
            [-1, -1, -1, -1, 1, 2, 3, -1, 4, 5, 6, -1]
        );
        assert_eq!(a.flatten().to_vec::<i32>().unwrap(), [1, 2, 3, 4, 5, 6]);
        assert_eq!(a.ones_like().to_vec::<i32>().unwrap(), [1; 6]);
    }

    #[test]
    fn layout_compositions_reject_bad_arguments() {
        let a = Array::zeros(&[2, 3], DType::F32);
        rules::assert_err_names(a.split(2, 1), "split", "into 2 equal parts");
        rules::assert_err_names(a.split(0, 1), "split", "0 equal parts");
        rules::assert_err_names(stack(&[], 0).check(), "stack", "at least one");
        rules::assert_err_names(
            stack(&[a.clone(), a.transpose()], 0).check(),
            "stack",
            "one shape",
        );
        rules::assert_err_names(
            a.pad(&[(1, 1)], 0.0).check(),
            "pad",
            "one (before, after) pair per axis",
        );
        rules::assert_err_names(a.repeat(2, 2).check(), "repeat", "2");
    }

    #[test]
    fn constructors_match_jax() {
        assert_eq!(
            Array::arange_i32(2, -3, -2)
                .unwrap()
                .to_vec::<i32>()
                .unwrap(),
            [2, 0, -2]
        );
        assert_eq!(Array::arange_i32(0, 0, 1).unwrap().dims(), Some(vec![0]));
        rules::assert_err_names(Array::arange_i32(0, 5, 0), "arange", "non-zero step");
        rules::assert_err_names(Array::arange_i32(0, 1 << 40, 1), "arange", "i32 bounds");
        let half_open = Array::linspace(0.0, 1.0, 4, false, DType::F32).unwrap();
        assert_eq!(f32s(&half_open), [0.0, 0.25, 0.5, 0.75]);
        assert_eq!(
            f32s(&Array::linspace(3.0, 7.0, 1, true, DType::F32).unwrap()),
            [3.0]
        );
        assert_eq!(
            Array::linspace(0.0, 1.0, 0, true, DType::F32)
                .unwrap()
                .dims(),
            Some(vec![0])
        );
        let eye = Array::eye(3, None, -1, DType::F32);
        assert_eq!(f32s(&eye), [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]);
        assert_eq!(
            Array::eye(2, Some(2), 1 << 40, DType::Bool)
                .to_vec::<bool>()
                .unwrap(),
            [false; 4]
        );
    }

    /// Values far enough apart (and from a kink) that a central difference of
    /// step 1e-2 crosses no tie.
    fn spaced(values: &[f32], shape: &[usize]) -> Array {
        rules::array(values, shape)
    }

    #[test]
    fn differentiable_compositions_have_jvps_matching_central_differences() {
        type F = fn(Vec<Array>) -> Array;
        let cases: [(&str, F, Array); 14] = [
            ("square", |x| x[0].square(), rules::normal(20, &[3, 2])),
            ("tan", |x| x[0].tan(), rules::uniform(21, &[5], -1.0, 1.0)),
            (
                "log1p",
                |x| x[0].log1p(),
                rules::uniform(22, &[5], -0.5, 3.0),
            ),
            (
                "clip",
                |x| x[0].clip(Some(-0.5), Some(0.5)),
                spaced(&[-1.0, -0.3, 0.2, 0.9, 0.45, -0.8], &[6]),
            ),
            (
                "var",
                |x| x[0].var(&[1], 1, false),
                rules::normal(24, &[2, 4]),
            ),
            (
                "std",
                |x| x[0].std(&[0, 1], 0, true),
                rules::normal(25, &[2, 4]),
            ),
            (
                "logsumexp",
                |x| x[0].logsumexp(&[-1], false),
                rules::normal(26, &[3, 4]),
            ),
            (
                "prod",
                |x| x[0].prod(&[1], false),
                rules::uniform(27, &[2, 5], 0.5, 1.5),
            ),
            ("cumsum", |x| x[0].cumsum(0), rules::normal(28, &[4, 2])),
            (
                "sort",
                |x| x[0].sort(-1),
                spaced(
                    &[3.0, -1.0, 0.5, 2.0, -2.5, 1.2, 0.1, -0.7, 2.9, -1.9],
                    &[2, 5],
                ),
            ),
            (
                "top_k",
                |x| x[0].top_k(2).0,
                spaced(&[0.3, -1.1, 2.2, 1.0, -0.4, 0.8, 1.9, -2.0], &[2, 4]),
            ),
            (
                "tile+repeat",
                |x| x[0].tile(&[2, 1]).repeat(2, 1),
                rules::normal(31, &[2, 3]),
            ),
            (
                "pad",
                |x| x[0].pad(&[(1, 2), (0, 1)], 3.0),
                rules::normal(32, &[2, 3]),
            ),
            (
                "stack+split",
                |x| stack(&x[0].split(2, 1).unwrap(), 0),
                rules::normal(33, &[3, 4]),
            ),
        ];
        for (what, f, x) in cases {
            rules::assert_jvp_matches_central_difference(what, f, &[x]);
        }
    }

    #[test]
    fn zero_gradient_compositions_have_zero_tangents() {
        let x = rules::array(&[-1.3, 0.4, 2.6], &[3]);
        for (what, f) in [
            ("floor", Array::floor as fn(&Array) -> Array),
            ("round", Array::round),
            ("sign", Array::sign),
        ] {
            let (_, t) = crate::jvp(|x: Array| f(&x), &x, &x).unwrap();
            assert_eq!(f32s(&t), [0.0, 0.0, 0.0], "{what}");
        }
    }

    #[test]
    fn compositions_batch_like_stacking_per_example() {
        type F = fn(Vec<Array>) -> Array;
        let xs = rules::normal(40, &[3, 4, 5]);
        let cases: [(&str, F); 12] = [
            ("round", |x| x[0].round() + x[0].floor() + x[0].sign()),
            ("log1p", |x| x[0].abs().log1p()),
            ("var", |x| x[0].var(&[0], 1, true) + x[0].std(&[1], 0, true)),
            ("logsumexp", |x| x[0].logsumexp(&[0], false)),
            ("prod", |x| x[0].prod(&[1], false)),
            ("argmin", |x| x[0].argmin(1, false).cast(DType::F32)),
            ("cumsum", |x| x[0].cumsum(1)),
            ("sort", |x| x[0].sort(0)),
            ("argsort", |x| x[0].argsort(-1, true).cast(DType::F32)),
            ("top_k", |x| x[0].top_k(3).0),
            ("tile", |x| {
                x[0].tile(&[1, 2]).repeat(2, 0).pad(&[(1, 0), (0, 2)], 1.0)
            }),
            ("stack", |x| {
                stack(&x[0].split_at(&[1], 0).unwrap()[1..], 0).flatten()
            }),
        ];
        for (what, f) in cases {
            let report = rules::assert_batches_like_stacking(what, f, std::slice::from_ref(&xs));
            assert!(
                report.vmap_fallbacks.is_empty(),
                "{what}: {:?}",
                report.vmap_fallbacks
            );
        }
    }

    #[test]
    fn hostile_sizes_are_errors_not_panics_or_hangs() {
        let x = Array::zeros(&[3], DType::F32);
        assert!(x.tile(&[usize::MAX]).check().is_err());
        assert!(x.repeat(usize::MAX, 0).check().is_err());
        assert!(x.pad(&[(usize::MAX, 1)], 0.0).check().is_err());
        // A value the dtype cannot hold fails the first axis' concat; the
        // next axis must not read the failed array's shape (the fuzzer's find).
        let bytes = Array::zeros(&[2, 2], DType::U8);
        let err = bytes.pad(&[(1, 1), (1, 1)], -1.5).check().unwrap_err();
        assert!(err.to_string().contains("-1.5"), "{err}");
        assert!(x.top_k(usize::MAX).0.check().is_err());
        assert!(Array::zeros(&[0], DType::F32).split(usize::MAX, 0).is_err());
        let parts = x.split_at(&[usize::MAX], 0).unwrap();
        assert_eq!(parts[0].dims(), Some(vec![3]));
        assert_eq!(parts[1].dims(), Some(vec![0]));
        assert!(Array::eye(usize::MAX, None, 0, DType::F32).check().is_err());
        assert!(Array::linspace(0.0, 1.0, usize::MAX, true, DType::F32).is_err());
        let down = Array::arange_i32(i32::MAX.into(), i32::MIN.into(), i64::MIN).unwrap();
        assert_eq!(down.to_vec::<i32>().unwrap(), [i32::MAX]);
        let up = Array::arange_i32(-3, 4, i64::MAX).unwrap();
        assert_eq!(up.to_vec::<i32>().unwrap(), [-3]);
        let huge = Array::scalar(0.0, DType::F32).broadcast_to([1usize << 40]);
        assert!(huge.cumsum(0).check().is_err());
    }

    #[test]
    fn a_failed_composition_names_the_callers_line() {
        let x = Array::zeros(&[2], DType::F32);
        let line = line!() + 1;
        let err = x.cumsum(3).check().unwrap_err();
        let at = err.call_site().expect("a call site");
        assert_eq!(at.line(), line, "{err}");
    }
}
