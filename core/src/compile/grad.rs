//! The user-facing reverse-mode transformations: [`grad`],
//! [`value_and_grad`] and [`vjp`] differentiate a function of any tree.
//! They trace and run through `compile`, so they sit in its layer; the walk
//! over the lazy graph they use is `transform/autodiff.rs`.

use super::cache::{compile, leaves_under, normalize_arg_path, Function, FunctionOutput};
use super::report::arg_path;
use crate::error::{Error, Result};
use crate::exec::{Backend, CpuBackend, Executable};
use crate::handle::array::Array;
use crate::ir::passes::Passes;
use crate::trace::{extract, next_trace_id, Leaves};
use crate::transform::autodiff::backward;
use crate::transform::implicit::optimize;
use crate::tree::{tree_unflatten, Tree, TreeDef};
use std::collections::HashSet;
use std::marker::PhantomData;

/// The gradient of `f`, a function of any tree returning a scalar float
/// array (or a `Result` of one, whose `Err` is the gradient's), with
/// respect to its argument (or to the subtrees chosen with
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
    pub fn call<In: Tree, L>(&self, args: &In) -> Result<In>
    where
        F: Fn(In) -> L,
        L: FunctionOutput<Value = Array>,
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
    pub fn call<In: Tree, L>(&self, args: &In) -> Result<(Array, In)>
    where
        F: Fn(In) -> L,
        L: FunctionOutput<Value = Array>,
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
    pub fn call<In: Tree, Aux: Tree, L>(&self, args: &In) -> Result<((Array, Aux), In)>
    where
        F: Fn(In) -> L,
        L: FunctionOutput<Value = (Array, Aux)>,
    {
        compile(ValueAndGradWithAux {
            f: &self.f,
            wrt: self.wrt.clone(),
        })
        .call(args)
    }
}

impl<In, L, F> Function<In, In, GradMarker> for Grad<F>
where
    In: Tree,
    L: FunctionOutput<Value = Array>,
    F: Fn(In) -> L,
{
    fn apply(&self, args: In) -> Result<In> {
        Ok(differentiate(args, &self.wrt, |args| (self.f)(args).into_value())?.1)
    }
}

impl<In, L, F> Function<In, (Array, In), ValueAndGradMarker> for ValueAndGrad<F>
where
    In: Tree,
    L: FunctionOutput<Value = Array>,
    F: Fn(In) -> L,
{
    fn apply(&self, args: In) -> Result<(Array, In)> {
        differentiate(args, &self.wrt, |args| (self.f)(args).into_value())
    }
}

impl<In, Aux, L, F> Function<In, ((Array, Aux), In), ValueAndGradWithAuxMarker>
    for ValueAndGradWithAux<F>
where
    In: Tree,
    Aux: Tree,
    L: FunctionOutput<Value = (Array, Aux)>,
    F: Fn(In) -> L,
{
    fn apply(&self, args: In) -> Result<((Array, Aux), In)> {
        let mut aux = None;
        let (loss, gradient) = differentiate(args, &self.wrt, |args| {
            let (loss, extra) = (self.f)(args).into_value()?;
            aux = Some(extra);
            Ok(loss)
        })?;
        let aux = aux.ok_or_else(|| Error::Tree {
            path: "args".into(),
            detail: "the function was not called".into(),
        })?;
        Ok(((loss, aux), gradient))
    }
}

/// Calls `loss_of(args)` (its `Err` is the result's) and differentiates the scalar loss with respect to
/// the leaves of `args` under `wrt` (all of them when empty): an integer
/// leaf, a non-scalar loss or an op without a vjp is an `Err`.
fn differentiate<In: Tree>(
    args: In,
    wrt: &[String],
    loss_of: impl FnOnce(In) -> Result<Array>,
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
                at: None,
            });
        }
    }
    let loss = loss_of(tree_unflatten(&tree, leaves.clone())?)?.check()?;
    if loss.ndim() != 0 || !loss.dtype().is_float() {
        return Err(Error::Shape {
            op: "grad".into(),
            detail: "the function must return a scalar float loss (use `vjp` for other outputs)"
                .into(),
            operands: loss.aval().to_string(),
            at: None,
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
                None => leaf.zeros_like(),
            },
        )
        .collect();
    Ok((loss, tree_unflatten(&tree, gradient)?))
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
pub fn vjp<In: Tree, Out: FunctionOutput<Value = V>, V: Tree>(
    f: impl FnOnce(In) -> Out,
    primals: &In,
) -> Result<(V, Pullback<In, V>)> {
    let mut leaves = Vec::new();
    let in_tree = primals.flatten(&mut leaves)?;
    crate::compile::eval::eval(&leaves)?;
    let trace = next_trace_id();
    let params: Vec<Array> = leaves
        .iter()
        .enumerate()
        .map(|(i, leaf)| Array::param(trace, i, leaf.aval().clone()))
        .collect();
    let out = f(tree_unflatten(&in_tree, params.clone())?).into_value()?;
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
            if !crate::symbolic::avals_equal(seed.aval(), output.aval()) {
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
        crate::compile::eval::eval(&seeds)?;
        let grads = backward(
            &self.traced_outputs,
            seeds.into_iter().map(Some).collect(),
            &self.params,
        )?;
        let grads: Vec<Array> = grads
            .into_iter()
            .zip(&self.params)
            .map(|(g, p)| g.unwrap_or_else(|| p.zeros_like()))
            .collect();
        let values = run_traced(&grads, self.trace, &self.primals)?;
        tree_unflatten(&self.in_tree, values)
    }
}

/// Runs the traced `outputs` of trace `trace` on the CPU executor with
/// `inputs` as its arguments.
fn run_traced(outputs: &[Array], trace: u64, inputs: &[Array]) -> Result<Vec<Array>> {
    let shapes: Vec<Vec<usize>> = inputs
        .iter()
        .map(|a| a.shape().as_known().unwrap_or_default())
        .collect();
    run_built(&build_traced(outputs, trace, &shapes)?, &shapes, inputs)
}

/// The optimized CPU executable of the traced `outputs` of trace `trace`,
/// whose arguments have `shapes`.
pub(super) fn build_traced(
    outputs: &[Array],
    trace: u64,
    shapes: &[Vec<usize>],
) -> Result<Executable> {
    let (graph, _) = extract(
        outputs,
        Leaves::Trace {
            id: trace,
            num_inputs: shapes.len(),
        },
        &HashSet::new(),
    )?;
    // As `compile` for the CPU executor, which runs it.
    let passes = Passes {
        transposed_operands: CpuBackend.reads_transposed_operands(),
        ..Passes::default()
    };
    let (graph, _) = optimize(&graph, passes)?;
    let refs: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
    Executable::new(graph, Vec::new(), &vec![false; shapes.len()], &refs)
}

/// Runs `exe` (from [`build_traced`]) on the CPU executor with `inputs`, of
/// `shapes`, as its arguments.
pub(super) fn run_built(
    exe: &Executable,
    shapes: &[Vec<usize>],
    inputs: &[Array],
) -> Result<Vec<Array>> {
    crate::compile::eval::eval(inputs)?;
    let refs: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
    let buffers = inputs
        .iter()
        .map(|a| {
            a.host_value()?.ok_or_else(|| Error::ReadTracer {
                aval: a.aval().to_string(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let resolved = exe.resolve_shapes(&refs)?;
    let results = CpuBackend.run(exe, buffers, &resolved)?;
    Ok(results
        .into_iter()
        .zip(&exe.graph().outputs)
        .map(|(data, &o)| Array::from_host(data, crate::shape::Shape::known(&resolved[o])))
        .collect())
}
