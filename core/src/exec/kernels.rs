//! What a backend runs for one call of an executable, step by step, as
//! data: the playground's Kernels view and tools read it
//! ([`crate::Backend::kernels`], [`crate::Compiled::kernels`]).
//!
//! A GPU backend lists its program's steps (each dispatch with its kernel
//! source, entry point, bindings as byte ranges and grid; copies; clears);
//! the CPU executor lists the op nodes it evaluates, in schedule order.
//! Every step names the graph values it serves, so a view can link a
//! kernel to its nodes and the nodes to their kernel.
//!
//! ```
//! use kiln::{compile, Array, DType};
//! let f = compile(|x: Array| (x.exp() + 1.0).sum(&[0], false));
//! f.call(&Array::ones(&[4], DType::F32))?;
//! let list = f.kernels(0)?;
//! assert_eq!(list.backend, "cpu");
//! assert!(list.steps.iter().any(|s| s.op.starts_with("sum")));
//! # Ok::<(), kiln::Error>(())
//! ```

use serde::{Deserialize, Serialize};

/// Every step a backend runs for one call of an executable, in order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelList {
    /// The backend's name (`cpu`, `wgpu:…`).
    pub backend: String,
    /// The executable listed ([`crate::Executable::id`]): measurements of
    /// its calls name it.
    pub executable: u64,
    /// The steps, in the order they run.
    pub steps: Vec<KernelStep>,
    /// The distinct kernel sources the steps name by index
    /// ([`KernelStep::source`]): dispatches of one kernel share one.
    pub sources: Vec<String>,
    /// Bytes of the buffer the slot plan lives in (the GPU's arena; on
    /// the CPU the slots' bytes together), when the backend has one.
    pub arena_bytes: Option<u64>,
}

/// What kind of work a step is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// A GPU compute dispatch.
    Dispatch,
    /// Bytes copied between buffers.
    Copy,
    /// Bytes set to zero (status words, before the kernels run).
    Clear,
    /// The CPU executor evaluating one op node.
    Evaluate,
    /// A loop's test: the predicate read back, the loop left when it is
    /// false (a GPU `while_loop`).
    Branch,
    /// Back to a loop's test.
    Jump,
}

impl StepKind {
    /// `dispatch`, `copy`, `clear`, `evaluate`, `branch` or `jump`.
    pub fn name(self) -> &'static str {
        match self {
            StepKind::Dispatch => "dispatch",
            StepKind::Copy => "copy",
            StepKind::Clear => "clear",
            StepKind::Evaluate => "evaluate",
            StepKind::Branch => "branch",
            StepKind::Jump => "jump",
        }
    }
}

/// One step of a [`KernelList`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelStep {
    /// What kind of step.
    pub kind: StepKind,
    /// The op it computes (`matmul`, `fused`, `copy`).
    pub op: String,
    /// The graph values it computes or serves (their node ids); empty
    /// for a step of the whole call (status words cleared).
    pub nodes: Vec<usize>,
    /// Its kernel's source, an index into [`KernelList::sources`].
    pub source: Option<usize>,
    /// The kernel's entry point.
    pub entry_point: Option<String>,
    /// The byte ranges it binds, in binding order (for a copy: source,
    /// then destination; on the CPU: the result's home, then each
    /// operand's).
    pub bindings: Vec<StepBinding>,
    /// Workgroups along x, y and z, for a dispatch.
    pub grid: Option<[u32; 3]>,
}

/// A byte range a step reads or writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepBinding {
    /// Which buffer: `arena`, `params`, `input 0`, `output 1`, `slot 3`,
    /// `constant`.
    pub buffer: String,
    /// Its first byte.
    pub offset: u64,
    /// Its length in bytes.
    pub bytes: u64,
}

impl std::fmt::Display for StepBinding {
    /// `arena[256..512)`: the buffer and the byte range.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}[{}..{})",
            self.buffer,
            self.offset,
            self.offset + self.bytes
        )
    }
}

impl KernelList {
    /// The steps serving graph value `node`, by index.
    pub fn steps_of(&self, node: usize) -> Vec<usize> {
        self.steps
            .iter()
            .enumerate()
            .filter(|(_, s)| s.nodes.contains(&node))
            .map(|(k, _)| k)
            .collect()
    }
}
