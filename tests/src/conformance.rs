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

/// Absolute and relative tolerance of a dtype: f32 results may differ by a
/// few ulps of transcendental functions, f16/bf16 by a rounding of their
/// own precision, everything else must be exact.
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

/// `Err` describing the first element where `got` and `want` differ by
/// more than `atol + rtol·|want|` (NaN matches NaN, infinities match
/// exactly); dtypes and lengths must agree.
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
    for i in 0..want.len() {
        let (g, w) = (got.get_f64(i), want.get_f64(i));
        let same = (g.is_nan() && w.is_nan())
            || g == w
            || (g.is_finite() && w.is_finite() && (g - w).abs() <= atol + rtol * w.abs());
        if !same {
            return Err(format!("element {i}: got {g}, want {w}"));
        }
    }
    Ok(())
}

/// Runs `program` on the CPU executor and on `backend` and compares every
/// output; `Err` names the output and the first differing element.
pub fn check_against_cpu<B: Backend>(
    backend: B,
    program: Program,
    inputs: &[Array],
    fusion: bool,
) -> Result<(), String> {
    let want = run_on(CpuBackend, program, inputs, fusion).map_err(|e| format!("cpu: {e}"))?;
    let got = run_on(backend, program, inputs, fusion).map_err(|e| format!("backend: {e}"))?;
    if got.len() != want.len() {
        return Err(format!("{} outputs, want {}", got.len(), want.len()));
    }
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        compare(g, w).map_err(|e| format!("output {k}: {e}"))?;
    }
    Ok(())
}
