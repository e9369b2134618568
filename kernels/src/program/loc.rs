//! Ranges and steps while lowering, before scratch is placed.

use std::sync::Arc;

/// Where a value or scratch range lives while lowering: scratch offsets
/// are placed after everything else once the program is complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Place {
    Arena,
    Params,
    Scratch,
    Input(usize),
    Output(usize),
}

/// A byte range while lowering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Loc {
    pub(super) place: Place,
    pub(super) offset: u64,
    pub(super) bytes: u64,
}

impl Loc {
    pub(super) fn at(place: Place, offset: u64, bytes: u64) -> Loc {
        Loc {
            place,
            offset,
            bytes,
        }
    }

    pub(super) fn overlaps(&self, other: &Loc) -> bool {
        self.place == other.place
            && self.offset < other.offset + other.bytes.max(1)
            && other.offset < self.offset + self.bytes.max(1)
    }

    /// True for ranges of the one arena buffer.
    pub(super) fn in_arena(&self) -> bool {
        matches!(self.place, Place::Arena | Place::Scratch)
    }
}

/// A step while lowering.
pub(super) enum Cmd {
    Dispatch {
        op: String,
        source: Arc<str>,
        entry_point: String,
        /// Parameters, output, operands, status word.
        bindings: Vec<Loc>,
        grid: [u32; 3],
    },
    Copy {
        from: Loc,
        to: Loc,
    },
    /// A loop's test ([`super::types::Step::Branch`]); `exit` indexes the
    /// lowering's commands until the program is finished.
    Branch {
        predicate: Loc,
        exit: usize,
    },
    /// Back to command `to` ([`super::types::Step::Jump`]).
    Jump {
        to: usize,
    },
}
