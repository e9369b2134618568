//! Reverse-mode autodiff: a transformation of traced graphs.
//!
//! Each op family's vjp sits beside its shape rule (`Op::vjp`). `backward`
//! walks the lazy graph from the outputs back to the differentiated leaves
//! and builds the cotangents as ordinary lazy arrays, so a gradient is just
//! more graph: traced by [`crate::compile()`] together with the forward pass
//! (one cache entry), then fused, reinplaced, slot-planned and verified like
//! any graph. A cotangent that is structurally zero is `None` and never
//! materialised.
//!
//! [`grad`] and [`value_and_grad`] differentiate a function of any [`Tree`];
//! gradients come back in the argument's own tree type. Called directly they
//! trace the function once on fresh tracers (so a value read inside it is an
//! error, not a silently constant branch); inside `compile` they differentiate
//! the trace they are part of. Errors (an integer leaf, a non-scalar loss, an
//! op without a vjp) are `Err`s naming the leaf path, the shape or the op.

use crate::array::{Array, NodeKind};
use crate::compile::{compile, leaves_under, next_trace_id, normalize_arg_path, Function};
use crate::error::{Error, Result};
use crate::exec::{Backend, CpuBackend, Executable};
use crate::hash::{fast_map, FastMap};
use crate::ops::Op;
use crate::passes::{optimize, Passes};
use crate::report::arg_path;
use crate::trace::{extract, Leaves};
use crate::tree::{tree_unflatten, Tree, TreeDef};
use std::cell::RefCell;
use std::collections::HashSet;
use std::marker::PhantomData;

/// The cotangent of each of `wrt` when `outputs` have the cotangents
/// `seeds` (`None` where an output's is zero); `None` where a cotangent is
/// structurally zero (no path from that leaf to a seeded output).
pub(crate) fn backward(
    outputs: &[Array],
    seeds: Vec<Option<Array>>,
    wrt: &[Array],
) -> Result<Vec<Option<Array>>> {
    if let Some(e) = outputs.iter().find_map(Array::error) {
        return Err(e.clone());
    }
    let order = topological_order(outputs);
    // Values that depend on a differentiated leaf, in schedule order.
    let mut active: HashSet<usize> = wrt.iter().map(Array::id).collect();
    for array in &order {
        if let NodeKind::Op { op, inputs, .. } = &array.node.kind {
            let depends = !matches!(op, Op::StopGradient)
                && inputs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .any(|input| active.contains(&input.id()));
            if depends {
                active.insert(array.id());
            }
        }
    }
    let mut cotangents: FastMap<usize, Array> = fast_map(order.len());
    for (output, seed) in outputs.iter().zip(seeds) {
        if let (Some(seed), true) = (seed, active.contains(&output.id())) {
            accumulate(&mut cotangents, output.id(), seed);
        }
    }
    for array in order.iter().rev() {
        let NodeKind::Op { op, inputs, .. } = &array.node.kind else {
            continue;
        };
        if !active.contains(&array.id()) {
            continue;
        }
        let Some(cotangent) = cotangents.remove(&array.id()) else {
            continue;
        };
        let inputs = inputs.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let grads = op.vjp(&inputs, array, &cotangent)?;
        for (input, grad) in inputs.iter().zip(grads) {
            if let (Some(grad), true) = (grad, active.contains(&input.id())) {
                accumulate(&mut cotangents, input.id(), grad);
            }
        }
    }
    let grads: Vec<Option<Array>> = wrt.iter().map(|w| cotangents.remove(&w.id())).collect();
    record_backward(&order, grads.iter().flatten());
    Ok(grads)
}

thread_local! {
    /// The backward values built while a `compile` trace runs, so its
    /// graph can mark them.
    static BACKWARD: RefCell<Option<Vec<Array>>> = const { RefCell::new(None) };
}

/// Runs `trace` collecting the values of every backward pass it builds
/// (kept alive, so their ids stay theirs while the trace is extracted).
pub(crate) fn collecting_backward<T>(trace: impl FnOnce() -> T) -> (T, Vec<Array>) {
    let outer = BACKWARD.with(|b| b.replace(Some(Vec::new())));
    let result = trace();
    let backward = BACKWARD.with(|b| b.replace(outer)).unwrap_or_default();
    (result, backward)
}

/// Adds to the collector, if one is active, every value below `grads` that
/// is not one of `forward`: the values the backward pass computes.
fn record_backward<'a>(forward: &[Array], grads: impl Iterator<Item = &'a Array>) {
    if BACKWARD.with(|b| b.borrow().is_none()) {
        return;
    }
    let forward: HashSet<usize> = forward.iter().map(Array::id).collect();
    let mut seen: HashSet<usize> = HashSet::new();
    let mut found: Vec<Array> = Vec::new();
    let mut stack: Vec<Array> = grads.cloned().collect();
    while let Some(array) = stack.pop() {
        if forward.contains(&array.id()) || !seen.insert(array.id()) {
            continue;
        }
        if let NodeKind::Op { inputs, .. } = &array.node.kind {
            stack.extend(
                inputs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .cloned(),
            );
        }
        found.push(array);
    }
    BACKWARD.with(|b| {
        if let Some(all) = b.borrow_mut().as_mut() {
            all.extend(found);
        }
    });
}

/// Adds `grad` to the cotangent gathered so far for value `id`.
fn accumulate(cotangents: &mut FastMap<usize, Array>, id: usize, grad: Array) {
    let sum = match cotangents.remove(&id) {
        Some(so_far) => so_far + grad,
        None => grad,
    };
    cotangents.insert(id, sum);
}

/// Every array `outputs` depend on, each after its inputs (an iterative
/// post-order walk: chains can be a hundred thousand ops long).
fn topological_order(outputs: &[Array]) -> Vec<Array> {
    let mut order = Vec::new();
    let mut seen: HashSet<usize> = HashSet::new();
    let mut stack: Vec<(Array, bool)> = outputs.iter().rev().map(|a| (a.clone(), false)).collect();
    while let Some((array, expanded)) = stack.pop() {
        if expanded {
            order.push(array);
            continue;
        }
        if !seen.insert(array.id()) {
            continue;
        }
        stack.push((array.clone(), true));
        if let NodeKind::Op { inputs, .. } = &array.node.kind {
            let inputs = inputs.lock().unwrap_or_else(|p| p.into_inner());
            for input in inputs.iter().rev() {
                if !seen.contains(&input.id()) {
                    stack.push((input.clone(), false));
                }
            }
        }
    }
    order
}

/// `x`, but no gradient flows through it: its cotangent is zero. It is an
/// identity op that the simplify pass removes, so no backend ever runs it.
///
/// ```
/// use kiln::{grad, stop_gradient, Array};
/// let f = grad(|x: Array| (&x * stop_gradient(&x)).sum_all());
/// let g = f.call(&Array::from_vec(vec![3.0f32], &[1])?)?;
/// assert_eq!(g.to_vec::<f32>()?, vec![3.0]);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn stop_gradient(x: &Array) -> Array {
    Array::apply(Op::StopGradient, vec![x.clone()])
}

/// The gradient of `f`, a function of any tree returning a scalar float
/// array, with respect to its argument (or to the subtrees chosen with
/// [`Grad::wrt`]). The gradient has the argument's own tree type: a
/// `#[derive(Tree)]` struct of parameters gives the same struct, static
/// fields unchanged; leaves that are not differentiated (not under a `wrt`
/// path) are zeros.
///
/// Call it with [`Grad::call`], or compile it like any function:
/// `compile(grad(f))` traces forward and backward into one cache entry.
///
/// ```
/// use kiln::{compile, grad, Array};
/// let df = compile(grad(|x: Array| (&x * &x).sum_all()));
/// let g = df.call(&Array::from_vec(vec![1.0f32, -2.0], &[2])?)?;
/// assert_eq!(g.to_vec::<f32>()?, vec![2.0, -4.0]);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn grad<F>(f: F) -> Grad<F> {
    Grad { f, wrt: Vec::new() }
}

/// The value and the gradient of `f` (see [`grad`]): `(loss, gradient)`.
/// With [`ValueAndGrad::has_aux`], `f` returns `(loss, aux)`, the aux takes
/// no gradient, and the result is `((loss, aux), gradient)`.
///
/// ```
/// use kiln::{value_and_grad, Array};
/// let f = value_and_grad(|x: Array| x.exp().sum_all());
/// let (value, g) = f.call(&Array::from_vec(vec![0.0f32], &[1])?)?;
/// assert_eq!((value.item::<f32>()?, g.to_vec::<f32>()?), (1.0, vec![1.0]));
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn value_and_grad<F>(f: F) -> ValueAndGrad<F> {
    ValueAndGrad { f, wrt: Vec::new() }
}

/// A function's gradient; made by [`grad`].
pub struct Grad<F> {
    f: F,
    wrt: Vec<String>,
}

/// A function's value and gradient; made by [`value_and_grad`].
pub struct ValueAndGrad<F> {
    f: F,
    wrt: Vec<String>,
}

/// A function's value, auxiliary outputs and gradient; made by
/// [`ValueAndGrad::has_aux`].
pub struct ValueAndGradWithAux<F> {
    f: F,
    wrt: Vec<String>,
}

/// Marks the [`Function`] implementation of [`Grad`].
pub enum GradMarker {}
/// Marks the [`Function`] implementation of [`ValueAndGrad`].
pub enum ValueAndGradMarker {}
/// Marks the [`Function`] implementation of [`ValueAndGradWithAux`].
pub enum ValueAndGradWithAuxMarker {}

fn normalized(paths: impl IntoIterator<Item = impl Into<String>>) -> Vec<String> {
    let mut paths: Vec<String> = paths
        .into_iter()
        .map(|p| normalize_arg_path(p.into()))
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

impl<F> Grad<F> {
    /// Differentiates only the leaves under `paths` (written as reports
    /// show them, `args.params` or `params`, as for `donate`); the other
    /// leaves are constants and get zeros.
    pub fn wrt<P: Into<String>>(mut self, paths: impl IntoIterator<Item = P>) -> Self {
        self.wrt = normalized(paths);
        self
    }

    /// The gradient at `args`, computed now (traced once on fresh tracers
    /// and run on the CPU executor).
    pub fn call<In: Tree>(&self, args: &In) -> Result<In>
    where
        F: Fn(In) -> Array,
    {
        compile(Grad {
            f: &self.f,
            wrt: self.wrt.clone(),
        })
        .call(args)
    }
}

impl<F> ValueAndGrad<F> {
    /// Differentiates only the leaves under `paths` (see [`Grad::wrt`]).
    pub fn wrt<P: Into<String>>(mut self, paths: impl IntoIterator<Item = P>) -> Self {
        self.wrt = normalized(paths);
        self
    }

    /// `f` returns `(loss, aux)`: the aux is returned beside the loss and
    /// takes no gradient.
    pub fn has_aux(self) -> ValueAndGradWithAux<F> {
        ValueAndGradWithAux {
            f: self.f,
            wrt: self.wrt,
        }
    }

    /// The value and the gradient at `args`, computed now.
    pub fn call<In: Tree>(&self, args: &In) -> Result<(Array, In)>
    where
        F: Fn(In) -> Array,
    {
        compile(ValueAndGrad {
            f: &self.f,
            wrt: self.wrt.clone(),
        })
        .call(args)
    }
}

impl<F> ValueAndGradWithAux<F> {
    /// The value, the aux and the gradient at `args`, computed now.
    pub fn call<In: Tree, Aux: Tree>(&self, args: &In) -> Result<((Array, Aux), In)>
    where
        F: Fn(In) -> (Array, Aux),
    {
        compile(ValueAndGradWithAux {
            f: &self.f,
            wrt: self.wrt.clone(),
        })
        .call(args)
    }
}

impl<In: Tree, F: Fn(In) -> Array> Function<In, In, GradMarker> for Grad<F> {
    fn apply(&self, args: In) -> Result<In> {
        Ok(differentiate(args, &self.wrt, |args| (self.f)(args))?.1)
    }
}

impl<In: Tree, F: Fn(In) -> Array> Function<In, (Array, In), ValueAndGradMarker>
    for ValueAndGrad<F>
{
    fn apply(&self, args: In) -> Result<(Array, In)> {
        differentiate(args, &self.wrt, |args| (self.f)(args))
    }
}

impl<In: Tree, Aux: Tree, F: Fn(In) -> (Array, Aux)>
    Function<In, ((Array, Aux), In), ValueAndGradWithAuxMarker> for ValueAndGradWithAux<F>
{
    fn apply(&self, args: In) -> Result<((Array, Aux), In)> {
        let mut aux = None;
        let (loss, gradient) = differentiate(args, &self.wrt, |args| {
            let (loss, extra) = (self.f)(args);
            aux = Some(extra);
            loss
        })?;
        let aux = aux.ok_or_else(|| Error::Tree {
            path: "args".into(),
            detail: "the function was not called".into(),
        })?;
        Ok(((loss, aux), gradient))
    }
}

/// Calls `loss_of(args)` and differentiates the scalar loss with respect to
/// the leaves of `args` under `wrt` (all of them when empty): an integer
/// leaf, a non-scalar loss or an op without a vjp is an `Err`.
fn differentiate<In: Tree>(
    args: In,
    wrt: &[String],
    loss_of: impl FnOnce(In) -> Array,
) -> Result<(Array, In)> {
    let mut leaves = Vec::new();
    let tree = args.flatten(&mut leaves)?;
    let selected = if wrt.is_empty() {
        vec![true; leaves.len()]
    } else {
        leaves_under(&tree, wrt, "grad")?
    };
    let paths = tree.leaf_paths();
    for ((leaf, path), &chosen) in leaves.iter().zip(&paths).zip(&selected) {
        if chosen && !leaf.dtype().is_float() {
            return Err(Error::DType {
                op: "grad".into(),
                detail: format!(
                    "cannot differentiate with respect to the {} leaf `{}`; select float \
                     leaves with `.wrt([...])`",
                    leaf.dtype(),
                    arg_path(path)
                ),
                operands: leaf.aval().to_string(),
            });
        }
    }
    let loss = loss_of(tree_unflatten(&tree, leaves.clone())?).check()?;
    if loss.ndim() != 0 || !loss.dtype().is_float() {
        return Err(Error::Shape {
            op: "grad".into(),
            detail: "the function must return a scalar float loss (use `vjp` for other outputs)"
                .into(),
            operands: loss.aval().to_string(),
        });
    }
    let seed = Array::scalar(1.0, loss.dtype());
    let chosen: Vec<Array> = leaves
        .iter()
        .zip(&selected)
        .filter(|(_, &s)| s)
        .map(|(l, _)| l.clone())
        .collect();
    let mut grads = backward(std::slice::from_ref(&loss), vec![Some(seed)], &chosen)?.into_iter();
    let gradient: Vec<Array> = leaves
        .iter()
        .zip(&selected)
        .map(
            |(leaf, &s)| match s.then(|| grads.next().flatten()).flatten() {
                Some(g) => g,
                None => zeros_like(leaf),
            },
        )
        .collect();
    Ok((loss, tree_unflatten(&tree, gradient)?))
}

/// Zeros with `x`'s aval (symbolic dims included), built by broadcasting a
/// scalar so that nothing large is materialised until a kernel writes it.
pub(crate) fn zeros_like(x: &Array) -> Array {
    Array::scalar(0.0, x.dtype()).broadcast_to(x.shape().clone())
}

/// The vector-Jacobian product of `f` at `primals`: its outputs, and a
/// [`Pullback`] that maps a cotangent of the outputs (same tree type) to
/// the cotangent of the arguments (the arguments' tree type).
///
/// ```
/// use kiln::{vjp, Array};
/// let x = Array::from_vec(vec![1.0f32, 2.0], &[2])?;
/// let (y, pullback) = vjp(|x: Array| &x * &x, &x)?;
/// assert_eq!(y.to_vec::<f32>()?, vec![1.0, 4.0]);
/// let g = pullback.call(&Array::from_vec(vec![1.0f32, 10.0], &[2])?)?;
/// assert_eq!(g.to_vec::<f32>()?, vec![2.0, 40.0]);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn vjp<In: Tree, Out: Tree>(
    f: impl FnOnce(In) -> Out,
    primals: &In,
) -> Result<(Out, Pullback<In, Out>)> {
    let mut leaves = Vec::new();
    let in_tree = primals.flatten(&mut leaves)?;
    crate::eval::eval(&leaves)?;
    let trace = next_trace_id();
    let params: Vec<Array> = leaves
        .iter()
        .enumerate()
        .map(|(i, leaf)| Array::param(trace, i, leaf.aval().clone()))
        .collect();
    let out = f(tree_unflatten(&in_tree, params.clone())?);
    let mut traced_outputs = Vec::new();
    let out_tree = out.flatten(&mut traced_outputs)?;
    let values = run_traced(&traced_outputs, trace, &leaves)?;
    let outputs = tree_unflatten(&out_tree, values)?;
    Ok((
        outputs,
        Pullback {
            trace,
            params,
            primals: leaves,
            in_tree,
            traced_outputs,
            out_tree,
            types: PhantomData,
        },
    ))
}

/// The pullback of [`vjp`]: the traced forward pass, kept to differentiate.
pub struct Pullback<In, Out> {
    trace: u64,
    params: Vec<Array>,
    primals: Vec<Array>,
    in_tree: TreeDef,
    traced_outputs: Vec<Array>,
    out_tree: TreeDef,
    types: PhantomData<fn(Out) -> In>,
}

impl<In: Tree, Out: Tree> Pullback<In, Out> {
    /// The cotangent of the arguments for the cotangent `cotangent` of the
    /// outputs, which must have the outputs' tree structure and avals (an
    /// `Err` names the first path that differs).
    pub fn call(&self, cotangent: &Out) -> Result<In> {
        let mut seeds = Vec::new();
        let tree = cotangent.flatten(&mut seeds)?;
        if let Some(diff) = self.out_tree.first_difference(&tree) {
            return Err(Error::Tree {
                path: arg_path(&diff.path),
                detail: format!(
                    "the cotangent's structure differs from the outputs': {:?}",
                    diff.kind
                ),
            });
        }
        let paths = self.out_tree.leaf_paths();
        for ((seed, output), path) in seeds.iter().zip(&self.traced_outputs).zip(&paths) {
            if seed.aval() != output.aval() {
                return Err(Error::Tree {
                    path: arg_path(path),
                    detail: format!(
                        "the cotangent is {} but the output is {}",
                        seed.aval(),
                        output.aval()
                    ),
                });
            }
        }
        crate::eval::eval(&seeds)?;
        let grads = backward(
            &self.traced_outputs,
            seeds.into_iter().map(Some).collect(),
            &self.params,
        )?;
        let grads: Vec<Array> = grads
            .into_iter()
            .zip(&self.params)
            .map(|(g, p)| g.unwrap_or_else(|| zeros_like(p)))
            .collect();
        let values = run_traced(&grads, self.trace, &self.primals)?;
        tree_unflatten(&self.in_tree, values)
    }
}

/// Runs the traced `outputs` of trace `trace` on the CPU executor with
/// `inputs` as its arguments.
fn run_traced(outputs: &[Array], trace: u64, inputs: &[Array]) -> Result<Vec<Array>> {
    let (graph, _) = extract(
        outputs,
        Leaves::Trace {
            id: trace,
            num_inputs: inputs.len(),
        },
        &HashSet::new(),
    )?;
    let (graph, _) = optimize(&graph, Passes::default())?;
    let shapes: Vec<Vec<usize>> = inputs
        .iter()
        .map(|a| a.shape().as_known().unwrap_or_default())
        .collect();
    let refs: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
    let exe = Executable::new(graph, Vec::new(), &vec![false; inputs.len()], &refs)?;
    let buffers = inputs
        .iter()
        .map(|a| {
            a.host_value()?.ok_or_else(|| Error::ReadTracer {
                aval: a.aval().to_string(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let resolved = exe.resolve_shapes(&refs)?;
    let results = CpuBackend.run(&exe, buffers, &resolved)?;
    Ok(results
        .into_iter()
        .zip(&exe.graph().outputs)
        .map(|(data, &o)| Array::from_host(data, crate::shape::Shape::known(&resolved[o])))
        .collect())
}
