//! Property tests over random op DAGs: compiled == eager, shapeless ==
//! static, and fused == op by op, for f32 and f16. Case count: `KILN_CASES` (CI default 500).

use kiln::{compile, Array, DType};
use kiln_tests::programs::{cases, instr, make_inputs, run, Instr};
use proptest::prelude::*;

fn bits(a: &Array) -> (String, Vec<u64>) {
    let data = a.data().expect("evaluates");
    (
        a.aval().to_string(),
        data.to_f64_vec()
            .into_iter()
            .map(|v| if v.is_nan() { u64::MAX } else { v.to_bits() })
            .collect(),
    )
}

fn check(program: Vec<Instr>, seed: u64, dtype: DType) -> Result<(), TestCaseError> {
    let p1 = program.clone();
    let p2 = program.clone();
    let p3 = program.clone();
    let compiled = compile(move |xs: Vec<Array>| run(&p1, xs));
    let shapeless = compile(move |xs: Vec<Array>| run(&p2, xs)).shapeless();
    // Op by op, no fusion: the oracle for fused execution (eager fuses too).
    let unfused = compile(move |xs: Vec<Array>| run(&p3, xs)).fusion(false);
    for n in [3, 5, 37] {
        let inputs = make_inputs(n, seed, dtype);
        let eager: Vec<_> = run(&program, inputs.clone()).iter().map(bits).collect();
        let reference: Vec<_> = unfused
            .call(&inputs)
            .expect("unfused call")
            .iter()
            .map(bits)
            .collect();
        prop_assert_eq!(&reference, &eager, "fused eager != op-by-op at n={}", n);
        let got: Vec<_> = compiled
            .call(&inputs)
            .expect("compiled call")
            .iter()
            .map(bits)
            .collect();
        prop_assert_eq!(&got, &eager, "compiled != eager at n={}", n);
        let got: Vec<_> = shapeless
            .call(&inputs)
            .expect("shapeless call")
            .iter()
            .map(bits)
            .collect();
        prop_assert_eq!(&got, &eager, "shapeless != eager at n={}", n);
    }
    prop_assert_eq!(shapeless.cache().entries, 1, "shapeless retraced");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(500)))]

    #[test]
    fn compiled_and_shapeless_equal_eager_f32(program in prop::collection::vec(instr(), 1..14), seed in any::<u64>()) {
        check(program, seed, DType::F32)?;
    }

    #[test]
    fn compiled_and_shapeless_equal_eager_f16(program in prop::collection::vec(instr(), 1..14), seed in any::<u64>()) {
        check(program, seed, DType::F16)?;
    }
}
