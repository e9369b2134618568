use kiln::{Array, DType};
use kiln_tests::conformance::check_against_cpu;

#[test]
fn smoke() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    eprintln!("{}", gpu.adapter());
    let x = Array::from_vec(
        (0..24).map(|i| i as f32 * 0.1 - 1.0).collect::<Vec<f32>>(),
        &[2, 3, 4],
    )
    .unwrap();
    let y = Array::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
    let progs: Vec<kiln_tests::conformance::Program> = vec![
        |a| vec![a[0].exp()],
        |a| vec![&a[0] + &a[1]],
        |a| vec![(a[0].tanh() * &a[1]).sigmoid() + 1.0],
        |a| vec![a[0].sum(&[1], false)],
        |a| vec![a[0].max(&[0, 2], true)],
        |a| vec![a[0].argmax(2, false)],
        |a| vec![a[0].permute(&[2, 0, 1])],
        |a| vec![a[0].matmul(&a[0].permute(&[0, 2, 1]))],
        |a| vec![a[0].cast(DType::F16).exp()],
        |a| vec![a[0].cast(DType::BF16).sum(&[2], false)],
        |a| vec![a[0].cast(DType::I32)],
        |a| vec![a[0].greater(0.0)],
        |a| vec![kiln::concat(&[a[0].clone(), a[0].clone()], 1)],
        |a| vec![a[0].slice_axis(2, 1, None, 2)],
        |a| vec![a[0].reshape(&[6, 4]), a[0].clone()],
    ];
    for (i, p) in progs.into_iter().enumerate() {
        for fusion in [false, true] {
            if let Err(e) = check_against_cpu(gpu.clone(), p, &[x.clone(), y.clone()], fusion) {
                panic!("program {i} fusion {fusion}: {e}");
            }
        }
    }
}
