//! In-place evaluation (what a reinplaced node runs) gives the same bits as
//! the functional evaluation, for every elementwise op, dtype and operand
//! position, broadcasting included. Case count: `KILN_CASES` (CI default 2000,
//! capped at 256 here: each case sweeps every op and dtype).

use kiln::ops::{FusedArg, FusedKernel, FusedStep};
use kiln::{BinaryOp, DType, HostData, Op, UnaryOp};
use kiln_tests::conformance::bits;
use kiln_tests::programs::cases;
use proptest::prelude::*;
use std::sync::Arc;

fn data(dtype: DType, values: &[f64]) -> HostData {
    HostData::from_f64s(dtype, values.iter().copied())
}

/// `op` in place on every operand position that can hold the output,
/// compared with its functional evaluation.
fn check_in_place(op: &Op, operands: &[HostData], shapes: &[&[usize]], out_shape: &[usize]) {
    let refs: Vec<&HostData> = operands.iter().collect();
    let Ok(expected) = op.eval(&refs, shapes, out_shape) else {
        return;
    };
    let numel: usize = out_shape.iter().product();
    for target in 0..operands.len() {
        let fits = operands[target].dtype() == expected.dtype() && operands[target].len() == numel;
        if !fits {
            continue;
        }
        // Every position holding the same data reads the target (x op x).
        let same: Vec<bool> = operands
            .iter()
            .zip(shapes)
            .map(|(o, s)| *o == operands[target] && *s == shapes[target])
            .collect();
        let inputs: Vec<Option<&HostData>> = operands
            .iter()
            .zip(&same)
            .map(|(o, &same)| (!same).then_some(o))
            .collect();
        let mut buffer = operands[target].clone();
        op.eval_in_place(&inputs, shapes, out_shape, &mut buffer)
            .unwrap_or_else(|e| panic!("{op:?} in place of operand {target}: {e}"));
        assert_eq!(
            bits(&buffer),
            bits(&expected),
            "{op:?} in place of operand {target}"
        );
    }
}

fn values() -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(
        prop_oneof![(-4i32..5).prop_map(f64::from), -3.0f64..3.0],
        12,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(2000).min(256)))]

    #[test]
    fn binary_ops_in_place_equal_functional(a in values(), b in values()) {
        let layouts: [(&[usize], &[usize], &[usize]); 5] = [
            (&[3, 4], &[3, 4], &[3, 4]),
            (&[3, 4], &[4], &[3, 4]),
            (&[1, 4], &[3, 4], &[3, 4]),
            (&[3, 1], &[3, 4], &[3, 4]),
            (&[3, 4], &[1], &[3, 4]),
        ];
        for dtype in DType::ALL {
            for (sa, sb, out) in layouts {
                let na: usize = sa.iter().product();
                let nb: usize = sb.iter().product();
                let x = data(dtype, &a[..na]);
                let y = data(dtype, &b[..nb]);
                for op in BinaryOp::ALL {
                    check_in_place(&Op::Binary(op), &[x.clone(), y.clone()], &[sa, sb], out);
                    check_in_place(&Op::Binary(op), &[x.clone(), x.clone()], &[sa, sa], sa);
                }
            }
        }
    }

    #[test]
    fn unary_ops_and_where_in_place_equal_functional(a in values(), b in values(), c in prop::collection::vec(any::<bool>(), 12)) {
        for dtype in DType::ALL {
            let x = data(dtype, &a);
            for op in UnaryOp::ALL {
                check_in_place(&Op::Unary(op), std::slice::from_ref(&x), &[&[12]], &[12]);
            }
            let y = data(dtype, &b);
            let cond = HostData::Bool(c.clone());
            check_in_place(&Op::Select, &[cond.clone(), x.clone(), y], &[&[12], &[12], &[12]], &[12]);
            check_in_place(&Op::Select, &[cond, x.clone(), x], &[&[12], &[12], &[12]], &[12]);
        }
    }
}

/// `exp(a) * b + a` with `a` overwritten, across tiles and (large enough)
/// threads, with `b` full or a scalar.
#[test]
fn fused_group_in_place_over_many_tiles_equals_functional() {
    let kernel = FusedKernel::new(
        vec![
            FusedStep {
                op: Op::Unary(UnaryOp::Exp),
                args: vec![FusedArg::Input(0)],
            },
            FusedStep {
                op: Op::Binary(BinaryOp::Mul),
                args: vec![FusedArg::Step(0), FusedArg::Input(1)],
            },
            FusedStep {
                op: Op::Binary(BinaryOp::Add),
                args: vec![FusedArg::Step(1), FusedArg::Input(0)],
            },
        ],
        2,
    )
    .expect("kernel");
    let op = Op::Fused(Arc::new(kernel));
    for n in [1usize, 1000, 5000, 400_000] {
        let a: Vec<f64> = (0..n).map(|i| ((i % 97) as f64) / 32.0 - 1.5).collect();
        let b: Vec<f64> = (0..n).map(|i| ((i % 13) as f64) / 4.0).collect();
        let x = data(DType::F32, &a);
        check_in_place(&op, &[x.clone(), data(DType::F32, &b)], &[&[n], &[n]], &[n]);
        check_in_place(
            &op,
            &[x.clone(), data(DType::F32, &[0.5])],
            &[&[n], &[]],
            &[n],
        );
        check_in_place(&op, &[x.clone(), x], &[&[n], &[n]], &[n]);
        let h = data(DType::F16, &a);
        check_in_place(&op, &[h, data(DType::F16, &b)], &[&[n], &[n]], &[n]);
    }
}
