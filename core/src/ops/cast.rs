//! Elementwise dtype conversion: shape rule and reference evaluation.

use super::strided::widen;
use crate::data::HostData;
use crate::handle::array::Array;
use crate::ops::Op;
use crate::shape::Aval;
use crate::DType;
use half::{bf16, f16};

impl Array {
    /// Elementwise conversion to `dtype`.
    #[track_caller]
    pub fn cast(&self, dtype: DType) -> Array {
        Array::apply(Op::Cast(dtype), vec![self.clone()])
    }
}

/// The output aval: the operand's shape with the new dtype.
pub fn shape_rule(aval: &Aval, dtype: DType) -> Aval {
    Aval::new(aval.shape.clone(), dtype)
}

/// Reference evaluation with the semantics of [`crate::Element::from_f64`]:
/// floats round to nearest, float → integer truncates toward zero and
/// saturates (NaN → 0), anything → bool is `x != 0`, bool → number is 0/1.
///
/// Every conversion rounds once from the exact value: f64 holds every
/// element exactly and [`crate::Element::from_f64`] rounds once, so integers
/// above 2^24 reach f16/bf16 without a detour through f32. The f32 ↔
/// f16/bf16/i32 conversions run directly, as a shortcut with equal results.
pub fn eval(data: &HostData, dtype: DType) -> HostData {
    match (data, dtype) {
        (_, d) if d == data.dtype() => data.clone(),
        (HostData::F32(v), DType::F16) => {
            HostData::F16(v.iter().map(|&x| f16::from_f32(x)).collect())
        }
        (HostData::F32(v), DType::BF16) => {
            HostData::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect())
        }
        (HostData::F32(v), DType::I32) => HostData::I32(v.iter().map(|&x| x as i32).collect()),
        (HostData::F16(v), DType::F32) => HostData::F32(widen(v)),
        (HostData::BF16(v), DType::F32) => HostData::F32(widen(v)),
        (HostData::I32(v), DType::F32) => HostData::F32(v.iter().map(|&x| x as f32).collect()),
        (_, DType::F32) => HostData::F32(data.to_vec()),
        (_, DType::F16) => HostData::F16(data.to_vec()),
        (_, DType::BF16) => HostData::BF16(data.to_vec()),
        (_, DType::I32) => HostData::I32(data.to_vec()),
        (_, DType::U32) => HostData::U32(data.to_vec()),
        (_, DType::Bool) => HostData::Bool(data.to_vec()),
        (_, DType::U8) => HostData::U8(data.to_vec()),
    }
}

/// The cotangent of `x` through a cast: `g` cast back between floats; none
/// to or from integers and bool, which carry no gradient.
pub(crate) fn vjp(x: &Array, g: &Array) -> Option<Array> {
    (x.dtype().is_float() && g.dtype().is_float()).then(|| g.cast(x.dtype()))
}

/// The tangent through a cast to `dtype`: `t` cast along between floats;
/// none to integers and bool (an integer operand has no tangent).
pub(crate) fn jvp(t: &Array, dtype: DType) -> Option<Array> {
    (t.dtype().is_float() && dtype.is_float()).then(|| t.cast(dtype))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::strided::proptest_config;
    use crate::shape::{Dim, Shape, Symbol};
    use proptest::prelude::*;

    #[test]
    fn float_to_int_truncates_saturates_and_maps_nan_to_zero() {
        let v = HostData::F32(vec![2.7, -2.7, 1e20, -1e20, f32::NAN]);
        assert_eq!(
            eval(&v, DType::I32),
            HostData::I32(vec![2, -2, i32::MAX, i32::MIN, 0])
        );
        assert_eq!(eval(&v, DType::U8), HostData::U8(vec![2, 0, 255, 0, 0]));
        assert_eq!(
            eval(&v, DType::U32),
            HostData::U32(vec![2, 0, u32::MAX, 0, 0])
        );
    }

    #[test]
    fn anything_to_bool_is_nonzero_and_bool_to_number_is_zero_or_one() {
        let v = HostData::F32(vec![0.0, -0.0, 0.5, f32::NAN]);
        assert_eq!(
            eval(&v, DType::Bool),
            HostData::Bool(vec![false, false, true, true])
        );
        let b = HostData::Bool(vec![true, false]);
        assert_eq!(
            eval(&b, DType::F16),
            HostData::F16(vec![f16::ONE, f16::ZERO])
        );
        assert_eq!(eval(&b, DType::I32), HostData::I32(vec![1, 0]));
    }

    #[test]
    fn f32_to_halves_round_to_nearest() {
        let v = HostData::F32(vec![1.0 + 1.0 / 4096.0, 65520.0]);
        let HostData::F16(h) = eval(&v, DType::F16) else {
            panic!()
        };
        assert_eq!(h[0], f16::ONE);
        assert!(h[1].is_infinite());
        let HostData::BF16(b) = eval(&HostData::F32(vec![1.0 + 1.0 / 256.0]), DType::BF16) else {
            panic!()
        };
        assert_eq!(b[0], bf16::ONE);
    }

    #[test]
    fn empty_data_casts_to_empty() {
        assert_eq!(
            eval(&HostData::U8(vec![]), DType::BF16),
            HostData::BF16(vec![])
        );
    }

    #[test]
    fn shape_rule_keeps_symbolic_shape() {
        let shape = Shape(vec![Dim::symbol(Symbol(0)), Dim::Known(3)]);
        let out = shape_rule(&Aval::new(shape.clone(), DType::F32), DType::U8);
        assert_eq!(out, Aval::new(shape, DType::U8));
    }

    #[test]
    fn f32_to_bf16_rounds_once_from_the_exact_value() {
        // Just above a tie: the low half of the f32 is 0x8001, so it rounds up.
        // (half's f64 → bf16 drops the low 32 bits of the f64 first and would
        // see an exact tie here.)
        let x = f32::from_bits(0xA929_8001);
        let HostData::BF16(b) = eval(&HostData::F32(vec![x]), DType::BF16) else {
            panic!()
        };
        assert_eq!(b[0].to_bits(), 0xA92A);
    }

    #[test]
    fn integers_to_halves_round_once_from_the_exact_value() {
        // 2^24 + 2^16 + 1 rounds to 2^24 through f32 (a tie there), but is
        // above the midpoint of 2^24 and 2^24 + 2^17.
        let ints = HostData::I32(vec![16_842_753, -16_842_753, i32::MAX, 65_519, 65_520]);
        assert_eq!(
            eval(&ints, DType::BF16).to_f64_vec(),
            [
                16_908_288.0,
                -16_908_288.0,
                2_147_483_648.0,
                65_536.0,
                65_536.0
            ]
        );
        assert_eq!(
            eval(&ints, DType::F16).to_f64_vec(),
            [
                f64::INFINITY,
                f64::NEG_INFINITY,
                f64::INFINITY,
                65_504.0,
                f64::INFINITY
            ]
        );
        let unsigned = HostData::U32(vec![16_842_753, u32::MAX, 0x8080_0001]);
        assert_eq!(
            eval(&unsigned, DType::BF16).to_f64_vec(),
            [16_908_288.0, 4_294_967_296.0, 2_164_260_864.0]
        );
    }

    proptest! {
        #![proptest_config(proptest_config())]
        #[test]
        fn direct_paths_equal_the_f64_route(bits in prop::collection::vec(any::<u32>(), 0..32)) {
            let xs: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
            let data = HostData::F32(xs.clone());
            for dtype in [DType::F16, DType::BF16, DType::I32] {
                let via_f64 = HostData::from_f64s(dtype, xs.iter().map(|&x| f64::from(x)));
                // Debug output compares NaNs as equal.
                prop_assert_eq!(format!("{:?}", eval(&data, dtype)), format!("{:?}", via_f64));
            }
            let ints: Vec<i32> = bits.iter().map(|&b| b as i32).collect();
            let direct = eval(&HostData::I32(ints.clone()), DType::F32);
            prop_assert_eq!(direct, HostData::from_f64s(DType::F32, ints.iter().map(|&x| f64::from(x))));
            let full: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
            let via_f64 = HostData::from_f64s(DType::I32, full.iter().map(|&x| f64::from(x)));
            prop_assert_eq!(eval(&HostData::F32(full), DType::I32), via_f64);
        }
    }

    use crate::compile::rule_checks as rules;

    #[test]
    fn cast_jvp_casts_the_tangent_and_an_integer_result_has_none() {
        let x = rules::array(&[1.5, -2.0], &[2]);
        let v = rules::array(&[0.25, 4.0], &[2]);
        let (_, t) = crate::jvp(|x: Array| x.cast(DType::F16), &x, &v).unwrap();
        assert_eq!(t.dtype(), DType::F16);
        assert_eq!(t.cast(DType::F32).to_vec::<f32>().unwrap(), [0.25, 4.0]);
        // An integer output takes zeros: no tangent flows through it.
        let (_, t) = crate::jvp(|x: Array| x.cast(DType::I32), &x, &v).unwrap();
        assert_eq!(t.to_vec::<i32>().unwrap(), [0, 0]);
    }

    #[test]
    fn cast_batches_elementwise_like_each_example() {
        let xs = rules::normal(9, &[3, 5]);
        let f = |x: Vec<Array>| x[0].cast(DType::BF16).cast(DType::F32);
        let report = rules::assert_batches_like_stacking("cast", f, &[xs]);
        assert!(
            report.vmap_fallbacks.is_empty(),
            "{:?}",
            report.vmap_fallbacks
        );
    }
}
