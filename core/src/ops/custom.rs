//! Custom ops: an op a program defines over a tree of arguments (seed
//! magi #32), one node in the graph however it is computed.
//!
//! The arguments are any [`Tree`], typically a `#[derive(Tree)]` struct:
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

use super::ShapeCx;
use crate::array::Array;
use crate::compile::next_trace_id;
use crate::data::HostData;
use crate::error::{Error, Result};
use crate::exec::{Backend, CpuBackend, Executable};
use crate::graph::Graph;
use crate::passes::{optimize, Passes};
use crate::shape::{Aval, Shape};
use crate::trace::{extract, Leaves};
use crate::tree::{tree_flatten, tree_unflatten, KeyPath, PathEntry, Tree, TreeDef};
use crate::DType;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};

pub(crate) type ForwardFn = dyn Fn(&TreeDef, Vec<Array>) -> Result<Array> + Send + Sync;
type VjpFn =
    dyn Fn(&TreeDef, Vec<Array>, &Array, &Array) -> Result<(Vec<Array>, TreeDef)> + Send + Sync;

/// Executables of one op's forward, by the arguments' structure (statics
/// included: they change what the forward computes) and the dtypes and
/// shapes of the operands they were built for.
type BodyCache = HashMap<(TreeDef, Vec<(DType, Vec<usize>)>), Arc<Executable>>;

/// Distinct operand shapes whose executables an op keeps; past this the
/// cache starts over (a shapeless program calling an op at ever new sizes
/// must not grow without bound).
const BODY_CACHE_LIMIT: usize = 64;

pub(crate) struct CustomDef {
    name: String,
    forward: Arc<ForwardFn>,
    vjp: Option<Arc<VjpFn>>,
    bodies: Mutex<BodyCache>,
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
pub struct CustomOp<A> {
    def: Arc<CustomDef>,
    arguments: PhantomData<fn(&A)>,
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
            .finish()
    }
}

impl<A: Tree + 'static> CustomOp<A> {
    /// An op named `name` computing `forward`, with no vjp (differentiating
    /// through it is an `Err` naming it).
    pub fn new(
        name: impl Into<String>,
        forward: impl Fn(&A) -> Result<Array> + Send + Sync + 'static,
    ) -> Self {
        let forward =
            move |def: &TreeDef, leaves: Vec<Array>| forward(&tree_unflatten(def, leaves)?);
        CustomOp {
            def: Arc::new(CustomDef {
                name: name.into(),
                forward: Arc::new(forward),
                vjp: None,
                bodies: Mutex::default(),
            }),
            arguments: PhantomData,
        }
    }

    /// The same op with a vjp: from the arguments, the output and its
    /// cotangent, one cotangent per argument in the arguments' own tree
    /// type `G` (usually `A` itself; static fields take none). `G` may put
    /// `None` (an `Option`) where the arguments have a whole subtree that
    /// takes no gradient. A result of another structure, or a cotangent of
    /// another shape or dtype than its argument, is an `Err` naming the path.
    pub fn with_vjp<G: Tree>(
        self,
        vjp: impl Fn(&A, &Array, &Array) -> Result<G> + Send + Sync + 'static,
    ) -> Self {
        let vjp = move |def: &TreeDef, leaves: Vec<Array>, out: &Array, g: &Array| {
            tree_flatten(&vjp(&tree_unflatten(def, leaves)?, out, g)?)
        };
        CustomOp {
            def: Arc::new(CustomDef {
                name: self.def.name.clone(),
                forward: self.def.forward.clone(),
                vjp: Some(Arc::new(vjp)),
                bodies: Mutex::default(),
            }),
            arguments: PhantomData,
        }
    }

    /// The op's name.
    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// Applies the op: one node whose operands are the array leaves of
    /// `args` (a failed array if `args` does not flatten or the forward
    /// fails for these operands).
    pub fn call(&self, args: &A) -> Array {
        match tree_flatten(args) {
            Ok((leaves, args)) => Array::apply(
                super::Op::Custom(CustomCall {
                    def: self.def.clone(),
                    args,
                }),
                leaves,
            ),
            Err(e) => Array::failed(e),
        }
    }
}

/// One application of a custom op: the op and the structure of its
/// arguments with their static values. Equal when the op is the same and
/// the structures and statics are equal.
#[derive(Clone)]
pub struct CustomCall {
    def: Arc<CustomDef>,
    args: TreeDef,
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
    /// A def named `name` computing `forward`, without a vjp.
    pub(crate) fn new(name: impl Into<String>, forward: Arc<ForwardFn>) -> Arc<CustomDef> {
        Arc::new(CustomDef {
            name: name.into(),
            forward,
            vjp: None,
            bodies: Mutex::default(),
        })
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

    /// The forward's graph over operands of `avals`, for splicing.
    pub(crate) fn forward_graph(&self, avals: &[&Aval]) -> Result<Graph> {
        self.trace(avals)
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

    fn error(&self, detail: impl Into<String>) -> Error {
        Error::InvalidArgument {
            op: self.def.name.clone(),
            detail: detail.into(),
        }
    }

    /// The forward's graph over operands of `avals` (the trace's inputs).
    fn trace(&self, avals: &[&Aval]) -> Result<Graph> {
        let id = next_trace_id();
        let params = avals
            .iter()
            .enumerate()
            .map(|(i, &a)| Array::param(id, i, a.clone()))
            .collect();
        let out = (self.def.forward)(&self.args, params)?;
        let (graph, _) = extract(
            &[out],
            Leaves::Trace {
                id,
                num_inputs: avals.len(),
            },
            &HashSet::new(),
        )
        .map_err(|e| match e {
            Error::ReadTracer { aval } => self.error(format!(
                "its forward reads a traced value ({aval}) or uses an array traced outside it; \
                 pass every array it needs as an argument"
            )),
            other => other,
        })?;
        Ok(graph)
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
        let graph = self.trace(inputs)?;
        cx.guards.extend(graph.guards.iter().cloned());
        let out = graph.outputs[0];
        Ok(graph.nodes[out].aval.clone())
    }

    /// The executable computing the forward for operands of these dtypes
    /// and concrete shapes, built once per distinct set.
    pub fn body(&self, operands: &[(DType, &[usize])]) -> Result<Arc<Executable>> {
        let key = (
            self.args.clone(),
            operands.iter().map(|(d, s)| (*d, s.to_vec())).collect(),
        );
        let cached = self
            .def
            .bodies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            .cloned();
        if let Some(exe) = cached {
            return Ok(exe);
        }
        let avals: Vec<Aval> = operands
            .iter()
            .map(|(d, s)| Aval::new(Shape::known(s), *d))
            .collect();
        let graph = self.trace(&avals.iter().collect::<Vec<_>>())?;
        let (graph, _) = optimize(&graph, Passes::default())?;
        let shapes: Vec<&[usize]> = operands.iter().map(|(_, s)| *s).collect();
        let exe = Arc::new(Executable::new(
            graph,
            Vec::new(),
            &vec![false; operands.len()],
            &shapes,
        )?);
        let mut bodies = self
            .def
            .bodies
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if bodies.len() >= BODY_CACHE_LIMIT {
            bodies.clear();
        }
        bodies.insert(key, exe.clone());
        Ok(exe)
    }

    /// Runs the forward on host data (the CPU executor's evaluation).
    pub(crate) fn eval(&self, inputs: &[&HostData], in_shapes: &[&[usize]]) -> Result<HostData> {
        let operands: Vec<(DType, &[usize])> = inputs
            .iter()
            .zip(in_shapes)
            .map(|(data, &shape)| (data.dtype(), shape))
            .collect();
        let exe = self.body(&operands)?;
        let shapes = exe.resolve_shapes(in_shapes)?.into_owned();
        let buffers = inputs.iter().map(|&d| Arc::new(d.clone())).collect();
        let mut outputs = CpuBackend.run(&exe, buffers, &shapes)?;
        let out = outputs
            .pop()
            .ok_or_else(|| self.error("its forward returned no value"))?;
        Ok(Arc::try_unwrap(out).unwrap_or_else(|shared| (*shared).clone()))
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
                if c.aval() != primal.aval() {
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
