//! Device buffers: the word layout of each dtype, host conversion, and a
//! pool that hands freed buffers to later calls so steady-state calls
//! allocate nothing.

use kiln::pool::{IdleBuffers, PoolStats};
use kiln::DType;
use kiln_kernels::program::Check;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Storage buffers by byte size, free for reuse, and how many were ever
/// created. Idle buffers are kept up to [`MAX_IDLE_BUFFERS`](crate::MAX_IDLE_BUFFERS) and
/// [`MAX_IDLE_BYTES`](crate::MAX_IDLE_BYTES); beyond either, the one freed longest ago is
/// released, so a shapeless function fed ever-new sizes does not keep a
/// buffer of every size it has seen.
#[derive(Default)]
pub(crate) struct Pool {
    idle: Mutex<IdleBuffers<wgpu::Buffer>>,
    created: AtomicU64,
    evicted: AtomicU64,
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
        let reused = self.idle().take((bytes, staging));
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

    /// Returns a buffer for reuse (which may release older idle ones).
    pub(crate) fn give(&self, buffer: wgpu::Buffer, staging: bool) {
        let evicted = self.idle().give((buffer.size(), staging), buffer);
        if !evicted.is_empty() {
            self.evicted
                .fetch_add(evicted.len() as u64, Ordering::Relaxed);
        }
        // Destroying buffers is device work: not under the pool's lock.
        drop(evicted);
    }

    /// Buffers released so far to keep within the limits: a bind group
    /// made before a release may name a released buffer (and keep it).
    pub(crate) fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Buffers created so far.
    pub(crate) fn created(&self) -> u64 {
        self.created.load(Ordering::Relaxed)
    }

    /// What the pool holds idle now.
    pub(crate) fn stats(&self) -> PoolStats {
        self.idle().stats()
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, IdleBuffers<wgpu::Buffer>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
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
/// copied out of the program's arena as the call ran, with what each one reports. The
/// call's outputs carry them and downloading an output reads them with its
/// data, so a call never waits for the device to learn whether its input
/// was bad: the browser, which cannot wait, reports it too.
pub(crate) struct StatusWords {
    held: Held,
    /// Per word, the program's check: the op, and what its bad input means.
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

    /// The first bad input the read-back `words` report.
    pub(crate) fn error(&self, words: &[u32]) -> Option<kiln::Error> {
        Check::first_error(&self.checks, words)
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
