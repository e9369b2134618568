//! A failed op names the user's Rust line: `Array`'s op methods are
//! `#[track_caller]`, so a shape error says `at path/to/file.rs:LINE:COL`
//! of the call, not only the op.

use kiln::{Array, DType, Error};

/// `at FILE:LINE:` for `line` of this file, as an error message writes it.
fn here(line: u32) -> String {
    format!("at {}:{line}:", file!())
}

#[test]
fn a_broadcast_error_names_the_callers_file_and_line() {
    let a = Array::zeros(&[33], DType::F32);
    let b = Array::zeros(&[32], DType::F32);
    let line = line!() + 1;
    let sum = &a + &b;
    let msg = sum.check().unwrap_err().to_string();
    assert!(msg.contains("cannot broadcast dim 33 with 32"), "{msg}");
    assert!(msg.contains(&here(line)), "{msg}");
}

#[test]
fn later_ops_keep_the_line_where_the_mistake_was_made() {
    let a = Array::zeros(&[2, 3], DType::F32);
    let line = line!() + 1;
    let product = a.matmul(&a);
    let later = (product.exp() * 2.0).sum_all();
    let err = later.check().unwrap_err();
    assert!(matches!(err, Error::Shape { .. }), "{err}");
    let site = err.call_site().expect("a call site");
    assert_eq!((site.file(), site.line()), (file!(), line));
}

#[test]
fn argument_and_dtype_errors_name_their_lines_too() {
    let x = Array::zeros(&[2, 3], DType::F32);
    let line = line!() + 1;
    let bad_axis = x.sum(&[5], false);
    let msg = bad_axis.check().unwrap_err().to_string();
    assert!(msg.contains(&here(line)), "{msg}");
    let ints = Array::zeros(&[2], DType::I32);
    let line = line!() + 1;
    let bad_dtype = ints.erf();
    let msg = bad_dtype.check().unwrap_err().to_string();
    assert!(msg.contains(&here(line)), "{msg}");
}

#[test]
fn an_op_failing_inside_a_composition_names_the_compositions_caller() {
    let logits = Array::zeros(&[2, 5], DType::F32);
    let targets = Array::zeros(&[3, 1], DType::I32);
    let line = line!() + 1;
    let picked = logits.take_along_axis(&targets, -1);
    let msg = picked.check().unwrap_err().to_string();
    assert!(msg.contains("cannot broadcast"), "{msg}");
    assert!(msg.contains(&here(line)), "{msg}");
}
