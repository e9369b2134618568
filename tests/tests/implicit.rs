//! Implicit arrays (seed eformer/jaximus): values that stand in for an
//! array, resolved op by op by registered handlers with precedence, and
//! materialized (with the forcing op recorded) where none matches; through
//! compile (structure and statics in the cache key), grad (including the
//! straight-through estimator) and shapeless compile.

use kiln::implicit::{register_handler, Handler, HandlerOperand, LowRank, OperandKind};
use kiln::random::Key;
use kiln::{compile, grad, Array, DType, Error, ImplicitArray, ImplicitDecision, MissReason, Tree};

fn normal(seed: u64, shape: &[usize]) -> Array {
    Array::random_normal(Key::new(seed), shape, DType::F32).unwrap()
}

fn low_rank(seed: u64) -> LowRank {
    LowRank {
        base: normal(seed, &[6, 5]),
        a: normal(seed + 1, &[6, 2]),
        b: normal(seed + 2, &[2, 5]),
    }
}

fn close(a: &Array, b: &Array, tolerance: f32) {
    let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= tolerance * (1.0 + y.abs()), "{x} vs {y}");
    }
}

#[test]
fn a_matmul_with_a_low_rank_weight_runs_through_its_handler_without_materializing() {
    let f = compile(|(x, w): (Array, LowRank)| x.matmul(&w.array()));
    let (x, w) = (normal(1, &[3, 6]), low_rank(10));
    let y = f.call(&(x.clone(), w.clone())).unwrap();
    close(&y, &x.matmul(&w.materialize().unwrap()), 1e-5);
    let report = f.cache().reports[0].clone();
    assert_eq!(report.materializations(), 0);
    assert_eq!(
        report.implicit,
        vec![ImplicitDecision::Handled {
            node: 5,
            op: "matmul".into(),
            operands: "dense, low_rank".into(),
            handler: "matmul_low_rank".into(),
        }]
    );
    // The [6, 5] update a·b is never formed: no node has its shape but the base.
    assert!(!report
        .nodes
        .iter()
        .any(|n| n.op == "add" && n.aval == "f32[6,5]"));
}

#[test]
fn an_op_without_a_handler_materializes_and_the_report_names_it() {
    let f = compile(|w: LowRank| w.array().exp().sum_all());
    let w = low_rank(20);
    let y = f.call(&w).unwrap();
    close(&y, &w.materialize().unwrap().exp().sum_all(), 1e-5);
    let report = f.cache().reports[0].clone();
    assert_eq!(report.materializations(), 1);
    match &report.implicit[0] {
        ImplicitDecision::Materialized {
            kind, forced_by, ..
        } => assert_eq!((kind.as_str(), forced_by.as_str()), ("low_rank", "exp")),
        other => panic!("expected a materialization, got {other:?}"),
    }
}

#[test]
fn an_implicit_value_returned_as_is_is_materialized_for_the_output() {
    let f = compile(|w: LowRank| w.array());
    let w = low_rank(30);
    close(&f.call(&w).unwrap(), &w.materialize().unwrap(), 1e-6);
    let report = f.cache().reports[0].clone();
    assert!(matches!(
        &report.implicit[..],
        [ImplicitDecision::Materialized { forced_by, consumer: None, .. }] if forced_by == "output"
    ));
}

/// `base * factor`: a test kind with a static, for handlers registered by
/// the tests.
#[derive(Tree, Clone, Debug)]
struct Scaled {
    base: Array,
    #[tree(static)]
    factor: f32,
}

impl ImplicitArray for Scaled {
    const KIND: &'static str = "scaled";
    fn materialize(&self) -> kiln::Result<Array> {
        Ok(&self.base * self.factor)
    }
}

fn scaled_operand(operands: &[HandlerOperand], k: usize) -> kiln::Result<Scaled> {
    operands[k]
        .implicit::<Scaled>()
        .ok_or(Error::InvalidArgument {
            op: "test handler".into(),
            detail: "expected a scaled operand".into(),
            at: None,
        })
}

#[test]
fn the_handler_of_highest_precedence_runs() {
    // `sub` of a dense and a scaled value: the low-precedence handler would
    // give a wrong answer, so the result shows which one ran.
    register_handler(Handler::new(
        "sub_scaled_wrong",
        "sub",
        [OperandKind::Dense, OperandKind::Implicit("scaled")],
        1,
        |_, _| Ok(Array::zeros(&[3], DType::F32)),
    ))
    .unwrap();
    register_handler(Handler::new(
        "sub_scaled",
        "sub",
        [OperandKind::Any, OperandKind::Implicit("scaled")],
        2,
        |_, operands| {
            let w = scaled_operand(operands, 1)?;
            let x = operands[0].dense().cloned().ok_or(Error::InvalidArgument {
                op: "sub".into(),
                detail: "dense first operand".into(),
                at: None,
            })?;
            Ok(x - &w.base * w.factor)
        },
    ))
    .unwrap();
    let f = compile(|(x, w): (Array, Scaled)| &x - &w.array());
    let w = Scaled {
        base: normal(40, &[3]),
        factor: 3.0,
    };
    let x = normal(41, &[3]);
    close(
        &f.call(&(x.clone(), w.clone())).unwrap(),
        &(&x - &w.base * 3.0),
        1e-6,
    );
    let report = f.cache().reports[0].clone();
    assert!(matches!(
        &report.implicit[..],
        [ImplicitDecision::Handled { handler, .. }] if handler == "sub_scaled"
    ));
    let again = register_handler(Handler::new("sub_scaled", "sub", [], 0, |_, _| {
        Ok(Array::zeros(&[1], DType::F32))
    }));
    assert!(again
        .unwrap_err()
        .to_string()
        .contains("already registered"));
}

#[test]
fn two_matching_handlers_at_equal_precedence_are_an_error_naming_both() {
    for name in ["maximum_scaled_one", "maximum_scaled_two"] {
        register_handler(Handler::new(
            name,
            "maximum",
            [OperandKind::Implicit("scaled"), OperandKind::Dense],
            7,
            |_, operands| Ok(scaled_operand(operands, 0)?.base),
        ))
        .unwrap();
    }
    let f = compile(|(w, x): (Scaled, Array)| w.array().maximum(&x));
    let w = Scaled {
        base: normal(50, &[4]),
        factor: 2.0,
    };
    let err = f.call(&(w, normal(51, &[4]))).unwrap_err().to_string();
    assert!(
        err.contains("maximum_scaled_one") && err.contains("maximum_scaled_two"),
        "{err}"
    );
    assert!(err.contains("precedence 7"), "{err}");
}

#[test]
fn a_handler_returning_the_wrong_aval_is_an_error_naming_it() {
    register_handler(Handler::new(
        "minimum_scaled_wrong_shape",
        "minimum",
        [OperandKind::Implicit("scaled"), OperandKind::Dense],
        0,
        |_, _| Ok(Array::zeros(&[2, 2], DType::F32)),
    ))
    .unwrap();
    let f = compile(|(w, x): (Scaled, Array)| w.array().minimum(&x));
    let w = Scaled {
        base: normal(52, &[4]),
        factor: 2.0,
    };
    let err = f.call(&(w, normal(53, &[4]))).unwrap_err().to_string();
    assert!(
        err.contains("minimum_scaled_wrong_shape") && err.contains("f32[2,2]"),
        "{err}"
    );
}

#[test]
fn an_implicit_statics_change_misses_the_cache_naming_its_path() {
    let f = compile(|(x, w): (Array, Scaled)| (&x * &w.array()).sum_all());
    let x = normal(60, &[4]);
    let w = |factor: f32| Scaled {
        base: normal(61, &[4]),
        factor,
    };
    f.call(&(x.clone(), w(2.0))).unwrap();
    f.call(&(x.clone(), w(2.0))).unwrap();
    let y = f.call(&(x.clone(), w(0.5))).unwrap();
    close(&y, &(&x * &(normal(61, &[4]) * 0.5)).sum_all(), 1e-5);
    let cache = f.cache();
    assert_eq!((cache.entries, cache.hits), (2, 1));
    assert_eq!(
        cache.last_miss().unwrap().reasons,
        vec![MissReason::Static {
            path: "args[1].factor".into(),
            before: "2.0".into(),
            now: "0.5".into(),
        }]
    );
}

#[test]
fn gradients_flow_into_float_leaves_through_the_materialization() {
    let x = normal(70, &[3, 6]);
    let loss = {
        let x = x.clone();
        move |w: LowRank| x.matmul(&w.array()).tanh().sum_all()
    };
    let w = low_rank(71);
    let g = grad(loss).call(&w).unwrap();
    let dense = {
        let x = x.clone();
        move |w: LowRank| x.matmul(&(&w.base + &w.a.matmul(&w.b))).tanh().sum_all()
    };
    let want = grad(dense).call(&w).unwrap();
    close(&g.base, &want.base, 1e-4);
    close(&g.a, &want.a, 1e-4);
    close(&g.b, &want.b, 1e-4);
}

#[test]
fn frozen_leaves_get_zero_gradients_when_only_the_adapter_trains() {
    let x = normal(72, &[3, 6]);
    let loss = move |w: LowRank| x.matmul(&w.array()).sum_all();
    let g = grad(loss)
        .wrt(["args.a", "args.b"])
        .call(&low_rank(73))
        .unwrap();
    assert!(g.base.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
    assert!(g.a.to_vec::<f32>().unwrap().iter().any(|&v| v != 0.0));
}

#[test]
fn the_straight_through_estimator_passes_the_gradient_to_the_master_copy() {
    // "Quantize" by truncating to a grid of 0.25: the implicit value holds the
    // codes and the step; its gradient goes straight to the master weights.
    let quantize = |w: &Array| Scaled {
        base: (w * 4.0).cast(DType::I32).cast(DType::F32),
        factor: 0.25,
    };
    let x = normal(80, &[2, 4]);
    let loss = {
        let x = x.clone();
        move |master: Array| {
            let q = quantize(&master).straight_through(&master);
            x.matmul(&q).tanh().sum_all()
        }
    };
    let master = normal(81, &[4, 3]);
    let g = grad(loss).call(&master).unwrap();
    // The gradient through the dequantized weight, taken as a constant.
    let dequantized = quantize(&master).materialize().unwrap();
    let want = grad(move |w: Array| x.matmul(&w).tanh().sum_all())
        .call(&dequantized)
        .unwrap();
    close(&g, &want, 1e-5);
    let err = grad(|m: Array| quantize(&m).straight_through(&m.reshape(&[12])).sum_all())
        .call(&master)
        .unwrap_err()
        .to_string();
    assert!(err.contains("master copy is f32[12]"), "{err}");
}

#[test]
fn a_shapeless_compile_with_implicit_weights_traces_once() {
    let f = compile(|(x, w): (Array, LowRank)| x.matmul(&w.array()).relu()).shapeless();
    let w = low_rank(90);
    for batch in [2, 5, 33] {
        let x = normal(batch as u64, &[batch, 6]);
        let y = f.call(&(x.clone(), w.clone())).unwrap();
        assert_eq!(y.dims().unwrap(), vec![batch, 5]);
        close(&y, &x.matmul(&w.materialize().unwrap()).relu(), 1e-5);
    }
    assert_eq!(f.cache().misses, 1);
    assert_eq!(f.cache().reports[0].materializations(), 0);
}

/// A kind whose materialization fails for its leaves.
#[derive(Tree, Clone)]
struct Broken {
    base: Array,
}

impl ImplicitArray for Broken {
    const KIND: &'static str = "broken";
    fn materialize(&self) -> kiln::Result<Array> {
        Ok(self.base.reshape(&[7]))
    }
}

#[test]
fn a_materialization_that_fails_is_an_error_not_filler() {
    let value = Broken {
        base: normal(100, &[2, 3]),
    };
    let err = value.array().exp().eval().unwrap_err().to_string();
    assert!(err.contains("reshape"), "{err}");
    let f = compile(|b: Broken| b.array().sum_all());
    assert!(f.call(&value).is_err());
}

#[test]
fn eager_ops_on_implicit_values_go_through_the_same_lowering() {
    let (x, w) = (normal(110, &[2, 6]), low_rank(111));
    close(
        &x.matmul(&w.array()),
        &x.matmul(&w.materialize().unwrap()),
        1e-5,
    );
}

mod quantized {
    use super::*;
    use kiln::implicit::{AffineQuantized, Int8, Nf4};

    #[test]
    fn x_at_an_nf4_weight_runs_the_quantized_kernel_and_materializes_nothing() {
        let (x, w) = (normal(200, &[3, 128]), normal(201, &[128, 16]) * 0.1);
        let q = Nf4::quantize(&w);
        let f = compile(|(x, w): (Array, Nf4)| x.matmul(&w.array()));
        let y = f.call(&(x.clone(), q.clone())).unwrap();
        close(&y, &x.matmul(&q.materialize().unwrap()), 1e-4);
        let report = f.cache().reports[0].clone();
        assert_eq!(report.materializations(), 0);
        assert!(matches!(
            &report.implicit[..],
            [ImplicitDecision::Handled { handler, .. }] if handler == "matmul_nf4"
        ));
        // Quantized: 4 bits a value plus one f32 scale per 64 (vs 32 bits).
        assert_eq!(q.bytes(), 128 * 16 / 2 + 16 * 2 * 4);
        if let Some(gpu) = kiln_tests::gpu::backend() {
            let on_gpu = compile(|(x, w): (Array, Nf4)| x.matmul(&w.array())).with_backend(gpu);
            close(&on_gpu.call(&(x.clone(), q)).unwrap(), &y, 1e-4);
        }
    }

    #[test]
    fn affine_and_int8_weights_match_their_dequantized_products() {
        let (x, w) = (normal(210, &[5, 64]), normal(211, &[64, 8]));
        let affine = AffineQuantized::quantize(&w, 4, 32);
        let f = compile(|(x, w): (Array, AffineQuantized)| x.matmul(&w.array()));
        let y = f.call(&(x.clone(), affine.clone())).unwrap();
        close(&y, &x.matmul(&affine.materialize().unwrap()), 1e-4);
        assert_eq!(f.cache().reports[0].materializations(), 0);
        // Another bit width is another format (and wider codes): a miss
        // naming both.
        f.call(&(x.clone(), AffineQuantized::quantize(&w, 8, 32)))
            .unwrap();
        let reasons = f.cache().last_miss().unwrap().reasons.clone();
        assert!(
            matches!(&reasons[..], [MissReason::Static { path, .. }, MissReason::Aval { path: codes, .. }]
                if path == "args[1].format" && codes == "args[1].packed"),
            "{reasons:?}"
        );
        let int8 = Int8::quantize(&w);
        let g = compile(|(x, w): (Array, Int8)| x.matmul(&w.array()));
        close(
            &g.call(&(x.clone(), int8.clone())).unwrap(),
            &x.matmul(&int8.materialize().unwrap()),
            1e-4,
        );
        // The quantization itself stays within half a step of each weight.
        let dequantized = int8.materialize().unwrap().to_vec::<f32>().unwrap();
        let original = w.to_vec::<f32>().unwrap();
        let worst = original
            .iter()
            .zip(&dequantized)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(worst < 0.05, "{worst}");
    }

    #[test]
    fn a_shapeless_quantized_layer_traces_once_for_every_batch() {
        let q = Nf4::quantize(&normal(220, &[64, 8]));
        let f = compile(|(x, w): (Array, Nf4)| x.matmul(&w.array()).relu()).shapeless();
        for batch in [2, 7, 40] {
            let x = normal(batch as u64, &[batch, 64]);
            let y = f.call(&(x.clone(), q.clone())).unwrap();
            assert_eq!(y.dims().unwrap(), vec![batch, 8]);
            close(&y, &x.matmul(&q.materialize().unwrap()).relu(), 1e-4);
        }
        assert_eq!(f.cache().misses, 1);
        assert_eq!(f.cache().reports[0].materializations(), 0);
    }

    #[test]
    fn straight_through_nf4_gives_the_gradient_through_the_dequantized_weight() {
        let x = normal(230, &[4, 64]);
        let loss = {
            let x = x.clone();
            move |master: Array| {
                let q = Nf4::quantize(&master).straight_through(&master);
                x.matmul(&q).tanh().sum_all()
            }
        };
        let master = normal(231, &[64, 8]) * 0.2;
        let g = grad(loss).call(&master).unwrap();
        let dequantized = Nf4::quantize(&master).materialize().unwrap();
        let want = grad(move |w: Array| x.matmul(&w).tanh().sum_all())
            .call(&dequantized)
            .unwrap();
        close(&g, &want, 1e-4);
    }
}

/// The README's example of a handler (section "Implicit arrays"), as it is
/// written there.
#[test]
fn the_readme_handler_multiplies_by_the_base_and_never_scales_the_weight() {
    register_handler(Handler::new(
        "matmul_scaled",
        "matmul",
        [OperandKind::Dense, OperandKind::Implicit("scaled")],
        1,
        |_, operands| {
            let x = operands[0].dense().cloned();
            let w = operands[1].implicit::<Scaled>();
            match (x, w) {
                (Some(x), Some(w)) => Ok(x.matmul(&w.base) * w.factor),
                _ => Err(Error::InvalidArgument {
                    op: "matmul".into(),
                    detail: "expected x @ scaled".into(),
                    at: None,
                }),
            }
        },
    ))
    .unwrap();
    let f = compile(|(x, w): (Array, Scaled)| x.matmul(&w.array()));
    let (x, base) = (normal(40, &[3, 4]), normal(41, &[4, 5]));
    let w = Scaled {
        base: base.clone(),
        factor: 0.5,
    };
    let y = f.call(&(x.clone(), w)).unwrap();
    close(&y, &(x.matmul(&base) * 0.5), 1e-5);
    let report = f.cache().reports[0].clone();
    assert_eq!(report.materializations(), 0);
    assert!(matches!(
        &report.implicit[..],
        [ImplicitDecision::Handled { handler, .. }] if handler == "matmul_scaled"
    ));
}
