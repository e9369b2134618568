//! Where a program keeps what is not a planned value: the arena starts
//! with the plan's slots (at the offsets the planner chose), then holds
//! constants, parameter blocks, status words and spliced custom-op
//! arenas, each at a [`SLOT_ALIGN`]ed offset so it can be bound directly,
//! then one scratch region that every op's temporaries share (an op's
//! scratch is dead once its last step has run).

use super::loc::{Loc, Place};
use super::types::{ArenaInit, ArenaUse};
use kiln::plan::SLOT_ALIGN;
use std::collections::HashMap;

/// `bytes` rounded up to a bindable offset.
fn aligned(bytes: u64) -> u64 {
    bytes.div_ceil(SLOT_ALIGN as u64) * SLOT_ALIGN as u64
}

/// What [`ArenaBuilder::finish`] gives: each buffer's bytes and initial
/// words, and how the arena divides.
pub(super) struct Finished {
    pub(super) arena: (u64, Vec<ArenaInit>),
    pub(super) params: (u64, Vec<ArenaInit>),
    pub(super) arena_use: ArenaUse,
}

pub(super) struct ArenaBuilder {
    /// The end of everything placed so far but scratch.
    size: u64,
    init: Vec<ArenaInit>,
    /// Offsets of parameter blocks already placed, by their words.
    params: HashMap<Vec<u32>, u64>,
    /// The end of the parameter buffer so far, and its words.
    params_size: u64,
    params_init: Vec<ArenaInit>,
    use_: ArenaUse,
    /// The word every empty value is bound as, once placed.
    empty_word: Option<u64>,
    /// Bytes of scratch the current op has taken.
    scratch_in_use: u64,
    /// Where scratch starts, once sealed.
    scratch_base: Option<u64>,
}

impl ArenaBuilder {
    /// An arena whose first `slots` bytes are the plan's slots.
    pub(super) fn new(slots: u64) -> ArenaBuilder {
        ArenaBuilder {
            size: slots,
            init: Vec::new(),
            params: HashMap::new(),
            params_size: 0,
            params_init: Vec::new(),
            use_: ArenaUse {
                slots,
                ..ArenaUse::default()
            },
            empty_word: None,
            scratch_in_use: 0,
            scratch_base: None,
        }
    }

    /// `bytes` at a new aligned offset after everything placed so far.
    fn reserve(&mut self, bytes: u64) -> u64 {
        let offset = aligned(self.size);
        self.size = offset + bytes.max(4);
        offset
    }

    /// Space for `words`, initialized to them.
    fn initialized(&mut self, words: &[u32]) -> (u64, u64) {
        let bytes = 4 * words.len().max(1) as u64;
        let offset = self.reserve(bytes);
        if !words.is_empty() {
            self.init.push(ArenaInit {
                offset,
                words: words.to_vec(),
            });
        }
        (offset, bytes)
    }

    /// A constant's words, placed once.
    pub(super) fn constant(&mut self, words: &[u32]) -> Loc {
        let (offset, bytes) = self.initialized(words);
        self.use_.constants += aligned(bytes);
        Loc::at(Place::Arena, offset, bytes)
    }

    /// A kernel's parameter block in the parameter buffer; identical
    /// blocks share one range.
    pub(super) fn params(&mut self, words: &[u32]) -> Loc {
        let bytes = 4 * words.len().max(1) as u64;
        if let Some(&offset) = self.params.get(words) {
            return Loc::at(Place::Params, offset, bytes);
        }
        let offset = aligned(self.params_size);
        self.params_size = offset + bytes;
        self.use_.params = aligned(self.params_size);
        if !words.is_empty() {
            self.params_init.push(ArenaInit {
                offset,
                words: words.to_vec(),
            });
        }
        self.params.insert(words.to_vec(), offset);
        Loc::at(Place::Params, offset, bytes)
    }

    /// A status word of its own.
    pub(super) fn status_word(&mut self) -> Loc {
        let offset = self.reserve(4);
        self.use_.checks += aligned(4);
        Loc::at(Place::Arena, offset, 4)
    }

    /// The word empty values are bound as (no kernel reads or writes an
    /// empty value, but every binding needs bytes).
    pub(super) fn empty_word(&mut self) -> Loc {
        let offset = match self.empty_word {
            Some(offset) => offset,
            None => {
                let offset = self.reserve(4);
                self.use_.constants += aligned(4);
                *self.empty_word.insert(offset)
            }
        };
        Loc::at(Place::Arena, offset, 4)
    }

    /// A private copy of an operand of `bytes`, so that no dispatch binds
    /// one range twice.
    pub(super) fn private_copy(&mut self, bytes: u64) -> Loc {
        let offset = self.reserve(bytes);
        self.use_.copies += aligned(bytes);
        Loc::at(Place::Arena, offset, bytes)
    }

    /// Room for a custom op's arena of `arena_bytes` holding `arena_init`
    /// and for its parameters (`params_bytes` holding `params_init`);
    /// returns the two offsets.
    pub(super) fn embed(
        &mut self,
        (arena_bytes, arena_init): (u64, &[ArenaInit]),
        (params_bytes, params_init): (u64, &[ArenaInit]),
    ) -> (u64, u64) {
        let offset = self.reserve(arena_bytes);
        self.use_.custom += aligned(arena_bytes);
        let relocated = |base: u64, init: &[ArenaInit]| -> Vec<ArenaInit> {
            init.iter()
                .map(|part| ArenaInit {
                    offset: base + part.offset,
                    words: part.words.clone(),
                })
                .collect()
        };
        self.init.extend(relocated(offset, arena_init));
        let params_offset = aligned(self.params_size);
        self.params_size = params_offset + params_bytes;
        self.use_.params = aligned(self.params_size);
        self.params_init
            .extend(relocated(params_offset, params_init));
        (offset, params_offset)
    }

    /// Starts the temporaries of a new op: scratch taken before is dead.
    pub(super) fn new_op(&mut self) {
        self.scratch_in_use = 0;
    }

    /// A temporary of `bytes` for the current op.
    pub(super) fn scratch(&mut self, bytes: u64) -> Loc {
        let offset = aligned(self.scratch_in_use);
        self.scratch_in_use = offset + bytes.max(4);
        self.use_.scratch = self.use_.scratch.max(aligned(self.scratch_in_use));
        Loc::at(Place::Scratch, offset, bytes)
    }

    /// Places scratch after everything else; returns where it starts.
    pub(super) fn seal_scratch(&mut self) -> u64 {
        *self.scratch_base.get_or_insert_with(|| aligned(self.size))
    }

    /// The arena's bytes and initial data, the parameter buffer's, and
    /// how the arena divides.
    pub(super) fn finish(self) -> Finished {
        let end = match self.scratch_base {
            Some(base) if self.use_.scratch > 0 => base + self.use_.scratch,
            _ => self.size,
        };
        Finished {
            arena: (end.max(4).div_ceil(4) * 4, self.init),
            params: (self.params_size.max(4), self.params_init),
            arena_use: self.use_,
        }
    }
}
