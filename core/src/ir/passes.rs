//! The passes that rewrite a graph: simplify, constant folding, CSE and DCE
//! in one forward sweep, then (for executors that read strided operands)
//! transposed operands, then elementwise fusion.

use crate::error::Result;
use crate::hash::{fast_map, FastHasher, FastMap};
use crate::ir::graph::{Graph, GraphNode, Literal, Operands, Origin, ValueId, ValueKind};
use crate::ops::{ControlCall, ControlKind, FusedArg, FusedKernel, FusedStep, Op};
use crate::shape::Aval;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// What one pass did, for the [`crate::Report`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassRecord {
    /// The pass: `simplify`, `constant_folding`, `cse`, `dce`,
    /// `transposed_operands`, `fuse`.
    pub pass: String,
    /// How many values it removed, folded or merged.
    pub changed: usize,
}

/// Constant-folded results may grow at most to this many elements beyond
/// their operands: folding `broadcast_to(0, [4096, 4096])` would bake a
/// large buffer into the executable.
const FOLD_GROWTH_LIMIT: usize = 1024;

/// Which optional passes [`optimize_lowered`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Passes {
    /// Fuse trees of elementwise ops into single ops.
    pub fuse: bool,
    /// Let matmuls read operands transposed in place ([`transposed_operands`]).
    /// `compile` sets it from its backend, eager evaluation from the
    /// default device ([`crate::Backend::reads_transposed_operands`]), so
    /// both run the same products: only the CPU executor has a kernel for
    /// [`Op::TransposedMatmul`], so it is off by default.
    pub transposed_operands: bool,
}

impl Default for Passes {
    fn default() -> Passes {
        Passes {
            fuse: true,
            transposed_operands: false,
        }
    }
}

/// Runs simplify, constant folding and CSE in one forward sweep, then
/// DCE, then (if enabled) transposed operands and elementwise fusion, on a
/// graph whose implicit
/// values are already lowered (the whole pipeline, lowering first, is
/// [`crate::transform::implicit::optimize`]).
pub fn optimize_lowered(graph: &Graph, passes: Passes) -> Result<(Graph, Vec<PassRecord>)> {
    let mut out = Graph {
        num_inputs: graph.num_inputs,
        guards: graph.guards.clone(),
        implicit: graph.implicit.clone(),
        ..Graph::default()
    };
    let mut remap: Vec<ValueId> = Vec::with_capacity(graph.nodes.len());
    // CSE table: node hash → the emitted values with that hash, compared
    // in place against `out.nodes` so no node is copied into the table.
    let mut seen: FastMap<u64, SmallVec<[ValueId; 1]>> = fast_map(graph.nodes.len());
    let (mut simplified, mut folded, mut merged) = (0, 0, 0);
    let no_origin = Origin::default();
    for node in &graph.nodes {
        let mut inputs: Operands = node.inputs.iter().map(|&i| remap[i]).collect();
        let backward = graph.is_backward(remap.len());
        let origin = graph.origin(remap.len()).unwrap_or(&no_origin);
        if let ValueKind::Op(Op::Reshape(_)) = &node.kind {
            // A reshape of a reshape reads the first one's operand (row-major
            // order is kept by both): vmap's batching rules make such pairs.
            let source = &out.nodes[inputs[0]];
            if let ValueKind::Op(Op::Reshape(_)) = &source.kind {
                inputs[0] = source.inputs[0];
                simplified += 1;
            }
        }
        if let ValueKind::Op(op) = &node.kind {
            if let Some(&alias) = inputs
                .first()
                .filter(|_| is_identity(op, &node.aval, &out, &inputs))
            {
                simplified += 1;
                absorb_origin(&mut out, alias, origin);
                remap.push(alias);
                continue;
            }
        }
        let kind = match &node.kind {
            ValueKind::Op(Op::Control(call)) => {
                ValueKind::Op(Op::Control(Arc::new(optimize_bodies(call, passes)?)))
            }
            kind => kind.clone(),
        };
        let mut candidate = GraphNode {
            kind,
            inputs,
            aval: node.aval.clone(),
        };
        if let Some(literal) = fold(&candidate, &out)? {
            folded += 1;
            candidate = GraphNode {
                kind: ValueKind::Constant(literal),
                inputs: Operands::new(),
                aval: node.aval.clone(),
            };
        }
        let hash = {
            let mut state = FastHasher::default();
            candidate.hash(&mut state);
            state.finish()
        };
        let same = seen.entry(hash).or_default();
        match same.iter().copied().find(|&id| out.nodes[id] == candidate) {
            Some(existing) => {
                merged += 1;
                // A value both passes compute is computed by the forward one.
                if !backward && out.is_backward(existing) {
                    out.backward[existing] = false;
                }
                absorb_origin(&mut out, existing, origin);
                remap.push(existing);
            }
            None => {
                let id = out.nodes.len();
                same.push(id);
                out.push_node(candidate, backward, origin.clone());
                remap.push(id);
            }
        }
    }
    out.outputs = graph.outputs.iter().map(|&o| remap[o]).collect();
    let (out, scans_merged) = merge_scans(out);
    let (out, removed) = dce(out);
    let mut records = vec![
        PassRecord {
            pass: "simplify".into(),
            changed: simplified,
        },
        PassRecord {
            pass: "constant_folding".into(),
            changed: folded,
        },
        PassRecord {
            pass: "cse".into(),
            changed: merged,
        },
        PassRecord {
            pass: "merge_scans".into(),
            changed: scans_merged,
        },
        PassRecord {
            pass: "dce".into(),
            changed: removed,
        },
    ];
    let out = if passes.transposed_operands {
        let (out, rewired) = transposed_operands(out);
        records.push(PassRecord {
            pass: "transposed_operands".into(),
            changed: rewired,
        });
        out
    } else {
        out
    };
    if !passes.fuse {
        return Ok((out, records));
    }
    let (out, fused) = fuse(out)?;
    records.push(PassRecord {
        pass: "fuse".into(),
        changed: fused,
    });
    Ok((out, records))
}

/// Merges scans that run the same body over the same operands where one
/// only has more results (the residual scan of a gradient is the primal
/// scan stacking its carries too): the earlier node takes the op with more
/// results and the later one's results read it, so the loop runs once;
/// DCE then drops the later node. Returns the graph and the merges.
pub fn merge_scans(mut graph: Graph) -> (Graph, usize) {
    let scans: Vec<ValueId> = (0..graph.nodes.len())
        .filter(|&v| {
            matches!(&graph.nodes[v].kind, ValueKind::Op(Op::Control(c)) if matches!(c.kind, ControlKind::Scan { .. }))
        })
        .collect();
    let call = |graph: &Graph, v: ValueId| match &graph.nodes[v].kind {
        ValueKind::Op(Op::Control(c)) => Some(c.clone()),
        _ => None,
    };
    let mut merged = 0;
    let mut gone: Vec<ValueId> = Vec::new();
    for (i, &first) in scans.iter().enumerate() {
        for &second in &scans[i + 1..] {
            if gone.contains(&first) || gone.contains(&second) {
                continue;
            }
            let (Some(a), Some(b)) = (call(&graph, first), call(&graph, second)) else {
                continue;
            };
            if graph.nodes[first].inputs != graph.nodes[second].inputs {
                continue;
            }
            let keep = if extends(&b, &a) {
                b
            } else if extends(&a, &b) {
                a
            } else {
                continue;
            };
            graph.nodes[first].kind = ValueKind::Op(Op::Control(keep));
            for node in &mut graph.nodes {
                if matches!(node.kind, ValueKind::Op(Op::Get { .. })) && node.inputs[0] == second {
                    node.inputs[0] = first;
                }
            }
            gone.push(second);
            merged += 1;
        }
    }
    (graph, merged)
}

/// True when `longer` runs `shorter`'s scan and only returns more results.
fn extends(longer: &ControlCall, shorter: &ControlCall) -> bool {
    let (lg, sg) = (longer.graphs(), shorter.graphs());
    longer.kind == shorter.kind
        && longer.num_consts == shorter.num_consts
        && longer.num_carry == shorter.num_carry
        && longer.operands == shorter.operands
        && longer.results.starts_with(&shorter.results)
        && lg.len() == 1
        && sg.len() == 1
        && lg[0].nodes == sg[0].nodes
        && lg[0].guards == sg[0].guards
        && lg[0].outputs.starts_with(&sg[0].outputs)
}

/// `call` with every subgraph optimized by the same passes: bodies are
/// simplified, CSE'd, DCE'd and fused like any graph (their inputs stay,
/// since the node's operands are fixed).
fn optimize_bodies(call: &ControlCall, passes: Passes) -> Result<ControlCall> {
    let graphs = call
        .graphs()
        .iter()
        .map(|g| optimize_lowered(g, passes).map(|(g, _)| g))
        .collect::<Result<Vec<_>>>()?;
    Ok(call.with_graphs(graphs))
}

/// Makes each matmul read a permute of its operand's last two axes in
/// place: the product becomes an [`Op::TransposedMatmul`] of the permute's
/// operand, so the transpose is never materialized (the permute goes when
/// nothing else reads it). Autodiff's `g @ wᵀ` and `xᵀ @ g` are such
/// products. Returns the graph and how many operands it rewired.
///
/// The permuted operand is now read by the product, later than by the
/// permute, so its slot lives longer: the plan, made afterwards, sees it.
pub fn transposed_operands(mut graph: Graph) -> (Graph, usize) {
    let mut rewired = 0;
    for v in 0..graph.nodes.len() {
        let mut transposed = match &graph.nodes[v].kind {
            ValueKind::Op(Op::Matmul) => [false, false],
            ValueKind::Op(Op::TransposedMatmul { transposed }) => *transposed,
            _ => continue,
        };
        let mut inputs = graph.nodes[v].inputs.clone();
        for (operand, swapped) in inputs.iter_mut().zip(&mut transposed) {
            // A permute of a permute swaps back.
            while let Some(source) = last_two_swapped(&graph, *operand) {
                let origin = graph.origin(*operand).cloned().unwrap_or_default();
                absorb_origin(&mut graph, v, &origin);
                *operand = source;
                *swapped = !*swapped;
                rewired += 1;
            }
        }
        let node = &mut graph.nodes[v];
        node.inputs = inputs;
        node.kind = ValueKind::Op(product_op(transposed));
    }
    rewired += sink_transposed_consts(&mut graph);
    if rewired == 0 {
        return (graph, 0);
    }
    (dce(graph).0, rewired)
}

/// Passes a loop's or branch's captured transposes untransposed: where a
/// control node's captured operand is a swap of its source's last two axes
/// and every subgraph reads it only as an operand of matrix products, the
/// node takes the source and those products read it transposed in place.
/// The trace hoists a body's `x @ wᵀ` of a weight `w` made outside it as
/// the transpose outside and the product inside; without this each call
/// would copy every such weight transposed before the loop runs. Returns
/// how many operands it rewired.
fn sink_transposed_consts(graph: &mut Graph) -> usize {
    let mut rewired = 0;
    for v in 0..graph.nodes.len() {
        let ValueKind::Op(Op::Control(call)) = &graph.nodes[v].kind else {
            continue;
        };
        let mut call = (**call).clone();
        let mut bodies = call.graphs().to_vec();
        let mut changed = false;
        for j in 0..call.num_consts {
            let operand = call.first_const() + j;
            let Some(source) = last_two_swapped(graph, graph.nodes[v].inputs[operand]) else {
                continue;
            };
            let Some(rewrites) = bodies
                .iter()
                .map(|body| products_reading_input(body, j))
                .collect::<Option<Vec<_>>>()
            else {
                continue;
            };
            for (body, (input, products)) in bodies.iter_mut().zip(rewrites) {
                body.nodes[input].aval = graph.nodes[source].aval.clone();
                for (product, side) in products {
                    flip_operand(&mut body.nodes[product], side);
                }
            }
            call.operands[operand] = graph.nodes[source].aval.clone();
            graph.nodes[v].inputs[operand] = source;
            changed = true;
            rewired += 1;
        }
        if changed {
            graph.nodes[v].kind = ValueKind::Op(Op::Control(Arc::new(call.with_graphs(bodies))));
        }
    }
    rewired
}

/// The node of subgraph input `index`.
fn input_node(body: &Graph, index: usize) -> Option<ValueId> {
    body.nodes
        .iter()
        .position(|n| matches!(n.kind, ValueKind::Input(i) if i == index))
}

/// A subgraph input's node and the products reading it, each with the
/// operand side (0 or 1) it is on.
type ProductReaders = (ValueId, Vec<(ValueId, usize)>);

/// Subgraph input `index` and the products reading it, when nothing else
/// reads it (not an output either).
fn products_reading_input(body: &Graph, index: usize) -> Option<ProductReaders> {
    let input = input_node(body, index)?;
    if body.outputs.contains(&input) {
        return None;
    }
    let mut products = Vec::new();
    for (v, node) in body.nodes.iter().enumerate() {
        let sides: SmallVec<[usize; 2]> = (0..node.inputs.len())
            .filter(|&i| node.inputs[i] == input)
            .collect();
        if sides.is_empty() {
            continue;
        }
        let is_product = matches!(
            node.kind,
            ValueKind::Op(Op::Matmul | Op::TransposedMatmul { .. })
        );
        if !is_product || sides.len() != 1 || sides[0] > 1 {
            return None;
        }
        products.push((v, sides[0]));
    }
    Some((input, products))
}

/// `node`, a product, reading operand `side` transposed the other way.
fn flip_operand(node: &mut GraphNode, side: usize) {
    let mut transposed = match &node.kind {
        ValueKind::Op(Op::TransposedMatmul { transposed }) => *transposed,
        _ => [false, false],
    };
    transposed[side] = !transposed[side];
    node.kind = ValueKind::Op(product_op(transposed));
}

/// The product reading its operands transposed as `transposed` says: a
/// plain [`Op::Matmul`] when it reads neither.
fn product_op(transposed: [bool; 2]) -> Op {
    if transposed == [false, false] {
        Op::Matmul
    } else {
        Op::TransposedMatmul { transposed }
    }
}

/// The operand of `v` when `v` permutes only its last two axes.
fn last_two_swapped(graph: &Graph, v: ValueId) -> Option<ValueId> {
    let node = &graph.nodes[v];
    let ValueKind::Op(Op::Permute(perm)) = &node.kind else {
        return None;
    };
    let rank = perm.len();
    let swaps_last_two = rank >= 2
        && perm[rank - 2] == rank - 1
        && perm[rank - 1] == rank - 2
        && perm[..rank - 2].iter().enumerate().all(|(i, &p)| i == p);
    swaps_last_two.then_some(node.inputs[0])
}

/// Groups elementwise ops into [`Op::Fused`] ops; returns the graph and how
/// many ops were absorbed into a group.
///
/// Walking the schedule backwards, an elementwise value joins the group of
/// its consumers when all of them are in one elementwise group, it is not a
/// graph output, and its shape provably equals the group's. Every member but
/// the root is then read only inside its group, so groups are trees with one
/// output (operands shared inside a group are fine) and never form a cycle
/// with the rest of the graph.
pub fn fuse(graph: Graph) -> Result<(Graph, usize)> {
    let n = graph.nodes.len();
    let facts = graph.dim_facts();
    let fusible = |v: ValueId| matches!(&graph.nodes[v].kind, ValueKind::Op(op) if op.is_elementwise() && !matches!(op, Op::Fused(_)));
    // Consumers of each value, deduplicated, in one flat table (CSR).
    let mut first_consumer = vec![0usize; n + 1];
    let distinct_inputs = |v: usize| {
        let inputs = &graph.nodes[v].inputs;
        (0..inputs.len())
            .filter(move |&k| !inputs[..k].contains(&inputs[k]))
            .map(move |k| inputs[k])
    };
    for v in 0..n {
        for i in distinct_inputs(v) {
            first_consumer[i + 1] += 1;
        }
    }
    for v in 0..n {
        first_consumer[v + 1] += first_consumer[v];
    }
    let mut consumer_table = vec![0usize; first_consumer[n]];
    let mut filled = first_consumer.clone();
    for v in 0..n {
        for i in distinct_inputs(v) {
            consumer_table[filled[i]] = v;
            filled[i] += 1;
        }
    }
    let consumers = |v: usize| &consumer_table[first_consumer[v]..first_consumer[v + 1]];
    let mut is_output = vec![false; n];
    for &o in &graph.outputs {
        is_output[o] = true;
    }
    let mut root: Vec<ValueId> = (0..n).collect();
    let mut group_size = vec![1usize; n];
    for v in (0..n).rev() {
        if !fusible(v) || is_output[v] {
            continue;
        }
        let Some(&first) = consumers(v).first() else {
            continue;
        };
        let group = root[first];
        if fusible(group)
            && consumers(v).iter().all(|&c| root[c] == group)
            && facts.shapes_equal(&graph.nodes[v].aval.shape, &graph.nodes[group].aval.shape)
        {
            root[v] = group;
            group_size[group] += 1;
        }
    }
    let mut members: Vec<Vec<ValueId>> = vec![Vec::new(); n];
    for v in 0..n {
        if group_size[root[v]] > 1 {
            members[root[v]].push(v);
        }
    }
    let mut out = Graph {
        num_inputs: graph.num_inputs,
        guards: graph.guards.clone(),
        implicit: graph.implicit.clone(),
        ..Graph::default()
    };
    let origin_of = |v: ValueId| graph.origin(v).cloned().unwrap_or_default();
    let mut remap = vec![usize::MAX; n];
    let mut step_of: Vec<Option<usize>> = vec![None; n];
    let mut absorbed = 0;
    for v in 0..n {
        if root[v] != v {
            continue;
        }
        let node = &graph.nodes[v];
        remap[v] = out.nodes.len();
        if members[v].is_empty() {
            let inputs = node.inputs.iter().map(|&i| remap[i]).collect();
            let copy = GraphNode {
                kind: node.kind.clone(),
                inputs,
                aval: node.aval.clone(),
            };
            out.push_node(copy, graph.is_backward(v), origin_of(v));
            continue;
        }
        absorbed += members[v].len() - 1;
        let mut external: Vec<ValueId> = Vec::new();
        let mut steps = Vec::with_capacity(members[v].len());
        for &m in &members[v] {
            let ValueKind::Op(op) = &graph.nodes[m].kind else {
                unreachable!("only ops join groups");
            };
            let args = graph.nodes[m]
                .inputs
                .iter()
                .map(|&i| match step_of[i].filter(|_| root[i] == v) {
                    Some(s) => FusedArg::Step(s),
                    None => FusedArg::Input(external.iter().position(|&e| e == i).unwrap_or_else(
                        || {
                            external.push(i);
                            external.len() - 1
                        },
                    )),
                })
                .collect();
            step_of[m] = Some(steps.len());
            steps.push(FusedStep {
                op: op.clone(),
                args,
            });
        }
        let kernel = FusedKernel::new(steps, external.len())?;
        let fused = GraphNode {
            kind: ValueKind::Op(Op::Fused(Arc::new(kernel))),
            inputs: external.iter().map(|&e| remap[e]).collect(),
            aval: node.aval.clone(),
        };
        // The group computes every member's traced values; the root's
        // location is where the program asked for the group's result.
        let mut origin = Origin {
            location: origin_of(v).location,
            composition: origin_of(v).composition,
            ..Origin::default()
        };
        for &m in &members[v] {
            let member = origin_of(m);
            origin.traced.extend(member.traced.iter().copied());
            origin.steps.push(member.traced);
        }
        // A group computing any backward value runs in the backward pass.
        out.push_node(
            fused,
            members[v].iter().any(|&m| graph.is_backward(m)),
            origin,
        );
    }
    out.outputs = graph.outputs.iter().map(|&o| remap[o]).collect();
    Ok((out, absorbed))
}

/// Records that value `into` of `graph` now also computes what `origin`
/// did (CSE merged it, or an identity op forwarded it).
fn absorb_origin(graph: &mut Graph, into: ValueId, origin: &Origin) {
    if let Some(kept) = graph.provenance.0.get_mut(into) {
        kept.absorb(origin);
    }
}

/// True when `op` returns its first operand unchanged.
fn is_identity(op: &Op, aval: &Aval, graph: &Graph, inputs: &[ValueId]) -> bool {
    let operand = &graph.nodes[inputs[0]].aval;
    match op {
        Op::Reshape(_) | Op::BroadcastTo(_) | Op::Cast(_) => operand == aval,
        // Only autodiff reads it; running it is the identity.
        Op::StopGradient => true,
        Op::Permute(perm) => perm.iter().enumerate().all(|(i, &p)| i == p),
        _ => false,
    }
}

/// Evaluates `node` now if everything it needs is known.
fn fold(node: &GraphNode, graph: &Graph) -> Result<Option<Literal>> {
    let ValueKind::Op(op) = &node.kind else {
        return Ok(None);
    };
    if matches!(op, Op::Control(_) | Op::Get { .. }) {
        // Subgraphs run through an executor, not the single-op evaluation.
        return Ok(None);
    }
    let is_constant = |i: &ValueId| matches!(graph.nodes[*i].kind, ValueKind::Constant(_));
    let reads_only_shape = matches!(op, Op::DimSize { .. } | Op::Iota { .. });
    if !reads_only_shape && !node.inputs.iter().all(is_constant) {
        return Ok(None);
    }
    let Some(out_shape) = node.aval.shape.as_known() else {
        return Ok(None);
    };
    if let Op::DimSize { axes, dtype } = op {
        // Needs only the operand's shape, which may be known while its data is not.
        let Some(in_shape) = graph.nodes[node.inputs[0]].aval.shape.as_known() else {
            return Ok(None);
        };
        return Ok(Some(Literal(Arc::new(crate::ops::layout::dim_size_eval(
            axes, *dtype, &in_shape,
        )))));
    }
    if let Op::Iota { axis, dtype } = op {
        let Some(in_shape) = graph.nodes[node.inputs[0]].aval.shape.as_known() else {
            return Ok(None);
        };
        if out_shape.iter().product::<usize>() > FOLD_GROWTH_LIMIT {
            return Ok(None);
        }
        return Ok(Some(Literal(Arc::new(crate::ops::layout::iota_eval(
            *axis, *dtype, &in_shape,
        )))));
    }
    let mut datas = Vec::with_capacity(node.inputs.len());
    let mut shapes = Vec::with_capacity(node.inputs.len());
    for &i in &node.inputs {
        let operand = &graph.nodes[i];
        match (&operand.kind, operand.aval.shape.as_known()) {
            (ValueKind::Constant(l), Some(s)) => {
                datas.push(l.0.as_ref());
                shapes.push(s);
            }
            _ => return Ok(None),
        }
    }
    let out_len: usize = out_shape.iter().product();
    let in_len = datas.iter().map(|d| d.len()).max().unwrap_or(0);
    if datas.is_empty() || out_len > in_len + FOLD_GROWTH_LIMIT {
        return Ok(None);
    }
    let shape_refs: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
    Ok(Some(Literal(Arc::new(op.eval(
        &datas,
        &shape_refs,
        &out_shape,
    )?))))
}

/// Removes values no output depends on; returns the graph and the count removed.
pub fn dce(graph: Graph) -> (Graph, usize) {
    let n = graph.nodes.len();
    let mut live = vec![false; n];
    for &o in &graph.outputs {
        live[o] = true;
    }
    for i in (0..n).rev() {
        if live[i] {
            for &j in &graph.nodes[i].inputs {
                live[j] = true;
            }
        }
    }
    let removed = live.iter().filter(|l| !**l).count();
    if removed == 0 {
        return (graph, 0);
    }
    let mut remap = vec![usize::MAX; n];
    let mut out = Graph {
        num_inputs: graph.num_inputs,
        guards: graph.guards,
        implicit: graph.implicit,
        ..Graph::default()
    };
    let backward = graph.backward;
    let mut origins = graph.provenance.0.into_iter();
    for (i, node) in graph.nodes.into_iter().enumerate() {
        let origin = origins.next().unwrap_or_default();
        if live[i] {
            remap[i] = out.nodes.len();
            let inputs = node.inputs.iter().map(|&j| remap[j]).collect();
            out.push_node(
                GraphNode { inputs, ..node },
                backward.get(i) == Some(&true),
                origin,
            );
        }
    }
    out.outputs = graph.outputs.iter().map(|&o| remap[o]).collect();
    (out, removed)
}
