//! The buffer pool policy every GPU executor shares: freed buffers kept by
//! size for later calls, within a count and a byte budget, the one freed
//! longest ago released first, so a steady-state call allocates nothing
//! and a shapeless function fed ever-new sizes does not keep a buffer of
//! every size it has seen.

use std::collections::{BTreeMap, HashMap, VecDeque};

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

#[cfg(test)]
mod tests {
    use super::*;

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
