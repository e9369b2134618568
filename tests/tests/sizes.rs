//! Sizes that overflow or exceed the default limits are `Err`s naming the
//! op and the shape, eager and compiled, and leave the cache clean.

use kiln::random::Key;
use kiln::{compile, Array, DType, Error, Shape};

/// Asserts `result` is an `Err` whose text holds every fragment.
fn assert_err_mentions<T: std::fmt::Debug>(result: kiln::Result<T>, fragments: &[&str]) -> Error {
    let err = result.expect_err("an error");
    let text = err.to_string();
    for f in fragments {
        assert!(text.contains(f), "`{text}` does not mention `{f}`");
    }
    err
}

const HUGE: usize = usize::MAX / 2;

#[test]
fn constructors_with_overflowing_dims_name_the_constructor_and_shape() {
    for (name, array) in [
        ("zeros", Array::zeros(&[HUGE, 3], DType::F32)),
        ("ones", Array::ones(&[3, HUGE], DType::U8)),
        ("full", Array::full(&[HUGE, HUGE], 2.0, DType::BF16)),
    ] {
        let err = assert_err_mentions(array.check(), &[name, "too large", "overflows"]);
        assert!(matches!(err, Error::SizeOverflow { .. }), "{err}");
    }
    assert_err_mentions(
        Array::random_normal(Key::new(0), &[HUGE, 4], DType::F32),
        &["random_normal", "overflows"],
    );
    assert_err_mentions(
        Array::random_uniform(Key::new(0), &[4, HUGE], 0.0, 1.0, DType::F32),
        &["random_uniform", "overflows"],
    );
}

#[test]
fn constructors_above_the_array_limit_say_the_size_the_limit_and_how_to_raise_it() {
    let err = assert_err_mentions(
        Array::zeros(&[1 << 30, 1 << 30], DType::F32).check(),
        &[
            "`zeros`",
            "f32[1073741824,1073741824]",
            "4611686018427387904 bytes",
            "kiln::Limits::set",
            "max_array_bytes",
        ],
    );
    assert!(matches!(err, Error::LimitExceeded { .. }), "{err}");
}

#[test]
fn an_empty_array_with_an_absurd_dim_is_rejected_like_numpy() {
    assert_err_mentions(
        Array::zeros(&[0, usize::MAX], DType::F32).check(),
        &["zeros", "overflows"],
    );
    let empty = Array::zeros(&[0, 1 << 20], DType::F32);
    assert_eq!(empty.to_vec::<f32>().unwrap(), Vec::<f32>::new());
}

#[test]
fn arange_with_an_absurd_length_is_an_error() {
    assert_err_mentions(
        Array::arange(0.0, 1e300, 1.0, DType::F32),
        &["arange", "overflows"],
    );
    assert_err_mentions(
        Array::arange(-1e308, 1e308, 1e-300, DType::F32),
        &["arange", "overflows"],
    );
    assert_err_mentions(
        Array::arange(0.0, 1e17, 1.0, DType::I32),
        &["arange", "i32[100000000000000000]", "max_array_bytes"],
    );
    assert_eq!(
        Array::arange(0.0, 3.0, 1.0, DType::I32)
            .unwrap()
            .to_vec::<i32>()
            .unwrap(),
        vec![0, 1, 2]
    );
}

#[test]
fn from_vec_with_an_overflowing_shape_is_an_error_not_a_panic() {
    assert_err_mentions(
        Array::from_vec(Vec::<f32>::new(), &[HUGE, 4, 0]),
        &["from_vec", "overflows"],
    );
}

#[test]
fn broadcast_to_an_absurd_shape_is_an_error_eager_and_compiled() {
    let x = Array::ones(&[1, 1], DType::F32);
    assert_err_mentions(
        x.broadcast_to([HUGE, HUGE]).check(),
        &["broadcast_to", "overflows"],
    );
    assert_err_mentions(
        x.broadcast_to([1 << 30, 1 << 30]).eval(),
        &[
            "broadcast_to",
            "f32[1073741824,1073741824]",
            "max_array_bytes",
        ],
    );
    let f = compile(|x: Array| x.broadcast_to([1 << 30, 1 << 30]).sum_all());
    assert_err_mentions(f.call(&x), &["broadcast_to", "max_array_bytes"]);
    assert_eq!(f.cache().entries, 0);
    let ok = compile(|x: Array| x.broadcast_to([2, 3]).sum_all());
    assert_eq!(ok.call(&x).unwrap().item::<f32>().unwrap(), 6.0);
}

#[test]
fn reshape_to_sizes_whose_product_overflows_is_an_error() {
    let x = Array::ones(&[4], DType::F32);
    assert_err_mentions(
        x.reshape(&[i64::MAX, i64::MAX]).check(),
        &["reshape", "f32[4]"],
    );
    assert_err_mentions(
        x.reshape(&[-1, i64::MAX, 4]).check(),
        &["reshape", "cannot infer -1"],
    );
    assert_err_mentions(x.reshape_to(Shape::known(&[HUGE, 8])).check(), &["reshape"]);
}

#[test]
fn a_shapeless_call_whose_resolved_shape_is_too_large_fails_at_call_time() {
    // An outer product by broadcasting: its size is known only per call.
    let outer = compile(|(a, b): (Array, Array)| (&a * &b).sum_all()).shapeless();
    let column = |n: usize| Array::ones(&[n, 1], DType::F32);
    let row = |n: usize| Array::ones(&[1, n], DType::F32);
    assert_eq!(
        outer
            .call(&(column(3), row(4)))
            .unwrap()
            .item::<f32>()
            .unwrap(),
        12.0
    );
    assert_err_mentions(
        outer.call(&(column(1 << 18), row(1 << 18))),
        &["mul", "f32[262144,262144]", "max_array_bytes"],
    );
    assert_eq!(
        outer
            .call(&(column(2), row(5)))
            .unwrap()
            .item::<f32>()
            .unwrap(),
        10.0
    );
    assert_eq!(outer.cache().entries, 1);
}

#[test]
fn a_failed_array_passes_its_first_error_through_every_later_op() {
    let failed = Array::ones(&[2, 3], DType::F32) + Array::ones(&[4], DType::F32);
    let vector = Array::ones(&[3], DType::F32);
    let indices = Array::from_vec(vec![0i32], &[1]).unwrap();
    let later: Vec<(&str, Array)> = vec![
        ("sum", failed.sum(&[1], false)),
        ("sum_all", failed.sum_all()),
        ("mean", failed.mean(&[0], true)),
        ("max", failed.max(&[-1], false)),
        ("min", failed.min(&[1], false)),
        ("argmax", failed.argmax(1, false)),
        ("squeeze", failed.squeeze(&[0])),
        ("squeeze all", failed.squeeze(&[])),
        ("expand_dims", failed.expand_dims(3)),
        ("slice", failed.slice_axis(2, 0, None, 1)),
        ("swap_axes", failed.swap_axes(0, 5)),
        ("take", failed.take(&indices, 3)),
        ("take indices", vector.take(&failed, 0)),
        ("concat", kiln::concat(&[vector.clone(), failed.clone()], 1)),
        ("matmul lhs", failed.matmul(&vector)),
        ("matmul rhs", vector.matmul(&failed)),
        ("reshape", failed.reshape(&[-1, 5])),
        ("transpose", failed.transpose()),
        ("exp", failed.exp()),
        ("chain", failed.exp().sum(&[1], false).argmax(0, true)),
    ];
    for (what, array) in later {
        let err = array.check().expect_err(what);
        assert!(
            matches!(&err, Error::Shape { op, operands, .. } if op == "add" && operands == "f32[2,3], f32[4]"),
            "{what}: {err}"
        );
    }
}

#[test]
fn a_failed_array_returned_from_compile_reports_the_first_error() {
    let f = compile(|x: Array| (&x + Array::ones(&[4], DType::F32)).sum(&[1], false));
    let err = assert_err_mentions(
        f.call(&Array::ones(&[2, 3], DType::F32)),
        &["add", "f32[2,3]", "f32[4]"],
    );
    assert!(matches!(err, Error::Shape { .. }), "{err}");
    assert_eq!(f.cache().entries, 0);
}

#[test]
fn a_shapeless_slice_with_an_absurd_negative_start_is_an_error_not_a_panic() {
    // `-k:` on a symbolic dim has the known size ceil(k / step): here about
    // 1.8e18 elements, beyond the array limit before any call.
    let f = compile(|x: Array| x.slice_axis(0, -i64::MAX, None, 5)).shapeless();
    assert_err_mentions(
        f.call(&Array::ones(&[2, 3], DType::F32)),
        &["slice", "with every symbol 1", "max_array_bytes"],
    );
    assert_eq!(f.cache().entries, 0);
}

#[test]
fn a_shapeless_outer_product_whose_traced_size_overflows_is_an_error_not_a_panic() {
    // Planning sizes the slots for the traced call: 2^66 elements.
    let f = compile(|(a, b, c): (Array, Array, Array)| (&a * &b * &c).sum_all()).shapeless();
    let n = 1 << 22;
    let args = (
        Array::zeros(&[n, 1, 1], DType::F32),
        Array::zeros(&[1, n, 1], DType::F32),
        Array::zeros(&[1, 1, n], DType::F32),
    );
    assert_err_mentions(
        f.call(&args),
        &["mul", "f32[4194304,4194304,1]", "max_array_bytes"],
    );
    let small = (
        Array::ones(&[2, 1, 1], DType::F32),
        Array::ones(&[1, 3, 1], DType::F32),
        Array::ones(&[1, 1, 4], DType::F32),
    );
    assert_eq!(f.call(&small).unwrap().item::<f32>().unwrap(), 24.0);
}
