//! The eager cache, alone in its own test binary so no other test moves its
//! process-wide counters.

use kiln::Array;

fn arr(values: &[f32], shape: &[usize]) -> Array {
    Array::from_slice(values, shape).expect("test data matches its shape")
}

#[test]
fn eager_eval_reuses_the_executable_for_the_same_structure() {
    let run = |v: f32| {
        (arr(&[v, v], &[2]).exp().sin() * 3.5 + 0.25)
            .tanh()
            .to_vec::<f32>()
            .unwrap()
    };
    run(1.0);
    let before = kiln::eval_cache_stats();
    let y = run(2.0);
    let after = kiln::eval_cache_stats();
    assert_eq!(
        (after.hits, after.misses),
        (before.hits + 1, before.misses),
        "{before:?} → {after:?}"
    );
    assert!((y[0] - ((2f32.exp().sin() * 3.5 + 0.25).tanh())).abs() < 1e-6);
}
