//! [`vmap`]: write the per-example function, get the batched one. Like
//! `grad` it traces and runs through `compile`, so `compile(vmap(f))` is
//! one cache entry and `vmap` inside a compiled function (or of `grad`)
//! adds to that trace; the walk that batches the graph is
//! `transform/batching.rs`.

use super::cache::{compile, normalize_arg_path, Function};
use super::report::arg_path;
use crate::error::{Error, Result};
use crate::handle::array::Array;
use crate::ops::batching::Batched;
use crate::shape::{Aval, Dim, Shape};
use crate::trace::next_trace_id;
use crate::transform::batching::batch_values;
use crate::tree::path::KeyPath;
use crate::tree::{tree_flatten, tree_unflatten, Tree, TreeDef};
use std::marker::PhantomData;

/// `f` mapped over a batch axis of its arguments: the result of `f` on
/// each example, stacked along the outputs' batch axis. By default every
/// argument leaf is batched along axis 0 and every output gets the batch
/// as axis 0; [`Vmap::in_axes`] and [`Vmap::out_axes`] choose per subtree.
/// All batched leaves must have the same batch size (an `Err` names the
/// two leaf paths and their sizes).
///
/// The batched program is built from each op's batching rule, not a loop:
/// a per-example matrix-vector product becomes one matrix product. Ops
/// without a rule (user kernels, custom ops without
/// [`with_vmap`](crate::ops::custom::CustomOp::with_vmap), `gather_qmm`,
/// a `take` or `scatter_add` whose indices vary per example) run once per
/// example inside the graph, which needs a known batch size.
///
/// ```
/// use kiln::{vmap, Array};
/// let w = Array::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
/// // Per example: a vector times the shared matrix.
/// let f = vmap(|(x, w): (Array, Array)| x.matmul(&w)).in_axes([("args[1]", None)]);
/// let xs = Array::from_vec(vec![1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2])?;
/// let ys = f.call(&(xs, w))?;
/// assert_eq!(ys.to_vec::<f32>()?, vec![1.0, 2.0, 3.0, 4.0, 4.0, 6.0]);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn vmap<F>(f: F) -> Vmap<F> {
    Vmap {
        f,
        in_axes: Vec::new(),
        out_axes: Vec::new(),
    }
}

/// A function mapped over a batch axis; made by [`vmap`].
pub struct Vmap<F> {
    f: F,
    in_axes: Vec<(String, Option<isize>)>,
    out_axes: Vec<(String, Option<isize>)>,
}

/// Marks the [`Function`] implementation of [`Vmap`] over a function
/// whose own implementation has the marker `M`.
pub struct VmapMarker<M>(PhantomData<M>);

/// The arguments of a vmapped call split into examples.
struct Split {
    /// The per-example arguments: placeholders for batched leaves, shared
    /// leaves as they are.
    per_example: Vec<Array>,
    /// The placeholders, and the batched values they stand for.
    placeholders: Vec<Array>,
    batched: Vec<Batched>,
    /// The batch size.
    size: Dim,
}

/// A path of the outputs as `out_axes` takes it (and an export names its
/// results): `out`, `out[1]`, `out.x`.
pub(crate) fn out_path(path: &KeyPath) -> String {
    let rendered = path.to_string();
    if path.is_empty() {
        "out".to_string()
    } else if rendered.starts_with('[') {
        format!("out{rendered}")
    } else {
        format!("out.{rendered}")
    }
}

/// `path` written with the `out` root.
fn normalize_out_path(path: String) -> String {
    if path == "out" || path.starts_with("out.") || path.starts_with("out[") {
        path
    } else if path.starts_with('[') {
        format!("out{path}")
    } else {
        format!("out.{path}")
    }
}

/// For each of `leaves` (rendered paths), the axis of the longest `spec`
/// path it is under, else axis 0; `Err` for a spec path no leaf is under.
fn axes_for(
    op: &str,
    leaves: &[String],
    spec: &[(String, Option<isize>)],
) -> Result<Vec<Option<isize>>> {
    let under = |leaf: &str, root: &str| {
        leaf == root
            || (leaf.starts_with(root)
                && matches!(leaf.as_bytes().get(root.len()), Some(b'.' | b'[')))
    };
    for (root, _) in spec {
        if !leaves.iter().any(|leaf| under(leaf, root)) {
            return Err(Error::InvalidArgument {
                op: op.into(),
                detail: format!("no leaf at `{root}`; the leaves are {}", leaves.join(", ")),
                at: None,
            });
        }
    }
    Ok(leaves
        .iter()
        .map(|leaf| {
            spec.iter()
                .filter(|(root, _)| under(leaf, root))
                .max_by_key(|(root, _)| root.len())
                .map_or(Some(0), |(_, axis)| *axis)
        })
        .collect())
}

/// `axis` of a value of `rank` as an index (negative counts from the end),
/// or an `Err` naming `what` at `path`.
fn resolve_axis(axis: isize, rank: usize, what: &str, path: &str, aval: &Aval) -> Result<usize> {
    let resolved = if axis < 0 { axis + rank as isize } else { axis };
    usize::try_from(resolved)
        .ok()
        .filter(|&a| a < rank)
        .ok_or_else(|| Error::Tree {
            path: path.to_string(),
            detail: format!("vmap: {what} axis {axis} is out of range for {aval}"),
        })
}

impl<F> Vmap<F> {
    /// The batch axis of the arguments' subtrees: each entry is a path as
    /// reports write it (`args`, `args.params`, `[1]`) and an axis
    /// (negative counts from the end) or `None` (the subtree is shared by
    /// every example). The longest path above a leaf decides; leaves under
    /// none are batched along axis 0.
    pub fn in_axes<P: Into<String>>(
        mut self,
        spec: impl IntoIterator<Item = (P, Option<isize>)>,
    ) -> Self {
        self.in_axes = spec
            .into_iter()
            .map(|(p, a)| (normalize_arg_path(p.into()), a))
            .collect();
        self
    }

    /// Where the outputs' subtrees get the batch axis: paths `out`,
    /// `out[0]`, `out.loss` (or `[0]`, `loss`) with an axis of the batched
    /// output, or `None` for an output that is the same for every example
    /// (an `Err` if it is not). Default: axis 0 everywhere.
    pub fn out_axes<P: Into<String>>(
        mut self,
        spec: impl IntoIterator<Item = (P, Option<isize>)>,
    ) -> Self {
        self.out_axes = spec
            .into_iter()
            .map(|(p, a)| (normalize_out_path(p.into()), a))
            .collect();
        self
    }

    /// The batched result at `args`, computed now. `f` is a closure or
    /// another transformation (`vmap(grad(loss))`: per-example gradients).
    pub fn call<In: Tree, Out: Tree, M>(&self, args: &In) -> Result<Out>
    where
        F: Function<In, Out, M>,
    {
        compile(Borrowed(self)).call(args)
    }
}

/// A [`Vmap`] borrowed for [`Vmap::call`]'s compile.
struct Borrowed<'a, F>(&'a Vmap<F>);

impl<In: Tree, Out: Tree, M, F: Function<In, Out, M>> Function<In, Out, VmapMarker<M>>
    for Borrowed<'_, F>
{
    fn apply(&self, args: In) -> Result<Out> {
        self.0.batched(args)
    }
}

impl<In: Tree, Out: Tree, M, F: Function<In, Out, M>> Function<In, Out, VmapMarker<M>> for Vmap<F> {
    fn apply(&self, args: In) -> Result<Out> {
        self.batched(args)
    }
}

impl<F> Vmap<F> {
    /// `f` run on per-example placeholders, its graph batched.
    fn batched<In: Tree, Out: Tree, M>(&self, args: In) -> Result<Out>
    where
        F: Function<In, Out, M>,
    {
        let (leaves, in_tree) = tree_flatten(&args)?;
        let Split {
            per_example,
            placeholders,
            batched,
            size,
        } = self.split(&leaves, &in_tree)?;
        let out = self.f.apply(tree_unflatten(&in_tree, per_example)?)?;
        let (out_leaves, out_tree) = tree_flatten(&out)?;
        let results = batch_values(&out_leaves, &placeholders, batched, &size)?;
        self.place_outputs(results, &out_leaves, &out_tree, &size)
    }
}

impl<F> Vmap<F> {
    /// The arguments split into examples.
    fn split(&self, leaves: &[Array], in_tree: &TreeDef) -> Result<Split> {
        let paths: Vec<String> = in_tree.leaf_paths().iter().map(arg_path).collect();
        let axes = axes_for("vmap", &paths, &self.in_axes)?;
        let trace = next_trace_id();
        let mut size: Option<(Dim, usize)> = None;
        let (mut per_example, mut placeholders, mut batched) = (Vec::new(), Vec::new(), Vec::new());
        for (i, (leaf, axis)) in leaves.iter().zip(axes).enumerate() {
            let Some(axis) = axis else {
                per_example.push(leaf.clone());
                continue;
            };
            let axis = resolve_axis(axis, leaf.ndim(), "in", &paths[i], leaf.aval())?;
            let dims = leaf.shape().dims();
            let d = dims[axis].clone();
            match &size {
                None => size = Some((d.clone(), i)),
                Some((s, j)) => match (s.known(), d.known()) {
                    (Some(a), Some(b)) if a != b => {
                        return Err(Error::Tree {
                            path: paths[i].clone(),
                            detail: format!(
                                "vmap: batch size {b} at `{}` but {a} at `{}`",
                                paths[i], paths[*j]
                            ),
                        })
                    }
                    _ if !crate::symbolic::dims_equal(s, &d) => {
                        crate::symbolic::assume_equal("vmap", s, &d);
                    }
                    _ => {}
                },
            }
            let example: Vec<Dim> = dims
                .iter()
                .enumerate()
                .filter(|&(a, _)| a != axis)
                .map(|(_, d)| d.clone())
                .collect();
            let placeholder = Array::param(trace, i, Aval::new(Shape(example), leaf.dtype()));
            per_example.push(placeholder.clone());
            placeholders.push(placeholder);
            batched.push(Batched::along(leaf.clone(), axis));
        }
        let Some((size, _)) = size else {
            return Err(Error::InvalidArgument {
                op: "vmap".into(),
                detail: format!(
                    "no argument leaf is batched (in_axes makes every leaf shared); the \
                     leaves are {}",
                    paths.join(", ")
                ),
                at: None,
            });
        };
        Ok(Split {
            per_example,
            placeholders,
            batched,
            size,
        })
    }

    /// The batched outputs with their batch axes where `out_axes` puts
    /// them, in the outputs' tree type.
    fn place_outputs<Out: Tree>(
        &self,
        results: Vec<Batched>,
        out_leaves: &[Array],
        out_tree: &TreeDef,
        size: &Dim,
    ) -> Result<Out> {
        let paths: Vec<String> = out_tree.leaf_paths().iter().map(out_path).collect();
        let axes = axes_for("vmap out_axes", &paths, &self.out_axes)?;
        let mut values = Vec::with_capacity(results.len());
        for (((result, axis), path), example) in
            results.into_iter().zip(axes).zip(&paths).zip(out_leaves)
        {
            let value = match axis {
                Some(axis) => {
                    let front = result.materialized(size);
                    let axis = resolve_axis(axis, front.ndim(), "out", path, front.aval())?;
                    if axis == 0 {
                        front
                    } else {
                        let mut perm: Vec<usize> = (1..front.ndim()).collect();
                        perm.insert(axis, 0);
                        front.permute(&perm)
                    }
                }
                None if result.axis.is_none() => result.value,
                None => {
                    return Err(Error::Tree {
                        path: path.clone(),
                        detail: format!(
                            "vmap: out_axes says the output ({}) is shared, but it differs \
                             between examples",
                            example.aval()
                        ),
                    })
                }
            };
            values.push(value);
        }
        tree_unflatten(out_tree, values)
    }
}
