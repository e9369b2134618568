//! Kiln core: arrays, ops with shape rules, trees, tracing, the compile cache
//! with explained misses, and the CPU executor.
//!
//! # Layers
//!
//! The folders of `core/src` are layers. Each file imports only from its own
//! layer or the layers below it, with one deliberate exception (the handle
//! and the op families, below); `tests/layers.rs` checks this on every
//! `cargo test`. From the bottom up:
//!
//! **Base types** (files at the root): [`shape`], [`dtype`], [`error`],
//! [`data`], [`limits`], [`hash`], [`location`], [`random`], [`threads`] (the
//! CPU thread count), [`pool`] (the buffer pool policy, and the host pool of
//! dead f32 buffers) and [`buffer`] (type-erased device buffers and the
//! narrow readback interface an array kept on a device uses), plus the
//! array-free half of [`tree`]: tree defs, key paths, static values and the
//! depth limit. They import nothing above them.
//!
//! **Ops and the handle** (`ops/`, `handle/`): the closed [`Op`] enum and one
//! module per family holding its shape rule, reference evaluation, vjp,
//! jvp, batching rule and the [`Array`] user methods for it; `handle/` holds the lazy [`Array`]
//! handle itself and its constructors. The handle stores an [`Op`] per node
//! and the families' methods build nodes through the handle: the one import
//! circle kept on purpose, so that everything about an op sits in one place.
//! What a family needs from higher layers comes in through narrow
//! interfaces: reverse and forward mode are arguments of `Op::vjp` and
//! `Op::jvp`, a custom op's
//! tracing and small executable come through the `CustomRuntime` its
//! constructor hands in.
//!
//! **Trees** (`tree/`): [`Tree`] flattens values made of arrays into leaves
//! plus a [`TreeDef`] and rebuilds them.
//!
//! **IR** (`ir/`): the [`Graph`] (values in schedule order, with the
//! implicit-lowering decisions it records) and the rewriting passes
//! (simplify, constant folding, CSE, DCE, fusion). The IR holds ops but
//! never an [`Array`].
//!
//! **Tracing** (`trace/`): extracting a [`Graph`] from lazy arrays, trace
//! ids, and tracing a custom op's forward.
//!
//! **Plan** (`plan/`): reinplace decisions, slot assignment and the
//! independent verifier, over a graph and its shapes.
//!
//! **Executors** (`exec/`): [`Executable`] (graph + slot plan + shape
//! resolution), the [`Backend`] trait, the CPU executor, and [`Device`]s with
//! the per-thread default device.
//!
//! **Transformations** (`transform/`): reverse-mode autodiff over the lazy
//! graph, implicit arrays and their lowering, and custom ops' runtime (their
//! forward traced and built into small executables). They sit above the
//! executors because a custom op's body and an implicit kind's
//! materialization are executables of their own.
//!
//! **Compile** (`compile/`): the compile cache with explained misses, the
//! [`Report`], eager evaluation (the same pipeline, cached by graph
//! structure) and the user-facing transformations built on `compile`
//! (`grad`, `value_and_grad`, `vjp`, `jvp`, `linearize`, `jacfwd`,
//! `jacrev`, `hessian`, `vmap`).
//!
//! **Export** (`export/`): a compiled function as a StableHLO module for
//! XLA and the other engines that take it, with Shardy sharding
//! annotations. It starts from a [`Compiled`] function, so it sits above
//! `compile/`.
//!
//! **Models** (`nn/`, `optim/`, `io/`): what users build models from —
//! layers and losses, optimizers, weight files. They use only the public
//! API, as `mlx.nn` and optax do: where one needs a private hook, the API
//! is missing something.
//!
//! # Data flow
//!
//! A call of a compiled function flattens its arguments ([`tree`]), looks up
//! the cache key ([`compile`](mod@compile)); on a miss it traces the function on tracer
//! leaves into a [`Graph`] ([`trace`]), lowers implicit values and runs the
//! passes ([`transform`], [`ir`]), plans slots ([`plan`]) and builds an
//! [`Executable`] ([`exec`]) with its [`Report`]. A [`Backend`] runs the
//! executable on the leaves' buffers and the outputs are unflattened into
//! the result tree. Eager code takes the same path through [`eval()`].
#![warn(missing_docs)]

// Lets `#[derive(Tree)]`'s `::kiln::` paths resolve inside this crate too.
extern crate self as kiln;

pub mod buffer;
pub mod compile;
pub mod data;
pub mod dtype;
pub mod error;
pub mod exec;
pub mod export;
pub mod handle;
pub mod hash;
pub mod io;
pub mod ir;
pub mod limits;
pub mod location;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod plan;
pub mod pool;
pub mod random;
pub mod shape;
pub mod symbolic;
pub mod threads;
pub mod trace;
pub mod transform;
pub mod tree;

// The paths modules had before the layers became folders: other crates
// import through them.
pub use compile::{eval, report};
pub use exec::device;
pub use handle::{array, creation};
pub use ir::graph;
pub use transform::implicit;

/// Reverse-mode autodiff: the tape walk ([`crate::transform::autodiff`])
/// and the transformations built on `compile` ([`crate::compile::grad`]),
/// under the path they had before the layers became folders.
pub mod autodiff {
    pub use crate::compile::grad::*;
    pub use crate::transform::autodiff::*;
}

/// The graph passes ([`crate::ir::passes`]); `optimize` here lowers
/// implicit values first ([`crate::transform::implicit::optimize`]), as it
/// always did.
pub mod passes {
    pub use crate::ir::passes::{dce, fuse, transposed_operands, PassRecord, Passes};
    pub use crate::transform::implicit::optimize;
}

pub use compile::diff::{NodeChange, ReportDiff};
pub use compile::eval::{eval, eval_async, eval_cache_stats, EvalCacheStats};
pub use compile::forward::{
    hessian, jacfwd, jacrev, jvp, linearize, Hessian, JacFwd, JacRev, Linear,
};
pub use compile::grad::{
    grad, value_and_grad, vjp, Grad, Pullback, ValueAndGrad, ValueAndGradWithAux,
};
pub use compile::report::{
    BodyReport, CacheInfo, CacheMiss, CarriedValue, LoopReport, MissReason, PlanReport, Report,
    ReportNode, SlotReport, SlotValue,
};
pub use compile::vmap::{vmap, Vmap};
pub use compile::{compile, CacheKey, Compiled, Function, FunctionOutput, LeafSignature};
pub use data::{HostData, HostElement};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use exec::device::{
    default_device, set_default_device, with_default_device, AnyBackend, Device, DeviceBuffer,
};
pub use exec::{Backend, CpuBackend, Executable, KernelList, KernelStep, StepBinding, StepKind};
pub use handle::array::Array;
pub use ir::graph::{Graph, GraphNode, ImplicitDecision, Origin, Provenance, ValueKind};
pub use ir::passes::{PassRecord, Passes};
pub use kiln_derive::Tree;
pub use limits::Limits;
pub use location::{
    at_location, current_composition, current_location, in_composition, SourceLocation,
};
pub use ops::array_api::stack;
pub use ops::batching::{VmapFallback, VmapMaterialization};
pub use ops::binary::Operand;
pub use ops::einsum::einsum;
pub use ops::layout::concat;
pub use ops::quant::{
    dequantize, gather_qmm, quantize, quantized_matmul, QuantFormat, QuantKind, QuantOp, QuantPart,
    Quantized,
};
pub use ops::select::select;
pub use ops::{
    BinaryOp, Condition, ControlCall, ControlKind, CustomCall, CustomOp, Guard, Kernel, KernelCall,
    Op, ReduceOp, SchemaEntry, ShapeCx, SliceAxis, TemplateValue, UnaryOp,
};
pub use plan::{Home, PlanMemory, Refusal, ReinplaceDecision, SlotPlan};
pub use shape::{Atom, Aval, Dim, Shape, SymExpr, Symbol};
pub use trace::control::{
    cond, fori_loop, scan, scan_with, switch, while_loop, Branch, ScanOptions,
};
pub use transform::autodiff::stop_gradient;
pub use transform::implicit::ImplicitArray;
pub use tree::{
    parameter_count, tree_flatten, tree_flatten_with_path, tree_leaves, tree_map, tree_map2,
    tree_map_n, tree_unflatten, DifferenceKind, JacobianOutput, KeyPath, NodeDef, NodeType,
    PathEntry, Registry, StaticValue, Tree, TreeDef, TreeDifference, Value, ValueParts,
    MAX_TREE_DEPTH,
};
