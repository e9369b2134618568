//! Control flow under tracing: [`scan`], [`fori_loop`], [`while_loop`],
//! [`switch`] and [`cond`]. Each traces its bodies once, on placeholders
//! of the carried and sliced values, into subgraphs of one control-flow
//! node ([`crate::ops::control`]); a loop in a compiled function is then one
//! node, however many iterations it runs.
//!
//! A body may read any array made outside it (weights, a compiled
//! function's arguments). Everything a body computes that does not depend
//! on its placeholders is *captured*: computed once, outside the loop, and
//! passed in as an operand. That is loop-invariant hoisting, done by the
//! trace itself. Captured values are shared by every subgraph of the node
//! (a while loop's condition and body, a switch's branches). Data (arrays
//! already computed) becomes a constant of the body, as it does of any
//! trace.

use super::next_trace_id;
use crate::error::{arg_err, Error, Result};
use crate::handle::array::{Array, NodeKind};
use crate::hash::{fast_map, FastMap};
use crate::ir::graph::{Graph, GraphNode, Literal, Operands, Origin, ValueKind};
use crate::ops::{ControlCall, ControlKind};
use crate::shape::{Aval, Dim, Shape};
use crate::symbolic::shapes_equal;
use crate::tree::def::TreeDef;
use crate::tree::path::KeyPath;
use crate::tree::{tree_flatten, tree_unflatten, Tree};
use crate::DType;
use std::sync::Arc;

/// A subgraph traced over placeholders: its graph, whose inputs are the
/// placeholders (`0..params`) then the captured values, and the captured
/// arrays in input order.
struct Traced {
    graph: Graph,
    params: usize,
    captured: Vec<Array>,
}

/// Traces `f` on fresh placeholders of `avals` (see the module docs).
fn trace_subgraph(
    op: &str,
    avals: &[Aval],
    f: impl FnOnce(Vec<Array>) -> Result<Vec<Array>>,
) -> Result<Traced> {
    let id = next_trace_id();
    let params: Vec<Array> = avals
        .iter()
        .enumerate()
        .map(|(i, a)| Array::param(id, i, a.clone()))
        .collect();
    let outputs = f(params)?;
    if let Some(e) = outputs.iter().find_map(Array::error) {
        return Err(e.clone());
    }
    let depends = dependence(&outputs, id);
    let mut graph = Graph::default();
    let mut captured: Vec<Array> = Vec::new();
    let mut ids: FastMap<usize, usize> = fast_map(depends.len());
    let mut stack: Vec<(Array, bool)> = outputs.iter().rev().map(|a| (a.clone(), false)).collect();
    while let Some((array, expanded)) = stack.pop() {
        if ids.contains_key(&array.id()) {
            continue;
        }
        let (kind, inputs, guards) = match (&array.node.kind, depends[&array.id()]) {
            // Data is a constant of the body, as of any trace; replaying a
            // body then gives the same graph.
            (_, false) if array.is_computed() => match array.host_value()? {
                Some(data) => (
                    ValueKind::Constant(Literal(data)),
                    Operands::new(),
                    Vec::new(),
                ),
                None => {
                    return Err(arg_err(
                        op,
                        format!(
                            "its body reads {}, whose value is not available",
                            array.aval()
                        ),
                    ))
                }
            },
            (_, false) => {
                captured.push(array.clone());
                (
                    ValueKind::Input(avals.len() + captured.len() - 1),
                    Operands::new(),
                    Vec::new(),
                )
            }
            (NodeKind::Param { index, .. }, true) => {
                (ValueKind::Input(*index), Operands::new(), Vec::new())
            }
            (NodeKind::Op { op, inputs, guards }, true) => {
                let inputs = inputs.lock().unwrap_or_else(|p| p.into_inner()).clone();
                if !expanded {
                    stack.push((array.clone(), true));
                    for input in inputs.iter().rev() {
                        if !ids.contains_key(&input.id()) {
                            stack.push((input.clone(), false));
                        }
                    }
                    continue;
                }
                let operands = inputs.iter().map(|a| ids[&a.id()]).collect();
                (ValueKind::Op(op.clone()), operands, guards.clone())
            }
            (_, true) => {
                return Err(arg_err(
                    op,
                    format!("its body reads {}, which it cannot trace", array.aval()),
                ))
            }
        };
        graph.guards.extend(guards);
        let node = GraphNode {
            kind,
            inputs,
            aval: array.aval().clone(),
        };
        ids.insert(array.id(), graph.nodes.len());
        let origin = Origin::traced(graph.nodes.len(), array.location());
        graph.push_node(node, false, origin);
    }
    graph.outputs = outputs.iter().map(|a| ids[&a.id()]).collect();
    graph.num_inputs = avals.len() + captured.len();
    Ok(Traced {
        graph,
        params: avals.len(),
        captured,
    })
}

/// Per array the outputs depend on, whether it depends on a placeholder of
/// trace `id` (an iterative post-order walk over the lazy graph; computed
/// arrays and other traces' values depend on none).
fn dependence(outputs: &[Array], id: u64) -> FastMap<usize, bool> {
    let mut depends: FastMap<usize, bool> = fast_map(64);
    let mut stack: Vec<(Array, bool)> = outputs.iter().map(|a| (a.clone(), false)).collect();
    while let Some((array, expanded)) = stack.pop() {
        if depends.contains_key(&array.id()) {
            continue;
        }
        let value = match &array.node.kind {
            NodeKind::Param { trace, .. } => *trace == id,
            NodeKind::Op { inputs, .. } if !array.is_computed() => {
                let inputs = inputs.lock().unwrap_or_else(|p| p.into_inner()).clone();
                if !expanded {
                    stack.push((array.clone(), true));
                    stack.extend(
                        inputs
                            .into_iter()
                            .filter(|i| !depends.contains_key(&i.id()))
                            .map(|i| (i, false)),
                    );
                    continue;
                }
                inputs.iter().any(|i| depends[&i.id()])
            }
            _ => false,
        };
        depends.insert(array.id(), value);
    }
    depends
}

/// Subgraphs traced for one node, their captured values merged into one
/// list every subgraph reads first: graphs whose inputs are `[consts,
/// params]`, and the consts.
fn share_captures(traced: Vec<Traced>) -> (Vec<Graph>, Vec<Array>) {
    let mut consts: Vec<Array> = Vec::new();
    let mut position: FastMap<usize, usize> = fast_map(8);
    for t in &traced {
        for c in &t.captured {
            position.entry(c.id()).or_insert_with(|| {
                consts.push(c.clone());
                consts.len() - 1
            });
        }
    }
    let graphs = traced
        .into_iter()
        .map(|t| {
            let mut graph = t.graph;
            for node in &mut graph.nodes {
                if let ValueKind::Input(i) = &mut node.kind {
                    *i = if *i < t.params {
                        consts.len() + *i
                    } else {
                        position[&t.captured[*i - t.params].id()]
                    };
                }
            }
            graph.num_inputs = consts.len() + t.params;
            graph
        })
        .collect();
    (graphs, consts)
}

/// `Err` with the first error a body's outputs carry: a failed op inside
/// a body is reported as itself, not as the aval its failed array has.
fn failed(outputs: &[Array]) -> Result<()> {
    match outputs.iter().find_map(Array::error) {
        Some(e) => Err(e.clone()),
        None => Ok(()),
    }
}

/// The avals of a subgraph's outputs.
fn output_avals(graph: &Graph) -> Vec<Aval> {
    graph
        .outputs
        .iter()
        .map(|&o| graph.nodes[o].aval.clone())
        .collect()
}

/// `Err` unless `got` (a body's output tree) has the structure `want` and
/// leaves of the avals `want_avals`; `what` names the value (`the carry`,
/// `branch 1's result`) and `op` the construct.
fn check_agrees(
    op: &str,
    what: &str,
    want: &TreeDef,
    want_avals: &[Aval],
    got: &TreeDef,
    got_avals: &[Aval],
) -> Result<()> {
    if let Some(diff) = want.first_difference(got) {
        return Err(Error::Tree {
            path: diff.path.to_string(),
            detail: format!("{op}: {what} does not keep its structure: {diff}"),
        });
    }
    for ((path, a), b) in want.leaf_paths().iter().zip(want_avals).zip(got_avals) {
        if a.dtype != b.dtype || !shapes_equal(&a.shape, &b.shape) {
            return Err(Error::Tree {
                path: path.to_string(),
                detail: format!("{op}: {what} must keep the aval {a}, but the body gives {b}"),
            });
        }
    }
    Ok(())
}

/// Options of [`scan_with`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanOptions {
    /// The trip count: required when `xs` has no leaves; otherwise it must
    /// equal their leading dim.
    pub length: Option<usize>,
    /// Iterate from the last slice to the first (the stacked `ys` keep the
    /// slices' order).
    pub reverse: bool,
}

/// A loop carrying `init` through `body` once per slice of `xs` (along
/// axis 0), stacking the per-iteration outputs: `body(carry, x) -> (carry,
/// y)` returns the final carry and the `y`s stacked along a new axis 0.
/// Trees everywhere; the carry must keep its structure and avals. The
/// body is traced once, so a compiled function holding a scan of a
/// thousand steps is one node (see the [module docs](self)).
///
/// ```
/// use kiln::{scan, Array};
/// let xs = Array::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
/// let init = Array::from_vec(vec![0.0f32], &[])?;
/// let (total, partial) = scan(|c: Array, x: Array| {
///     let c = &c + &x;
///     Ok((c.clone(), c))
/// }, &init, &xs)?;
/// assert_eq!(total.item::<f32>()?, 6.0);
/// assert_eq!(partial.to_vec::<f32>()?, vec![1.0, 3.0, 6.0]);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn scan<C: Tree, X: Tree, Y: Tree>(
    body: impl FnOnce(C, X) -> Result<(C, Y)>,
    init: &C,
    xs: &X,
) -> Result<(C, Y)> {
    scan_with(body, init, xs, ScanOptions::default())
}

/// [`scan`] with a trip count for an `xs` without leaves, or in reverse.
pub fn scan_with<C: Tree, X: Tree, Y: Tree>(
    body: impl FnOnce(C, X) -> Result<(C, Y)>,
    init: &C,
    xs: &X,
    options: ScanOptions,
) -> Result<(C, Y)> {
    let (carry, carry_def) = tree_flatten(init)?;
    let (xs_leaves, xs_def) = tree_flatten(xs)?;
    for leaf in carry.iter().chain(&xs_leaves) {
        if let Some(e) = leaf.error() {
            return Err(e.clone());
        }
    }
    let length = scan_length(&xs_leaves, &xs_def, options.length)?;
    let carry_avals: Vec<Aval> = carry.iter().map(|a| a.aval().clone()).collect();
    let mut y_def = None;
    let mut outs = build_scan(
        length,
        options.reverse,
        &[],
        &carry,
        &xs_leaves,
        |_, c, x| {
            let c: C = tree_unflatten(&carry_def, c.to_vec())?;
            let x: X = tree_unflatten(&xs_def, x.to_vec())?;
            let (c, y) = body(c, x)?;
            let (outs, out_def) = tree_flatten(&c)?;
            failed(&outs)?;
            let got: Vec<Aval> = outs.iter().map(|a| a.aval().clone()).collect();
            check_agrees(
                "scan",
                "the carry",
                &carry_def,
                &carry_avals,
                &out_def,
                &got,
            )?;
            let (ys, def) = tree_flatten(&y)?;
            y_def = Some(def);
            Ok((outs, ys))
        },
    )?;
    let y_def = y_def.ok_or_else(|| arg_err("scan", "its body returned nothing"))?;
    let ys = outs.split_off(carry.len());
    Ok((
        tree_unflatten(&carry_def, outs)?,
        tree_unflatten(&y_def, ys)?,
    ))
}

/// A scan node over flat values: `body(consts, carry, x)` (the consts read
/// as placeholders every iteration, as are the carries and the slices of
/// `xs`) returns the new carries and the iteration's ys. Returns the final
/// carries, then the stacked ys. Transformations build their scans here.
pub(crate) fn build_scan(
    length: Dim,
    reverse: bool,
    consts: &[Array],
    carry: &[Array],
    xs: &[Array],
    body: impl FnOnce(&[Array], &[Array], &[Array]) -> Result<(Vec<Array>, Vec<Array>)>,
) -> Result<Vec<Array>> {
    const OP: &str = "scan";
    let (nc, nk) = (consts.len(), carry.len());
    let mut avals: Vec<Aval> = consts
        .iter()
        .chain(carry)
        .map(|a| a.aval().clone())
        .collect();
    for x in xs {
        let Some(dims) = x.shape().dims().get(1..) else {
            return Err(arg_err(
                OP,
                format!("cannot slice {} along axis 0", x.aval()),
            ));
        };
        avals.push(Aval::new(Shape(dims.to_vec()), x.dtype()));
    }
    let traced = trace_subgraph(OP, &avals, |params| {
        let (c, y) = body(&params[..nc], &params[nc..nc + nk], &params[nc + nk..])?;
        failed(&c)?;
        failed(&y)?;
        for (i, (out, want)) in c.iter().zip(&avals[nc..nc + nk]).enumerate() {
            if out.aval() != want {
                return Err(arg_err(
                    OP,
                    format!(
                        "carry {i} must keep the aval {want}, but the body gives {}",
                        out.aval()
                    ),
                ));
            }
        }
        if c.len() != nk {
            return Err(arg_err(
                OP,
                format!("its body returns {} carries for {nk}", c.len()),
            ));
        }
        Ok(c.into_iter().chain(y).collect())
    })?;
    let (mut graphs, captured) = share_captures(vec![traced]);
    let graph = graphs.remove(0);
    let mut results = output_avals(&graph);
    for y in &mut results[nk..] {
        let mut dims = vec![length.clone()];
        dims.extend(y.shape.dims().iter().cloned());
        y.shape = Shape(dims);
    }
    let num_consts = captured.len() + nc;
    let mut operands = captured;
    operands.extend(consts.iter().chain(carry).chain(xs).cloned());
    let call = ControlCall::new(
        ControlKind::Scan { length, reverse },
        num_consts,
        nk,
        operands.iter().map(|a| a.aval().clone()).collect(),
        results,
        vec![graph],
    );
    Ok(Arc::new(call).apply(operands))
}

/// The trip count of a scan over `xs`: every leaf's leading dim, which
/// must agree (with each other and with `length` when given).
fn scan_length(xs: &[Array], def: &TreeDef, length: Option<usize>) -> Result<Dim> {
    const OP: &str = "scan";
    let paths = def.leaf_paths();
    let mut found: Option<(Dim, &KeyPath)> = None;
    for (x, path) in xs.iter().zip(&paths) {
        let Some(lead) = x.shape().dims().first() else {
            return Err(Error::Tree {
                path: path.to_string(),
                detail: format!(
                    "scan: a scanned value needs an axis to slice, got {}",
                    x.aval()
                ),
            });
        };
        match &found {
            Some((n, first)) if !crate::symbolic::dims_equal(n, lead) => {
                return Err(Error::Tree {
                    path: path.to_string(),
                    detail: format!(
                        "scan: scanned values must agree in length: `{first}` has {n}, \
                         `{path}` has {lead}"
                    ),
                })
            }
            Some(_) => {}
            None => found = Some((lead.clone(), path)),
        }
    }
    match (found, length) {
        (Some((n, path)), Some(l)) if n.known().is_some_and(|k| k != l) || n.known().is_none() => {
            Err(arg_err(
                OP,
                format!("length {l} differs from the length {n} of `{path}`"),
            ))
        }
        (Some((n, _)), _) => Ok(n),
        (None, Some(l)) => Ok(Dim::Known(l)),
        (None, None) => Err(arg_err(
            OP,
            "has nothing to scan over: give `ScanOptions::length` when `xs` has no arrays",
        )),
    }
}

/// `body(i, carry)` for `i` in `lo..hi`, a [`scan`] over the indices
/// (`i` is an `i32` scalar): the trip count is static, so the loop is one
/// node whose body runs `hi - lo` times.
///
/// ```
/// use kiln::{fori_loop, Array};
/// let x = Array::from_vec(vec![1.0f32], &[])?;
/// let y = fori_loop(0, 10, |_i, x: Array| Ok(&x * 2.0), &x)?;
/// assert_eq!(y.item::<f32>()?, 1024.0);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn fori_loop<C: Tree>(
    lo: i32,
    hi: i32,
    body: impl FnOnce(Array, C) -> Result<C>,
    init: &C,
) -> Result<C> {
    let hi = hi.max(lo);
    let indices = Array::arange(lo as f64, hi as f64, 1.0, DType::I32)?;
    let (carry, ()) = scan(|c: C, i: Array| Ok((body(i, c)?, ())), init, &indices)?;
    Ok(carry)
}

/// Runs `body` on the carry while `cond` (a bool scalar) holds: the
/// result is the first carry for which it does not. The trip count is
/// known only when it runs; the loop cannot be differentiated in reverse
/// mode (as in JAX).
///
/// ```
/// use kiln::{while_loop, Array};
/// let x = Array::from_vec(vec![1.0f32], &[])?;
/// let y = while_loop(|x: Array| Ok(x.less(100.0)), |x: Array| Ok(&x * 3.0), &x)?;
/// assert_eq!(y.item::<f32>()?, 243.0);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn while_loop<C: Tree>(
    cond: impl FnOnce(C) -> Result<Array>,
    body: impl FnOnce(C) -> Result<C>,
    init: &C,
) -> Result<C> {
    const OP: &str = "while_loop";
    let (carry, def) = tree_flatten(init)?;
    if let Some(e) = carry.iter().find_map(Array::error) {
        return Err(e.clone());
    }
    let avals: Vec<Aval> = carry.iter().map(|a| a.aval().clone()).collect();
    let outs = build_while(
        &[],
        &carry,
        |_, c| cond(tree_unflatten(&def, c.to_vec())?),
        |_, c| {
            let (outs, out_def) = tree_flatten(&body(tree_unflatten(&def, c.to_vec())?)?)?;
            failed(&outs)?;
            let got: Vec<Aval> = outs.iter().map(|a| a.aval().clone()).collect();
            check_agrees(OP, "the carry", &def, &avals, &out_def, &got)?;
            Ok(outs)
        },
    )?;
    tree_unflatten(&def, outs)
}

/// A while node over flat values: `cond(consts, carry)` (a bool scalar)
/// and `body(consts, carry)` (the new carries) over placeholders. Returns
/// the final carries. Transformations build their loops here.
pub(crate) fn build_while(
    consts: &[Array],
    carry: &[Array],
    cond: impl FnOnce(&[Array], &[Array]) -> Result<Array>,
    body: impl FnOnce(&[Array], &[Array]) -> Result<Vec<Array>>,
) -> Result<Vec<Array>> {
    const OP: &str = "while_loop";
    let nc = consts.len();
    let avals: Vec<Aval> = consts
        .iter()
        .chain(carry)
        .map(|a| a.aval().clone())
        .collect();
    let cond_graph = trace_subgraph(OP, &avals, |params| {
        let pred = cond(&params[..nc], &params[nc..])?.check()?;
        if pred.dtype() != DType::Bool || pred.ndim() != 0 {
            return Err(arg_err(
                OP,
                format!(
                    "its condition must return a bool scalar, got {}",
                    pred.aval()
                ),
            ));
        }
        Ok(vec![pred])
    })?;
    let body_graph = trace_subgraph(OP, &avals, |params| {
        let outs = body(&params[..nc], &params[nc..])?;
        failed(&outs)?;
        let got: Vec<Aval> = outs.iter().map(|a| a.aval().clone()).collect();
        if got != avals[nc..] {
            return Err(arg_err(
                OP,
                format!(
                    "its body must keep the carries' avals {}, but gives {}",
                    render(&avals[nc..]),
                    render(&got)
                ),
            ));
        }
        Ok(outs)
    })?;
    let (graphs, captured) = share_captures(vec![cond_graph, body_graph]);
    let num_consts = captured.len() + nc;
    let mut operands = captured;
    operands.extend(consts.iter().chain(carry).cloned());
    let call = ControlCall::new(
        ControlKind::While,
        num_consts,
        carry.len(),
        operands.iter().map(|a| a.aval().clone()).collect(),
        avals[nc..].to_vec(),
        graphs,
    );
    Ok(Arc::new(call).apply(operands))
}

/// A branch of [`switch`]: a function of the operands' tree.
pub type Branch<'a, A, R> = Box<dyn FnOnce(A) -> Result<R> + 'a>;

/// Runs the branch `index` (an integer scalar, clamped to the branches as
/// in JAX) names on `operands`. Every branch is traced; their results
/// must agree in tree structure and avals.
///
/// ```
/// use kiln::{switch, Array, Branch};
/// let x = Array::from_vec(vec![2.0f32], &[1])?;
/// let branches: Vec<Branch<Array, Array>> = vec![
///     Box::new(|x: Array| Ok(&x + 1.0)),
///     Box::new(|x: Array| Ok(&x * 10.0)),
/// ];
/// let index = Array::from_vec(vec![1i32], &[])?;
/// assert_eq!(switch(&index, branches, &x)?.to_vec::<f32>()?, vec![20.0]);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn switch<A: Tree, R: Tree>(
    index: &Array,
    branches: Vec<Branch<'_, A, R>>,
    operands: &A,
) -> Result<R> {
    const OP: &str = "switch";
    let (leaves, def) = tree_flatten(operands)?;
    if let Some(e) = leaves.iter().find_map(Array::error) {
        return Err(e.clone());
    }
    let result: std::cell::RefCell<Option<(TreeDef, Vec<Aval>)>> = Default::default();
    let flat: Vec<FlatBranch<'_>> = branches
        .into_iter()
        .enumerate()
        .map(|(b, branch)| {
            let (def, result) = (&def, &result);
            Box::new(move |_: &[Array], params: &[Array]| {
                let (outs, out_def) =
                    tree_flatten(&branch(tree_unflatten(def, params.to_vec())?)?)?;
                let got: Vec<Aval> = outs.iter().map(|a| a.aval().clone()).collect();
                let mut result = result.borrow_mut();
                match &*result {
                    Some((want, want_avals)) => check_agrees(
                        OP,
                        &format!("branch {b}'s result (against branch 0's)"),
                        want,
                        want_avals,
                        &out_def,
                        &got,
                    )?,
                    None => *result = Some((out_def, got)),
                }
                Ok(outs)
            }) as FlatBranch<'_>
        })
        .collect();
    let outs = build_switch(index, &[], &leaves, flat)?;
    let result_def = result
        .into_inner()
        .map(|(def, _)| def)
        .ok_or_else(|| arg_err(OP, "needs at least one branch"))?;
    tree_unflatten(&result_def, outs)
}

/// A branch over flat values: `(consts, operands)` placeholders to results.
pub(crate) type FlatBranch<'a> = Box<dyn FnOnce(&[Array], &[Array]) -> Result<Vec<Array>> + 'a>;

/// A switch node over flat values: branch `index` (clamped) of `branches`,
/// each reading `consts` and `operands` as placeholders; their results
/// must agree in avals. Transformations build their switches here.
pub(crate) fn build_switch(
    index: &Array,
    consts: &[Array],
    operands: &[Array],
    branches: Vec<FlatBranch<'_>>,
) -> Result<Vec<Array>> {
    const OP: &str = "switch";
    let index = index.clone().check()?;
    if index.ndim() != 0 || !index.dtype().is_integer() {
        return Err(arg_err(
            OP,
            format!("its index must be an integer scalar, got {}", index.aval()),
        ));
    }
    if branches.is_empty() {
        return Err(arg_err(OP, "needs at least one branch"));
    }
    let nc = consts.len();
    let avals: Vec<Aval> = consts
        .iter()
        .chain(operands)
        .map(|a| a.aval().clone())
        .collect();
    let mut results: Option<Vec<Aval>> = None;
    let mut traced = Vec::with_capacity(branches.len());
    for (b, branch) in branches.into_iter().enumerate() {
        traced.push(trace_subgraph(OP, &avals, |params| {
            let outs = branch(&params[..nc], &params[nc..])?;
            failed(&outs)?;
            let got: Vec<Aval> = outs.iter().map(|a| a.aval().clone()).collect();
            match &results {
                Some(want) if *want != got => Err(arg_err(
                    OP,
                    format!(
                        "branch {b} returns {} where branch 0 returns {}",
                        render(&got),
                        render(want)
                    ),
                )),
                Some(_) => Ok(outs),
                None => {
                    results = Some(got);
                    Ok(outs)
                }
            }
        })?);
    }
    let results = results.ok_or_else(|| arg_err(OP, "needs at least one branch"))?;
    let (graphs, captured) = share_captures(traced);
    let num_consts = captured.len() + nc;
    let mut operand_arrays = vec![index];
    operand_arrays.extend(captured);
    operand_arrays.extend(consts.iter().chain(operands).cloned());
    let call = ControlCall::new(
        ControlKind::Switch,
        num_consts,
        operands.len(),
        operand_arrays.iter().map(|a| a.aval().clone()).collect(),
        results,
        graphs,
    );
    Ok(Arc::new(call).apply(operand_arrays))
}

/// `(f32[2], i32[])`.
fn render(avals: &[Aval]) -> String {
    let parts: Vec<String> = avals.iter().map(Aval::to_string).collect();
    format!("({})", parts.join(", "))
}

/// The values `graph` computes from `inputs` (one per graph input): every
/// op applied again to lazy arrays, so a subgraph is inlined into whatever
/// is being traced now (the transformations of control flow replay a body
/// inside the bodies they build).
pub(crate) fn replay(graph: &Graph, inputs: &[Array]) -> Result<Vec<Array>> {
    let mut values: Vec<Array> = Vec::with_capacity(graph.nodes.len());
    for node in &graph.nodes {
        let value = match &node.kind {
            ValueKind::Input(i) => inputs.get(*i).cloned().ok_or_else(|| {
                arg_err(
                    "replay",
                    format!("the graph reads input {i} of {}", inputs.len()),
                )
            })?,
            ValueKind::Constant(literal) => {
                Array::from_host(literal.0.clone(), node.aval.shape.clone())
            }
            ValueKind::Op(op) => Array::apply(
                op.clone(),
                node.inputs.iter().map(|&j| values[j].clone()).collect(),
            ),
        };
        values.push(value);
    }
    Ok(graph.outputs.iter().map(|&o| values[o].clone()).collect())
}

/// `true_fn(operands)` where `pred` (a bool scalar) holds, else
/// `false_fn(operands)`: a [`switch`] of two branches. Both are traced;
/// their results must agree in structure and avals.
///
/// ```
/// use kiln::{cond, Array};
/// let x = Array::from_vec(vec![3.0f32], &[1])?;
/// let pred = x.sum_all().greater(0.0);
/// let y = cond(&pred, |x: Array| Ok(x.sqrt()), |x: Array| Ok(-&x), &x)?;
/// assert!((y.to_vec::<f32>()?[0] - 3f32.sqrt()).abs() < 1e-6);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn cond<A: Tree, R: Tree>(
    pred: &Array,
    true_fn: impl FnOnce(A) -> Result<R>,
    false_fn: impl FnOnce(A) -> Result<R>,
    operands: &A,
) -> Result<R> {
    let pred = pred.clone().check()?;
    if pred.ndim() != 0 || pred.dtype() != DType::Bool {
        return Err(arg_err(
            "cond",
            format!("its predicate must be a bool scalar, got {}", pred.aval()),
        ));
    }
    switch(
        &pred.cast(DType::I32),
        vec![Box::new(false_fn), Box::new(true_fn)],
        operands,
    )
}
