//! The lowering: an [`Executable`](kiln::Executable) for one set of resolved shapes and one
//! device's [`Caps`] becomes a [`Program`], everything a GPU runs for a
//! call: dispatches, copies and clears over byte ranges of one arena buffer
//! (which *is* the executable's slot plan), the caller's argument buffers
//! and the output buffers.
//!
//! A GPU backend executes a program and decides nothing about ops: which
//! kernel serves each op and with which parameters (`op_kernel`), how a
//! fused group that binds too many buffers runs step by step (`fused`),
//! how f16 and bf16 results of f32-accumulating kernels are packed
//! (`half`), how a custom op's forward is spliced in (`custom`) and where
//! every value, constant, parameter block and status word lives
//! (`arena`) are all decided here, once for every backend.
//!
//! ```
//! use kiln::Array;
//! use kiln_kernels::program::{lower, Caps, Step};
//!
//! let f = kiln::compile(|x: Array| (x.exp() * 2.0).sum(&[0], false));
//! let x = Array::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap();
//! let exe = f.executable(&x).unwrap();
//! let shapes = exe.resolve_shapes(&[&[3]]).unwrap();
//! let program = lower(&exe, &shapes, &Caps::default()).unwrap();
//! assert!(program.steps.iter().any(|s| matches!(s, Step::Dispatch(_))));
//! assert_eq!(program.outputs.len(), 1);
//! ```

mod arena;
mod check;
mod control;
mod custom;
mod fused;
mod half;
mod listing;
mod loc;
mod lowering;
mod op_kernel;
mod types;

pub use lowering::lower;
pub use types::{
    ArenaInit, ArenaUse, Buffer, Caps, Check, Dispatch, OutputInfo, Program, Range, Step,
};
