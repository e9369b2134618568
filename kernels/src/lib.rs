//! Kiln's GPU lowering and its WGSL kernels: what every GPU backend runs.
//!
//! **Layers.** `kiln-kernels` sits between the core (`kiln`: the graph,
//! the passes, the slot plan) and the GPU executors (`kiln-wgpu`, and the
//! native Metal backend). It imports only `kiln`; no backend imports
//! another, and no backend matches on ops.
//!
//! * [`abi`] — the word ABI written once: how each dtype lies in 32-bit
//!   words, the binding order and access of every kernel, the status-word
//!   encoding, host conversion.
//! * The **kernel generators**, one module per op family (elementwise and
//!   fused groups, layout and gather, reductions and matmul, pad, scatter,
//!   quantization, user kernels): each returns a [`KernelSpec`] — WGSL
//!   source, parameter words, workgroups, which operands it binds. The
//!   static sources in `src/wgsl/*.wgsl` hold the algorithms (tree
//!   reductions, tiled matmul, gather, the index-to-element mains) and, in
//!   `ops.wgsl`, the meaning of every unary, binary, where and cast op per
//!   operand kind. Elementwise kernels over an element count divisible by
//!   four compute four elements per invocation as vec4 lanes.
//! * [`program`] — the lowering: [`lower`] turns an [`kiln::Executable`]
//!   at one set of resolved shapes and a device's [`Caps`] into a
//!   [`Program`]: dispatches, copies and clears over byte ranges of one
//!   arena buffer that *is* the executable's slot plan, plus its constants,
//!   parameter blocks and status words.
//!
//! **Data flow.** A backend's first call of an executable with some shapes
//! asks for its `Program`, makes its arena (writing the initial data) and
//! pipelines, and from then on only records the steps per call: bind
//! groups, one encoder, the pool of argument and output buffers, readback
//! of outputs and status words. The same `Program` serves wgpu (Vulkan,
//! Metal, DX12, WebGPU) and Metal (MSL from the same WGSL through naga).
//!
//! ```
//! use kiln::{DType, Op, UnaryOp};
//! use kiln_kernels::{elementwise, validate, Target, View};
//!
//! let x = View::contiguous(DType::F32, &[4]);
//! let spec = elementwise(&Op::Unary(UnaryOp::Exp), &[x], &[4], DType::F32, Target::default()).unwrap();
//! validate(&spec.source).unwrap();
//! assert_eq!(spec.workgroups, 1);
//! ```
#![warn(missing_docs)]

pub mod abi;
mod dynamic;
mod element;
mod family;
mod layout;
mod pad;
pub mod program;
mod quant;
mod scatter;
mod source;
mod spec;
mod user;

pub use abi::{bad_input_position, from_words, storage_bytes, to_words, words};
pub use dynamic::{dynamic_slice, dynamic_update_slice, dynamic_update_window, select_branch};
pub use family::{argmax, matmul, reduce, stores_f32, MatmulVariant};
pub use layout::{check_indices, concat, copy, take};
pub use pad::pad_slice;
pub use program::{lower, Caps, Program};
pub use quant::{dequantize, quantize, quantized_matmul, QmmBatch, QmmShape, QMM_TILED_MIN_ROWS};
pub use scatter::scatter_add;
pub use source::elementwise;
pub use spec::{checked, validate, KernelError, KernelSpec, Launch, Target, View};
pub use user::user_kernel;
