//! Host (CPU) storage of array elements.

use crate::dtype::{DType, Element};
use crate::error::Result;
use crate::limits::try_vec;
use half::{bf16, f16};

/// Contiguous row-major elements of one dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    /// f32 elements.
    F32(Vec<f32>),
    /// f16 elements.
    F16(Vec<f16>),
    /// bf16 elements.
    BF16(Vec<bf16>),
    /// i32 elements.
    I32(Vec<i32>),
    /// u32 elements.
    U32(Vec<u32>),
    /// bool elements.
    Bool(Vec<bool>),
    /// u8 elements.
    U8(Vec<u8>),
}

/// Runs `$body` with `$v` bound to the typed Vec inside a [`HostData`].
#[macro_export]
#[doc(hidden)]
macro_rules! with_host_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::HostData::F32($v) => $body,
            $crate::HostData::F16($v) => $body,
            $crate::HostData::BF16($v) => $body,
            $crate::HostData::I32($v) => $body,
            $crate::HostData::U32($v) => $body,
            $crate::HostData::Bool($v) => $body,
            $crate::HostData::U8($v) => $body,
        }
    };
}

/// Evaluates `$body` with `$t` naming the Rust element type of `$dtype`
/// and wraps the `Vec<$t>` it returns in the matching [`HostData`] variant.
/// Conversions in `$body` must say `<$t as Element>::from_f64`: half's
/// inherent `from_f64` would win over the trait's and rounds twice.
macro_rules! with_element_type {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            DType::F32 => HostData::F32({
                type $t = f32;
                $body
            }),
            DType::F16 => HostData::F16({
                type $t = f16;
                $body
            }),
            DType::BF16 => HostData::BF16({
                type $t = bf16;
                $body
            }),
            DType::I32 => HostData::I32({
                type $t = i32;
                $body
            }),
            DType::U32 => HostData::U32({
                type $t = u32;
                $body
            }),
            DType::Bool => HostData::Bool({
                type $t = bool;
                $body
            }),
            DType::U8 => HostData::U8({
                type $t = u8;
                $body
            }),
        }
    };
}

/// A Rust element type that [`HostData`] can hold.
pub trait HostElement: Element {
    /// Wraps a Vec of this type.
    fn wrap(values: Vec<Self>) -> HostData;
    /// Borrows the elements if the data has this type.
    fn slice(data: &HostData) -> Option<&[Self]>;
}

macro_rules! host_element {
    ($t:ty, $variant:ident) => {
        impl HostElement for $t {
            fn wrap(values: Vec<Self>) -> HostData {
                HostData::$variant(values)
            }
            fn slice(data: &HostData) -> Option<&[Self]> {
                match data {
                    HostData::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}

host_element!(f32, F32);
host_element!(f16, F16);
host_element!(bf16, BF16);
host_element!(i32, I32);
host_element!(u32, U32);
host_element!(bool, Bool);
host_element!(u8, U8);

impl HostData {
    /// Overwrites the elements with `src`'s, keeping this buffer; `Err`
    /// describes a dtype or length mismatch.
    pub fn copy_from(&mut self, src: &HostData) -> Result<(), String> {
        let (len, dtype) = (self.len(), self.dtype());
        let mismatch = || {
            format!(
                "cannot copy {} {} elements into {len} {dtype} elements",
                src.len(),
                src.dtype(),
            )
        };
        if self.len() != src.len() {
            return Err(mismatch());
        }
        match (&mut *self, src) {
            (HostData::F32(d), HostData::F32(s)) => d.copy_from_slice(s),
            (HostData::F16(d), HostData::F16(s)) => d.copy_from_slice(s),
            (HostData::BF16(d), HostData::BF16(s)) => d.copy_from_slice(s),
            (HostData::I32(d), HostData::I32(s)) => d.copy_from_slice(s),
            (HostData::U32(d), HostData::U32(s)) => d.copy_from_slice(s),
            (HostData::Bool(d), HostData::Bool(s)) => d.copy_from_slice(s),
            (HostData::U8(d), HostData::U8(s)) => d.copy_from_slice(s),
            _ => return Err(mismatch()),
        }
        Ok(())
    }

    /// The dtype of the elements.
    pub fn dtype(&self) -> DType {
        match self {
            HostData::F32(_) => DType::F32,
            HostData::F16(_) => DType::F16,
            HostData::BF16(_) => DType::BF16,
            HostData::I32(_) => DType::I32,
            HostData::U32(_) => DType::U32,
            HostData::Bool(_) => DType::Bool,
            HostData::U8(_) => DType::U8,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        with_host_data!(self, v => v.len())
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `len` zeros of `dtype`.
    pub fn zeros(dtype: DType, len: usize) -> HostData {
        HostData::filled(dtype, len, 0.0)
    }

    /// `len` copies of `value` converted to `dtype`, allocated infallibly:
    /// for sizes Kiln already checked; [`HostData::try_filled`] takes
    /// sizes a user gives.
    pub fn filled(dtype: DType, len: usize, value: f64) -> HostData {
        with_element_type!(dtype, T => vec![<T as Element>::from_f64(value); len])
    }

    /// Builds data of `dtype` from f64 values (cast semantics of [`Element::from_f64`]).
    pub fn from_f64s(dtype: DType, values: impl Iterator<Item = f64>) -> HostData {
        with_element_type!(dtype, T => values.map(<T as Element>::from_f64).collect())
    }

    /// `len` copies of `value` converted to `dtype`, in a buffer allocated
    /// fallibly: one the system cannot give is an [`crate::Error::Allocation`]
    /// naming `op`.
    pub fn try_filled(op: &str, dtype: DType, len: usize, value: f64) -> Result<HostData> {
        Ok(with_element_type!(dtype, T => {
            let mut values = try_vec::<T>(op, len)?;
            values.resize(len, <T as Element>::from_f64(value));
            values
        }))
    }

    /// The first `len` of `values` converted to `dtype` (cast semantics of
    /// [`Element::from_f64`]), in a buffer allocated fallibly.
    pub fn try_from_f64s(
        op: &str,
        dtype: DType,
        len: usize,
        values: impl Iterator<Item = f64>,
    ) -> Result<HostData> {
        Ok(with_element_type!(dtype, T => {
            let mut out = try_vec::<T>(op, len)?;
            out.extend(values.take(len).map(<T as Element>::from_f64));
            out
        }))
    }

    /// Element `i` as f64.
    pub fn get_f64(&self, i: usize) -> f64 {
        with_host_data!(self, v => v[i].to_f64())
    }

    /// Every element as f64.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        with_host_data!(self, v => v.iter().map(|x| x.to_f64()).collect())
    }

    /// The elements converted to `T` (cast semantics of [`Element::from_f64`]).
    pub fn to_vec<T: HostElement>(&self) -> Vec<T> {
        if let Some(s) = T::slice(self) {
            return s.to_vec();
        }
        with_host_data!(self, v => v.iter().map(|x| <T as Element>::from_f64(x.to_f64())).collect())
    }

    /// A copy of the `len` elements from `start` (a row of a stacked
    /// array); `None` when they are not all there.
    pub fn range(&self, start: usize, len: usize) -> Option<HostData> {
        let end = start.checked_add(len)?;
        Some(with_host_data!(self, v => HostElement::wrap(v.get(start..end)?.to_vec())))
    }

    /// Overwrites the elements from `start` with `src`'s (a row of a
    /// stacked array); `Err` describes a dtype or length mismatch.
    pub fn write_range(&mut self, start: usize, src: &HostData) -> Result<(), String> {
        let (len, dtype) = (self.len(), self.dtype());
        let mismatch = || {
            format!(
                "cannot write {} {} elements at {start} of {len} {dtype} elements",
                src.len(),
                src.dtype(),
            )
        };
        let end = start
            .checked_add(src.len())
            .filter(|&e| e <= len)
            .ok_or_else(mismatch)?;
        match (&mut *self, src) {
            (HostData::F32(d), HostData::F32(s)) => d[start..end].copy_from_slice(s),
            (HostData::F16(d), HostData::F16(s)) => d[start..end].copy_from_slice(s),
            (HostData::BF16(d), HostData::BF16(s)) => d[start..end].copy_from_slice(s),
            (HostData::I32(d), HostData::I32(s)) => d[start..end].copy_from_slice(s),
            (HostData::U32(d), HostData::U32(s)) => d[start..end].copy_from_slice(s),
            (HostData::Bool(d), HostData::Bool(s)) => d[start..end].copy_from_slice(s),
            (HostData::U8(d), HostData::U8(s)) => d[start..end].copy_from_slice(s),
            _ => return Err(mismatch()),
        }
        Ok(())
    }

    /// Bytes the elements occupy.
    pub fn size_bytes(&self) -> usize {
        self.len() * self.dtype().size_bytes()
    }
}
