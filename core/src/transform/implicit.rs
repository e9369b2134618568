//! Implicit arrays: values that stand in for an array (quantized weights, a
//! low-rank update) without being one, and the lowering pass that resolves
//! every op consuming one.
//!
//! An implicit array is a [`Tree`] (its buffers are leaves, its parameters
//! statics) with a [`materialize`](ImplicitArray::materialize) composition.
//! [`ImplicitArray::array`] makes it a graph value of its own kind
//! ([`Op::Implicit`]) over its leaves, with the aval of what it stands for;
//! ops apply to it like to any array, so it passes through `compile` (as
//! tree leaves: its structure and statics are in the cache key), `grad`
//! and shapeless compile. Before the other passes, [`lower_implicit`]
//! resolves each op reading one: the [`Handler`] registered for that op and
//! those operand kinds with the highest precedence rewrites it (two at the
//! same precedence are an `Err` naming both); without a handler the value
//! is materialized, and the graph records which op forced it. Either way
//! the decision is data ([`ImplicitDecision`]) shown by the `Report`.
//!
//! Gradients flow through an implicit value into its float leaves by
//! differentiating its materialization; one made with
//! [`ImplicitArray::straight_through`] instead passes its cotangent
//! unchanged to a full-precision master copy (the straight-through
//! estimator) and none to its leaves.

use super::custom_runtime::Bodies;
use crate::error::{Error, Result};
use crate::handle::array::Array;
use crate::ir::graph::{Graph, GraphNode, Origin, ValueId, ValueKind};
use crate::ir::passes::{optimize_lowered, PassRecord, Passes};
use crate::ops::custom::{CustomCall, CustomDef, ForwardFn};
use crate::ops::quant::{quantize, quantized_matmul, QuantFormat, Quantized};
use crate::ops::Op;
use crate::shape::Aval;
use crate::trace::{extract, next_trace_id, Leaves};
use crate::tree::{tree_flatten, tree_unflatten, Tree, TreeDef};
use std::any::TypeId;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

// The op of an implicit value is an op family (`ops/implicit.rs`) and the
// decisions are graph data (`ir/graph.rs`); their public path stays here.
pub use crate::ir::graph::ImplicitDecision;
pub use crate::ops::implicit::ImplicitCall;

/// A value that stands in for an array. See the [module docs](self).
///
/// ```
/// use kiln::implicit::{ImplicitArray, LowRank};
/// use kiln::Array;
///
/// let base = Array::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], &[2, 2])?;
/// let a = Array::from_vec(vec![1.0f32, 2.0], &[2, 1])?;
/// let b = Array::from_vec(vec![0.5f32, 0.5], &[1, 2])?;
/// let w = LowRank { base, a, b };
/// let x = Array::from_vec(vec![1.0f32, 1.0], &[1, 2])?;
/// // x @ (base + a·b), computed as x·base + (x·a)·b by the registered handler.
/// assert_eq!(x.matmul(&w.array()).to_vec::<f32>()?, vec![2.5, 2.5]);
/// # Ok::<(), kiln::Error>(())
/// ```
pub trait ImplicitArray: Tree + Clone + Send + Sync + 'static {
    /// The kind's name, which handlers match on (`low_rank`, `nf4`, ...).
    const KIND: &'static str;

    /// The array it stands for, as a Kiln composition of its leaves.
    fn materialize(&self) -> Result<Array>;

    /// The graph value of this implicit array (a failed array if it does
    /// not flatten or its materialization fails for its leaves' avals).
    fn array(&self) -> Array {
        implicit_array(self, None)
    }

    /// Like [`array`](Self::array), but gradients pass straight through
    /// to `master` (which must have the materialized aval) and not into
    /// the leaves: the straight-through estimator for training through
    /// quantization.
    fn straight_through(&self, master: &Array) -> Array {
        implicit_array(self, Some(master))
    }
}

/// The per-type def of implicit kind `T`: one per type, so equal values of
/// one kind are equal ops.
fn kind_def<T: ImplicitArray>() -> Arc<CustomDef> {
    static DEFS: OnceLock<RwLock<HashMap<TypeId, Arc<CustomDef>>>> = OnceLock::new();
    let defs = DEFS.get_or_init(RwLock::default);
    if let Some(def) = defs
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&TypeId::of::<T>())
    {
        return def.clone();
    }
    let forward: Arc<ForwardFn> = Arc::new(|def: &TreeDef, leaves: Vec<Array>| {
        tree_unflatten::<T>(def, leaves)?.materialize()
    });
    defs.write()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(TypeId::of::<T>())
        .or_insert_with(|| CustomDef::new(T::KIND, forward, Bodies::runtime(optimize)))
        .clone()
}

fn implicit_array<T: ImplicitArray>(value: &T, master: Option<&Array>) -> Array {
    match tree_flatten(value) {
        Ok((mut leaves, args)) => {
            let call = ImplicitCall {
                kind: T::KIND,
                body: CustomCall::of(kind_def::<T>(), args),
                straight_through: master.is_some(),
            };
            leaves.extend(master.cloned());
            Array::apply(Op::Implicit(call), leaves)
        }
        Err(e) => Array::failed(e),
    }
}

/// What kind of value a handler accepts at one operand position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OperandKind {
    /// An ordinary array.
    Dense,
    /// An implicit array of this kind.
    Implicit(&'static str),
    /// Anything.
    Any,
}

impl OperandKind {
    fn accepts(self, given: OperandKind) -> bool {
        self == OperandKind::Any || self == given
    }
}

impl fmt::Display for OperandKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OperandKind::Dense => f.write_str("dense"),
            OperandKind::Implicit(kind) => f.write_str(kind),
            OperandKind::Any => f.write_str("any"),
        }
    }
}

/// An operand as a handler sees it.
#[derive(Clone)]
pub enum HandlerOperand {
    /// An ordinary array.
    Dense(Array),
    /// An implicit array: its kind, structure and leaves.
    Implicit {
        /// The kind's name.
        kind: &'static str,
        /// The structure (with its statics).
        args: TreeDef,
        /// The leaves, in order.
        leaves: Vec<Array>,
    },
}

impl HandlerOperand {
    /// The implicit value, if it is one of kind `T`.
    pub fn implicit<T: ImplicitArray>(&self) -> Option<T> {
        match self {
            HandlerOperand::Implicit { kind, args, leaves } if *kind == T::KIND => {
                tree_unflatten(args, leaves.clone()).ok()
            }
            _ => None,
        }
    }

    /// The dense array, if it is one.
    pub fn dense(&self) -> Option<&Array> {
        match self {
            HandlerOperand::Dense(a) => Some(a),
            HandlerOperand::Implicit { .. } => None,
        }
    }
}

/// Rewrites one op over the operands it matched.
pub type RewriteFn = dyn Fn(&Op, &[HandlerOperand]) -> Result<Array> + Send + Sync;

/// A rewrite of an op whose operands are of given kinds.
#[derive(Clone)]
pub struct Handler {
    /// The handler's name, shown by the `Report`.
    pub name: String,
    /// The op it rewrites, by [`Op::name`] (`matmul`, `add`, ...).
    pub op: String,
    /// The kinds it accepts, one per operand.
    pub operands: Vec<OperandKind>,
    /// Among handlers that match, the highest precedence runs.
    pub precedence: i32,
    /// The rewrite: a composition computing the op's result.
    pub rewrite: Arc<RewriteFn>,
}

impl fmt::Debug for Handler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handler")
            .field("name", &self.name)
            .field("op", &self.op)
            .field("operands", &self.operands)
            .field("precedence", &self.precedence)
            .finish_non_exhaustive()
    }
}

impl Handler {
    /// A handler named `name` rewriting `op` over operands of `operands`.
    pub fn new(
        name: impl Into<String>,
        op: impl Into<String>,
        operands: impl Into<Vec<OperandKind>>,
        precedence: i32,
        rewrite: impl Fn(&Op, &[HandlerOperand]) -> Result<Array> + Send + Sync + 'static,
    ) -> Handler {
        Handler {
            name: name.into(),
            op: op.into(),
            operands: operands.into(),
            precedence,
            rewrite: Arc::new(rewrite),
        }
    }

    fn matches(&self, op: &str, kinds: &[OperandKind]) -> bool {
        self.op == op
            && self.operands.len() == kinds.len()
            && self.operands.iter().zip(kinds).all(|(h, &k)| h.accepts(k))
    }
}

fn handlers() -> &'static RwLock<Vec<Arc<Handler>>> {
    static HANDLERS: OnceLock<RwLock<Vec<Arc<Handler>>>> = OnceLock::new();
    HANDLERS.get_or_init(|| RwLock::new(builtin_handlers().into_iter().map(Arc::new).collect()))
}

/// Registers `handler` for every later lowering (process-wide). A second
/// handler of the same name is an `Err`.
pub fn register_handler(handler: Handler) -> Result<()> {
    let mut all = handlers().write().unwrap_or_else(PoisonError::into_inner);
    if all.iter().any(|h| h.name == handler.name) {
        return Err(Error::InvalidArgument {
            op: "register_handler".into(),
            detail: format!("a handler named `{}` is already registered", handler.name),
            at: None,
        });
    }
    all.push(Arc::new(handler));
    Ok(())
}

/// The handler for `op` over operands of `kinds`: the matching one of the
/// highest precedence; two at that precedence are an `Err` naming both.
fn choose(op: &str, kinds: &[OperandKind]) -> Result<Option<Arc<Handler>>> {
    let all = handlers().read().unwrap_or_else(PoisonError::into_inner);
    let mut matching: Vec<&Arc<Handler>> = all.iter().filter(|h| h.matches(op, kinds)).collect();
    matching.sort_by_key(|h| std::cmp::Reverse(h.precedence));
    match matching.as_slice() {
        [first, second, ..] if first.precedence == second.precedence => {
            Err(Error::InvalidArgument {
                op: op.to_string(),
                detail: format!(
                    "handlers `{}` and `{}` both match operands ({}) at precedence {}; give one \
                     a higher precedence",
                    first.name,
                    second.name,
                    render_kinds(kinds),
                    first.precedence
                ),
                at: None,
            })
        }
        [first, ..] => Ok(Some(Arc::clone(first))),
        [] => Ok(None),
    }
}

fn render_kinds(kinds: &[OperandKind]) -> String {
    kinds
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The whole graph pipeline: lowers implicit values ([`lower_implicit`]),
/// then runs simplify, constant folding and CSE in one forward sweep, then
/// DCE, then (if enabled) elementwise fusion
/// ([`crate::ir::passes::optimize_lowered`]).
pub fn optimize(graph: &Graph, passes: Passes) -> Result<(Graph, Vec<PassRecord>)> {
    let lowered = lower_implicit(graph)?;
    optimize_lowered(lowered.as_ref().unwrap_or(graph), passes)
}

/// Resolves every op reading an implicit value (see the module docs):
/// `None` when the graph has none; otherwise the graph without implicit
/// values, its [`Graph::implicit`] listing every decision.
pub fn lower_implicit(graph: &Graph) -> Result<Option<Graph>> {
    let is_implicit = |node: &GraphNode| matches!(node.kind, ValueKind::Op(Op::Implicit(_)));
    if !graph.nodes.iter().any(is_implicit) {
        return Ok(None);
    }
    let mut lowering = Lowering {
        out: Graph {
            num_inputs: graph.num_inputs,
            guards: graph.guards.clone(),
            ..Graph::default()
        },
        remap: vec![None; graph.nodes.len()],
        graph,
    };
    for (i, node) in graph.nodes.iter().enumerate() {
        let backward = graph.is_backward(i);
        match &node.kind {
            // Emitted when an op needs the value itself.
            ValueKind::Op(Op::Implicit(_)) => {}
            ValueKind::Op(op) if node.inputs.iter().any(|&j| is_implicit(&graph.nodes[j])) => {
                let kinds: Vec<OperandKind> = node
                    .inputs
                    .iter()
                    .map(|&j| match &graph.nodes[j].kind {
                        ValueKind::Op(Op::Implicit(call)) => OperandKind::Implicit(call.kind),
                        _ => OperandKind::Dense,
                    })
                    .collect();
                match choose(op.name(), &kinds)? {
                    Some(handler) => {
                        let value = lowering.handle(i, op, &handler, backward)?;
                        lowering.remap[i] = Some(value);
                        lowering.out.implicit.push(ImplicitDecision::Handled {
                            node: i,
                            op: op.describe(),
                            operands: render_kinds(&kinds),
                            handler: handler.name.clone(),
                        });
                    }
                    None => {
                        for &j in &node.inputs {
                            lowering.materialize(j, op.name(), Some(i))?;
                        }
                        lowering.copy(i, backward);
                    }
                }
            }
            _ => lowering.copy(i, backward),
        }
    }
    for &o in &graph.outputs {
        lowering.materialize(o, "output", None)?;
    }
    let mut out = lowering.out;
    out.outputs = graph
        .outputs
        .iter()
        .map(|&o| lowering.remap[o].ok_or_else(|| unresolved(o)))
        .collect::<Result<_>>()?;
    Ok(Some(out))
}

fn unresolved(v: ValueId) -> Error {
    Error::InvalidPlan {
        detail: format!("implicit lowering left value %{v} unresolved"),
    }
}

struct Lowering<'a> {
    graph: &'a Graph,
    out: Graph,
    /// Each traced value's value in `out`, once emitted.
    remap: Vec<Option<ValueId>>,
}

impl Lowering<'_> {
    fn value(&self, v: ValueId) -> Result<ValueId> {
        self.remap[v].ok_or_else(|| unresolved(v))
    }

    /// Where traced value `v` came from.
    fn origin(&self, v: ValueId) -> Origin {
        self.graph.provenance.0.get(v).cloned().unwrap_or_default()
    }

    /// Emits traced node `i` with its operands remapped.
    fn copy(&mut self, i: ValueId, backward: bool) {
        let node = &self.graph.nodes[i];
        let inputs = node
            .inputs
            .iter()
            .map(|&j| self.remap[j].unwrap_or(j))
            .collect();
        self.out.push_node(
            GraphNode {
                kind: node.kind.clone(),
                inputs,
                aval: node.aval.clone(),
            },
            backward,
            self.origin(i),
        );
        self.remap[i] = Some(self.out.nodes.len() - 1);
    }

    /// Emits the materialization of implicit value `v` (once), recording
    /// that `forced_by` forced it; other values are left alone.
    fn materialize(
        &mut self,
        v: ValueId,
        forced_by: &str,
        consumer: Option<ValueId>,
    ) -> Result<()> {
        let node = &self.graph.nodes[v];
        let ValueKind::Op(Op::Implicit(call)) = &node.kind else {
            return Ok(());
        };
        if self.remap[v].is_some() {
            return Ok(());
        }
        let leaves = call.num_leaves(node.inputs.len());
        let inputs: Vec<ValueId> = node.inputs[..leaves]
            .iter()
            .map(|&j| self.value(j))
            .collect::<Result<_>>()?;
        let avals: Vec<&Aval> = node.inputs[..leaves]
            .iter()
            .map(|&j| &self.graph.nodes[j].aval)
            .collect();
        let body = call.body.forward_graph(&avals)?;
        let value = self.splice(&body, &inputs, self.graph.is_backward(v), &self.origin(v));
        self.remap[v] = Some(value);
        self.out.implicit.push(ImplicitDecision::Materialized {
            node: v,
            kind: call.kind.to_string(),
            forced_by: forced_by.to_string(),
            consumer,
        });
        Ok(())
    }

    /// Emits `handler`'s rewrite of traced op `i` and returns its value.
    fn handle(
        &mut self,
        i: ValueId,
        op: &Op,
        handler: &Handler,
        backward: bool,
    ) -> Result<ValueId> {
        let node = &self.graph.nodes[i];
        let trace = next_trace_id();
        let mut params: Vec<ValueId> = Vec::new();
        let param = |v: ValueId, aval: &Aval, params: &mut Vec<ValueId>| {
            params.push(v);
            Array::param(trace, params.len() - 1, aval.clone())
        };
        let mut operands = Vec::with_capacity(node.inputs.len());
        for &j in &node.inputs {
            let operand = &self.graph.nodes[j];
            operands.push(match &operand.kind {
                ValueKind::Op(Op::Implicit(call)) => {
                    let leaves = call.num_leaves(operand.inputs.len());
                    let mut arrays = Vec::with_capacity(leaves);
                    for &leaf in &operand.inputs[..leaves] {
                        arrays.push(param(
                            self.value(leaf)?,
                            &self.graph.nodes[leaf].aval,
                            &mut params,
                        ));
                    }
                    HandlerOperand::Implicit {
                        kind: call.kind,
                        args: call.body.args().clone(),
                        leaves: arrays,
                    }
                }
                _ => HandlerOperand::Dense(param(self.value(j)?, &operand.aval, &mut params)),
            });
        }
        let result = (handler.rewrite)(op, &operands)?;
        if !crate::symbolic::avals_equal(result.aval(), &node.aval) {
            return Err(Error::InvalidArgument {
                op: op.name().to_string(),
                detail: format!(
                    "handler `{}` returned {} for an op whose result is {}",
                    handler.name,
                    result.aval(),
                    node.aval
                ),
                at: None,
            });
        }
        let (sub, _) = extract(
            &[result],
            Leaves::Trace {
                id: trace,
                num_inputs: params.len(),
            },
            &HashSet::new(),
        )
        .map_err(|e| match e {
            Error::ReadTracer { aval } => Error::InvalidArgument {
                op: op.name().to_string(),
                detail: format!(
                    "handler `{}` uses a value it was not given ({aval}); build the rewrite \
                     from its operands",
                    handler.name
                ),
                at: None,
            },
            other => other,
        })?;
        Ok(self.splice(&sub, &params, backward, &self.origin(i)))
    }

    /// Appends `sub`'s computed values with its inputs bound to `inputs`
    /// and returns the value of its (first) output.
    /// Every spliced value has `origin`, the replaced value's.
    fn splice(
        &mut self,
        sub: &Graph,
        inputs: &[ValueId],
        backward: bool,
        origin: &Origin,
    ) -> ValueId {
        let mut map = Vec::with_capacity(sub.nodes.len());
        for node in &sub.nodes {
            match node.kind {
                ValueKind::Input(k) => map.push(inputs[k]),
                _ => {
                    let node = GraphNode {
                        kind: node.kind.clone(),
                        inputs: node.inputs.iter().map(|&j| map[j]).collect(),
                        aval: node.aval.clone(),
                    };
                    self.out.push_node(node, backward, origin.clone());
                    map.push(self.out.nodes.len() - 1);
                }
            }
        }
        self.out.guards.extend(sub.guards.iter().cloned());
        map[sub.outputs[0]]
    }
}

/// A low-rank update of a base matrix, `base + a·b` (as in LoRA): an
/// implicit array that is not quantization. `x @ w` runs as
/// `x·base + (x·a)·b` without forming the `[k, n]` update.
#[derive(Clone, Debug, crate::Tree)]
pub struct LowRank {
    /// The `[k, n]` base matrix.
    pub base: Array,
    /// The `[k, r]` left factor.
    pub a: Array,
    /// The `[r, n]` right factor.
    pub b: Array,
}

impl ImplicitArray for LowRank {
    const KIND: &'static str = "low_rank";

    fn materialize(&self) -> Result<Array> {
        Ok(&self.base + &self.a.matmul(&self.b))
    }
}

/// Declares a quantized weight kind standing for a `[k, n]` matrix `w`:
/// its codes hold `wᵀ` (`[n, k]`, quantized along `k`, the layout MLX and
/// QLoRA keep weights in), so `x @ w` runs as [`quantized_matmul`] with
/// `transpose` straight from the packed codes.
macro_rules! quantized_kind {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, crate::Tree)]
        pub struct $name {
            /// Packed codes of `wᵀ`, `u32[n, k·bits/32]`.
            pub packed: Array,
            /// One scale per group of a row of `wᵀ`.
            pub scales: Array,
            /// One bias per group (affine only).
            pub biases: Option<Array>,
            /// The format (bits, group size): a static, part of the cache key.
            #[tree(static)]
            pub format: QuantFormat,
        }

        impl $name {
            /// The codes as the quantization ops take them.
            pub fn quantized(&self) -> Quantized {
                Quantized {
                    packed: self.packed.clone(),
                    scales: self.scales.clone(),
                    biases: self.biases.clone(),
                    format: self.format,
                }
            }

            fn of(w: &Array, format: QuantFormat) -> $name {
                let q = quantize(&w.transpose(), format);
                $name {
                    packed: q.packed,
                    scales: q.scales,
                    biases: q.biases,
                    format: q.format,
                }
            }

            /// The bytes its buffers take (known shapes), to set beside the
            /// `k·n·4` of the f32 weight it stands for.
            pub fn bytes(&self) -> usize {
                [Some(&self.packed), Some(&self.scales), self.biases.as_ref()]
                    .into_iter()
                    .flatten()
                    .filter_map(Array::nbytes)
                    .sum()
            }
        }

        impl ImplicitArray for $name {
            const KIND: &'static str = $kind;

            fn materialize(&self) -> Result<Array> {
                Ok(self.quantized().dequantize().transpose())
            }
        }
    };
}

quantized_kind!(
    /// A weight in MLX's affine format (2–8 bits, groups of 32, 64 or 128).
    AffineQuantized,
    "affine_quantized"
);
quantized_kind!(
    /// A weight in QLoRA's NF4 (16 normal-float levels, absmax per 64).
    Nf4,
    "nf4"
);
quantized_kind!(
    /// A weight in symmetric int8 with one scale per output channel.
    Int8,
    "int8"
);

impl AffineQuantized {
    /// `w` (`[k, n]`) quantized to `bits` per value in groups of
    /// `group_size` along `k`.
    pub fn quantize(w: &Array, bits: u32, group_size: usize) -> AffineQuantized {
        AffineQuantized::of(w, QuantFormat::affine(bits, group_size))
    }
}

impl Nf4 {
    /// `w` (`[k, n]`) in NF4 along `k`.
    pub fn quantize(w: &Array) -> Nf4 {
        Nf4::of(w, QuantFormat::Nf4)
    }
}

impl Int8 {
    /// `w` (`[k, n]`) in int8, one scale per output channel.
    pub fn quantize(w: &Array) -> Int8 {
        Int8::of(w, QuantFormat::Int8)
    }
}

/// `x @ w` for a quantized `w` of kind `T`, from the packed codes.
fn quantized_matmul_handler<T: ImplicitArray>(
    name: &'static str,
    quantized: fn(&T) -> Quantized,
) -> Handler {
    Handler::new(
        name,
        "matmul",
        [OperandKind::Dense, OperandKind::Implicit(T::KIND)],
        0,
        move |_, operands| {
            let (Some(x), Some(w)) = (operands[0].dense(), operands[1].implicit::<T>()) else {
                return Err(Error::InvalidArgument {
                    op: "matmul".into(),
                    detail: format!("{name} expects a dense array and a {} weight", T::KIND),
                    at: None,
                });
            };
            Ok(quantized_matmul(x, &quantized(&w), true))
        },
    )
}

/// The handlers Kiln registers itself.
fn builtin_handlers() -> Vec<Handler> {
    vec![
        quantized_matmul_handler("matmul_affine_quantized", AffineQuantized::quantized),
        quantized_matmul_handler("matmul_nf4", Nf4::quantized),
        quantized_matmul_handler("matmul_int8", Int8::quantized),
        Handler::new(
            "matmul_low_rank",
            "matmul",
            [OperandKind::Dense, OperandKind::Implicit(LowRank::KIND)],
            0,
            |_, operands| {
                let (Some(x), Some(w)) = (operands[0].dense(), operands[1].implicit::<LowRank>())
                else {
                    return Err(Error::InvalidArgument {
                        op: "matmul".into(),
                        detail: "matmul_low_rank expects a dense array and a low-rank value".into(),
                        at: None,
                    });
                };
                Ok(x.matmul(&w.base) + x.matmul(&w.a).matmul(&w.b))
            },
        ),
    ]
}
