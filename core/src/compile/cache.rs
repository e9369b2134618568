//! `compile`: trace a function once per argument signature, optimize its
//! graph, cache the executable, and explain every cache miss.

use super::key::{hash_key, CacheKey, KeyView};
use super::report::{
    arg_path, build_report, explain_miss, CacheInfo, CacheMiss, MissReason, Report,
};
use crate::error::{Error, Result};
use crate::exec::device::read_back;
use crate::exec::{Backend, CpuBackend, Executable, KernelList, SymbolSource};
use crate::handle::array::Array;
use crate::hash::FastMap;
use crate::ir::graph::Graph;
use crate::ir::passes::{PassRecord, Passes};
use crate::ops::batching::{collecting_vmap_records, VmapRecords};
use crate::ops::{Condition, Guard};
use crate::shape::{Aval, Dim, Shape, Symbol};
use crate::symbolic::{DimFacts, TraceScope};
use crate::trace::{extract, next_trace_id, Leaves};
use crate::transform::autodiff::collecting_backward;
use crate::transform::implicit::optimize;
use crate::tree::{tree_unflatten, Tree, TreeDef};
use smallvec::SmallVec;
use std::borrow::Cow;
use std::collections::{HashSet, VecDeque};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

static NEXT_FUNCTION: AtomicU64 = AtomicU64::new(1);

/// Compiles `f`: the first call with a new argument signature traces `f` on
/// tracer leaves, optimizes the graph and caches the executable; later calls
/// with the same signature only run it.
///
/// ```
/// use kiln::{compile, Array, DType};
/// let f = compile(|x: Array| x.exp() * 2.0 + 1.0);
/// let y = f.call(&Array::zeros(&[2, 2], DType::F32))?;
/// assert_eq!(y.to_vec::<f32>()?, vec![3.0; 4]);
/// f.call(&Array::zeros(&[2, 2], DType::F32))?;
/// assert_eq!((f.cache().hits, f.cache().misses), (1, 1));
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn compile<In, Out, F, M>(f: F) -> Compiled<In, Out, F, CpuBackend, M>
where
    In: Tree,
    Out: Tree,
    F: Function<In, Out, M>,
{
    Compiled {
        f,
        function: NEXT_FUNCTION.fetch_add(1, Ordering::Relaxed),
        shapeless: false,
        passes: Passes::default(),
        donate: Vec::new(),
        backend: CpuBackend,
        leaf_count_hint: AtomicUsize::new(0),
        cache: Mutex::default(),
        types: PhantomData,
    }
}

/// What [`compile`] traces: any `Fn(In) -> R` closure whose `R` is a
/// [`FunctionOutput`] (a tree, or a `Result` of one), and the
/// transformations that make functions ([`crate::grad`],
/// [`crate::value_and_grad`]). `Out` is the tree the function gives: a
/// closure returning `Result<T>` is a `Function<In, T>`. `Marker` only
/// keeps the implementations apart (a closure's is `()`); callers never
/// name it.
pub trait Function<In, Out, Marker = ()> {
    /// Runs the function (on tracers, inside a trace). A transformation
    /// that cannot apply (the gradient of an integer leaf) is an `Err`, and
    /// so is a closure's `Err`; an op's error travels in failed arrays.
    fn apply(&self, args: In) -> Result<Out>;
}

impl<In, R: FunctionOutput, F: Fn(In) -> R> Function<In, R::Value, ()> for F {
    fn apply(&self, args: In) -> Result<R::Value> {
        self(args).into_value()
    }
}

/// What a function given to [`compile`] (or [`crate::vjp`], [`crate::jvp`],
/// [`crate::linearize`], [`crate::grad`]) may return: a tree, or a
/// `Result` of one, so its body can use `?`. Calling the compiled function
/// gives the tree in one `Result`: the closure's `Err` is the call's `Err`.
///
/// ```
/// use kiln::{compile, grad, Array, Result};
/// let f = compile(|x: Array| -> Result<Array> {
///     Ok(grad(|x: Array| x.sum_all()).call(&x)? * 2.0)
/// });
/// let g: Array = f.call(&Array::from_vec(vec![1.0f32, 2.0], &[2])?)?;
/// assert_eq!(g.to_vec::<f32>()?, vec![2.0, 2.0]);
/// # Ok::<(), kiln::Error>(())
/// ```
///
/// The two implementations do not overlap because no `Result` is a
/// [`Tree`]: `Tree` is Kiln's trait and `Result` a foreign type, so no
/// other crate may implement one for the other either.
pub trait FunctionOutput {
    /// The tree the function gives.
    type Value: Tree;

    /// The tree, or the function's error.
    fn into_value(self) -> Result<Self::Value>;
}

impl<T: Tree> FunctionOutput for T {
    type Value = T;

    fn into_value(self) -> Result<T> {
        Ok(self)
    }
}

impl<T: Tree> FunctionOutput for Result<T> {
    type Value = T;

    fn into_value(self) -> Result<T> {
        self
    }
}

/// A compiled function with its own cache.
pub struct Compiled<In, Out, F, B: Backend = CpuBackend, M = ()> {
    f: F,
    function: u64,
    shapeless: bool,
    passes: Passes,
    /// Argument paths whose buffers the caller gives up.
    donate: Vec<String>,
    backend: B,
    /// Leaves of the previous call: the capacity to flatten into.
    leaf_count_hint: AtomicUsize,
    cache: Mutex<CacheState>,
    types: PhantomData<fn(In, M) -> Out>,
}

/// The product of one trace.
struct Traced {
    exe: Arc<Executable>,
    output_tree: TreeDef,
    /// The graph before the passes, for the report.
    traced: crate::ir::graph::Graph,
    passes: Vec<PassRecord>,
    symbols: Vec<(Symbol, SymbolSource)>,
    vmap: VmapRecords,
}

struct Entry {
    key: CacheKey,
    exe: Arc<Executable>,
    output_tree: TreeDef,
    report: Arc<Report>,
    /// A shapeless entry's argument shapes at its latest call, for
    /// [`Compiled::kernels`] (a static entry's key pins them).
    latest_shapes: Mutex<Vec<Vec<usize>>>,
}

impl Entry {
    /// Keeps a shapeless entry's argument shapes of this call (copied only
    /// when they changed).
    fn remember_shapes(&self, shapes: &[&[usize]]) {
        if !self.exe.is_shapeless() {
            return;
        }
        let mut latest = self.latest_shapes.lock().unwrap_or_else(|p| p.into_inner());
        if latest.len() != shapes.len() || latest.iter().zip(shapes).any(|(a, b)| a != b) {
            *latest = shapes.iter().map(|s| s.to_vec()).collect();
        }
    }
}

#[derive(Default)]
struct CacheState {
    entries: Vec<Arc<Entry>>,
    buckets: FastMap<u64, Vec<usize>>,
    last_hit: Option<usize>,
    calls: u64,
    hits: u64,
    misses: u64,
    miss_log: VecDeque<CacheMiss>,
}

/// Misses a cache keeps explained: a function called with ever-new shapes
/// would otherwise grow its log by one explanation per call.
pub const MISS_LOG_CAPACITY: usize = 256;

/// Which leaves of `tree` lie under one of `roots` (argument paths as
/// [`normalize_arg_path`] writes them; a root names its whole subtree);
/// `Err` from `op` names a root that matches no leaf, listing the leaves.
pub(crate) fn leaves_under(tree: &TreeDef, roots: &[String], op: &str) -> Result<Vec<bool>> {
    let paths: Vec<String> = tree.leaf_paths().iter().map(arg_path).collect();
    let under = |leaf: &str, root: &str| {
        leaf == root
            || (leaf.starts_with(root)
                && matches!(leaf.as_bytes().get(root.len()), Some(b'.' | b'[')))
    };
    for root in roots {
        if !paths.iter().any(|leaf| under(leaf, root)) {
            return Err(Error::InvalidArgument {
                op: op.into(),
                detail: format!(
                    "no argument leaf at `{root}`; the leaves are {}",
                    paths.join(", ")
                ),
                at: None,
            });
        }
    }
    Ok(paths
        .iter()
        .map(|leaf| roots.iter().any(|root| under(leaf, root)))
        .collect())
}

/// A path as reports write it: `x` and `[0]` become `args.x` and `args[0]`.
pub(crate) fn normalize_arg_path(path: String) -> String {
    if path == "args" || path.starts_with("args.") || path.starts_with("args[") {
        path
    } else if path.starts_with('[') {
        format!("args{path}")
    } else {
        format!("args.{path}")
    }
}

impl<In, Out, F, B, M> Compiled<In, Out, F, B, M>
where
    In: Tree,
    Out: Tree,
    F: Function<In, Out, M>,
    B: Backend,
{
    /// Keys the cache on dtype and rank only: dims become symbols, and new
    /// sizes reuse the executable without tracing again.
    pub fn shapeless(mut self) -> Self {
        self.shapeless = true;
        self
    }

    /// Turns elementwise fusion on (the default) or off, e.g. to compare
    /// fused execution with op-by-op execution.
    pub fn fusion(mut self, enabled: bool) -> Self {
        self.passes.fuse = enabled;
        self
    }

    /// Donates the argument leaves at `paths` (written as reports show
    /// them, `args.x` or `args[0]`; a path to a subtree donates every leaf
    /// under it): the executable may write its results into their buffers.
    /// [`Compiled::call_owned`] then reuses a donated buffer that nothing
    /// else holds; one still shared (e.g. by the caller, through
    /// [`Compiled::call`]) is copied first, so the caller's data stays
    /// intact. A path that names no leaf is an error at the first call.
    ///
    /// ```
    /// use kiln::{compile, Array};
    /// let f = compile(|(x, y): (Array, Array)| (x.exp() + &y).tanh()).donate(["args[0]"]);
    /// let x = Array::from_vec(vec![0.0f32; 4], &[4])?;
    /// let y = Array::from_vec(vec![1.0f32; 4], &[4])?;
    /// let out = f.call_owned((x, y))?;
    /// assert_eq!(out.to_vec::<f32>()?, vec![2.0f32.tanh(); 4]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn donate<P: Into<String>>(mut self, paths: impl IntoIterator<Item = P>) -> Self {
        self.donate = paths
            .into_iter()
            .map(|p| normalize_arg_path(p.into()))
            .collect();
        self.donate.sort();
        self.donate.dedup();
        self
    }

    /// Runs on `backend` instead (the cache starts empty).
    pub fn with_backend<B2: Backend>(self, backend: B2) -> Compiled<In, Out, F, B2, M> {
        Compiled {
            f: self.f,
            function: self.function,
            shapeless: self.shapeless,
            passes: self.passes,
            donate: self.donate,
            backend,
            leaf_count_hint: AtomicUsize::new(0),
            cache: Mutex::default(),
            types: PhantomData,
        }
    }

    /// A snapshot of the cache: counters, miss explanations and reports.
    pub fn cache(&self) -> CacheInfo {
        let state = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        CacheInfo {
            entries: state.entries.len(),
            hits: state.hits,
            misses: state.misses,
            miss_log: state.miss_log.iter().cloned().collect(),
            reports: state.entries.iter().map(|e| e.report.clone()).collect(),
        }
    }

    /// What differs between the cache keys of entries `before` and
    /// `after` (indexes as [`crate::Report::entry`] gives them), as a miss
    /// explains it; an `Err` for an entry the cache does not hold. See
    /// [`crate::compile::diff`] for the rest of what differs.
    pub fn key_difference(&self, before: usize, after: usize) -> Result<Vec<MissReason>> {
        let state = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let entry = |i: usize| {
            state.entries.get(i).ok_or_else(|| Error::InvalidArgument {
                op: "key_difference".into(),
                detail: format!("the cache holds no entry {i}"),
                at: None,
            })
        };
        let (a, b) = (entry(before)?, entry(after)?);
        Ok(a.key.differences(&b.key))
    }

    /// The key entry `entry` is stored under (the index
    /// [`crate::Report::entry`] gives); an `Err` for an entry the cache
    /// does not hold. Keys of two compiled functions compare with
    /// [`CacheKey::differences`]: how the playground explains an entry
    /// against the previous run's, whose function text may have changed.
    pub fn entry_key(&self, entry: usize) -> Result<CacheKey> {
        let state = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        state
            .entries
            .get(entry)
            .map(|e| e.key.clone())
            .ok_or_else(|| Error::InvalidArgument {
                op: "entry_key".into(),
                detail: format!("the cache holds no entry {entry}"),
                at: None,
            })
    }

    /// What the backend runs for cache entry `entry` (the index
    /// [`crate::Report::entry`] gives), step by step
    /// ([`Backend::kernels`]), at the shapes of its latest call; an `Err`
    /// for an entry the cache does not hold, a shapeless entry never
    /// called, or a backend that does not list its kernels.
    pub fn kernels(&self, entry: usize) -> Result<KernelList> {
        let entry = {
            let state = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            state.entries.get(entry).cloned()
        }
        .ok_or_else(|| Error::InvalidArgument {
            op: "kernels".into(),
            detail: format!("the cache holds no entry {entry}"),
            at: None,
        })?;
        let latest = entry
            .latest_shapes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if entry.exe.is_shapeless() && latest.is_empty() {
            return Err(Error::InvalidArgument {
                op: "kernels".into(),
                detail: "a shapeless entry lists its kernels once it has been called".into(),
                at: None,
            });
        }
        let refs: Vec<&[usize]> = latest.iter().map(Vec::as_slice).collect();
        let shapes = entry.exe.resolve_shapes(&refs)?;
        self.backend.kernels(&entry.exe, &shapes)
    }

    /// Compiles for the signature of `args` without running: traces on a
    /// miss, does nothing on a hit. Returns whether it traced.
    pub fn prepare(&self, args: &In) -> Result<bool> {
        let (tree, leaves) = self.flatten(args)?;
        let shapes = self.leaf_shapes(&leaves);
        Ok(self.entry(&tree, &leaves, &shapes)?.1)
    }

    /// The executable that serves calls with the signature of `args`
    /// (compiled on a miss, like [`Compiled::prepare`]): its graph, plan
    /// and shapes, for backends, tests and tools.
    pub fn executable(&self, args: &In) -> Result<Arc<Executable>> {
        let (tree, leaves) = self.flatten(args)?;
        let shapes = self.leaf_shapes(&leaves);
        Ok(self.entry(&tree, &leaves, &shapes)?.0.exe.clone())
    }

    /// The result tree of calls with the signature of `args` (compiled on
    /// a miss, like [`Compiled::prepare`]): where each result leaf of
    /// [`Compiled::executable`]'s graph goes, for tools that name them.
    pub fn output_tree(&self, args: &In) -> Result<TreeDef> {
        let (tree, leaves) = self.flatten(args)?;
        let shapes = self.leaf_shapes(&leaves);
        Ok(self.entry(&tree, &leaves, &shapes)?.0.output_tree.clone())
    }

    /// The entry serving flattened arguments of `shapes` (the leaves'
    /// shapes, which only a shapeless entry reads), traced and inserted on
    /// a miss; and whether it traced. Every way of calling goes through it.
    fn entry(
        &self,
        tree: &TreeDef,
        leaves: &[Array],
        shapes: &LeafShapes,
    ) -> Result<(Arc<Entry>, bool)> {
        let view = self.key_view(tree, leaves);
        match self.lookup(&view, &shapes.refs()) {
            Some(entry) => Ok((entry, false)),
            None => Ok((
                self.trace_and_insert(view.to_key(), leaves, &shapes.refs())?,
                true,
            )),
        }
    }

    /// The call's leaf shapes, which only a shapeless compile reads: a
    /// static entry's key pins them, and its executable knows them.
    fn leaf_shapes(&self, leaves: &[Array]) -> LeafShapes {
        if self.shapeless {
            LeafShapes::of(leaves)
        } else {
            LeafShapes::default()
        }
    }

    fn key_view<'a>(&'a self, tree: &'a TreeDef, leaves: &'a [Array]) -> KeyView<'a> {
        KeyView {
            function: self.function,
            tree,
            leaves,
            shapeless: self.shapeless,
            backend: self.backend.name(),
        }
    }

    /// Calls the function. The arguments are only read: the result is built
    /// from new values even where it mirrors the input's structure. A
    /// function returning `Result<T>` gives `Result<T>` here, its `Err` the
    /// call's (see [`FunctionOutput`]); the cache keeps no entry for it.
    pub fn call(&self, args: &In) -> Result<Out> {
        let (tree, leaves) = self.flatten(args)?;
        let mut shapes = LeafShapes::default();
        match self.begin(tree, leaves, &mut shapes)? {
            Begun::Inline(out) => Ok(out),
            Begun::Run(entry, leaves) => self.finish(&entry, leaves, &shapes),
        }
    }

    /// Calls the function like [`Compiled::call`], reading the results
    /// back through [`Backend::download_async`]: the way to call in a
    /// browser, where a GPU readback completes only after the page yields.
    pub async fn call_async(&self, args: &In) -> Result<Out> {
        let (tree, leaves) = self.flatten(args)?;
        let mut shapes = LeafShapes::default();
        match self.begin(tree, leaves, &mut shapes)? {
            Begun::Inline(out) => Ok(out),
            Begun::Run(entry, leaves) => {
                let (buffers, resolved) = self.launch(&entry, leaves, &shapes.refs())?;
                let mut arrays = Vec::with_capacity(buffers.len());
                for (buffer, &o) in buffers.into_iter().zip(&entry.exe.graph().outputs) {
                    let data = self.backend.download_async(buffer).await?;
                    arrays.push(Array::from_host(data, Shape::known(&resolved[o])));
                }
                tree_unflatten(&entry.output_tree, arrays)
            }
        }
    }

    /// Calls the function on arguments it takes over: a donated leaf that
    /// nothing else holds (no clone of the array is kept) has its buffer
    /// reused for results written in place. Otherwise like [`Compiled::call`].
    pub fn call_owned(&self, args: In) -> Result<Out> {
        let (tree, leaves) = self.flatten(&args)?;
        drop(args);
        let mut shapes = LeafShapes::default();
        match self.begin(tree, leaves, &mut shapes)? {
            Begun::Inline(out) => Ok(out),
            Begun::Run(entry, leaves) => self.finish(&entry, leaves, &shapes),
        }
    }

    /// Calls the function on arguments it takes over, like
    /// [`Compiled::call_owned`], but leaves the results on the backend's
    /// device: nothing is read back until a reader ([`Array::data`]) or
    /// [`crate::eval_async`] asks, and a later call or eager op on the same
    /// device uses them where they are. The way to run a chain of calls in
    /// a browser, where a readback completes only after the page yields.
    /// (On the CPU executor the results are host data at once.)
    pub fn call_deferred(&self, args: In) -> Result<Out>
    where
        B: Clone,
    {
        let (tree, leaves) = self.flatten(&args)?;
        drop(args);
        let mut shapes = LeafShapes::default();
        match self.begin(tree, leaves, &mut shapes)? {
            Begun::Inline(out) => Ok(out),
            Begun::Run(entry, leaves) => {
                let (buffers, resolved) = self.launch(&entry, leaves, &shapes.refs())?;
                let device = read_back(Arc::new(self.backend.clone()));
                let arrays = buffers
                    .into_iter()
                    .zip(&entry.exe.graph().outputs)
                    .map(|(buffer, &o)| {
                        Array::from_device(
                            device.clone(),
                            B::share(buffer),
                            Shape::known(&resolved[o]),
                            entry.exe.graph().nodes[o].aval.dtype,
                        )
                    })
                    .collect();
                tree_unflatten(&entry.output_tree, arrays)
            }
        }
    }

    fn flatten(&self, args: &In) -> Result<(TreeDef, Vec<Array>)> {
        let mut leaves = Vec::with_capacity(self.leaf_count_hint.load(Ordering::Relaxed));
        let tree = args.flatten(&mut leaves)?;
        self.leaf_count_hint.store(leaves.len(), Ordering::Relaxed);
        Ok((tree, leaves))
    }

    /// Finds (or compiles) the entry serving the flattened arguments,
    /// filling in `shapes` (the leaves' shapes, which only a shapeless
    /// entry reads); called inside another trace, runs `f` inline instead.
    fn begin(
        &self,
        tree: TreeDef,
        leaves: Vec<Array>,
        shapes: &mut LeafShapes,
    ) -> Result<Begun<Out>> {
        if leaves.iter().any(|l| !l.is_computed()) {
            if leaves.iter().any(Array::is_tracer) {
                // Called inside another trace: inline `f` (a failed
                // argument's error then reaches the outer call's result).
                return Ok(Begun::Inline(self.f.apply(tree_unflatten(&tree, leaves)?)?));
            }
            // A failed argument is the call's error: its first one, as the
            // README promises for "the first eval, read or compiled call".
            if let Some(error) = leaves.iter().find_map(Array::error) {
                return Err(error.clone());
            }
            crate::compile::eval::eval(&leaves)?;
        }
        *shapes = self.leaf_shapes(&leaves);
        let (entry, _) = self.entry(&tree, &leaves, shapes)?;
        Ok(Begun::Run(entry, leaves))
    }

    /// Runs the entry and reads the results back, blocking.
    fn finish(&self, entry: &Entry, leaves: Vec<Array>, shapes: &LeafShapes) -> Result<Out> {
        let (buffers, resolved) = self.launch(entry, leaves, &shapes.refs())?;
        let arrays = buffers
            .into_iter()
            .zip(&entry.exe.graph().outputs)
            .map(|(buffer, &o)| {
                let data = self.backend.download(buffer)?;
                Ok(Array::from_host(data, Shape::known(&resolved[o])))
            })
            .collect::<Result<Vec<_>>>()?;
        tree_unflatten(&entry.output_tree, arrays)
    }

    /// The cached entry serving this call, if any; records the hit, or the
    /// miss with its explanation. The entry of the last hit is tried before
    /// hashing: a program calling with one signature over and over (the
    /// common case) pays one key comparison.
    fn lookup(&self, key: &KeyView<'_>, shapes: &[&[usize]]) -> Option<Arc<Entry>> {
        let mut state = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        state.calls += 1;
        let mut guard_failure = None;
        let mut found = state
            .last_hit
            .filter(|&i| self.serves(&state.entries[i], key, shapes, i, &mut guard_failure));
        if found.is_none() {
            guard_failure = None;
            found = state.buckets.get(&key.hash()).and_then(|bucket| {
                bucket
                    .iter()
                    .copied()
                    .find(|&i| self.serves(&state.entries[i], key, shapes, i, &mut guard_failure))
            });
        }
        if let Some(i) = found {
            state.hits += 1;
            state.last_hit = Some(i);
            return Some(state.entries[i].clone());
        }
        let miss = match guard_failure {
            Some((i, detail)) => CacheMiss {
                call: state.calls,
                reasons: vec![MissReason::ShapeGuard { detail }],
                closest_entry: Some(i),
            },
            None => explain_miss(
                state.calls,
                &key.to_key(),
                state.entries.iter().map(|e| &e.key),
            ),
        };
        state.misses += 1;
        if state.miss_log.len() == MISS_LOG_CAPACITY {
            state.miss_log.pop_front();
        }
        state.miss_log.push_back(miss);
        None
    }

    /// True when `entry` (at `index`) can serve the call: its key matches
    /// and, shapeless, its guards hold for these sizes. The first guard
    /// failure is kept to explain a miss.
    fn serves(
        &self,
        entry: &Entry,
        key: &KeyView<'_>,
        shapes: &[&[usize]],
        index: usize,
        guard_failure: &mut Option<(usize, String)>,
    ) -> bool {
        if !key.matches(&entry.key) {
            return false;
        }
        if !self.shapeless {
            return true;
        }
        match entry.exe.accepts(shapes) {
            Ok(()) => true,
            Err(e) => {
                guard_failure.get_or_insert((index, e.to_string()));
                false
            }
        }
    }

    /// Traces for this call and caches the result. A shapeless trace whose
    /// guards already reject this call's sizes is replaced by a trace with
    /// the concrete shapes: it serves the call, or reports the real error.
    fn trace_and_insert(
        &self,
        key: CacheKey,
        leaves: &[Array],
        shapes: &[&[usize]],
    ) -> Result<Arc<Entry>> {
        let mut traced = self.trace(&key.tree, leaves, self.shapeless)?;
        if self.shapeless && traced.exe.accepts(shapes).is_err() {
            traced = self.trace(&key.tree, leaves, false)?;
        }
        let Traced {
            exe,
            output_tree,
            traced,
            passes,
            symbols,
            vmap,
        } = traced;
        let mut state = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        // Another thread may have traced and inserted this signature while we
        // traced (both missed): serve its entry and drop our trace, so one
        // signature has one entry. This call still counts as a miss: it traced.
        let bucket = hash_key(&key);
        if let Some(existing) = state.buckets.get(&bucket).and_then(|indexes| {
            indexes
                .iter()
                .map(|&i| &state.entries[i])
                .find(|e| e.key == key && (!self.shapeless || e.exe.accepts(shapes).is_ok()))
        }) {
            return Ok(existing.clone());
        }
        let index = state.entries.len();
        let leaf_paths = key.tree.leaf_paths();
        let representative = exe.representative_shapes(shapes);
        let mut report = build_report(
            &representative,
            index,
            exe.is_shapeless(),
            &key.tree,
            &output_tree,
            &traced,
            passes,
            &exe,
            &symbols,
            &leaf_paths,
        );
        report.vmap_fallbacks = vmap.fallbacks;
        report.vmap_materialized = vmap.materialized;
        let report = Arc::new(report);
        let entry = Arc::new(Entry {
            key,
            exe,
            output_tree,
            report,
            latest_shapes: Mutex::default(),
        });
        state.buckets.entry(bucket).or_default().push(index);
        state.entries.push(entry.clone());
        Ok(entry)
    }

    fn trace(&self, tree: &TreeDef, leaves: &[Array], symbolic: bool) -> Result<Traced> {
        let trace = next_trace_id();
        // The equalities the trace's shape rules assume, which its later
        // shape checks rely on (see `crate::symbolic`).
        let scope = symbolic.then(TraceScope::open);
        let mut symbols = Vec::new();
        let params: Vec<Array> = leaves
            .iter()
            .enumerate()
            .map(|(i, leaf)| {
                let aval = if symbolic {
                    symbolic_aval(leaf, i, &mut symbols)
                } else {
                    leaf.aval().clone()
                };
                Array::param(trace, i, aval)
            })
            .collect();
        let args: In = tree_unflatten(tree, params)?;
        let ((out, backward), vmap) =
            collecting_vmap_records(|| collecting_backward(|| self.f.apply(args)));
        let out = out?;
        let backward: HashSet<usize> = backward.iter().map(Array::id).collect();
        let mut out_leaves = Vec::new();
        let output_tree = out.flatten(&mut out_leaves)?;
        let (mut graph, _) = extract(
            &out_leaves,
            Leaves::Trace {
                id: trace,
                num_inputs: leaves.len(),
            },
            &backward,
        )?;
        if let Some(scope) = &scope {
            keep_assumed_equalities(&mut graph, &scope.facts());
        }
        // Still in the scope: implicit lowering checks handlers' results.
        let passes = Passes {
            transposed_operands: self.backend.reads_transposed_operands(),
            ..self.passes
        };
        let (optimized, passes) = optimize(&graph, passes)?;
        drop(scope);
        let donated = self.donated_leaves(tree)?;
        let input_shapes: Vec<Vec<usize>> = leaves
            .iter()
            .map(|l| l.shape().as_known().unwrap_or_default())
            .collect();
        let input_refs: Vec<&[usize]> = input_shapes.iter().map(Vec::as_slice).collect();
        Ok(Traced {
            exe: Arc::new(Executable::new(
                optimized,
                symbols.clone(),
                &donated,
                &input_refs,
            )?),
            output_tree,
            traced: graph,
            passes,
            symbols,
            vmap,
        })
    }

    /// Which argument leaves of `tree` are donated; `Err` names a donated
    /// path that matches no leaf.
    fn donated_leaves(&self, tree: &TreeDef) -> Result<Vec<bool>> {
        leaves_under(tree, &self.donate, "donate")
    }

    /// Runs `entry` on the leaves, which it consumes: once uploaded, the
    /// leaves are dropped, so a donated buffer nothing else holds can be
    /// written in place. Returns the output buffers and their shapes.
    fn launch<'e>(
        &self,
        entry: &'e Entry,
        leaves: Vec<Array>,
        shapes: &[&[usize]],
    ) -> Result<Launched<'e, B::Buffer>> {
        let mut inputs: Vec<B::Buffer> = Vec::with_capacity(leaves.len());
        for leaf in &leaves {
            // A value this backend keeps is used where it is.
            let kept = leaf
                .buffer_on(self.backend.name())
                .and_then(|b| B::unshare(&b));
            let buffer = match kept {
                Some(buffer) => buffer,
                None => {
                    let data = leaf.host_value()?.ok_or_else(|| Error::ReadTracer {
                        aval: leaf.aval().to_string(),
                    })?;
                    self.backend.upload(&data)?
                }
            };
            inputs.push(buffer);
        }
        drop(leaves);
        let resolved = entry.exe.resolve_shapes(shapes)?;
        entry.remember_shapes(shapes);
        let outputs = self.backend.run(&entry.exe, inputs, &resolved)?;
        Ok((outputs, resolved))
    }
}

/// The output buffers of a run, and the shape of every value of its graph.
type Launched<'e, Buffer> = (Vec<Buffer>, Cow<'e, [Vec<usize>]>);

/// How a call goes on: `f` already ran inline (inside another trace), or
/// an entry runs on the flattened leaves.
enum Begun<Out> {
    Inline(Out),
    Run(Arc<Entry>, Vec<Array>),
}

/// Adds to `graph`'s guards every equality the trace assumed that they do
/// not already imply: a check may have relied on one recorded by an op
/// whose value the graph does not keep, and every call must satisfy what
/// any check relied on.
fn keep_assumed_equalities(graph: &mut Graph, assumed: &DimFacts) {
    let mut kept = graph.dim_facts();
    for (op, a, b) in assumed.assumed() {
        if !kept.dims_equal(a, b) {
            kept.assume_equal(op, a, b);
            graph.guards.push(Guard {
                op: op.clone(),
                condition: Condition::Equal(a.clone(), b.clone()),
            });
        }
    }
}

/// A leaf's aval with each axis of size other than 1 replaced by a fresh
/// symbol; size-1 axes stay known (they decide broadcasting).
fn symbolic_aval(leaf: &Array, index: usize, symbols: &mut Vec<(Symbol, SymbolSource)>) -> Aval {
    let dims = leaf
        .shape()
        .dims()
        .iter()
        .enumerate()
        .map(|(axis, d)| match d {
            Dim::Known(1) => Dim::Known(1),
            _ => {
                let s = Symbol(symbols.len() as u32);
                symbols.push((s, SymbolSource { leaf: index, axis }));
                Dim::symbol(s)
            }
        })
        .collect();
    Aval::new(Shape(dims), leaf.dtype())
}

/// The concrete shapes of a call's leaves, in one buffer (on the stack for
/// typical argument trees).
#[derive(Default)]
struct LeafShapes {
    dims: SmallVec<[usize; 64]>,
    ends: SmallVec<[usize; 32]>,
}

impl LeafShapes {
    fn of(leaves: &[Array]) -> LeafShapes {
        let mut dims = SmallVec::new();
        let mut ends = SmallVec::new();
        for leaf in leaves {
            for dim in leaf.shape().dims() {
                if let Dim::Known(n) = dim {
                    dims.push(*n);
                }
            }
            ends.push(dims.len());
        }
        LeafShapes { dims, ends }
    }

    fn refs(&self) -> SmallVec<[&[usize]; 32]> {
        let mut start = 0;
        self.ends
            .iter()
            .map(|&end| {
                let s = &self.dims[start..end];
                start = end;
                s
            })
            .collect()
    }
}
