//! Custom ops: an op a program defines over a tree of arguments (seed
//! magi #32), one node in the graph however it is computed.
//!
//! The arguments are any [`Tree`](crate::Tree), typically a `#[derive(Tree)]` struct:
//! its array leaves are the node's operands, its static values (numbers,
//! bools, strings, enums; `#[tree(static)]` fields) are attributes, compared
//! by value. Two calls of one op with equal attributes on the same operands
//! are equal nodes, so CSE merges them; an attribute that changes between
//! calls of a compiled function is a cache miss naming its path.
//!
//! The forward is a Kiln composition (it may call a user [`Kernel`]): the
//! node's shape rule traces it abstractly, so shapeless compile stays total,
//! and executors run it as a small executable of its own per set of
//! resolved shapes, which keeps the node opaque to the outer passes. An
//! optional vjp returns one cotangent per original argument in the
//! argument's own tree type (static fields take none; any subtree may be
//! `None` for "no gradient").
//!
//! [`Kernel`]: super::kernel::Kernel

use super::batching::{per_example, Batched};
use super::{Guard, Op, ShapeCx};
use crate::data::HostData;
use crate::error::{Error, Result};
use crate::handle::array::Array;
use crate::shape::{Aval, Dim, Shape};
use crate::tree::def::TreeDef;
use crate::tree::path::{KeyPath, PathEntry};
use std::any::Any;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::sync::Arc;

pub(crate) type ForwardFn = dyn Fn(&TreeDef, Vec<Array>) -> Result<Array> + Send + Sync;
pub(crate) type VjpFn =
    dyn Fn(&TreeDef, Vec<Array>, &Array, &Array) -> Result<(Vec<Array>, TreeDef)> + Send + Sync;
pub(crate) type VmapFn = dyn Fn(&TreeDef, Vec<Array>, &Dim) -> Result<Array> + Send + Sync;
pub(crate) type JvpFn =
    dyn Fn(&TreeDef, Vec<Array>, &Array, Vec<Array>) -> Result<Array> + Send + Sync;

/// What a custom op needs from the layers above the op families: its
/// forward traced abstractly (the shape rule) and run on host data (the
/// reference evaluation), both through a small executable of its own.
/// Defined here and implemented in `transform/custom_runtime.rs`; every
/// constructor of a [`CustomDef`] hands one in, so the family never traces
/// or builds an executable itself.
pub(crate) trait CustomRuntime: Any + Send + Sync {
    /// The forward's output aval over operands of `inputs`, and the guards
    /// its ops record.
    fn trace_aval(&self, call: &CustomCall, inputs: &[&Aval]) -> Result<(Aval, Vec<Guard>)>;
    /// The forward run on host data with concrete shapes.
    fn eval(
        &self,
        call: &CustomCall,
        inputs: &[&HostData],
        in_shapes: &[&[usize]],
    ) -> Result<HostData>;
}

pub(crate) struct CustomDef {
    pub(crate) name: String,
    pub(crate) forward: Arc<ForwardFn>,
    pub(crate) vjp: Option<Arc<VjpFn>>,
    pub(crate) jvp: Option<Arc<JvpFn>>,
    pub(crate) vmap: Option<Arc<VmapFn>>,
    /// Traces and runs the forward (and keeps its executables).
    pub(crate) runtime: Arc<dyn CustomRuntime>,
}

/// A custom op over arguments of type `A`; see the [module docs](self).
///
/// ```
/// use kiln::ops::custom::CustomOp;
/// use kiln::{Array, Tree};
///
/// #[derive(Tree, Clone)]
/// struct ScaleArgs {
///     x: Array,
///     #[tree(static)]
///     factor: i32,
/// }
///
/// let scale = CustomOp::new("scale", |a: &ScaleArgs| Ok(&a.x * a.factor as f32))
///     .with_vjp(|a: &ScaleArgs, _out: &Array, g: &Array| {
///         Ok(ScaleArgs { x: g * a.factor as f32, factor: a.factor })
///     });
/// let x = Array::from_vec(vec![1.0f32, 2.0], &[2])?;
/// let y = scale.call(&ScaleArgs { x: x.clone(), factor: 3 });
/// assert_eq!(y.to_vec::<f32>()?, vec![3.0, 6.0]);
/// let dx = kiln::grad(|x: Array| scale.call(&ScaleArgs { x, factor: 3 }).sum_all()).call(&x)?;
/// assert_eq!(dx.to_vec::<f32>()?, vec![3.0, 3.0]);
/// # Ok::<(), kiln::Error>(())
/// ```
///
/// Its constructors and `call` flatten trees of arguments, so they sit
/// above the op families, in `transform/custom.rs`.
pub struct CustomOp<A> {
    pub(crate) def: Arc<CustomDef>,
    pub(crate) arguments: PhantomData<fn(&A)>,
}

impl<A> Clone for CustomOp<A> {
    fn clone(&self) -> Self {
        CustomOp {
            def: self.def.clone(),
            arguments: PhantomData,
        }
    }
}

impl<A> fmt::Debug for CustomOp<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CustomOp")
            .field("name", &self.def.name)
            .field("has_vjp", &self.def.vjp.is_some())
            .field("has_jvp", &self.def.jvp.is_some())
            .field("has_vmap", &self.def.vmap.is_some())
            .finish()
    }
}

/// One application of a custom op: the op and the structure of its
/// arguments with their static values. Equal when the op is the same and
/// the structures and statics are equal.
#[derive(Clone)]
pub struct CustomCall {
    pub(crate) def: Arc<CustomDef>,
    pub(crate) args: TreeDef,
}

impl PartialEq for CustomCall {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.def, &other.def) && self.args == other.args
    }
}

impl Eq for CustomCall {}

impl Hash for CustomCall {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (Arc::as_ptr(&self.def) as *const () as usize).hash(state);
        self.args.hash(state);
    }
}

impl fmt::Debug for CustomCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.describe())
    }
}

/// A schema path: like [`KeyPath`]'s rendering, but map keys that are
/// identifiers read as fields (`cfg.scale`, as a config map is written).
fn schema_path(path: &KeyPath) -> String {
    let mut out = String::new();
    for entry in path.iter() {
        match entry {
            PathEntry::Field(name) if name.is_empty() => {}
            PathEntry::Field(name) => {
                out.push('.');
                out.push_str(name);
            }
            PathEntry::Key(key)
                if key
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_alphabetic() || c == '_')
                    && key.chars().all(|c| c.is_alphanumeric() || c == '_') =>
            {
                out.push('.');
                out.push_str(key);
            }
            PathEntry::Key(key) => out.push_str(&format!("[{key:?}]")),
            PathEntry::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    match out.strip_prefix('.') {
        Some(rest) => rest.to_string(),
        None if out.is_empty() => "<root>".to_string(),
        None => out,
    }
}

/// One entry of a custom op's flattened schema.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SchemaEntry {
    /// The path inside the arguments, like `cfg.inner.scale`.
    pub path: String,
    /// `None` for an operand (an array leaf), else the attribute's value.
    pub attribute: Option<String>,
}

impl CustomDef {
    /// A def named `name` computing `forward` through `runtime`, without a
    /// vjp, jvp or batching rule.
    pub(crate) fn new(
        name: impl Into<String>,
        forward: Arc<ForwardFn>,
        runtime: Arc<dyn CustomRuntime>,
    ) -> Arc<CustomDef> {
        Arc::new(CustomDef {
            name: name.into(),
            forward,
            vjp: None,
            jvp: None,
            vmap: None,
            runtime,
        })
    }
}

impl<A> CustomOp<A> {
    /// The op's name.
    pub fn name(&self) -> &str {
        &self.def.name
    }
}

impl CustomCall {
    /// An application of `def` to arguments of structure `args`.
    pub(crate) fn of(def: Arc<CustomDef>, args: TreeDef) -> CustomCall {
        CustomCall { def, args }
    }

    /// The structure of the arguments.
    pub fn args(&self) -> &TreeDef {
        &self.args
    }

    /// The forward applied to `leaves` (lazily: the graph it builds).
    pub(crate) fn apply_forward(&self, leaves: Vec<Array>) -> Result<Array> {
        (self.def.forward)(&self.args, leaves)
    }

    /// The op's name.
    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// The flattened schema: every operand and attribute with its path, in
    /// leaf order.
    pub fn schema(&self) -> Vec<SchemaEntry> {
        let mut entries = Vec::new();
        let mut pending: Vec<(KeyPath, &TreeDef)> = vec![(KeyPath::default(), &self.args)];
        while let Some((path, def)) = pending.pop() {
            match def {
                TreeDef::Leaf => entries.push(SchemaEntry {
                    path: schema_path(&path),
                    attribute: None,
                }),
                TreeDef::Static(v) => entries.push(SchemaEntry {
                    path: schema_path(&path),
                    attribute: Some(format!("{v:?}")),
                }),
                TreeDef::Option(Some(inner)) => pending.push((path, inner)),
                _ => {
                    for (entry, child) in def.children().into_iter().rev() {
                        let mut child_path = path.clone();
                        child_path.push(entry);
                        pending.push((child_path, child));
                    }
                }
            }
        }
        entries
    }

    /// `name(q, k, cfg.inner.w; cfg.scale=0.5, cfg.causal=true)`.
    pub fn describe(&self) -> String {
        let schema = self.schema();
        let operands: Vec<&str> = schema
            .iter()
            .filter(|e| e.attribute.is_none())
            .map(|e| e.path.as_str())
            .collect();
        let attributes: Vec<String> = schema
            .iter()
            .filter_map(|e| e.attribute.as_ref().map(|v| format!("{}={v}", e.path)))
            .collect();
        if attributes.is_empty() {
            format!("{}({})", self.def.name, operands.join(", "))
        } else {
            format!(
                "{}({}; {})",
                self.def.name,
                operands.join(", "),
                attributes.join(", ")
            )
        }
    }

    pub(crate) fn error(&self, detail: impl Into<String>) -> Error {
        Error::InvalidArgument {
            op: self.def.name.clone(),
            detail: detail.into(),
            at: None,
        }
    }

    /// The shape rule: the forward traced abstractly over `inputs`; the
    /// guards its ops record become this node's.
    pub(crate) fn shape_rule(&self, inputs: &[&Aval], cx: &mut ShapeCx) -> Result<Aval> {
        let expected = self.args.num_leaves();
        if inputs.len() != expected {
            return Err(self.error(format!(
                "its arguments have {expected} array leaves, given {} operands",
                inputs.len()
            )));
        }
        let (aval, guards) = self.def.runtime.trace_aval(self, inputs)?;
        cx.guards.extend(guards);
        Ok(aval)
    }

    /// Runs the forward on host data (the CPU executor's evaluation),
    /// through the runtime's executable of it.
    pub(crate) fn eval(&self, inputs: &[&HostData], in_shapes: &[&[usize]]) -> Result<HostData> {
        self.def.runtime.eval(self, inputs, in_shapes)
    }

    /// The cotangent of every operand from the op's vjp, checked against
    /// the arguments' structure, shapes and dtypes.
    pub(crate) fn vjp(
        &self,
        inputs: &[Array],
        output: &Array,
        g: &Array,
    ) -> Result<Vec<Option<Array>>> {
        let vjp = self.def.vjp.as_ref().ok_or_else(|| {
            self.error(
                "custom op has no vjp, so gradients cannot flow through it; give it one with \
                 `CustomOp::with_vjp`",
            )
        })?;
        let (leaves, def) = vjp(&self.args, inputs.to_vec(), output, g)?;
        let mut cotangents = leaves.into_iter();
        let mut out = Vec::with_capacity(inputs.len());
        let mut path = KeyPath::default();
        self.match_cotangents(&self.args, &def, &mut path, &mut cotangents, &mut out)?;
        for ((cotangent, primal), path) in out.iter().zip(inputs).zip(self.args.leaf_paths()) {
            if let Some(c) = cotangent {
                if !crate::symbolic::avals_equal(c.aval(), primal.aval()) {
                    return Err(Error::Tree {
                        path: path.to_string(),
                        detail: format!(
                            "the vjp of `{}` returned a cotangent of {} for an argument of {}",
                            self.def.name,
                            c.aval(),
                            primal.aval()
                        ),
                    });
                }
            }
        }
        Ok(out)
    }

    /// The output's tangent from the op's jvp, given the operands'
    /// tangents (zeros where `None`, so the jvp sees its arguments' own
    /// tree type), checked against the output's shape and dtype.
    pub(crate) fn jvp(
        &self,
        inputs: &[Array],
        output: &Array,
        tangents: &[Option<Array>],
    ) -> Result<Option<Array>> {
        let jvp = self.def.jvp.as_ref().ok_or_else(|| {
            self.error(
                "custom op has no jvp, so forward-mode derivatives cannot flow through it; \
                 give it one with `CustomOp::with_jvp`",
            )
        })?;
        let tangents = inputs
            .iter()
            .zip(tangents)
            .map(|(x, t)| t.clone().unwrap_or_else(|| x.zeros_like()))
            .collect();
        let tangent = jvp(&self.args, inputs.to_vec(), output, tangents)?;
        if !crate::symbolic::avals_equal(tangent.aval(), output.aval()) {
            return Err(self.error(format!(
                "its jvp returned a tangent of {} for an output of {}",
                tangent.aval(),
                output.aval()
            )));
        }
        Ok(Some(tangent))
    }

    /// The batched output under vmap: the op's batching rule, given every
    /// array leaf with the batch axis first (shared leaves broadcast), or
    /// without one the op once per example (`op` is this call's op).
    pub(crate) fn batch(
        &self,
        op: &Op,
        operands: &[Batched],
        output: &Array,
        size: &Dim,
    ) -> Result<Batched> {
        let Some(rule) = self.def.vmap.as_ref() else {
            return per_example(
                op,
                operands,
                output,
                size,
                "the custom op has no batching rule",
            );
        };
        let leaves = operands.iter().map(|b| b.materialized(size)).collect();
        let batched = rule(&self.args, leaves, size)?;
        let mut want = vec![size.clone()];
        want.extend(output.shape().dims().iter().cloned());
        let want = Aval::new(Shape(want), output.dtype());
        if !crate::symbolic::avals_equal(batched.aval(), &want) {
            return Err(self.error(format!(
                "its batching rule returned {} where the batched output is {want}",
                batched.aval()
            )));
        }
        Ok(Batched::along(batched, 0))
    }

    /// Walks the arguments' def `primal` and the vjp's def `cotangent`
    /// together, pushing one entry per primal leaf. Recursion is bounded by
    /// the tree depth limit both defs were flattened under.
    fn match_cotangents(
        &self,
        primal: &TreeDef,
        cotangent: &TreeDef,
        path: &mut KeyPath,
        leaves: &mut std::vec::IntoIter<Array>,
        out: &mut Vec<Option<Array>>,
    ) -> Result<()> {
        let mismatch = |path: &KeyPath| Error::Tree {
            path: path.to_string(),
            detail: format!(
                "the vjp of `{}` returned {} where the argument is {}",
                self.def.name,
                cotangent.brief(),
                primal.brief()
            ),
        };
        match (primal, cotangent) {
            (TreeDef::Option(_), TreeDef::Option(None)) | (_, TreeDef::Option(None)) => {
                out.extend((0..primal.num_leaves()).map(|_| None));
            }
            (TreeDef::Option(Some(p)), TreeDef::Option(Some(c))) => {
                self.match_cotangents(p, c, path, leaves, out)?;
            }
            (p, TreeDef::Option(Some(c))) => self.match_cotangents(p, c, path, leaves, out)?,
            (TreeDef::Leaf, TreeDef::Leaf) => out.push(leaves.next()),
            (TreeDef::Static(_), TreeDef::Static(_) | TreeDef::Unit)
            | (TreeDef::Unit, TreeDef::Unit) => {}
            (TreeDef::Tuple(_), TreeDef::Tuple(_))
            | (TreeDef::List(_), TreeDef::List(_))
            | (TreeDef::Map(_), TreeDef::Map(_))
            | (TreeDef::Node(_), TreeDef::Node(_)) => {
                let (p, c) = (primal.children(), cotangent.children());
                let same_type = match (primal, cotangent) {
                    (TreeDef::Node(a), TreeDef::Node(b)) => a.type_name == b.type_name,
                    _ => true,
                };
                if !same_type
                    || p.len() != c.len()
                    || p.iter().zip(&c).any(|((a, _), (b, _))| a != b)
                {
                    return Err(mismatch(path));
                }
                for ((entry, p), (_, c)) in p.into_iter().zip(c) {
                    path.push(entry);
                    self.match_cotangents(p, c, path, leaves, out)?;
                    path.pop();
                }
            }
            _ => return Err(mismatch(path)),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::compile::rule_checks as rules;
    use crate::handle::array::Array;
    use crate::CustomOp;

    /// `Σx²` as a custom op, with the given rules.
    fn sum_of_squares(name: &str) -> CustomOp<Array> {
        CustomOp::new(name, |x: &Array| Ok((x * x).sum_all()))
    }

    #[test]
    fn a_custom_ops_jvp_rule_gives_its_tangent() {
        let op = sum_of_squares("squares_jvp")
            .with_jvp(|x: &Array, _, t: &Array| Ok((x * t).sum_all() * 2.0));
        let f = move |x: Vec<Array>| op.call(&x[0]);
        rules::assert_jvp_matches_central_difference("custom", f, &[rules::normal(43, &[4])]);
    }

    #[test]
    fn a_custom_op_without_a_jvp_is_an_error_naming_it() {
        let op = sum_of_squares("squares_plain");
        let x = rules::normal(44, &[4]);
        rules::assert_err_names(
            crate::jvp(move |x: Array| op.call(&x), &x, &x),
            "squares_plain",
            "jvp",
        );
    }

    #[test]
    fn a_custom_ops_vmap_rule_batches_it_in_one_call() {
        let op =
            sum_of_squares("squares_vmap").with_vmap(|x: &Array, _| Ok((x * x).sum(&[-1], false)));
        let f = move |x: Vec<Array>| op.call(&x[0]);
        let report =
            rules::assert_batches_like_stacking("custom", f, &[rules::normal(45, &[3, 4])]);
        assert!(
            report.vmap_fallbacks.is_empty(),
            "{:?}",
            report.vmap_fallbacks
        );
    }

    #[test]
    fn a_custom_op_without_a_vmap_rule_runs_once_per_example_on_the_report() {
        let op = sum_of_squares("squares_looped");
        let f = move |x: Vec<Array>| op.call(&x[0]);
        let report =
            rules::assert_batches_like_stacking("custom", f, &[rules::normal(46, &[3, 4])]);
        assert_eq!(
            report.vmap_fallbacks.len(),
            1,
            "{:?}",
            report.vmap_fallbacks
        );
        assert_eq!(report.vmap_fallbacks[0].examples, 3);
        assert!(report.vmap_fallbacks[0].op.contains("squares_looped"));
    }
}
