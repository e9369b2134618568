//! Slot planning: every computed value gets a slot and a lifetime over the
//! schedule. Values whose lifetimes do not overlap share slots of provably
//! equal size (valid for every call of a shapeless executable); per set of
//! concrete sizes, slots are then placed in one arena, greedily by size with
//! best fit, where slots never busy at a common step share bytes.

use crate::graph::{Graph, ValueId, ValueKind};
use crate::hash::FastMap;
use crate::shape::SymExpr;
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Index of a slot of a [`Plan`](super::Plan).
pub type SlotId = usize;

/// Slot sizes and arena offsets are multiples of this many bytes: the
/// storage-buffer offset alignment WebGPU guarantees, so a GPU backend can
/// bind any slot of an arena buffer directly.
pub const SLOT_ALIGN: usize = 256;

/// `bytes` rounded up to [`SLOT_ALIGN`].
pub fn aligned(bytes: usize) -> usize {
    bytes.div_ceil(SLOT_ALIGN) * SLOT_ALIGN
}

/// Where a value's elements live during a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Home {
    /// The caller's buffer of argument leaf `i` (an input, or an output
    /// written in place of a donated input).
    Input(usize),
    /// The constant's own shared data.
    Constant,
    /// A planned slot.
    Slot(SlotId),
}

/// The steps during which a value's buffer must hold it: from the step
/// defining it to the last step reading it. `last == schedule length` marks
/// a value returned to the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Lifetime {
    /// The defining step.
    pub def: usize,
    /// The last reading step.
    pub last: usize,
}

impl Lifetime {
    /// True when the two share a step.
    pub fn overlaps(&self, other: &Lifetime) -> bool {
        self.def <= other.last && other.def <= self.last
    }
}

/// Each value's lifetime: outputs live past the last step.
pub fn lifetimes(graph: &Graph) -> Vec<Lifetime> {
    let n = graph.nodes.len();
    let mut lifetimes: Vec<Lifetime> = (0..n).map(|i| Lifetime { def: i, last: i }).collect();
    for (i, node) in graph.nodes.iter().enumerate() {
        for &j in &node.inputs {
            lifetimes[j].last = i;
        }
    }
    for &o in &graph.outputs {
        lifetimes[o].last = n;
    }
    lifetimes
}

/// Assigns every value a home. `in_place[v]` is the operand whose buffer
/// `v` takes; `size_keys[v]` is each value's byte size as an expression of
/// the symbols. A value and the outputs written in place of it form a
/// chain; chains whose lifetimes do not overlap and whose sizes are
/// provably equal share a slot (a linear scan in schedule order, reusing
/// the slot freed earliest), so a slot never wastes bytes for any call.
/// Returns the homes and, per slot, its values in schedule order.
pub fn assign_slots(
    graph: &Graph,
    in_place: &[Option<ValueId>],
    lifetimes: &[Lifetime],
    size_keys: &[SymExpr],
) -> (Vec<Home>, Vec<Vec<ValueId>>) {
    let n = graph.nodes.len();
    // Each value's chain root: an in-place output continues its operand's.
    let mut root: Vec<ValueId> = (0..n).collect();
    for v in 0..n {
        if let Some(u) = in_place[v] {
            root[v] = root[u];
        }
    }
    let mut chain_end: Vec<usize> = lifetimes.iter().map(|l| l.last).collect();
    for v in 0..n {
        let r = root[v];
        chain_end[r] = chain_end[r].max(lifetimes[v].last);
    }
    // Roots come in schedule order, so chains are scanned by start.
    let mut free: FastMap<&SymExpr, BinaryHeap<Reverse<(usize, SlotId)>>> = FastMap::default();
    let mut slot_of_root: Vec<Option<SlotId>> = vec![None; n];
    let mut members: Vec<Vec<ValueId>> = Vec::new();
    let mut homes = Vec::with_capacity(n);
    for v in 0..n {
        let r = root[v];
        let home = match &graph.nodes[r].kind {
            ValueKind::Input(i) => Home::Input(*i),
            ValueKind::Constant(_) => Home::Constant,
            ValueKind::Op(_) => {
                let slot = match slot_of_root[r] {
                    Some(slot) => slot,
                    None => {
                        let heap = free.entry(&size_keys[r]).or_default();
                        let slot = match heap.peek() {
                            Some(&Reverse((free_after, slot))) if free_after < v => {
                                heap.pop();
                                slot
                            }
                            _ => {
                                members.push(Vec::new());
                                members.len() - 1
                            }
                        };
                        heap.push(Reverse((chain_end[r], slot)));
                        slot_of_root[r] = Some(slot);
                        slot
                    }
                };
                members[slot].push(v);
                Home::Slot(slot)
            }
        };
        homes.push(home);
    }
    (homes, members)
}

/// Where each slot lies in one arena buffer, for one set of sizes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Arena {
    /// Each slot's byte offset (a multiple of [`SLOT_ALIGN`]).
    pub offsets: Vec<usize>,
    /// Each slot's size in bytes (a multiple of [`SLOT_ALIGN`]).
    pub bytes: Vec<usize>,
    /// The arena's size: the end of the highest slot.
    pub size: usize,
}

/// Places slots of `bytes` in one arena: slots busy at a common step get
/// disjoint ranges; others may share bytes. Greedy by size with best fit:
/// the largest slots are placed first, each in the smallest gap between the
/// ranges of the slots it coexists with (or above them all).
pub fn place_slots(busy: &[Vec<Lifetime>], bytes: &[usize]) -> Arena {
    let mut order: Vec<SlotId> = (0..bytes.len()).collect();
    order.sort_by_key(|&s| (Reverse(bytes[s]), busy[s].first().map_or(0, |l| l.def)));
    let mut offsets = vec![0; bytes.len()];
    let mut placed: Vec<SlotId> = Vec::with_capacity(bytes.len());
    let mut size = 0;
    let mut taken: Vec<(usize, usize)> = Vec::new();
    for &s in &order {
        taken.clear();
        taken.extend(
            placed
                .iter()
                .filter(|&&p| coexist(&busy[s], &busy[p]))
                .map(|&p| (offsets[p], offsets[p] + bytes[p])),
        );
        taken.sort_unstable();
        let mut best: Option<(usize, usize)> = None;
        let mut cursor = 0;
        for &(start, end) in &taken {
            if start >= cursor + bytes[s] {
                let gap = start - cursor;
                if best.is_none_or(|(_, g)| gap < g) {
                    best = Some((cursor, gap));
                }
            }
            cursor = cursor.max(end);
        }
        let offset = best.map_or(cursor, |(offset, _)| offset);
        offsets[s] = offset;
        size = size.max(offset + bytes[s]);
        placed.push(s);
    }
    Arena {
        offsets,
        bytes: bytes.to_vec(),
        size,
    }
}

/// True when two sorted lists of disjoint lifetimes share a step.
fn coexist(a: &[Lifetime], b: &[Lifetime]) -> bool {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if a[i].overlaps(&b[j]) {
            return true;
        }
        if a[i].last < b[j].last {
            i += 1;
        } else {
            j += 1;
        }
    }
    false
}
