//! Fused elementwise groups: one op standing for a tree of elementwise ops
//! whose intermediate values never leave the group.
//!
//! Evaluation replays the members' own evaluation, so a fused group gives
//! the same bits as its members run one by one. Groups of f32 arithmetic on
//! full-size or scalar operands take a tiled path instead: each member runs
//! over a cache-sized tile, and intermediates live in a few reused tile
//! registers rather than whole arrays. Runs of cheap ops with a scalar
//! operand (`x·a + b`, `x − c`) fold into the step before them as an
//! epilogue, applied while its value is still in registers: on the
//! anchors' chain (exp, ×c, +c, tanh) that halves the tile passes, and a
//! chain of cheap scalar ops runs about a third faster than with one pass
//! per op (`cpu_scalar_chain_100`, 0.22 → 0.15 ms).

use super::binary::{float_zip_into, Lane};
use super::math::map_into;
use super::math::simd_dispatch;
use super::strided::numel;
use super::unary::float_map_into_then;
use super::{BinaryOp, Op, ShapeCx, UnaryOp};
use crate::data::HostData;
use crate::error::{Error, Result};
use crate::shape::Aval;
#[cfg(not(target_arch = "wasm32"))]
use crate::threads::{cpu_threads, for_each_task};
use smallvec::SmallVec;
use std::cell::RefCell;
#[cfg(not(target_arch = "wasm32"))]
use std::sync::Mutex;

/// Elements per tile: small enough that a few tile registers stay in L1.
const TILE: usize = 1024;

/// An operand of a fused step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FusedArg {
    /// External operand `i` of the fused op.
    Input(usize),
    /// The value of an earlier step.
    Step(usize),
}

/// One member op of a fused group.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FusedStep {
    /// The member's op (elementwise).
    pub op: Op,
    /// Its operands.
    pub args: Vec<FusedArg>,
}

/// An operand of a tiled step, resolved when the kernel is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum TileSource {
    /// External operand `k`.
    Input(usize),
    /// Tile register `r`.
    Register(usize),
}

/// The cheap ops with a scalar operand folded onto a tiled step, applied
/// to its value while it is still in registers: an optional
/// multiplication, then an optional addition or subtraction. Each names
/// the external operand that holds the scalar.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Epilogue {
    mul: Option<usize>,
    /// The operand, and whether it is subtracted.
    add: Option<(usize, bool)>,
}

impl Epilogue {
    /// The epilogue followed by `op` with scalar operand `k` (on the right
    /// for a subtraction), if the form (mul?)(add|sub)? still holds it.
    fn then(self, op: BinaryOp, k: usize) -> Option<Epilogue> {
        match (op, self.mul, self.add) {
            (BinaryOp::Mul, None, None) => Some(Epilogue {
                mul: Some(k),
                ..self
            }),
            (BinaryOp::Add | BinaryOp::Sub, _, None) => Some(Epilogue {
                add: Some((k, op == BinaryOp::Sub)),
                ..self
            }),
            _ => None,
        }
    }
}

/// One step of the tiled program: the op, its operands, the epilogue
/// applied to its value before it is stored, and the register it writes
/// (`None`: the output).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum TileStep {
    Unary(UnaryOp, TileSource, Epilogue, Option<usize>),
    Binary(BinaryOp, TileSource, TileSource, Option<usize>),
    /// The operand itself through the epilogue: a run of cheap scalar ops
    /// whose first op had nothing to fold onto.
    Affine(TileSource, Epilogue, Option<usize>),
}

/// A tiled program and the tile registers it needs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct TileProgram {
    steps: Vec<TileStep>,
    num_registers: usize,
}

/// A step of the folded program before registers are assigned: what
/// produces the value, the epilogue, and the original step whose value it
/// is.
struct FoldedGroup {
    producer: Producer,
    epilogue: Epilogue,
    output: usize,
}

/// What produces a folded group's value, reading original operands.
enum Producer {
    Unary(UnaryOp, FusedArg),
    Binary(BinaryOp, FusedArg, FusedArg),
    Identity(FusedArg),
}

impl Producer {
    fn args(&self) -> SmallVec<[FusedArg; 2]> {
        match *self {
            Producer::Unary(_, a) | Producer::Identity(a) => smallvec::smallvec![a],
            Producer::Binary(_, a, b) => smallvec::smallvec![a, b],
        }
    }
}

/// A fused group: its steps in order; the last step's value is the result.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FusedKernel {
    steps: Vec<FusedStep>,
    num_inputs: usize,
    /// Steps after which a step's value is dead, for the replay path.
    last_use: Vec<usize>,
    /// The steps as a tiled program, when every step is f32-capable
    /// arithmetic (no comparison, select or cast).
    program: Option<TileProgram>,
    /// The tiled program with runs of cheap scalar ops folded into
    /// epilogues, when that folds anything; it runs when every operand an
    /// epilogue names is a scalar.
    folded: Option<TileProgram>,
}

impl FusedKernel {
    /// A kernel over `num_inputs` external operands. Steps may only read
    /// inputs and earlier steps; the last step is the result.
    pub fn new(steps: Vec<FusedStep>, num_inputs: usize) -> Result<FusedKernel> {
        let bad = |detail: String| Error::InvalidArgument {
            op: "fused".into(),
            detail,
            at: None,
        };
        if steps.is_empty() {
            return Err(bad("a fused group needs at least one step".into()));
        }
        let mut last_use = vec![0; steps.len()];
        for (i, step) in steps.iter().enumerate() {
            if !step.op.is_elementwise() || matches!(step.op, Op::Fused(_)) {
                return Err(bad(format!(
                    "step {i} ({}) is not a plain elementwise op",
                    step.op.name()
                )));
            }
            for arg in &step.args {
                match *arg {
                    FusedArg::Input(k) if k >= num_inputs => {
                        return Err(bad(format!("step {i} reads input {k} of {num_inputs}")))
                    }
                    FusedArg::Step(j) if j >= i => {
                        return Err(bad(format!("step {i} reads later step {j}")))
                    }
                    FusedArg::Step(j) => last_use[j] = i,
                    FusedArg::Input(_) => {}
                }
            }
        }
        let program = steps
            .iter()
            .map(|step| match (&step.op, step.args.as_slice()) {
                (Op::Unary(u), [a]) => Some(Producer::Unary(*u, *a)),
                (Op::Binary(b), [a, c]) if !b.is_comparison() => Some(Producer::Binary(*b, *a, *c)),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .map(|producers| {
                producers
                    .into_iter()
                    .enumerate()
                    .map(|(output, producer)| FoldedGroup {
                        producer,
                        epilogue: Epilogue::default(),
                        output,
                    })
                    .collect::<Vec<_>>()
            });
        let folded = program
            .as_ref()
            .and_then(|_| fold_scalar_runs(&steps))
            .filter(|groups| groups.len() < steps.len())
            .map(|groups| assign_registers(&groups, steps.len()));
        let program = program.map(|groups| assign_registers(&groups, steps.len()));
        Ok(FusedKernel {
            steps,
            num_inputs,
            last_use,
            program,
            folded,
        })
    }

    /// The member steps.
    pub fn steps(&self) -> &[FusedStep] {
        &self.steps
    }

    /// Number of external operands.
    pub fn num_inputs(&self) -> usize {
        self.num_inputs
    }

    /// `fused(exp, mul, add)`; long groups are abbreviated.
    pub fn describe(&self) -> String {
        const SHOWN: usize = 8;
        let names: Vec<&str> = self.steps.iter().take(SHOWN).map(|s| s.op.name()).collect();
        if self.steps.len() > SHOWN {
            format!("fused({} ops: {}, …)", self.steps.len(), names.join(", "))
        } else {
            format!("fused({})", names.join(", "))
        }
    }
}

/// Whether `step` is a cheap op with a scalar candidate: `x * k`, `k * x`,
/// `x + k`, `k + x` or `x - k`, with `k` an external operand. Returns the
/// op, `x` and `k`.
fn cheap_scalar_step(step: &FusedStep) -> Option<(BinaryOp, FusedArg, usize)> {
    let Op::Binary(op) = step.op else {
        return None;
    };
    match (op, step.args.as_slice()) {
        (BinaryOp::Mul | BinaryOp::Add | BinaryOp::Sub, [x, FusedArg::Input(k)]) => {
            Some((op, *x, *k))
        }
        (BinaryOp::Mul | BinaryOp::Add, [FusedArg::Input(k), x]) => Some((op, *x, *k)),
        _ => None,
    }
}

/// Groups the steps so that each cheap scalar step
/// reading only the step just before it, which nothing else reads, joins
/// that step's epilogue (while its form allows); one with nothing to join
/// starts an `Identity` group. Multiplication and addition commute
/// bitwise, and `x − k` is `x + (−k)` bitwise, so every group computes its
/// members' values exactly. `None` when a step has no tiled form.
fn fold_scalar_runs(steps: &[FusedStep]) -> Option<Vec<FoldedGroup>> {
    let mut readers = vec![0usize; steps.len()];
    for step in steps {
        for arg in &step.args {
            if let FusedArg::Step(j) = *arg {
                readers[j] += 1;
            }
        }
    }
    let mut groups: Vec<FoldedGroup> = Vec::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        if let Some((op, x, k)) = cheap_scalar_step(step) {
            let joins = |g: &FoldedGroup| {
                x == FusedArg::Step(i.wrapping_sub(1))
                    && g.output + 1 == i
                    && readers[g.output] == 1
            };
            if let Some(last) = groups.last_mut().filter(|g| joins(g)) {
                if !matches!(last.producer, Producer::Binary(..)) {
                    if let Some(epilogue) = last.epilogue.then(op, k) {
                        last.epilogue = epilogue;
                        last.output = i;
                        continue;
                    }
                }
            }
            if let Some(epilogue) = Epilogue::default().then(op, k) {
                groups.push(FoldedGroup {
                    producer: Producer::Identity(x),
                    epilogue,
                    output: i,
                });
                continue;
            }
        }
        let producer = match (&step.op, step.args.as_slice()) {
            (Op::Unary(u), [a]) => Producer::Unary(*u, *a),
            (Op::Binary(b), [a, c]) => Producer::Binary(*b, *a, *c),
            _ => return None,
        };
        groups.push(FoldedGroup {
            producer,
            epilogue: Epilogue::default(),
            output: i,
        });
    }
    Some(groups)
}

/// Assigns tile registers to `groups` (whose operands name original steps,
/// `num_steps` of them) and builds the tiled program. A register is
/// reused once its value's last reader has run; the destination is
/// allocated before the operands are freed, so a step never writes the
/// register it reads.
fn assign_registers(groups: &[FoldedGroup], num_steps: usize) -> TileProgram {
    // The group holding each original step's value (folded intermediates
    // are read only inside their group).
    let mut group_of = vec![usize::MAX; num_steps];
    for (g, group) in groups.iter().enumerate() {
        group_of[group.output] = g;
    }
    let mut last_use = vec![0usize; groups.len()];
    for (g, group) in groups.iter().enumerate() {
        for arg in group.producer.args() {
            if let FusedArg::Step(j) = arg {
                last_use[group_of[j]] = g;
            }
        }
    }
    let mut registers = Vec::with_capacity(groups.len());
    let mut free: Vec<usize> = Vec::new();
    let mut num_registers = 0;
    for (g, group) in groups.iter().enumerate() {
        let reg = free.pop().unwrap_or_else(|| {
            num_registers += 1;
            num_registers - 1
        });
        registers.push(reg);
        for arg in group.producer.args() {
            if let FusedArg::Step(j) = arg {
                let source = group_of[j];
                if last_use[source] == g && !free.contains(&registers[source]) {
                    free.push(registers[source]);
                }
            }
        }
    }
    let last = groups.len() - 1;
    let source = |arg: FusedArg| match arg {
        FusedArg::Input(k) => TileSource::Input(k),
        FusedArg::Step(j) => TileSource::Register(registers[group_of[j]]),
    };
    let steps = groups
        .iter()
        .enumerate()
        .map(|(g, group)| {
            let dst = (g != last).then_some(registers[g]);
            match group.producer {
                Producer::Unary(u, a) => TileStep::Unary(u, source(a), group.epilogue, dst),
                Producer::Binary(b, a, c) => TileStep::Binary(b, source(a), source(c), dst),
                Producer::Identity(a) => TileStep::Affine(source(a), group.epilogue, dst),
            }
        })
        .collect();
    TileProgram {
        steps,
        num_registers,
    }
}

/// The members' shape rules replayed over the external operands.
pub fn shape_rule(kernel: &FusedKernel, inputs: &[&Aval], cx: &mut ShapeCx) -> Result<Aval> {
    if inputs.len() != kernel.num_inputs {
        return Err(Error::InvalidArgument {
            op: "fused".into(),
            detail: format!(
                "expects {} operands, got {}",
                kernel.num_inputs,
                inputs.len()
            ),
            at: None,
        });
    }
    step_avals(&kernel.steps, inputs, cx)?
        .pop()
        .ok_or_else(|| Error::InvalidArgument {
            op: "fused".into(),
            detail: "a fused group has no steps".into(),
            at: None,
        })
}

/// The aval of every one of `steps` on operands of `inputs`, by each
/// member's own shape rule: the one rule of what a step produces, which
/// the GPU lowering uses too.
pub fn step_avals(steps: &[FusedStep], inputs: &[&Aval], cx: &mut ShapeCx) -> Result<Vec<Aval>> {
    let mut avals: Vec<Aval> = Vec::with_capacity(steps.len());
    for step in steps {
        let aval = {
            let args: Vec<&Aval> = step
                .args
                .iter()
                .map(|a| match *a {
                    FusedArg::Input(k) => inputs[k],
                    FusedArg::Step(j) => &avals[j],
                })
                .collect();
            step.op.shape_rule(&args, cx)?
        };
        avals.push(aval);
    }
    Ok(avals)
}

/// Evaluates the group; every member's output has `out_shape`.
pub fn eval(
    kernel: &FusedKernel,
    inputs: &[&HostData],
    in_shapes: &[&[usize]],
    out_shape: &[usize],
) -> Result<HostData> {
    if let Some(out) = eval_tiled_f32(kernel, inputs, in_shapes, out_shape) {
        return Ok(out);
    }
    let mut values: Vec<Option<HostData>> = Vec::with_capacity(kernel.steps.len());
    for (i, step) in kernel.steps.iter().enumerate() {
        let mut operands = Vec::with_capacity(step.args.len());
        let mut shapes = Vec::with_capacity(step.args.len());
        for arg in &step.args {
            match *arg {
                FusedArg::Input(k) => {
                    operands.push(inputs[k]);
                    shapes.push(in_shapes[k]);
                }
                FusedArg::Step(j) => {
                    operands.push(values[j].as_ref().ok_or_else(|| Error::Runtime {
                        op: "fused".into(),
                        detail: format!("step {i} reads step {j} after its last use"),
                    })?);
                    shapes.push(out_shape);
                }
            }
        }
        let value = step.op.eval(&operands, &shapes, out_shape)?;
        values.push(Some(value));
        for arg in &step.args {
            if let FusedArg::Step(j) = *arg {
                if kernel.last_use[j] == i {
                    values[j] = None;
                }
            }
        }
    }
    values.pop().flatten().ok_or_else(|| Error::Runtime {
        op: "fused".into(),
        detail: "the group produced no value".into(),
    })
}

/// An external operand of a tiled evaluation.
#[derive(Clone, Copy)]
enum Source<'a> {
    Full(&'a [f32]),
    Scalar(f32),
    /// An operand broadcast along leading axes only (a bias row): output
    /// element `i` reads element `i % len`.
    Repeating(&'a [f32]),
    /// The output buffer itself, which the group writes in place.
    Aliased,
}

/// The tiled source of an f32 operand of shape `shape` for an output of
/// `out_shape` (`n` elements); `None` when the operand broadcasts in a way
/// the tiles do not read (along a trailing axis).
fn source_of<'a>(
    v: &'a [f32],
    shape: &[usize],
    out_shape: &[usize],
    n: usize,
) -> Option<Source<'a>> {
    if v.len() == n {
        return Some(Source::Full(v));
    }
    if v.len() == 1 {
        return Some(Source::Scalar(v[0]));
    }
    let leading_ones = shape.iter().take_while(|&&d| d == 1).count();
    let trailing = &shape[leading_ones..];
    let repeats =
        !v.is_empty() && trailing.len() <= out_shape.len() && out_shape.ends_with(trailing);
    repeats.then_some(Source::Repeating(v))
}

/// Evaluates the group into `target`, the buffer of the external operand
/// at each position where `inputs` holds `None` (it has the output's shape
/// and dtype). Returns `false`, touching nothing, when the group does not
/// take the tiled f32 path; the caller then evaluates and copies.
pub fn eval_in_place(
    kernel: &FusedKernel,
    inputs: &[Option<&HostData>],
    in_shapes: &[&[usize]],
    out_shape: &[usize],
    target: &mut HostData,
) -> bool {
    if kernel.program.is_none() || inputs.len() != kernel.num_inputs {
        return false;
    }
    let HostData::F32(out) = target else {
        return false;
    };
    let n = numel(out_shape);
    if out.len() != n {
        return false;
    }
    let mut sources: SmallVec<[Source<'_>; 8]> = SmallVec::with_capacity(inputs.len());
    for (input, shape) in inputs.iter().zip(in_shapes) {
        let source = match input {
            None => Some(Source::Aliased),
            Some(HostData::F32(v)) => source_of(v, shape, out_shape, n),
            Some(_) => None,
        };
        let Some(source) = source else { return false };
        sources.push(source);
    }
    run_split(kernel, &sources, out);
    true
}

/// The tiled path, when every step is f32 arithmetic and every operand is
/// f32 with one element per output element, a single element, or a row
/// repeated along leading axes.
fn eval_tiled_f32(
    kernel: &FusedKernel,
    inputs: &[&HostData],
    in_shapes: &[&[usize]],
    out_shape: &[usize],
) -> Option<HostData> {
    kernel.program.as_ref()?;
    let n = numel(out_shape);
    let mut sources: SmallVec<[Source<'_>; 8]> = SmallVec::with_capacity(inputs.len());
    for (data, shape) in inputs.iter().zip(in_shapes) {
        let HostData::F32(v) = data else { return None };
        sources.push(source_of(v, shape, out_shape, n)?);
    }
    let mut out = crate::pool::zeroed_f32(n);
    run_split(kernel, &sources, &mut out);
    Some(HostData::F32(out))
}

/// An epilogue with its scalars read: what happens to a step's value
/// before it is stored.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Post {
    None,
    Mul(f32),
    Add(f32),
    MulAdd(f32, f32),
}

impl Post {
    /// `epilogue` over `sources`; `None` when an operand it names is not a
    /// scalar (the unfolded program runs then).
    fn resolve(epilogue: Epilogue, sources: &[Source<'_>]) -> Option<Post> {
        let scalar = |k: usize| match sources[k] {
            Source::Scalar(x) => Some(x),
            Source::Full(_) | Source::Repeating(_) | Source::Aliased => None,
        };
        // x − k is x + (−k) bitwise (IEEE 754 defines subtraction so).
        let add = match epilogue.add {
            Some((k, subtract)) => Some(if subtract { -scalar(k)? } else { scalar(k)? }),
            None => None,
        };
        Some(match (epilogue.mul.map(scalar), add) {
            (None, None) => Post::None,
            (Some(a), None) => Post::Mul(a?),
            (None, Some(b)) => Post::Add(b),
            (Some(a), Some(b)) => Post::MulAdd(a?, b),
        })
    }
}

/// Binds `$g` to the function `post` applies and evaluates `$body`, so
/// each epilogue form gets its own loop with the scalars in registers.
macro_rules! with_post {
    ($post:expr, $g:ident => $body:expr) => {
        match $post {
            Post::None => {
                let $g = |y: f32| y;
                $body
            }
            Post::Mul(a) => {
                let $g = move |y: f32| y * a;
                $body
            }
            Post::Add(b) => {
                let $g = move |y: f32| y + b;
                $body
            }
            Post::MulAdd(a, b) => {
                let $g = move |y: f32| y * a + b;
                $body
            }
        }
    };
}

/// The program to run over `sources` and each step's resolved epilogue:
/// the folded one when every scalar it folds is a scalar here.
fn choose_program<'k>(
    kernel: &'k FusedKernel,
    sources: &[Source<'_>],
) -> Option<(&'k TileProgram, SmallVec<[Post; 16]>)> {
    // A plain loop into a vector sized once: this runs per call, and a
    // collect through `Option` costs a grow and a fold adapter per step.
    let resolve = |program: &'k TileProgram| {
        let mut posts = SmallVec::<[Post; 16]>::with_capacity(program.steps.len());
        for step in &program.steps {
            posts.push(match *step {
                TileStep::Unary(_, _, e, _) | TileStep::Affine(_, e, _) => {
                    Post::resolve(e, sources)?
                }
                TileStep::Binary(..) => Post::None,
            });
        }
        Some((program, posts))
    };
    kernel
        .folded
        .as_ref()
        .and_then(resolve)
        .or_else(|| kernel.program.as_ref().and_then(resolve))
}

/// Runs the tiles, split across [`crate::exec::cpu_threads`] threads when
/// the group is big enough (tiles are independent, so the result is the
/// same). wasm32 runs on one thread.
fn run_split(kernel: &FusedKernel, sources: &[Source<'_>], out: &mut [f32]) {
    let Some((program, posts)) = choose_program(kernel, sources) else {
        return;
    };
    let tiles = Tiles {
        program,
        posts: &posts,
        sources,
    };
    #[cfg(not(target_arch = "wasm32"))]
    {
        /// Element-ops (elements × steps) below which splitting the output
        /// across threads costs more in handing out than it saves.
        const PARALLEL_MIN_WORK: usize = 1 << 20;
        let cores = cpu_threads();
        let n = out.len();
        if cores > 1 && n >= 2 * TILE && n.saturating_mul(kernel.steps.len()) >= PARALLEL_MIN_WORK {
            // Several chunks per thread, claimed one at a time (see
            // `for_each_task`).
            let per_task = n.div_ceil(cores * 4).div_ceil(TILE) * TILE;
            let chunks: Vec<Mutex<&mut [f32]>> = out.chunks_mut(per_task).map(Mutex::new).collect();
            for_each_task(chunks.len(), |k| {
                let mut chunk = chunks[k].lock().unwrap_or_else(|p| p.into_inner());
                run_tiles(&tiles, &mut chunk, k * per_task);
            });
            return;
        }
    }
    run_tiles(&tiles, out, 0);
}

/// One run of a tiled program: the program, its resolved epilogues and
/// its external operands.
struct Tiles<'a> {
    program: &'a TileProgram,
    posts: &'a [Post],
    sources: &'a [Source<'a>],
}

thread_local! {
    /// Tile registers kept between evaluations, so a cached call of a small
    /// fused kernel allocates none.
    static REGISTER_POOL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// A buffer of at least `len` elements, from the pool when it has one.
fn take_registers(len: usize) -> Vec<f32> {
    let mut buffer = REGISTER_POOL.with(|pool| {
        pool.try_borrow_mut()
            .map(|mut p| std::mem::take(&mut *p))
            .unwrap_or_default()
    });
    if buffer.len() < len {
        buffer.resize(len, 0.0);
    }
    buffer
}

/// Gives a register buffer back to the pool, keeping the larger one.
fn return_registers(buffer: Vec<f32>) {
    REGISTER_POOL.with(|pool| {
        if let Ok(mut pool) = pool.try_borrow_mut() {
            if buffer.len() >= pool.len() {
                *pool = buffer;
            }
        }
    });
}

simd_dispatch! {
    /// Runs the program over `out`, which holds output elements from
    /// `offset` on, tile by tile, in the widest SIMD build the CPU runs.
    fn run_tiles(tiles: &Tiles<'_>, out: &mut [f32], offset: usize) {
        run_tiles_portable(tiles, out, offset)
    }
}

#[inline(always)]
fn run_tiles_portable(tiles: &Tiles<'_>, out: &mut [f32], offset: usize) {
    let Tiles {
        program,
        posts,
        sources,
    } = *tiles;
    let n = out.len();
    let tile = TILE.min(n.max(1));
    // An aliased operand is copied tile by tile into one extra register
    // before the tile's steps run, since the last step overwrites it; each
    // repeating operand is laid out along the tile in one extra register.
    let aliased = sources.iter().any(|s| matches!(s, Source::Aliased));
    let alias_register = program.num_registers;
    let mut extra = program.num_registers + usize::from(aliased);
    let mut repeat_register: SmallVec<[usize; 8]> = SmallVec::with_capacity(sources.len());
    for source in sources {
        repeat_register.push(extra);
        extra += usize::from(matches!(source, Source::Repeating(_)));
    }
    let mut registers = take_registers(extra * tile);
    for start in (0..n).step_by(tile) {
        let len = tile.min(n - start);
        if aliased {
            let at = alias_register * tile;
            registers[at..at + len].copy_from_slice(&out[start..start + len]);
        }
        for (source, &r) in sources.iter().zip(&repeat_register) {
            if let Source::Repeating(row) = *source {
                let dst = &mut registers[r * tile..r * tile + len];
                let mut from = (offset + start) % row.len();
                let mut filled = 0;
                while filled < len {
                    let run = (row.len() - from).min(len - filled);
                    dst[filled..filled + run].copy_from_slice(&row[from..from + run]);
                    filled += run;
                    from = 0;
                }
            }
        }
        for (step, &post) in program.steps.iter().zip(posts) {
            let dst_register = match *step {
                TileStep::Unary(.., dst)
                | TileStep::Binary(.., dst)
                | TileStep::Affine(.., dst) => dst,
            };
            // The destination register is split off the buffer, so sources
            // (other registers) are read while it is written.
            let (before, dst, after): (&[f32], &mut [f32], &[f32]) = match dst_register {
                Some(d) => {
                    let (before, rest) = registers.split_at_mut(d * tile);
                    let (dst, after) = rest.split_at_mut(tile);
                    (before, &mut dst[..len], after)
                }
                None => (&registers[..], &mut out[start..start + len], &[]),
            };
            let below = dst_register.unwrap_or(usize::MAX);
            let register = |r: usize| {
                if r < below {
                    Lane::Run(&before[r * tile..r * tile + len])
                } else {
                    let at = (r - below - 1) * tile;
                    Lane::Run(&after[at..at + len])
                }
            };
            let lane = |src: TileSource| match src {
                TileSource::Input(k) => match sources[k] {
                    Source::Full(v) => Lane::Run(&v[offset + start..offset + start + len]),
                    Source::Scalar(x) => Lane::Splat(x),
                    Source::Repeating(_) => register(repeat_register[k]),
                    Source::Aliased => register(alias_register),
                },
                TileSource::Register(r) => register(r),
            };
            match *step {
                TileStep::Unary(u, a, _, _) => with_post!(post, g => match lane(a) {
                    Lane::Run(src) => float_map_into_then(u, src, dst, g),
                    Lane::Splat(x) => {
                        let mut one = [0f32];
                        float_map_into_then(u, &[x], &mut one, g);
                        dst.fill(one[0]);
                    }
                }),
                TileStep::Affine(a, _, _) => with_post!(post, g => match lane(a) {
                    Lane::Run(src) => map_into(src, dst, g),
                    Lane::Splat(x) => dst.fill(g(x)),
                }),
                TileStep::Binary(b, a, c, _) => float_zip_into(b, lane(a), lane(c), dst),
            }
        }
    }
    return_registers(registers);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::math::exp_f32;
    use crate::ops::{BinaryOp, UnaryOp};

    fn chain_kernel() -> FusedKernel {
        // (exp(in0) * in1) + in0
        FusedKernel::new(
            vec![
                FusedStep {
                    op: Op::Unary(UnaryOp::Exp),
                    args: vec![FusedArg::Input(0)],
                },
                FusedStep {
                    op: Op::Binary(BinaryOp::Mul),
                    args: vec![FusedArg::Step(0), FusedArg::Input(1)],
                },
                FusedStep {
                    op: Op::Binary(BinaryOp::Add),
                    args: vec![FusedArg::Step(1), FusedArg::Input(0)],
                },
            ],
            2,
        )
        .unwrap()
    }

    #[test]
    fn tiled_result_equals_member_by_member_result_bitwise() {
        let n = 2 * TILE + 37;
        let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.013).sin()).collect();
        let kernel = chain_kernel();
        let inputs = [&HostData::F32(x.clone()), &HostData::F32(vec![2.5])];
        let tiled = eval_tiled_f32(&kernel, &inputs, &[&[n], &[1]], &[n]).unwrap();
        let expected: Vec<f32> = x.iter().map(|&v| exp_f32(v) * 2.5 + v).collect();
        assert_eq!(tiled, HostData::F32(expected));
    }

    #[test]
    fn groups_split_across_threads_give_the_same_bits() {
        // Enough element-ops (3 steps) to split across threads, and a length that
        // is not a multiple of the tile.
        let n = (1 << 20) / 3 + 123;
        let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.0007).cos()).collect();
        let kernel = chain_kernel();
        let inputs = [&HostData::F32(x.clone()), &HostData::F32(vec![-0.75])];
        let got = eval_tiled_f32(&kernel, &inputs, &[&[n], &[]], &[n]).unwrap();
        let expected: Vec<f32> = x.iter().map(|&v| exp_f32(v) * -0.75 + v).collect();
        assert_eq!(got, HostData::F32(expected));
    }

    /// `exp(x) * row + x` with `row` broadcast along leading axes, as the
    /// member-by-member evaluation computes it.
    fn with_repeating_row(rows: usize, cols: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let x: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.011).sin()).collect();
        let row: Vec<f32> = (0..cols).map(|j| j as f32 * 0.25 - 3.0).collect();
        let expected = x
            .iter()
            .enumerate()
            .map(|(i, &v)| exp_f32(v) * row[i % cols] + v)
            .collect();
        (x, row, expected)
    }

    #[test]
    fn a_row_broadcast_along_leading_axes_runs_tiled_with_the_same_bits() {
        // Rows that straddle tiles (300 does not divide 1024), and a split
        // across threads whose chunks start mid-row.
        for (rows, cols) in [(7, 300), ((1 << 20) / 3 / 300 + 5, 300), (3, 1)] {
            let (x, row, expected) = with_repeating_row(rows, cols);
            let inputs = [&HostData::F32(x), &HostData::F32(row)];
            let got = eval_tiled_f32(
                &chain_kernel(),
                &inputs,
                &[&[rows, cols], &[1, cols]],
                &[rows, cols],
            );
            assert_eq!(got, Some(HostData::F32(expected)), "{rows}x{cols}");
        }
    }

    #[test]
    fn a_row_broadcast_along_leading_axes_runs_in_place() {
        let (x, row, expected) = with_repeating_row(5, 300);
        let mut target = HostData::F32(x);
        let row = HostData::F32(row);
        let ran = eval_in_place(
            &chain_kernel(),
            &[None, Some(&row)],
            &[&[5, 300], &[300]],
            &[5, 300],
            &mut target,
        );
        assert!(ran);
        assert_eq!(target, HostData::F32(expected));
    }

    #[test]
    fn a_column_broadcast_along_a_trailing_axis_is_not_tiled() {
        let inputs = [&HostData::F32(vec![0.5; 6]), &HostData::F32(vec![1.0, 2.0])];
        assert_eq!(
            eval_tiled_f32(&chain_kernel(), &inputs, &[&[2, 3], &[2, 1]], &[2, 3]),
            None
        );
    }

    #[test]
    fn half_inputs_replay_members_with_rounding_after_each_step() {
        use half::f16;
        let kernel = chain_kernel();
        let x = HostData::F16(vec![f16::from_f32(0.3), f16::from_f32(-1.7)]);
        let k = HostData::F16(vec![f16::from_f32(3.0)]);
        let got = eval(&kernel, &[&x, &k], &[&[2], &[1]], &[2]).unwrap();
        let step = |v: f32| {
            let e = f16::from_f32(exp_f32(f16::from_f32(v).to_f32()));
            let m = f16::from_f32(e.to_f32() * 3.0);
            f16::from_f32(m.to_f32() + f16::from_f32(v).to_f32())
        };
        assert_eq!(got, HostData::F16(vec![step(0.3), step(-1.7)]));
    }

    #[test]
    fn registers_are_reused_along_a_chain() {
        let steps = (0..50)
            .map(|i| FusedStep {
                op: Op::Binary(BinaryOp::Add),
                args: vec![
                    if i == 0 {
                        FusedArg::Input(0)
                    } else {
                        FusedArg::Step(i - 1)
                    },
                    FusedArg::Input(1),
                ],
            })
            .collect();
        let kernel = FusedKernel::new(steps, 2).unwrap();
        assert_eq!(kernel.program.map(|p| p.num_registers), Some(2));
    }

    fn unary(op: UnaryOp, arg: FusedArg) -> FusedStep {
        FusedStep {
            op: Op::Unary(op),
            args: vec![arg],
        }
    }

    fn binary(op: BinaryOp, a: FusedArg, b: FusedArg) -> FusedStep {
        FusedStep {
            op: Op::Binary(op),
            args: vec![a, b],
        }
    }

    /// exp, ×k, +k, tanh repeated `n` times over input 0, with the scalars
    /// in inputs 1 and 2.
    fn anchor_chain(n: usize) -> FusedKernel {
        let mut steps = Vec::new();
        for i in 0..4 * n {
            let x = if i == 0 {
                FusedArg::Input(0)
            } else {
                FusedArg::Step(i - 1)
            };
            steps.push(match i % 4 {
                0 => unary(UnaryOp::Exp, x),
                1 => binary(BinaryOp::Mul, x, FusedArg::Input(1)),
                // k + x: the scalar on the left.
                2 => binary(BinaryOp::Add, FusedArg::Input(2), x),
                _ => unary(UnaryOp::Tanh, x),
            });
        }
        FusedKernel::new(steps, 3).unwrap()
    }

    /// The kernel's members evaluated one by one, as unfused execution does.
    fn member_by_member(kernel: &FusedKernel, inputs: &[&HostData], n: usize) -> HostData {
        let mut values: Vec<HostData> = Vec::new();
        for step in kernel.steps() {
            let operands: Vec<&HostData> = step
                .args
                .iter()
                .map(|a| match *a {
                    FusedArg::Input(k) => inputs[k],
                    FusedArg::Step(j) => &values[j],
                })
                .collect();
            let (one, full) = ([1usize], [n]);
            let shapes: Vec<&[usize]> = operands
                .iter()
                .map(|d| if d.len() == 1 { &one[..] } else { &full[..] })
                .collect();
            values.push(step.op.eval(&operands, &shapes, &[n]).unwrap());
        }
        values.pop().unwrap()
    }

    #[test]
    fn scalar_runs_fold_into_the_epilogue_of_the_step_before() {
        let kernel = anchor_chain(3);
        let folded = kernel.folded.as_ref().expect("the chain folds");
        // exp with (×k, +k) in its epilogue, then tanh: two steps per four.
        assert_eq!(folded.steps.len(), 6);
        let epilogue = Epilogue {
            mul: Some(1),
            add: Some((2, false)),
        };
        assert!(matches!(
            folded.steps[0],
            TileStep::Unary(UnaryOp::Exp, TileSource::Input(0), e, Some(_)) if e == epilogue
        ));
        assert!(matches!(
            folded.steps[5],
            TileStep::Unary(UnaryOp::Tanh, TileSource::Register(_), e, None) if e == Epilogue::default()
        ));
    }

    #[test]
    fn folded_chains_equal_member_by_member_evaluation_bitwise() {
        let n = 2 * TILE + 45;
        let x: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin() * 1.6).collect();
        let kernel = anchor_chain(5);
        for (a, b) in [(0.5f32, 0.25f32), (-1.25, -0.0), (0.0, f32::NAN)] {
            let inputs = [
                &HostData::F32(x.clone()),
                &HostData::F32(vec![a]),
                &HostData::F32(vec![b]),
            ];
            let want = member_by_member(&kernel, &inputs, n);
            let got = eval(&kernel, &inputs, &[&[n], &[1], &[1]], &[n]).unwrap();
            assert_eq!(
                got.to_f64_vec()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>(),
                want.to_f64_vec()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>(),
                "k = {a}, {b}"
            );
        }
    }

    #[test]
    fn full_size_operands_of_an_epilogue_take_the_unfolded_program() {
        let n = TILE + 3;
        let x: Vec<f32> = (0..n).map(|i| i as f32 * 1e-3 - 0.5).collect();
        let k: Vec<f32> = (0..n).map(|i| 1.0 + i as f32 * 1e-4).collect();
        let kernel = anchor_chain(2);
        let inputs = [
            &HostData::F32(x),
            &HostData::F32(k),
            &HostData::F32(vec![0.125]),
        ];
        let want = member_by_member(&kernel, &inputs, n);
        let got = eval(&kernel, &inputs, &[&[n], &[n], &[1]], &[n]).unwrap();
        assert_eq!(got, want);
    }

    #[test]
    fn runs_without_a_producer_start_an_affine_step_and_subtraction_folds() {
        // ((in0 − k) · k2 ... : x − k has no step before it to join, so it
        // starts an affine step; x·k2 cannot follow an addition, so it
        // starts another, which the final + k joins; the max ends the run.
        let steps = vec![
            binary(BinaryOp::Sub, FusedArg::Input(0), FusedArg::Input(1)),
            binary(BinaryOp::Mul, FusedArg::Input(2), FusedArg::Step(0)),
            binary(BinaryOp::Add, FusedArg::Step(1), FusedArg::Input(1)),
            binary(BinaryOp::Maximum, FusedArg::Step(2), FusedArg::Input(2)),
        ];
        let kernel = FusedKernel::new(steps, 3).unwrap();
        let folded = kernel.folded.as_ref().expect("folds");
        assert_eq!(folded.steps.len(), 3);
        assert!(matches!(
            folded.steps[0],
            TileStep::Affine(
                TileSource::Input(0),
                Epilogue {
                    mul: None,
                    add: Some((1, true))
                },
                _
            )
        ));
        assert!(matches!(
            folded.steps[1],
            TileStep::Affine(
                TileSource::Register(_),
                Epilogue {
                    mul: Some(2),
                    add: Some((1, false))
                },
                _
            )
        ));
        let n = 300;
        let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.01 - 1.5).collect();
        let inputs = [
            &HostData::F32(x),
            &HostData::F32(vec![0.3]),
            &HostData::F32(vec![-0.7]),
        ];
        let want = member_by_member(&kernel, &inputs, n);
        assert_eq!(
            eval(&kernel, &inputs, &[&[n], &[1], &[1]], &[n]).unwrap(),
            want
        );
    }

    #[test]
    fn a_value_read_twice_is_not_folded_away() {
        // t = exp(x); (t · k) + t: t has two readers, so the product
        // cannot join its step, and nothing else folds.
        let steps = vec![
            unary(UnaryOp::Exp, FusedArg::Input(0)),
            binary(BinaryOp::Mul, FusedArg::Step(0), FusedArg::Input(1)),
            binary(BinaryOp::Add, FusedArg::Step(1), FusedArg::Step(0)),
        ];
        let kernel = FusedKernel::new(steps, 2).unwrap();
        assert_eq!(kernel.folded, None);
        let n = 50;
        let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.05).collect();
        let inputs = [&HostData::F32(x), &HostData::F32(vec![3.0])];
        let want = member_by_member(&kernel, &inputs, n);
        assert_eq!(eval(&kernel, &inputs, &[&[n], &[1]], &[n]).unwrap(), want);
    }

    #[test]
    fn shape_rule_replays_member_rules_and_rejects_bad_operands() {
        let kernel = chain_kernel();
        let x = Aval::new([3, 4], crate::DType::F32);
        let k = Aval::new([4], crate::DType::F32);
        assert_eq!(
            shape_rule(&kernel, &[&x, &k], &mut ShapeCx::new()).unwrap(),
            x
        );
        let wrong = Aval::new([5], crate::DType::F32);
        let err = shape_rule(&kernel, &[&x, &wrong], &mut ShapeCx::new()).unwrap_err();
        assert!(err.to_string().contains("mul"), "{err}");
    }

    #[test]
    fn malformed_kernels_are_rejected() {
        let forward = vec![FusedStep {
            op: Op::Unary(UnaryOp::Exp),
            args: vec![FusedArg::Step(0)],
        }];
        assert!(FusedKernel::new(forward, 1).is_err());
        let reduce = vec![FusedStep {
            op: Op::Reduce {
                op: crate::ops::ReduceOp::Sum,
                axes: vec![0],
                keepdims: false,
            },
            args: vec![FusedArg::Input(0)],
        }];
        assert!(FusedKernel::new(reduce, 1).is_err());
        assert!(FusedKernel::new(Vec::new(), 0).is_err());
    }

    #[test]
    fn a_fused_group_has_no_jvp_or_batching_rule_and_the_errors_name_it() {
        use crate::compile::rule_checks as rules;
        use crate::handle::array::Array;
        use std::sync::Arc;
        let fused = Op::Fused(Arc::new(chain_kernel()));
        let x = rules::normal(55, &[3]);
        let result = crate::jvp(
            move |x: Array| Array::apply(fused.clone(), vec![x.clone(), x]),
            &x,
            &x,
        );
        rules::assert_err_names(result, "fused", "no jvp");
        let fused = Op::Fused(Arc::new(chain_kernel()));
        let xs = rules::normal(56, &[2, 3]);
        let result =
            crate::vmap(move |x: Array| Array::apply(fused.clone(), vec![x.clone(), x])).call(&xs);
        rules::assert_err_names(result, "fused", "no batching rule");
    }
}
