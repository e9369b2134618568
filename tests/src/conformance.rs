//! Conformance harness: run one function through any [`Backend`] and compare
//! its outputs with the CPU executor's under per-dtype tolerances.

use kiln::{compile, Array, Backend, CpuBackend, DType, HostData};
use std::sync::Arc;

/// The values of `data` for bit-exact comparison: its dtype and each
/// element's f64 bits, every NaN alike (their payloads may differ).
pub fn bits(data: &HostData) -> (DType, Vec<u64>) {
    (
        data.dtype(),
        data.to_f64_vec()
            .into_iter()
            .map(|v| if v.is_nan() { u64::MAX } else { v.to_bits() })
            .collect(),
    )
}

/// A function of arrays to arrays, as the suites write their cases.
pub type Program = fn(&[Array]) -> Vec<Array>;

/// The outputs of `program` on `inputs`, compiled for `backend` (fusion on
/// or off).
pub fn run_on<B: Backend>(
    backend: B,
    program: Program,
    inputs: &[Array],
    fusion: bool,
) -> kiln::Result<Vec<Arc<HostData>>> {
    let compiled = compile(move |xs: Vec<Array>| program(&xs))
        .fusion(fusion)
        .with_backend(backend);
    let outputs = compiled.call(&inputs.to_vec())?;
    outputs.iter().map(Array::data).collect()
}

/// How a backend's outputs must match the CPU executor's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Within the [`tolerance`] of the dtype: for cases whose results depend
    /// on summation order (matmuls, reductions, fused chains) or on a
    /// transcendental function's documented ulp bound (the WGSL library
    /// computes the CPU's algorithms within it; `tests/wgpu_math.rs` holds
    /// every op to that bound exactly).
    Tolerance,
    /// Bit for bit, every NaN alike, signed zeros told apart: for cases
    /// whose results every backend must round exactly as the reference
    /// (casts, scalar constants, special values), except where
    /// [`may_flush`] allows a zero.
    Exact,
}

/// The subnormal rule: `got` may be a zero (of either sign) where the
/// reference gives `want`, a nonzero below the smallest normal of `dtype`
/// (2^-126 for f32 and for bf16, which shares f32's exponent range; 2^-14
/// for f16). WGSL lets an implementation flush subnormal inputs,
/// intermediates and results to zero, so a subnormal result, or one from a
/// subnormal input, may come back as zero. The CPU executor never flushes
/// (Rust's f32 arithmetic keeps subnormals) and lavapipe keeps them too;
/// the rule is for GPUs that flush. Cases with subnormals choose programs
/// where flushing any subnormal along the way flushes the output.
pub fn may_flush(dtype: DType, got: f64, want: f64) -> bool {
    let smallest_normal = match dtype {
        DType::F16 => 2f64.powi(-14),
        DType::F32 | DType::BF16 => f64::from(f32::MIN_POSITIVE),
        _ => return false,
    };
    got == 0.0 && want != 0.0 && want.abs() < smallest_normal
}

/// Absolute and relative tolerance of a dtype: f32 results may differ by
/// summation order and by the ulp bounds of transcendental functions,
/// f16/bf16 by a rounding of their own precision, everything else must be
/// exact.
pub fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (1e-5, 1e-4),
        DType::F16 => (2e-3, 4e-3),
        DType::BF16 => (1.6e-2, 1.6e-2),
        _ => (0.0, 0.0),
    }
}

/// `Err` describing the first element where `got` and `want` differ beyond
/// the tolerance of their dtype (NaN matches NaN, infinities match exactly).
pub fn compare(got: &HostData, want: &HostData) -> Result<(), String> {
    let (atol, rtol) = tolerance(want.dtype());
    compare_within(got, want, atol, rtol)
}

/// `Err` describing the first element where `got` and `want` differ under
/// `rule`; dtypes and lengths must agree.
pub fn compare_by(got: &HostData, want: &HostData, rule: Rule) -> Result<(), String> {
    match rule {
        Rule::Tolerance => compare(got, want),
        Rule::Exact => compare_within(got, want, 0.0, 0.0),
    }
}

/// `Err` describing the first element where `got` and `want` differ by
/// more than `atol + rtol·|want|` (NaN matches NaN, infinities match
/// exactly, and a zero matches a subnormal as [`may_flush`] says); dtypes
/// and lengths must agree. With both tolerances zero, equal values must
/// also agree in the sign of zero.
pub fn compare_within(got: &HostData, want: &HostData, atol: f64, rtol: f64) -> Result<(), String> {
    if got.dtype() != want.dtype() || got.len() != want.len() {
        return Err(format!(
            "got {}[{}], want {}[{}]",
            got.dtype(),
            got.len(),
            want.dtype(),
            want.len()
        ));
    }
    let exact = atol == 0.0 && rtol == 0.0;
    for i in 0..want.len() {
        let (g, w) = (got.get_f64(i), want.get_f64(i));
        let equal = if exact {
            g.to_bits() == w.to_bits()
        } else {
            g == w
        };
        let same = (g.is_nan() && w.is_nan())
            || equal
            || may_flush(want.dtype(), g, w)
            || (!exact && g.is_finite() && w.is_finite() && (g - w).abs() <= atol + rtol * w.abs());
        if !same {
            return Err(format!("element {i}: got {g:e}, want {w:e}"));
        }
    }
    Ok(())
}

/// Runs `program` on the CPU executor and on `backend` and compares every
/// output under the dtype tolerances; `Err` names the output and the first
/// differing element.
pub fn check_against_cpu<B: Backend>(
    backend: B,
    program: Program,
    inputs: &[Array],
    fusion: bool,
) -> Result<(), String> {
    check_case(backend, program, inputs, fusion, Rule::Tolerance, None)
}

/// Runs `program` on the CPU executor and on `backend`, compares every
/// output under `rule`, and, given `expected` outputs, first checks the
/// CPU executor's against them under the same rule; `Err` says which
/// differed and where.
pub fn check_case<B: Backend>(
    backend: B,
    program: Program,
    inputs: &[Array],
    fusion: bool,
    rule: Rule,
    expected: Option<&[HostData]>,
) -> Result<(), String> {
    let want = run_on(CpuBackend, program, inputs, fusion).map_err(|e| format!("cpu: {e}"))?;
    if let Some(expected) = expected {
        compare_outputs(&want, expected, rule).map_err(|e| format!("cpu against expected: {e}"))?;
    }
    let got = run_on(backend, program, inputs, fusion).map_err(|e| format!("backend: {e}"))?;
    let want: Vec<HostData> = want.iter().map(|w| (**w).clone()).collect();
    compare_outputs(&got, &want, rule)
}

fn compare_outputs(got: &[Arc<HostData>], want: &[HostData], rule: Rule) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} outputs, want {}", got.len(), want.len()));
    }
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        compare_by(g, w, rule).map_err(|e| format!("output {k}: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subnormal_rule_lets_a_zero_stand_for_a_subnormal_only() {
        let subnormal = f64::from(f32::MIN_POSITIVE) / 4.0;
        let want = HostData::F32(vec![subnormal as f32, -(subnormal as f32), 1.0]);
        let flushed = HostData::F32(vec![0.0, -0.0, 1.0]);
        assert_eq!(compare_by(&flushed, &want, Rule::Exact), Ok(()));
        let normal = HostData::F32(vec![f32::MIN_POSITIVE, 1.0]);
        let zeroed = HostData::F32(vec![0.0, 1.0]);
        assert!(compare_by(&zeroed, &normal, Rule::Exact).is_err());
        // f16 subnormals lie below 2^-14, far above f32's.
        let f16_want = HostData::from_f64s(DType::F16, [2f64.powi(-20)].into_iter());
        let f16_zero = HostData::from_f64s(DType::F16, [0.0].into_iter());
        assert_eq!(compare_by(&f16_zero, &f16_want, Rule::Exact), Ok(()));
    }

    #[test]
    fn the_exact_rule_tells_signed_zeros_apart_and_nans_alike() {
        let want = HostData::F32(vec![-0.0, f32::NAN]);
        let got = HostData::F32(vec![0.0, -f32::NAN]);
        assert!(compare_by(&got, &want, Rule::Exact).is_err());
        assert_eq!(compare_by(&got, &want, Rule::Tolerance), Ok(()));
        let same = HostData::F32(vec![-0.0, -f32::NAN]);
        assert_eq!(compare_by(&same, &want, Rule::Exact), Ok(()));
    }

    #[test]
    fn the_exact_rule_rejects_one_ulp() {
        let want = HostData::F32(vec![1.0]);
        let got = HostData::F32(vec![1.0 + f32::EPSILON]);
        assert!(compare_by(&got, &want, Rule::Exact).is_err());
        assert_eq!(compare_by(&got, &want, Rule::Tolerance), Ok(()));
    }
}
