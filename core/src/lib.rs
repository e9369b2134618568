//! Kiln core: arrays, ops with shape rules, trees, tracing, the compile cache
//! with explained misses, and the CPU executor.
#![warn(missing_docs)]

// Lets `#[derive(Tree)]`'s `::kiln::` paths resolve inside this crate too.
extern crate self as kiln;

pub mod array;
pub mod autodiff;
pub mod compile;
pub mod creation;
pub mod data;
pub mod device;
pub mod dtype;
pub mod error;
pub mod eval;
pub mod exec;
pub mod graph;
pub mod hash;
pub mod implicit;
pub mod limits;
pub mod location;
pub mod nn;
pub mod ops;
pub mod passes;
pub mod plan;
pub mod random;
pub mod report;
pub mod shape;
pub mod trace;
pub mod tree;

pub use array::Array;
pub use autodiff::{
    grad, stop_gradient, value_and_grad, vjp, Grad, Pullback, ValueAndGrad, ValueAndGradWithAux,
};
pub use compile::{compile, CacheKey, Compiled, Function, LeafSignature};
pub use data::{HostData, HostElement};
pub use device::{
    default_device, set_default_device, with_default_device, AnyBackend, Device, DeviceBuffer,
};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use eval::{eval, eval_async, eval_cache_stats, EvalCacheStats};
pub use exec::{Backend, CpuBackend, Executable};

pub use graph::{Graph, GraphNode, Origin, Provenance, ValueKind};
pub use implicit::{ImplicitArray, ImplicitDecision};
pub use kiln_derive::Tree;
pub use limits::Limits;
pub use location::{at_location, current_location, SourceLocation};
pub use ops::binary::Operand;
pub use ops::layout::concat;
pub use ops::quant::{
    dequantize, gather_qmm, quantize, quantized_matmul, QuantFormat, QuantKind, QuantOp, QuantPart,
    Quantized,
};
pub use ops::select::select;
pub use ops::{
    BinaryOp, Condition, CustomCall, CustomOp, Guard, Kernel, KernelCall, Op, ReduceOp,
    SchemaEntry, ShapeCx, SliceAxis, TemplateValue, UnaryOp,
};
pub use passes::{PassRecord, Passes};
pub use plan::{Home, PlanMemory, Refusal, ReinplaceDecision, SlotPlan};
pub use report::{
    CacheInfo, CacheMiss, MissReason, PlanReport, Report, ReportNode, SlotReport, SlotValue,
};
pub use shape::{Atom, Aval, Dim, Shape, SymExpr, Symbol};
pub use tree::{
    tree_flatten, tree_flatten_with_path, tree_leaves, tree_map, tree_unflatten, DifferenceKind,
    KeyPath, NodeDef, NodeType, PathEntry, Registry, StaticValue, Tree, TreeDef, TreeDifference,
    Value, MAX_TREE_DEPTH,
};
