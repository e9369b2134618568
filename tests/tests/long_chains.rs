//! Programs as long as users can type them: a 100,000-op chain works eagerly,
//! compiled, compiled shapeless and on wgpu, and no symbolic dim nests
//! without a bound. Each case runs in a child process, so a stack overflow
//! fails its test instead of killing the test binary.

use kiln::{compile, Array, DType, Error};
use kiln_tests::isolate::in_child_process;

const CHAIN: usize = 100_000;

/// `x` through `n` cheap elementwise ops whose result is known: each pair
/// adds 1 and subtracts 1, so the chain returns `x + (n % 2)`.
fn chain(x: &Array, n: usize) -> Array {
    (0..n).fold(
        x.clone(),
        |acc, i| if i % 2 == 0 { acc + 1.0 } else { acc - 1.0 },
    )
}

#[test]
fn a_100000_op_chain_evaluates_eagerly() {
    in_child_process("a_100000_op_chain_evaluates_eagerly", || {
        let x = Array::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap();
        let y = chain(&x, CHAIN + 1);
        assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0]);
    });
}

#[test]
fn a_100000_op_chain_compiles_and_runs_static_and_shapeless() {
    in_child_process(
        "a_100000_op_chain_compiles_and_runs_static_and_shapeless",
        || {
            let x = Array::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap();
            let f = compile(|x: Array| chain(&x, CHAIN + 1));
            assert_eq!(
                f.call(&x).unwrap().to_vec::<f32>().unwrap(),
                vec![2.0, 3.0, 4.0]
            );
            let unfused = compile(|x: Array| chain(&x, CHAIN)).fusion(false);
            assert_eq!(
                unfused.call(&x).unwrap().to_vec::<f32>().unwrap(),
                vec![1.0, 2.0, 3.0]
            );
            let g = compile(|x: Array| chain(&x, CHAIN)).shapeless();
            let x5 = Array::ones(&[5], DType::F32);
            assert_eq!(g.call(&x5).unwrap().to_vec::<f32>().unwrap(), vec![1.0; 5]);
            assert_eq!(
                g.call(&x).unwrap().to_vec::<f32>().unwrap(),
                vec![1.0, 2.0, 3.0]
            );
            assert_eq!(g.cache().entries, 1);
        },
    );
}

#[test]
fn a_100000_slice_chain_on_a_symbolic_dim_keeps_its_size_one_level_deep() {
    in_child_process(
        "a_100000_slice_chain_on_a_symbolic_dim_keeps_its_size_one_level_deep",
        || {
            // Each `1::2` makes floor((d - 1 + 1)/2) of the last size; the
            // divisions flatten into one instead of nesting per op.
            let halve = |x: Array, n: usize| (0..n).fold(x, |acc, _| acc.slice_axis(0, 1, None, 2));
            let f = compile(move |x: Array| halve(x, CHAIN).sum_all()).shapeless();
            assert_eq!(
                f.call(&Array::ones(&[7], DType::F32))
                    .unwrap()
                    .item::<f32>()
                    .unwrap(),
                0.0
            );
            let g = compile(move |x: Array| halve(x, 3).sum_all()).shapeless();
            assert_eq!(
                g.call(&Array::ones(&[17], DType::F32))
                    .unwrap()
                    .item::<f32>()
                    .unwrap(),
                2.0
            );
            assert_eq!(
                g.call(&Array::ones(&[9], DType::F32))
                    .unwrap()
                    .item::<f32>()
                    .unwrap(),
                1.0
            );
        },
    );
}

#[test]
fn symbolic_dims_that_would_nest_without_bound_are_an_error() {
    in_child_process(
        "symbolic_dims_that_would_nest_without_bound_are_an_error",
        || {
            // Halving, then multiplying by another symbol, cannot flatten: the
            // size floor(floor(s0/2)·s1/2)… nests one level per round.
            let f = compile(|(x, y): (Array, Array)| {
                (0..40).fold(x, |acc, _| {
                    let half = acc.slice_axis(0, 1, None, 2);
                    (half.expand_dims(1) * y.expand_dims(0)).reshape(&[-1])
                })
            })
            .shapeless();
            let ones = |n: usize| Array::ones(&[n], DType::F32);
            let err = f.call(&(ones(8), ones(2))).unwrap_err();
            assert!(
                matches!(&err, Error::InvalidArgument { detail, .. } if detail.contains("nests more than 16")),
                "{err}"
            );
            assert_eq!(f.cache().entries, 0);
        },
    );
}

#[test]
fn a_10000_op_chain_runs_on_wgpu() {
    in_child_process("a_10000_op_chain_runs_on_wgpu", || {
        let Some(gpu) = kiln_tests::gpu::backend() else {
            return;
        };
        let x = Array::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
        let f = compile(|x: Array| chain(&x, 10_001)).with_backend(gpu);
        let y = f.call(&x).unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0, 5.0]);
    });
}
