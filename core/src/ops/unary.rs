//! Elementwise one-operand math: shape rule and reference evaluation.

use super::math::{
    cos_f32, cos_reduced_f32, erf_f32, erf_small_f32, erf_takes_small, exp_f32, log_f32,
    map_chunked_in_place, map_chunked_into, map_into, sigmoid_f32, simd_dispatch, sin_f32,
    sin_reduced_f32, tanh_f32, tanh_small_f32, tanh_takes_small, trig_takes_reduced,
};
use super::strided::{eval_dtype_err, narrow, widen, HalfFloat};
use crate::data::HostData;
use crate::error::{dtype_err, require_float, Result};
use crate::handle::array::Array;
use crate::ops::Op;
use crate::shape::Aval;
use crate::DType;
use serde::{Deserialize, Serialize};

impl Array {
    #[track_caller]
    fn unary(&self, op: UnaryOp) -> Array {
        Array::apply(Op::Unary(op), vec![self.clone()])
    }

    /// `-x`.
    #[track_caller]
    pub fn neg(&self) -> Array {
        self.unary(UnaryOp::Neg)
    }
    /// `|x|`.
    #[track_caller]
    pub fn abs(&self) -> Array {
        self.unary(UnaryOp::Abs)
    }
    /// `e^x`.
    #[track_caller]
    pub fn exp(&self) -> Array {
        self.unary(UnaryOp::Exp)
    }
    /// Natural logarithm.
    #[track_caller]
    pub fn log(&self) -> Array {
        self.unary(UnaryOp::Log)
    }
    /// Sine.
    #[track_caller]
    pub fn sin(&self) -> Array {
        self.unary(UnaryOp::Sin)
    }
    /// Cosine.
    #[track_caller]
    pub fn cos(&self) -> Array {
        self.unary(UnaryOp::Cos)
    }
    /// Hyperbolic tangent.
    #[track_caller]
    pub fn tanh(&self) -> Array {
        self.unary(UnaryOp::Tanh)
    }
    /// Square root.
    #[track_caller]
    pub fn sqrt(&self) -> Array {
        self.unary(UnaryOp::Sqrt)
    }
    /// `1 / sqrt(x)`.
    #[track_caller]
    pub fn rsqrt(&self) -> Array {
        self.unary(UnaryOp::Rsqrt)
    }
    /// `1 / (1 + e^-x)`.
    #[track_caller]
    pub fn sigmoid(&self) -> Array {
        self.unary(UnaryOp::Sigmoid)
    }
    /// `maximum(x, 0)`: `relu(-0)` is `+0` and NaN stays NaN.
    #[track_caller]
    pub fn relu(&self) -> Array {
        self.unary(UnaryOp::Relu)
    }
    /// The error function.
    #[track_caller]
    pub fn erf(&self) -> Array {
        self.unary(UnaryOp::Erf)
    }
}

impl std::ops::Neg for Array {
    type Output = Array;
    #[track_caller]
    fn neg(self) -> Array {
        Array::neg(&self)
    }
}

impl std::ops::Neg for &Array {
    type Output = Array;
    #[track_caller]
    fn neg(self) -> Array {
        Array::neg(self)
    }
}

/// An elementwise one-operand op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UnaryOp {
    /// `-x` (signed integers wrap: `-i32::MIN == i32::MIN`).
    Neg,
    /// `|x|` (wrapping for i32).
    Abs,
    /// `e^x`.
    Exp,
    /// Natural logarithm.
    Log,
    /// Sine.
    Sin,
    /// Cosine.
    Cos,
    /// Hyperbolic tangent.
    Tanh,
    /// Square root.
    Sqrt,
    /// `1 / sqrt(x)`.
    Rsqrt,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// `max(x, 0)` (NaN stays NaN).
    Relu,
    /// The error function.
    Erf,
}

impl UnaryOp {
    /// Every unary op, in declaration order.
    pub const ALL: [UnaryOp; 12] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Tanh,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Erf,
    ];

    /// The op's name as users write it: `neg`, `abs`, `exp`, ...
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::Erf => "erf",
        }
    }

    /// True when the op is defined on `dtype`.
    fn accepts(self, dtype: DType) -> bool {
        match self {
            UnaryOp::Neg => dtype.is_signed(),
            UnaryOp::Abs | UnaryOp::Relu => dtype != DType::Bool,
            _ => dtype.is_float(),
        }
    }
}

/// The output aval: the operand's. `neg` needs a signed dtype, `abs` and
/// `relu` any numeric dtype, everything else a float.
pub fn shape_rule(op: UnaryOp, aval: &Aval) -> Result<Aval> {
    match op {
        UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu if !op.accepts(aval.dtype) => {
            let want = if op == UnaryOp::Neg {
                "a signed"
            } else {
                "a numeric"
            };
            Err(dtype_err(
                op.name(),
                &[aval],
                format!("expects {want} dtype, got {}", aval.dtype),
            ))
        }
        UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu => Ok(aval.clone()),
        _ => require_float(op.name(), aval).map(|()| aval.clone()),
    }
}

/// Reference evaluation: f32 directly, f16/bf16 through f32, integers with
/// wrapping semantics.
pub fn eval(op: UnaryOp, data: &HostData) -> Result<HostData> {
    if !op.accepts(data.dtype()) {
        return Err(eval_dtype_err(
            op.name(),
            &[data.dtype()],
            "unsupported dtype",
        ));
    }
    Ok(match data {
        HostData::F32(v) => HostData::F32(float_map(op, v)),
        HostData::F16(v) => HostData::F16(narrow(&float_map(op, &widen(v)))),
        HostData::BF16(v) => HostData::BF16(narrow(&float_map(op, &widen(v)))),
        HostData::I32(v) => HostData::I32(match op {
            UnaryOp::Neg => v.iter().map(|x| x.wrapping_neg()).collect(),
            UnaryOp::Abs => v.iter().map(|x| x.wrapping_abs()).collect(),
            _ => v.iter().map(|&x| x.max(0)).collect(),
        }),
        // abs and relu are the identity on unsigned types.
        HostData::U32(_) | HostData::U8(_) => data.clone(),
        HostData::Bool(_) => {
            return Err(eval_dtype_err(
                op.name(),
                &[DType::Bool],
                "unsupported dtype",
            ))
        }
    })
}

/// Binds `$f` to the f32 function of a float unary op and evaluates
/// `$body`: the one definition of each op's element semantics, shared by
/// the plain and the fused evaluation so both give the same bits.
macro_rules! with_f32_unary {
    ($op:expr, $f:ident => $body:expr) => {
        match $op {
            UnaryOp::Neg => {
                let $f = |x: f32| -x;
                $body
            }
            UnaryOp::Abs => {
                let $f = f32::abs;
                $body
            }
            UnaryOp::Exp => {
                let $f = exp_f32;
                $body
            }
            UnaryOp::Log => {
                let $f = log_f32;
                $body
            }
            UnaryOp::Sin => {
                let $f = sin_f32;
                $body
            }
            UnaryOp::Cos => {
                let $f = cos_f32;
                $body
            }
            UnaryOp::Tanh => {
                let $f = tanh_f32;
                $body
            }
            UnaryOp::Sqrt => {
                let $f = f32::sqrt;
                $body
            }
            UnaryOp::Rsqrt => {
                let $f = |x: f32| 1.0 / x.sqrt();
                $body
            }
            UnaryOp::Sigmoid => {
                let $f = sigmoid_f32;
                $body
            }
            UnaryOp::Relu => {
                // `<=` makes relu(-0) = +0, as IEEE maximum(x, +0) would.
                let $f = |x: f32| if x <= 0.0 { 0.0 } else { x };
                $body
            }
            UnaryOp::Erf => {
                let $f = erf_f32;
                $body
            }
        }
    };
}

/// The op's f32 function mapped over `v`.
fn float_map(op: UnaryOp, v: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; v.len()];
    float_map_into_simd(op, v, &mut out);
    out
}

simd_dispatch! {
    /// [`float_map_into`] in the widest SIMD build the CPU runs.
    fn float_map_into_simd(op: UnaryOp, src: &[f32], dst: &mut [f32]) {
        float_map_into(op, src, dst)
    }
}

simd_dispatch! {
    /// [`float_map_in_place`] in the widest SIMD build the CPU runs.
    fn float_map_in_place_simd(op: UnaryOp, v: &mut [f32]) {
        float_map_in_place(op, v)
    }
}

/// The op's f32 function from `src` into `dst` (equal lengths).
#[inline(always)]
pub(crate) fn float_map_into(op: UnaryOp, src: &[f32], dst: &mut [f32]) {
    float_map_into_then(op, src, dst, |y| y)
}

/// The op's f32 function from `src` into `dst` (equal lengths), each
/// result passed through `then` before it is stored (the fused executor's
/// epilogues). `tanh`, `erf`, `sin` and `cos` go chunk by chunk, skipping
/// the far branch in chunks that do not select it (see
/// [`map_chunked_into`]).
#[inline(always)]
pub(crate) fn float_map_into_then(
    op: UnaryOp,
    src: &[f32],
    dst: &mut [f32],
    then: impl Fn(f32) -> f32,
) {
    macro_rules! chunked {
        ($takes_fast:expr, $fast:expr, $full:expr) => {
            map_chunked_into(
                src,
                dst,
                $takes_fast,
                |x| then($fast(x)),
                |x| then($full(x)),
            )
        };
    }
    match op {
        UnaryOp::Tanh => chunked!(tanh_takes_small, tanh_small_f32, tanh_f32),
        UnaryOp::Erf => chunked!(erf_takes_small, erf_small_f32, erf_f32),
        UnaryOp::Sin => chunked!(trig_takes_reduced, sin_reduced_f32, sin_f32),
        UnaryOp::Cos => chunked!(trig_takes_reduced, cos_reduced_f32, cos_f32),
        _ => with_f32_unary!(op, f => map_into(src, dst, |x| then(f(x)))),
    }
}

/// [`float_map_into`] with `v` as source and destination.
#[inline(always)]
fn float_map_in_place(op: UnaryOp, v: &mut [f32]) {
    match op {
        UnaryOp::Tanh => map_chunked_in_place(v, tanh_takes_small, tanh_small_f32, tanh_f32),
        UnaryOp::Erf => map_chunked_in_place(v, erf_takes_small, erf_small_f32, erf_f32),
        UnaryOp::Sin => map_chunked_in_place(v, trig_takes_reduced, sin_reduced_f32, sin_f32),
        UnaryOp::Cos => map_chunked_in_place(v, trig_takes_reduced, cos_reduced_f32, cos_f32),
        _ => with_f32_unary!(op, f => v.iter_mut().for_each(|x| *x = f(*x))),
    }
}

/// Evaluates in place: each element of `data` is replaced by the op's
/// value of it, with the same bits as [`eval`].
pub fn eval_in_place(op: UnaryOp, data: &mut HostData) -> Result<()> {
    if !op.accepts(data.dtype()) || data.dtype() == DType::Bool {
        return Err(eval_dtype_err(
            op.name(),
            &[data.dtype()],
            "unsupported dtype",
        ));
    }
    match data {
        HostData::F32(v) => float_map_in_place_simd(op, v),
        HostData::F16(v) => map_half_in_place(op, v),
        HostData::BF16(v) => map_half_in_place(op, v),
        HostData::I32(v) => match op {
            UnaryOp::Neg => v.iter_mut().for_each(|x| *x = x.wrapping_neg()),
            UnaryOp::Abs => v.iter_mut().for_each(|x| *x = x.wrapping_abs()),
            _ => v.iter_mut().for_each(|x| *x = (*x).max(0)),
        },
        // abs and relu are the identity on unsigned types.
        HostData::U32(_) | HostData::U8(_) | HostData::Bool(_) => {}
    }
    Ok(())
}

/// The op through f32 on 16-bit floats, rounding once per element.
fn map_half_in_place<H: HalfFloat>(op: UnaryOp, v: &mut [H]) {
    with_f32_unary!(op, f => v.iter_mut().for_each(|x| *x = H::narrow(f(x.widen()))))
}

/// The cotangent of `x` for the cotangent `g` of `y = op(x)`. At the kinks
/// `abs` and `relu` take 0 (JAX's convention); `sqrt` at 0 is infinite, as
/// its derivative is.
#[track_caller]
pub(crate) fn vjp(op: UnaryOp, x: &Array, y: &Array, g: &Array) -> Array {
    let zero = || Array::scalar(0.0, x.dtype());
    match op {
        UnaryOp::Neg => -g,
        UnaryOp::Abs => {
            let one = Array::scalar(1.0, x.dtype());
            let sign = x
                .greater(0.0)
                .select(&one, x.less(0.0).select(-&one, zero()));
            g * sign
        }
        UnaryOp::Exp => g * y,
        UnaryOp::Log => g / x,
        UnaryOp::Sin => g * x.cos(),
        UnaryOp::Cos => -(g * x.sin()),
        UnaryOp::Tanh => g * (1.0 - y * y),
        UnaryOp::Sqrt => g * 0.5 / y,
        UnaryOp::Rsqrt => g * -0.5 * y / x,
        UnaryOp::Sigmoid => g * y * (1.0 - y),
        UnaryOp::Relu => x.greater(0.0).select(g, zero()),
        // d/dx erf(x) = 2/√π · e^(-x²)
        UnaryOp::Erf => g * std::f64::consts::FRAC_2_SQRT_PI * (-(x * x)).exp(),
    }
}

/// The tangent of `y = op(x)` for the tangent `t` of `x`. The derivative
/// is diagonal, so it is the cotangent rule applied to `t` (same kink
/// conventions).
#[track_caller]
pub(crate) fn jvp(op: UnaryOp, x: &Array, y: &Array, t: &Array) -> Array {
    vjp(op, x, y, t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use half::{bf16, f16};

    fn f32s(op: UnaryOp, v: &[f32]) -> Vec<f32> {
        match eval(op, &HostData::F32(v.to_vec())) {
            Ok(HostData::F32(out)) => out,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-6 * (1.0 + y.abs()), "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn float_ops_compute_hand_values() {
        close(&f32s(UnaryOp::Neg, &[1.5, -2.0]), &[-1.5, 2.0]);
        close(&f32s(UnaryOp::Abs, &[-3.0, 2.0]), &[3.0, 2.0]);
        close(
            &f32s(UnaryOp::Exp, &[0.0, 1.0]),
            &[1.0, std::f32::consts::E],
        );
        close(
            &f32s(UnaryOp::Log, &[1.0, std::f32::consts::E]),
            &[0.0, 1.0],
        );
        close(
            &f32s(UnaryOp::Sin, &[0.0, std::f32::consts::FRAC_PI_2]),
            &[0.0, 1.0],
        );
        close(
            &f32s(UnaryOp::Cos, &[0.0, std::f32::consts::PI]),
            &[1.0, -1.0],
        );
        close(&f32s(UnaryOp::Tanh, &[0.0, 100.0]), &[0.0, 1.0]);
        close(&f32s(UnaryOp::Sqrt, &[4.0, 9.0]), &[2.0, 3.0]);
        close(&f32s(UnaryOp::Rsqrt, &[4.0, 0.25]), &[0.5, 2.0]);
        close(
            &f32s(UnaryOp::Sigmoid, &[0.0, -200.0, 200.0]),
            &[0.5, 0.0, 1.0],
        );
        close(&f32s(UnaryOp::Relu, &[-1.0, 2.0]), &[0.0, 2.0]);
        close(
            &f32s(UnaryOp::Erf, &[0.0, 1.0, -1.0]),
            &[0.0, 0.842_700_8, -0.842_700_8],
        );
    }

    #[test]
    fn the_widest_simd_build_gives_the_baseline_bits() {
        // float_map_into here is compiled for the test's baseline target;
        // float_map_into_simd runs the AVX-512 or AVX2 copy where the CPU
        // has one. Every float op, over every binade and the specials.
        let src: Vec<f32> = (0..=u32::MAX)
            .step_by(65_537)
            .map(f32::from_bits)
            .chain((-3000..3000).map(|i| i as f32 * 0.005))
            .collect();
        for op in UnaryOp::ALL {
            let (mut base, mut wide) = (vec![0f32; src.len()], vec![0f32; src.len()]);
            float_map_into(op, &src, &mut base);
            float_map_into_simd(op, &src, &mut wide);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&base), bits(&wide), "{}", op.name());
        }
    }

    #[test]
    fn relu_keeps_nan() {
        assert!(f32s(UnaryOp::Relu, &[f32::NAN])[0].is_nan());
        assert_eq!(f32s(UnaryOp::Relu, &[-0.0])[0].to_bits(), 0.0f32.to_bits());
    }

    #[test]
    fn half_results_equal_f32_results_rounded() {
        // Half inputs are exact in f32, so the half result must be the f32
        // result on the widened inputs, rounded once.
        let xs = [0.3f32, 1.7, 2.5, 0.01, 1.0, 0.5];
        for op in UnaryOp::ALL {
            let h: Vec<f16> = xs.iter().map(|&x| f16::from_f32(x)).collect();
            let b: Vec<bf16> = xs.iter().map(|&x| bf16::from_f32(x)).collect();
            let want_h = HostData::F16(narrow(&f32s(op, &widen(&h))));
            let want_b = HostData::BF16(narrow(&f32s(op, &widen(&b))));
            assert_eq!(eval(op, &HostData::F16(h)), Ok(want_h), "{}", op.name());
            assert_eq!(eval(op, &HostData::BF16(b)), Ok(want_b), "{}", op.name());
        }
    }

    #[test]
    fn integer_neg_and_abs_wrap() {
        let v = HostData::I32(vec![i32::MIN, -3, 4]);
        assert_eq!(
            eval(UnaryOp::Neg, &v),
            Ok(HostData::I32(vec![i32::MIN, 3, -4]))
        );
        assert_eq!(
            eval(UnaryOp::Abs, &v),
            Ok(HostData::I32(vec![i32::MIN, 3, 4]))
        );
        assert_eq!(eval(UnaryOp::Relu, &v), Ok(HostData::I32(vec![0, 0, 4])));
        let u = HostData::U8(vec![0, 200]);
        assert_eq!(eval(UnaryOp::Relu, &u), Ok(u.clone()));
    }

    #[test]
    fn empty_input_gives_empty_output() {
        assert_eq!(
            eval(UnaryOp::Exp, &HostData::F32(vec![])),
            Ok(HostData::F32(vec![]))
        );
    }

    #[test]
    fn shape_rule_keeps_the_aval() {
        let a = Aval::new([2, 0, 3], DType::BF16);
        assert_eq!(shape_rule(UnaryOp::Tanh, &a), Ok(a.clone()));
        let i = Aval::new([4], DType::I32);
        assert_eq!(shape_rule(UnaryOp::Neg, &i), Ok(i.clone()));
        assert_eq!(
            shape_rule(UnaryOp::Abs, &Aval::new([4], DType::U8)).map(|a| a.dtype),
            Ok(DType::U8)
        );
    }

    #[test]
    fn neg_rejects_unsigned_and_bool() {
        for dtype in [DType::U32, DType::U8, DType::Bool] {
            let err = shape_rule(UnaryOp::Neg, &Aval::new([3], dtype)).unwrap_err();
            assert!(matches!(err, Error::DType { .. }));
            assert!(format!("{err}").contains("neg"));
            assert!(format!("{err}").contains(&format!("{dtype}[3]")));
        }
    }

    #[test]
    fn float_ops_reject_integers_and_abs_rejects_bool() {
        let err = shape_rule(UnaryOp::Exp, &Aval::new([2], DType::I32)).unwrap_err();
        assert!(matches!(err, Error::DType { .. }));
        assert!(format!("{err}").contains("exp") && format!("{err}").contains("i32[2]"));
        let err = shape_rule(UnaryOp::Abs, &Aval::new([2], DType::Bool)).unwrap_err();
        assert!(matches!(err, Error::DType { .. }));
        assert!(eval(UnaryOp::Relu, &HostData::Bool(vec![true])).is_err());
        assert!(eval(UnaryOp::Sqrt, &HostData::U32(vec![4])).is_err());
    }

    use crate::compile::rule_checks as rules;
    use crate::ops::Op;

    #[test]
    fn every_unary_jvp_matches_a_central_difference() {
        // Away from 0, where abs and relu bend.
        let x = rules::uniform(1, &[2, 3], 0.5, 2.0);
        use UnaryOp::*;
        for u in [
            Neg, Abs, Exp, Log, Sin, Cos, Tanh, Sqrt, Rsqrt, Sigmoid, Relu, Erf,
        ] {
            let f = move |x: Vec<Array>| Array::apply(Op::Unary(u), x);
            rules::assert_jvp_matches_central_difference(u.name(), f, std::slice::from_ref(&x));
        }
    }

    #[test]
    fn a_unary_op_batches_elementwise_like_each_example() {
        let xs = rules::uniform(2, &[3, 4], 0.5, 2.0);
        let report = rules::assert_batches_like_stacking("sqrt", |x| x[0].sqrt().exp(), &[xs]);
        assert!(
            report.vmap_fallbacks.is_empty(),
            "{:?}",
            report.vmap_fallbacks
        );
    }
}
