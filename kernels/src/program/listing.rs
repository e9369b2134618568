//! A [`Program`] as the backend-neutral [`KernelList`] that views and
//! tools read: every step in order, the graph value it serves, its
//! kernel's source (each distinct source once), bindings and grid.

use super::types::{Buffer, Program, Range, Step};
use kiln::{KernelList, KernelStep, StepBinding, StepKind};
use std::collections::HashMap;

impl Program {
    /// This program's steps as a [`KernelList`] of backend `backend` for
    /// executable `executable` (its [`kiln::Executable::id`]).
    ///
    /// ```
    /// use kiln::{Array, StepKind};
    /// use kiln_kernels::program::{lower, Caps};
    ///
    /// let f = kiln::compile(|x: Array| x.exp().sum(&[0], false));
    /// let x = Array::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    /// let exe = f.executable(&x).unwrap();
    /// let shapes = exe.resolve_shapes(&[&[2]]).unwrap();
    /// let list = lower(&exe, &shapes, &Caps::default()).unwrap().kernel_list("gpu", exe.id());
    /// let sum = list.steps.iter().find(|s| s.op == "sum").unwrap();
    /// assert_eq!(sum.kind, StepKind::Dispatch);
    /// assert!(list.sources[sum.source.unwrap()].contains("@compute"));
    /// ```
    pub fn kernel_list(&self, backend: &str, executable: u64) -> KernelList {
        let mut sources: Vec<String> = Vec::new();
        let mut seen: HashMap<&str, usize> = HashMap::new();
        let steps = self
            .steps
            .iter()
            .enumerate()
            .map(|(k, step)| {
                let nodes = self
                    .step_values
                    .get(k)
                    .copied()
                    .flatten()
                    .into_iter()
                    .collect();
                match step {
                    Step::Dispatch(d) => {
                        let source = *seen.entry(&d.source).or_insert_with(|| {
                            sources.push(d.source.to_string());
                            sources.len() - 1
                        });
                        KernelStep {
                            kind: StepKind::Dispatch,
                            op: d.op.clone(),
                            nodes,
                            source: Some(source),
                            entry_point: Some(d.entry_point.clone()),
                            bindings: d.bindings.iter().map(step_binding).collect(),
                            grid: Some(d.grid),
                        }
                    }
                    Step::Copy { from, to } => KernelStep {
                        kind: StepKind::Copy,
                        op: "copy".to_string(),
                        nodes,
                        source: None,
                        entry_point: None,
                        bindings: vec![step_binding(from), step_binding(to)],
                        grid: None,
                    },
                    Step::Clear(range) => KernelStep {
                        kind: StepKind::Clear,
                        op: "clear".to_string(),
                        nodes,
                        source: None,
                        entry_point: None,
                        bindings: vec![step_binding(range)],
                        grid: None,
                    },
                    Step::Branch { predicate, exit } => KernelStep {
                        kind: StepKind::Branch,
                        op: format!("read back the predicate; false: go to step {exit}"),
                        nodes,
                        source: None,
                        entry_point: None,
                        bindings: vec![step_binding(predicate)],
                        grid: None,
                    },
                    Step::Jump { to } => KernelStep {
                        kind: StepKind::Jump,
                        op: format!("go to step {to}"),
                        nodes,
                        source: None,
                        entry_point: None,
                        bindings: Vec::new(),
                        grid: None,
                    },
                }
            })
            .collect();
        KernelList {
            backend: backend.to_string(),
            executable,
            steps,
            sources,
            arena_bytes: Some(self.arena_bytes),
        }
    }
}

/// A range as the list names it: `arena`, `params`, `input 0`, `output 1`.
fn step_binding(range: &Range) -> StepBinding {
    StepBinding {
        buffer: match range.buffer {
            Buffer::Arena => "arena".to_string(),
            Buffer::Params => "params".to_string(),
            Buffer::Input(i) => format!("input {i}"),
            Buffer::Output(o) => format!("output {o}"),
        },
        offset: range.offset,
        bytes: range.bytes,
    }
}
