//! What a compiled function tells about itself: the explanation of each
//! cache miss, and the report of each cache entry (graph, passes, guards,
//! symbols, reinplace decisions and buffer plan). All serde-serializable;
//! the playground renders them as they are.

use super::key::CacheKey;
use crate::exec::{Executable, SymbolSource};
use crate::ir::graph::{Graph, GraphNode, ImplicitDecision, Origin, ValueKind};
use crate::ir::passes::PassRecord;
use crate::location::SourceLocation;
use crate::ops::batching::{VmapFallback, VmapMaterialization};
use crate::ops::{ControlCall, ControlKind, FusedArg, Op};
use crate::plan::{Home, PlanMemory, ReinplaceDecision};
use crate::shape::Symbol;
use crate::tree::{DifferenceKind, KeyPath, TreeDef};
use crate::DType;
use serde::{Deserialize, Serialize};
use std::cell::OnceCell;
use std::fmt;
use std::sync::Arc;

/// Why a call missed the cache, against the closest stored key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MissReason {
    /// Nothing was cached yet.
    NeverSeen,
    /// The tree has another structure at `path`.
    TreeStructure {
        /// Where, like `args.layers[2]`.
        path: String,
        /// The stored structure there.
        before: String,
        /// This call's structure there.
        now: String,
    },
    /// A static value or aux datum differs at `path`.
    Static {
        /// Where.
        path: String,
        /// The stored value.
        before: String,
        /// This call's value.
        now: String,
    },
    /// A leaf's shape or dtype differs.
    Aval {
        /// The leaf's path.
        path: String,
        /// The stored aval, like `f32[4,4]`.
        before: String,
        /// This call's aval.
        now: String,
    },
    /// The key names another backend.
    Backend {
        /// The stored backend.
        before: String,
        /// This call's backend.
        now: String,
    },
    /// A shapeless entry matched the key but its trace relied on a condition
    /// this call's sizes break.
    ShapeGuard {
        /// The failed check.
        detail: String,
    },
}

impl fmt::Display for MissReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MissReason::NeverSeen => f.write_str("never seen"),
            MissReason::TreeStructure { path, before, now } => {
                write!(
                    f,
                    "tree structure differs at path {path} (before {before}, now {now})"
                )
            }
            MissReason::Static { path, before, now } => {
                write!(
                    f,
                    "static/aux differs at node {path}: before {before}, now {now}"
                )
            }
            MissReason::Aval { path, before, now } => {
                write!(f, "aval differs at leaf {path}: {before} → {now}")
            }
            MissReason::Backend { before, now } => write!(f, "backend differs: {before} → {now}"),
            MissReason::ShapeGuard { detail } => write!(f, "shapeless guard failed: {detail}"),
        }
    }
}

/// One cache miss: which call, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheMiss {
    /// The call's number (1-based) on this compiled function.
    pub call: u64,
    /// The differences from the closest stored key, most important first.
    pub reasons: Vec<MissReason>,
    /// The entry compared against, if any.
    pub closest_entry: Option<usize>,
}

/// A node of a [`Report`]'s graph.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportNode {
    /// Position in the schedule.
    pub id: usize,
    /// The op with parameters, `input args.a` or `constant`.
    pub op: String,
    /// Operand ids.
    pub inputs: Vec<usize>,
    /// Shape and dtype, like `f32[s0,4]`.
    pub aval: String,
    /// Where the value lives: `slot 2`, `args.x` or `constant`.
    pub home: String,
    /// For an elementwise node, whether it writes in place of an operand
    /// and why each operand was or was not taken.
    pub reinplace: Option<ReinplaceDecision>,
    /// Whether it belongs to a gradient's backward pass.
    pub backward: bool,
    /// The nodes of [`Report::traced`] it computes: one, several once CSE
    /// merged them, all of a fused group's members.
    pub traced: Vec<usize>,
    /// Where the program made it, when the front end said (see
    /// [`crate::at_location`]).
    pub location: Option<SourceLocation>,
    /// For a fused op, its member ops in evaluation order (the last one is
    /// the result); empty for any other node.
    pub group: Vec<GroupStep>,
    /// The `nn` composition that made it (`softmax`, `layer_norm`), if
    /// one did (reports from before it was recorded have none).
    #[serde(default)]
    pub composition: Option<String>,
}

/// One member op of a fused group, as the report shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupStep {
    /// The op with parameters.
    pub op: String,
    /// What it reads.
    pub args: Vec<GroupArg>,
    /// Its shape and dtype.
    pub aval: String,
    /// The nodes of [`Report::traced`] it computes.
    pub traced: Vec<usize>,
    /// Where the program made it.
    pub location: Option<SourceLocation>,
    /// The `nn` composition that made it, if one did.
    #[serde(default)]
    pub composition: Option<String>,
}

/// What a member of a fused group reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "id", rename_all = "snake_case")]
pub enum GroupArg {
    /// A node of the optimized graph (an operand of the fused op).
    Node(usize),
    /// An earlier member of the group, by its position.
    Step(usize),
}

/// A node of the traced graph, before any pass.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracedNode {
    /// Position in the traced graph.
    pub id: usize,
    /// The op with parameters, `input args.a` or `constant`.
    pub op: String,
    /// Operand ids.
    pub inputs: Vec<usize>,
    /// Shape and dtype, like `f32[s0,4]`.
    pub aval: String,
    /// Where the program made it, when the front end said.
    pub location: Option<SourceLocation>,
    /// Whether it belongs to a gradient's backward pass.
    pub backward: bool,
    /// The `nn` composition that made it, if one did.
    #[serde(default)]
    pub composition: Option<String>,
    /// The node of [`Report::nodes`] that computes it, if one still does
    /// (simplification and DCE drop some).
    pub optimized: Option<usize>,
}

/// One value held by a slot, with its lifetime.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotValue {
    /// The value's id.
    pub value: usize,
    /// The step defining it.
    pub def: usize,
    /// The last step reading it (the schedule's length: returned).
    pub last: usize,
}

/// One slot of the buffer plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotReport {
    /// The slot's index.
    pub slot: usize,
    /// Its size for the traced call's shapes, rounded to the slot alignment.
    pub bytes: usize,
    /// Its byte offset in the arena for the traced call's shapes.
    pub offset: usize,
    /// Its size as an expression of the symbols (before rounding).
    pub bytes_expr: String,
    /// The values it holds, in schedule order.
    pub values: Vec<SlotValue>,
}

/// The buffer plan of an entry, as reports show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanReport {
    /// Every slot with its values and their lifetimes.
    pub slots: Vec<SlotReport>,
    /// Peak, lower bound and no-reuse bytes for the traced call's shapes.
    pub memory: PlanMemory,
    /// The donated argument leaves.
    pub donated: Vec<String>,
    /// Elementwise nodes written in place of an operand.
    pub reinplaced: usize,
}

/// A control-flow node (`scan`, `while_loop`, `switch`) and its
/// subgraphs, each planned once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopReport {
    /// Its id in the graph that holds it.
    pub node: usize,
    /// The op with parameters.
    pub op: String,
    /// A scan's iterations for the traced call (`1000`, or `7 (s0)` when
    /// shapeless); `None` for a while loop (known only when it runs) and a
    /// switch.
    pub trip_count: Option<String>,
    /// Its subgraphs: a scan's body; a while loop's condition and body; a
    /// switch's branches.
    pub bodies: Vec<BodyReport>,
}

/// One subgraph of a control-flow node, as planned for every iteration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BodyReport {
    /// `body`, `cond` or `branch k`.
    pub name: String,
    /// Its optimized nodes (inputs named `const[i]`, `carry[i]`, `x[i]`
    /// or `operand[i]`).
    pub nodes: Vec<ReportNode>,
    /// Ids of its results (a loop body's carries first).
    pub outputs: Vec<usize>,
    /// Its plan: one slot assignment reused every iteration.
    pub plan: PlanReport,
    /// For a loop body, how each carry moves between iterations.
    pub carried: Vec<CarriedValue>,
    /// Control-flow nodes inside it.
    pub loops: Vec<LoopReport>,
}

/// How one carry of a loop moves from an iteration to the next.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CarriedValue {
    /// Which carry.
    pub carry: usize,
    /// Its shape and dtype.
    pub aval: String,
    /// It stays in one buffer for the whole loop.
    pub in_place: bool,
    /// How: the node updating it in place, or why it is double-buffered.
    pub detail: String,
}

impl LoopReport {
    /// The most bytes its subgraphs' plans (nested loops included) hold at
    /// once: the largest body's, as one runs at a time.
    pub fn body_peak_bytes(&self) -> usize {
        self.bodies
            .iter()
            .map(|b| {
                b.plan.memory.peak_bytes
                    + b.loops
                        .iter()
                        .map(LoopReport::body_peak_bytes)
                        .sum::<usize>()
            })
            .max()
            .unwrap_or(0)
    }
}

/// What `compile` did for one cache entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The entry's index in its cache.
    pub entry: usize,
    /// Whether dims were symbolic.
    pub shapeless: bool,
    /// The argument tree, rendered.
    pub input_tree: String,
    /// The result tree, rendered.
    pub output_tree: String,
    /// The traced graph before the passes.
    pub traced_nodes: usize,
    /// Its nodes, in trace order.
    pub traced: Vec<TracedNode>,
    /// The optimized graph, in schedule order.
    pub nodes: Vec<ReportNode>,
    /// Ids of the returned values.
    pub outputs: Vec<usize>,
    /// The passes, in order, with what each changed.
    pub passes: Vec<PassRecord>,
    /// Conditions every call of a shapeless entry must satisfy.
    pub guards: Vec<String>,
    /// Where each symbol comes from, like `s0 = args.x.shape[0]`.
    pub symbols: Vec<String>,
    /// Reinplacing and slot planning.
    pub plan: PlanReport,
    /// The forward values a gradient's backward pass reads, saved for it
    /// between the passes; empty without a gradient.
    pub residuals: Vec<Residual>,
    /// Their bytes (for the traced call's shapes).
    pub residual_bytes: usize,
    /// How implicit lowering resolved every op reading an implicit value:
    /// the handler chosen, or the op that forced a materialization.
    #[serde(default)]
    pub implicit: Vec<ImplicitDecision>,
    /// The ops [`crate::vmap`] ran once per example (no batching rule for
    /// their operands), in trace order; empty without vmap.
    #[serde(default)]
    pub vmap_fallbacks: Vec<VmapFallback>,
    /// Every control-flow node with its subgraphs and their plans.
    #[serde(default)]
    pub loops: Vec<LoopReport>,
    /// The implicit values [`crate::vmap`] batched by materializing them,
    /// in trace order; empty without vmap.
    #[serde(default)]
    pub vmap_materialized: Vec<VmapMaterialization>,
}

impl Report {
    /// The planned peak of one call: the arena of [`Report::plan`] plus
    /// every control-flow node's subgraph arenas (a body's plan is made
    /// once and reused by every iteration, so it does not grow with the
    /// trip count).
    pub fn total_peak_bytes(&self) -> usize {
        self.plan.memory.peak_bytes
            + self
                .loops
                .iter()
                .map(LoopReport::body_peak_bytes)
                .sum::<usize>()
    }

    /// The number of implicit values materialized (0 when every op reading
    /// one had a handler).
    pub fn materializations(&self) -> usize {
        self.implicit
            .iter()
            .filter(|d| matches!(d, ImplicitDecision::Materialized { .. }))
            .count()
    }
}

/// A forward value the backward pass reads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Residual {
    /// The value's id in [`Report::nodes`].
    pub node: usize,
    /// The op that computed it, with parameters.
    pub op: String,
    /// Its shape and dtype, like `f32[64,256]`.
    pub aval: String,
    /// Its bytes, for the traced call's shapes.
    pub bytes: usize,
}

/// A snapshot of a compiled function's cache.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CacheInfo {
    /// Number of cached executables.
    pub entries: usize,
    /// Calls served from the cache.
    pub hits: u64,
    /// Calls that traced. Concurrent first calls of one signature may each
    /// trace; all of them count as misses, but only the first to finish
    /// adds an entry and the others are served by it, so `hits + misses`
    /// is the number of calls and `entries` can be fewer than `misses`.
    pub misses: u64,
    /// The most recent misses (at most [`crate::compile::MISS_LOG_CAPACITY`]), oldest first,
    /// each with its explanation; `misses` counts them all.
    pub miss_log: Vec<CacheMiss>,
    /// One report per entry.
    pub reports: Vec<Arc<Report>>,
}

impl CacheInfo {
    /// `2 entries, 5 hits, 2 misses`.
    pub fn summary(&self) -> String {
        format!(
            "{} entries, {} hits, {} misses",
            self.entries, self.hits, self.misses
        )
    }

    /// The most recent miss.
    pub fn last_miss(&self) -> Option<&CacheMiss> {
        self.miss_log.last()
    }
}

/// Compares `key` with every stored key and explains the difference from
/// the closest: same tree structure first, then the fewest differing leaves.
pub(crate) fn explain_miss<'a>(
    call: u64,
    key: &CacheKey,
    stored: impl Iterator<Item = &'a CacheKey>,
) -> CacheMiss {
    // The new key's leaf paths, listed once for all the comparisons (each
    // path is as long as the tree is deep).
    let leaf_paths = OnceCell::new();
    let best = stored
        .enumerate()
        .map(|(i, stored)| (i, differences(stored, key, &leaf_paths)))
        .min_by_key(|(_, reasons)| {
            let structural = reasons
                .iter()
                .any(|r| matches!(r, MissReason::TreeStructure { .. }));
            (structural, reasons.len())
        });
    match best {
        None => CacheMiss {
            call,
            reasons: vec![MissReason::NeverSeen],
            closest_entry: None,
        },
        Some((i, reasons)) => CacheMiss {
            call,
            reasons,
            closest_entry: Some(i),
        },
    }
}

impl CacheKey {
    /// What differs from this key to `later`, as a miss explains it: the
    /// backend, the argument tree (structure, statics, aux data) and each
    /// leaf's signature. The functions are not compared: keys of two
    /// compiled functions compare too.
    ///
    /// ```
    /// use kiln::{compile, Array, DType};
    /// let f = compile(|x: Array| x.exp());
    /// f.call(&Array::ones(&[4], DType::F32))?;
    /// f.call(&Array::ones(&[8], DType::F32))?;
    /// let reasons = f.entry_key(0)?.differences(&f.entry_key(1)?);
    /// assert_eq!(reasons[0].to_string(), "aval differs at leaf args: f32[4] → f32[8]");
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn differences(&self, later: &CacheKey) -> Vec<MissReason> {
        differences(self, later, &OnceCell::new())
    }
}

/// Every difference between a stored key and a new one; `now_paths` caches
/// the new key's leaf paths.
pub(crate) fn differences(
    before: &CacheKey,
    now: &CacheKey,
    now_paths: &OnceCell<Vec<KeyPath>>,
) -> Vec<MissReason> {
    let mut reasons = Vec::new();
    if before.backend != now.backend {
        reasons.push(MissReason::Backend {
            before: before.backend.clone(),
            now: now.backend.clone(),
        });
    }
    if let Some(diff) = before.tree.first_difference(&now.tree) {
        let path = arg_path(&diff.path);
        reasons.push(match diff.kind {
            DifferenceKind::Structure { before, now } => {
                MissReason::TreeStructure { path, before, now }
            }
            DifferenceKind::Static { before, now } => MissReason::Static { path, before, now },
        });
        if reasons
            .iter()
            .any(|r| matches!(r, MissReason::TreeStructure { .. }))
        {
            return reasons;
        }
    }
    let paths = now_paths.get_or_init(|| now.tree.leaf_paths());
    for (i, (b, n)) in before.leaves.iter().zip(&now.leaves).enumerate() {
        if b != n {
            reasons.push(MissReason::Aval {
                path: paths.get(i).map_or_else(|| format!("leaf {i}"), arg_path),
                before: b.to_string(),
                now: n.to_string(),
            });
        }
    }
    reasons
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn build_report(
    shapes: &[Vec<usize>],
    entry: usize,
    shapeless: bool,
    input_tree: &TreeDef,
    output_tree: &TreeDef,
    traced: &Graph,
    passes: Vec<PassRecord>,
    exe: &Executable,
    symbols: &[(Symbol, SymbolSource)],
    leaf_paths: &[KeyPath],
) -> Report {
    let leaf_name = |i: usize| {
        leaf_paths
            .get(i)
            .map_or_else(|| format!("leaf {i}"), arg_path)
    };
    let graph = exe.graph();
    let residuals = residuals_of(graph, shapes);
    let plan_report = plan_report(exe, shapes, &leaf_name);
    let describe = |kind: &ValueKind| match kind {
        ValueKind::Input(i) => format!("input {}", leaf_name(*i)),
        ValueKind::Constant(_) => "constant".to_string(),
        ValueKind::Op(op) => op.describe(),
    };
    let no_origin = Origin::default();
    let origin = |id: usize| graph.origin(id).unwrap_or(&no_origin);
    let mut optimized_of = vec![None; traced.nodes.len()];
    for id in 0..graph.nodes.len() {
        for &t in &origin(id).traced {
            if let Some(slot) = optimized_of.get_mut(t) {
                // A value merged into another keeps its first computer.
                slot.get_or_insert(id);
            }
        }
    }
    Report {
        implicit: graph.implicit.clone(),
        vmap_fallbacks: Vec::new(),
        vmap_materialized: Vec::new(),
        entry,
        shapeless,
        input_tree: input_tree.to_string(),
        output_tree: output_tree.to_string(),
        traced_nodes: traced.nodes.len(),
        traced: traced
            .nodes
            .iter()
            .enumerate()
            .map(|(id, node)| TracedNode {
                id,
                op: describe(&node.kind),
                inputs: node.inputs.to_vec(),
                aval: node.aval.to_string(),
                location: traced.origin(id).and_then(|o| o.location),
                composition: traced
                    .origin(id)
                    .and_then(|o| o.composition)
                    .map(str::to_string),
                backward: traced.is_backward(id),
                optimized: optimized_of[id],
            })
            .collect(),
        nodes: report_nodes(exe, traced, &leaf_name),
        loops: loop_reports(exe, shapes, traced),
        outputs: graph.outputs.clone(),
        passes,
        guards: graph
            .guards
            .iter()
            .map(|g| format!("{} (from {})", g.condition, g.op))
            .collect(),
        symbols: symbols
            .iter()
            .map(|(s, src)| format!("{s} = {}.shape[{}]", leaf_name(src.leaf), src.axis))
            .collect(),
        plan: plan_report,
        residual_bytes: residuals.iter().map(|r| r.bytes).sum(),
        residuals,
    }
}

/// The plan of `exe` for values of `shapes`: its slots with their values
/// lifetimes, its memory figures, donated leaves (named by `leaf_name`)
/// and reinplaced count.
fn plan_report(
    exe: &Executable,
    shapes: &[Vec<usize>],
    leaf_name: &dyn Fn(usize) -> String,
) -> PlanReport {
    let (graph, plan) = (exe.graph(), exe.plan());
    let arena = plan.arena(graph, shapes, DType::size_bytes);
    PlanReport {
        slots: (0..plan.num_slots())
            .map(|slot| SlotReport {
                slot,
                bytes: arena.bytes[slot],
                offset: arena.offsets[slot],
                bytes_expr: plan.slot_bytes_expr(graph, slot),
                values: plan
                    .slot_values(slot)
                    .iter()
                    .map(|&value| {
                        let life = plan.lifetime(value);
                        SlotValue {
                            value,
                            def: life.def,
                            last: life.last,
                        }
                    })
                    .collect(),
            })
            .collect(),
        memory: plan.memory(graph, shapes),
        donated: plan
            .donated()
            .iter()
            .enumerate()
            .filter(|(_, &d)| d)
            .map(|(i, _)| leaf_name(i))
            .collect(),
        reinplaced: plan
            .decisions()
            .iter()
            .filter(|d| d.target().is_some())
            .count(),
    }
}

/// The nodes of `exe`'s graph as the report shows them; `traced` is the
/// graph before the passes (for fused groups' members), inputs are named
/// by `leaf_name`.
fn report_nodes(
    exe: &Executable,
    traced: &Graph,
    leaf_name: &dyn Fn(usize) -> String,
) -> Vec<ReportNode> {
    let (graph, plan) = (exe.graph(), exe.plan());
    let mut decisions: Vec<Option<ReinplaceDecision>> = vec![None; graph.nodes.len()];
    for decision in plan.decisions() {
        decisions[decision.node] = Some(decision.clone());
    }
    let no_origin = Origin::default();
    let origin = |id: usize| graph.origin(id).unwrap_or(&no_origin);
    graph
        .nodes
        .iter()
        .enumerate()
        .map(|(id, node)| ReportNode {
            id,
            op: match &node.kind {
                ValueKind::Input(i) => format!("input {}", leaf_name(*i)),
                ValueKind::Constant(_) => "constant".to_string(),
                ValueKind::Op(op) => op.describe(),
            },
            traced: origin(id).traced.to_vec(),
            location: origin(id).location,
            composition: origin(id).composition.map(str::to_string),
            group: group_steps(node, origin(id), traced),
            inputs: node.inputs.to_vec(),
            aval: node.aval.to_string(),
            home: match plan.home(id) {
                Home::Slot(s) => format!("slot {s}"),
                Home::Input(i) => leaf_name(i),
                Home::Constant => "constant".to_string(),
            },
            reinplace: decisions[id].take(),
            backward: graph.is_backward(id),
        })
        .collect()
}

/// Every control-flow node of `exe` (for values of `shapes`) with its
/// subgraphs' reports; `traced` is the graph before the passes.
fn loop_reports(exe: &Executable, shapes: &[Vec<usize>], traced: &Graph) -> Vec<LoopReport> {
    let graph = exe.graph();
    let mut loops = Vec::new();
    for (v, node) in graph.nodes.iter().enumerate() {
        let ValueKind::Op(Op::Control(call)) = &node.kind else {
            continue;
        };
        // The same node before the passes holds the unoptimized bodies,
        // whose values the optimized bodies' fused groups name.
        let traced_call =
            graph
                .origin(v)
                .and_then(|o| o.traced.first())
                .and_then(|&t| match &traced.nodes.get(t)?.kind {
                    ValueKind::Op(Op::Control(c)) => Some(c.clone()),
                    _ => None,
                });
        let operand_shape = |position: usize| &shapes[node.inputs[position]];
        let trip_count = match &call.kind {
            ControlKind::Scan { length, .. } => Some(match length.known() {
                Some(n) => n.to_string(),
                None => call
                    .subgraph_inputs(0)
                    .iter()
                    .find(|i| i.sliced)
                    .and_then(|i| operand_shape(i.operand).first())
                    .map_or_else(|| length.to_string(), |n| format!("{n} ({length})")),
            }),
            _ => None,
        };
        let bodies = exe
            .bodies(v)
            .iter()
            .enumerate()
            .map(|(k, body)| {
                let inputs = call.subgraph_inputs(k);
                let body_shapes: Vec<&[usize]> = inputs
                    .iter()
                    .map(|i| {
                        let shape = &operand_shape(i.operand)[..];
                        if i.sliced {
                            shape.get(1..).unwrap_or(&[])
                        } else {
                            shape
                        }
                    })
                    .collect();
                let resolved = body
                    .resolve_shapes(&body_shapes)
                    .map(|s| s.into_owned())
                    .unwrap_or_else(|_| body.representative_shapes(&body_shapes));
                let carries = call.carry_operands();
                let input_name = |i: usize| {
                    let operand = inputs.get(i).map_or(0, |input| input.operand);
                    if inputs.get(i).is_some_and(|input| input.sliced) {
                        format!("x[{}]", operand - carries.end)
                    } else if carries.contains(&operand) {
                        match call.kind {
                            ControlKind::Switch => format!("operand[{}]", operand - carries.start),
                            _ => format!("carry[{}]", operand - carries.start),
                        }
                    } else {
                        format!("const[{}]", operand - call.first_const())
                    }
                };
                let traced_body = traced_call
                    .as_ref()
                    .and_then(|c| c.graphs().get(k).cloned())
                    .unwrap_or_default();
                BodyReport {
                    name: match (&call.kind, k) {
                        (ControlKind::While, 0) => "cond".to_string(),
                        (ControlKind::Switch, b) => format!("branch {b}"),
                        _ => "body".to_string(),
                    },
                    nodes: report_nodes(body, &traced_body, &input_name),
                    outputs: body.graph().outputs.clone(),
                    plan: plan_report(body, &resolved, &input_name),
                    carried: carried_values(call, k, body),
                    loops: loop_reports(body, &resolved, &traced_body),
                }
            })
            .collect();
        loops.push(LoopReport {
            node: v,
            op: call.describe(),
            trip_count,
            bodies,
        });
    }
    loops
}

/// How each carry of a loop body (subgraph `k` of `call`) moves between
/// iterations: in one buffer when the body writes the new value over the
/// old one, else double-buffered, with the reason.
fn carried_values(call: &ControlCall, k: usize, body: &Executable) -> Vec<CarriedValue> {
    let is_loop_body = match call.kind {
        ControlKind::Scan { .. } => true,
        ControlKind::While => k == 1,
        ControlKind::Switch => false,
    };
    if !is_loop_body {
        return Vec::new();
    }
    let (graph, plan) = (body.graph(), body.plan());
    (0..call.num_carry)
        .map(|c| {
            // A loop body reads its consts, then its carries.
            let input = call.num_consts + c;
            let out = graph.outputs[c];
            let node = &graph.nodes[out];
            let name = |v: usize| match &graph.nodes[v].kind {
                ValueKind::Op(op) => format!("%{v} `{}`", op.name()),
                _ => format!("%{v}"),
            };
            let (in_place, detail) = if matches!(node.kind, ValueKind::Input(i) if i == input) {
                (true, "passed through unchanged".to_string())
            } else if plan.home(out) == Home::Input(input) {
                (true, format!("updated in place by {}", name(out)))
            } else {
                let refusal = plan
                    .decisions()
                    .iter()
                    .find(|d| d.node == out)
                    .and_then(|d| d.operands.iter().find_map(|o| o.refusal.clone()));
                let detail = match refusal {
                    Some(r) => format!(
                        "double-buffered: {} could not write over its operand: {r}",
                        name(out)
                    ),
                    None => format!("double-buffered: {} computes into a new buffer", name(out)),
                };
                (false, detail)
            };
            CarriedValue {
                carry: c,
                aval: node.aval.to_string(),
                in_place,
                detail,
            }
        })
        .collect()
}

/// The members of fused node `node` (none for another node), with the
/// traced values each computes (from `origin`) and their avals and
/// locations (from the `traced` graph).
fn group_steps(node: &GraphNode, origin: &Origin, traced: &Graph) -> Vec<GroupStep> {
    let ValueKind::Op(Op::Fused(kernel)) = &node.kind else {
        return Vec::new();
    };
    kernel
        .steps()
        .iter()
        .enumerate()
        .map(|(k, step)| {
            let computes: Vec<usize> = origin.steps.get(k).map(|t| t.to_vec()).unwrap_or_default();
            let first = computes.first().and_then(|&t| traced.nodes.get(t));
            GroupStep {
                op: step.op.describe(),
                args: step
                    .args
                    .iter()
                    .map(|arg| match *arg {
                        FusedArg::Input(i) => GroupArg::Node(node.inputs[i]),
                        FusedArg::Step(s) => GroupArg::Step(s),
                    })
                    .collect(),
                aval: first.map_or_else(|| node.aval.to_string(), |n| n.aval.to_string()),
                location: computes
                    .iter()
                    .find_map(|&t| traced.origin(t).and_then(|o| o.location)),
                composition: computes
                    .iter()
                    .find_map(|&t| traced.origin(t).and_then(|o| o.composition))
                    .map(str::to_string),
                traced: computes,
            }
        })
        .collect()
}

/// The computed forward values of `graph` that a backward value reads.
fn residuals_of(graph: &Graph, shapes: &[Vec<usize>]) -> Vec<Residual> {
    let mut read_by_backward = vec![false; graph.nodes.len()];
    for (v, node) in graph.nodes.iter().enumerate() {
        if graph.is_backward(v) {
            for &i in &node.inputs {
                read_by_backward[i] = true;
            }
        }
    }
    graph
        .nodes
        .iter()
        .enumerate()
        .filter(|(v, node)| {
            read_by_backward[*v] && !graph.is_backward(*v) && matches!(node.kind, ValueKind::Op(_))
        })
        .map(|(v, node)| Residual {
            node: v,
            op: match &node.kind {
                ValueKind::Op(op) => op.describe(),
                _ => String::new(),
            },
            aval: node.aval.to_string(),
            bytes: shapes[v].iter().product::<usize>() * node.aval.dtype.size_bytes(),
        })
        .collect()
}

/// Renders a leaf or node path rooted at the arguments: `args.layers[2].w`.
pub(crate) fn arg_path(path: &KeyPath) -> String {
    let rendered = path.to_string();
    if path.is_empty() {
        "args".to_string()
    } else if rendered.starts_with('[') {
        format!("args{rendered}")
    } else {
        format!("args.{rendered}")
    }
}

/// How many reinplace decisions of each kind a summary lists before it
/// only counts the rest.
const LISTED_DECISIONS: usize = 6;

/// A printable summary: the signature, node counts, passes, the planned
/// peak beside its lower bound, donated leaves, what was reinplaced and
/// what was refused (with reasons), guards and symbols, and what
/// gradients, vmap and implicit lowering recorded, when they did.
///
/// ```
/// use kiln::{compile, Array};
/// let f = compile(|x: Array| (x.exp() + 1.0).tanh()).donate(["args"]);
/// f.call_owned(Array::from_vec(vec![0.0f32; 4], &[4])?)?;
/// let text = f.cache().reports[0].to_string();
/// assert!(text.contains("donated: args"), "{text}");
/// # Ok::<(), kiln::Error>(())
/// ```
/// `text` cut to its first [`SUMMARY_WIDTH`] characters with `…` (a
/// model's tree structure runs to thousands).
fn abridged(text: &str) -> String {
    match text.char_indices().nth(SUMMARY_WIDTH) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// `items` in full when there are at most [`SUMMARY_ITEMS`], else how many
/// and the first few.
fn abridged_list(items: &[String]) -> String {
    if items.len() <= SUMMARY_ITEMS {
        return list_or_none(items);
    }
    let shown = SUMMARY_ITEMS / 2;
    format!(
        "{} leaves: {}, … and {} more",
        items.len(),
        items[..shown].join(", "),
        items.len() - shown
    )
}

/// The most items a summary line lists one by one.
const SUMMARY_ITEMS: usize = 8;

/// The longest tree structure a summary line writes in full.
const SUMMARY_WIDTH: usize = 160;

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shapeless = if self.shapeless { " (shapeless)" } else { "" };
        writeln!(
            f,
            "entry {}{shapeless}: {} -> {}",
            self.entry,
            abridged(&self.input_tree),
            abridged(&self.output_tree)
        )?;
        writeln!(
            f,
            "  nodes: {} traced, {} after the passes",
            self.traced_nodes,
            self.nodes.len()
        )?;
        let passes: Vec<String> = self
            .passes
            .iter()
            .map(|p| format!("{} ({})", p.pass, p.changed))
            .collect();
        writeln!(f, "  passes: {}", list_or_none(&passes))?;
        let memory = &self.plan.memory;
        writeln!(
            f,
            "  memory: peak {} bytes planned, lower bound {}, {} without reuse, {} slots",
            memory.peak_bytes,
            memory.lower_bound_bytes,
            memory.no_reuse_bytes,
            self.plan.slots.len()
        )?;
        if self.total_peak_bytes() != memory.peak_bytes {
            writeln!(
                f,
                "  with control-flow bodies: peak {} bytes",
                self.total_peak_bytes()
            )?;
        }
        writeln!(f, "  donated: {}", abridged_list(&self.plan.donated))?;
        self.fmt_reinplace(f)?;
        if !self.guards.is_empty() {
            writeln!(f, "  guards: {}", self.guards.join(", "))?;
        }
        if !self.symbols.is_empty() {
            writeln!(f, "  symbols: {}", self.symbols.join(", "))?;
        }
        if !self.residuals.is_empty() {
            writeln!(
                f,
                "  residuals: {} values, {} bytes",
                self.residuals.len(),
                self.residual_bytes
            )?;
        }
        if !self.loops.is_empty() {
            writeln!(f, "  control flow: {} nodes", self.loops.len())?;
        }
        if !self.implicit.is_empty() {
            writeln!(
                f,
                "  implicit values: {} decisions, {} materialized",
                self.implicit.len(),
                self.materializations()
            )?;
        }
        if !self.vmap_fallbacks.is_empty() || !self.vmap_materialized.is_empty() {
            writeln!(
                f,
                "  vmap: {} per-example fallbacks, {} materialized implicit values",
                self.vmap_fallbacks.len(),
                self.vmap_materialized.len()
            )?;
        }
        Ok(())
    }
}

impl Report {
    /// The reinplace lines of the summary: taken, then refused, each
    /// counted and the first [`LISTED_DECISIONS`] listed.
    fn fmt_reinplace(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let decisions: Vec<&ReinplaceDecision> = self
            .nodes
            .iter()
            .filter_map(|n| n.reinplace.as_ref())
            .collect();
        let (taken, refused): (Vec<&ReinplaceDecision>, Vec<&ReinplaceDecision>) =
            decisions.iter().partition(|d| d.target().is_some());
        for (label, group) in [("reinplaced", &taken), ("refused", &refused)] {
            writeln!(
                f,
                "  {label}: {} of {} elementwise nodes",
                group.len(),
                decisions.len()
            )?;
            for decision in group.iter().take(LISTED_DECISIONS) {
                writeln!(
                    f,
                    "    %{} {}: {}",
                    decision.node,
                    decision.op,
                    decision.summary()
                )?;
            }
            if group.len() > LISTED_DECISIONS {
                writeln!(f, "    … and {} more", group.len() - LISTED_DECISIONS)?;
            }
        }
        Ok(())
    }
}

/// `items` joined by commas, or `none`.
fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use crate::{compile, Array};

    #[test]
    fn display_summarizes_nodes_memory_donation_and_reinplace_decisions() {
        let f = compile(|(x, y): (Array, Array)| {
            let e = x.exp();
            (&e + &y) * &e
        })
        .donate(["args[0]"])
        .fusion(false);
        let x = Array::from_vec(vec![0.0f32; 4], &[4]).unwrap();
        let y = Array::from_vec(vec![1.0f32; 4], &[4]).unwrap();
        f.call_owned((x, y)).unwrap();
        let report = f.cache().reports[0].clone();
        let text = report.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "entry 0: (*, *) -> *");
        let nodes = format!(
            "  nodes: {} traced, {} after the passes",
            report.traced_nodes,
            report.nodes.len()
        );
        assert_eq!(lines[1], nodes);
        let memory = &report.plan.memory;
        assert!(
            text.contains(&format!(
                "memory: peak {} bytes planned, lower bound {}",
                memory.peak_bytes, memory.lower_bound_bytes
            )),
            "{text}"
        );
        assert!(text.contains("  donated: args[0]\n"), "{text}");
        let decisions: Vec<_> = report
            .nodes
            .iter()
            .filter_map(|n| n.reinplace.as_ref())
            .collect();
        let taken = decisions.iter().filter(|d| d.target().is_some()).count();
        assert!(taken > 0, "{text}");
        assert!(
            text.contains(&format!(
                "  reinplaced: {taken} of {} elementwise nodes",
                decisions.len()
            )),
            "{text}"
        );
        assert!(text.contains("exp: in place of %0"), "{text}");
        let refused = decisions.len() - taken;
        assert!(refused > 0, "{text}");
        assert!(
            text.contains(&format!("  refused: {refused} of {}", decisions.len())),
            "{text}"
        );
        assert!(text.contains("read later by"), "{text}");
        assert!(!text.contains("guards:"), "{text}");
    }

    #[test]
    fn display_of_a_shapeless_entry_lists_its_symbols() {
        let f = compile(|x: Array| x.exp()).shapeless();
        f.call(&Array::from_vec(vec![0.0f32; 3], &[3]).unwrap())
            .unwrap();
        let report = f.cache().reports[0].clone();
        let text = report.to_string();
        assert!(text.starts_with("entry 0 (shapeless): "), "{text}");
        assert!(
            text.contains(&format!("  symbols: {}", report.symbols.join(", "))),
            "{text}"
        );
        assert!(!report.symbols.is_empty(), "{text}");
    }
}
