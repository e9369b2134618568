//! GPU time from timestamp queries: while timing is on
//! ([`crate::WgpuBackend::set_gpu_timing`]), each dispatch of a call runs
//! in a compute pass of its own whose beginning and end write timestamps
//! (WebGPU's `timestamp-query`, wgpu's [`wgpu::Features::TIMESTAMP_QUERY`]:
//! nothing beyond it is needed). The timestamps are resolved and copied to
//! a readback buffer in the call's own encoder; they are read later, when
//! asked ([`crate::WgpuBackend::take_gpu_times`]), so a call never waits.

use crate::shared::lock;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// The GPU time of one call of an executable, from timestamp queries.
#[derive(Clone, Debug, PartialEq)]
pub struct CallGpuTime {
    /// The executable called ([`kiln::Executable::id`], as
    /// [`kiln::KernelList::executable`] names it).
    pub executable: u64,
    /// Which timed call of this backend it was (0, 1, …; see
    /// [`crate::WgpuBackend::gpu_calls_timed`]).
    pub call: u64,
    /// Per step of the call's program (as [`kiln::KernelList::steps`]):
    /// nanoseconds from its dispatch's start to its end; `None` for a copy
    /// or clear, which no timestamp brackets.
    pub steps_ns: Vec<Option<f64>>,
    /// Nanoseconds from the first dispatch's start to the last one's end
    /// (copies between them included).
    pub total_ns: f64,
}

/// Timed calls kept unread at most: the oldest are dropped (a backend
/// timing calls that nobody reads must not grow).
pub const MAX_PENDING_TIMES: usize = 256;

/// A timed call whose timestamps are on their way to `staging`.
pub(crate) struct PendingTime {
    pub executable: u64,
    pub call: u64,
    /// Per program step: the index of its pair of queries.
    pub pairs: Vec<Option<u32>>,
    /// Two u64 timestamps per pair, once the call's commands ran.
    pub staging: wgpu::Buffer,
}

/// A backend's timing state.
#[derive(Default)]
pub(crate) struct Timing {
    pub enabled: AtomicBool,
    pub calls: AtomicU64,
    pub pending: Mutex<VecDeque<PendingTime>>,
}

impl Timing {
    /// Keeps a timed call for reading later.
    pub(crate) fn push(&self, pending: PendingTime) {
        let mut queue = lock(&self.pending);
        if queue.len() >= MAX_PENDING_TIMES {
            queue.pop_front();
        }
        queue.push_back(pending);
    }

    /// The next call's number.
    pub(crate) fn next_call(&self) -> u64 {
        self.calls.fetch_add(1, Ordering::Relaxed)
    }
}

/// Per step, the nanoseconds its pair of timestamps spans (`ticks`:
/// begin and end per pair, at `period` nanoseconds per tick), and the
/// nanoseconds from the first begin to the last end.
pub(crate) fn spans(pairs: &[Option<u32>], ticks: &[u64], period: f64) -> (Vec<Option<f64>>, f64) {
    let pair = |p: u32| -> Option<(u64, u64)> {
        Some((*ticks.get(2 * p as usize)?, *ticks.get(2 * p as usize + 1)?))
    };
    let steps = pairs
        .iter()
        .map(|p| {
            let (begin, end) = pair((*p)?)?;
            Some(end.saturating_sub(begin) as f64 * period)
        })
        .collect();
    let bracketed: Vec<(u64, u64)> = pairs.iter().filter_map(|p| pair((*p)?)).collect();
    let total = match (
        bracketed.iter().map(|s| s.0).min(),
        bracketed.iter().map(|s| s.1).max(),
    ) {
        (Some(first), Some(last)) => last.saturating_sub(first) as f64 * period,
        _ => 0.0,
    };
    (steps, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calls_time_spans_its_dispatches_and_skips_copies() {
        let (steps, total) = spans(&[Some(0), None, Some(1)], &[100, 150, 160, 400], 2.0);
        assert_eq!(steps, vec![Some(100.0), None, Some(480.0)]);
        assert_eq!(total, 600.0);
    }

    #[test]
    fn a_call_without_dispatches_took_no_gpu_time() {
        assert_eq!(spans(&[None, None], &[], 1.0), (vec![None, None], 0.0));
    }
}
