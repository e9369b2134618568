//! The default device with the wgpu backend (lavapipe in CI): eager ops
//! run on it and their results stay there until read, compiled calls on
//! an [`AnyBackend`] take such values where they are, `eval_async` reads
//! them back, and every value equals the CPU executor's.

use kiln::{
    compile, default_device, eval_async, with_default_device, AnyBackend, Array, CpuBackend, DType,
};
use std::sync::Arc;

fn close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{got:?} vs {want:?}"
        );
    }
}

fn eager_program() -> Array {
    let x = Array::arange(0.0, 12.0, 1.0, DType::F32)
        .expect("arange")
        .reshape(&[3, 4]);
    ((x.clone() * 0.25).tanh() + x.exp().sum(&[1], true)).sum(&[0], false)
}

#[test]
fn eager_ops_run_on_the_default_device_and_stay_there_until_read() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let want = eager_program().to_vec::<f32>().expect("cpu");
    let name = kiln::Backend::name(&gpu).to_string();
    let y = with_default_device(Arc::new(gpu), || {
        let y = eager_program();
        y.eval().expect("runs on the gpu");
        y
    });
    assert_eq!(y.device_name(), Some(name.as_str()));
    assert!(!y.is_materialized());
    // Read back after the default went back to the CPU: from its own device.
    assert_eq!(default_device().name(), "cpu");
    close(&y.to_vec::<f32>().expect("read back"), &want);
    assert_eq!(y.device_name(), None);
}

#[test]
fn eval_async_reads_every_kept_value_back() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let want = eager_program().to_vec::<f32>().expect("cpu");
    let y = with_default_device(Arc::new(gpu), eager_program);
    pollster::block_on(eval_async(std::slice::from_ref(&y))).expect("evaluates and reads");
    assert!(y.is_materialized());
    close(&y.to_vec::<f32>().expect("host data"), &want);
}

#[test]
fn deferred_compiled_calls_chain_on_the_device_with_eager_ops_between() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let step = |x: Array| (x.clone() * 0.5).sin() + x;
    let cpu = compile(step);
    let mut want = Array::ones(&[8], DType::F32);
    for _ in 0..3 {
        want = cpu.call(&(want * 1.5)).expect("cpu step");
    }
    let name = kiln::Backend::name(&gpu).to_string();
    let got = with_default_device(Arc::new(gpu), || {
        let f = compile(step).with_backend(AnyBackend::default_device());
        let mut x = Array::ones(&[8], DType::F32);
        for _ in 0..3 {
            x = f.call_deferred(x * 1.5).expect("gpu step");
            assert_eq!(x.device_name(), Some(name.as_str()));
        }
        x
    });
    close(
        &got.to_vec::<f32>().expect("read back"),
        &want.to_vec::<f32>().expect("cpu"),
    );
}

#[test]
fn a_compiled_function_on_another_device_reads_a_kept_value_back_first() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let on_gpu = with_default_device(Arc::new(gpu), || {
        let y = Array::full(&[4], 3.0, DType::F32) * 2.0;
        y.eval().expect("runs");
        y
    });
    let f = compile(|x: Array| x + 1.0).with_backend(CpuBackend);
    let out = f.call(&on_gpu).expect("cpu call on a gpu value");
    assert_eq!(out.to_vec::<f32>().expect("f32"), vec![7.0; 4]);
}

#[test]
fn deferred_calls_on_the_cpu_give_host_data_at_once() {
    let f = compile(|x: Array| x * 3.0).with_backend(AnyBackend::new(Arc::new(CpuBackend)));
    let y = f
        .call_deferred(Array::ones(&[2], DType::F32))
        .expect("runs");
    assert!(y.is_materialized());
    assert_eq!(y.to_vec::<f32>().expect("f32"), vec![3.0, 3.0]);
}
