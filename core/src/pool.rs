//! The buffer pool policy every executor shares: freed buffers kept by
//! size for later calls, within a count and a byte budget, the one freed
//! longest ago released first, so a steady-state call allocates nothing
//! and a shapeless function fed ever-new sizes does not keep a buffer of
//! every size it has seen.
//!
//! The GPU executors keep one pool each of device buffers. On the host, one
//! process-wide pool ([`host_pool_stats`]) keeps the f32 buffers of dropped
//! arrays and of the CPU executor's dead slots for the CPU outputs of their
//! size that ask for one (products, dequantize, fused groups, and the
//! layout ops' copies: permutes, slices, reshapes and broadcasts of more
//! than one value): when a
//! caller drops a step's outputs, the allocator would otherwise hand their
//! pages back to the system, and the next call's outputs would fault every
//! page in again (a quarter of a 4-layer training step's time on a virtual
//! machine whose page faults cost 1.3 µs each).

use crate::data::HostData;
use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};

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

/// A pool's idle buffers, generic over the device's buffer type (and so
/// testable without a device), keyed by bytes and a kind (a backend keeps
/// host-readable staging buffers apart from storage). Each one carries the
/// tick of its return, and `by_age` lists them oldest first, so eviction finds the oldest without a scan while
/// `take` still finds a size in one lookup.
pub struct IdleBuffers<B> {
    /// Per (bytes, kind): buffers with their return tick, oldest first.
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

impl<B> Default for IdleBuffers<B> {
    fn default() -> Self {
        IdleBuffers {
            by_size: HashMap::new(),
            by_age: BTreeMap::new(),
            bytes: 0,
            clock: 0,
        }
    }
}

impl<B> IdleBuffers<B> {
    /// The most recently returned buffer of `key`, if any. Newest first:
    /// it is the one most likely still warm in caches and bind groups.
    pub fn take(&mut self, key: (u64, bool)) -> Option<B> {
        let (tick, buffer) = self.by_size.get_mut(&key)?.pop_back()?;
        self.by_age.remove(&tick);
        self.bytes -= key.0;
        Some(buffer)
    }

    /// Keeps `buffer` under `key` (its bytes, and whether it is a staging
    /// buffer), then evicts the oldest idle buffers until both limits hold;
    /// returns them for the caller to drop outside the lock.
    pub fn give(&mut self, key: (u64, bool), buffer: B) -> Vec<B> {
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

impl<B> IdleBuffers<B> {
    /// What is held idle now.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            idle_buffers: self.by_age.len(),
            idle_bytes: self.bytes,
        }
    }
}

/// Host buffers smaller than this are not kept: they would take the pool's
/// [`MAX_IDLE_BUFFERS`] places from the large buffers, whose pages are the
/// ones worth keeping, while the allocator reuses small freed blocks from
/// its own free lists.
pub const HOST_MIN_BYTES: usize = 64 << 10;

/// The host pool: idle f32 buffers by bytes, and for each size how many
/// outputs asked for a buffer that no dead buffer has answered yet. A dead
/// buffer is kept only against such a request: arrays made by code
/// that never asks (an eager loop of ops that allocate for themselves) are
/// freed as before instead of filling the pool up to its limits.
#[derive(Default)]
struct HostPool {
    idle: IdleBuffers<Vec<f32>>,
    /// Bytes → requests not yet answered by a kept buffer, at most
    /// [`MAX_IDLE_BUFFERS`] per size and [`MAX_IDLE_BUFFERS`] sizes.
    wanted: HashMap<u64, usize>,
}

impl HostPool {
    /// The most recently kept buffer of `bytes`, if any; either way the
    /// size is now wanted once more.
    fn take(&mut self, bytes: u64) -> Option<Vec<f32>> {
        if self.wanted.len() >= MAX_IDLE_BUFFERS && !self.wanted.contains_key(&bytes) {
            // Sizes asked for and never dropped since (outputs their
            // callers keep, a shapeless function's old sizes) are
            // forgotten together.
            self.wanted.clear();
        }
        let wanted = self.wanted.entry(bytes).or_default();
        *wanted = (*wanted + 1).min(MAX_IDLE_BUFFERS);
        self.idle.take((bytes, false))
    }

    /// Keeps `buffer` when its size is wanted; returns what is not kept:
    /// `buffer` itself, or the buffers released to keep the limits.
    fn give(&mut self, buffer: Vec<f32>) -> Vec<Vec<f32>> {
        let bytes = (buffer.capacity() * std::mem::size_of::<f32>()) as u64;
        let Some(wanted) = self.wanted.get_mut(&bytes) else {
            return vec![buffer];
        };
        *wanted -= 1;
        if *wanted == 0 {
            self.wanted.remove(&bytes);
        }
        self.idle.give((bytes, false), buffer)
    }
}

/// The process's host pool.
static HOST_POOL: LazyLock<Mutex<HostPool>> = LazyLock::new(Mutex::default);

/// The host pool, locked. [`give_back`] runs in an array's drop, which must
/// not panic, so a poisoned lock is used as it is: the pool's operations
/// finish their bookkeeping before anything in them could panic.
fn host_pool() -> MutexGuard<'static, HostPool> {
    HOST_POOL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An empty buffer with room for exactly `len` f32 elements: the most
/// recently dropped one of that capacity, or a new one. Its pages are
/// already the process's when it comes from the pool. Asking marks the
/// size as wanted, so the next array of that size dropped is kept.
pub(crate) fn take_f32(len: usize) -> Vec<f32> {
    let bytes = len.saturating_mul(std::mem::size_of::<f32>());
    let kept = if bytes >= HOST_MIN_BYTES {
        host_pool().take(bytes as u64)
    } else {
        None
    };
    let mut buffer = kept.unwrap_or_else(|| Vec::with_capacity(len));
    buffer.clear();
    buffer
}

/// An empty buffer with room for `len` elements of `T`: [`take_f32`]'s
/// for f32, a new one for every other element type (the pool holds f32
/// buffers only).
pub(crate) fn take<T: 'static>(len: usize) -> Vec<T> {
    let mut pooled = (TypeId::of::<T>() == TypeId::of::<f32>()).then(|| take_f32(len));
    (&mut pooled as &mut dyn Any)
        .downcast_mut::<Option<Vec<T>>>()
        .and_then(Option::take)
        .unwrap_or_else(|| Vec::with_capacity(len))
}

/// A copy of `data`, into a [`take_f32`] buffer when it is f32.
pub(crate) fn copy(data: &HostData) -> HostData {
    match data {
        HostData::F32(values) => {
            let mut buffer = take_f32(values.len());
            buffer.extend_from_slice(values);
            HostData::F32(buffer)
        }
        other => other.clone(),
    }
}

/// [`take_f32`]'s buffer holding `len` zeros: for the outputs that start
/// from zeros.
pub(crate) fn zeroed_f32(len: usize) -> Vec<f32> {
    let mut buffer = take_f32(len);
    buffer.resize(len, 0.0);
    buffer
}

/// Keeps the buffer of `data`, a value no one holds any more, for
/// [`take_f32`] when it is an f32 buffer of at least [`HOST_MIN_BYTES`]
/// whose size an output asked for; drops it otherwise, and drops whatever
/// the pool releases to stay within its limits.
pub(crate) fn give_back(data: HostData) {
    let HostData::F32(buffer) = data else {
        return;
    };
    if buffer.capacity() * std::mem::size_of::<f32>() >= HOST_MIN_BYTES {
        let released = host_pool().give(buffer);
        // Freed here, once the lock is let go.
        drop(released);
    }
}

/// What the host pool holds for later outputs now: at most
/// [`MAX_IDLE_BUFFERS`] buffers and [`MAX_IDLE_BYTES`] bytes.
///
/// ```
/// let held = kiln::pool::host_pool_stats();
/// assert!(held.idle_bytes <= kiln::pool::MAX_IDLE_BYTES);
/// ```
pub fn host_pool_stats() -> PoolStats {
    host_pool().idle.stats()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{compile, Array};

    /// The start of `array`'s f32 buffer, computing it first.
    fn buffer_address(array: &Array) -> usize {
        match &*array.data().expect("the product runs") {
            HostData::F32(values) => values.as_ptr() as usize,
            other => panic!("an f32 product gave {:?}", other.dtype()),
        }
    }

    /// Operands of a product whose 67×263 output (70,484 bytes) no other
    /// test makes, so that no other test takes its buffer from the pool.
    fn unusual_operands() -> (Array, Array) {
        let a: Vec<f32> = (0..67 * 251).map(|i| (i % 13) as f32 - 6.0).collect();
        let b: Vec<f32> = (0..251 * 263).map(|i| (i % 7) as f32 * 0.5).collect();
        (
            Array::from_vec(a, &[67, 251]).expect("a"),
            Array::from_vec(b, &[251, 263]).expect("b"),
        )
    }

    /// Calls `call` twice, dropping the first result: the second lands in
    /// the first one's buffer, and both hold the same values.
    fn second_call_reuses_the_first_calls_buffer(call: impl Fn() -> Array) -> Vec<f32> {
        let first = call();
        let expected = first.to_vec::<f32>().expect("first value");
        let address = buffer_address(&first);
        let len = expected.len();
        drop(first);
        // Allocations of the same size would take a buffer the allocator
        // had been given back: the output can only land where the first
        // one was if the pool kept it.
        let bystanders: Vec<Vec<f32>> = (0..4).map(|_| Vec::with_capacity(len)).collect();
        let second = call();
        assert_eq!(buffer_address(&second), address);
        assert!(bystanders.iter().all(|b| b.as_ptr() as usize != address));
        assert_eq!(second.to_vec::<f32>().expect("second value"), expected);
        expected
    }

    #[test]
    fn a_compiled_calls_dropped_output_is_the_next_calls_output_buffer() {
        let product = compile(|(a, b): (Array, Array)| a.matmul(&b));
        let operands = unusual_operands();
        second_call_reuses_the_first_calls_buffer(|| product.call(&operands).expect("a call"));
    }

    #[test]
    fn a_compiled_calls_dropped_transpose_is_the_next_calls_transpose_buffer() {
        // 257×71 (72,988 bytes): a size no other test makes.
        let transpose = compile(|a: Array| a.transpose());
        let values: Vec<f32> = (0..71 * 257).map(|i| i as f32).collect();
        let a = Array::from_vec(values, &[71, 257]).expect("a");
        let transposed =
            second_call_reuses_the_first_calls_buffer(|| transpose.call(&a).expect("a call"));
        assert_eq!(&transposed[..3], &[0.0, 257.0, 514.0]);
    }

    #[test]
    fn a_value_still_held_elsewhere_is_not_reused_when_its_array_drops() {
        let (a, b) = unusual_operands();
        let first = a.matmul(&b);
        let held = first.data().expect("the product runs");
        let before = held.to_vec::<f32>();
        drop(first);
        let doubled = (&a * 2.0).matmul(&b);
        let twice = doubled.to_vec::<f32>().expect("the second product runs");
        assert_eq!(held.to_vec::<f32>(), before);
        assert!(twice.iter().zip(&before).all(|(t, v)| *t == 2.0 * v));
    }

    #[test]
    fn a_dropped_buffer_is_kept_only_against_an_output_that_asked_for_its_size() {
        let mut pool = HostPool::default();
        let buffer = Vec::<f32>::with_capacity(1 << 16);
        let address = buffer.as_ptr();
        let not_kept = pool.give(buffer);
        assert_eq!(not_kept.len(), 1);
        assert_eq!(pool.idle.stats().idle_buffers, 0);
        assert!(pool.take(1 << 18).is_none());
        assert!(pool.give(not_kept.into_iter().next().unwrap()).is_empty());
        assert_eq!(pool.idle.stats().idle_bytes, 1 << 18);
        assert_eq!(pool.take(1 << 18).map(|b| b.as_ptr()), Some(address));
    }

    #[test]
    fn buffers_dropped_beyond_the_requests_for_their_size_are_freed() {
        let mut pool = HostPool::default();
        assert!(pool.take(1 << 18).is_none());
        assert!(pool.take(1 << 18).is_none());
        let mut freed = 0;
        for _ in 0..3 {
            freed += pool.give(Vec::with_capacity(1 << 16)).len();
        }
        assert_eq!(freed, 1);
        assert_eq!(pool.idle.stats().idle_buffers, 2);
        assert_eq!(pool.give(Vec::with_capacity(1 << 17)).len(), 1);
    }

    #[test]
    fn idle_buffers_beyond_the_count_limit_release_the_one_returned_longest_ago() {
        let mut idle = IdleBuffers::default();
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
        let mut idle = IdleBuffers::default();
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
        let mut idle = IdleBuffers::default();
        for id in 0..3 {
            assert!(idle.give((16, false), id).is_empty());
        }
        assert_eq!(idle.take((16, true)), None);
        assert_eq!(idle.take((16, false)), Some(2));
        assert_eq!(idle.take((16, false)), Some(1));
        assert_eq!(idle.bytes, 16);
    }
}
