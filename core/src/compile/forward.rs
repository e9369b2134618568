//! The user-facing forward-mode transformations and Jacobians: [`jvp`],
//! [`linearize`], [`jacfwd`], [`jacrev`] and [`hessian`]. Like the reverse
//! ones in `grad.rs` they trace and run through `compile`, so inside
//! another trace (a compiled function, `grad`) they add to that trace and
//! compose with it; the walk that pushes tangents is
//! `transform/forward.rs`.
//!
//! A Jacobian is one forward pass ([`jacfwd`]) or one reverse pass
//! ([`jacrev`]) batched over the identity basis of the argument's (or the
//! output's) elements by the vmap batching rules, as JAX builds them: one
//! graph whose size does not grow with the element count (the basis
//! itself is an `n × n` constant).

use super::cache::{compile, Function, FunctionOutput};
use super::grad::{build_traced, run_built};
use super::report::arg_path;
use crate::data::HostData;
use crate::error::{Error, Result};
use crate::exec::Executable;
use crate::handle::array::{Array, NodeKind};
use crate::ops::batching::Batched;
use crate::shape::{Dim, Shape};
use crate::trace::next_trace_id;
use crate::transform::autodiff::{backward, topological_order};
use crate::transform::batching::batch_values;
use crate::transform::forward::push_tangents;
use crate::tree::path::KeyPath;
use crate::tree::{tree_flatten, tree_unflatten, JacobianOutput, Tree, TreeDef};
use std::collections::HashSet;
use std::marker::PhantomData;

/// The Jacobian-vector product of `f` at `primals` along `tangents`:
/// `(f(primals), J·tangents)`, the second in the outputs' tree type.
/// `tangents` must have the primals' structure, shapes and dtypes (an
/// `Err` names the first leaf path that differs); integer leaves carry no
/// tangent, and an output that depends on no tangent (or is not a float)
/// gets zeros. An op on the way without a jvp rule is an `Err` naming it.
///
/// Inside a compiled function (or `grad`) it adds to that trace, so
/// `grad(|x| jvp(f, &x, &v).1 ...)` and forward-over-reverse
/// (Hessian-vector products) compose.
///
/// ```
/// use kiln::{jvp, Array};
/// let x = Array::from_vec(vec![1.0f32, 2.0], &[2])?;
/// let v = Array::from_vec(vec![1.0f32, 0.5], &[2])?;
/// let (y, dy) = jvp(|x: Array| &x * &x, &x, &v)?;
/// assert_eq!(y.to_vec::<f32>()?, vec![1.0, 4.0]);
/// assert_eq!(dy.to_vec::<f32>()?, vec![2.0, 2.0]);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn jvp<In: Tree, Out: FunctionOutput>(
    f: impl Fn(In) -> Out,
    primals: &In,
    tangents: &In,
) -> Result<(Out::Value, Out::Value)> {
    let (primal_leaves, primal_tree) = tree_flatten(primals)?;
    let (tangent_leaves, tangent_tree) = tree_flatten(tangents)?;
    check_tangents(
        "jvp",
        &primal_tree,
        &primal_leaves,
        &tangent_tree,
        &tangent_leaves,
    )?;
    let args: (In, In) = (
        tree_unflatten(&primal_tree, primal_leaves)?,
        tree_unflatten(&tangent_tree, tangent_leaves)?,
    );
    compile(PushForward { f: &f }).call(&args)
}

/// `f` and its tangent map as one function of `(primals, tangents)`: what
/// [`jvp`] compiles.
struct PushForward<F> {
    f: F,
}

/// Marks the [`Function`] implementation of [`jvp`]'s function.
enum PushForwardMarker {}

impl<In: Tree, Out: FunctionOutput, F: Fn(In) -> Out>
    Function<(In, In), (Out::Value, Out::Value), PushForwardMarker> for PushForward<F>
{
    fn apply(&self, (primals, tangents): (In, In)) -> Result<(Out::Value, Out::Value)> {
        let (primal_leaves, in_tree) = tree_flatten(&primals)?;
        let (tangent_leaves, _) = tree_flatten(&tangents)?;
        let out = (self.f)(primals).into_value()?;
        let (out_leaves, out_tree) = tree_flatten(&out)?;
        let given = primal_leaves
            .iter()
            .zip(tangent_leaves)
            .map(|(p, t)| p.dtype().is_float().then_some(t))
            .collect();
        let pushed = push_tangents(&out_leaves, &primal_leaves, given)
            .map_err(|e| in_function("jvp", &in_tree, e))?;
        let tangents_out = out_leaves
            .iter()
            .zip(pushed)
            .map(|(o, t)| t.unwrap_or_else(|| o.zeros_like()))
            .collect();
        Ok((out, tree_unflatten(&out_tree, tangents_out)?))
    }
}

/// `Err` unless `tangents` (def and leaves) has the structure and the
/// leaves' avals of `primals`, naming the first path that differs;
/// symbolic dims that may be equal are assumed equal.
fn check_tangents(
    op: &str,
    primal_tree: &TreeDef,
    primals: &[Array],
    tangent_tree: &TreeDef,
    tangents: &[Array],
) -> Result<()> {
    if let Some(diff) = primal_tree.first_difference(tangent_tree) {
        return Err(Error::Tree {
            path: arg_path(&diff.path),
            detail: format!(
                "{op}: the tangents' structure differs from the primals': {:?}",
                diff.kind
            ),
        });
    }
    for ((p, t), path) in primals.iter().zip(tangents).zip(primal_tree.leaf_paths()) {
        let dims = p.shape().dims().iter().zip(t.shape().dims());
        let compatible = p.dtype() == t.dtype()
            && p.ndim() == t.ndim()
            && dims.clone().all(|(a, b)| match (a.known(), b.known()) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            });
        if !compatible {
            return Err(Error::Tree {
                path: arg_path(&path),
                detail: format!(
                    "{op}: the tangent is {} but the primal is {}",
                    t.aval(),
                    p.aval()
                ),
            });
        }
        // Under shapeless compile a primal and its tangent get symbols of
        // their own: they must be equal, which the entry's guards check.
        for (a, b) in dims {
            if !crate::symbolic::dims_equal(a, b) {
                crate::symbolic::assume_equal(op, a, b);
            }
        }
    }
    Ok(())
}

/// `error` unchanged, unless it is a tree error without a path, which gets
/// the arguments' root.
fn in_function(op: &str, in_tree: &TreeDef, error: Error) -> Error {
    match error {
        Error::Tree { path, detail } if path.is_empty() => Error::Tree {
            path: format!("{op} of a function of {}", in_tree.brief()),
            detail,
        },
        other => other,
    }
}

/// [`f`](linearize)'s outputs at the primals, and its tangent map there:
/// the Jacobian-vector product as a function of the tangents alone,
/// compiled once. The primal values the tangent map reads (the residuals:
/// `cos(x)` for `sin(x)`, the operands of a product) are computed once,
/// when `linearize` runs, and kept as constants of the map's executable, so
/// each [`Linear::call`] runs only the tangent arithmetic, on the CPU.
///
/// ```
/// use kiln::{linearize, Array};
/// let x = Array::from_vec(vec![0.0f32, 1.0], &[2])?;
/// let (y, tangent_map) = linearize(|x: Array| x.exp(), &x)?;
/// assert_eq!(y.to_vec::<f32>()?, vec![1.0, std::f32::consts::E]);
/// let dy = tangent_map.call(&Array::from_vec(vec![2.0f32, 1.0], &[2])?)?;
/// assert_eq!(dy.to_vec::<f32>()?, vec![2.0, std::f32::consts::E]);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn linearize<In: Tree, Out: FunctionOutput<Value = V>, V: Tree>(
    f: impl FnOnce(In) -> Out,
    primals: &In,
) -> Result<(V, Linear<In, V>)> {
    let (leaves, in_tree) = tree_flatten(primals)?;
    if leaves.iter().any(Array::is_tracer) {
        return Err(crate::error::arg_err(
            "linearize",
            "runs eagerly on concrete primals; inside a compiled function use `jvp`",
        ));
    }
    crate::compile::eval::eval(&leaves)?;
    let out = f(tree_unflatten(&in_tree, leaves.clone())?).into_value()?;
    let (out_leaves, out_tree) = tree_flatten(&out)?;
    let trace = next_trace_id();
    let params: Vec<Array> = leaves
        .iter()
        .enumerate()
        .map(|(i, leaf)| Array::param(trace, i, leaf.aval().clone()))
        .collect();
    let given = leaves
        .iter()
        .zip(&params)
        .map(|(leaf, p)| leaf.dtype().is_float().then(|| p.clone()))
        .collect();
    let pushed = push_tangents(&out_leaves, &leaves, given)
        .map_err(|e| in_function("linearize", &in_tree, e))?;
    let tangents_out: Vec<Array> = out_leaves
        .iter()
        .zip(pushed)
        .map(|(o, t)| t.unwrap_or_else(|| o.zeros_like()))
        .collect();
    let mut computed_once = out_leaves.clone();
    computed_once.extend(residuals(&tangents_out, trace));
    crate::compile::eval::eval(&computed_once)?;
    let shapes: Vec<Vec<usize>> = leaves
        .iter()
        .map(|a| a.shape().as_known().unwrap_or_default())
        .collect();
    let exe = build_traced(&tangents_out, trace, &shapes)?;
    Ok((
        out,
        Linear {
            exe,
            shapes,
            primals: leaves,
            in_tree,
            out_tree,
            types: PhantomData,
        },
    ))
}

/// The primal values (not depending on a param of `trace`, not yet
/// computed) that the tangent computation below `tangents` reads.
fn residuals(tangents: &[Array], trace: u64) -> Vec<Array> {
    let order = topological_order(tangents);
    let mut active: HashSet<usize> = HashSet::new();
    let mut found: Vec<Array> = Vec::new();
    let mut seen: HashSet<usize> = HashSet::new();
    for array in &order {
        match &array.node.kind {
            NodeKind::Param { trace: t, .. } if *t == trace => {
                active.insert(array.id());
            }
            NodeKind::Op { inputs, .. } if !array.is_computed() => {
                let inputs = inputs.lock().unwrap_or_else(|p| p.into_inner());
                if inputs.iter().any(|i| active.contains(&i.id())) {
                    active.insert(array.id());
                    for input in inputs.iter() {
                        if !active.contains(&input.id())
                            && !input.is_computed()
                            && seen.insert(input.id())
                        {
                            found.push(input.clone());
                        }
                    }
                }
            }
            _ => {}
        }
    }
    found
}

/// The tangent map made by [`linearize`].
pub struct Linear<In, Out> {
    exe: Executable,
    shapes: Vec<Vec<usize>>,
    primals: Vec<Array>,
    in_tree: TreeDef,
    out_tree: TreeDef,
    types: PhantomData<fn(In) -> Out>,
}

impl<In: Tree, Out: Tree> Linear<In, Out> {
    /// `J·tangents`, in the outputs' tree type. `tangents` must have the
    /// primals' structure, shapes and dtypes (an `Err` names the first path
    /// that differs).
    pub fn call(&self, tangents: &In) -> Result<Out> {
        let (leaves, tree) = tree_flatten(tangents)?;
        check_tangents("linearize", &self.in_tree, &self.primals, &tree, &leaves)?;
        let values = run_built(&self.exe, &self.shapes, &leaves)?;
        tree_unflatten(&self.out_tree, values)
    }
}

/// The Jacobian of `f`, a function of any tree returning any tree of
/// float arrays, by forward mode. The result is the output's tree with
/// each output leaf replaced by the argument's tree holding, per argument
/// leaf, `∂out_leaf/∂in_leaf` with shape `out_leaf.shape ++
/// in_leaf.shape` (see [`JacobianOutput`] for the Rust types: one array
/// output gives the argument's type): one forward pass per argument leaf,
/// batched over the leaf's elements (see the [module docs](self)); shapes
/// must be known. Compiles like [`crate::grad`]: `compile(jacfwd(f))` is
/// one cache entry.
///
/// ```
/// use kiln::{jacfwd, Array};
/// let j = jacfwd(|x: Array| &x * &x).call(&Array::from_vec(vec![1.0f32, 3.0], &[2])?)?;
/// assert_eq!(j.to_vec::<f32>()?, vec![2.0, 0.0, 0.0, 6.0]);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn jacfwd<F>(f: F) -> JacFwd<F> {
    JacFwd { f }
}

/// The Jacobian of `f` by reverse mode (see [`jacfwd`] for the layout):
/// one reverse pass per output leaf, batched over its elements.
///
/// ```
/// use kiln::{jacrev, Array};
/// let j = jacrev(|x: Array| x.sum_all()).call(&Array::from_vec(vec![1.0f32, 3.0], &[2])?)?;
/// assert_eq!(j.to_vec::<f32>()?, vec![1.0, 1.0]);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn jacrev<F>(f: F) -> JacRev<F> {
    JacRev { f }
}

/// The Hessian of `f`, a function of any tree returning a tree of float
/// arrays (a scalar loss, usually): `jacfwd(jacrev(f))`, so of an array
/// `x` to an array, shape `out.shape ++ x.shape ++ x.shape`. Over a tree
/// argument each level is laid out as [`jacfwd`] lays it out: for a
/// tuple `(a, b)` and one output array, `((Haa, Hab), (Hba, Hbb))`; for a
/// derived struct, a `Vec` with one struct per leaf (see
/// [`JacobianOutput`]).
///
/// ```
/// use kiln::{hessian, Array};
/// let h = hessian(|x: Array| (&x * &x * &x).sum_all())
///     .call(&Array::from_vec(vec![1.0f32, 2.0], &[2])?)?;
/// assert_eq!(h.to_vec::<f32>()?, vec![6.0, 0.0, 0.0, 12.0]);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn hessian<F>(f: F) -> Hessian<F> {
    Hessian { f }
}

/// A function's Jacobian by forward mode; made by [`jacfwd`].
pub struct JacFwd<F> {
    f: F,
}

/// A function's Jacobian by reverse mode; made by [`jacrev`].
pub struct JacRev<F> {
    f: F,
}

/// A function's Hessian; made by [`hessian`].
pub struct Hessian<F> {
    f: F,
}

/// Marks the [`Function`] implementation of [`JacFwd`].
pub enum JacFwdMarker {}
/// Marks the [`Function`] implementation of [`JacRev`].
pub enum JacRevMarker {}
/// Marks the [`Function`] implementation of [`Hessian`].
pub enum HessianMarker {}

/// The Jacobian type of `f: In -> Out`.
type JacobianOf<Out, In> = <Out as JacobianOutput<In>>::Jacobian;
/// The Hessian type of `f: In -> Out`: the Jacobian of its Jacobian.
type HessianOf<Out, In> = JacobianOf<JacobianOf<Out, In>, In>;

impl<F> JacFwd<F> {
    /// The Jacobian at `args`, computed now.
    pub fn call<In: Tree, Out: JacobianOutput<In>>(&self, args: &In) -> Result<JacobianOf<Out, In>>
    where
        F: Fn(In) -> Out,
    {
        compile(JacFwd { f: &self.f }).call(args)
    }
}

impl<F> JacRev<F> {
    /// The Jacobian at `args`, computed now.
    pub fn call<In: Tree, Out: JacobianOutput<In>>(&self, args: &In) -> Result<JacobianOf<Out, In>>
    where
        F: Fn(In) -> Out,
    {
        compile(JacRev { f: &self.f }).call(args)
    }
}

impl<F> Hessian<F> {
    /// The Hessian at `args`, computed now.
    pub fn call<In: Tree, Out>(&self, args: &In) -> Result<HessianOf<Out, In>>
    where
        F: Fn(In) -> Out,
        Out: JacobianOutput<In>,
        JacobianOf<Out, In>: JacobianOutput<In>,
    {
        compile(Hessian { f: &self.f }).call(args)
    }
}

impl<In: Tree, Out: JacobianOutput<In>, F: Fn(In) -> Out>
    Function<In, JacobianOf<Out, In>, JacFwdMarker> for JacFwd<F>
{
    fn apply(&self, args: In) -> Result<JacobianOf<Out, In>> {
        jacobian_forward(|args| Ok((self.f)(args)), args)
    }
}

impl<In: Tree, Out: JacobianOutput<In>, F: Fn(In) -> Out>
    Function<In, JacobianOf<Out, In>, JacRevMarker> for JacRev<F>
{
    fn apply(&self, args: In) -> Result<JacobianOf<Out, In>> {
        jacobian_reverse(|args| Ok((self.f)(args)), args)
    }
}

impl<In, Out, F> Function<In, HessianOf<Out, In>, HessianMarker> for Hessian<F>
where
    In: Tree,
    F: Fn(In) -> Out,
    Out: JacobianOutput<In>,
    JacobianOf<Out, In>: JacobianOutput<In>,
{
    fn apply(&self, args: In) -> Result<HessianOf<Out, In>> {
        jacobian_forward(
            |args: In| jacobian_reverse(|args: In| Ok((self.f)(args)), args),
            args,
        )
    }
}

/// The leaves of `args`, its structure, and `f`'s output at them with its
/// leaves and their dims, checked for a Jacobian: float leaves of known
/// shapes in and out (an `Err` names the first leaf path that is not).
#[allow(clippy::type_complexity)]
fn jacobian_setup<In: Tree, Out: Tree>(
    op: &str,
    f: impl FnOnce(In) -> Result<Out>,
    args: In,
) -> Result<(Vec<Array>, TreeDef, Out, Vec<Array>, Vec<Vec<usize>>)> {
    let (leaves, tree) = tree_flatten(&args)?;
    for (leaf, path) in leaves.iter().zip(tree.leaf_paths()) {
        known_float_dims(op, leaf, &path)?;
    }
    let out = f(args)?;
    let (out_leaves, out_tree) = tree_flatten(&out)?;
    let mut out_dims = Vec::with_capacity(out_leaves.len());
    for (leaf, path) in out_leaves.iter().zip(out_tree.leaf_paths()) {
        leaf.first_error()?;
        let dims = known_float_dims(op, leaf, &path).map_err(|_| Error::Shape {
            op: op.into(),
            detail: format!(
                "the function's output{} must be a float array of known shape",
                if path.is_empty() {
                    String::new()
                } else {
                    format!(" leaf {path}")
                }
            ),
            operands: leaf.aval().to_string(),
            at: None,
        })?;
        out_dims.push(dims);
    }
    Ok((leaves, tree, out, out_leaves, out_dims))
}

/// `a`'s dims, or an `Err` naming `path` when `a` is not a float or has a
/// symbolic dim.
fn known_float_dims(op: &str, a: &Array, path: &KeyPath) -> Result<Vec<usize>> {
    match a.shape().as_known() {
        Some(dims) if a.dtype().is_float() => Ok(dims),
        _ => Err(Error::Tree {
            path: arg_path(path),
            detail: format!(
                "{op} needs float leaves of known shape (the basis has one vector per element), got {}",
                a.aval()
            ),
        }),
    }
}

/// The identity basis for values of `dims`: `[n] ++ dims` with example
/// `k` the one-hot array of element `k` (`n` the element count).
fn basis(dims: &[usize], dtype: crate::DType) -> Result<Array> {
    let n: usize = dims.iter().product();
    let data = HostData::from_f64s(
        dtype,
        (0..n * n).map(|i| f64::from(u8::from(i / n == i % n))),
    );
    let mut shape = vec![n];
    shape.extend(dims);
    Array::from_data(data, &shape)
}

/// Each of `per_example` that is not `None` (functions of the
/// placeholder `at`) evaluated for every vector of the identity basis of
/// `at`'s values at once, through the batching rules (one batched walk):
/// `[n] ++ per_example.shape`; `None` stays `None`.
fn over_basis(per_example: Vec<Option<Array>>, at: &Array) -> Result<Vec<Option<Array>>> {
    let dims = at.shape().as_known().unwrap_or_default();
    let n = Dim::Known(dims.iter().product());
    let present: Vec<Array> = per_example.iter().flatten().cloned().collect();
    let batched = batch_values(
        &present,
        std::slice::from_ref(at),
        vec![Batched::along(basis(&dims, at.dtype())?, 0)],
        &n,
    )?;
    let mut batched = batched.iter().map(|b| b.materialized(&n));
    Ok(per_example
        .into_iter()
        .map(|p| p.and_then(|_| batched.next()))
        .collect())
}

/// The shape of `∂out/∂in`: `out.shape ++ in.shape`.
fn block_dims(out: &[usize], input: &Array) -> Vec<usize> {
    let input = input.shape().as_known().unwrap_or_default();
    out.iter().chain(&input).copied().collect()
}

/// `∂out_leaf/∂in_leaf` blocks (`blocks[o][i]`) assembled into `out`'s
/// Jacobian: per output leaf, the argument tree of its blocks.
fn assemble<In: Tree, Out: JacobianOutput<In>>(
    out: &Out,
    in_tree: &TreeDef,
    blocks: Vec<Vec<Array>>,
) -> Result<JacobianOf<Out, In>> {
    let per_leaf = blocks
        .into_iter()
        .map(|row| tree_unflatten(in_tree, row))
        .collect::<Result<Vec<In>>>()?;
    out.jacobian_from(&mut per_leaf.into_iter())
}

/// The Jacobian by forward mode: per argument leaf, the tangents of the
/// outputs for a placeholder tangent of the leaf, batched over the leaf's
/// basis (one batched forward pass), the basis axis moved last.
fn jacobian_forward<In: Tree, Out: JacobianOutput<In>>(
    f: impl FnOnce(In) -> Result<Out>,
    args: In,
) -> Result<JacobianOf<Out, In>> {
    let (leaves, tree, out, out_leaves, out_dims) = jacobian_setup("jacfwd", f, args)?;
    let trace = next_trace_id();
    let mut blocks: Vec<Vec<Array>> = vec![Vec::with_capacity(leaves.len()); out_leaves.len()];
    for (i, leaf) in leaves.iter().enumerate() {
        let tangent = Array::param(trace, i, leaf.aval().clone());
        let mut tangents = vec![None; leaves.len()];
        tangents[i] = Some(tangent.clone());
        let pushed = push_tangents(&out_leaves, &leaves, tangents)?;
        let columns = over_basis(pushed, &tangent)?;
        for (((o, column), dims), row) in out_leaves
            .iter()
            .zip(columns)
            .zip(&out_dims)
            .zip(&mut blocks)
        {
            let dims = block_dims(dims, leaf);
            row.push(match column {
                Some(c) => {
                    let mut last: Vec<usize> = (1..c.ndim()).collect();
                    last.push(0);
                    c.permute(&last).reshape_to(Shape::known(&dims))
                }
                None => Array::zeros(&dims, o.dtype()),
            });
        }
    }
    assemble(&out, &tree, blocks)
}

/// The Jacobian by reverse mode: per output leaf, the cotangents of the
/// argument leaves for a placeholder seed of it, batched over the output
/// leaf's basis (one batched reverse pass).
fn jacobian_reverse<In: Tree, Out: JacobianOutput<In>>(
    f: impl FnOnce(In) -> Result<Out>,
    args: In,
) -> Result<JacobianOf<Out, In>> {
    let (leaves, tree, out, out_leaves, out_dims) = jacobian_setup("jacrev", f, args)?;
    let trace = next_trace_id();
    let mut blocks = Vec::with_capacity(out_leaves.len());
    for (o, (out_leaf, dims)) in out_leaves.iter().zip(&out_dims).enumerate() {
        let seed = Array::param(trace, o, out_leaf.aval().clone());
        let mut seeds = vec![None; out_leaves.len()];
        seeds[o] = Some(seed.clone());
        let grads = backward(&out_leaves, seeds, &leaves)?;
        let rows = over_basis(grads, &seed)?;
        let row = rows
            .into_iter()
            .zip(&leaves)
            .map(|(r, leaf)| {
                let dims = block_dims(dims, leaf);
                match r {
                    Some(r) => r.reshape_to(Shape::known(&dims)),
                    None => Array::zeros(&dims, leaf.dtype()),
                }
            })
            .collect();
        blocks.push(row);
    }
    assemble(&out, &tree, blocks)
}
