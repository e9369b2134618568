//! Element types and the Rust scalar types that carry them.
//!
//! Conversions to a float dtype round once, to nearest even, from the exact
//! value (see [`Element::from_f64`] and the integer cases of
//! [`crate::Array::cast`]); the reference keeps subnormals, which GPU
//! backends may flush to zero (WGSL allows it).

use half::{bf16, f16};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The element type of an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float; evaluated through f32 on the CPU.
    F16,
    /// bfloat16; evaluated through f32 on the CPU.
    BF16,
    /// 32-bit signed integer.
    I32,
    /// 32-bit unsigned integer.
    U32,
    /// Boolean (one byte per element).
    Bool,
    /// 8-bit unsigned integer.
    U8,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::U32,
        DType::Bool,
        DType::U8,
    ];

    /// Bytes one element occupies in a buffer.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Bool | DType::U8 => 1,
        }
    }

    /// True for f32, f16 and bf16.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// True for the integer types (i32, u32, u8).
    pub fn is_integer(self) -> bool {
        matches!(self, DType::I32 | DType::U32 | DType::U8)
    }

    /// The values an integer dtype holds; `None` for floats and bool.
    pub fn integer_range(self) -> Option<std::ops::RangeInclusive<i128>> {
        match self {
            DType::I32 => Some(i32::MIN.into()..=i32::MAX.into()),
            DType::U32 => Some(0..=u32::MAX.into()),
            DType::U8 => Some(0..=u8::MAX.into()),
            _ => None,
        }
    }

    /// True for the types with a sign (the floats and i32).
    pub fn is_signed(self) -> bool {
        self.is_float() || self == DType::I32
    }

    /// The value integer `value` takes in this dtype: floats round once
    /// from the exact integer (an i64 above 2^53 would round once to f64
    /// and again to the dtype), integers saturate, bool is `value != 0`.
    pub(crate) fn round_integer(self, value: i128) -> f64 {
        let significant_bits = match self {
            DType::F32 => f32::MANTISSA_DIGITS,
            DType::F16 => f16::MANTISSA_DIGITS,
            DType::BF16 => bf16::MANTISSA_DIGITS,
            DType::I32 => return value.clamp(i32::MIN.into(), i32::MAX.into()) as f64,
            DType::U32 => return value.clamp(0, u32::MAX.into()) as f64,
            DType::U8 => return value.clamp(0, u8::MAX.into()) as f64,
            DType::Bool => return f64::from(u8::from(value != 0)),
        };
        let magnitude = value.unsigned_abs();
        let width = u128::BITS - magnitude.leading_zeros();
        let shift = width.saturating_sub(significant_bits);
        // At most `significant_bits` (≤ 24) significant bits below 2^128:
        // exact in f64, and in the dtype unless beyond its range, where the
        // conversion below gives the infinity rounding to nearest gives.
        let kept = (round_shifted(magnitude, shift) << shift) as f64;
        let rounded = if value < 0 { -kept } else { kept };
        match self {
            DType::F16 => <f16 as Element>::from_f64(rounded).to_f64(),
            DType::BF16 => <bf16 as Element>::from_f64(rounded).to_f64(),
            _ => f64::from(rounded as f32),
        }
    }

    /// The short lowercase name used in messages: `f32`, `bf16`, `bool`, ...
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::Bool => "bool",
            DType::U8 => "u8",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust scalar type that is the element type of some [`DType`].
///
/// Conversions go through `f64`, which represents every value of every
/// supported type exactly (u32 and i32 included).
pub trait Element: Copy + Send + Sync + PartialEq + fmt::Debug + 'static {
    /// The dtype this Rust type stores.
    const DTYPE: DType;
    /// The value as f64 (exact for every supported type).
    fn to_f64(self) -> f64;
    /// Converts from f64 with the cast semantics of [`crate::Array::cast`]:
    /// floats round once to nearest (ties to even) from the exact value,
    /// integers truncate toward zero and saturate, bool is `x != 0`.
    fn from_f64(value: f64) -> Self;
}

macro_rules! int_element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(value: f64) -> Self {
                // `as` from f64 truncates toward zero, saturates, and maps NaN to 0.
                value as $t
            }
        }
    };
}

int_element!(i32, DType::I32);
int_element!(u32, DType::U32);
int_element!(u8, DType::U8);

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(value: f64) -> Self {
        value as f32
    }
}

/// `magnitude >> shift` rounded to nearest, ties to even (`shift` < 128).
fn round_shifted(magnitude: u128, shift: u32) -> u128 {
    if shift == 0 {
        return magnitude;
    }
    let kept = magnitude >> shift;
    let rest = magnitude - (kept << shift);
    let half = 1u128 << (shift - 1);
    kept + u128::from(rest > half || (rest == half && kept & 1 == 1))
}

/// A binary16-like float format: sign, `exponent` bits, `mantissa` bits.
struct HalfFormat {
    exponent: u32,
    mantissa: u32,
}

const F16_FORMAT: HalfFormat = HalfFormat {
    exponent: 5,
    mantissa: 10,
};
const BF16_FORMAT: HalfFormat = HalfFormat {
    exponent: 8,
    mantissa: 7,
};

/// The bits of `value` rounded once, to nearest even, into `format`.
///
/// `half`'s own f64 conversions round twice: `f16::from_f64` goes through
/// f32 where the CPU has F16C, and `bf16::from_f64` drops the low 32 bits
/// of the f64 first, so near a tie both can land on the wrong neighbour
/// (bf16 of 16842753 = 2^24 + 2^16 + 1 gave 2^24, not 2^24 + 2^17).
fn round_f64_to_half(value: f64, format: &HalfFormat) -> u16 {
    let bits = value.to_bits();
    let sign = ((bits >> 63) as u16) << 15;
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let fraction = bits & ((1 << 52) - 1);
    let infinity = ((1u16 << format.exponent) - 1) << format.mantissa;
    if biased == 0x7ff {
        if fraction == 0 {
            return sign | infinity;
        }
        // A quiet NaN keeping the top of the payload.
        let payload = (fraction >> (52 - format.mantissa)) as u16;
        return sign | infinity | (1 << (format.mantissa - 1)) | payload;
    }
    if biased == 0 {
        // Zero or an f64 subnormal, far below half the smallest 16-bit subnormal.
        return sign;
    }
    let bias = (1i32 << (format.exponent - 1)) - 1;
    let min_exponent = 1 - bias;
    let exponent = biased - 1023;
    let significand = u128::from(fraction | (1 << 52));
    // `value` is significand · 2^(exponent - 52); the result counts units of
    // 2^(max(exponent, min_exponent) - mantissa), the spacing of 16-bit
    // values there (subnormals below `min_exponent`).
    let binade = exponent.max(min_exponent);
    let shift = (binade - format.mantissa as i32) - (exponent - 52);
    // Below 2^53, the significand rounds to 0 units for any shift from 54
    // on, so clamping keeps the result and the shift in range.
    let units = round_shifted(significand, shift.min(64) as u32);
    // Adding the rounded units to the binade's first encoding carries into
    // the exponent field when rounding reaches the next binade.
    let magnitude = (((binade - min_exponent) as u128) << format.mantissa) + units;
    if magnitude >= u128::from(infinity) {
        sign | infinity
    } else {
        sign | magnitude as u16
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(value: f64) -> Self {
        f16::from_bits(round_f64_to_half(value, &F16_FORMAT))
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(value: f64) -> Self {
        bf16::from_bits(round_f64_to_half(value, &BF16_FORMAT))
    }
}

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn to_f64(self) -> f64 {
        if self {
            1.0
        } else {
            0.0
        }
    }
    fn from_f64(value: f64) -> Self {
        value != 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::proptest_config;
    use proptest::prelude::*;

    /// The exact oracle: the bits of the 16-bit value nearest `value`
    /// (ties to even), found by searching the ordered positive encodings
    /// `0..infinity` through the exact widening `to_f64` and comparing
    /// `value` with the midpoint of its two neighbours (exact in f64).
    fn nearest(value: f64, infinity: u16, to_f64: fn(u16) -> f64) -> u16 {
        let sign = if value.is_sign_negative() { 0x8000 } else { 0 };
        let magnitude = value.abs();
        if magnitude == f64::INFINITY {
            return sign | infinity;
        }
        // The largest encoding whose value is at most `magnitude`.
        let below = last_at_most(infinity, |b| to_f64(b) <= magnitude);
        let low = to_f64(below);
        let midpoint = if below + 1 == infinity {
            // Past the largest finite value, ties go to infinity (the even side).
            low + (low - to_f64(below - 1)) / 2.0
        } else {
            (low + to_f64(below + 1)) / 2.0
        };
        let up = magnitude > midpoint || (magnitude == midpoint && below & 1 == 1);
        sign | (below + u16::from(up))
    }

    /// The last encoding in `0..infinity` for which `at_most` holds (it
    /// holds for 0 and is monotone: positive encodings are ordered).
    fn last_at_most(infinity: u16, at_most: impl Fn(u16) -> bool) -> u16 {
        let (mut low, mut high) = (0u16, infinity);
        while high - low > 1 {
            let mid = low + (high - low) / 2;
            if at_most(mid) {
                low = mid;
            } else {
                high = mid;
            }
        }
        low
    }

    fn f16_oracle(value: f64) -> u16 {
        nearest(value, 0x7c00, |b| f16::from_bits(b).to_f64())
    }

    fn bf16_oracle(value: f64) -> u16 {
        nearest(value, 0x7f80, |b| bf16::from_bits(b).to_f64())
    }

    /// f64 values that stress the rounding: any bits, values across the
    /// 16-bit ranges, and values a few f64 ulps from a midpoint of two
    /// neighbouring 16-bit values (`bf16` picks the format).
    fn values(bf16: bool) -> impl Strategy<Value = f64> {
        let to_f64 = move |b: u16| {
            if bf16 {
                bf16::from_bits(b).to_f64()
            } else {
                f16::from_bits(b).to_f64()
            }
        };
        let infinity: u16 = if bf16 { 0x7f80 } else { 0x7c00 };
        prop_oneof![
            any::<u64>().prop_map(f64::from_bits),
            // Exponents 2^-160 .. 2^130, either sign.
            (
                0x35f0_0000_0000_0000u64..0x4810_0000_0000_0000,
                any::<bool>()
            )
                .prop_map(|(b, neg)| f64::from_bits(b | (u64::from(neg) << 63))),
            (0..infinity - 1, -3i64..=3, any::<bool>()).prop_map(move |(b, ulps, neg)| {
                let midpoint = (to_f64(b) + to_f64(b + 1)) / 2.0;
                let near = f64::from_bits(midpoint.to_bits().wrapping_add_signed(ulps));
                if neg {
                    -near
                } else {
                    near
                }
            }),
        ]
    }

    #[test]
    fn bf16_from_f64_rounds_once_from_the_exact_value() {
        // 2^24 + 2^16 + 1 lies just above the midpoint of 2^24 and 2^24 + 2^17.
        assert_eq!(
            <bf16 as Element>::from_f64(16_842_753.0).to_f64(),
            16_908_288.0
        );
        // An exact tie goes to the even neighbour.
        assert_eq!(
            <bf16 as Element>::from_f64(16_842_752.0).to_f64(),
            16_777_216.0
        );
    }

    #[test]
    fn f16_from_f64_rounds_once_from_the_exact_value() {
        // Through f32 this is 1 + 2^-11, an exact tie that rounds down to 1.
        let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(<f16 as Element>::from_f64(x).to_f64(), 1.0 + 2f64.powi(-10));
    }

    #[test]
    fn halves_from_f64_keep_signed_zeros_infinities_and_nan() {
        for (x, f16_bits, bf16_bits) in [
            (0.0, 0x0000, 0x0000),
            (-0.0, 0x8000, 0x8000),
            (f64::INFINITY, 0x7c00, 0x7f80),
            (f64::NEG_INFINITY, 0xfc00, 0xff80),
            (f64::MIN_POSITIVE / 2.0, 0x0000, 0x0000),
            (-1e-300, 0x8000, 0x8000),
        ] {
            assert_eq!(<f16 as Element>::from_f64(x).to_bits(), f16_bits, "{x}");
            assert_eq!(<bf16 as Element>::from_f64(x).to_bits(), bf16_bits, "{x}");
        }
        assert!(<f16 as Element>::from_f64(f64::NAN).is_nan());
        assert!(<bf16 as Element>::from_f64(-f64::NAN).is_nan());
    }

    #[test]
    fn halves_from_f64_overflow_and_underflow_at_the_midpoints() {
        let f16_of = |x: f64| <f16 as Element>::from_f64(x).to_bits();
        // 65520 is the midpoint of 65504 (odd) and 2^16: ties go to infinity.
        assert_eq!(f16_of(65_519.999), 0x7bff);
        assert_eq!(f16_of(65_520.0), 0x7c00);
        // Half the smallest subnormal 2^-24 ties to zero; above it, rounds up.
        assert_eq!(f16_of(2f64.powi(-25)), 0x0000);
        assert_eq!(f16_of(2f64.powi(-25) * (1.0 + f64::EPSILON)), 0x0001);
        let bf16_of = |x: f64| <bf16 as Element>::from_f64(x).to_bits();
        assert_eq!(bf16_of(2f64.powi(-134)), 0x0000);
        assert_eq!(bf16_of(-(2f64.powi(-134)) * 1.5), 0x8001);
        assert_eq!(bf16_of(f64::from(f32::MAX)), 0x7f80);
    }

    #[test]
    fn round_integer_rounds_once_to_floats_and_saturates_integers() {
        // Through f64 this is 2^60 + 2^36, a tie that f32 rounds down to 2^60.
        let big = (1i128 << 60) + (1 << 36) + 1;
        assert_eq!(DType::F32.round_integer(big), 2f64.powi(60) + 2f64.powi(37));
        assert_eq!(DType::BF16.round_integer(16_842_753), 16_908_288.0);
        assert_eq!(DType::BF16.round_integer(-16_842_753), -16_908_288.0);
        assert_eq!(DType::F16.round_integer(65_520), f64::INFINITY);
        assert_eq!(DType::F16.round_integer(65_519), 65_504.0);
        assert_eq!(DType::F32.round_integer(i128::MIN), -(2f64.powi(127)));
        assert_eq!(DType::I32.round_integer(1 << 40), f64::from(i32::MAX));
        assert_eq!(DType::U32.round_integer(-5), 0.0);
        assert_eq!(DType::U8.round_integer(300), 255.0);
        assert_eq!(DType::Bool.round_integer(-2), 1.0);
        assert_eq!(DType::Bool.round_integer(0), 0.0);
    }

    proptest! {
        #![proptest_config(proptest_config())]
        #[test]
        fn f16_from_f64_is_the_nearest_f16(x in values(false)) {
            let got = <f16 as Element>::from_f64(x);
            if x.is_nan() {
                prop_assert!(got.is_nan());
            } else {
                prop_assert_eq!(got.to_bits(), f16_oracle(x), "{:e}", x);
            }
        }

        #[test]
        fn bf16_from_f64_is_the_nearest_bf16(x in values(true)) {
            let got = <bf16 as Element>::from_f64(x);
            if x.is_nan() {
                prop_assert!(got.is_nan());
            } else {
                prop_assert_eq!(got.to_bits(), bf16_oracle(x), "{:e}", x);
            }
        }

        #[test]
        fn round_integer_is_the_nearest_float(value in any::<i64>(), shift in 0u32..64) {
            // Shifting spreads the values over every magnitude of an i64.
            let value = i128::from(value >> shift);
            // Rust's integer-to-float `as` rounds once, to nearest even.
            prop_assert_eq!(DType::F32.round_integer(value), f64::from(value as f32));
            let f16_want = nearest_to_integer(value, 0x7c00, |b| f16::from_bits(b).to_f64());
            prop_assert_eq!(DType::F16.round_integer(value), f16_want);
            let bf16_want = nearest_to_integer(value, 0x7f80, |b| bf16::from_bits(b).to_f64());
            prop_assert_eq!(DType::BF16.round_integer(value), bf16_want);
        }
    }

    /// The 16-bit value nearest integer `value`, as f64, by exact integer
    /// comparisons (the f64 oracle [`nearest`] would round `value` first).
    fn nearest_to_integer(value: i128, infinity: u16, to_f64: fn(u16) -> f64) -> f64 {
        let magnitude = value.unsigned_abs();
        if magnitude == 0 {
            return 0.0;
        }
        // Rounding up keeps `≤ magnitude` exact for an integer magnitude, and
        // the midpoint comparison too: a non-integer neighbour only occurs
        // where `magnitude` itself is representable. Values above u128 saturate.
        let at = |b: u16| to_f64(b).ceil() as u128;
        let below = last_at_most(infinity, |b| at(b) <= magnitude);
        let above = if below + 1 == infinity {
            at(below) + (at(below) - at(below - 1))
        } else {
            at(below + 1)
        };
        let twice = 2 * magnitude;
        let sum = at(below) + above;
        let up = twice > sum || (twice == sum && below & 1 == 1);
        let rounded = to_f64(below + u16::from(up));
        if value < 0 {
            -rounded
        } else {
            rounded
        }
    }
}
