//! A lost device is reported by every later call, naming the adapter (its
//! own test binary: it destroys the device it opens).

use kiln::{compile, Array, Backend};

#[test]
fn calls_after_the_device_is_lost_return_an_error_saying_so() {
    if kiln_tests::gpu::backend().is_none() {
        return;
    }
    let gpu = kiln_wgpu::WgpuBackend::new().expect("a second device on the same adapter");
    let f = compile(|x: Array| x.exp()).with_backend(gpu.clone());
    let x = Array::from_vec(vec![0.0f32, 1.0], &[2]).expect("2 values");
    assert_eq!(
        f.call(&x).expect("before").to_vec::<f32>().expect("f32")[0],
        1.0
    );
    gpu.destroy();
    for attempt in 0..2 {
        let err = f.call(&x).expect_err("the device is gone");
        let message = err.to_string();
        assert!(
            message.contains("lost") && message.contains(gpu.name()),
            "attempt {attempt}: {message}"
        );
    }
}
