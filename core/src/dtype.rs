//! Element types and the Rust scalar types that carry them.

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

    /// True for the types with a sign (the floats and i32).
    pub fn is_signed(self) -> bool {
        self.is_float() || self == DType::I32
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
    /// floats round to nearest, integers truncate toward zero and saturate,
    /// bool is `x != 0`.
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

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(value: f64) -> Self {
        f16::from_f64(value)
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(value: f64) -> Self {
        bf16::from_f64(value)
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
