//! Device buffers: the word layout of each dtype, host conversion, and a
//! pool that hands freed buffers to later calls so steady-state calls
//! allocate nothing.

use crate::plan::Check;
use half::{bf16, f16};
use kiln::{DType, HostData};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Storage buffers by byte size, free for reuse, and how many were ever
/// created.
#[derive(Default)]
pub(crate) struct Pool {
    free: Mutex<HashMap<(u64, bool), Vec<wgpu::Buffer>>>,
    created: AtomicU64,
}

/// The usages of pooled buffers: storage buffers (readable by copies) and
/// staging buffers for readback.
fn usage(staging: bool) -> wgpu::BufferUsages {
    if staging {
        wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST
    } else {
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST
    }
}

impl Pool {
    /// A buffer of `bytes` (a multiple of 4, at least 4): a freed one when
    /// there is one, else a new one.
    pub(crate) fn take(&self, device: &wgpu::Device, bytes: u64, staging: bool) -> wgpu::Buffer {
        let reused = self
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&(bytes, staging))
            .and_then(Vec::pop);
        reused.unwrap_or_else(|| {
            self.created.fetch_add(1, Ordering::Relaxed);
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(if staging { "kiln readback" } else { "kiln" }),
                size: bytes,
                usage: usage(staging),
                mapped_at_creation: false,
            })
        })
    }

    /// Returns a buffer for reuse.
    pub(crate) fn give(&self, buffer: wgpu::Buffer, staging: bool) {
        self.free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((buffer.size(), staging))
            .or_default()
            .push(buffer);
    }

    /// Buffers created so far.
    pub(crate) fn created(&self) -> u64 {
        self.created.load(Ordering::Relaxed)
    }
}

/// Bytes of a buffer holding `len` elements of `dtype` (at least one word:
/// wgpu binds no empty buffer).
pub(crate) fn byte_size(dtype: DType, len: usize) -> u64 {
    (kiln_kernels::words(dtype, len).max(1) as u64) * 4
}

/// Storage that goes back to its pool when the last handle to it drops.
struct Held {
    buffer: wgpu::Buffer,
    pool: Arc<Pool>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.pool.give(self.buffer.clone(), false);
    }
}

/// One call's status words (see [`kiln_kernels::KernelSpec::status`]),
/// copied out of the plan as the call ran, with what each one reports. The
/// call's outputs carry them and downloading an output reads them with its
/// data, so a call never waits for the device to learn whether its input
/// was bad: the browser, which cannot wait, reports it too.
pub(crate) struct StatusWords {
    held: Held,
    /// Per word, the plan's check: the op, and what its bad input means.
    checks: Arc<[Check]>,
}

impl StatusWords {
    /// Wraps pooled storage of one word per entry of `checks`.
    pub(crate) fn new(buffer: wgpu::Buffer, pool: Arc<Pool>, checks: Arc<[Check]>) -> StatusWords {
        StatusWords {
            held: Held { buffer, pool },
            checks,
        }
    }

    pub(crate) fn raw(&self) -> &wgpu::Buffer {
        &self.held.buffer
    }

    /// Bytes of the words.
    pub(crate) fn bytes(&self) -> u64 {
        4 * self.checks.len() as u64
    }

    /// The first bad input the read-back `words` report: a word starts at
    /// `u32::MAX` and a kernel lowers it to the first offending position.
    pub(crate) fn error(&self, words: &[u32]) -> Option<kiln::Error> {
        self.checks
            .iter()
            .zip(words)
            .find(|(_, &position)| position != u32::MAX)
            .map(|(check, position)| kiln::Error::Runtime {
                op: check.op.clone(),
                detail: format!("{} (at position {position} of the indices)", check.detail),
            })
    }
}

/// A device-resident array. Clones share the storage; when the last one
/// drops, the storage returns to the backend's pool for later calls.
#[derive(Clone)]
pub struct WgpuBuffer {
    held: Arc<Held>,
    pub(crate) dtype: DType,
    pub(crate) len: usize,
    /// The status words of the call that wrote it, if any of its kernels
    /// reports bad input.
    pub(crate) status: Option<Arc<StatusWords>>,
}

impl WgpuBuffer {
    /// Wraps pooled storage holding `len` elements of `dtype`.
    pub(crate) fn new(
        buffer: wgpu::Buffer,
        pool: Arc<Pool>,
        dtype: DType,
        len: usize,
    ) -> WgpuBuffer {
        WgpuBuffer {
            held: Arc::new(Held { buffer, pool }),
            dtype,
            len,
            status: None,
        }
    }

    /// The element dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The element count.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn raw(&self) -> &wgpu::Buffer {
        &self.held.buffer
    }

    /// True when another handle shares the storage (so it must not be
    /// written in place).
    pub(crate) fn is_shared(&self) -> bool {
        Arc::strong_count(&self.held) > 1
    }
}

impl std::fmt::Debug for WgpuBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WgpuBuffer({}[{}])", self.dtype, self.len)
    }
}

/// The words of `data` as the kernels read them.
pub(crate) fn to_words(data: &HostData) -> Vec<u32> {
    fn pairs(bits: impl ExactSizeIterator<Item = u16>) -> Vec<u32> {
        let mut words = Vec::with_capacity(bits.len().div_ceil(2));
        let mut bits = bits.peekable();
        while let Some(low) = bits.next() {
            let high = bits.next().unwrap_or(0);
            words.push(u32::from(low) | (u32::from(high) << 16));
        }
        words
    }
    match data {
        HostData::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
        HostData::I32(v) => v.iter().map(|&x| x as u32).collect(),
        HostData::U32(v) => v.clone(),
        HostData::Bool(v) => v.iter().map(|&x| u32::from(x)).collect(),
        HostData::U8(v) => v.iter().map(|&x| u32::from(x)).collect(),
        HostData::F16(v) => pairs(v.iter().map(|x| x.to_bits())),
        HostData::BF16(v) => pairs(v.iter().map(|x| x.to_bits())),
    }
}

/// `len` elements of `dtype` from the words the kernels wrote.
pub(crate) fn from_words(dtype: DType, len: usize, words: &[u32]) -> HostData {
    let halves = || {
        words
            .iter()
            .flat_map(|&w| [w as u16, (w >> 16) as u16])
            .take(len)
    };
    let words = &words[..len.min(words.len())];
    match dtype {
        DType::F32 => HostData::F32(words.iter().map(|&w| f32::from_bits(w)).collect()),
        DType::I32 => HostData::I32(words.iter().map(|&w| w as i32).collect()),
        DType::U32 => HostData::U32(words.to_vec()),
        DType::Bool => HostData::Bool(words.iter().map(|&w| w != 0).collect()),
        DType::U8 => HostData::U8(words.iter().map(|&w| w as u8).collect()),
        DType::F16 => HostData::F16(halves().map(f16::from_bits).collect()),
        DType::BF16 => HostData::BF16(halves().map(bf16::from_bits).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_survives_the_word_layout() {
        let cases = [
            HostData::F32(vec![1.5, -0.0, f32::NAN, f32::INFINITY]),
            HostData::I32(vec![i32::MIN, -1, 0, 7]),
            HostData::U32(vec![u32::MAX, 0, 3]),
            HostData::Bool(vec![true, false, true]),
            HostData::U8(vec![0, 255, 17]),
            HostData::F16(vec![
                f16::from_f32(1.5),
                f16::NEG_INFINITY,
                f16::from_f32(-2.0),
            ]),
            HostData::BF16(vec![bf16::from_f32(3.25), bf16::from_f32(-7.0)]),
        ];
        for data in cases {
            let words = to_words(&data);
            assert_eq!(words.len(), kiln_kernels::words(data.dtype(), data.len()));
            let back = from_words(data.dtype(), data.len(), &words);
            assert_eq!(format!("{back:?}"), format!("{data:?}"));
        }
    }
}
