//! Fused elementwise groups: one op standing for a tree of elementwise ops
//! whose intermediate values never leave the group.
//!
//! Evaluation replays the members' own evaluation, so a fused group gives
//! the same bits as its members run one by one. Groups of f32 arithmetic on
//! full-size or scalar operands take a tiled path instead: each member runs
//! over a cache-sized tile, and intermediates live in a few reused tile
//! registers rather than whole arrays.

use super::binary::{float_zip_into, Lane};
use super::strided::numel;
use super::unary::float_map_into;
use super::{BinaryOp, Op, ShapeCx, UnaryOp};
use crate::data::HostData;
use crate::error::{Error, Result};
use crate::shape::Aval;
use smallvec::SmallVec;
use std::cell::RefCell;

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

/// One step of the tiled program: the op, its operands, and the register it
/// writes (`None`: the output).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum TileStep {
    Unary(UnaryOp, TileSource, Option<usize>),
    Binary(BinaryOp, TileSource, TileSource, Option<usize>),
}

/// A fused group: its steps in order; the last step's value is the result.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FusedKernel {
    steps: Vec<FusedStep>,
    num_inputs: usize,
    num_registers: usize,
    /// Steps after which a step's value is dead, for the replay path.
    last_use: Vec<usize>,
    /// The steps as a tiled program, when every step is f32-capable
    /// arithmetic (no comparison, select or cast).
    program: Option<Vec<TileStep>>,
}

impl FusedKernel {
    /// A kernel over `num_inputs` external operands. Steps may only read
    /// inputs and earlier steps; the last step is the result.
    pub fn new(steps: Vec<FusedStep>, num_inputs: usize) -> Result<FusedKernel> {
        let bad = |detail: String| Error::InvalidArgument {
            op: "fused".into(),
            detail,
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
        // Allocate the destination before freeing the operands, so a step
        // never writes the register it reads.
        let mut registers = Vec::with_capacity(steps.len());
        let mut free = Vec::new();
        let mut num_registers = 0;
        for (i, step) in steps.iter().enumerate() {
            let reg = free.pop().unwrap_or_else(|| {
                num_registers += 1;
                num_registers - 1
            });
            registers.push(reg);
            for arg in &step.args {
                if let FusedArg::Step(j) = *arg {
                    if last_use[j] == i && !free.contains(&registers[j]) {
                        free.push(registers[j]);
                    }
                }
            }
        }
        let last = steps.len() - 1;
        let source = |arg: &FusedArg| match *arg {
            FusedArg::Input(k) => TileSource::Input(k),
            FusedArg::Step(j) => TileSource::Register(registers[j]),
        };
        let program = steps
            .iter()
            .enumerate()
            .map(|(i, step)| {
                let dst = (i != last).then_some(registers[i]);
                match (&step.op, step.args.as_slice()) {
                    (Op::Unary(u), [a]) => Some(TileStep::Unary(*u, source(a), dst)),
                    (Op::Binary(b), [a, c]) if !b.is_comparison() => {
                        Some(TileStep::Binary(*b, source(a), source(c), dst))
                    }
                    _ => None,
                }
            })
            .collect::<Option<Vec<_>>>();
        Ok(FusedKernel {
            steps,
            num_inputs,
            num_registers,
            last_use,
            program,
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
        });
    }
    let mut avals: Vec<Aval> = Vec::with_capacity(kernel.steps.len());
    for step in &kernel.steps {
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
    Ok(avals.pop().expect("a kernel has at least one step"))
}

/// Evaluates the group; every member's output has `out_shape`.
pub fn eval(
    kernel: &FusedKernel,
    inputs: &[&HostData],
    in_shapes: &[&[usize]],
    out_shape: &[usize],
) -> Result<HostData> {
    if let Some(out) = eval_tiled_f32(kernel, inputs, out_shape) {
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
    /// The output buffer itself, which the group writes in place.
    Aliased,
}

/// Evaluates the group into `target`, the buffer of the external operand
/// at each position where `inputs` holds `None` (it has the output's shape
/// and dtype). Returns `false`, touching nothing, when the group does not
/// take the tiled f32 path; the caller then evaluates and copies.
pub fn eval_in_place(
    kernel: &FusedKernel,
    inputs: &[Option<&HostData>],
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
    for input in inputs {
        sources.push(match input {
            None => Source::Aliased,
            Some(HostData::F32(v)) if v.len() == n => Source::Full(v),
            Some(HostData::F32(v)) if v.len() == 1 => Source::Scalar(v[0]),
            Some(_) => return false,
        });
    }
    run_split(kernel, &sources, out);
    true
}

/// The tiled path, when every step is f32 arithmetic and every operand is
/// f32 with one element per output element or a single element.
fn eval_tiled_f32(
    kernel: &FusedKernel,
    inputs: &[&HostData],
    out_shape: &[usize],
) -> Option<HostData> {
    kernel.program.as_ref()?;
    let n = numel(out_shape);
    let mut sources: SmallVec<[Source<'_>; 8]> = SmallVec::with_capacity(inputs.len());
    for data in inputs {
        sources.push(match data {
            HostData::F32(v) if v.len() == n => Source::Full(v),
            HostData::F32(v) if v.len() == 1 => Source::Scalar(v[0]),
            _ => return None,
        });
    }
    let mut out = vec![0f32; n];
    run_split(kernel, &sources, &mut out);
    Some(HostData::F32(out))
}

/// Runs the tiles, split across the machine's cores when the group is big
/// enough (tiles are independent, so the result is the same). wasm32 runs on
/// one thread.
fn run_split(kernel: &FusedKernel, sources: &[Source<'_>], out: &mut [f32]) {
    #[cfg(not(target_arch = "wasm32"))]
    {
        /// Element-ops (elements × steps) below which splitting the output
        /// across threads costs more in spawning than it saves.
        const PARALLEL_MIN_WORK: usize = 1 << 20;
        static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let cores =
            *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let n = out.len();
        if cores > 1 && n >= 2 * TILE && n.saturating_mul(kernel.steps.len()) >= PARALLEL_MIN_WORK {
            let per_thread = n.div_ceil(cores).div_ceil(TILE) * TILE;
            std::thread::scope(|scope| {
                for (k, chunk) in out.chunks_mut(per_thread).enumerate() {
                    scope.spawn(move || run_tiles(kernel, sources, chunk, k * per_thread));
                }
            });
            return;
        }
    }
    run_tiles(kernel, sources, out, 0);
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

/// Runs the kernel over `out`, which holds output elements from `offset`
/// on, tile by tile; on x86_64 with AVX2, through a
/// copy of the loop compiled for AVX2 (twice the lanes of the SSE2
/// baseline). Neither build contracts into FMA, so both give the same bits.
fn run_tiles(kernel: &FusedKernel, sources: &[Source<'_>], out: &mut [f32], offset: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        fn run_tiles_avx2(
            kernel: &FusedKernel,
            sources: &[Source<'_>],
            out: &mut [f32],
            offset: usize,
        ) {
            run_tiles_portable(kernel, sources, out, offset);
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            unsafe { run_tiles_avx2(kernel, sources, out, offset) };
            return;
        }
    }
    run_tiles_portable(kernel, sources, out, offset);
}

#[inline(always)]
fn run_tiles_portable(
    kernel: &FusedKernel,
    sources: &[Source<'_>],
    out: &mut [f32],
    offset: usize,
) {
    let Some(program) = kernel.program.as_deref() else {
        return;
    };
    let n = out.len();
    let tile = TILE.min(n.max(1));
    // An aliased operand is copied tile by tile into one extra register
    // before the tile's steps run, since the last step overwrites it.
    let aliased = sources.iter().any(|s| matches!(s, Source::Aliased));
    let alias_register = kernel.num_registers;
    let mut registers = take_registers((kernel.num_registers + usize::from(aliased)) * tile);
    for start in (0..n).step_by(tile) {
        let len = tile.min(n - start);
        if aliased {
            let at = alias_register * tile;
            registers[at..at + len].copy_from_slice(&out[start..start + len]);
        }
        for step in program {
            let dst_register = match *step {
                TileStep::Unary(_, _, dst) | TileStep::Binary(_, _, _, dst) => dst,
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
                    Source::Aliased => register(alias_register),
                },
                TileSource::Register(r) => register(r),
            };
            match *step {
                TileStep::Unary(u, a, _) => match lane(a) {
                    Lane::Run(src) => float_map_into(u, src, dst),
                    Lane::Splat(x) => {
                        let mut one = [0f32];
                        float_map_into(u, &[x], &mut one);
                        dst.fill(one[0]);
                    }
                },
                TileStep::Binary(b, a, c, _) => float_zip_into(b, lane(a), lane(c), dst),
            }
        }
    }
    return_registers(registers);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::unary::exp_f32;
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
        let tiled = eval_tiled_f32(&kernel, &inputs, &[n]).unwrap();
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
        let got = eval_tiled_f32(&kernel, &inputs, &[n]).unwrap();
        let expected: Vec<f32> = x.iter().map(|&v| exp_f32(v) * -0.75 + v).collect();
        assert_eq!(got, HostData::F32(expected));
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
        assert_eq!(kernel.num_registers, 2);
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
}
