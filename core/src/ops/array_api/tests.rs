//! Each composition against a host reference written as plain loops (on
//! the CPU executor; `tests/tests/array_api.rs` runs them on wgpu too),
//! with its dtypes, empty and 0-d operands and errors; jvp against central
//! differences and vmap against stacking per example.

use super::*;
use crate::compile::rule_checks as rules;
use crate::Error;
use proptest::prelude::*;

fn f32s(a: &Array) -> Vec<f32> {
    a.to_vec::<f32>().unwrap_or_else(|e| panic!("{e}"))
}

fn vec_f32(values: &[f32]) -> Array {
    rules::array(values, &[values.len()])
}

/// Bitwise equality, every NaN alike (signed zeros told apart).
fn assert_bits(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same = (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits();
        assert!(same, "element {i}: got {g:?}, want {w:?}");
    }
}

/// Values that exercise rounding: halves, near-halves, signed zeros,
/// large and non-finite values.
const EDGES: [f32; 18] = [
    0.5,
    1.5,
    2.5,
    -0.5,
    -1.5,
    -2.5,
    0.49999997,
    -0.3,
    -0.0,
    0.0,
    1.7,
    -1.7,
    8_388_607.5,
    16_777_216.0,
    -3.0e9,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
];

#[test]
fn floor_and_round_match_std_bit_for_bit_with_half_to_even() {
    let x = vec_f32(&EDGES);
    let floor: Vec<f32> = EDGES.iter().map(|v| v.floor()).collect();
    let round: Vec<f32> = EDGES.iter().map(|v| v.round_ties_even()).collect();
    assert_bits(&f32s(&x.floor()), &floor);
    assert_bits(&f32s(&x.round()), &round);
}

#[test]
fn floor_and_round_keep_half_floats_and_integers() {
    let halves = vec_f32(&[2.5, -1.5, 3.7]).cast(DType::F16);
    let got = halves.round().cast(DType::F32);
    assert_eq!(halves.round().dtype(), DType::F16);
    assert_eq!(f32s(&got), [2.0, -2.0, 4.0]);
    let ints = Array::from_vec(vec![-3i32, 7], &[2]).unwrap();
    assert_eq!(ints.floor().to_vec::<i32>().unwrap(), [-3, 7]);
    let err = Array::scalar(1.0, DType::Bool).round().check().unwrap_err();
    assert!(
        matches!(&err, Error::DType { op, .. } if op == "round"),
        "{err}"
    );
}

#[test]
fn sign_keeps_signed_zeros_and_nan_and_unsigned_gives_zero_or_one() {
    let x = vec_f32(&[-2.0, -0.0, 0.0, 3.0, f32::NAN, f32::NEG_INFINITY]);
    assert_bits(&f32s(&x.sign()), &[-1.0, -0.0, 0.0, 1.0, f32::NAN, -1.0]);
    let i = Array::from_vec(vec![-5i32, 0, 9], &[3]).unwrap();
    assert_eq!(i.sign().to_vec::<i32>().unwrap(), [-1, 0, 1]);
    let u = Array::from_vec(vec![0u8, 200], &[2]).unwrap();
    assert_eq!(u.sign().to_vec::<u8>().unwrap(), [0, 1]);
}

#[test]
fn log1p_is_accurate_where_log_of_one_plus_x_is_not() {
    let values = [
        1e-10f32,
        -1e-7,
        3e-5,
        0.5,
        -0.5,
        10.0,
        -1.0,
        -2.0,
        f32::INFINITY,
    ];
    let got = f32s(&vec_f32(&values).log1p());
    for (&x, g) in values.iter().zip(got) {
        let want = f64::from(x).ln_1p();
        if want.is_nan() {
            assert!(g.is_nan(), "log1p({x}) = {g}");
        } else if want.is_infinite() {
            assert_eq!(f64::from(g), want, "log1p({x})");
        } else {
            let error = (f64::from(g) - want).abs() / want.abs();
            assert!(
                error < 4.0 * f64::from(f32::EPSILON),
                "log1p({x}) = {g}, want {want}"
            );
        }
    }
}

#[test]
fn square_tan_and_clip_match_loops() {
    let values = [-2.0f32, -0.25, 0.0, 0.7, 1.5];
    let x = vec_f32(&values);
    let square: Vec<f32> = values.iter().map(|v| v * v).collect();
    assert_eq!(f32s(&x.square()), square);
    for (g, v) in f32s(&x.tan()).iter().zip(values) {
        assert!((g - v.tan()).abs() <= 4.0 * f32::EPSILON * v.tan().abs().max(1.0));
    }
    let clipped: Vec<f32> = values.iter().map(|v| v.clamp(-0.5, 1.0)).collect();
    assert_eq!(f32s(&x.clip(Some(-0.5), Some(1.0))), clipped);
    assert_eq!(f32s(&x.clip(None, Some(0.0))), [-2.0, -0.25, 0.0, 0.0, 0.0]);
}

#[test]
fn clip_propagates_nan_and_rejects_bounds_an_integer_cannot_hold() {
    let x = vec_f32(&[f32::NAN, 3.0]);
    let got = f32s(&x.clip(Some(0.0), Some(1.0)));
    assert!(got[0].is_nan() && got[1] == 1.0);
    let bytes = Array::from_vec(vec![5u8, 250], &[2]).unwrap();
    assert_eq!(
        bytes.clip(Some(10.0), Some(200.0)).to_vec::<u8>().unwrap(),
        [10, 200]
    );
    assert!(bytes.clip(Some(-1.0), None).check().is_err());
}

#[test]
fn compositions_take_zero_d_and_empty_arrays() {
    let scalar = Array::scalar(-2.5, DType::F32);
    assert_eq!(f32s(&scalar.round()), [-2.0]);
    assert_eq!(f32s(&scalar.square()), [6.25]);
    assert_eq!(scalar.sign().dims(), Some(vec![]));
    assert_eq!(f32s(&scalar.flatten()), [-2.5]);
    assert_eq!(scalar.flatten().dims(), Some(vec![1]));
    let empty = Array::zeros(&[0, 3], DType::F32);
    assert_eq!(empty.log1p().dims(), Some(vec![0, 3]));
    assert_eq!(empty.cumsum(0).dims(), Some(vec![0, 3]));
    assert_eq!(empty.sort(0).dims(), Some(vec![0, 3]));
    assert_eq!(f32s(&empty.prod(&[0], false)), [1.0, 1.0, 1.0]);
    assert_eq!(f32s(&empty.sum(&[0], false)), [0.0, 0.0, 0.0]);
    assert_eq!(empty.tile(&[2, 1]).dims(), Some(vec![0, 3]));
    assert!(scalar.cumsum(0).check().is_err());
    assert!(scalar.argsort(0, false).check().is_err());
}

/// `[rows, n]` row-major `x` reduced along axis 1 by `f`, in f64.
fn rows(x: &[f32], n: usize, f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    x.chunks(n.max(1))
        .map(|r| f(&r.iter().map(|&v| f64::from(v)).collect::<Vec<_>>()))
        .collect()
}

fn assert_near(got: &[f32], want: &[f64], tolerance: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(g) - w).abs() <= tolerance * w.abs().max(1.0),
            "element {i}: {g} vs {w}"
        );
    }
}

#[test]
fn var_std_and_logsumexp_match_loops() {
    let x = rules::normal(1, &[3, 5]);
    let v = f32s(&x);
    let variance = |ddof: f64| {
        move |r: &[f64]| {
            let mean = r.iter().sum::<f64>() / r.len() as f64;
            r.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / (r.len() as f64 - ddof)
        }
    };
    assert_near(
        &f32s(&x.var(&[1], 0, false)),
        &rows(&v, 5, variance(0.0)),
        1e-5,
    );
    let std1: Vec<f64> = rows(&v, 5, variance(1.0))
        .iter()
        .map(|a| a.sqrt())
        .collect();
    assert_near(&f32s(&x.std(&[-1], 1, false)), &std1, 1e-5);
    assert_eq!(x.var(&[1], 0, true).dims(), Some(vec![3, 1]));
    let lse = rows(&v, 5, |r| r.iter().map(|a| a.exp()).sum::<f64>().ln());
    assert_near(&f32s(&x.logsumexp(&[1], false)), &lse, 1e-5);
    let ints = Array::from_vec(vec![1i32, 2, 3, 4], &[4]).unwrap();
    assert_eq!(f32s(&ints.var(&[0], 0, false)), [1.25]);
}

#[test]
fn logsumexp_of_large_and_infinite_values_stays_finite_or_exact() {
    let x = rules::array(
        &[
            1000.0,
            1000.0,
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
            1.0,
            f32::INFINITY,
        ],
        &[3, 2],
    );
    let got = f32s(&x.logsumexp(&[1], false));
    assert!((got[0] - (1000.0 + 2f32.ln())).abs() < 1e-3);
    assert_eq!(got[1..], [f32::NEG_INFINITY, f32::INFINITY]);
}

#[test]
fn prod_matches_loops_for_any_axis_length_and_wraps_integers() {
    for n in 0..8 {
        let values: Vec<i32> = (0..3 * n as i32).map(|i| (i % 5) - 2).collect();
        let x = Array::from_vec(values.clone(), &[3, n]).unwrap();
        let want: Vec<i32> = (0..3)
            .map(|r| {
                values[r * n..(r + 1) * n]
                    .iter()
                    .fold(1i32, |a, &b| a.wrapping_mul(b))
            })
            .collect();
        assert_eq!(
            x.prod(&[1], false).to_vec::<i32>().unwrap(),
            want,
            "n = {n}"
        );
    }
    let big = Array::full(&[40], 3.0, DType::I32);
    assert_eq!(
        big.prod(&[0], false).to_vec::<i32>().unwrap(),
        [3i32.wrapping_pow(40)]
    );
    let f = rules::normal(2, &[2, 3, 4]);
    let want = rows(&f32s(&f.permute(&[1, 0, 2])), 8, |r| r.iter().product());
    assert_near(&f32s(&f.prod(&[0, 2], false)), &want, 1e-5);
}

#[test]
fn argmin_takes_the_first_minimum_and_the_first_nan_in_every_dtype() {
    let f = vec_f32(&[3.0, -1.0, -1.0, 2.0]);
    assert_eq!(f.argmin(0, false).to_vec::<u32>().unwrap(), [1]);
    let nan = vec_f32(&[3.0, f32::NAN, -5.0, f32::NAN]);
    assert_eq!(nan.argmin(0, false).to_vec::<u32>().unwrap(), [1]);
    let i = Array::from_vec(vec![i32::MAX, i32::MIN, 0, i32::MIN], &[4]).unwrap();
    assert_eq!(i.argmin(0, true).to_vec::<u32>().unwrap(), [1]);
    let u = Array::from_vec(vec![7u32, u32::MAX, 0, 0], &[4]).unwrap();
    assert_eq!(u.argmin(0, false).to_vec::<u32>().unwrap(), [2]);
    let b = Array::from_vec(vec![true, false, false, true], &[2, 2]).unwrap();
    assert_eq!(b.argmin(1, false).to_vec::<u32>().unwrap(), [1, 0]);
    let h = rules::array(&[2.0, 1.0, 1.0], &[3]).cast(DType::BF16);
    assert_eq!(h.argmin(0, false).to_vec::<u32>().unwrap(), [1]);
}

#[test]
fn cumsum_matches_running_sums_along_each_axis() {
    let x = rules::normal(3, &[2, 3, 4]);
    let v = f32s(&x);
    for axis in 0..3 {
        let dims = [2usize, 3, 4];
        let strides = [12usize, 4, 1];
        let mut want = vec![0.0f64; 24];
        for (flat, w) in want.iter_mut().enumerate() {
            let position = (flat / strides[axis]) % dims[axis];
            let start = flat - position * strides[axis];
            *w = (0..=position)
                .map(|p| f64::from(v[start + p * strides[axis]]))
                .sum();
        }
        assert_near(&f32s(&x.cumsum(axis as isize)), &want, 1e-5);
    }
    let ints = Array::from_vec(vec![i32::MAX, 1, true as i32], &[3]).unwrap();
    assert_eq!(
        ints.cumsum(0).to_vec::<i32>().unwrap(),
        [i32::MAX, i32::MIN, i32::MIN + 1]
    );
    let bools = Array::from_vec(vec![true, false, true], &[3]).unwrap();
    assert_eq!(bools.cumsum(-1).to_vec::<i32>().unwrap(), [1, 1, 2]);
}

/// `values` with `-0.0` written `0.0`: a sort picks values through a
/// sum of one selected value and zeros, which gives `0.0` for `-0.0`.
fn unsigned_zeros(values: &[f32]) -> Vec<f32> {
    values
        .iter()
        .map(|&v| if v == 0.0 { 0.0 } else { v })
        .collect()
}

/// The stable order of `row`, NaN above every number.
fn argsort_reference(row: &[f32], descending: bool) -> Vec<i32> {
    let mut order: Vec<usize> = (0..row.len()).collect();
    let key = |v: f32| {
        if v.is_nan() {
            f64::INFINITY
        } else {
            f64::from(v)
        }
    };
    let nan_rank = |v: f32| v.is_nan() as u8;
    order.sort_by(|&a, &b| {
        let by = (nan_rank(row[a]), key(row[a])).partial_cmp(&(nan_rank(row[b]), key(row[b])));
        let by = by.unwrap_or(std::cmp::Ordering::Equal);
        if descending {
            by.reverse()
        } else {
            by
        }
    });
    order.into_iter().map(|i| i as i32).collect()
}

proptest! {
    #![proptest_config(crate::ops::proptest_config())]
    #[test]
    fn argsort_sort_and_top_k_match_a_stable_sort(
        row in prop::collection::vec(prop_oneof![Just(f32::NAN), Just(-0.0f32), (-3i8..3).prop_map(f32::from)], 1..9),
        descending in any::<bool>(),
    ) {
        let n = row.len();
        let x = vec_f32(&row);
        let want = argsort_reference(&row, descending);
        prop_assert_eq!(x.argsort(0, descending).to_vec::<i32>().unwrap(), want.clone());
        let ascending = argsort_reference(&row, false);
        let sorted: Vec<f32> = ascending.iter().map(|&i| row[i as usize]).collect();
        assert_bits(&unsigned_zeros(&f32s(&x.sort(0))), &unsigned_zeros(&sorted));
        let k = n.div_ceil(2);
        let (values, indices) = x.top_k(k);
        let top = argsort_reference(&row, true)[..k].to_vec();
        prop_assert_eq!(indices.to_vec::<i32>().unwrap(), top.clone());
        let top_values: Vec<f32> = top.iter().map(|&i| row[i as usize]).collect();
        assert_bits(&unsigned_zeros(&f32s(&values)), &unsigned_zeros(&top_values));
    }
}

#[test]
fn sort_works_along_any_axis_for_integers_and_bool() {
    let x = Array::from_vec(vec![3i32, 1, -2, 0, 5, -7], &[2, 3]).unwrap();
    assert_eq!(x.sort(0).to_vec::<i32>().unwrap(), [0, 1, -7, 3, 5, -2]);
    assert_eq!(
        x.argsort(1, true).to_vec::<i32>().unwrap(),
        [0, 1, 2, 1, 0, 2]
    );
    let b = Array::from_vec(vec![true, false, true, false], &[4]).unwrap();
    assert_eq!(
        b.sort(0).to_vec::<bool>().unwrap(),
        [false, false, true, true]
    );
    let err = vec_f32(&[1.0, 2.0]).top_k(3).0.check().unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument { op, .. } if op == "top_k"),
        "{err}"
    );
}

#[test]
fn stack_split_tile_repeat_and_pad_match_loops() {
    let a = Array::from_vec(vec![1i32, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
    let b = &a * 10;
    assert_eq!(
        stack(&[a.clone(), b.clone()], 1).to_vec::<i32>().unwrap(),
        [1, 2, 3, 10, 20, 30, 4, 5, 6, 40, 50, 60]
    );
    assert_eq!(
        stack(&[a.clone(), b.clone()], -1).dims(),
        Some(vec![2, 3, 2])
    );
    let parts = a.split(3, 1).unwrap();
    assert_eq!(parts.len(), 3);
    assert_eq!(parts[2].to_vec::<i32>().unwrap(), [3, 6]);
    let uneven = a.split_at(&[2, 9], 1).unwrap();
    assert_eq!(uneven[0].to_vec::<i32>().unwrap(), [1, 2, 4, 5]);
    assert_eq!(uneven[2].dims(), Some(vec![2, 0]));
    assert_eq!(
        a.tile(&[2]).to_vec::<i32>().unwrap(),
        [1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6]
    );
    assert_eq!(a.tile(&[2, 1, 1]).dims(), Some(vec![2, 2, 3]));
    assert_eq!(
        a.repeat(2, 0).to_vec::<i32>().unwrap(),
        [1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6]
    );
    assert_eq!(
        a.repeat(2, -1).to_vec::<i32>().unwrap(),
        [1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6]
    );
    let padded = a.pad(&[(1, 0), (0, 1)], -1.0);
    assert_eq!(
        padded.to_vec::<i32>().unwrap(),
        [-1, -1, -1, -1, 1, 2, 3, -1, 4, 5, 6, -1]
    );
    assert_eq!(a.flatten().to_vec::<i32>().unwrap(), [1, 2, 3, 4, 5, 6]);
    assert_eq!(a.ones_like().to_vec::<i32>().unwrap(), [1; 6]);
}

#[test]
fn layout_compositions_reject_bad_arguments() {
    let a = Array::zeros(&[2, 3], DType::F32);
    rules::assert_err_names(a.split(2, 1), "split", "into 2 equal parts");
    rules::assert_err_names(a.split(0, 1), "split", "0 equal parts");
    rules::assert_err_names(stack(&[], 0).check(), "stack", "at least one");
    rules::assert_err_names(
        stack(&[a.clone(), a.transpose()], 0).check(),
        "stack",
        "one shape",
    );
    rules::assert_err_names(
        a.pad(&[(1, 1)], 0.0).check(),
        "pad",
        "one (before, after) pair per axis",
    );
    rules::assert_err_names(a.repeat(2, 2).check(), "repeat", "2");
}

#[test]
fn constructors_match_jax() {
    assert_eq!(
        Array::arange_i32(2, -3, -2)
            .unwrap()
            .to_vec::<i32>()
            .unwrap(),
        [2, 0, -2]
    );
    assert_eq!(Array::arange_i32(0, 0, 1).unwrap().dims(), Some(vec![0]));
    rules::assert_err_names(Array::arange_i32(0, 5, 0), "arange", "non-zero step");
    rules::assert_err_names(Array::arange_i32(0, 1 << 40, 1), "arange", "i32 bounds");
    let half_open = Array::linspace(0.0, 1.0, 4, false, DType::F32).unwrap();
    assert_eq!(f32s(&half_open), [0.0, 0.25, 0.5, 0.75]);
    assert_eq!(
        f32s(&Array::linspace(3.0, 7.0, 1, true, DType::F32).unwrap()),
        [3.0]
    );
    assert_eq!(
        Array::linspace(0.0, 1.0, 0, true, DType::F32)
            .unwrap()
            .dims(),
        Some(vec![0])
    );
    let eye = Array::eye(3, None, -1, DType::F32);
    assert_eq!(f32s(&eye), [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]);
    assert_eq!(
        Array::eye(2, Some(2), 1 << 40, DType::Bool)
            .to_vec::<bool>()
            .unwrap(),
        [false; 4]
    );
}

/// Values far enough apart (and from a kink) that a central difference of
/// step 1e-2 crosses no tie.
fn spaced(values: &[f32], shape: &[usize]) -> Array {
    rules::array(values, shape)
}

#[test]
fn differentiable_compositions_have_jvps_matching_central_differences() {
    type F = fn(Vec<Array>) -> Array;
    let cases: [(&str, F, Array); 14] = [
        ("square", |x| x[0].square(), rules::normal(20, &[3, 2])),
        ("tan", |x| x[0].tan(), rules::uniform(21, &[5], -1.0, 1.0)),
        (
            "log1p",
            |x| x[0].log1p(),
            rules::uniform(22, &[5], -0.5, 3.0),
        ),
        (
            "clip",
            |x| x[0].clip(Some(-0.5), Some(0.5)),
            spaced(&[-1.0, -0.3, 0.2, 0.9, 0.45, -0.8], &[6]),
        ),
        (
            "var",
            |x| x[0].var(&[1], 1, false),
            rules::normal(24, &[2, 4]),
        ),
        (
            "std",
            |x| x[0].std(&[0, 1], 0, true),
            rules::normal(25, &[2, 4]),
        ),
        (
            "logsumexp",
            |x| x[0].logsumexp(&[-1], false),
            rules::normal(26, &[3, 4]),
        ),
        (
            "prod",
            |x| x[0].prod(&[1], false),
            rules::uniform(27, &[2, 5], 0.5, 1.5),
        ),
        ("cumsum", |x| x[0].cumsum(0), rules::normal(28, &[4, 2])),
        (
            "sort",
            |x| x[0].sort(-1),
            spaced(
                &[3.0, -1.0, 0.5, 2.0, -2.5, 1.2, 0.1, -0.7, 2.9, -1.9],
                &[2, 5],
            ),
        ),
        (
            "top_k",
            |x| x[0].top_k(2).0,
            spaced(&[0.3, -1.1, 2.2, 1.0, -0.4, 0.8, 1.9, -2.0], &[2, 4]),
        ),
        (
            "tile+repeat",
            |x| x[0].tile(&[2, 1]).repeat(2, 1),
            rules::normal(31, &[2, 3]),
        ),
        (
            "pad",
            |x| x[0].pad(&[(1, 2), (0, 1)], 3.0),
            rules::normal(32, &[2, 3]),
        ),
        (
            "stack+split",
            |x| stack(&x[0].split(2, 1).unwrap(), 0),
            rules::normal(33, &[3, 4]),
        ),
    ];
    for (what, f, x) in cases {
        rules::assert_jvp_matches_central_difference(what, f, &[x]);
    }
}

#[test]
fn zero_gradient_compositions_have_zero_tangents() {
    let x = rules::array(&[-1.3, 0.4, 2.6], &[3]);
    for (what, f) in [
        ("floor", Array::floor as fn(&Array) -> Array),
        ("round", Array::round),
        ("sign", Array::sign),
    ] {
        let (_, t) = crate::jvp(|x: Array| f(&x), &x, &x).unwrap();
        assert_eq!(f32s(&t), [0.0, 0.0, 0.0], "{what}");
    }
}

#[test]
fn compositions_batch_like_stacking_per_example() {
    type F = fn(Vec<Array>) -> Array;
    let xs = rules::normal(40, &[3, 4, 5]);
    let cases: [(&str, F); 12] = [
        ("round", |x| x[0].round() + x[0].floor() + x[0].sign()),
        ("log1p", |x| x[0].abs().log1p()),
        ("var", |x| x[0].var(&[0], 1, true) + x[0].std(&[1], 0, true)),
        ("logsumexp", |x| x[0].logsumexp(&[0], false)),
        ("prod", |x| x[0].prod(&[1], false)),
        ("argmin", |x| x[0].argmin(1, false).cast(DType::F32)),
        ("cumsum", |x| x[0].cumsum(1)),
        ("sort", |x| x[0].sort(0)),
        ("argsort", |x| x[0].argsort(-1, true).cast(DType::F32)),
        ("top_k", |x| x[0].top_k(3).0),
        ("tile", |x| {
            x[0].tile(&[1, 2]).repeat(2, 0).pad(&[(1, 0), (0, 2)], 1.0)
        }),
        ("stack", |x| {
            stack(&x[0].split_at(&[1], 0).unwrap()[1..], 0).flatten()
        }),
    ];
    for (what, f) in cases {
        let report = rules::assert_batches_like_stacking(what, f, std::slice::from_ref(&xs));
        assert!(
            report.vmap_fallbacks.is_empty(),
            "{what}: {:?}",
            report.vmap_fallbacks
        );
    }
}

#[test]
fn a_failed_composition_names_the_callers_line() {
    let line = line!() + 1;
    let err = Array::zeros(&[2], DType::F32)
        .cumsum(3)
        .check()
        .unwrap_err();
    let at = err.call_site().expect("a call site");
    assert_eq!(at.line(), line, "{err}");
}
