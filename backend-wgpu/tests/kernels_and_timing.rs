//! What the backend lists and measures, on the default adapter (lavapipe
//! in CI; `KILN_REQUIRE_GPU=1` makes a missing adapter, or one without
//! timestamps, fail instead of skip): the kernel list names every dispatch
//! with its WGSL, bindings and grid and the graph value it serves, and a
//! timed call reports each dispatch's GPU time beside that list.

use kiln::{compile, Array, DType, StepKind};
use kiln_wgpu::WgpuBackend;

fn required() -> bool {
    std::env::var("KILN_REQUIRE_GPU").is_ok_and(|v| v != "0")
}

fn backend() -> Option<WgpuBackend> {
    match WgpuBackend::new() {
        Ok(gpu) => Some(gpu),
        Err(e) => {
            assert!(!required(), "KILN_REQUIRE_GPU is set but {e}");
            eprintln!("skipping: {e}");
            None
        }
    }
}

fn exp_then_sum(x: Array) -> Array {
    (x.exp() * 2.0).sum(&[0], false)
}

#[test]
fn the_kernel_list_names_each_dispatch_with_its_source_bindings_grid_and_node() {
    let Some(gpu) = backend() else { return };
    let f = compile(exp_then_sum).with_backend(gpu);
    f.call(&Array::ones(&[64], DType::F32)).unwrap();
    let list = f.kernels(0).unwrap();
    assert!(list.backend.starts_with("wgpu:"), "{}", list.backend);
    let sum = list
        .steps
        .iter()
        .find(|s| s.op.starts_with("sum"))
        .expect("the sum is a dispatch");
    assert_eq!(sum.kind, StepKind::Dispatch);
    let source = &list.sources[sum.source.expect("a dispatch has a source")];
    assert!(source.contains("@compute"), "{source}");
    assert_eq!(sum.bindings[0].buffer, "params");
    assert_eq!(sum.bindings[1].buffer, "output 0");
    assert!(sum.grid.is_some_and(|g| g.iter().all(|&n| n >= 1)));
    let report = &f.cache().reports[0];
    let node = sum.nodes[0];
    assert!(
        report.nodes[node].op.starts_with("sum"),
        "{}",
        report.nodes[node].op
    );
    // Every dispatch serves a value of the graph.
    assert!(list
        .steps
        .iter()
        .filter(|s| s.kind == StepKind::Dispatch)
        .all(|s| s.nodes.len() == 1));
}

#[test]
fn a_timed_call_reports_each_dispatchs_gpu_time_beside_the_kernel_list() {
    let Some(gpu) = backend() else { return };
    if !gpu.set_gpu_timing(true) {
        assert!(
            !required(),
            "the adapter {} has no timestamp queries",
            gpu.adapter()
        );
        eprintln!("skipping: {} has no timestamp queries", gpu.adapter());
        return;
    }
    let f = compile(exp_then_sum).with_backend(gpu.clone());
    let before = gpu.gpu_calls_timed();
    for n in [256, 256] {
        f.call(&Array::ones(&[n], DType::F32)).unwrap();
    }
    assert_eq!(gpu.gpu_calls_timed(), before + 2);
    let list = f.kernels(0).unwrap();
    let times = pollster::block_on(gpu.take_gpu_times()).unwrap();
    assert_eq!(times.len(), 2);
    for (k, time) in times.iter().enumerate() {
        assert_eq!(time.call, before + k as u64);
        assert_eq!(time.executable, list.executable);
        assert_eq!(time.steps_ns.len(), list.steps.len());
        for (step, ns) in list.steps.iter().zip(&time.steps_ns) {
            assert_eq!(ns.is_some(), step.kind == StepKind::Dispatch, "{step:?}");
        }
        let longest = time
            .steps_ns
            .iter()
            .flatten()
            .fold(0.0f64, |a, &b| a.max(b));
        assert!(time.total_ns >= longest, "{time:?}");
    }
    // Times are read once; untimed calls add none.
    gpu.set_gpu_timing(false);
    f.call(&Array::ones(&[256], DType::F32)).unwrap();
    assert!(pollster::block_on(gpu.take_gpu_times()).unwrap().is_empty());
    assert_eq!(gpu.gpu_calls_timed(), before + 2);
}
