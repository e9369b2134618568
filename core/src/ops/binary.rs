//! Elementwise two-operand math and comparisons with NumPy broadcasting:
//! shape rule and reference evaluation.

use super::strided::{
    broadcast_shapes, broadcast_update, broadcast_zip, eval_dtype_err, nan_max, nan_min, narrow,
    widen, HalfFloat, WrappingInt,
};
use super::ShapeCx;
use crate::data::{HostData, HostElement};
use crate::error::{dtype_err, require_float, require_same_dtype, Result};
use crate::handle::array::Array;
use crate::ops::Op;
use crate::shape::{Aval, Dim, Shape};
use crate::DType;
use serde::{Deserialize, Serialize};

impl Array {
    #[track_caller]
    fn binary(&self, op: BinaryOp, rhs: impl Operand) -> Array {
        let rhs = rhs.into_array(self.dtype());
        Array::apply(Op::Binary(op), vec![self.clone(), rhs])
    }

    /// `self ** rhs` (floats).
    #[track_caller]
    pub fn pow(&self, rhs: impl Operand) -> Array {
        self.binary(BinaryOp::Pow, rhs)
    }
    /// Elementwise maximum, IEEE 754-2019's on floats: NaN from either
    /// operand propagates and `+0` is greater than `-0`, in either order.
    #[track_caller]
    pub fn maximum(&self, rhs: impl Operand) -> Array {
        self.binary(BinaryOp::Maximum, rhs)
    }
    /// Elementwise minimum, IEEE 754-2019's on floats: NaN propagates and
    /// `-0` is less than `+0`, in either order.
    #[track_caller]
    pub fn minimum(&self, rhs: impl Operand) -> Array {
        self.binary(BinaryOp::Minimum, rhs)
    }
    /// `self == rhs` as bool.
    #[track_caller]
    pub fn equal(&self, rhs: impl Operand) -> Array {
        self.binary(BinaryOp::Eq, rhs)
    }
    /// `self != rhs` as bool.
    #[track_caller]
    pub fn not_equal(&self, rhs: impl Operand) -> Array {
        self.binary(BinaryOp::Ne, rhs)
    }
    /// `self < rhs` as bool.
    #[track_caller]
    pub fn less(&self, rhs: impl Operand) -> Array {
        self.binary(BinaryOp::Lt, rhs)
    }
    /// `self <= rhs` as bool.
    #[track_caller]
    pub fn less_equal(&self, rhs: impl Operand) -> Array {
        self.binary(BinaryOp::Le, rhs)
    }
    /// `self > rhs` as bool.
    #[track_caller]
    pub fn greater(&self, rhs: impl Operand) -> Array {
        self.binary(BinaryOp::Gt, rhs)
    }
    /// `self >= rhs` as bool.
    #[track_caller]
    pub fn greater_equal(&self, rhs: impl Operand) -> Array {
        self.binary(BinaryOp::Ge, rhs)
    }
}

/// Something usable as an op operand: an array, or a Rust number that
/// becomes a scalar of the other operand's dtype.
pub trait Operand {
    /// The dtype of an array operand; `None` for a number.
    fn dtype(&self) -> Option<DType>;
    /// The operand as an array; numbers take `dtype`.
    fn into_array(self, dtype: DType) -> Array;
}

impl Operand for Array {
    fn dtype(&self) -> Option<DType> {
        Some(Array::dtype(self))
    }
    #[track_caller]
    fn into_array(self, _: DType) -> Array {
        self
    }
}

impl Operand for &Array {
    fn dtype(&self) -> Option<DType> {
        Some(Array::dtype(self))
    }
    #[track_caller]
    fn into_array(self, _: DType) -> Array {
        self.clone()
    }
}

macro_rules! number_operand {
    ($($t:ty),*) => {$(
        impl Operand for $t {
            fn dtype(&self) -> Option<DType> {
                None
            }
            #[track_caller]
            fn into_array(self, dtype: DType) -> Array {
                let value = self as f64;
                match dtype.integer_range() {
                    Some(range) if value.fract() != 0.0 || !range.contains(&(value as i128)) => {
                        Array::failed(scalar_misfit(value, dtype))
                    }
                    _ => Array::scalar(value, dtype),
                }
            }
        }
    )*};
}
number_operand!(f32, f64);

/// The error for a number operand that an integer array's dtype cannot
/// hold: JAX raises for an out-of-range Python int rather than wrap or
/// saturate it, and so does Kiln (a fraction or NaN would be truncated).
fn scalar_misfit(value: impl std::fmt::Display, dtype: DType) -> crate::error::Error {
    crate::error::arg_err(
        "scalar operand",
        format!(
            "the number {value} does not fit the array's dtype {} (integers {}); \
             cast the array to a wider or float dtype first",
            dtype.name(),
            dtype
                .integer_range()
                .map_or(String::new(), |r| format!("{}..={}", r.start(), r.end())),
        ),
    )
}

macro_rules! integer_operand {
    ($($t:ty),*) => {$(
        impl Operand for $t {
            fn dtype(&self) -> Option<DType> {
                None
            }
            #[track_caller]
            fn into_array(self, dtype: DType) -> Array {
                let value = self as i128;
                match dtype.integer_range() {
                    Some(range) if !range.contains(&value) => {
                        Array::failed(scalar_misfit(value, dtype))
                    }
                    // Rounded once from the exact integer: `self as f64`
                    // would round an i64 or usize above 2^53 twice.
                    _ => Array::scalar(dtype.round_integer(value), dtype),
                }
            }
        }
    )*};
}
integer_operand!(i32, i64, u32, usize);

macro_rules! operator {
    ($trait:ident, $method:ident, $op:expr) => {
        impl<R: Operand> std::ops::$trait<R> for Array {
            type Output = Array;
            #[track_caller]
            fn $method(self, rhs: R) -> Array {
                self.binary($op, rhs)
            }
        }
        impl<R: Operand> std::ops::$trait<R> for &Array {
            type Output = Array;
            #[track_caller]
            fn $method(self, rhs: R) -> Array {
                self.binary($op, rhs)
            }
        }
        impl std::ops::$trait<Array> for f32 {
            type Output = Array;
            #[track_caller]
            fn $method(self, rhs: Array) -> Array {
                Operand::into_array(self, rhs.dtype()).binary($op, rhs)
            }
        }
        impl std::ops::$trait<&Array> for f32 {
            type Output = Array;
            #[track_caller]
            fn $method(self, rhs: &Array) -> Array {
                Operand::into_array(self, rhs.dtype()).binary($op, rhs)
            }
        }
    };
}
operator!(Add, add, BinaryOp::Add);
operator!(Sub, sub, BinaryOp::Sub);
operator!(Mul, mul, BinaryOp::Mul);
operator!(Div, div, BinaryOp::Div);

/// An elementwise two-operand op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BinaryOp {
    /// `a + b` (integers wrap).
    Add,
    /// `a - b` (integers wrap).
    Sub,
    /// `a * b` (integers wrap).
    Mul,
    /// `a / b` (integers truncate toward zero; division by zero yields 0).
    Div,
    /// `a ^ b` (floats only).
    Pow,
    /// The larger operand (NaN if either is NaN).
    Maximum,
    /// The smaller operand (NaN if either is NaN).
    Minimum,
    /// `a == b`, a bool result.
    Eq,
    /// `a != b`, a bool result.
    Ne,
    /// `a < b`, a bool result.
    Lt,
    /// `a <= b`, a bool result.
    Le,
    /// `a > b`, a bool result.
    Gt,
    /// `a >= b`, a bool result.
    Ge,
}

impl BinaryOp {
    /// Every binary op, in declaration order.
    pub const ALL: [BinaryOp; 13] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Eq,
        BinaryOp::Ne,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
    ];

    /// The op's name as users write it: `add`, `equal`, `less_equal`, ...
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
            BinaryOp::Eq => "equal",
            BinaryOp::Ne => "not_equal",
            BinaryOp::Lt => "less",
            BinaryOp::Le => "less_equal",
            BinaryOp::Gt => "greater",
            BinaryOp::Ge => "greater_equal",
        }
    }

    /// True for the six comparisons, whose result is bool.
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge
        )
    }

    /// True for add, sub, mul, div and pow, which reject bool.
    fn is_arithmetic(self) -> bool {
        matches!(
            self,
            BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div | BinaryOp::Pow
        )
    }
}

/// The output aval: the broadcast shape of both operands, bool for
/// comparisons and the operands' dtype otherwise.
pub fn shape_rule(op: BinaryOp, a: &Aval, b: &Aval, cx: &mut ShapeCx) -> Result<Aval> {
    let dtype = require_same_dtype(op.name(), a, b)?;
    if op == BinaryOp::Pow {
        require_float(op.name(), a)?;
    } else if op.is_arithmetic() && dtype == DType::Bool {
        return Err(dtype_err(
            op.name(),
            &[a, b],
            "expects a numeric dtype, got bool",
        ));
    }
    let shape = broadcast_shapes(op.name(), &[a, b], cx)?;
    let out = if op.is_comparison() {
        DType::Bool
    } else {
        dtype
    };
    Ok(Aval::new(shape, out))
}

/// Reference evaluation with NumPy broadcasting of the contiguous operands.
pub fn eval(
    op: BinaryOp,
    a: &HostData,
    a_shape: &[usize],
    b: &HostData,
    b_shape: &[usize],
    out_shape: &[usize],
) -> Result<HostData> {
    let zip = Zip {
        a_shape,
        b_shape,
        out_shape,
    };
    let unsupported = || {
        eval_dtype_err(
            op.name(),
            &[a.dtype(), b.dtype()],
            "unsupported operand dtypes",
        )
    };
    if op.is_comparison() {
        let out = match (a, b) {
            (HostData::F32(x), HostData::F32(y)) => zip.compare(op, x, y),
            (HostData::F16(x), HostData::F16(y)) => zip.compare(op, x, y),
            (HostData::BF16(x), HostData::BF16(y)) => zip.compare(op, x, y),
            (HostData::I32(x), HostData::I32(y)) => zip.compare(op, x, y),
            (HostData::U32(x), HostData::U32(y)) => zip.compare(op, x, y),
            (HostData::U8(x), HostData::U8(y)) => zip.compare(op, x, y),
            (HostData::Bool(x), HostData::Bool(y)) => zip.compare(op, x, y),
            _ => return Err(unsupported()),
        };
        return Ok(HostData::Bool(out));
    }
    Ok(match (a, b) {
        (HostData::F32(x), HostData::F32(y)) => HostData::F32(zip.float(op, x, y)),
        (HostData::F16(x), HostData::F16(y)) => {
            HostData::F16(narrow(&zip.float(op, &widen(x), &widen(y))))
        }
        (HostData::BF16(x), HostData::BF16(y)) => {
            HostData::BF16(narrow(&zip.float(op, &widen(x), &widen(y))))
        }
        (HostData::I32(x), HostData::I32(y)) => {
            HostData::I32(zip.int(op, x, y).ok_or_else(unsupported)?)
        }
        (HostData::U32(x), HostData::U32(y)) => {
            HostData::U32(zip.int(op, x, y).ok_or_else(unsupported)?)
        }
        (HostData::U8(x), HostData::U8(y)) => {
            HostData::U8(zip.int(op, x, y).ok_or_else(unsupported)?)
        }
        (HostData::Bool(x), HostData::Bool(y)) => HostData::Bool(match op {
            BinaryOp::Maximum => zip.run(x, y, |p, q| p | q),
            BinaryOp::Minimum => zip.run(x, y, |p, q| p & q),
            _ => return Err(unsupported()),
        }),
        _ => return Err(unsupported()),
    })
}

/// Binds `$f` to the f32 function of a non-comparison binary op and
/// evaluates `$body`: the one definition of each op's element semantics,
/// shared by the plain and the fused evaluation so both give the same bits.
macro_rules! with_f32_arithmetic {
    ($op:expr, $f:ident => $body:expr) => {
        match $op {
            BinaryOp::Add => {
                let $f = |x: f32, y: f32| x + y;
                $body
            }
            BinaryOp::Sub => {
                let $f = |x: f32, y: f32| x - y;
                $body
            }
            BinaryOp::Mul => {
                let $f = |x: f32, y: f32| x * y;
                $body
            }
            BinaryOp::Div => {
                let $f = |x: f32, y: f32| x / y;
                $body
            }
            BinaryOp::Pow => {
                let $f = super::math::pow_f32;
                $body
            }
            BinaryOp::Maximum => {
                let $f = nan_max;
                $body
            }
            _ => {
                let $f = nan_min;
                $body
            }
        }
    };
}

/// Evaluates in place into `target`, the buffer of the operand at each
/// position where `operands` holds `None` (both for `x op x`); it has the
/// output's shape and dtype, so a comparison runs in place only on bools.
/// Gives the same bits as [`eval`].
pub fn eval_in_place(
    op: BinaryOp,
    operands: [Option<&HostData>; 2],
    shapes: [&[usize]; 2],
    out_shape: &[usize],
    target: &mut HostData,
) -> Result<()> {
    let (other, other_shape, target_is_lhs) = match operands {
        [None, other] => (other, shapes[1], true),
        [other, None] => (other, shapes[0], false),
        _ => {
            return Err(crate::error::arg_err(
                op.name(),
                "in-place evaluation needs an operand to write into",
            ))
        }
    };
    let target_dtype = target.dtype();
    let unsupported = || {
        let other_dtype = other.map_or(target_dtype, HostData::dtype);
        eval_dtype_err(
            op.name(),
            &[target_dtype, other_dtype],
            "unsupported in-place operand dtypes",
        )
    };
    let update = InPlace {
        other_shape,
        out_shape,
        target_is_lhs,
    };
    match target {
        HostData::F32(t) if !op.is_comparison() => {
            let o = update.other(other).ok_or_else(unsupported)?;
            with_f32_arithmetic!(op, f => update.run(t, o, f));
        }
        HostData::F16(t) if !op.is_comparison() => {
            let o = update.other(other).ok_or_else(unsupported)?;
            update.half(op, t, o);
        }
        HostData::BF16(t) if !op.is_comparison() => {
            let o = update.other(other).ok_or_else(unsupported)?;
            update.half(op, t, o);
        }
        HostData::I32(t) => {
            let o = update.other(other).ok_or_else(unsupported)?;
            update.int(op, t, o).ok_or_else(unsupported)?;
        }
        HostData::U32(t) => {
            let o = update.other(other).ok_or_else(unsupported)?;
            update.int(op, t, o).ok_or_else(unsupported)?;
        }
        HostData::U8(t) => {
            let o = update.other(other).ok_or_else(unsupported)?;
            update.int(op, t, o).ok_or_else(unsupported)?;
        }
        HostData::Bool(t) => {
            let o = update.other(other).ok_or_else(unsupported)?;
            match op {
                BinaryOp::Maximum => update.run(t, o, |p, q| p | q),
                BinaryOp::Minimum => update.run(t, o, |p, q| p & q),
                BinaryOp::Eq => update.run(t, o, |p, q| p == q),
                BinaryOp::Ne => update.run(t, o, |p, q| p != q),
                BinaryOp::Lt => update.run(t, o, |p, q| !p & q),
                BinaryOp::Le => update.run(t, o, |p, q| !p | q),
                BinaryOp::Gt => update.run(t, o, |p, q| p & !q),
                BinaryOp::Ge => update.run(t, o, |p, q| p | !q),
                _ => return Err(unsupported()),
            }
        }
        _ => return Err(unsupported()),
    }
    Ok(())
}

/// The shapes of one in-place evaluation and which side the target is on.
struct InPlace<'s> {
    other_shape: &'s [usize],
    out_shape: &'s [usize],
    target_is_lhs: bool,
}

impl InPlace<'_> {
    /// The other operand typed like the target: `Some(None)` when the
    /// target is both operands, `None` when the dtypes differ.
    fn other<'a, T: HostElement>(&self, other: Option<&'a HostData>) -> Option<Option<&'a [T]>> {
        match other {
            None => Some(None),
            Some(data) => T::slice(data).map(Some),
        }
    }

    /// `target = f(target, other)` (or `f(other, target)`), broadcasting.
    fn run<T: Copy>(&self, target: &mut [T], other: Option<&[T]>, f: impl Fn(T, T) -> T) {
        let other = other.map(|o| (o, self.other_shape));
        if self.target_is_lhs {
            broadcast_update(target, other, self.out_shape, f);
        } else {
            broadcast_update(target, other, self.out_shape, |t, o| f(o, t));
        }
    }

    fn half<H: HalfFloat>(&self, op: BinaryOp, target: &mut [H], other: Option<&[H]>) {
        with_f32_arithmetic!(op, f => self.run(target, other, |x: H, y: H| H::narrow(f(x.widen(), y.widen()))))
    }

    /// `None` for pow and comparisons, which integers do not support in place.
    fn int<T: WrappingInt>(
        &self,
        op: BinaryOp,
        target: &mut [T],
        other: Option<&[T]>,
    ) -> Option<()> {
        match op {
            BinaryOp::Add => self.run(target, other, T::add),
            BinaryOp::Sub => self.run(target, other, T::sub),
            BinaryOp::Mul => self.run(target, other, T::mul),
            BinaryOp::Div => self.run(target, other, T::div),
            BinaryOp::Maximum => self.run(target, other, Ord::max),
            BinaryOp::Minimum => self.run(target, other, Ord::min),
            _ => return None,
        }
        Some(())
    }
}

/// One operand of a fused tile: a run of elements or a broadcast scalar.
#[derive(Clone, Copy)]
pub(crate) enum Lane<'a> {
    /// One element per output element.
    Run(&'a [f32]),
    /// The same element for every output element.
    Splat(f32),
}

/// A non-comparison op's f32 function over two lanes into `dst`.
#[inline(always)]
pub(crate) fn float_zip_into(op: BinaryOp, a: Lane<'_>, b: Lane<'_>, dst: &mut [f32]) {
    // Indexed loops over slices cut to `dst`'s length: the form LLVM
    // vectorizes without bounds checks.
    #[inline(always)]
    fn zip(a: Lane<'_>, b: Lane<'_>, dst: &mut [f32], f: impl Fn(f32, f32) -> f32) {
        let n = dst.len();
        match (a, b) {
            (Lane::Run(x), Lane::Run(y)) => {
                let (x, y) = (&x[..n], &y[..n]);
                for i in 0..n {
                    dst[i] = f(x[i], y[i]);
                }
            }
            (Lane::Splat(p), Lane::Run(y)) => {
                let y = &y[..n];
                for i in 0..n {
                    dst[i] = f(p, y[i]);
                }
            }
            (Lane::Run(x), Lane::Splat(q)) => {
                let x = &x[..n];
                for i in 0..n {
                    dst[i] = f(x[i], q);
                }
            }
            (Lane::Splat(p), Lane::Splat(q)) => dst.fill(f(p, q)),
        }
    }
    with_f32_arithmetic!(op, f => zip(a, b, dst, f))
}

/// The operand and output shapes of one evaluation; each method matches the
/// op once and then runs a monomorphized broadcast loop.
struct Zip<'s> {
    a_shape: &'s [usize],
    b_shape: &'s [usize],
    out_shape: &'s [usize],
}

impl Zip<'_> {
    fn run<T: Copy, R>(&self, a: &[T], b: &[T], f: impl Fn(T, T) -> R) -> Vec<R> {
        broadcast_zip(a, self.a_shape, b, self.b_shape, self.out_shape, f)
    }

    fn compare<T: Copy + PartialOrd>(&self, op: BinaryOp, a: &[T], b: &[T]) -> Vec<bool> {
        match op {
            BinaryOp::Eq => self.run(a, b, |x, y| x == y),
            BinaryOp::Ne => self.run(a, b, |x, y| x != y),
            BinaryOp::Lt => self.run(a, b, |x, y| x < y),
            BinaryOp::Le => self.run(a, b, |x, y| x <= y),
            BinaryOp::Gt => self.run(a, b, |x, y| x > y),
            _ => self.run(a, b, |x, y| x >= y),
        }
    }

    fn float(&self, op: BinaryOp, a: &[f32], b: &[f32]) -> Vec<f32> {
        with_f32_arithmetic!(op, f => self.run(a, b, f))
    }

    /// `None` for pow, which integers do not support.
    fn int<T: WrappingInt>(&self, op: BinaryOp, a: &[T], b: &[T]) -> Option<Vec<T>> {
        Some(match op {
            BinaryOp::Add => self.run(a, b, T::add),
            BinaryOp::Sub => self.run(a, b, T::sub),
            BinaryOp::Mul => self.run(a, b, T::mul),
            BinaryOp::Div => self.run(a, b, T::div),
            BinaryOp::Maximum => self.run(a, b, Ord::max),
            BinaryOp::Minimum => self.run(a, b, Ord::min),
            _ => return None,
        })
    }
}

/// The cotangents of `a` and `b` for the cotangent `g` of `y = op(a, b)`,
/// each summed over the axes it was broadcast along. Comparisons have none.
/// Where `maximum`/`minimum` tie, each operand takes half; `pow`'s exponent
/// takes none where the base is not positive (its logarithm is undefined).
pub(crate) fn vjp(op: BinaryOp, a: &Array, b: &Array, y: &Array, g: &Array) -> [Option<Array>; 2] {
    let zero = || Array::scalar(0.0, y.dtype());
    let half_on_ties = |wins: Array| {
        let one = Array::scalar(1.0, y.dtype());
        let half = Array::scalar(0.5, y.dtype());
        wins.select(&one, a.equal(b).select(half, zero()))
    };
    let (ga, gb) = match op {
        BinaryOp::Add => (g.clone(), g.clone()),
        BinaryOp::Sub => (g.clone(), -g),
        BinaryOp::Mul => (g * b, g * a),
        BinaryOp::Div => (g / b, -(g * y) / b),
        BinaryOp::Pow => (
            g * b * a.pow(b - 1.0),
            a.greater(0.0).select(g * y * a.log(), zero()),
        ),
        BinaryOp::Maximum | BinaryOp::Minimum => {
            let a_wins = match op {
                BinaryOp::Maximum => a.greater(b),
                _ => a.less(b),
            };
            let share = half_on_ties(a_wins);
            (g * &share, g * (1.0 - &share))
        }
        BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge => {
            return [None, None]
        }
    };
    [
        Some(unbroadcast(&ga, a.shape())),
        Some(unbroadcast(&gb, b.shape())),
    ]
}

/// The tangent of `y = op(a, b)` for the tangents `ta`, `tb` (`None` where
/// zero), in `y`'s shape; the same tie and `pow` conventions as [`vjp`].
/// Comparisons have none.
pub(crate) fn jvp(
    op: BinaryOp,
    a: &Array,
    b: &Array,
    y: &Array,
    ta: Option<Array>,
    tb: Option<Array>,
) -> Option<Array> {
    let zero = || Array::scalar(0.0, y.dtype());
    let (da, db) = match op {
        BinaryOp::Add => (ta, tb),
        BinaryOp::Sub => (ta, tb.map(|t| -t)),
        BinaryOp::Mul => (ta.map(|t| t * b), tb.map(|t| a * t)),
        BinaryOp::Div => (ta.map(|t| t / b), tb.map(|t| -(t * y) / b)),
        BinaryOp::Pow => (
            ta.map(|t| t * b * a.pow(b - 1.0)),
            tb.map(|t| a.greater(0.0).select(t * y * a.log(), zero())),
        ),
        BinaryOp::Maximum | BinaryOp::Minimum => {
            let a_wins = match op {
                BinaryOp::Maximum => a.greater(b),
                _ => a.less(b),
            };
            let one = Array::scalar(1.0, y.dtype());
            let half = Array::scalar(0.5, y.dtype());
            let share = a_wins.select(&one, a.equal(b).select(half, zero()));
            (ta.map(|t| t * &share), tb.map(|t| t * (1.0 - &share)))
        }
        BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge => {
            return None
        }
    };
    let sum = match (da, db) {
        (Some(da), Some(db)) => da + db,
        (Some(d), None) | (None, Some(d)) => d,
        (None, None) => return None,
    };
    Some(broadcast_like(sum, y))
}

/// `t` broadcast to `like`'s shape where it is not already that shape
/// (a tangent computed from one operand of a broadcasting op).
#[track_caller]
pub(crate) fn broadcast_like(t: Array, like: &Array) -> Array {
    if crate::symbolic::shapes_equal(t.shape(), like.shape()) {
        t
    } else {
        t.broadcast_to(like.shape().clone())
    }
}

/// `g` summed over the axes along which `shape` was broadcast to `g`'s
/// shape (leading axes, and known 1s that grew), in `shape`.
#[track_caller]
pub(crate) fn unbroadcast(g: &Array, shape: &Shape) -> Array {
    if g.shape() == shape {
        return g.clone();
    }
    let lead = g.ndim().saturating_sub(shape.rank());
    let grown = shape.dims().iter().enumerate().filter_map(|(i, d)| {
        let out = &g.shape().dims()[lead + i];
        (*d == Dim::Known(1) && *out != Dim::Known(1)).then_some((lead + i) as isize)
    });
    let axes: Vec<isize> = (0..lead as isize).chain(grown).collect();
    let summed = if axes.is_empty() {
        g.clone()
    } else {
        g.sum(&axes, false)
    };
    summed.reshape_to(shape.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::ops::strided::proptest_config;
    use crate::ops::{Condition, Guard};
    use crate::shape::{Dim, Shape, Symbol};
    use half::{bf16, f16};
    use proptest::prelude::*;

    fn rule(op: BinaryOp, a: &Aval, b: &Aval) -> (Result<Aval>, Vec<Guard>) {
        let mut cx = ShapeCx::new();
        let out = shape_rule(op, a, b, &mut cx);
        (out, cx.guards)
    }

    fn f32_eval(
        op: BinaryOp,
        a: &[f32],
        ash: &[usize],
        b: &[f32],
        bsh: &[usize],
        out: &[usize],
    ) -> HostData {
        eval(
            op,
            &HostData::F32(a.to_vec()),
            ash,
            &HostData::F32(b.to_vec()),
            bsh,
            out,
        )
        .unwrap()
    }

    #[test]
    fn add_broadcasts_column_with_row() {
        let out = f32_eval(
            BinaryOp::Add,
            &[10.0, 20.0],
            &[2, 1],
            &[1.0, 2.0, 3.0],
            &[3],
            &[2, 3],
        );
        assert_eq!(out, HostData::F32(vec![11.0, 12.0, 13.0, 21.0, 22.0, 23.0]));
    }

    #[test]
    fn scalar_operand_on_either_side() {
        let out = f32_eval(BinaryOp::Sub, &[10.0], &[], &[1.0, 2.0], &[2], &[2]);
        assert_eq!(out, HostData::F32(vec![9.0, 8.0]));
        let out = f32_eval(BinaryOp::Div, &[1.0, 2.0], &[2], &[4.0], &[1], &[2]);
        assert_eq!(out, HostData::F32(vec![0.25, 0.5]));
    }

    #[test]
    fn each_float_op_computes_hand_values() {
        let a = [2.0f32, -1.0, 3.0];
        let b = [3.0f32, 4.0, 3.0];
        let s = [3];
        let cases: [(BinaryOp, HostData); 13] = [
            (BinaryOp::Add, HostData::F32(vec![5.0, 3.0, 6.0])),
            (BinaryOp::Sub, HostData::F32(vec![-1.0, -5.0, 0.0])),
            (BinaryOp::Mul, HostData::F32(vec![6.0, -4.0, 9.0])),
            (BinaryOp::Div, HostData::F32(vec![2.0 / 3.0, -0.25, 1.0])),
            (BinaryOp::Pow, HostData::F32(vec![8.0, 1.0, 27.0])),
            (BinaryOp::Maximum, HostData::F32(vec![3.0, 4.0, 3.0])),
            (BinaryOp::Minimum, HostData::F32(vec![2.0, -1.0, 3.0])),
            (BinaryOp::Eq, HostData::Bool(vec![false, false, true])),
            (BinaryOp::Ne, HostData::Bool(vec![true, true, false])),
            (BinaryOp::Lt, HostData::Bool(vec![true, true, false])),
            (BinaryOp::Le, HostData::Bool(vec![true, true, true])),
            (BinaryOp::Gt, HostData::Bool(vec![false, false, false])),
            (BinaryOp::Ge, HostData::Bool(vec![false, false, true])),
        ];
        for (op, want) in cases {
            assert_eq!(f32_eval(op, &a, &s, &b, &s, &s), want, "{}", op.name());
        }
    }

    #[test]
    fn pow_follows_the_c99_special_cases() {
        // (x, y, x^y) from C99 F.9.4.4, which every backend's pow follows.
        let (inf, nan) = (f32::INFINITY, f32::NAN);
        let table = [
            (0.0, -1.0, inf),
            (-0.0, -3.0, -inf),
            (1.0, nan, 1.0),
            (nan, 0.0, 1.0),
            (-1.0, -inf, 1.0),
            (-2.0, 3.0, -8.0),
            (-2.0, 0.5, nan),
            (-inf, -3.0, -0.0),
            (0.5, -inf, inf),
        ];
        let (x, y): (Vec<f32>, Vec<f32>) = table.iter().map(|&(x, y, _)| (x, y)).unzip();
        let s = [table.len()];
        let HostData::F32(got) = f32_eval(BinaryOp::Pow, &x, &s, &y, &s, &s) else {
            panic!("pow of f32 is f32")
        };
        for (&(x, y, want), got) in table.iter().zip(got) {
            let same = (want.is_nan() && got.is_nan()) || want.to_bits() == got.to_bits();
            assert!(same, "pow({x}, {y}) = {got}, want {want}");
        }
    }

    #[test]
    fn maximum_and_minimum_propagate_nan() {
        for op in [BinaryOp::Maximum, BinaryOp::Minimum] {
            let out = f32_eval(op, &[f32::NAN, 1.0], &[2], &[1.0, f32::NAN], &[2], &[2]);
            let HostData::F32(v) = out else { panic!() };
            assert!(v.iter().all(|x| x.is_nan()));
        }
    }

    #[test]
    fn maximum_and_minimum_order_signed_zeros_whatever_the_operand_order() {
        let (neg, pos) = (-0.0f32, 0.0f32);
        let bits = |op, a: f32, b: f32| {
            let HostData::F32(v) = f32_eval(op, &[a], &[1], &[b], &[1], &[1]) else {
                panic!()
            };
            v[0].to_bits()
        };
        for (a, b) in [(neg, pos), (pos, neg)] {
            assert_eq!(bits(BinaryOp::Maximum, a, b), pos.to_bits());
            assert_eq!(bits(BinaryOp::Minimum, a, b), neg.to_bits());
        }
        assert_eq!(bits(BinaryOp::Maximum, neg, neg), neg.to_bits());
        assert_eq!(bits(BinaryOp::Minimum, pos, pos), pos.to_bits());
    }

    #[test]
    fn half_results_equal_f32_results_rounded() {
        let a = [0.1f32, 1.3, 2.7, 5.5];
        let b = [0.7f32, 3.1, 0.3, 2.0];
        for op in [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Pow,
            BinaryOp::Maximum,
        ] {
            let ah: Vec<f16> = a.iter().map(|&x| f16::from_f32(x)).collect();
            let bh: Vec<f16> = b.iter().map(|&x| f16::from_f32(x)).collect();
            let HostData::F32(want) = f32_eval(op, &widen(&ah), &[4], &widen(&bh), &[4], &[4])
            else {
                panic!()
            };
            let got = eval(op, &HostData::F16(ah), &[4], &HostData::F16(bh), &[4], &[4]);
            assert_eq!(got, Ok(HostData::F16(narrow(&want))));
            let ab: Vec<bf16> = a.iter().map(|&x| bf16::from_f32(x)).collect();
            let bb: Vec<bf16> = b.iter().map(|&x| bf16::from_f32(x)).collect();
            let HostData::F32(want) = f32_eval(op, &widen(&ab), &[4], &widen(&bb), &[4], &[4])
            else {
                panic!()
            };
            let got = eval(
                op,
                &HostData::BF16(ab),
                &[4],
                &HostData::BF16(bb),
                &[4],
                &[4],
            );
            assert_eq!(got, Ok(HostData::BF16(narrow(&want))));
        }
    }

    #[test]
    fn integer_arithmetic_wraps_and_division_by_zero_is_zero() {
        let a = HostData::I32(vec![i32::MAX, -7, 7, i32::MIN]);
        let b = HostData::I32(vec![1, 2, 0, -1]);
        let s = [4];
        assert_eq!(
            eval(BinaryOp::Add, &a, &s, &b, &s, &s),
            Ok(HostData::I32(vec![i32::MIN, -5, 7, i32::MAX]))
        );
        assert_eq!(
            eval(BinaryOp::Div, &a, &s, &b, &s, &s),
            Ok(HostData::I32(vec![i32::MAX, -3, 0, i32::MIN]))
        );
        let u = HostData::U8(vec![250, 3]);
        let v = HostData::U8(vec![10, 5]);
        assert_eq!(
            eval(BinaryOp::Add, &u, &[2], &v, &[2], &[2]),
            Ok(HostData::U8(vec![4, 8]))
        );
        assert_eq!(
            eval(BinaryOp::Sub, &u, &[2], &v, &[2], &[2]),
            Ok(HostData::U8(vec![240, 254]))
        );
        assert_eq!(
            eval(BinaryOp::Mul, &u, &[2], &v, &[2], &[2]),
            Ok(HostData::U8(vec![196, 15]))
        );
        assert_eq!(
            eval(BinaryOp::Maximum, &u, &[2], &v, &[2], &[2]),
            Ok(HostData::U8(vec![250, 5]))
        );
    }

    #[test]
    fn bool_maximum_is_or_and_minimum_is_and() {
        let a = HostData::Bool(vec![true, false, false]);
        let b = HostData::Bool(vec![false, false, true]);
        let s = [3];
        assert_eq!(
            eval(BinaryOp::Maximum, &a, &s, &b, &s, &s),
            Ok(HostData::Bool(vec![true, false, true]))
        );
        assert_eq!(
            eval(BinaryOp::Minimum, &a, &s, &b, &s, &s),
            Ok(HostData::Bool(vec![false, false, false]))
        );
        assert!(eval(BinaryOp::Add, &a, &s, &b, &s, &s).is_err());
    }

    #[test]
    fn size_zero_dims_give_empty_output() {
        let out = f32_eval(BinaryOp::Mul, &[], &[0, 3], &[1.0, 2.0, 3.0], &[3], &[0, 3]);
        assert_eq!(out, HostData::F32(vec![]));
        let (aval, _) = rule(
            BinaryOp::Mul,
            &Aval::new([0, 3], DType::F32),
            &Aval::new([1, 3], DType::F32),
        );
        assert_eq!(aval, Ok(Aval::new([0, 3], DType::F32)));
    }

    #[test]
    fn incompatible_shapes_name_op_and_both_avals() {
        let (out, _) = rule(
            BinaryOp::Add,
            &Aval::new([2, 3], DType::F32),
            &Aval::new([4], DType::F32),
        );
        let err = out.unwrap_err();
        assert!(matches!(err, Error::Shape { .. }));
        let msg = format!("{err}");
        for part in [
            "add",
            "f32[2,3]",
            "f32[4]",
            "cannot broadcast dim 3 with 4 at axis 1",
        ] {
            assert!(msg.contains(part), "{msg}");
        }
    }

    #[test]
    fn dtype_rules() {
        let f = Aval::new([2], DType::F32);
        let i = Aval::new([2], DType::I32);
        let t = Aval::new([2], DType::Bool);
        let err = rule(BinaryOp::Add, &f, &i).0.unwrap_err();
        assert!(matches!(err, Error::DType { .. }) && format!("{err}").contains("i32[2]"));
        assert!(matches!(
            rule(BinaryOp::Pow, &i, &i).0,
            Err(Error::DType { .. })
        ));
        assert!(matches!(
            rule(BinaryOp::Sub, &t, &t).0,
            Err(Error::DType { .. })
        ));
        assert_eq!(rule(BinaryOp::Maximum, &t, &t).0, Ok(t.clone()));
        assert_eq!(
            rule(BinaryOp::Lt, &i, &i).0,
            Ok(Aval::new([2], DType::Bool))
        );
        assert_eq!(rule(BinaryOp::Mul, &i, &i).0, Ok(i.clone()));
    }

    #[test]
    fn symbolic_dim_against_known_needs_no_guard() {
        let s0 = Dim::symbol(Symbol(0));
        let a = Aval::new(Shape(vec![s0.clone(), Dim::Known(4)]), DType::F32);
        let (out, guards) = rule(BinaryOp::Add, &a, &Aval::new([4], DType::F32));
        assert_eq!(out, Ok(a.clone()));
        assert!(guards.is_empty());
    }

    #[test]
    fn two_distinct_symbols_record_one_equal_guard() {
        let s0 = Dim::symbol(Symbol(0));
        let s1 = Dim::symbol(Symbol(1));
        let a = Aval::new(Shape(vec![s0.clone()]), DType::F32);
        let b = Aval::new(Shape(vec![s1.clone()]), DType::F32);
        let mut cx = ShapeCx::new();
        let out = crate::ops::Op::Binary(BinaryOp::Add).shape_rule(&[&a, &b], &mut cx);
        assert_eq!(out.map(|a| a.shape.rank()), Ok(1));
        assert_eq!(
            cx.guards,
            vec![Guard {
                op: "add".to_string(),
                condition: Condition::Equal(s0, s1)
            }]
        );
    }

    fn naive_broadcast_add(
        a: &[i32],
        ash: &[usize],
        b: &[i32],
        bsh: &[usize],
        out: &[usize],
    ) -> Vec<i32> {
        let n: usize = out.iter().product();
        (0..n)
            .map(|flat| {
                let mut rem = flat;
                let mut idx = vec![0; out.len()];
                for d in (0..out.len()).rev() {
                    idx[d] = rem % out[d];
                    rem /= out[d];
                }
                let at = |data: &[i32], sh: &[usize]| {
                    let lead = out.len() - sh.len();
                    let mut off = 0;
                    for (j, &d) in sh.iter().enumerate() {
                        off = off * d + if d == 1 { 0 } else { idx[lead + j] };
                    }
                    data[off]
                };
                at(a, ash).wrapping_add(at(b, bsh))
            })
            .collect()
    }

    fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>, Vec<usize>)> {
        prop::collection::vec(0usize..4, 0..4)
            .prop_flat_map(|out| {
                let rank = out.len();
                let masks = prop::collection::vec(any::<bool>(), rank);
                (Just(out), masks.clone(), masks, 0..=rank, 0..=rank)
            })
            .prop_map(|(out, ma, mb, da, db)| {
                let pick = |mask: &[bool], drop: usize| -> Vec<usize> {
                    out.iter()
                        .zip(mask)
                        .skip(drop)
                        .map(|(&d, &one)| if one { 1 } else { d })
                        .collect()
                };
                (pick(&ma, da), pick(&mb, db), out)
            })
    }

    proptest! {
        #![proptest_config(proptest_config())]
        #[test]
        fn broadcast_eval_matches_naive_indexing((ash, bsh, _) in broadcast_pair()) {
            let a: Vec<i32> = (0..ash.iter().product::<usize>() as i32).collect();
            let b: Vec<i32> = (0..bsh.iter().product::<usize>() as i32).map(|x| x * 100).collect();
            let (aa, ba) = (Aval::new(ash.clone(), DType::I32), Aval::new(bsh.clone(), DType::I32));
            let out = rule(BinaryOp::Add, &aa, &ba).0.unwrap().shape.as_known().unwrap();
            let got = eval(BinaryOp::Add, &HostData::I32(a.clone()), &ash, &HostData::I32(b.clone()), &bsh, &out).unwrap();
            prop_assert_eq!(got, HostData::I32(naive_broadcast_add(&a, &ash, &b, &bsh, &out)));
        }
    }

    use crate::compile::rule_checks as rules;
    use crate::ops::Op;

    #[test]
    fn arithmetic_jvps_match_central_differences_with_broadcasting() {
        let a = rules::uniform(3, &[2, 3], 0.5, 2.0);
        let b = rules::uniform(4, &[3], 0.5, 2.0);
        use BinaryOp::*;
        for op in [Add, Sub, Mul, Div, Pow] {
            let f = move |x: Vec<Array>| Array::apply(Op::Binary(op), x);
            rules::assert_jvp_matches_central_difference(op.name(), f, &[a.clone(), b.clone()]);
        }
    }

    #[test]
    fn maximum_jvp_takes_the_larger_operands_tangent() {
        let a = rules::array(&[1.0, 5.0], &[2]);
        let b = rules::array(&[3.0, 2.0], &[2]);
        let (_, t) = crate::jvp(
            |x: (Array, Array)| x.0.maximum(&x.1),
            &(a, b),
            &(
                rules::array(&[10.0, 20.0], &[2]),
                rules::array(&[30.0, 40.0], &[2]),
            ),
        )
        .unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), [30.0, 20.0]);
    }

    #[test]
    fn a_binary_op_batches_a_batched_operand_against_a_batched_one_of_lower_rank() {
        let xs = rules::normal(5, &[3, 2, 4]);
        let ys = rules::normal(6, &[3, 4]);
        let report =
            rules::assert_batches_like_stacking("mul", |x| &x[0] * &x[1] - &x[1], &[xs, ys]);
        assert!(
            report.vmap_fallbacks.is_empty(),
            "{:?}",
            report.vmap_fallbacks
        );
    }
}
