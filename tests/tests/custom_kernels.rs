//! User kernels (seed mlx #3485): a mandatory shape rule keeps shapeless
//! compile total, and the grid is computed from each call's shapes, so a
//! shapeless executable called at new sizes writes every element (outputs
//! start as a sentinel to prove it), on the CPU and on wgpu. Invalid WGSL,
//! undescribed bindings, oversize workgroups and lying shape rules are
//! `Err`s; pipelines are keyed by source, not name.

use kiln::ops::kernel::GridArgs;
use kiln::{compile, Array, Backend, CpuBackend, DType, Error, HostData, Kernel, Op, ValueKind};

const SENTINEL: f32 = -777.0;

/// `out[r, c] = x[r, c] * SCALE + r`, written over `init` (in place), one
/// invocation per element on an 8×8 grid of 2-D workgroups.
const SCALED_ROWS: &str = "
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;

@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let rows = params[3];
    let cols = params[4];
    if id.y < rows && id.x < cols {
        let i = id.y * cols + id.x;
        out[i] = x[i] * SCALE + f32(id.y);
    }
}
";

fn scaled_rows() -> Kernel {
    Kernel::builder("scaled_rows", ["init", "x"])
        .in_place("init")
        .template("SCALE", 2.0f32)
        .shape_rule(|inputs, cx| {
            let (init, x) = (inputs[0], inputs[1]);
            if init.shape.rank() != 2 || x.shape.rank() != 2 || init.dtype != x.dtype {
                return Err(Error::Kernel {
                    kernel: "scaled_rows".into(),
                    detail: format!("expects two matrices of one dtype, got {init} and {x}"),
                });
            }
            for d in 0..2 {
                cx.unify(&init.shape.dims()[d], &x.shape.dims()[d]);
            }
            Ok(init.clone())
        })
        .reference(|call| {
            let scale = call.template("SCALE").unwrap_or(1.0);
            let cols = call.shapes[1][1];
            let x = call.inputs[1].to_f64_vec();
            Ok(HostData::from_f64s(
                call.out_dtype,
                x.iter()
                    .enumerate()
                    .map(|(i, v)| v * scale + (i / cols) as f64),
            ))
        })
        .wgsl(SCALED_ROWS)
        .grid(|call: &GridArgs| {
            let (rows, cols) = (call.output[0] as u32, call.output[1] as u32);
            [cols.div_ceil(8), rows.div_ceil(8), 1]
        })
        .build()
        .unwrap()
}

/// `out[r] = Σ_c x[r, c]`: a kernel whose output shape differs from its
/// input's, one invocation per row.
fn row_sums() -> Kernel {
    Kernel::builder("row_sums", ["x"])
        .shape_rule(|inputs, _| {
            let x = inputs[0];
            Ok(kiln::Aval::new(vec![x.shape.dims()[0].clone()], x.dtype))
        })
        .reference(|call| {
            let cols = call.shapes[0][1];
            let x = call.inputs[0].to_f64_vec();
            Ok(HostData::from_f64s(
                call.out_dtype,
                x.chunks(cols.max(1)).map(|row| row.iter().sum()),
            ))
        })
        .wgsl(
            "@group(0) @binding(0) var<storage, read> params: array<u32>;
             @group(0) @binding(1) var<storage, read_write> out: array<f32>;
             @group(0) @binding(2) var<storage, read> x: array<f32>;
             @compute @workgroup_size(64)
             fn main(@builtin(global_invocation_id) id: vec3<u32>) {
                 let rows = params[0];
                 let cols = params[6];
                 if id.x < rows {
                     var total = 0.0;
                     for (var c = 0u; c < cols; c++) { total += x[id.x * cols + c]; }
                     out[id.x] = total;
                 }
             }",
        )
        .build()
        .unwrap()
}

fn matrix(rows: usize, cols: usize, seed: u64) -> Array {
    let data: Vec<f32> = (0..rows * cols)
        .map(|i| ((i as u64 * 7919 + seed * 104729) % 1000) as f32 / 100.0 - 5.0)
        .collect();
    Array::from_vec(data, &[rows, cols]).unwrap()
}

fn expected_scaled_rows(x: &Array, scale: f32) -> Vec<f32> {
    let cols = x.dims().unwrap()[1];
    x.to_vec::<f32>()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, v)| v * scale + (i / cols) as f32)
        .collect()
}

/// The seed's scenario on `backend`: one shapeless trace, three sizes that
/// are not multiples of the workgroup, every element written.
fn shapeless_kernel_writes_every_element<B: Backend>(backend: B) {
    let kernel = scaled_rows();
    let sums = row_sums();
    let f = compile(move |(init, x): (Array, Array)| {
        let scaled = kernel.call(&[&init, &x]);
        let total = sums.call(&[&scaled]);
        (scaled, total)
    })
    .shapeless()
    .with_backend(backend);
    for (rows, cols) in [(5, 3), (37, 70), (130, 9)] {
        let init = Array::full(&[rows, cols], f64::from(SENTINEL), DType::F32);
        let x = matrix(rows, cols, rows as u64);
        let (scaled, total) = f.call(&(init, x.clone())).unwrap();
        assert_eq!(scaled.dims().unwrap(), vec![rows, cols]);
        assert_eq!(total.dims().unwrap(), vec![rows]);
        let got = scaled.to_vec::<f32>().unwrap();
        assert!(
            !got.contains(&SENTINEL),
            "{rows}x{cols}: an element was never written"
        );
        let want = expected_scaled_rows(&x, 2.0);
        assert_eq!(got, want, "{rows}x{cols}");
        let sums = total.to_vec::<f32>().unwrap();
        for (r, s) in sums.iter().enumerate() {
            let row: f32 = want[r * cols..(r + 1) * cols].iter().sum();
            assert!(
                (s - row).abs() <= 1e-3 * (1.0 + row.abs()),
                "row {r}: {s} vs {row}"
            );
        }
    }
    assert_eq!(f.cache().misses, 1, "one trace for every size");
}

#[test]
fn a_shapeless_kernel_writes_every_element_at_every_size_on_the_cpu() {
    shapeless_kernel_writes_every_element(CpuBackend);
}

#[test]
fn a_shapeless_kernel_writes_every_element_at_every_size_on_wgpu() {
    if let Some(gpu) = kiln_tests::gpu::backend() {
        shapeless_kernel_writes_every_element(gpu);
    }
}

#[test]
fn an_in_place_kernel_takes_a_donated_buffer_and_the_plan_records_it() {
    let kernel = scaled_rows();
    let f = compile(move |(init, x): (Array, Array)| kernel.call(&[&init, &x])).donate(["args[0]"]);
    let args = (Array::zeros(&[4, 4], DType::F32), matrix(4, 4, 1));
    f.call(&args).unwrap();
    let report = f.cache().reports[0].clone();
    let decision = report
        .nodes
        .iter()
        .find_map(|n| n.reinplace.clone())
        .expect("the kernel node has a reinplace decision");
    assert_eq!(decision.op, "scaled_rows[SCALE=2]");
    assert!(
        decision.summary().starts_with("in place of"),
        "{}",
        decision.summary()
    );
    assert_eq!(
        decision.operands.len(),
        1,
        "only the in-place input is a candidate"
    );
}

#[test]
fn an_in_place_kernel_refuses_an_input_read_later_and_still_computes() {
    let kernel = scaled_rows();
    let f = compile(move |x: Array| {
        let init = x.exp();
        let y = kernel.call(&[&init, &x]);
        &y + &init
    });
    let x = matrix(3, 5, 2);
    let y = f.call(&x).unwrap();
    let want: Vec<f32> = expected_scaled_rows(&x, 2.0)
        .iter()
        .zip(x.exp().to_vec::<f32>().unwrap())
        .map(|(a, b)| a + b)
        .collect();
    let got = y.to_vec::<f32>().unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()));
    }
    let report = f.cache().reports[0].clone();
    let refused = report
        .nodes
        .iter()
        .filter_map(|n| n.reinplace.as_ref())
        .find(|d| d.op.starts_with("scaled_rows"))
        .unwrap();
    assert!(
        refused.summary().contains("read later"),
        "{}",
        refused.summary()
    );
    if let Some(gpu) = kiln_tests::gpu::backend() {
        let kernel = scaled_rows();
        let on_gpu = compile(move |x: Array| {
            let init = x.exp();
            &kernel.call(&[&init, &x]) + &init
        })
        .with_backend(gpu);
        let g = on_gpu.call(&x).unwrap().to_vec::<f32>().unwrap();
        for (g, w) in g.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()));
        }
    }
}

#[test]
fn template_constants_change_the_op_and_equal_ones_merge_in_cse() {
    let kernel = scaled_rows();
    let f = compile(move |(init, x): (Array, Array)| {
        let a = kernel.call(&[&init, &x]);
        let b = kernel.call(&[&init, &x]);
        let c = kernel.call_with(&[&init, &x], &[("SCALE", 3.0f32.into())]);
        (&a + &b, c)
    });
    let x = matrix(2, 3, 3);
    let (ab, c) = f
        .call(&(Array::zeros(&[2, 3], DType::F32), x.clone()))
        .unwrap();
    let kernels = f
        .executable(&(Array::zeros(&[2, 3], DType::F32), x.clone()))
        .unwrap()
        .graph()
        .nodes
        .iter()
        .filter(|n| matches!(n.kind, ValueKind::Op(Op::Kernel(_))))
        .count();
    assert_eq!(kernels, 2, "equal templates merge, SCALE=3 stays apart");
    let twice: Vec<f32> = expected_scaled_rows(&x, 2.0)
        .iter()
        .map(|v| 2.0 * v)
        .collect();
    assert_eq!(ab.to_vec::<f32>().unwrap(), twice);
    assert_eq!(c.to_vec::<f32>().unwrap(), expected_scaled_rows(&x, 3.0));
    let err = kernel_error(scaled_rows().call_with(&[&x, &x], &[("SCALE", 3u32.into())]));
    assert!(err.contains("`SCALE` is a f32, given a u32"), "{err}");
    let err = kernel_error(scaled_rows().call_with(&[&x, &x], &[("OTHER", 1.0f32.into())]));
    assert!(err.contains("no template constant `OTHER`"), "{err}");
}

fn kernel_error(a: Array) -> String {
    a.eval().unwrap_err().to_string()
}

/// A kernel named `scale` multiplying by `factor`.
fn scale_by(factor: f32) -> Kernel {
    Kernel::builder("scale", ["x"])
        .shape_rule(|inputs, _| Ok(inputs[0].clone()))
        .reference(move |call| {
            Ok(HostData::from_f64s(
                call.out_dtype,
                call.inputs[0]
                    .to_f64_vec()
                    .into_iter()
                    .map(|v| v * f64::from(factor)),
            ))
        })
        .wgsl(format!(
            "@group(0) @binding(0) var<storage, read> params: array<u32>;
             @group(0) @binding(1) var<storage, read_write> out: array<f32>;
             @group(0) @binding(2) var<storage, read> x: array<f32>;
             @compute @workgroup_size(64)
             fn main(@builtin(global_invocation_id) id: vec3<u32>) {{
                 if id.x < params[0] {{ out[id.x] = x[id.x] * {factor:?}; }}
             }}"
        ))
        .build()
        .unwrap()
}

/// Both same-name kernels in one compiled call on `backend`.
fn two_scales<B: Backend>(backend: B, x: &Array) -> (Vec<f32>, Vec<f32>) {
    let (two, three) = (scale_by(2.0), scale_by(3.0));
    let f = compile(move |x: Array| (two.call(&[&x]), three.call(&[&x]))).with_backend(backend);
    let (a, b) = f.call(x).unwrap();
    (a.to_vec().unwrap(), b.to_vec().unwrap())
}

#[test]
fn two_kernels_with_one_name_and_different_sources_run_correctly_in_one_call() {
    let x = matrix(1, 100, 4).reshape(&[100]);
    let values = x.to_vec::<f32>().unwrap();
    let want = (
        values.iter().map(|v| v * 2.0).collect::<Vec<_>>(),
        values.iter().map(|v| v * 3.0).collect::<Vec<_>>(),
    );
    assert_eq!(two_scales(CpuBackend, &x), want);
    if let Some(gpu) = kiln_tests::gpu::backend() {
        assert_eq!(two_scales(gpu, &x), want);
    }
}

#[test]
fn invalid_wgsl_is_an_error_with_nagas_message_and_the_line() {
    let err = Kernel::builder("broken", ["x"])
        .shape_rule(|inputs, _| Ok(inputs[0].clone()))
        .reference(|call| Ok(call.inputs[0].clone()))
        .wgsl(
            "@group(0) @binding(1) var<storage, read_write> out: array<f32>;\n\
             @compute @workgroup_size(64)\n\
             fn main(@builtin(global_invocation_id) id: vec3<u32>) {\n\
                 out[id.x] = undefined_name * 2.0;\n\
             }\n",
        )
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("kernel `broken`"), "{err}");
    assert!(err.contains("does not validate"), "{err}");
    assert!(err.contains("undefined_name"), "{err}");
    assert!(err.contains(":4:"), "the message names line 4: {err}");
}

#[test]
fn bindings_must_match_the_description() {
    let build = |source: &str| {
        Kernel::builder("k", ["a", "b"])
            .shape_rule(|inputs, _| Ok(inputs[0].clone()))
            .reference(|call| Ok(call.inputs[0].clone()))
            .wgsl(source)
            .build()
            .unwrap_err()
            .to_string()
    };
    let header = "@group(0) @binding(1) var<storage, read_write> out: array<f32>;\n";
    let main = "@compute @workgroup_size(1) fn main() { out[0] = 1.0; }\n";
    let err = build(&format!(
        "{header}@group(0) @binding(2) var<storage, read> a: array<f32>;\n{main}"
    ));
    assert!(err.contains("no binding 3 for input 1"), "{err}");
    let err = build(&format!(
        "{header}@group(0) @binding(2) var<storage, read> a: array<f32>;\n\
         @group(0) @binding(3) var<storage, read> b: array<f32>;\n\
         @group(0) @binding(4) var<storage, read> c: array<f32>;\n{main}"
    ));
    assert!(err.contains("binding 4 is not described"), "{err}");
    let err = build(&format!(
        "{header}@group(0) @binding(2) var<storage, read_write> a: array<f32>;\n\
         @group(0) @binding(3) var<storage, read> b: array<f32>;\n{main}"
    ));
    assert!(
        err.contains("binding 2 (input 0) must be `var<storage, read>`"),
        "{err}"
    );
    let err = Kernel::builder("k", ["a"])
        .shape_rule(|inputs, _| Ok(inputs[0].clone()))
        .reference(|call| Ok(call.inputs[0].clone()))
        .wgsl(format!("{header}{main}").replace("main", "start"))
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("no entry point `main`"), "{err}");
    let err = Kernel::builder("k", ["a"])
        .reference(|call| Ok(call.inputs[0].clone()))
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("no shape rule"), "{err}");
}

#[test]
fn a_workgroup_above_the_adapters_limits_is_an_error_not_a_partial_run() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let kernel = Kernel::builder("huge_groups", ["x"])
        .shape_rule(|inputs, _| Ok(inputs[0].clone()))
        .reference(|call| Ok(call.inputs[0].clone()))
        .wgsl(
            "@group(0) @binding(0) var<storage, read> params: array<u32>;
             @group(0) @binding(1) var<storage, read_write> out: array<f32>;
             @group(0) @binding(2) var<storage, read> x: array<f32>;
             @compute @workgroup_size(4096)
             fn main(@builtin(global_invocation_id) id: vec3<u32>) {
                 if id.x < params[0] { out[id.x] = x[id.x]; }
             }",
        )
        .build()
        .unwrap();
    let x = matrix(1, 8, 5).reshape(&[8]);
    let on_cpu = kernel.call(&[&x]).to_vec::<f32>().unwrap();
    assert_eq!(on_cpu, x.to_vec::<f32>().unwrap());
    let f = compile(move |x: Array| kernel.call(&[&x])).with_backend(gpu);
    let err = f.call(&x).unwrap_err().to_string();
    assert!(
        err.contains("huge_groups") && err.contains("@workgroup_size(4096, 1, 1)"),
        "{err}"
    );
}

#[test]
fn a_shape_rule_that_disagrees_with_the_kernel_is_an_error() {
    let liar = Kernel::builder("liar", ["x"])
        .shape_rule(|inputs, _| Ok(inputs[0].clone()))
        .reference(|call| {
            let mut values = call.inputs[0].to_f64_vec();
            values.push(0.0);
            Ok(HostData::from_f64s(call.out_dtype, values.into_iter()))
        })
        .build()
        .unwrap();
    let x = matrix(2, 2, 6);
    let err = liar.call(&[&x]).eval().unwrap_err().to_string();
    assert!(
        err.contains("kernel `liar`") && err.contains("returned 5") && err.contains("[2, 2]"),
        "{err}"
    );
    let f = compile(move |x: Array| liar.call(&[&x]));
    assert!(f.call(&x).is_err());
}

#[test]
fn a_kernel_without_wgsl_runs_on_the_cpu_and_says_why_not_on_wgpu() {
    let cpu_only = Kernel::builder("cpu_only", ["x"])
        .shape_rule(|inputs, _| Ok(inputs[0].clone()))
        .reference(|call| Ok(call.inputs[0].clone()))
        .build()
        .unwrap();
    let x = matrix(2, 3, 7);
    assert_eq!(
        cpu_only.call(&[&x]).to_vec::<f32>().unwrap(),
        x.to_vec::<f32>().unwrap()
    );
    if let Some(gpu) = kiln_tests::gpu::backend() {
        let f = compile(move |x: Array| cpu_only.call(&[&x])).with_backend(gpu);
        let err = f.call(&x).unwrap_err().to_string();
        assert!(err.contains("cpu_only") && err.contains("no WGSL"), "{err}");
    }
}

#[test]
fn a_kernel_given_dtypes_its_bindings_do_not_declare_is_an_error_on_wgpu() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let kernel = scale_by(2.0);
    let f = compile(move |x: Array| kernel.call(&[&x])).with_backend(gpu);
    let x = Array::from_vec(vec![1i32, 2], &[2]).unwrap();
    let err = f.call(&x).unwrap_err().to_string();
    assert!(err.contains("array<f32>") && err.contains("i32"), "{err}");
}
