//! Slot planning: every computed value gets a slot (a buffer) and a
//! lifetime over the schedule; values whose lifetimes do not overlap share
//! slots, packed greedily by size with best fit.

use crate::graph::{Graph, ValueId, ValueKind};
use serde::{Deserialize, Serialize};

/// Index of a slot of a [`Plan`](super::Plan).
pub type SlotId = usize;

/// Slot sizes are rounded up to this many bytes (a 16-byte vector is the
/// widest element any backend loads at once).
pub const SLOT_ALIGN: usize = 16;

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

/// Values that share one buffer: a value and the outputs written in place
/// of it, transitively.
struct Chain {
    lifetime: Lifetime,
    /// Bytes at the representative shapes (orders the packing).
    bytes: usize,
}

/// Assigns every value a home. `in_place[v]` is the operand whose buffer
/// `v` takes; `bytes[v]` is each value's size at representative shapes.
/// Returns the homes and, per slot, its values in schedule order.
pub fn assign_slots(
    graph: &Graph,
    in_place: &[Option<ValueId>],
    lifetimes: &[Lifetime],
    bytes: &[usize],
) -> (Vec<Home>, Vec<Vec<ValueId>>) {
    let n = graph.nodes.len();
    // Each value's chain root: an in-place output continues its operand's.
    let mut root: Vec<ValueId> = (0..n).collect();
    for v in 0..n {
        if let Some(u) = in_place[v] {
            root[v] = root[u];
        }
    }
    let mut chain_of: Vec<Option<usize>> = vec![None; n];
    let mut chains: Vec<Chain> = Vec::new();
    for v in 0..n {
        let r = root[v];
        if !matches!(graph.nodes[r].kind, ValueKind::Op(_)) {
            continue;
        }
        let c = *chain_of[r].get_or_insert_with(|| {
            chains.push(Chain {
                lifetime: lifetimes[r],
                bytes: 0,
            });
            chains.len() - 1
        });
        chain_of[v] = Some(c);
        let chain = &mut chains[c];
        chain.lifetime.last = chain.lifetime.last.max(lifetimes[v].last);
        chain.bytes = chain.bytes.max(aligned(bytes[v]));
    }
    // Greedy by size: the largest chains choose first, each taking the
    // slot that fits it with the least waste (or grows the least).
    let mut order: Vec<usize> = (0..chains.len()).collect();
    order.sort_by_key(|&c| (std::cmp::Reverse(chains[c].bytes), chains[c].lifetime.def));
    let mut slot_size: Vec<usize> = Vec::new();
    // Per slot, the lifetimes it holds, sorted by start and disjoint.
    let mut slot_busy: Vec<Vec<Lifetime>> = Vec::new();
    let mut slot_of_chain = vec![0; chains.len()];
    for &c in &order {
        let chain = &chains[c];
        let mut best: Option<(SlotId, (bool, usize))> = None;
        for (s, busy) in slot_busy.iter().enumerate() {
            let at = busy.partition_point(|l| l.def < chain.lifetime.def);
            let clear_before = at == 0 || busy[at - 1].last < chain.lifetime.def;
            let clear_after = at == busy.len() || chain.lifetime.last < busy[at].def;
            if !(clear_before && clear_after) {
                continue;
            }
            let size = slot_size[s];
            let cost = if size >= chain.bytes {
                (false, size - chain.bytes)
            } else {
                (true, chain.bytes - size)
            };
            if best.is_none_or(|(_, b)| cost < b) {
                best = Some((s, cost));
            }
        }
        let s = match best {
            Some((s, _)) => s,
            None => {
                slot_size.push(0);
                slot_busy.push(Vec::new());
                slot_size.len() - 1
            }
        };
        let at = slot_busy[s].partition_point(|l| l.def < chain.lifetime.def);
        slot_busy[s].insert(at, chain.lifetime);
        slot_size[s] = slot_size[s].max(chain.bytes);
        slot_of_chain[c] = s;
    }
    let mut homes = Vec::with_capacity(n);
    let mut members: Vec<Vec<ValueId>> = vec![Vec::new(); slot_size.len()];
    for v in 0..n {
        let home = match (chain_of[v], &graph.nodes[root[v]].kind) {
            (Some(c), _) => {
                let s = slot_of_chain[c];
                members[s].push(v);
                Home::Slot(s)
            }
            (None, ValueKind::Input(i)) => Home::Input(*i),
            (None, _) => Home::Constant,
        };
        homes.push(home);
    }
    (homes, members)
}
