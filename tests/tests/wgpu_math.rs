//! wgpu's elementwise math is the CPU's (`kiln::ops::math`) on the default
//! adapter (lavapipe in CI): every float unary op and `pow` give the CPU
//! executor's results within the CPU function's documented ulp bound, and
//! special results (NaN, ±inf, ±0) bit for bit, on special values, on wide
//! ranges and on a sweep of f32 bit patterns; f16 and bf16 on every one of
//! their values within one ulp of their own. Subnormal results may flush to
//! zero as [`kiln_tests::conformance::may_flush`] says, and a subnormal
//! input may give the CPU's result on its flushed input (log of a
//! subnormal is then −inf), never a third value.
//!
//! The sweeps cover 256 × `KILN_CASES` (default 256) f32 bit patterns per
//! op; `KILN_CASES=16777216` covers every f32.

use kiln::{compile, with_default_device, Array, CpuBackend, DType, HostData};
use kiln_tests::conformance::{may_flush, run_on, Program};
use kiln_tests::programs::cases;
use std::sync::Arc;

/// Each float unary op with its documented bound in ulps (the CPU
/// function's: `kiln::ops::math`'s table; sqrt correctly rounded, rsqrt
/// 1 ulp, the rest exact).
const UNARY: [(&str, Program, f64); 12] = [
    ("exp", |a| vec![a[0].exp()], 1.0),
    ("log", |a| vec![a[0].log()], 1.0),
    ("sin", |a| vec![a[0].sin()], 1.0),
    ("cos", |a| vec![a[0].cos()], 1.0),
    ("tanh", |a| vec![a[0].tanh()], 2.0),
    ("sigmoid", |a| vec![a[0].sigmoid()], 3.0),
    ("erf", |a| vec![a[0].erf()], 2.0),
    ("sqrt", |a| vec![a[0].sqrt()], 0.5),
    ("rsqrt", |a| vec![a[0].rsqrt()], 1.0),
    ("relu", |a| vec![a[0].relu()], 0.0),
    ("neg", |a| vec![a[0].neg()], 0.0),
    ("abs", |a| vec![a[0].abs()], 0.0),
];

const POW_BOUND: f64 = 1.0;

/// The special values of f32: zeros, infinities, NaN, ±1, the extremes of
/// the normal range and subnormals.
const SPECIAL: [f32; 17] = [
    0.0,
    -0.0,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
    1.0,
    -1.0,
    f32::MAX,
    -f32::MAX,
    f32::MIN_POSITIVE,
    -f32::MIN_POSITIVE,
    1e-40,
    -1e-40,
    1e-45,
    -1e-45,
    0.5,
    -2.5,
];

/// How far `got` is from the CPU's `want`, in ulps of `want` (the
/// smallest subnormal below the normal range, the spacing of `dtype`'s
/// values otherwise): 0 for the same value, or a zero where [`may_flush`]
/// allows one; infinite where either is NaN, infinite or zero and they
/// differ in bits (every NaN alike), so special results must match
/// exactly, the sign of zero included.
fn ulps_apart(dtype: DType, got: f64, want: f64) -> f64 {
    if (got.is_nan() && want.is_nan()) || got.to_bits() == want.to_bits() {
        return 0.0;
    }
    if may_flush(dtype, got, want) {
        return 0.0;
    }
    let special = |v: f64| !v.is_finite() || v == 0.0;
    if special(got) || special(want) {
        return f64::INFINITY;
    }
    let (digits, smallest_normal) = match dtype {
        DType::F16 => (11, 2f64.powi(-14)),
        DType::BF16 => (8, f64::from(f32::MIN_POSITIVE)),
        _ => (24, f64::from(f32::MIN_POSITIVE)),
    };
    let magnitude = want.abs().max(smallest_normal);
    let unit = 2f64.powi(magnitude.log2().floor() as i32 + 1 - digits);
    (got - want).abs() / unit
}

/// `data` with every subnormal replaced by a zero of its sign: what a GPU
/// that flushes subnormal inputs computes with.
fn flushed(data: &HostData) -> HostData {
    let dtype = data.dtype();
    HostData::from_f64s(
        dtype,
        data.to_f64_vec().into_iter().map(|v| {
            if may_flush(dtype, 0.0, v) {
                0.0f64.copysign(v)
            } else {
                v
            }
        }),
    )
}

/// The CPU executor's outputs of `program` on rank-1 `inputs`, on them as
/// given and with subnormals flushed, and wgpu's (fusion off: one kernel
/// per op), as f64; `None` without an adapter.
struct Outputs {
    want: Vec<f64>,
    want_flushed: Vec<f64>,
    got: Vec<f64>,
}

fn cpu_and_wgpu(program: Program, inputs: &[HostData]) -> Option<Outputs> {
    let gpu = kiln_tests::gpu::backend()?;
    let arrays = |data: &[HostData]| -> Vec<Array> {
        data.iter()
            .map(|d| Array::from_data(d.clone(), &[d.len()]).expect("rank 1 fits its values"))
            .collect()
    };
    let values = |outputs: kiln::Result<Vec<Arc<HostData>>>| {
        outputs.unwrap_or_else(|e| panic!("{e}"))[0].to_f64_vec()
    };
    let flushed_inputs: Vec<HostData> = inputs.iter().map(flushed).collect();
    Some(Outputs {
        want: values(run_on(CpuBackend, program, &arrays(inputs), false)),
        want_flushed: values(run_on(CpuBackend, program, &arrays(&flushed_inputs), false)),
        got: values(run_on(gpu, program, &arrays(inputs), false)),
    })
}

/// The largest error over the elements, with its index: [`ulps_apart`]
/// from the CPU's result, or from its result on the flushed inputs where
/// that is nearer (a GPU may flush subnormal inputs).
fn worst(dtype: DType, outputs: &Outputs) -> (f64, usize) {
    let Outputs {
        want,
        want_flushed,
        got,
    } = outputs;
    assert_eq!(got.len(), want.len());
    largest((0..got.len()).map(|i| {
        ulps_apart(dtype, got[i], want[i]).min(ulps_apart(dtype, got[i], want_flushed[i]))
    }))
}

/// The largest of `errors` and its index (0 and 0 for none).
fn largest(errors: impl Iterator<Item = f64>) -> (f64, usize) {
    errors.enumerate().fold(
        (0.0, 0),
        |(err, at), (i, e)| if e > err { (e, i) } else { (err, at) },
    )
}

/// Asserts that unary `name` on wgpu stays within `bound` ulps of the CPU
/// on `xs` (of `dtype`), and returns the worst error.
fn check_unary(name: &str, program: Program, bound: f64, dtype: DType, xs: &[f32]) -> f64 {
    let input = HostData::from_f64s(dtype, xs.iter().map(|&x| f64::from(x)));
    let Some(outputs) = cpu_and_wgpu(program, std::slice::from_ref(&input)) else {
        return 0.0;
    };
    let (err, at) = worst(dtype, &outputs);
    let Outputs { want, got, .. } = outputs;
    assert!(
        err <= bound,
        "{name} {dtype}({:e}): wgpu {:e}, cpu {:e}: {err} ulp (bound {bound})",
        input.get_f64(at),
        got[at],
        want[at]
    );
    err
}

/// Asserts that `pow` on wgpu stays within [`POW_BOUND`] of the CPU on
/// every pair `(xs[i], ys[i])`, and returns the worst error.
fn check_pow(xs: &[f32], ys: &[f32]) -> f64 {
    let inputs = [HostData::F32(xs.to_vec()), HostData::F32(ys.to_vec())];
    let Some(outputs) = cpu_and_wgpu(|a| vec![a[0].pow(&a[1])], &inputs) else {
        return 0.0;
    };
    let (err, at) = worst(DType::F32, &outputs);
    let Outputs { want, got, .. } = outputs;
    assert!(
        err <= POW_BOUND,
        "pow({:e}, {:e}): wgpu {:e}, cpu {:e}: {err} ulp",
        xs[at],
        ys[at],
        got[at],
        want[at]
    );
    err
}

/// Every `stride`-th f32 bit pattern (both signs, every binade, the
/// special values among them), then a fine linear sweep of [−12, 12],
/// where the functions change fastest.
fn bit_pattern_sweep(stride: u32) -> Vec<f32> {
    let patterns = (0..=u32::MAX).step_by(stride as usize).map(f32::from_bits);
    let linear = (-24_000..=24_000).map(|i| i as f32 * 5e-4);
    patterns.chain(linear).collect()
}

/// The sweep's stride: 2^32 / (256 × `KILN_CASES`), at least 1.
fn sweep_stride() -> u32 {
    let points = 256 * u64::from(cases(256)).max(1);
    u32::try_from((1u64 << 32) / points)
        .unwrap_or(u32::MAX)
        .max(1)
}

#[test]
fn every_unary_op_gives_special_values_the_cpus_results() {
    for (name, program, bound) in UNARY {
        check_unary(name, program, bound, DType::F32, &SPECIAL);
    }
}

#[test]
fn erf_sin_tanh_and_sqrt_of_negative_zero_are_negative_zero() {
    let programs: [(&str, Program); 4] = [
        ("erf", |a| vec![a[0].erf()]),
        ("sin", |a| vec![a[0].sin()]),
        ("tanh", |a| vec![a[0].tanh()]),
        ("sqrt", |a| vec![a[0].sqrt()]),
    ];
    for (name, program) in programs {
        let Some(Outputs { got, .. }) = cpu_and_wgpu(program, &[HostData::F32(vec![-0.0])]) else {
            return;
        };
        assert_eq!(
            got[0].to_bits(),
            (-0f64).to_bits(),
            "{name}(-0) = {:e}",
            got[0]
        );
    }
}

#[test]
fn maximum_minimum_and_relu_order_signed_zeros_as_ieee_754_2019_on_wgpu() {
    // +0 > -0 whatever the operand order; NaN from either side propagates.
    let programs: [(&str, Program, [f64; 4]); 3] = [
        (
            "maximum",
            |a| vec![a[0].maximum(&a[1])],
            [0.0, 0.0, -0.0, 0.0],
        ),
        (
            "minimum",
            |a| vec![a[0].minimum(&a[1])],
            [-0.0, -0.0, -0.0, 0.0],
        ),
        ("relu", |a| vec![a[0].relu()], [0.0, 0.0, 0.0, 0.0]),
    ];
    let lhs = HostData::F32(vec![-0.0, 0.0, -0.0, 0.0]);
    let rhs = HostData::F32(vec![0.0, -0.0, -0.0, 0.0]);
    for (name, program, want) in programs {
        let Some(Outputs { want: cpu, got, .. }) =
            cpu_and_wgpu(program, &[lhs.clone(), rhs.clone()])
        else {
            return;
        };
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&cpu), bits(&want), "{name} on the CPU: {cpu:?}");
        assert_eq!(bits(&got), bits(&want), "{name} on wgpu: {got:?}");
    }
    let Some(Outputs { got, .. }) = cpu_and_wgpu(
        |a| vec![a[0].maximum(&a[1]), a[1].maximum(&a[0])],
        &[HostData::F32(vec![f32::NAN]), HostData::F32(vec![1.0])],
    ) else {
        return;
    };
    assert!(got[0].is_nan(), "maximum(NaN, 1) = {}", got[0]);
}

#[test]
fn sin_and_cos_of_huge_arguments_are_reduced_exactly() {
    let xs = [
        1e10,
        -1e10,
        1e20,
        3e38,
        -3e38,
        f32::MAX,
        1_048_577.0,
        12_345.679,
        1e5,
        7.0e7,
        // Near multiples of π/2, where the reduction cancels the most.
        std::f32::consts::FRAC_PI_2,
        std::f32::consts::PI,
        3.0 * std::f32::consts::FRAC_PI_2,
        1.0e22,
        8.865_734e37,
    ];
    for (name, program, bound) in &UNARY[2..4] {
        check_unary(name, *program, *bound, DType::F32, &xs);
    }
    let Some(Outputs { want, got, .. }) =
        cpu_and_wgpu(|a| vec![a[0].sin()], &[HostData::F32(vec![1e10])])
    else {
        return;
    };
    // Not the ±1 that WGSL's builtin, accurate on [−π, π] only, gives.
    assert!(
        (got[0] - want[0]).abs() < 1e-6 && got[0].abs() < 0.99,
        "{got:?}"
    );
}

#[test]
fn exp_log_and_pow_keep_their_bounds_at_the_ends_of_the_range() {
    let exp_xs = [88.72, 88.7, -87.3, -103.9, -104.5, 50.0, -50.0, 1e-8, -1e-8];
    check_unary("exp", UNARY[0].1, 1.0, DType::F32, &exp_xs);
    let log_xs = [1e-40, 1e-45, 3e-39, 1.000_000_1, 0.999_999_94, 3e38, 1e-30];
    check_unary("log", UNARY[1].1, 1.0, DType::F32, &log_xs);
    let xs = [
        0.999_999_9,
        1.000_000_1,
        1e-40,
        1e-40,
        10.0,
        0.5,
        2.0,
        1.5,
        1e-3,
    ];
    let ys = [1e8, -1e8, -1.0, 0.5, 38.0, 149.0, -149.0, 218.0, 12.5];
    check_pow(&xs, &ys);
    let Some(Outputs { want, got, .. }) = cpu_and_wgpu(
        |a| vec![a[0].pow(&a[1])],
        &[
            HostData::F32(vec![0.999_999_9, 1e-40]),
            HostData::F32(vec![1e8, -1.0]),
        ],
    ) else {
        return;
    };
    // e^(1e8·ln 0.99999988) = 6.6e-6, not the 3.3e-5 of exp2(y·log2 x) in f32.
    assert!(
        (want[0] - 6.65e-6).abs() < 1e-8 && (got[0] - want[0]).abs() < 1e-12,
        "{got:?}"
    );
    assert_eq!(got[1], f64::INFINITY);
}

#[test]
fn division_gives_the_cpus_correctly_rounded_quotients() {
    // WGSL allows `/` 2.5 ulp; Kiln's kernels correct it to the CPU's
    // quotient: every pair of special values, then a sweep of dividends
    // over divisors that reach overflow, underflow and subnormal quotients.
    let classes: Vec<f32> = SPECIAL
        .iter()
        .copied()
        .chain([3.0, -7.0, 0.1, 1e30, 1e-30])
        .collect();
    let divisors = [
        3.0,
        -7.0,
        0.1,
        1.3,
        1.000_000_1,
        1e-38,
        3e38,
        1e-40,
        f32::MIN_POSITIVE,
    ];
    let dividends = bit_pattern_sweep(sweep_stride().saturating_mul(16));
    let pairs = classes
        .iter()
        .flat_map(|&x| classes.iter().map(move |&y| (x, y)))
        .chain(
            dividends
                .iter()
                .flat_map(|&x| divisors.iter().map(move |&y| (x, y))),
        );
    let (xs, ys): (Vec<f32>, Vec<f32>) = pairs.unzip();
    let inputs = [HostData::F32(xs.clone()), HostData::F32(ys.clone())];
    let Some(outputs) = cpu_and_wgpu(|a| vec![&a[0] / &a[1]], &inputs) else {
        return;
    };
    let (err, at) = worst(DType::F32, &outputs);
    assert!(
        err == 0.0,
        "{:e} / {:e}: wgpu {:e}, cpu {:e}: {err} ulp",
        xs[at],
        ys[at],
        outputs.got[at],
        outputs.want[at]
    );
}

#[test]
fn pow_gives_the_cpus_results_on_every_pair_of_special_values() {
    let classes: Vec<f32> = SPECIAL
        .iter()
        .copied()
        .chain([2.0, -2.0, 3.0, -3.0, 0.25, 1e10, -1e10])
        .collect();
    let (xs, ys): (Vec<f32>, Vec<f32>) = classes
        .iter()
        .flat_map(|&x| classes.iter().map(move |&y| (x, y)))
        .unzip();
    check_pow(&xs, &ys);
}

#[test]
fn every_unary_op_stays_within_its_bound_of_the_cpu_on_a_sweep_of_f32() {
    let xs = bit_pattern_sweep(sweep_stride());
    for (name, program, bound) in UNARY {
        let err = check_unary(name, program, bound, DType::F32, &xs);
        eprintln!(
            "{name}: worst {err:.3} ulp against the CPU over {} inputs",
            xs.len()
        );
    }
}

#[test]
fn pow_stays_within_its_bound_of_the_cpu_on_a_grid() {
    let stride = sweep_stride().saturating_mul(64);
    let bases: Vec<f32> = bit_pattern_sweep(stride)
        .into_iter()
        .filter(|x| *x > 0.0)
        .step_by(8)
        .collect();
    let exponents: Vec<f32> = (-120..=120)
        .map(|i| i as f32 * 0.37)
        .chain([0.5, -0.5, 2.0, 3.0, -1.0, 1e-3, 7e5, 1e8, -3e7])
        .collect();
    let (xs, ys): (Vec<f32>, Vec<f32>) = bases
        .iter()
        .flat_map(|&x| exponents.iter().map(move |&y| (x, y)))
        .unzip();
    let err = check_pow(&xs, &ys);
    eprintln!(
        "pow: worst {err:.3} ulp against the CPU over {} pairs",
        xs.len()
    );
    // Negative bases with integer exponents keep the sign of odd ones.
    let negative: Vec<f32> = bases.iter().map(|x| -x).collect();
    let integers: Vec<f32> = (0..negative.len())
        .map(|i| (i % 41) as f32 - 20.0)
        .collect();
    check_pow(&negative, &integers);
}

#[test]
fn every_unary_op_on_every_f16_and_bf16_value_is_within_one_of_their_ulps() {
    for dtype in [DType::F16, DType::BF16] {
        let xs: Vec<f32> = (0..=u16::MAX)
            .map(|bits| match dtype {
                DType::F16 => half::f16::from_bits(bits).to_f32(),
                _ => half::bf16::from_bits(bits).to_f32(),
            })
            .collect();
        for (name, program, _) in UNARY {
            check_unary(name, program, 1.0, dtype, &xs);
        }
    }
}

#[test]
fn f32_values_rounded_to_f16_and_bf16_inside_a_fused_kernel_are_the_cpus_bits() {
    // Fused, the narrow value never reaches memory: the kernel rounds it
    // in registers (round_f16, round_bf16), which must match the CPU's
    // conversion bit for bit over the whole f32 range: ties, the f16
    // subnormal quantum, overflow from 65520, NaN.
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let mut xs = bit_pattern_sweep(sweep_stride());
    xs.extend([
        65504.0,
        65519.99,
        65520.0,
        -65520.0,
        2.980_232_2e-8,
        2.980_233e-8,
        5.960_464_5e-8,
    ]);
    xs.extend(SPECIAL);
    let inputs = [Array::from_vec(xs.clone(), &[xs.len()]).expect("rank 1")];
    for dtype in [DType::F16, DType::BF16] {
        let program: Program = match dtype {
            DType::F16 => |a| vec![a[0].cast(DType::F16).cast(DType::F32) * 1.0],
            _ => |a| vec![a[0].cast(DType::BF16).cast(DType::F32) * 1.0],
        };
        let values = |outputs: kiln::Result<Vec<Arc<HostData>>>| {
            outputs.unwrap_or_else(|e| panic!("{e}"))[0].to_f64_vec()
        };
        let want = values(run_on(CpuBackend, program, &inputs, true));
        let got = values(run_on(gpu.clone(), program, &inputs, true));
        let flushed: Vec<f32> = xs
            .iter()
            .map(|&x| if x.is_subnormal() { 0.0 } else { x })
            .collect();
        let flushed_inputs = [Array::from_vec(flushed, &[xs.len()]).expect("rank 1")];
        let want_flushed = values(run_on(CpuBackend, program, &flushed_inputs, true));
        for i in 0..xs.len() {
            let same = |w: f64| w.to_bits() == got[i].to_bits() || (w.is_nan() && got[i].is_nan());
            assert!(
                same(want[i]) || same(want_flushed[i]) || may_flush(dtype, got[i], want[i]),
                "{dtype}({:e}): wgpu {:e}, cpu {:e}",
                xs[i],
                got[i],
                want[i]
            );
        }
    }
}

/// Transcendental ops of constants, so compiling folds them on the CPU;
/// with `flushed`, the subnormal constant is the zero a GPU that flushes
/// subnormals reads instead.
fn constant_program(flushed: bool) -> Vec<Array> {
    let subnormal = if flushed { 0.0 } else { 1e-40 };
    let x = Array::from_vec(
        vec![1e10f32, -3e38, 0.5, 88.0, -0.0, subnormal, 2.5, -7.25],
        &[8],
    )
    .expect("8 values");
    vec![
        x.sin(),
        x.cos(),
        x.exp(),
        x.abs().log(),
        x.tanh(),
        x.sigmoid(),
        x.erf(),
        x.abs().pow(0.75),
    ]
}

#[test]
fn a_constant_program_gives_the_same_values_compiled_and_eager_on_wgpu() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let compiled = compile(|_: Vec<Array>| constant_program(false)).with_backend(gpu.clone());
    let folded = compiled.call(&Vec::new()).unwrap_or_else(|e| panic!("{e}"));
    let folded_flushed = compile(|_: Vec<Array>| constant_program(true))
        .with_backend(gpu.clone())
        .call(&Vec::new())
        .unwrap_or_else(|e| panic!("{e}"));
    let eager = with_default_device(Arc::new(gpu), || {
        let outputs = constant_program(false);
        outputs
            .iter()
            .for_each(|y| y.eval().unwrap_or_else(|e| panic!("{e}")));
        outputs
    });
    // The outputs' documented bounds, in order.
    let bounds = [1.0, 1.0, 1.0, 1.0, 2.0, 3.0, 2.0, POW_BOUND];
    let values = |a: &Array| a.data().unwrap_or_else(|e| panic!("{e}")).to_f64_vec();
    for (k, bound) in bounds.into_iter().enumerate() {
        let (f, flushed, e) = (
            values(&folded[k]),
            values(&folded_flushed[k]),
            values(&eager[k]),
        );
        // A GPU that flushes the subnormal constant computes the flushed
        // program eagerly; folding on the CPU keeps it.
        let (err, at) = largest((0..f.len()).map(|i| {
            ulps_apart(DType::F32, e[i], f[i]).min(ulps_apart(DType::F32, e[i], flushed[i]))
        }));
        assert!(
            err <= bound,
            "output {k} element {at}: eager {:e}, compiled {:e}",
            e[at],
            f[at]
        );
    }
}
