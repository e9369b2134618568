//! Conformance of the quantization ops, generic over [`Backend`]:
//! `quantized_matmul` and `gather_qmm` on each backend against dequantize →
//! gather → matmul on the CPU executor, for every format and bit width,
//! with non-contiguous operands, an inner dimension that is no multiple of
//! a kernel block or of the group, sorted and broadcast indices, more than
//! 32,768 rows, and shapeless compiles over varying row and batch counts;
//! `dequantize` and `quantize` on each backend against the CPU executor
//! (quantize by its round-trip bound, since a device may divide a few ulps
//! off and so pick a neighbouring code at a tie).

use kiln::{
    compile, dequantize, gather_qmm, quantize, quantized_matmul, Array, Backend, CpuBackend, DType,
    HostData, QuantFormat, Quantized,
};
use kiln_tests::conformance::{compare_within, tolerance};
use std::sync::Arc;

const FORMATS: [QuantFormat; 8] = [
    QuantFormat::Affine {
        bits: 2,
        group_size: 32,
    },
    QuantFormat::Affine {
        bits: 3,
        group_size: 32,
    },
    QuantFormat::Affine {
        bits: 4,
        group_size: 64,
    },
    QuantFormat::Affine {
        bits: 5,
        group_size: 128,
    },
    QuantFormat::Affine {
        bits: 6,
        group_size: 32,
    },
    QuantFormat::Affine {
        bits: 8,
        group_size: 64,
    },
    QuantFormat::Nf4,
    QuantFormat::Int8,
];

/// Deterministic values in [-1, 1) of `shape` and `dtype`.
fn values(dtype: DType, shape: &[usize], seed: u64) -> Array {
    let n: usize = shape.iter().product();
    let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    let raw = (0..n).map(|_| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((state >> 33) % 2000) as f64 / 1000.0 - 1.0
    });
    Array::from_data(HostData::from_f64s(dtype, raw), shape).expect("shape fits")
}

/// The quantized parts of `w` (computed on the CPU) as plain arrays.
fn parts(w: &Array, format: QuantFormat) -> Vec<Array> {
    let q = quantize(w, format);
    let mut out = vec![q.packed, q.scales];
    out.extend(q.biases);
    for part in &out {
        part.eval().expect("quantizes");
    }
    out
}

/// The weight made of `xs[at..]`.
fn weight(xs: &[Array], at: usize, format: QuantFormat) -> Quantized {
    Quantized {
        packed: xs[at].clone(),
        scales: xs[at + 1].clone(),
        biases: format.has_biases().then(|| xs[at + 2].clone()),
        format,
    }
}

fn weight_len(format: QuantFormat) -> usize {
    2 + usize::from(format.has_biases())
}

/// Runs `f` compiled for `backend` (fusion on or off) and returns its
/// outputs' data.
fn run<B: Backend>(
    backend: B,
    f: impl Fn(&[Array]) -> Vec<Array> + 'static,
    inputs: &[Array],
    fusion: bool,
) -> Result<Vec<HostData>, String> {
    let compiled = compile(move |xs: Vec<Array>| f(&xs))
        .fusion(fusion)
        .with_backend(backend);
    let outputs = compiled.call(&inputs.to_vec()).map_err(|e| e.to_string())?;
    outputs
        .iter()
        .map(|a| a.data().map(|d| (*d).clone()).map_err(|e| e.to_string()))
        .collect()
}

/// `got` against `want` under the dtype's tolerance widened by the sum's
/// length `k`.
fn close(got: &[HostData], want: &[HostData], k: usize) -> Result<(), String> {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (atol, rtol) = tolerance(w.dtype());
        compare_within(g, w, atol * k as f64, rtol * 4.0)
            .map_err(|e| format!("output {i}: {e}"))?;
    }
    Ok(())
}

/// A case: the quantized program on the backend against the composition
/// on the CPU executor.
type Program = Arc<dyn Fn(&[Array]) -> Vec<Array> + Send + Sync>;

struct Case {
    name: String,
    quantized: Program,
    composed: Program,
    inputs: Vec<Array>,
    k: usize,
}

fn qmm_case(
    format: QuantFormat,
    dtype: DType,
    x_shape: &[usize],
    w_shape: &[usize],
    transpose: bool,
    seed: u64,
) -> Case {
    let w = values(dtype, w_shape, seed);
    let mut inputs = vec![values(dtype, x_shape, seed + 1)];
    inputs.extend(parts(&w, format));
    let k = *x_shape.last().expect("rank >= 2");
    Case {
        name: format!(
            "quantized_matmul {format} {dtype} x{x_shape:?} w{w_shape:?} transpose={transpose}"
        ),
        quantized: Arc::new(move |xs| {
            vec![quantized_matmul(&xs[0], &weight(xs, 1, format), transpose)]
        }),
        composed: Arc::new(move |xs| {
            let w = weight(xs, 1, format).dequantize();
            let w = if transpose { w.swap_axes(-1, -2) } else { w };
            vec![xs[0].matmul(&w)]
        }),
        inputs,
        k,
    }
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for format in FORMATS {
        // Groups of 32 make k = 96, no multiple of 64; int8 takes 36.
        let cols = match format.group_size() {
            Some(32) => 96,
            Some(g) => 2 * g,
            None => 36,
        };
        // Transposed: w [n, k], k = cols (a whole number of groups, but no
        // multiple of 4 rows or 64 invocations), 5 rows of x.
        cases.push(qmm_case(
            format,
            DType::F32,
            &[2, 5, cols],
            &[20, cols],
            true,
            1,
        ));
        // Rows enough for the tiled kernel (`QMM_TILED_MIN_ROWS` and more):
        // two blocks of 64 rows and two of 32 columns, the second of each
        // partial.
        cases.push(qmm_case(
            format,
            DType::F32,
            &[70, cols],
            &[40, cols],
            true,
            10,
        ));
        // Not transposed: w [k, n] with k = 37, no multiple of anything.
        cases.push(qmm_case(
            format,
            DType::F32,
            &[5, 37],
            &[37, cols],
            false,
            2,
        ));
        // Not transposed on the tiled kernel: 70 rows of x, k = 37.
        cases.push(qmm_case(
            format,
            DType::F32,
            &[70, 37],
            &[37, cols],
            false,
            13,
        ));
    }
    for dtype in [DType::F16, DType::BF16] {
        for format in [
            QuantFormat::affine(4, 32),
            QuantFormat::Nf4,
            QuantFormat::Int8,
        ] {
            cases.push(qmm_case(format, dtype, &[3, 64], &[9, 64], true, 3));
            cases.push(qmm_case(format, dtype, &[3, 7], &[7, 64], false, 4));
            cases.push(qmm_case(format, dtype, &[9, 64], &[33, 64], true, 11));
        }
    }
    // The tiled kernel over broadcast batch dims: x [2, 1, 9, k] against
    // w [3, n, k].
    cases.push(qmm_case(
        QuantFormat::affine(4, 32),
        DType::F32,
        &[2, 1, 9, 64],
        &[3, 6, 64],
        true,
        12,
    ));
    // Broadcast batch dims: x [2, 1, m, k] against w [3, n, k].
    cases.push(qmm_case(
        QuantFormat::affine(4, 32),
        DType::F32,
        &[2, 1, 3, 64],
        &[3, 6, 64],
        true,
        5,
    ));
    cases.push(qmm_case(
        QuantFormat::Nf4,
        DType::F32,
        &[3, 2, 10],
        &[1, 10, 64],
        false,
        6,
    ));
    // More than 32,768 rows of x (and of output).
    cases.push(qmm_case(
        QuantFormat::affine(4, 64),
        DType::F32,
        &[40_000, 64],
        &[6, 64],
        true,
        7,
    ));
    // Non-contiguous operands: x transposed, the weight's codes and scales
    // sliced every other row.
    {
        let format = QuantFormat::affine(4, 32);
        let w = values(DType::F32, &[16, 96], 8);
        let mut inputs = vec![values(DType::F32, &[96, 5], 9)];
        inputs.extend(parts(&w, format));
        let pick = move |xs: &[Array]| {
            let every_other = |a: &Array| a.slice_axis(0, 1, None, 2);
            Quantized {
                packed: every_other(&xs[1]),
                scales: every_other(&xs[2]),
                biases: Some(every_other(&xs[3])),
                format,
            }
        };
        cases.push(Case {
            name: "quantized_matmul of a transposed x and a row-sliced weight".into(),
            quantized: Arc::new(move |xs| {
                vec![quantized_matmul(&xs[0].transpose(), &pick(xs), true)]
            }),
            composed: Arc::new(move |xs| {
                vec![xs[0].transpose().matmul(&pick(xs).dequantize().transpose())]
            }),
            inputs,
            k: 96,
        });
    }
    // gather_qmm: sorted indices (as MoE routing gives them), and indices
    // broadcast against each other; with 9 rows of x on the tiled kernel.
    for (format, transpose, m) in [
        (QuantFormat::affine(4, 32), true, 1),
        (QuantFormat::Int8, false, 1),
        (QuantFormat::affine(6, 32), true, 1),
        (QuantFormat::affine(4, 32), true, 9),
        (QuantFormat::Int8, false, 9),
    ] {
        let (n, k) = (12, 64);
        let w_shape = if transpose { [4, n, k] } else { [4, k, n] };
        let w = values(DType::F32, &w_shape, 10);
        let mut inputs = vec![values(DType::F32, &[6, m, k], 11)];
        inputs.extend(parts(&w, format));
        inputs.push(Array::from_vec(vec![0u32, 1, 2, 3, 4, 5], &[6]).expect("6"));
        inputs.push(Array::from_vec(vec![0u32, 0, 1, 1, 3, 3], &[6]).expect("6"));
        inputs.push(Array::from_vec(vec![5i32, 2], &[2, 1]).expect("2"));
        inputs.push(Array::from_vec(vec![3i32, 0, 2], &[3]).expect("3"));
        let wl = weight_len(format);
        let gathered = move |xs: &[Array], w: &Array, lhs: &Array, rhs: &Array| {
            let x = xs[0].take(&lhs.reshape(&[-1]), 0);
            let w = w.take(&rhs.reshape(&[-1]), 0);
            let w = if transpose { w.swap_axes(-1, -2) } else { w };
            (x, w)
        };
        cases.push(Case {
            name: format!(
                "gather_qmm {format} transpose={transpose} m={m}, sorted and broadcast indices"
            ),
            quantized: Arc::new(move |xs| {
                let q = weight(xs, 1, format);
                let at = 1 + wl;
                vec![
                    gather_qmm(&xs[0], &q, &xs[at], &xs[at + 1], transpose),
                    gather_qmm(&xs[0], &q, &xs[at + 2], &xs[at + 3], transpose),
                ]
            }),
            composed: Arc::new(move |xs| {
                let w = weight(xs, 1, format).dequantize();
                let at = 1 + wl;
                let (x, wg) = gathered(xs, &w, &xs[at], &xs[at + 1]);
                let sorted = x.matmul(&wg);
                // Broadcast [2, 1] against [3]: expand both to [2, 3].
                let lhs = xs[at + 2].broadcast_to([2, 3]);
                let rhs = xs[at + 3].broadcast_to([2, 3]);
                let (x, wg) = gathered(xs, &w, &lhs, &rhs);
                let broadcast = x.matmul(&wg).reshape(&[2, 3, m as i64, -1]);
                vec![sorted, broadcast]
            }),
            inputs,
            k,
        });
    }
    cases
}

fn run_cases<B: Backend + Clone>(backend: &B) -> Result<usize, String> {
    let mut failures = Vec::new();
    let mut ran = 0;
    for case in cases() {
        for fusion in [true, false] {
            ran += 1;
            let (quantized, composed) = (case.quantized.clone(), case.composed.clone());
            let want = run(CpuBackend, move |xs| composed(xs), &case.inputs, fusion);
            let got = run(
                backend.clone(),
                move |xs| quantized(xs),
                &case.inputs,
                fusion,
            );
            let outcome = match (got, want) {
                (Ok(got), Ok(want)) => close(&got, &want, case.k),
                (Err(e), _) => Err(format!("backend: {e}")),
                (_, Err(e)) => Err(format!("reference: {e}")),
            };
            if let Err(e) = outcome {
                failures.push(format!("{} (fusion {fusion}): {e}", case.name));
            }
        }
    }
    if failures.is_empty() {
        Ok(ran)
    } else {
        Err(format!(
            "{} of {ran} runs failed:\n{}",
            failures.len(),
            failures.join("\n")
        ))
    }
}

#[test]
fn cpu_executor_matches_dequantize_then_matmul() {
    let ran = run_cases(&CpuBackend).unwrap_or_else(|e| panic!("{e}"));
    assert!(ran >= 60, "only {ran} runs");
}

#[test]
fn wgpu_matches_dequantize_then_matmul() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let ran = run_cases(&gpu).unwrap_or_else(|e| panic!("on {}: {e}", gpu.adapter()));
    assert!(ran >= 60, "only {ran} runs");
}

#[cfg(target_vendor = "apple")]
#[test]
fn metal_matches_dequantize_then_matmul_and_quantizes_every_format() {
    let Some(metal) = kiln_tests::gpu::metal() else {
        return;
    };
    let ran = run_cases(&metal).unwrap_or_else(|e| panic!("on {}: {e}", metal.name()));
    assert!(ran >= 60, "only {ran} runs");
    check_shapeless(metal.clone()).unwrap_or_else(|e| panic!("on {}: {e}", metal.name()));
}

/// `dequantize` on `backend` against the CPU executor, and `quantize` on
/// `backend` by its contract: scales (and biases) close to the CPU
/// executor's, and the dequantized result within half a scale (affine and
/// int8) or half the widest level gap (NF4) of the weight.
fn check_quantize_and_dequantize<B: Backend + Clone>(backend: &B) -> Result<usize, String> {
    let mut ran = 0;
    for format in FORMATS {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let cols = format.group_size().unwrap_or(64) * 2;
            let w = values(dtype, &[3, cols], 20);
            let parts = parts(&w, format);
            let deq = move |xs: &[Array]| vec![weight(xs, 0, format).dequantize()];
            let name = format!("{format} {dtype}");
            let want = run(CpuBackend, deq, &parts, true)?;
            let got =
                run(backend.clone(), deq, &parts, true).map_err(|e| format!("{name}: {e}"))?;
            close(&got, &want, 1).map_err(|e| format!("dequantize {name}: {e}"))?;
            let round_trip = move |xs: &[Array]| {
                let q = quantize(&xs[0], format);
                let mut out = vec![q.dequantize(), q.scales];
                out.extend(q.biases);
                out
            };
            let want = run(CpuBackend, round_trip, std::slice::from_ref(&w), true)?;
            let got = run(backend.clone(), round_trip, std::slice::from_ref(&w), true)
                .map_err(|e| format!("quantize {name}: {e}"))?;
            close(&got[1..], &want[1..], 1).map_err(|e| format!("quantize {name}: {e}"))?;
            let (w, back, scales) = (w.data().map_err(|e| e.to_string())?, &got[0], &got[1]);
            let group = format.group_size().unwrap_or(cols);
            let reach = match format {
                QuantFormat::Nf4 => 0.152,
                _ => 0.5,
            };
            let slack = tolerance(dtype).1 * 2.0;
            for i in 0..w.len() {
                let (v, d, s) = (w.get_f64(i), back.get_f64(i), scales.get_f64(i / group));
                if (v - d).abs() > s * reach * (1.0 + slack) + slack {
                    return Err(format!(
                        "quantize {name}: element {i}: {v} came back as {d} (scale {s})"
                    ));
                }
            }
            ran += 1;
        }
    }
    Ok(ran)
}

#[test]
fn cpu_executor_quantizes_and_dequantizes_every_format() {
    let ran = check_quantize_and_dequantize(&CpuBackend).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ran, 24);
}

#[test]
fn wgpu_quantizes_and_dequantizes_every_format() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let ran =
        check_quantize_and_dequantize(&gpu).unwrap_or_else(|e| panic!("on {}: {e}", gpu.adapter()));
    assert_eq!(ran, 24);
}

/// `x: [batch, m, 64]` against a 4-bit weight `[batch, 8, 64]` and the
/// gathered product of every x row block with weight 1.
fn shapeless_products(xs: Vec<Array>) -> Vec<Array> {
    let format = QuantFormat::affine(4, 32);
    let q = weight(&xs, 1, format);
    let rhs = Array::from_vec(vec![1u32], &[1]).expect("one index");
    vec![
        quantized_matmul(&xs[0], &q, true),
        gather_qmm(&xs[0], &q, &xs[4], &rhs, true),
    ]
}

/// Compiles [`shapeless_products`] shapelessly for `backend`, calls it at
/// three (batch, m) sizes, and compares with dequantize → gather → matmul
/// on the CPU; the backend must trace once.
fn check_shapeless<B: Backend>(backend: B) -> Result<(), String> {
    let compiled = compile(shapeless_products)
        .shapeless()
        .with_backend(backend);
    for (batch, m) in [(2, 3), (3, 17), (2, 1)] {
        let w = values(DType::F32, &[batch, 8, 64], 30);
        let mut args = vec![values(DType::F32, &[batch, m, 64], 31 + m as u64)];
        args.extend(parts(&w, QuantFormat::affine(4, 32)));
        let lhs: Vec<u32> = (0..batch as u32).rev().collect();
        args.push(Array::from_vec(lhs.clone(), &[batch]).expect("indices"));
        let got = compiled
            .call(&args)
            .map_err(|e| format!("({batch}, {m}): {e}"))?;
        let deq = weight(&args, 1, QuantFormat::affine(4, 32)).dequantize();
        let plain = args[0].matmul(&deq.swap_axes(-1, -2));
        let w1 = deq.slice_axis(0, 1, Some(2), 1).swap_axes(-1, -2);
        let gathered = args[0].take(&args[4], 0).matmul(&w1);
        for (k, (g, w)) in got.iter().zip([plain, gathered]).enumerate() {
            if g.dims() != w.dims() || g.dims() != Some(vec![batch, m, 8]) {
                return Err(format!(
                    "({batch}, {m}) output {k}: shape {} vs {}",
                    g.shape(),
                    w.shape()
                ));
            }
            let (g, w) = (
                g.data().map_err(|e| e.to_string())?,
                w.data().map_err(|e| e.to_string())?,
            );
            compare_within(&g, &w, 64e-5, 4e-4)
                .map_err(|e| format!("({batch}, {m}) output {k}: {e}"))?;
        }
    }
    let cache = compiled.cache();
    if (cache.entries, cache.misses) != (1, 1) {
        return Err(format!("traced {} times for three sizes", cache.misses));
    }
    Ok(())
}

#[test]
fn cpu_executor_runs_shapeless_quantized_products_with_one_trace() {
    check_shapeless(CpuBackend).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn wgpu_runs_shapeless_quantized_products_with_one_trace() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    check_shapeless(gpu.clone()).unwrap_or_else(|e| panic!("on {}: {e}", gpu.adapter()));
}

/// A gather index past the last weight matrix is an `Err` naming the
/// indices on every backend, never a read out of bounds.
fn check_out_of_range_index<B: Backend>(backend: B, rows: usize) -> Result<String, String> {
    let format = QuantFormat::Nf4;
    let w = values(DType::F32, &[2, 4, 64], 40);
    let mut args = vec![values(DType::F32, &[1, rows, 64], 41)];
    args.extend(parts(&w, format));
    args.push(Array::from_vec(vec![0u32, 0], &[2]).expect("2"));
    args.push(Array::from_vec(vec![1u32, 2], &[2]).expect("2"));
    let f = compile(move |xs: Vec<Array>| {
        gather_qmm(&xs[0], &weight(&xs, 1, format), &xs[3], &xs[4], true)
    })
    .with_backend(backend);
    match f.call(&args).and_then(|y| y.data().map(|_| ())) {
        Ok(()) => Err("an out-of-range index gave a result".into()),
        Err(e) => Ok(e.to_string()),
    }
}

#[test]
fn out_of_range_gather_indices_are_errors() {
    // 2 rows of x stream the codes on wgpu; 9 run on the tiled kernel.
    for rows in [2, 9] {
        let err = check_out_of_range_index(CpuBackend, rows).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            err.contains("rhs_indices holds 2, out of range for 2 matrices"),
            "{err}"
        );
        if let Some(gpu) = kiln_tests::gpu::backend() {
            let err = check_out_of_range_index(gpu, rows).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                err.contains("lhs_indices or rhs_indices") && err.contains("position 1"),
                "rows {rows}: {err}"
            );
        }
    }
}

#[test]
fn dequantize_of_mismatched_parts_is_an_error_naming_the_shapes() {
    let packed = Array::zeros(&[4, 8], DType::U32);
    let scales = Array::zeros(&[4, 3], DType::F32);
    let err = dequantize(&packed, &scales, Some(&scales), QuantFormat::affine(4, 32))
        .data()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "3 groups of affine(bits=4, group_size=32) hold 96 columns, which need 12 words"
        ),
        "{err}"
    );
}

#[test]
fn wgpu_with_f16_packed_in_words_matches_the_cpu_executor() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let packed = gpu.with_packed_f16();
    assert!(!packed.has_shader_f16());
    let ran = run_cases(&packed).unwrap_or_else(|e| panic!("on {}: {e}", packed.adapter()));
    assert!(ran >= 60, "only {ran} runs");
    let ran = check_quantize_and_dequantize(&packed)
        .unwrap_or_else(|e| panic!("on {}: {e}", packed.adapter()));
    assert_eq!(ran, 24);
}
