//! Device buffers: the word layout of each dtype, host conversion, and a
//! pool that hands freed buffers to later calls so steady-state calls
//! allocate nothing.

use kiln::DType;
use kiln_kernels::program::Check;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Storage buffers by byte size, free for reuse, and how many were ever
/// created. Idle buffers are kept up to [`MAX_IDLE_BUFFERS`] and
/// [`MAX_IDLE_BYTES`]; beyond either, the one freed longest ago is
/// released, so a shapeless function fed ever-new sizes does not keep a
/// buffer of every size it has seen.
#[derive(Default)]
pub(crate) struct Pool {
    idle: Mutex<Idle<wgpu::Buffer>>,
    created: AtomicU64,
    evicted: AtomicU64,
}

/// Idle buffers a pool keeps at most (of any size). Between calls the
/// pool holds a call's arguments, outputs and readback buffers; 256 covers
/// that for programs of many leaves, and for a shapeless function cycling
/// through a couple of hundred sizes.
pub const MAX_IDLE_BUFFERS: usize = 256;

/// Bytes of idle buffers a pool keeps at most. A program whose calls
/// return more than this between calls has the excess recreated by the
/// next call instead of kept for ever; on a CPU adapter (lavapipe) idle
/// buffers are process memory, so the limit is also an RSS bound.
pub const MAX_IDLE_BYTES: u64 = 256 << 20;

/// A pool's idle buffers (generic so the policy is testable without a
/// device). Each one carries the tick of its return, and `by_age` lists
/// them oldest first, so eviction finds the oldest without a scan while
/// `take` still finds a size in one lookup.
struct Idle<B> {
    /// Per (bytes, staging): buffers with their return tick, oldest first.
    by_size: HashMap<(u64, bool), VecDeque<(u64, B)>>,
    /// Return tick → the key of the buffer returned then.
    by_age: BTreeMap<u64, (u64, bool)>,
    bytes: u64,
    clock: u64,
}

/// What a pool holds for reuse right now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Idle buffers (at most [`MAX_IDLE_BUFFERS`]).
    pub idle_buffers: usize,
    /// Their bytes (at most [`MAX_IDLE_BYTES`]).
    pub idle_bytes: u64,
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

impl<B> Default for Idle<B> {
    fn default() -> Self {
        Idle {
            by_size: HashMap::new(),
            by_age: BTreeMap::new(),
            bytes: 0,
            clock: 0,
        }
    }
}

impl<B> Idle<B> {
    /// The most recently returned buffer of `key`, if any. Newest first:
    /// it is the one most likely still warm in caches and bind groups.
    fn take(&mut self, key: (u64, bool)) -> Option<B> {
        let (tick, buffer) = self.by_size.get_mut(&key)?.pop_back()?;
        self.by_age.remove(&tick);
        self.bytes -= key.0;
        Some(buffer)
    }

    /// Keeps `buffer` under `key` (its bytes, and whether it is a staging
    /// buffer), then evicts the oldest idle buffers until both limits hold;
    /// returns them for the caller to drop outside the lock.
    fn give(&mut self, key: (u64, bool), buffer: B) -> Vec<B> {
        self.clock += 1;
        self.by_age.insert(self.clock, key);
        self.bytes += key.0;
        self.by_size
            .entry(key)
            .or_default()
            .push_back((self.clock, buffer));
        let mut evicted = Vec::new();
        while self.by_age.len() > MAX_IDLE_BUFFERS || self.bytes > MAX_IDLE_BYTES {
            let Some((_, oldest)) = self.by_age.pop_first() else {
                break;
            };
            if let Some(same_size) = self.by_size.get_mut(&oldest) {
                // The oldest of all is the oldest of its size: at the front.
                evicted.extend(same_size.pop_front().map(|(_, buffer)| buffer));
                if same_size.is_empty() {
                    self.by_size.remove(&oldest);
                }
            }
            self.bytes -= oldest.0;
        }
        evicted
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
        let idle = self.idle();
        PoolStats {
            idle_buffers: idle.by_age.len(),
            idle_bytes: idle.bytes,
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Idle<wgpu::Buffer>> {
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
        self.checks
            .iter()
            .zip(words)
            .find_map(|(check, &word)| Some((check, kiln_kernels::bad_input_position(word)?)))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_buffers_beyond_the_count_limit_release_the_one_returned_longest_ago() {
        let mut idle = Idle::default();
        for id in 0..MAX_IDLE_BUFFERS {
            assert!(idle.give((4 + 4 * id as u64, false), id).is_empty());
        }
        assert_eq!(idle.give((4, false), MAX_IDLE_BUFFERS), vec![0]);
        assert_eq!(idle.by_age.len(), MAX_IDLE_BUFFERS);
        assert_eq!(idle.take((4, false)), Some(MAX_IDLE_BUFFERS));
        assert_eq!(idle.take((4, false)), None);
        assert_eq!(idle.take((8, false)), Some(1));
    }

    #[test]
    fn idle_buffers_beyond_the_byte_limit_release_the_oldest_until_it_holds() {
        let mut idle = Idle::default();
        let quarter = MAX_IDLE_BYTES / 4;
        for id in 0..4 {
            assert!(idle.give((quarter, id % 2 == 0), id).is_empty());
        }
        assert_eq!(idle.bytes, MAX_IDLE_BYTES);
        assert_eq!(idle.give((2 * quarter, false), 4), vec![0, 1]);
        assert_eq!(idle.bytes, MAX_IDLE_BYTES);
        assert_eq!(idle.take((quarter, true)), Some(2));
        assert_eq!(idle.take((quarter, false)), Some(3));
        assert_eq!(idle.bytes, 2 * quarter);
    }

    #[test]
    fn idle_buffers_of_one_size_are_taken_newest_first() {
        let mut idle = Idle::default();
        for id in 0..3 {
            assert!(idle.give((16, false), id).is_empty());
        }
        assert_eq!(idle.take((16, true)), None);
        assert_eq!(idle.take((16, false)), Some(2));
        assert_eq!(idle.take((16, false)), Some(1));
        assert_eq!(idle.bytes, 16);
    }
}
