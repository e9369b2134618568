//! Slot planning: every computed value gets a slot and a lifetime over the
//! schedule; slots live in one arena, where values never live at a common
//! step share bytes. Placement is greedy by size with best fit, for the
//! traced call's sizes; a shapeless executable called with other sizes
//! places its (fixed) slots again for those sizes.

use crate::hash::FastMap;
use crate::ir::graph::{Graph, ValueId, ValueKind};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;

/// Index of a slot of a [`SlotPlan`](super::SlotPlan).
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

/// Each value's lifetime: outputs live past the last step; a control-flow
/// result is live from its control node's step, which writes it
/// ([`Graph::written_at`]).
pub fn lifetimes(graph: &Graph) -> Vec<Lifetime> {
    let n = graph.nodes.len();
    let mut lifetimes: Vec<Lifetime> = (0..n)
        .map(|i| Lifetime {
            def: graph.written_at(i),
            last: i,
        })
        .collect();
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

/// Assigns every value a home and places the slots in an arena, for the
/// value sizes `bytes` (the traced call's). `in_place[v]` is the operand
/// whose buffer `v` takes. A value and the outputs written in place of it
/// form a chain, live from its first definition to its last read. Chains
/// are placed greedily by size with best fit: largest first, each in the
/// smallest gap between the chains live at a common step (or above them).
/// Chains placed at the same offset with the same size form one slot, a
/// buffer reused over time. Returns the homes, each slot's values in
/// schedule order, and the arena.
pub fn assign_slots(
    graph: &Graph,
    in_place: &[Option<ValueId>],
    lifetimes: &[Lifetime],
    bytes: &[usize],
) -> (Vec<Home>, Vec<Vec<ValueId>>, Arena) {
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
    let roots: Vec<ValueId> = (0..n)
        .filter(|&v| root[v] == v && matches!(graph.nodes[v].kind, ValueKind::Op(_)))
        .collect();
    let life = |r: ValueId| Lifetime {
        def: lifetimes[r].def,
        last: chain_end[r],
    };
    let size_of = |r: ValueId| aligned(bytes[r]);
    let mut by_size: Vec<ValueId> = roots.clone();
    by_size.sort_by_key(|&r| (Reverse(size_of(r)), r));
    let by_breadth = order_by_breadth(&roots, n, &life, &size_of);
    // Two greedy orders (TensorFlow Lite's "by size" and "by breadth");
    // each leaves other gaps, and the smaller arena wins.
    let (size_end, size_offsets) = place_chains(&by_size, n, &life, &size_of);
    let (breadth_end, breadth_offsets) = place_chains(&by_breadth, n, &life, &size_of);
    let offset = if breadth_end < size_end {
        breadth_offsets
    } else {
        size_offsets
    };
    let mut slot_at: FastMap<(usize, usize), SlotId> = FastMap::default();
    let mut slot_of_root: Vec<SlotId> = vec![0; n];
    let mut arena = Arena::default();
    for &r in &roots {
        let size = aligned(bytes[r]);
        let mut new_slot = || {
            arena.offsets.push(offset[r]);
            arena.bytes.push(size);
            arena.size = arena.size.max(offset[r].saturating_add(size));
            arena.offsets.len() - 1
        };
        // Empty chains take no bytes, so placement puts them all at one
        // offset even when live together; each gets a slot of its own.
        slot_of_root[r] = if size == 0 {
            new_slot()
        } else {
            *slot_at.entry((offset[r], size)).or_insert_with(new_slot)
        };
    }
    let mut members: Vec<Vec<ValueId>> = vec![Vec::new(); arena.offsets.len()];
    let homes = (0..n)
        .map(|v| match &graph.nodes[root[v]].kind {
            ValueKind::Input(i) => Home::Input(*i),
            ValueKind::Constant(_) => Home::Constant,
            ValueKind::Op(_) => {
                let slot = slot_of_root[root[v]];
                members[slot].push(v);
                Home::Slot(slot)
            }
        })
        .collect();
    (homes, members, arena)
}

/// The chains in the order of the steps where most bytes are live: the
/// chains live at the busiest step first (largest first), then those of
/// the next busiest step not placed yet, so the chains that make the peak
/// are packed together before anything can fragment the range they need.
fn order_by_breadth(
    roots: &[ValueId],
    n: usize,
    life: &dyn Fn(ValueId) -> Lifetime,
    size_of: &dyn Fn(ValueId) -> usize,
) -> Vec<ValueId> {
    let mut live_at: Vec<Vec<ValueId>> = vec![Vec::new(); n + 1];
    let mut breadth = vec![0usize; n + 1];
    for &r in roots {
        let l = life(r);
        for step in l.def..=l.last.min(n) {
            live_at[step].push(r);
            breadth[step] += size_of(r);
        }
    }
    let mut steps: Vec<usize> = (0..=n).collect();
    steps.sort_by_key(|&step| (Reverse(breadth[step]), step));
    let mut placed = vec![false; n];
    let mut order = Vec::with_capacity(roots.len());
    for step in steps {
        let mut chains: Vec<ValueId> = live_at[step]
            .iter()
            .copied()
            .filter(|&r| !placed[r])
            .collect();
        chains.sort_by_key(|&r| (Reverse(size_of(r)), r));
        for r in chains {
            placed[r] = true;
            order.push(r);
        }
    }
    order
}

/// Places the chains of `order` one after another, each at the best fit
/// among the chains already placed that are live with it: the arena's end
/// and every chain's offset.
fn place_chains(
    order: &[ValueId],
    n: usize,
    life: &dyn Fn(ValueId) -> Lifetime,
    size_of: &dyn Fn(ValueId) -> usize,
) -> (usize, Vec<usize>) {
    let mut offset = vec![0usize; n];
    let mut index = TimeIndex::new(n);
    let mut taken: Vec<(usize, usize)> = Vec::new();
    let mut end = 0usize;
    for &r in order {
        let size = size_of(r);
        taken.clear();
        index.overlapping(life(r), |c| taken.push((offset[c], offset[c] + size_of(c))));
        offset[r] = best_fit(&mut taken, size);
        end = end.max(offset[r].saturating_add(size));
        index.insert(r, life(r));
    }
    (end, offset)
}

/// The offset of the smallest gap of at least `size` bytes between the
/// `taken` ranges, or the end of the highest one.
fn best_fit(taken: &mut [(usize, usize)], size: usize) -> usize {
    taken.sort_unstable();
    let mut best: Option<(usize, usize)> = None;
    let mut cursor = 0;
    for &(start, end) in taken.iter() {
        if start >= cursor + size {
            let gap = start - cursor;
            if best.is_none_or(|(_, g)| gap < g) {
                best = Some((cursor, gap));
            }
        }
        cursor = cursor.max(end);
    }
    best.map_or(cursor, |(offset, _)| offset)
}

/// Chains indexed by the blocks of steps they are live in, so finding the
/// chains live at a common step with a new one looks at nearby chains only.
struct TimeIndex {
    blocks: Vec<Vec<ValueId>>,
    /// Per chain root, the query in which it was last reported (so each is
    /// reported once per query).
    seen: Vec<usize>,
    query: usize,
    lives: Vec<Lifetime>,
}

/// Steps per block of a [`TimeIndex`].
const BLOCK: usize = 32;

impl TimeIndex {
    /// An index for the chains of a graph of `values` values (live up to
    /// step `values`, the end).
    fn new(values: usize) -> TimeIndex {
        TimeIndex {
            blocks: vec![Vec::new(); values / BLOCK + 1],
            seen: vec![0; values],
            query: 0,
            lives: vec![Lifetime { def: 0, last: 0 }; values],
        }
    }

    fn insert(&mut self, chain: ValueId, life: Lifetime) {
        for block in &mut self.blocks[life.def / BLOCK..=life.last / BLOCK] {
            block.push(chain);
        }
        self.lives[chain] = life;
    }

    /// Calls `f` once for every indexed chain live at a step of `life`.
    fn overlapping(&mut self, life: Lifetime, mut f: impl FnMut(ValueId)) {
        self.query += 1;
        for block in &self.blocks[life.def / BLOCK..=life.last / BLOCK] {
            for &chain in block {
                if self.seen[chain] != self.query && self.lives[chain].overlaps(&life) {
                    self.seen[chain] = self.query;
                    f(chain);
                }
            }
        }
    }
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

/// Places slots of `bytes` in one arena, given the steps each is `busy`:
/// slots busy at a common step get disjoint ranges; others may share
/// bytes. Greedy by size with best fit, like the chain placement.
pub fn place_slots(busy: &[Vec<Lifetime>], bytes: &[usize]) -> Arena {
    let mut order: Vec<SlotId> = (0..bytes.len()).collect();
    order.sort_by_key(|&s| (Reverse(bytes[s]), busy[s].first().map_or(0, |l| l.def)));
    let mut offsets = vec![0usize; bytes.len()];
    let mut placed: Vec<SlotId> = Vec::with_capacity(bytes.len());
    let mut size = 0usize;
    let mut taken: Vec<(usize, usize)> = Vec::new();
    for &s in &order {
        taken.clear();
        taken.extend(
            placed
                .iter()
                .filter(|&&p| coexist(&busy[s], &busy[p]))
                .map(|&p| (offsets[p], offsets[p].saturating_add(bytes[p]))),
        );
        let offset = best_fit(&mut taken, bytes[s]);
        offsets[s] = offset;
        size = size.max(offset.saturating_add(bytes[s]));
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
