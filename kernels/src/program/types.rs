//! What a program is: the types a GPU executor consumes.

use crate::abi::bad_input_position;
use crate::family::MatmulVariant;
use crate::spec::Target;
use kiln::{DType, Error};
use std::sync::Arc;

/// What a device allows a program: the limits it is lowered within.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caps {
    /// The backend's name, for messages (`wgpu`, `metal`).
    pub backend: String,
    /// Storage buffers one kernel may bind (parameters, output, operands
    /// and status word together).
    pub max_storage_buffers_per_stage: u32,
    /// Workgroups per grid dimension.
    pub max_workgroups_per_dimension: u32,
    /// Invocations per workgroup along x, y and z.
    pub max_workgroup_size: [u32; 3],
    /// Invocations per workgroup in all.
    pub max_invocations_per_workgroup: u32,
    /// Bytes one binding may span.
    pub max_binding_bytes: u64,
    /// Bytes one buffer (the arena) may hold.
    pub max_buffer_bytes: u64,
    /// Binding offsets are multiples of this (at most
    /// [`kiln::plan::SLOT_ALIGN`], which WebGPU guarantees).
    pub binding_offset_alignment: u32,
    /// The device computes with f16 natively (SHADER_F16).
    pub native_f16: bool,
    /// Every matmul runs this kernel (benchmarks compare them); `None`
    /// picks per shape.
    pub forced_matmul: Option<MatmulVariant>,
}

impl Default for Caps {
    /// WebGPU's guaranteed limits (`maxStorageBuffersPerShaderStage` 8,
    /// 65,535 workgroups per dimension, 256 invocations, 128 MiB bindings,
    /// 256-byte offsets), without f16.
    fn default() -> Caps {
        Caps {
            backend: "gpu".into(),
            max_storage_buffers_per_stage: 8,
            max_workgroups_per_dimension: 65_535,
            max_workgroup_size: [256, 256, 64],
            max_invocations_per_workgroup: 256,
            max_binding_bytes: 128 << 20,
            max_buffer_bytes: 256 << 20,
            binding_offset_alignment: 256,
            native_f16: false,
            forced_matmul: None,
        }
    }
}

impl Caps {
    /// What the kernel generators may use.
    pub fn target(&self) -> Target {
        Target {
            native_f16: self.native_f16,
        }
    }
}

/// A buffer a program names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Buffer {
    /// The program's arena: slots, constants, parameters, status words
    /// and scratch ([`Program::arena_bytes`], initial data in
    /// [`Program::arena_init`]).
    Arena,
    /// The program's parameter words ([`Program::params_bytes`], written
    /// once from [`Program::params_init`]). A buffer of its own, bound
    /// read-only: WGSL treats loads from writable storage as non-uniform,
    /// and kernels branch and synchronize on their parameters.
    Params,
    /// The caller's argument leaf `i`.
    Input(usize),
    /// Output `o`, a buffer of [`Program::outputs`]`[o]`'s bytes made per call.
    Output(usize),
}

/// A byte range of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Range {
    /// Which buffer.
    pub buffer: Buffer,
    /// The first byte (a multiple of [`Caps::binding_offset_alignment`] for
    /// a binding).
    pub offset: u64,
    /// Bytes, a positive multiple of 4.
    pub bytes: u64,
}

impl Range {
    /// The byte after the range.
    pub fn end(&self) -> u64 {
        self.offset + self.bytes
    }

    /// True when the two share a byte.
    pub fn overlaps(&self, other: &Range) -> bool {
        self.buffer == other.buffer && self.offset < other.end() && other.offset < self.end()
    }
}

/// One compute dispatch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dispatch {
    /// The op it computes, for messages.
    pub op: String,
    /// The WGSL module (see [`crate::abi`] for its bindings).
    pub source: Arc<str>,
    /// Its entry point.
    pub entry_point: String,
    /// Ranges bound at bindings 0, 1, …: parameters, output, operands and,
    /// for a checking kernel, the status word. Every binding is writable
    /// storage; ranges of one buffer may repeat.
    pub bindings: Vec<Range>,
    /// Workgroups along x, y and z, within [`Caps`].
    pub grid: [u32; 3],
}

/// One step of a program, run in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// A kernel.
    Dispatch(Dispatch),
    /// `from.bytes` bytes copied between two different buffers (copies
    /// within the arena are copy kernels).
    Copy {
        /// The source range.
        from: Range,
        /// The destination, as long as the source.
        to: Range,
    },
    /// Bytes set to zero (status words before the kernels run).
    Clear(Range),
    /// The test of a loop whose trip count is known only as it runs
    /// (`while_loop`): the steps recorded so far are submitted, the
    /// predicate word is read back, and when it is zero the program goes
    /// on at step `exit`, else at the next step.
    Branch {
        /// The predicate: one word, nonzero to stay in the loop.
        predicate: Range,
        /// The first step after the loop.
        exit: usize,
    },
    /// The program goes on at step `to` (the end of a loop's body, back to
    /// its test).
    Jump {
        /// The step to go on at.
        to: usize,
    },
}

/// A status word some kernel raises when its input is bad (see
/// [`crate::abi`]): read back with the call's outputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// The word, 4 bytes of the arena.
    pub word: Range,
    /// The op that checks.
    pub op: String,
    /// What bad input means, before the position.
    pub detail: String,
}

impl Check {
    /// The `Err` every backend returns for the first of `checks` whose
    /// read-back status word (in `words`, one per check, in order) reports
    /// bad input; `None` when none does.
    pub fn first_error(checks: &[Check], words: &[u32]) -> Option<Error> {
        checks.iter().zip(words).find_map(|(check, &word)| {
            let position = bad_input_position(word)?;
            Some(Error::Runtime {
                op: check.op.clone(),
                detail: format!("{} (at position {position} of the indices)", check.detail),
            })
        })
    }
}

/// Initial bytes of the arena (constants and parameter words), written
/// once when the program's arena is made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaInit {
    /// Where in the arena.
    pub offset: u64,
    /// The words.
    pub words: Vec<u32>,
}

/// An output's element type and count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputInfo {
    /// Element dtype.
    pub dtype: DType,
    /// Element count.
    pub len: usize,
    /// Bytes of its buffer ([`storage_bytes`](crate::abi::storage_bytes)).
    pub bytes: u64,
}

/// How a program's arena divides, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArenaUse {
    /// The plan's slots: the executable's planned arena at these shapes.
    pub slots: u64,
    /// Constants.
    pub constants: u64,
    /// Parameter blocks, in the parameter buffer (identical blocks share
    /// one).
    pub params: u64,
    /// Status words.
    pub checks: u64,
    /// Custom ops' spliced forwards (their own arenas).
    pub custom: u64,
    /// Private copies of operands one dispatch would otherwise bind twice
    /// (elementwise kernels read a repeated operand through one binding
    /// instead).
    pub copies: u64,
    /// Scratch shared by the steps of one op (fused groups run step by
    /// step, f32 results awaiting their f16/bf16 packing).
    pub scratch: u64,
}

/// Everything a GPU runs for one call of an executable at one set of
/// shapes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Program {
    /// The value shapes it was lowered for.
    pub shapes: Vec<Vec<usize>>,
    /// The steps, in order; [`Step::Branch`] and [`Step::Jump`] form
    /// loops.
    pub steps: Vec<Step>,
    /// Bytes of the arena buffer.
    pub arena_bytes: u64,
    /// What the arena holds before the first call.
    pub arena_init: Vec<ArenaInit>,
    /// Bytes of the parameter buffer.
    pub params_bytes: u64,
    /// The parameter buffer's words, written once.
    pub params_init: Vec<ArenaInit>,
    /// How the arena divides ([`ArenaUse::slots`] is the plan's arena).
    pub arena_use: ArenaUse,
    /// Status words to read back with the outputs, in order.
    pub checks: Vec<Check>,
    /// The outputs, in order.
    pub outputs: Vec<OutputInfo>,
    /// Arguments some step writes (donated ones reinplaced into), sorted.
    pub written_inputs: Vec<usize>,
    /// The graph value each step serves, beside [`Program::steps`]: the
    /// op value it computes (a fused group's node for all its steps), the
    /// output a copy fills; `None` for the status words cleared first.
    pub step_values: Vec<Option<usize>>,
}

impl Program {
    /// True when some step reads a predicate back ([`Step::Branch`]): a
    /// call waits on the device once per iteration of such a loop.
    pub fn has_loops(&self) -> bool {
        self.steps.iter().any(|s| matches!(s, Step::Branch { .. }))
    }
}
