//! Host (CPU) storage of array elements.

use crate::dtype::{DType, Element};
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

    /// `len` copies of `value` converted to `dtype`.
    pub fn filled(dtype: DType, len: usize, value: f64) -> HostData {
        // `<f16 as Element>`, not half's inherent `from_f64`, which rounds twice.
        match dtype {
            DType::F32 => HostData::F32(vec![f32::from_f64(value); len]),
            DType::F16 => HostData::F16(vec![<f16 as Element>::from_f64(value); len]),
            DType::BF16 => HostData::BF16(vec![<bf16 as Element>::from_f64(value); len]),
            DType::I32 => HostData::I32(vec![i32::from_f64(value); len]),
            DType::U32 => HostData::U32(vec![u32::from_f64(value); len]),
            DType::Bool => HostData::Bool(vec![bool::from_f64(value); len]),
            DType::U8 => HostData::U8(vec![u8::from_f64(value); len]),
        }
    }

    /// Builds data of `dtype` from f64 values (cast semantics of [`Element::from_f64`]).
    pub fn from_f64s(dtype: DType, values: impl Iterator<Item = f64>) -> HostData {
        match dtype {
            DType::F32 => HostData::F32(values.map(f32::from_f64).collect()),
            DType::F16 => HostData::F16(values.map(<f16 as Element>::from_f64).collect()),
            DType::BF16 => HostData::BF16(values.map(<bf16 as Element>::from_f64).collect()),
            DType::I32 => HostData::I32(values.map(i32::from_f64).collect()),
            DType::U32 => HostData::U32(values.map(u32::from_f64).collect()),
            DType::Bool => HostData::Bool(values.map(bool::from_f64).collect()),
            DType::U8 => HostData::U8(values.map(u8::from_f64).collect()),
        }
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
        with_host_data!(self, v => v.iter().map(|x| T::from_f64(x.to_f64())).collect())
    }

    /// Bytes the elements occupy.
    pub fn size_bytes(&self) -> usize {
        self.len() * self.dtype().size_bytes()
    }
}
