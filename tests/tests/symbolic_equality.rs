//! Symbolic dims that a guard has made equal compare equal everywhere a
//! shapeless trace checks shapes (issue 25, part 1): custom-op vjps,
//! straight-through implicit values, pullbacks and the planner.

use kiln::implicit::{AffineQuantized, ImplicitArray};
use kiln::random::Key;
use kiln::{compile, grad, Array, CustomOp, DType, Tree};
use kiln_tests::programs::{cases, instr, make_inputs, run, Instr};
use proptest::prelude::*;

fn normal(seed: u64, shape: &[usize]) -> Array {
    Array::random_normal(Key::new(seed), shape, DType::F32).unwrap()
}

fn max_difference(a: &Array, b: &Array) -> f32 {
    let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// `x · y` elementwise with the textbook vjp `(g·y, g·x)`.
fn product_op() -> CustomOp<(Array, Array)> {
    CustomOp::new("product", |(x, y): &(Array, Array)| Ok(x * y))
        .with_vjp(|(x, y): &(Array, Array), _out: &Array, g: &Array| Ok((Some(g * y), Some(g * x))))
}

#[test]
fn a_custom_op_over_two_same_length_operands_differentiates_under_shapeless_compile() {
    let op = product_op();
    let loss = move |(x, y): (Array, Array)| op.call(&(x, y)).sum_all();
    let f = compile(grad(loss)).shapeless();
    for n in [3, 8, 17] {
        let (x, y) = (normal(n as u64, &[n]), normal(100 + n as u64, &[n]));
        let (dx, dy) = f.call(&(x.clone(), y.clone())).unwrap();
        assert!(max_difference(&dx, &y) == 0.0);
        assert!(max_difference(&dy, &x) == 0.0);
    }
    assert_eq!(f.cache().misses, 1, "one trace for every length");
}

#[derive(Tree, Clone)]
struct Dense {
    x: Array,
    w: Array,
}

#[test]
fn a_struct_argument_op_whose_cotangent_is_g_times_w_transposed_differentiates_under_shapeless() {
    let op = CustomOp::new("dense", |d: &Dense| Ok(d.x.matmul(&d.w))).with_vjp(
        |d: &Dense, _out: &Array, g: &Array| {
            Ok(Dense {
                x: g.matmul(&d.w.transpose()),
                w: d.x.transpose().matmul(g),
            })
        },
    );
    let loss = move |d: Dense| op.call(&d).tanh().sum_all();
    let f = compile(grad(loss.clone())).shapeless();
    for (b, k, n) in [(2, 3, 4), (5, 7, 2), (9, 4, 6)] {
        let d = Dense {
            x: normal(b as u64, &[b, k]),
            w: normal(50 + k as u64, &[k, n]),
        };
        let got = f.call(&d).unwrap();
        let want = grad(loss.clone()).call(&d).unwrap();
        assert!(max_difference(&got.x, &want.x) < 1e-5);
        assert!(max_difference(&got.w, &want.w) < 1e-5);
    }
    assert_eq!(f.cache().misses, 1);
}

#[test]
fn a_straight_through_step_over_an_affine_quantized_weight_runs_under_shapeless_compile() {
    // Quantization-aware training: the forward uses the 4-bit weight, the
    // gradient reaches the master copy unchanged.
    let loss = |(x, master): (Array, Array)| {
        let q = AffineQuantized::quantize(&master, 4, 32).straight_through(&master);
        x.matmul(&q).tanh().sum_all()
    };
    let f = compile(grad(loss)).shapeless();
    for (rows, batch) in [(32, 2), (64, 3), (96, 5)] {
        let x = normal(batch as u64, &[batch, rows]);
        let master = normal(7 + rows as u64, &[rows, 8]);
        let (_, got) = f.call(&(x.clone(), master.clone())).unwrap();
        let (_, want) = grad(loss).call(&(x, master)).unwrap();
        assert!(max_difference(&got, &want) < 1e-5);
    }
    assert_eq!(f.cache().misses, 1);
}

/// A random program's result pushed through a custom op over two operands
/// of equal (differently named) symbolic shapes and a straight-through
/// 4-bit weight, summed: every check that compares shapes sees dims a
/// guard made equal.
fn loss_through_custom_op_and_implicit_weight(
    program: &[Instr],
    (xs, master): (Vec<Array>, Array),
) -> Array {
    let value = run(program, xs.clone()).swap_remove(0);
    let full = value.broadcast_to(xs[0].shape().clone());
    let product = product_op().call(&(full, xs[0].clone()));
    let weight = AffineQuantized::quantize(&master, 4, 32).straight_through(&master);
    product.matmul(&weight).tanh().sum_all()
}

fn values(tree: &(Vec<Array>, Array)) -> Vec<(String, Vec<f32>)> {
    tree.0
        .iter()
        .chain([&tree.1])
        .map(|a| (a.aval().to_string(), a.to_vec::<f32>().unwrap()))
        .collect()
}

/// Equal up to the rounding a different summation order may give (the
/// shaped and shapeless plans may fuse differently); NaN where NaN.
fn agree(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> bool {
    a.iter().zip(b).all(|((sa, va), (sb, vb))| {
        sa == sb
            && va.iter().zip(vb).all(|(x, y)| {
                (x.is_nan() && y.is_nan()) || (x - y).abs() <= 1e-4 * (1.0 + x.abs().max(y.abs()))
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(24)))]

    #[test]
    fn shapeless_grads_through_custom_ops_and_implicit_weights_equal_the_shaped_compile(
        program in prop::collection::vec(instr(), 1..10),
        seed in any::<u64>(),
    ) {
        let p1 = program.clone();
        let p2 = program;
        let shaped = compile(grad(move |args: (Vec<Array>, Array)| {
            loss_through_custom_op_and_implicit_weight(&p1, args)
        }));
        let shapeless = compile(grad(move |args: (Vec<Array>, Array)| {
            loss_through_custom_op_and_implicit_weight(&p2, args)
        }))
        .shapeless();
        for n in [32, 64, 96] {
            let args = (make_inputs(n, seed, DType::F32), normal(seed ^ n as u64, &[n, 8]));
            let want = values(&shaped.call(&args).expect("shaped call"));
            let got = values(&shapeless.call(&args).expect("shapeless call"));
            prop_assert!(agree(&got, &want), "shapeless != shaped at n={}:\n{:?}\n{:?}", n, got, want);
        }
        prop_assert_eq!(shapeless.cache().entries, 1, "shapeless retraced");
    }
}
