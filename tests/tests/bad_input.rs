//! Bad input is an `Err` naming the problem and where; the cache keeps no
//! broken entry and the next valid call works.

use kiln::{compile, concat, tree_unflatten, Array, DType, Error, Tree};

#[derive(Tree, Clone, Debug)]
struct Pair {
    a: Array,
    b: Array,
}

fn ones(shape: &[usize]) -> Array {
    Array::ones(shape, DType::F32)
}

/// Asserts `err` renders with every fragment.
fn assert_mentions(err: &Error, fragments: &[&str]) {
    let text = err.to_string();
    for f in fragments {
        assert!(text.contains(f), "`{text}` does not mention `{f}`");
    }
}

#[test]
fn unflatten_with_wrong_leaf_count_is_an_error() {
    let p = Pair {
        a: ones(&[1]),
        b: ones(&[1]),
    };
    let (leaves, def) = kiln::tree_flatten(&p).unwrap();
    assert_eq!(leaves.len(), 2);
    let err = tree_unflatten::<Pair>(&def, vec![ones(&[1])]).unwrap_err();
    assert!(matches!(err, Error::Tree { .. }), "{err}");
    let err = tree_unflatten::<Pair>(&def, vec![ones(&[1]), ones(&[1]), ones(&[1])]).unwrap_err();
    assert!(matches!(err, Error::Tree { .. }), "{err}");
}

#[test]
fn binary_shape_mismatch_names_op_and_both_shapes_and_leaves_cache_clean() {
    let f = compile(|p: Pair| &p.a + &p.b);
    let err = f
        .call(&Pair {
            a: ones(&[2, 3]),
            b: ones(&[4]),
        })
        .unwrap_err();
    assert_mentions(&err, &["add", "f32[2,3]", "f32[4]"]);
    assert_eq!(f.cache().entries, 0);
    let ok = f
        .call(&Pair {
            a: ones(&[2, 3]),
            b: ones(&[3]),
        })
        .unwrap();
    assert_eq!(ok.to_vec::<f32>().unwrap(), vec![2.0; 6]);
    assert_eq!(f.cache().entries, 1);
}

#[test]
fn matmul_inner_dim_mismatch_names_both_shapes() {
    let f = compile(|p: Pair| p.a.matmul(&p.b));
    let err = f
        .call(&Pair {
            a: ones(&[2, 3]),
            b: ones(&[4, 5]),
        })
        .unwrap_err();
    assert_mentions(&err, &["matmul", "f32[2,3]", "f32[4,5]"]);
    assert_eq!(f.cache().entries, 0);
    assert_eq!(
        f.call(&Pair {
            a: ones(&[2, 3]),
            b: ones(&[3, 5])
        })
        .unwrap()
        .dims(),
        Some(vec![2, 5])
    );
}

#[test]
fn concat_mismatch_names_op_and_shapes() {
    let err = concat(&[ones(&[2, 3]), ones(&[2, 4])], 0)
        .check()
        .unwrap_err();
    assert_mentions(&err, &["concat", "f32[2,3]", "f32[2,4]"]);
}

#[test]
fn reshape_to_wrong_size_names_shapes() {
    let err = ones(&[2, 3]).reshape(&[4, 2]).check().unwrap_err();
    assert_mentions(&err, &["reshape", "f32[2,3]", "[4,2]"]);
    let err = ones(&[2, 3]).reshape(&[-1, 4]).check().unwrap_err();
    assert_mentions(&err, &["reshape", "f32[2,3]"]);
}

#[test]
fn dtype_mismatch_is_an_error_naming_both_dtypes() {
    let f = compile(|p: Pair| &p.a * &p.b);
    let err = f
        .call(&Pair {
            a: ones(&[2]),
            b: Array::ones(&[2], DType::I32),
        })
        .unwrap_err();
    assert!(matches!(err, Error::DType { .. }), "{err}");
    assert_mentions(&err, &["mul", "f32", "i32"]);
    assert_eq!(f.cache().entries, 0);
}

#[test]
fn float_only_op_on_integers_is_a_dtype_error() {
    let err = Array::ones(&[2], DType::I32)
        .exp()
        .to_vec::<i32>()
        .unwrap_err();
    assert_mentions(&err, &["exp", "i32"]);
}

#[test]
fn errors_propagate_through_later_ops_unchanged() {
    let bad = ones(&[2]) + ones(&[3]);
    let later = (bad.exp() * 2.0).sum_all();
    assert_eq!(later.check().unwrap_err(), bad.check().unwrap_err());
}

#[test]
fn invalid_axis_is_an_error() {
    let err = ones(&[2, 2]).sum(&[2], false).check().unwrap_err();
    assert_mentions(&err, &["sum", "axis 2", "rank 2"]);
}

#[test]
fn reading_with_wrong_element_type_is_an_error() {
    let err = ones(&[2]).to_vec::<i32>().unwrap_err();
    assert!(matches!(err, Error::ReadBack { .. }), "{err}");
    assert!(ones(&[2]).item::<f32>().is_err());
}

#[test]
fn data_length_mismatch_is_an_error() {
    let err = Array::from_vec(vec![1.0f32; 5], &[2, 3]).unwrap_err();
    assert_eq!(
        err,
        Error::DataLength {
            shape: vec![2, 3],
            len: 5
        }
    );
}

#[test]
fn reading_a_tracer_inside_compile_is_an_error_not_a_panic() {
    let f = compile(|x: Array| {
        let err = x.to_vec::<f32>().unwrap_err();
        assert!(matches!(err, Error::ReadTracer { .. }));
        x
    });
    f.call(&ones(&[1])).unwrap();
}

#[test]
fn take_out_of_range_is_a_runtime_error_and_keeps_the_entry() {
    let f = compile(|(x, i): (Array, Array)| x.take(&i, 0));
    let x = Array::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap();
    let err = f
        .call(&(x.clone(), Array::from_vec(vec![7i32], &[1]).unwrap()))
        .unwrap_err();
    assert_mentions(&err, &["take", "7"]);
    let y = f
        .call(&(x.clone(), Array::from_vec(vec![2i32], &[1]).unwrap()))
        .unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![3.0]);
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
}

#[test]
fn select_with_branches_of_different_dtypes_is_an_error() {
    let cond = ones(&[2]).greater(0.0);
    let err = cond
        .select(ones(&[2]), Array::ones(&[2], DType::F16))
        .check()
        .unwrap_err();
    assert!(matches!(err, Error::DType { .. }), "{err}");
    assert_mentions(&err, &["where", "f32", "f16"]);
}

#[test]
fn select_number_branch_takes_the_array_branch_dtype() {
    let x = Array::from_vec(
        vec![half::f16::from_f32(-1.0), half::f16::from_f32(2.0)],
        &[2],
    )
    .unwrap();
    let y = x.greater(0.0).select(7.0, &x);
    assert_eq!(y.dtype(), DType::F16);
    assert_eq!(
        y.to_vec::<half::f16>().unwrap(),
        vec![half::f16::from_f32(-1.0), half::f16::from_f32(7.0)]
    );
}

#[test]
fn a_number_that_does_not_fit_an_integer_array_is_an_error_naming_value_and_dtype() {
    let bytes = Array::from_data(kiln::HostData::U8(vec![1, 2]), &[2]).unwrap();
    let err = (&bytes + 256).eval().unwrap_err();
    assert_mentions(&err, &["256", "u8", "0..=255"]);
    let err = (&bytes + (-1i64)).eval().unwrap_err();
    assert_mentions(&err, &["-1", "u8"]);
    let ints = Array::from_data(kiln::HostData::I32(vec![1, 2]), &[2]).unwrap();
    let err = (&ints + (1i64 << 31)).eval().unwrap_err();
    assert_mentions(&err, &["2147483648", "i32"]);
    let err = (&ints * 0.5).eval().unwrap_err();
    assert_mentions(&err, &["0.5", "i32"]);
    let err = ints.less(f64::NAN).eval().unwrap_err();
    assert_mentions(&err, &["NaN", "i32"]);
    // Numbers in range keep working, from either side.
    let sum = (&bytes + 255).data().unwrap();
    assert_eq!(*sum, kiln::HostData::U8(vec![0, 1]));
    assert_eq!(
        (&ints + (-(1i64 << 31))).to_vec::<i32>().unwrap()[0],
        i32::MIN + 1
    );
    assert_eq!((2.0f32 * &ints).to_vec::<i32>().unwrap(), vec![2, 4]);
}
