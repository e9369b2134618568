//! Array data to and from safetensors' little-endian bytes.

use crate::error::{Error, Result};
use crate::{Array, DType, HostData};
use half::{bf16, f16};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, View};
use std::borrow::Cow;
use std::sync::Arc;

/// The safetensors dtype of a Kiln dtype.
pub(super) fn file_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I32 => Dtype::I32,
        DType::U32 => Dtype::U32,
        DType::Bool => Dtype::BOOL,
        DType::U8 => Dtype::U8,
    }
}

/// The Kiln dtype of a safetensors dtype; `None` for those Kiln lacks
/// (f64, i64, i8, the 8-bit floats, ...).
pub(super) fn kiln_dtype(dtype: Dtype) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| file_dtype(d) == dtype)
}

/// A tensor's dtype as messages print it: Kiln's name where Kiln has the
/// dtype, else the file's (`F64`).
pub(super) fn dtype_label(dtype: Dtype) -> String {
    kiln_dtype(dtype).map_or_else(|| format!("{dtype:?}"), |d| d.to_string())
}

/// One array's data and shape, encoded to bytes when the file is written
/// (so that a file in memory holds one tensor's copy at a time besides
/// itself).
pub(super) struct Encoded {
    data: Arc<HostData>,
    shape: Vec<usize>,
}

impl Encoded {
    /// The computed data of `array`; `Err` naming `tensor` when its shape is
    /// not known or it does not compute.
    pub(super) fn of(tensor: &str, array: &Array) -> Result<Encoded> {
        let shape = array.dims().ok_or_else(|| Error::Weights {
            tensor: tensor.to_string(),
            detail: format!("its shape {} is not concrete", array.aval()),
        })?;
        Ok(Encoded {
            data: array.data()?,
            shape,
        })
    }
}

impl View for Encoded {
    fn dtype(&self) -> Dtype {
        file_dtype(self.data.dtype())
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(to_le_bytes(&self.data))
    }

    fn data_len(&self) -> usize {
        self.data.len() * self.data.dtype().size_bytes()
    }
}

/// The elements of `data`, little-endian (bool as one byte, 0 or 1).
fn to_le_bytes(data: &HostData) -> Vec<u8> {
    fn flat<const N: usize, T: Copy>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        v.iter().flat_map(|&x| f(x)).collect()
    }
    match data {
        HostData::F32(v) => flat(v, f32::to_le_bytes),
        HostData::F16(v) => flat(v, f16::to_le_bytes),
        HostData::BF16(v) => flat(v, bf16::to_le_bytes),
        HostData::I32(v) => flat(v, i32::to_le_bytes),
        HostData::U32(v) => flat(v, u32::to_le_bytes),
        HostData::Bool(v) => v.iter().map(|&b| u8::from(b)).collect(),
        HostData::U8(v) => v.clone(),
    }
}

/// The array a tensor of the file holds; `Err` naming `tensor` when Kiln
/// has no such dtype or the array is above [`crate::Limits`]. A bool byte
/// other than 0 reads as `true`.
pub(super) fn decode(tensor: &str, view: &TensorView<'_>) -> Result<Array> {
    let dtype = kiln_dtype(view.dtype()).ok_or_else(|| Error::Weights {
        tensor: tensor.to_string(),
        detail: format!(
            "its dtype {:?} has no Kiln dtype (Kiln has {})",
            view.dtype(),
            kiln_dtype_names()
        ),
    })?;
    Array::from_data(from_le_bytes(dtype, view.data()), view.shape())
}

/// `f32, f16, ...` for messages.
fn kiln_dtype_names() -> String {
    DType::ALL.map(DType::name).join(", ")
}

/// The elements of `dtype` in little-endian `bytes` (whose length the
/// safetensors header check made a multiple of the element size; a
/// trailing partial element would be dropped, and then `from_data` refuses
/// the count).
fn from_le_bytes(dtype: DType, bytes: &[u8]) -> HostData {
    fn elements<const N: usize, T>(bytes: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
        bytes
            .chunks_exact(N)
            .map(|chunk| {
                let mut word = [0u8; N];
                word.copy_from_slice(chunk);
                f(word)
            })
            .collect()
    }
    match dtype {
        DType::F32 => HostData::F32(elements(bytes, f32::from_le_bytes)),
        DType::F16 => HostData::F16(elements(bytes, f16::from_le_bytes)),
        DType::BF16 => HostData::BF16(elements(bytes, bf16::from_le_bytes)),
        DType::I32 => HostData::I32(elements(bytes, i32::from_le_bytes)),
        DType::U32 => HostData::U32(elements(bytes, u32::from_le_bytes)),
        DType::Bool => HostData::Bool(bytes.iter().map(|&b| b != 0).collect()),
        DType::U8 => HostData::U8(bytes.to_vec()),
    }
}
