//! The wgpu backend on the default adapter (lavapipe in CI): random graphs
//! equal the CPU executor, cached calls create nothing, a fused chain is
//! one dispatch, and errors are `Err`s after which the backend still works.
//! Integer casts to f16/bf16 give the CPU executor's bits. Case count of
//! the property tests: `KILN_CASES` (default 48: every case compiles
//! kernels on a software rasterizer).

use kiln::{compile, Array, Backend, CpuBackend, DType};
use kiln_tests::conformance::{compare_by, compare_within, run_on, Rule};
use kiln_tests::programs::{cases, instr, make_inputs, run, Instr};
use proptest::prelude::*;
use std::sync::Arc;

/// Runs `program` compiled with fusion and reinplacing (`donate` marks
/// argument leaves that may be overwritten) on `backend`.
fn run_program<B: kiln::Backend>(
    backend: B,
    program: &Arc<Vec<Instr>>,
    inputs: &[Array],
    donate: &[String],
    shapeless: bool,
) -> kiln::Result<Vec<Arc<kiln::HostData>>> {
    let p = program.clone();
    let f = compile(move |xs: Vec<Array>| run(&p, xs))
        .fusion(true)
        .donate(donate.to_vec())
        .with_backend(backend);
    let f = if shapeless { f.shapeless() } else { f };
    f.call_owned(inputs.to_vec())?
        .iter()
        .map(Array::data)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(48)))]

    #[test]
    fn random_fused_reinplaced_graphs_on_wgpu_equal_the_cpu_executor(
        program in prop::collection::vec(instr(), 1..12),
        n in prop::sample::select(vec![1usize, 3, 6]),
        dtype in prop::sample::select(vec![DType::F32, DType::F32, DType::F16]),
        donated in 0u8..16,
        shapeless in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let Some(gpu) = kiln_tests::gpu::backend() else {
            return Ok(());
        };
        let program = Arc::new(program);
        let donate: Vec<String> = (0..4)
            .filter(|i| donated & (1 << i) != 0)
            .map(|i| format!("args[{i}]"))
            .collect();
        let want = run_program(CpuBackend, &program, &make_inputs(n, seed, dtype), &donate, shapeless);
        let got = run_program(gpu, &program, &make_inputs(n, seed, dtype), &donate, shapeless);
        match (want, got) {
            (Ok(want), Ok(got)) => {
                prop_assert_eq!(want.len(), got.len());
                // Random programs amplify rounding (cancellation, exp), so the
                // bound is looser than the conformance suite's.
                let (atol, rtol) = if dtype == DType::F32 { (1e-3, 1e-3) } else { (5e-2, 5e-2) };
                for (k, (w, g)) in want.iter().zip(&got).enumerate() {
                    if let Err(e) = compare_within(g, w, atol, rtol) {
                        return Err(TestCaseError::fail(format!("output {k}: {e}")));
                    }
                }
            }
            (Err(w), Err(g)) => prop_assert_eq!(w.to_string(), g.to_string()),
            (want, got) => {
                return Err(TestCaseError::fail(format!("cpu gave {want:?}, wgpu gave {got:?}")))
            }
        }
    }
}

/// Integers a few units from a midpoint of two neighbouring bf16 (8
/// significant bits) or f16 (11) values, at magnitudes up to 2^32, where
/// rounding through f32 first goes wrong; and any u32.
fn integer_near_a_half_midpoint() -> impl Strategy<Value = u32> {
    let near = (
        prop::sample::select(vec![8u32, 11]),
        any::<u32>(),
        1u32..25,
        -2i64..=2,
    )
        .prop_map(|(digits, bits, shift, offset)| {
            let leading = (1 << (digits - 1)) | (bits & ((1 << (digits - 1)) - 1));
            let midpoint = (i64::from(leading) << shift) + (1 << (shift - 1));
            (midpoint + offset).clamp(0, i64::from(u32::MAX)) as u32
        });
    prop_oneof![near, any::<u32>()]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(48)))]

    #[test]
    fn integer_casts_to_f16_and_bf16_on_wgpu_give_the_cpu_executors_bits(
        words in prop::collection::vec(integer_near_a_half_midpoint(), 64),
    ) {
        let Some(gpu) = kiln_tests::gpu::backend() else {
            return Ok(());
        };
        let signed: Vec<i32> = words.iter().map(|&w| w as i32).collect();
        let inputs = [
            Array::from_vec(signed, &[64]).expect("64 values"),
            Array::from_vec(words, &[64]).expect("64 values"),
        ];
        let casts: kiln_tests::conformance::Program = |a| {
            vec![
                a[0].cast(DType::BF16),
                a[0].cast(DType::F16),
                a[1].cast(DType::BF16),
                a[1].cast(DType::F16),
            ]
        };
        let want = run_on(CpuBackend, casts, &inputs, true).expect("the CPU casts");
        for backend in [gpu.clone(), gpu.with_packed_f16()] {
            let got = run_on(backend, casts, &inputs, true).expect("wgpu casts");
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                if let Err(e) = compare_by(g, w, Rule::Exact) {
                    return Err(TestCaseError::fail(format!("output {k}: {e}")));
                }
            }
        }
    }
}

#[test]
fn a_second_call_creates_no_pipeline_and_no_buffer() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let gpu = gpu.with_matmul_variant(kiln_wgpu::MatmulVariant::Tiled);
    let f = compile(|(x, w): (Array, Array)| {
        let h = x.matmul(&w).relu() + 1.0;
        (h.sum(&[1], false), h.exp().max(&[0], true))
    })
    .with_backend(gpu.clone());
    let x = Array::from_vec(
        (0..24).map(|i| i as f32 / 10.0).collect::<Vec<_>>(),
        &[4, 6],
    )
    .expect("24 values");
    let w = Array::from_vec(
        (0..18).map(|i| 0.5 - i as f32 / 20.0).collect::<Vec<_>>(),
        &[6, 3],
    )
    .expect("18 values");
    let first = f.call(&(x.clone(), w.clone())).expect("first call");
    let after_first = gpu.counters();
    assert!(after_first.pipelines > 0 && after_first.buffers > 0);
    let second = f.call(&(x, w)).expect("second call");
    let after_second = gpu.counters();
    assert_eq!(
        after_second.pipelines, after_first.pipelines,
        "new pipelines"
    );
    assert_eq!(after_second.buffers, after_first.buffers, "new buffers");
    assert_eq!(after_second.programs, after_first.programs, "a new program");
    assert_eq!(
        first.0.to_vec::<f32>().expect("f32"),
        second.0.to_vec::<f32>().expect("f32")
    );
    assert_eq!(
        first.1.to_vec::<f32>().expect("f32"),
        second.1.to_vec::<f32>().expect("f32")
    );
}

#[test]
fn a_fused_chain_of_one_hundred_ops_runs_as_one_dispatch() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let gpu = gpu.with_matmul_variant(kiln_wgpu::MatmulVariant::Tiled);
    let chain = |x: Array| {
        let mut y = x;
        for i in 0..50 {
            y = (&y * 0.999).sin() + i as f64 * 1e-3;
        }
        y
    };
    let x = Array::from_vec(
        (0..1000).map(|i| i as f32 / 100.0).collect::<Vec<_>>(),
        &[1000],
    )
    .expect("1000 values");
    let f = compile(chain).with_backend(gpu.clone());
    let got = f.call(&x).expect("wgpu call");
    let before = gpu.counters();
    f.call(&x).expect("cached call");
    assert_eq!(gpu.counters().dispatches - before.dispatches, 1);
    let want = compile(chain).call(&x).expect("cpu call");
    compare_within(
        &got.data().expect("data"),
        &want.data().expect("data"),
        1e-4,
        1e-4,
    )
    .expect("wgpu == cpu");
}

#[test]
fn a_buffer_above_the_binding_limit_is_an_error_naming_size_and_limit_and_the_backend_recovers() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let limit = gpu.limits().max_storage_buffer_binding_size;
    let side = ((limit / 4) as f64).sqrt() as usize + 2;
    let f =
        compile(move |x: Array| x.broadcast_to(&[side, side][..]) * 2.0).with_backend(gpu.clone());
    let err = f
        .call(&Array::scalar(1.0, DType::F32))
        .expect_err("too large a buffer");
    let message = err.to_string();
    // The buffer is the value's slot: its bytes, rounded up to the slot alignment.
    let needed: u64 = message
        .split("needs a buffer of ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no size in: {message}"));
    let bytes = (side * side * 4) as u64;
    assert!(
        (bytes..bytes + 4096).contains(&needed) && needed > limit,
        "{message}"
    );
    assert!(message.contains(&format!("{limit} bytes")), "{message}");
    let g = compile(|x: Array| x * 3.0).with_backend(gpu);
    let y = g.call(&Array::scalar(2.0, DType::F32)).expect("later call");
    assert_eq!(y.item::<f32>().expect("f32"), 6.0);
}

#[test]
fn a_runtime_error_on_the_device_path_matches_the_cpu_and_leaves_the_backend_usable() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    // One closure for both, so both errors name the same line.
    let row_max = |x: Array| x.max(&[1], false);
    let f = compile(row_max).with_backend(gpu.clone());
    let empty = Array::zeros(&[2, 0], DType::F32);
    let err = f.call(&empty).expect_err("max of an empty axis");
    let want = compile(row_max).call(&empty).expect_err("cpu too");
    assert_eq!(err.to_string(), want.to_string());
    let ok = f
        .call(&Array::from_vec(vec![1.0f32, 5.0, 2.0, -1.0], &[2, 2]).expect("4 values"))
        .expect("later call");
    assert_eq!(ok.to_vec::<f32>().expect("f32"), vec![5.0, 2.0]);
}

#[test]
fn the_backend_name_names_the_adapter_and_keys_the_cache() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    use kiln::Backend;
    assert!(gpu.name().starts_with("wgpu:"), "{}", gpu.name());
    assert!(gpu
        .adapter()
        .contains(gpu.name().trim_start_matches("wgpu:")));
}

#[test]
fn a_donated_argument_still_shared_by_the_caller_is_copied_before_an_in_place_write() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    use kiln::plan::Home;
    use kiln::Backend;
    let f = compile(|xs: Vec<Array>| vec![xs[0].exp().sin() * 2.0])
        .donate(["args[0]"])
        .with_backend(gpu.clone());
    let values: Vec<f32> = (0..8).map(|i| i as f32 / 8.0).collect();
    let x = Array::from_vec(values.clone(), &[8]).expect("8 values");
    let exe = f.executable(&vec![x.clone()]).expect("compiles");
    assert!(
        exe.plan().homes().contains(&Home::Input(0)),
        "the plan writes the donated argument in place"
    );
    let shapes = exe.resolve_shapes(&[&[8]]).expect("shapes").into_owned();
    let argument = gpu.upload(&x.data().expect("data")).expect("upload");
    let kept = argument.clone();
    let outputs = gpu.run(&exe, vec![argument], &shapes).expect("run");
    let kept = gpu.download(kept).expect("download");
    assert_eq!(*kept, kiln::HostData::F32(values.clone()));
    let out = outputs.into_iter().next().expect("one output");
    let got = gpu.download(out).expect("download").to_vec::<f32>();
    let want: Vec<f32> = values.iter().map(|v| v.exp().sin() * 2.0).collect();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
    }
}

#[test]
fn plans_of_executables_not_used_for_long_are_released() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let gpu = gpu.with_packed_f16();
    let x = Array::from_vec(vec![1.0f32, 2.0], &[2]).expect("2 values");
    let first = compile(|x: Array| x * 2.0).with_backend(gpu.clone());
    first.call(&x).expect("first call");
    let planned = gpu.counters().programs;
    first.call(&x).expect("cached call");
    assert_eq!(
        gpu.counters().programs,
        planned,
        "a cached call reuses its plan"
    );
    // Seventy other executables, each with its own constant.
    let others: Vec<_> = (0..70)
        .map(|i| {
            let f = compile(move |x: Array| x + f64::from(i)).with_backend(gpu.clone());
            f.call(&x).expect("call");
            f
        })
        .collect();
    first.call(&x).expect("call after many others");
    assert_eq!(
        gpu.counters().programs,
        planned + 71,
        "the first executable's plan was released and rebuilt"
    );
    drop(others);
}

#[test]
fn an_index_out_of_range_in_take_is_a_runtime_error_as_on_the_cpu() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let take = |(x, i): (Array, Array)| x.take(&i, 0);
    let f = compile(take).with_backend(gpu);
    let x = Array::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).expect("3 values");
    let bad = Array::from_vec(vec![0, 2, 3, -4], &[4]).expect("4 indices");
    let err = f.call(&(x.clone(), bad.clone())).expect_err("index 3 of 3");
    let cpu = compile(take).call(&(x.clone(), bad)).expect_err("cpu too");
    for message in [err.to_string(), cpu.to_string()] {
        assert!(
            message.contains("`take`") && message.contains("out of range for axis 0 of size 3"),
            "{message}"
        );
    }
    assert!(err.to_string().contains("position 2"), "{err}");
    let good = Array::from_vec(vec![-1, 0], &[2]).expect("2 indices");
    let y = f.call(&(x, good)).expect("in range");
    assert_eq!(y.to_vec::<f32>().expect("f32"), vec![3.0, 1.0]);
}

#[test]
fn a_bad_take_index_is_reported_by_the_download_so_the_browser_sees_it_too() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let take = |(x, i): (Array, Array)| {
        let picked = x.take(&i, 0);
        (picked.clone() * 2.0, picked)
    };
    let f = compile(take).with_backend(gpu.clone());
    let x = Array::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).expect("3 values");
    let bad = Array::from_vec(vec![1, 7, 0], &[3]).expect("3 indices");
    // The async path (the browser's) reports it.
    let err = pollster::block_on(f.call_async(&(x.clone(), bad.clone()))).expect_err("index 7");
    assert!(err.to_string().contains("position 1"), "{err}");
    // The call itself never waits for the device: running succeeds, and
    // downloading either output reports the bad index.
    let exe = f.executable(&(x.clone(), bad.clone())).expect("compiles");
    let shapes = exe
        .resolve_shapes(&[&[3], &[3]])
        .expect("shapes")
        .into_owned();
    let upload = |a: &Array| gpu.upload(&a.data().expect("data")).expect("upload");
    let outputs = gpu
        .run(&exe, vec![upload(&x), upload(&bad)], &shapes)
        .expect("runs");
    assert_eq!(outputs.len(), 2);
    for output in outputs {
        let err = gpu.download(output).expect_err("bad index");
        assert!(err.to_string().contains("out of range"), "{err}");
    }
    let good = Array::from_vec(vec![2, -3], &[2]).expect("2 indices");
    let (doubled, picked) = pollster::block_on(f.call_async(&(x, good))).expect("in range");
    assert_eq!(doubled.to_vec::<f32>().unwrap(), vec![6.0, 2.0]);
    assert_eq!(picked.to_vec::<f32>().unwrap(), vec![3.0, 1.0]);
}

#[test]
fn a_fused_group_reading_more_buffers_than_a_kernel_can_bind_runs_op_by_op() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    // At most 16 bindings, so that the group needs only a few dozen
    // leaves on any device (NVIDIA's limit is in the millions).
    let gpu = gpu.with_packed_f16().with_storage_buffer_limit(16);
    let limit = gpu.caps().max_storage_buffers_per_stage as usize;
    let sum_of_leaves = |xs: Vec<Array>| {
        let mut acc = xs[0].clone();
        for x in &xs[1..] {
            acc = acc + (x.exp() * 2.0 + 1.0);
        }
        vec![acc.tanh()]
    };
    let xs: Vec<Array> = (0..limit + 8)
        .map(|i| {
            let shape: &[usize] = if i % 3 == 0 { &[4, 1] } else { &[4, 5] };
            let n: usize = shape.iter().product();
            Array::from_vec((0..n).map(|j| (i + j) as f32 * 0.01).collect(), shape)
                .expect("sized data")
        })
        .collect();
    let want = compile(sum_of_leaves).call(&xs).expect("cpu");
    let f = compile(sum_of_leaves).with_backend(gpu.clone());
    f.call(&xs).expect("first call");
    let before = gpu.counters().dispatches;
    let got = f.call(&xs).expect("wgpu runs the group op by op");
    assert!(
        gpu.counters().dispatches - before > limit as u64,
        "one dispatch per member op"
    );
    compare_within(
        &got[0].data().expect("data"),
        &want[0].data().expect("data"),
        1e-5,
        1e-5,
    )
    .expect("wgpu == cpu");
}

#[test]
fn call_async_reads_results_back_through_the_async_readback() {
    let x = Array::from_vec(vec![0.5f32, -1.0, 2.0, 0.0], &[4]).expect("x");
    let cpu = compile(|x: Array| (x.exp() * 2.0 + 1.0).tanh());
    let want = pollster::block_on(cpu.call_async(&x)).expect("cpu call");
    assert_eq!(
        want.to_vec::<f32>().unwrap(),
        cpu.call(&x).unwrap().to_vec::<f32>().unwrap()
    );
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let f = compile(|x: Array| (x.exp() * 2.0 + 1.0).tanh()).with_backend(gpu);
    let got = pollster::block_on(f.call_async(&x)).expect("wgpu call");
    let (got, want) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5, "{got:?} vs {want:?}");
    }
}

#[test]
fn slices_whose_step_exceeds_the_axis_read_one_element_as_on_the_cpu() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    // A step of i64::MAX times the row stride overflowed the kernel's view.
    let program = |x: Array| {
        (
            x.slice_axis(1, 1, None, i64::MAX),
            x.slice_axis(0, 4, None, i64::MAX),
        )
    };
    let x = Array::arange(0.0, 6.0, 1.0, DType::F32)
        .unwrap()
        .reshape(&[3, 2]);
    let (one, empty) = compile(program).with_backend(gpu).call(&x).unwrap();
    assert_eq!(one.to_vec::<f32>().unwrap(), vec![1.0, 3.0, 5.0]);
    assert_eq!(empty.dims(), Some(vec![0, 2]));
    let (cpu_one, _) = compile(program).call(&x).unwrap();
    assert_eq!(cpu_one.to_vec::<f32>().unwrap(), vec![1.0, 3.0, 5.0]);
}

#[test]
fn empty_arrays_with_dims_beyond_32_bits_need_no_kernel() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let program = |x: Array| {
        let empty = x.reshape(&[2, 1, 1]).broadcast_to([2, 0, 1 << 40]);
        (
            kiln::concat(&[empty.clone(), empty.clone()], 2),
            (&empty * 2.0).sum(&[2], false),
        )
    };
    let x = Array::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    let (joined, sums) = compile(program).with_backend(gpu).call(&x).unwrap();
    assert_eq!(joined.dims(), Some(vec![2, 0, 1 << 41]));
    assert_eq!(joined.to_vec::<f32>().unwrap(), Vec::<f32>::new());
    assert_eq!(sums.dims(), Some(vec![2, 0]));
}

/// `[rows, cols]` of small integers as f32, so every product and sum of a
/// short matmul is exact and any order of the sums gives the same bits.
fn small_ints(rows: usize, cols: usize, seed: usize) -> Array {
    let values = (0..rows * cols).map(|i| ((i * 7 + seed * 13) % 11) as f32 - 5.0);
    Array::from_vec(values.collect(), &[rows, cols]).expect("sized")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(12)))]

    #[test]
    fn products_of_transposed_operands_read_in_place_on_wgpu_equal_the_cpu(
        m in 1usize..70,
        k in 1usize..40,
        n in 1usize..70,
        transposed in any::<[bool; 2]>(),
        variant in prop::sample::select(vec![
            kiln_wgpu::MatmulVariant::Tiled,
            kiln_wgpu::MatmulVariant::Skinny,
            kiln_wgpu::MatmulVariant::Naive,
        ]),
    ) {
        let Some(gpu) = kiln_tests::gpu::backend() else {
            return Ok(());
        };
        // Stored transposed where marked, multiplied as `[m, k] @ [k, n]`.
        let a = if transposed[0] { small_ints(k, m, 1) } else { small_ints(m, k, 1) };
        let b = if transposed[1] { small_ints(n, k, 2) } else { small_ints(k, n, 2) };
        let product = move |(a, b): (Array, Array)| {
            let a = if transposed[0] { a.transpose() } else { a };
            let b = if transposed[1] { b.transpose() } else { b };
            a.matmul(&b)
        };
        let on_gpu = compile(product).with_backend(gpu.with_matmul_variant(variant));
        let exe = on_gpu.executable(&(a.clone(), b.clone())).expect("compiles");
        let permutes = exe
            .graph()
            .nodes
            .iter()
            .filter(|node| matches!(node.kind, kiln::ValueKind::Op(kiln::Op::Permute(_))))
            .count();
        prop_assert_eq!(permutes, 0);
        let got = on_gpu.call(&(a.clone(), b.clone())).expect("wgpu call");
        let want = compile(product).call(&(a, b)).expect("cpu call");
        prop_assert_eq!(got.to_vec::<f32>().expect("f32"), want.to_vec::<f32>().expect("f32"));
    }
}
