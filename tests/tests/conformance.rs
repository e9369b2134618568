//! The conformance suite, generic over [`Backend`]: every op family on
//! f32/f16/bf16 (and the integer and bool dtypes where the op takes them),
//! over shapes with size-0 and size-1 dims, broadcasting, transposed
//! operands, sizes that are no multiple of a workgroup and dispatches of
//! more than 65,535 workgroups. Each case runs fused and unfused and is
//! compared with the CPU executor under per-dtype tolerances.
//!
//! The CPU executor runs the suite against itself (fused against unfused
//! reference), and the wgpu backend runs it on the default adapter
//! (lavapipe in CI, where `KILN_REQUIRE_GPU` makes a missing adapter fail)
//! twice: with native f16 where the adapter has SHADER_F16 (lavapipe has),
//! and with f16 packed in words as on adapters without it.
//!
//! The numerics cases compare bit for bit ([`Rule::Exact`]) where every
//! backend must round as the reference does (casts, scalar constants,
//! special values), and give the values they expect; subnormals may flush
//! to zero on wgpu as [`kiln_tests::conformance::may_flush`] says.

use half::{bf16, f16};
use kiln::{compile, concat, Array, Backend, CpuBackend, DType, HostData, SliceAxis};
use kiln_kernels::program::{Buffer, Caps, Program as Lowered, Step};
use kiln_tests::conformance::{check_case, compare, Program, Rule};
use std::sync::Arc;

/// One case: a name, a program, its inputs, how the backend's outputs
/// must match the CPU executor's, and the outputs it must give, if known.
struct Case {
    name: String,
    program: Program,
    inputs: Vec<Array>,
    rule: Rule,
    expected: Option<Vec<HostData>>,
}

fn case(name: impl Into<String>, program: Program, inputs: Vec<Array>) -> Case {
    Case {
        name: name.into(),
        program,
        inputs,
        rule: Rule::Tolerance,
        expected: None,
    }
}

impl Case {
    /// The backend must give the CPU executor's bits.
    fn exact(self) -> Case {
        Case {
            rule: Rule::Exact,
            ..self
        }
    }

    /// The CPU executor (and so every backend) must give `outputs`, under
    /// the case's rule.
    fn expecting(self, outputs: Vec<HostData>) -> Case {
        Case {
            expected: Some(outputs),
            ..self
        }
    }
}

/// A rank-1 array of `values` converted to `dtype`.
fn array(dtype: DType, values: &[f64]) -> Array {
    Array::from_data(data(dtype, values), &[values.len()]).expect("rank 1 fits its values")
}

/// `values` converted to `dtype`, as expected output data.
fn data(dtype: DType, values: &[f64]) -> HostData {
    HostData::from_f64s(dtype, values.iter().copied())
}

/// Deterministic values of `dtype`: floats in [-2, 2) with a few exact
/// zeros, i32 in [-50, 50), u32 and u8 in [0, 100), alternating bools.
fn values(dtype: DType, shape: &[usize], seed: u64) -> Array {
    let n: usize = shape.iter().product();
    let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    let raw: Vec<f64> = (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 33) % 1000) as f64 / 1000.0
        })
        .collect();
    let data = match dtype {
        d if d.is_float() => HostData::from_f64s(d, raw.iter().map(|&r| (r * 4.0 - 2.0) * 1.0)),
        DType::I32 => HostData::from_f64s(dtype, raw.iter().map(|&r| (r * 100.0).floor() - 50.0)),
        DType::Bool => HostData::Bool(raw.iter().map(|&r| r > 0.5).collect()),
        d => HostData::from_f64s(d, raw.iter().map(|&r| (r * 100.0).floor())),
    };
    Array::from_data(data, shape).expect("shape fits the data")
}

const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
const NUMERIC: [DType; 6] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::U32,
    DType::U8,
];

fn unary_cases(cases: &mut Vec<Case>) {
    let float_ops: [(&str, Program); 12] = [
        ("neg", |a| vec![a[0].neg()]),
        ("abs", |a| vec![a[0].abs()]),
        ("exp", |a| vec![a[0].exp()]),
        ("log", |a| vec![(a[0].abs() + 0.25).log()]),
        ("sin", |a| vec![a[0].sin()]),
        ("cos", |a| vec![a[0].cos()]),
        ("tanh", |a| vec![(&a[0] * 10.0).tanh()]),
        ("sqrt", |a| vec![a[0].abs().sqrt()]),
        ("rsqrt", |a| vec![(a[0].abs() + 0.25).rsqrt()]),
        ("sigmoid", |a| vec![(&a[0] * 8.0).sigmoid()]),
        ("relu", |a| vec![a[0].relu()]),
        ("erf", |a| vec![a[0].erf()]),
    ];
    // 15 elements run one per invocation, 20 four per invocation (vec4).
    for dtype in FLOATS {
        for (name, program) in float_ops {
            for shape in [[3, 5], [4, 5]] {
                cases.push(case(
                    format!("{name} {dtype} {shape:?}"),
                    program,
                    vec![values(dtype, &shape, 1)],
                ));
            }
        }
    }
    for dtype in [DType::I32, DType::U32, DType::U8] {
        for n in [17, 16] {
            cases.push(case(
                format!("abs, relu {dtype} [{n}]"),
                |a| vec![a[0].abs(), a[0].relu()],
                vec![values(dtype, &[n], 2)],
            ));
        }
    }
    cases.push(case(
        "neg i32 wraps",
        |a| vec![a[0].neg(), a[0].abs()],
        vec![Array::from_vec(vec![i32::MIN, -3, 0, 9], &[4]).expect("4 values")],
    ));
}

fn binary_cases(cases: &mut Vec<Case>) {
    let arithmetic: [(&str, Program); 6] = [
        ("add", |a| vec![&a[0] + &a[1]]),
        ("sub", |a| vec![&a[0] - &a[1]]),
        ("mul", |a| vec![&a[0] * &a[1]]),
        ("div", |a| vec![&a[0] / &a[1]]),
        ("maximum", |a| vec![a[0].maximum(&a[1])]),
        ("minimum", |a| vec![a[0].minimum(&a[1])]),
    ];
    for dtype in NUMERIC {
        for (name, program) in arithmetic {
            cases.push(case(
                format!("{name} {dtype} broadcast [3,1,5] with [4,5]"),
                program,
                vec![values(dtype, &[3, 1, 5], 3), values(dtype, &[4, 5], 4)],
            ));
        }
    }
    for dtype in FLOATS {
        for shape in [[6, 7], [6, 8]] {
            cases.push(case(
                format!("pow {dtype} {shape:?}"),
                |a| vec![a[0].abs().pow(&a[1]), a[0].pow(2.0), a[0].pow(&a[1])],
                vec![values(dtype, &shape, 5), values(dtype, &shape, 6)],
            ));
        }
    }
    let comparisons: Program = |a| {
        vec![
            a[0].equal(&a[1]),
            a[0].not_equal(&a[1]),
            a[0].less(&a[1]),
            a[0].less_equal(&a[1]),
            a[0].greater(&a[1]),
            a[0].greater_equal(&a[1]),
        ]
    };
    for dtype in kiln::DType::ALL {
        for n in [9, 8] {
            cases.push(case(
                format!("comparisons {dtype} broadcast [2,1] with [{n}]"),
                comparisons,
                vec![values(dtype, &[2, 1], 7), values(dtype, &[n], 8)],
            ));
        }
    }
    for n in [13, 12] {
        cases.push(case(
            format!("bool maximum is or, minimum is and [{n}]"),
            |a| vec![a[0].maximum(&a[1]), a[0].minimum(&a[1])],
            vec![values(DType::Bool, &[n], 9), values(DType::Bool, &[n], 10)],
        ));
    }
    let numerators = [7, -7, i32::MIN, i32::MAX, 5, 9, -9, 0];
    let denominators = [0, 2, -1, 0, -2, 0, 4, 0];
    for n in [5, 8] {
        cases.push(case(
            format!("integer division by zero is zero and wrapping [{n}]"),
            |a| vec![&a[0] / &a[1], &a[0] * &a[0], &a[0] + &a[0]],
            vec![
                Array::from_vec(numerators[..n].to_vec(), &[n]).expect("numerators"),
                Array::from_vec(denominators[..n].to_vec(), &[n]).expect("denominators"),
            ],
        ));
    }
    cases.push(case(
        "maximum and minimum propagate NaN",
        |a| vec![a[0].maximum(&a[1]), a[0].minimum(&a[1])],
        vec![
            Array::from_vec(vec![f32::NAN, 1.0, 2.0, f32::NAN], &[4]).expect("4 values"),
            Array::from_vec(vec![0.0, f32::NAN, 1.0, f32::NAN], &[4]).expect("4 values"),
        ],
    ));
    cases.push(case(
        "transposed operands",
        |a| vec![a[0].transpose() * &a[1] + a[1].transpose().transpose()],
        vec![
            values(DType::F32, &[5, 3], 11),
            values(DType::F32, &[3, 5], 12),
        ],
    ));
}

fn select_and_cast_cases(cases: &mut Vec<Case>) {
    for dtype in kiln::DType::ALL {
        cases.push(case(
            format!("where {dtype} broadcasting all three"),
            |a| vec![kiln::select(&a[0], &a[1], &a[2])],
            vec![
                values(DType::Bool, &[4, 1], 13),
                values(dtype, &[1, 6], 14),
                values(dtype, &[4, 6], 15),
            ],
        ));
    }
    let special = [
        0.0f32,
        -0.0,
        1.5,
        -1.5,
        2.7,
        -2.7,
        255.9,
        300.0,
        -300.0,
        1e10,
        -1e10,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        65504.0,
        1e-3,
    ];
    let casts: [(DType, Program); 7] = [
        (DType::F32, |a| vec![a[0].cast(DType::F32)]),
        (DType::F16, |a| vec![a[0].cast(DType::F16)]),
        (DType::BF16, |a| vec![a[0].cast(DType::BF16)]),
        (DType::I32, |a| vec![a[0].cast(DType::I32)]),
        (DType::U32, |a| vec![a[0].cast(DType::U32)]),
        (DType::Bool, |a| vec![a[0].cast(DType::Bool)]),
        (DType::U8, |a| vec![a[0].cast(DType::U8)]),
    ];
    // All 16 values run four per invocation; the first 15 one per invocation.
    for from in kiln::DType::ALL {
        let inputs = if from == DType::F32 {
            [16, 15].map(|n| Array::from_vec(special[..n].to_vec(), &[n]).expect("specials"))
        } else {
            [values(from, &[16], 16), values(from, &[15], 16)]
        };
        for input in inputs {
            for (to, program) in casts {
                cases.push(case(
                    format!("cast {from} to {to} {:?}", input.shape()),
                    program,
                    vec![input.clone()],
                ));
            }
        }
    }
    cases.push(case(
        "casts between integer types saturate",
        |a| {
            vec![
                a[0].cast(DType::U8),
                a[0].cast(DType::U32),
                a[0].cast(DType::F16),
            ]
        },
        vec![Array::from_vec(vec![-5, 0, 200, 300, i32::MAX], &[5]).expect("5 values")],
    ));
}

fn reduction_cases(cases: &mut Vec<Case>) {
    let reductions: [(&str, Program); 8] = [
        ("sum axis 0", |a| vec![a[0].sum(&[0], false)]),
        ("sum axes 0,2 keepdims", |a| vec![a[0].sum(&[0, 2], true)]),
        ("sum all", |a| vec![a[0].sum_all()]),
        ("max axis 1", |a| vec![a[0].max(&[1], false)]),
        ("max axis 2 keepdims", |a| vec![a[0].max(&[2], true)]),
        ("min axes 1,2", |a| vec![a[0].min(&[1, 2], false)]),
        ("argmax axis 1", |a| vec![a[0].argmax(1, false)]),
        ("argmax axis 2 keepdims", |a| vec![a[0].argmax(2, true)]),
    ];
    for dtype in NUMERIC {
        for (name, program) in reductions {
            cases.push(case(
                format!("{name} {dtype} [3,70,5]"),
                program,
                vec![values(dtype, &[3, 70, 5], 17)],
            ));
        }
    }
    cases.push(case(
        "bool max is any, min is all, argmax",
        |a| {
            vec![
                a[0].max(&[1], false),
                a[0].min(&[0], false),
                a[0].argmax(1, false),
            ]
        },
        vec![values(DType::Bool, &[5, 9], 18)],
    ));
    cases.push(case(
        "argmax takes the first maximum and the first NaN",
        |a| vec![a[0].argmax(1, false)],
        vec![Array::from_vec(
            vec![1.0f32, 3.0, 3.0, 0.0, 2.0, f32::NAN, 5.0, f32::NAN],
            &[2, 4],
        )
        .expect("8 values")],
    ));
    cases.push(case(
        "sum over an empty axis is zero; size-1 axes",
        |a| vec![a[0].sum(&[1], false), a[1].max(&[0, 2], true)],
        vec![
            values(DType::F32, &[4, 0], 19),
            values(DType::F32, &[1, 3, 1], 20),
        ],
    ));
    cases.push(case(
        "reduction over 70,000 outputs needs more than 65,535 workgroups",
        |a| vec![a[0].sum(&[1], false), a[0].argmax(1, false)],
        vec![values(DType::F32, &[70_000, 3], 21)],
    ));
}

fn matmul_cases(cases: &mut Vec<Case>) {
    let product: Program = |a| vec![a[0].matmul(&a[1])];
    let shapes: [(&str, &[usize], &[usize]); 8] = [
        ("odd sizes", &[33, 65], &[65, 31]),
        // Inner and output widths multiples of four (read a vec4 at a time
        // by the tiled kernel), with rows, inner and columns beyond one
        // tile and not multiples of it.
        ("rows of four", &[70, 36], &[36, 40]),
        ("broadcast batch, rows of four", &[2, 1, 9, 8], &[3, 8, 12]),
        ("small", &[5, 7], &[7, 3]),
        ("broadcast batch", &[2, 1, 4, 6], &[3, 6, 5]),
        ("skinny", &[1, 700], &[700, 3]),
        ("empty inner dim", &[2, 0], &[0, 3]),
        ("empty rows", &[0, 4], &[4, 3]),
    ];
    for (name, a, b) in shapes {
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::I32, DType::U8] {
            cases.push(case(
                format!("matmul {name} {dtype} {a:?}@{b:?}"),
                product,
                vec![values(dtype, a, 22), values(dtype, b, 23)],
            ));
        }
    }
    cases.push(case(
        "matmul of a transposed operand",
        |a| vec![a[0].transpose().matmul(&a[1])],
        vec![
            values(DType::F32, &[9, 4], 24),
            values(DType::F32, &[9, 6], 25),
        ],
    ));
}

fn layout_cases(cases: &mut Vec<Case>) {
    for dtype in kiln::DType::ALL {
        cases.push(case(
            format!("permute, broadcast, reshape, slice {dtype}"),
            |a| {
                vec![
                    a[0].permute(&[2, 0, 1]),
                    a[0].slice_axis(2, 1, None, 2)
                        .broadcast_to(&[4, 2, 3, 2][..]),
                    a[0].reshape(&[6, 4]),
                    a[0].slice_axis(1, -2, None, 1).slice_axis(0, 1, Some(2), 1),
                ]
            },
            vec![values(dtype, &[2, 3, 4], 26)],
        ));
        cases.push(case(
            format!("concat axis 0, 1 and with an empty piece {dtype}"),
            |a| {
                vec![
                    concat(&[a[0].clone(), a[1].clone()], 1),
                    concat(&[a[0].clone(), a[0].clone(), a[0].clone()], 0),
                    concat(&[a[2].clone(), a[0].clone()], 1),
                ]
            },
            vec![
                values(dtype, &[3, 5], 27),
                values(dtype, &[3, 2], 28),
                values(dtype, &[3, 0], 29),
            ],
        ));
    }
    for dtype in FLOATS {
        cases.push(case(
            format!("take i32 with negative indices and u32 {dtype}"),
            |a| vec![a[0].take(&a[1], 1), a[0].take(&a[2], 0)],
            vec![
                values(dtype, &[3, 5, 2], 30),
                Array::from_vec(vec![4, -1, 0, 2, -5, 1], &[2, 3]).expect("6 indices"),
                Array::from_vec(vec![2u32, 0, 2], &[3]).expect("3 indices"),
            ],
        ));
    }
}

/// `start:stop:step` of one axis.
fn sl(start: i64, stop: Option<i64>, step: i64) -> SliceAxis {
    SliceAxis { start, stop, step }
}

/// The strided multi-axis slice the pad_slice cases place into
/// `[5, 7, 4]`: steps 2 and 3, a negative start and stop, a whole axis.
fn strided_axes() -> [SliceAxis; 3] {
    [sl(1, None, 2), sl(-5, Some(-1), 3), SliceAxis::full()]
}

/// `scatter_add` and `pad_slice`, the transposes of `take` and `slice`
/// that autodiff emits.
fn transpose_cases(cases: &mut Vec<Case>) {
    // Every dtype but bool, whose sum is an error.
    for dtype in NUMERIC {
        cases.push(case(
            format!(
                "scatter_add of repeated and negative indices on axis 1 and u32 on axis 0 {dtype}"
            ),
            |a| vec![a[0].scatter_add(&a[1], 1, 5), a[2].scatter_add(&a[3], 0, 4)],
            vec![
                values(dtype, &[3, 2, 3, 2], 40),
                Array::from_vec(vec![4, -1, 0, 4, -5, 1], &[2, 3]).expect("6 indices"),
                values(dtype, &[3, 5, 2], 41),
                Array::from_vec(vec![2u32, 0, 2], &[3]).expect("3 indices"),
            ],
        ));
    }
    for dtype in DType::ALL {
        cases.push(case(
            format!("pad_slice with steps 2 and 3 on three axes, and of its own slice {dtype}"),
            |a| {
                let axes = strided_axes();
                vec![
                    a[0].pad_slice(&axes, [5, 7, 4]),
                    a[1].slice(&axes).pad_slice(&axes, a[1].shape()),
                ]
            },
            vec![values(dtype, &[2, 2, 4], 42), values(dtype, &[5, 7, 4], 43)],
        ));
    }
    cases.push(case(
        "scatter_add of 300 indices into 259 outputs (no multiple of a workgroup)",
        |a| vec![a[0].scatter_add(&a[1], 0, 7)],
        vec![
            values(DType::F32, &[300, 37], 44),
            Array::from_vec(
                (0..300).map(|i| (i * 5 % 14) - 7).collect::<Vec<i32>>(),
                &[300],
            )
            .expect("300 indices"),
        ],
    ));
    cases.push(case(
        "scatter_add with size-0 dims: no indices, no outer rows, an empty axis",
        |a| {
            vec![
                a[0].scatter_add(&a[1], 1, 4),
                a[2].scatter_add(&a[3], 1, 5),
                a[4].scatter_add(&a[1], 0, 0),
            ]
        },
        vec![
            values(DType::F32, &[2, 0, 3], 45),
            Array::from_vec(Vec::<i32>::new(), &[0]).expect("no indices"),
            values(DType::F16, &[0, 2], 46),
            Array::from_vec(vec![1, -1], &[2]).expect("2 indices"),
            values(DType::I32, &[0], 47),
        ],
    ));
    for dtype in [DType::F32, DType::Bool] {
        cases.push(case(
            format!("pad_slice of 333 elements, an empty slice and a huge step {dtype}"),
            |a| {
                let empty = [sl(4, Some(2), 1), SliceAxis::full()];
                let huge = [sl(-1, None, i64::MAX), sl(2, None, 1)];
                vec![
                    a[0].pad_slice(&[sl(0, None, 1), sl(1, Some(8), 3)], [37, 9]),
                    a[1].pad_slice(&empty, [3, 2]),
                    a[2].pad_slice(&huge, [4, 5]),
                ]
            },
            vec![
                values(dtype, &[37, 3], 48),
                values(dtype, &[0, 2], 49),
                values(dtype, &[1, 3], 50),
            ],
        ));
    }
}

fn shape_edge_cases(cases: &mut Vec<Case>) {
    cases.push(case(
        "size-0 dims",
        |a| vec![a[0].exp(), &a[0] + &a[1], a[0].sum(&[0], false)],
        vec![
            values(DType::F32, &[0, 3], 31),
            values(DType::F32, &[1, 3], 32),
        ],
    ));
    cases.push(case(
        "size-1 dims broadcast",
        |a| vec![(&a[0] * &a[1]).tanh() - &a[0]],
        vec![
            values(DType::F32, &[1, 1, 4], 33),
            values(DType::F32, &[3, 1, 1], 34),
        ],
    ));
    for n in [1, 255, 257, 1000, 4099] {
        cases.push(case(
            format!("odd length {n} f16 chain"),
            |a| vec![((&a[0] * 1.5).sigmoid() + &a[0]).cast(DType::F32)],
            vec![values(DType::F16, &[n], 35)],
        ));
    }
    cases.push(case(
        "an elementwise dispatch of more than 65,535 workgroups",
        |a| vec![(&a[0] + 1.0).maximum(0.0)],
        vec![values(DType::U8, &[65_536 * 256 + 3], 36)],
    ));
    cases.push(case(
        "a scalar argument returned as it is and a constant",
        |a| vec![a[0].clone(), Array::scalar(2.5, DType::F32), a[0].clone()],
        vec![Array::scalar(7.0, DType::F32)],
    ));
}

/// Integers casting to f16/bf16, rounded once from the exact integer
/// (through f32, 2^24 + 2^16 + 1 would be a tie that bf16 rounds down).
fn integer_to_half_cases(cases: &mut Vec<Case>) {
    const INF: f64 = f64::INFINITY;
    let signed = [
        16_842_753.0,
        -16_842_753.0,
        16_842_752.0,
        16_908_289.0,
        2_147_483_647.0,
        -2_147_483_648.0,
        65_519.0,
        65_520.0,
        2_049.0,
        2_051.0,
    ];
    let to_halves: Program = |a| vec![a[0].cast(DType::BF16), a[0].cast(DType::F16)];
    cases.push(
        case(
            "i32 to bf16 and f16 rounds once from the exact integer",
            to_halves,
            vec![array(DType::I32, &signed)],
        )
        .exact()
        .expecting(vec![
            data(
                DType::BF16,
                &[
                    16_908_288.0,
                    -16_908_288.0,
                    16_777_216.0,
                    16_908_288.0,
                    2_147_483_648.0,
                    -2_147_483_648.0,
                    65_536.0,
                    65_536.0,
                    2_048.0,
                    2_048.0,
                ],
            ),
            data(
                DType::F16,
                &[
                    INF, -INF, INF, INF, INF, -INF, 65_504.0, INF, 2_048.0, 2_052.0,
                ],
            ),
        ]),
    );
    cases.push(
        case(
            "u32 and u8 to bf16 and f16 round once from the exact integer",
            |a| {
                vec![
                    a[0].cast(DType::BF16),
                    a[0].cast(DType::F16),
                    a[1].cast(DType::BF16),
                ]
            },
            vec![
                array(
                    DType::U32,
                    &[16_842_753.0, 4_294_967_295.0, 2_155_872_257.0, 2_049.0],
                ),
                array(DType::U8, &[255.0, 0.0, 1.0, 129.0]),
            ],
        )
        .exact()
        .expecting(vec![
            data(
                DType::BF16,
                &[16_908_288.0, 4_294_967_296.0, 2_164_260_864.0, 2_048.0],
            ),
            data(DType::F16, &[INF, INF, INF, 2_048.0]),
            data(DType::BF16, &[255.0, 0.0, 1.0, 129.0]),
        ]),
    );
    let sweep = integers_near_half_midpoints(31);
    let signed: Vec<i32> = sweep
        .iter()
        .enumerate()
        .map(|(k, &m)| if k % 3 == 0 { -(m as i32) } else { m as i32 })
        .collect();
    let unsigned = integers_near_half_midpoints(32);
    cases.push(
        case(
            "integers near 16-bit midpoints cast to bf16 and f16 as on the CPU, fused too",
            |a| {
                vec![
                    a[0].cast(DType::BF16),
                    a[0].cast(DType::F16),
                    a[1].cast(DType::BF16),
                    a[1].cast(DType::F16),
                    (a[0].cast(DType::BF16) - a[1].cast(DType::BF16)).cast(DType::F32),
                ]
            },
            vec![
                Array::from_vec(signed, &[4_096]).expect("4096 values"),
                Array::from_vec(unsigned, &[4_096]).expect("4096 values"),
            ],
        )
        .exact(),
    );
}

/// 4,096 integers below 2^`bits` within a few units of a midpoint of two
/// neighbouring bf16 (8 significant bits) or f16 (11) values, at every
/// magnitude: where rounding through f32 first would go wrong.
fn integers_near_half_midpoints(bits: u32) -> Vec<u32> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..4_096u32)
        .map(|k| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let digits = if k % 2 == 0 { 8 } else { 11 };
            // The leading `digits` bits, then the midpoint bit at `shift - 1`.
            let shift = 1 + (k / 2) % (bits - digits);
            let leading = (1 << (digits - 1)) | ((state >> 40) as u32 & ((1 << (digits - 1)) - 1));
            let offset = (state >> 20) as i64 % 5 - 2;
            let midpoint = (i64::from(leading) << shift) + (1 << (shift - 1));
            (midpoint + offset).clamp(0, (1 << bits) - 1) as u32
        })
        .collect()
}

/// f32 beyond the f16 range rounds as IEEE 754 does, though WGSL's
/// pack2x16float leaves such values undefined.
fn f16_overflow_cases(cases: &mut Vec<Case>) {
    const INF: f64 = f64::INFINITY;
    let big = [
        65_504.0, 65_510.0, 65_519.99, 65_520.0, -70_000.0, -65_519.0, 1e10, -1e38,
    ];
    cases.push(
        case(
            "f32 to f16 rounds to 65504 below 65520 and to infinity from it",
            |a| vec![a[0].cast(DType::F16), (&a[0] * 1.0).cast(DType::F16) * 1.0],
            vec![array(DType::F32, &big)],
        )
        .exact()
        .expecting(vec![
            data(
                DType::F16,
                &[
                    65_504.0, 65_504.0, 65_504.0, INF, -INF, -65_504.0, INF, -INF,
                ],
            ),
            data(
                DType::F16,
                &[
                    65_504.0, 65_504.0, 65_504.0, INF, -INF, -65_504.0, INF, -INF,
                ],
            ),
        ]),
    );
    cases.push(
        case(
            "f16 arithmetic overflows to infinity",
            |a| vec![&a[0] * &a[0], &a[0] + &a[0]],
            vec![array(DType::F16, &[300.0, -300.0, 40_000.0, 255.0])],
        )
        .exact()
        .expecting(vec![
            data(DType::F16, &[INF, INF, INF, 65_024.0]),
            data(DType::F16, &[600.0, -600.0, INF, 510.0]),
        ]),
    );
}

/// Scalars baked into kernels (or carried in their parameters) hold the
/// value of the dtype nearest the exact scalar, rounded once.
fn scalar_constant_cases(cases: &mut Vec<Case>) {
    // 2^60 + 2^36 + 1: through f64 a tie that f32 rounds down to 2^60.
    const BIG: i64 = (1 << 60) + (1 << 36) + 1;
    cases.push(
        case(
            "scalar constants and operands round once to the dtype",
            |a| {
                vec![
                    &a[0] * 16_842_753.0f64,
                    &a[0] * 16_842_753i64,
                    Array::full(&[2], 16_842_753.0, DType::BF16),
                    &a[1] * BIG,
                    &a[2] * (1.0 + 2f64.powi(-11) + 2f64.powi(-40)),
                ]
            },
            vec![
                array(DType::BF16, &[1.0, -1.0]),
                array(DType::F32, &[1.0, -1.0]),
                array(DType::F16, &[1.0, -1.0]),
            ],
        )
        .exact()
        .expecting(vec![
            data(DType::BF16, &[16_908_288.0, -16_908_288.0]),
            data(DType::BF16, &[16_908_288.0, -16_908_288.0]),
            data(DType::BF16, &[16_908_288.0, 16_908_288.0]),
            data(
                DType::F32,
                &[
                    2f64.powi(60) + 2f64.powi(37),
                    -(2f64.powi(60) + 2f64.powi(37)),
                ],
            ),
            data(DType::F16, &[1.0 + 2f64.powi(-10), -(1.0 + 2f64.powi(-10))]),
        ]),
    );
    for n in [4, 3] {
        cases.push(
            case(
                format!("float zero constants divide and multiply as IEEE 754 [{n}]"),
                |a| vec![&a[0] / 0.0, &a[0] * 0.0, &a[0] / -0.0],
                vec![array(DType::F32, &[1.0, -2.0, 0.0, f64::INFINITY][..n])],
            )
            .exact(),
        );
    }
}

fn mean_cases(cases: &mut Vec<Case>) {
    let means: [(&str, Program); 3] = [
        ("mean axis 1", |a| vec![a[0].mean(&[1], false)]),
        ("mean axes 0,2 keepdims", |a| vec![a[0].mean(&[0, 2], true)]),
        ("mean all", |a| vec![a[0].mean_all()]),
    ];
    for dtype in NUMERIC {
        for (name, program) in means {
            cases.push(case(
                format!("{name} {dtype} [3,70,5]"),
                program,
                vec![values(dtype, &[3, 70, 5], 40)],
            ));
        }
    }
    cases.push(
        case(
            "mean of integers and bool is f32",
            |a| {
                vec![
                    a[0].mean(&[1], false),
                    a[1].mean_all(),
                    a[2].mean_all(),
                    a[3].mean_all(),
                ]
            },
            vec![
                Array::from_vec(vec![1i32, 2, 3, 5, -7, 0], &[3, 2]).expect("6 values"),
                Array::full(&[300], 200.0, DType::U8),
                Array::from_vec(vec![true, false, true, true], &[4]).expect("4 values"),
                Array::full(&[70_000], 7.0, DType::U32),
            ],
        )
        .expecting(vec![
            data(DType::F32, &[1.5, 4.0, -3.5]),
            data(DType::F32, &[200.0]),
            data(DType::F32, &[0.75]),
            data(DType::F32, &[7.0]),
        ]),
    );
    cases.push(
        case(
            "mean of f16 and bf16 sums and divides in f32 past the 16-bit range",
            |a| vec![a[0].mean_all(), a[0].mean(&[0], true), a[1].mean_all()],
            vec![
                Array::full(&[70_000, 1], 2.0, DType::F16),
                Array::full(&[70_000], 3.0, DType::BF16),
            ],
        )
        .expecting(vec![
            data(DType::F16, &[2.0]),
            data(DType::F16, &[2.0]),
            data(DType::BF16, &[3.0]),
        ]),
    );
    let nan = f64::NAN;
    cases.push(
        case(
            "mean over an empty axis is NaN",
            |a| {
                vec![
                    a[0].mean(&[1], false),
                    a[1].mean(&[1], true),
                    a[2].mean(&[0], false),
                    a[3].mean(&[1], false),
                ]
            },
            vec![
                values(DType::F32, &[3, 0], 41),
                values(DType::F16, &[2, 0], 42),
                values(DType::BF16, &[0, 2], 43),
                values(DType::U8, &[2, 0], 44),
            ],
        )
        .exact()
        .expecting(vec![
            data(DType::F32, &[nan; 3]),
            data(DType::F16, &[nan; 2]),
            data(DType::BF16, &[nan; 2]),
            data(DType::F32, &[nan; 2]),
        ]),
    );
}

/// pow's special cases as C99 / IEEE 754 `pow` has them, on the values
/// where they are exact: zeros, infinities, NaN and one.
fn pow_cases(cases: &mut Vec<Case>) {
    const INF: f64 = f64::INFINITY;
    const NAN: f64 = f64::NAN;
    // (x, y, x^y)
    let table: [(f64, f64, f64); 28] = [
        (0.0, -1.0, INF),
        (-0.0, -1.0, -INF),
        (-0.0, -2.0, INF),
        (0.0, -0.5, INF),
        (-0.0, 3.0, -0.0),
        (-0.0, 2.0, 0.0),
        (0.0, -INF, INF),
        (-0.0, INF, 0.0),
        (1.0, NAN, 1.0),
        (1.0, INF, 1.0),
        (1.0, -INF, 1.0),
        (NAN, 0.0, 1.0),
        (NAN, -0.0, 1.0),
        (INF, 0.0, 1.0),
        (-1.0, INF, 1.0),
        (-1.0, -INF, 1.0),
        (0.5, INF, 0.0),
        (0.5, -INF, INF),
        (-3.0, INF, INF),
        (-3.0, -INF, 0.0),
        (-2.0, 0.5, NAN),
        (-8.0, 1.0 / 3.0, NAN),
        (NAN, 1.0, NAN),
        (-1.0, NAN, NAN),
        (-INF, 3.0, -INF),
        (-INF, -3.0, -0.0),
        (-INF, 0.5, INF),
        (INF, -2.0, 0.0),
    ];
    let xs: Vec<f64> = table.iter().map(|t| t.0).collect();
    let ys: Vec<f64> = table.iter().map(|t| t.1).collect();
    let want: Vec<f64> = table.iter().map(|t| t.2).collect();
    for dtype in FLOATS {
        // 28 elements run four per invocation for f32; 27 one per invocation.
        for n in [28, 27] {
            cases.push(
                case(
                    format!("pow follows the C99 special cases {dtype} [{n}]"),
                    |a| vec![a[0].pow(&a[1])],
                    vec![array(dtype, &xs[..n]), array(dtype, &ys[..n])],
                )
                .exact()
                .expecting(vec![data(dtype, &want[..n])]),
            );
        }
        cases.push(
            case(
                format!("pow of a negative base takes the sign of an integral exponent {dtype}"),
                |a| vec![a[0].pow(&a[1]), a[0].pow(3.0)],
                vec![
                    array(dtype, &[-2.0, -2.0, -2.0, -2.0, -0.5, -3.0]),
                    array(dtype, &[3.0, 2.0, -3.0, -2.0, 5.0, 1.5]),
                ],
            )
            .expecting(vec![
                data(dtype, &[-8.0, 4.0, -0.125, 0.25, -0.03125, NAN]),
                data(dtype, &[-8.0, -8.0, -8.0, -8.0, -0.125, -27.0]),
            ]),
        );
    }
}

/// Subnormal inputs and results, compared bit for bit under the subnormal
/// rule: a backend may give zero where the reference has a subnormal. Each
/// program is one where flushing any subnormal along the way flushes the
/// output, so the rule is all the slack there is.
fn subnormal_cases(cases: &mut Vec<Case>) {
    let tiny = f64::from(f32::MIN_POSITIVE);
    let f32_subnormals = [1e-40, -1e-40, 1e-45, -3e-39, 1.0, 0.0, tiny, -tiny / 4.0];
    for n in [8, 7] {
        cases.push(
            case(
                format!("f32 subnormal inputs pass through neg, abs, add and maximum [{n}]"),
                |a| {
                    vec![
                        a[0].neg(),
                        a[0].abs(),
                        &a[0] + &a[0],
                        a[0].maximum(0.0),
                        &a[0] * 0.5,
                    ]
                },
                vec![array(DType::F32, &f32_subnormals[..n])],
            )
            .exact(),
        );
    }
    cases.push(
        case(
            "f32 products underflow to subnormals",
            |a| vec![&a[0] * &a[1]],
            vec![
                array(DType::F32, &[1e-20, -1e-20, 3e-21, 1e-30, 1.0]),
                array(DType::F32, &[1e-20, 1e-20, 1e-20, 1e-15, 1e-39]),
            ],
        )
        .exact(),
    );
    // Each doubles to a subnormal: a doubled 0x007f or 0x0040 would be
    // normal, and a GPU that flushes the input gives 0 for it (NVIDIA).
    let bf16_subnormals = HostData::BF16(
        [0x0001, 0x003f, 0x8001, 0x0020, 0x3f80]
            .map(bf16::from_bits)
            .to_vec(),
    );
    cases.push(
        case(
            "bf16 subnormals add, widen to f32 and come back from f32",
            |a| vec![&a[0] + &a[0], a[0].cast(DType::F32), a[1].cast(DType::BF16)],
            vec![
                Array::from_data(bf16_subnormals, &[5]).expect("5 values"),
                array(DType::F32, &[1e-40, -1.1e-38, 3e-39, 1.0, -1e-45]),
            ],
        )
        .exact(),
    );
    let f16_subnormals = HostData::F16(
        [0x0001, 0x03ff, 0x8001, 0x0200, 0x3c00]
            .map(f16::from_bits)
            .to_vec(),
    );
    cases.push(
        case(
            "f16 subnormals add, halve and come from f32",
            |a| vec![&a[0] + &a[0], &a[0] * 0.5, a[1].cast(DType::F16)],
            vec![
                Array::from_data(f16_subnormals, &[5]).expect("5 values"),
                array(DType::F32, &[1e-6, -3e-5, 6e-8, 1.0, -1e-7]),
            ],
        )
        .exact(),
    );
}

/// Values where floor and round half to even must round exactly: halves,
/// signed zeros, the largest non-integers, integers from 2^23 up and the
/// special values.
const ROUNDING_EDGES: [f64; 14] = [
    0.5,
    1.5,
    2.5,
    -0.5,
    -2.5,
    -0.3,
    -0.0,
    1.7,
    -1.7,
    8_388_607.5,
    -3.0e9,
    f64::INFINITY,
    f64::NEG_INFINITY,
    f64::NAN,
];

/// The `jax.numpy` compositions (no op family of their own: they lower to
/// the families' kernels), each against a host reference where one is
/// short to write.
fn array_api_cases(cases: &mut Vec<Case>) {
    let floor: Vec<f64> = ROUNDING_EDGES.iter().map(|v| v.floor()).collect();
    let round: Vec<f64> = ROUNDING_EDGES.iter().map(|v| v.round_ties_even()).collect();
    cases.push(
        case(
            "floor and round half to even",
            |a| vec![a[0].floor(), a[0].round()],
            vec![array(DType::F32, &ROUNDING_EDGES)],
        )
        .exact()
        .expecting(vec![data(DType::F32, &floor), data(DType::F32, &round)]),
    );
    cases.push(
        case(
            "sign keeps signed zeros and NaN",
            |a| vec![a[0].sign()],
            vec![array(DType::F32, &[-2.0, -0.0, 0.0, 3.0, f64::NAN])],
        )
        .exact()
        .expecting(vec![data(DType::F32, &[-1.0, -0.0, 0.0, 1.0, f64::NAN])]),
    );
    let logs = [1e-7, -0.5, 3.0, 1e-3];
    let log1p: Vec<f64> = logs.iter().map(|v: &f64| v.ln_1p()).collect();
    cases.push(
        case(
            "log1p",
            |a| vec![a[0].log1p()],
            vec![array(DType::F32, &logs)],
        )
        .expecting(vec![data(DType::F32, &log1p)]),
    );
    let ints = [3.0, -1.0, 4.0, -1.0, 5.0, 9.0];
    cases.push(
        case(
            "cumsum, argmin, prod and sort of i32",
            |a| {
                vec![
                    a[0].cumsum(0),
                    a[0].argmin(0, false),
                    a[0].prod(&[0], false),
                    a[0].sort(0),
                    a[0].argsort(0, true),
                ]
            },
            vec![array(DType::I32, &ints)],
        )
        .exact()
        .expecting(vec![
            data(DType::I32, &[3.0, 2.0, 6.0, 5.0, 10.0, 19.0]),
            data(DType::U32, &[1.0]),
            data(DType::I32, &[540.0]),
            data(DType::I32, &[-1.0, -1.0, 3.0, 4.0, 5.0, 9.0]),
            data(DType::I32, &[5.0, 4.0, 2.0, 0.0, 1.0, 3.0]),
        ]),
    );
    cases.push(
        case(
            "top_k takes NaN first and ties to the lower index",
            |a| {
                let (values, indices) = a[0].top_k(3);
                vec![values, indices]
            },
            vec![array(DType::F32, &[1.0, 5.0, f64::NAN, 5.0, -2.0])],
        )
        .exact()
        .expecting(vec![
            data(DType::F32, &[f64::NAN, 5.0, 5.0]),
            data(DType::I32, &[2.0, 1.0, 3.0]),
        ]),
    );
    for dtype in FLOATS {
        cases.push(case(
            format!("cumsum, var, logsumexp and sort {dtype}"),
            |a| {
                vec![
                    a[0].cumsum(1),
                    a[0].var(&[1], 1, false),
                    a[0].logsumexp(&[0], false),
                    a[0].sort(1),
                ]
            },
            vec![values(dtype, &[3, 5], 90)],
        ));
    }
    for dtype in FLOATS {
        cases.push(case(
            format!("square, tan, clip, std, argmin, prod and logsumexp {dtype}"),
            |a| {
                vec![
                    a[0].square(),
                    a[0].tan(),
                    a[0].clip(Some(-0.5), Some(0.5)),
                    a[0].std(&[1], 0, false),
                    a[0].argmin(1, false),
                    a[0].prod(&[1], false),
                    a[0].logsumexp(&[1], true),
                ]
            },
            vec![values(dtype, &[4, 7], 94)],
        ));
    }
    let long: Vec<f64> = (0..1000).map(|i| f64::from((i * 7919) % 13 - 6)).collect();
    let running: Vec<f64> = long
        .iter()
        .scan(0.0, |s, v| {
            *s += v;
            Some(*s)
        })
        .collect();
    cases.push(
        case(
            "cumsum of a long axis, in blocks",
            |a| vec![a[0].cumsum(0)],
            vec![array(DType::I32, &long)],
        )
        .exact()
        .expecting(vec![data(DType::I32, &running)]),
    );
    cases.push(case(
        "cumsum of a long f32 axis, in blocks",
        |a| vec![a[0].cumsum(1)],
        vec![values(DType::F32, &[2, 300], 95)],
    ));
    for dtype in NUMERIC.into_iter().chain([DType::Bool]) {
        cases.push(
            case(
                format!("argsort {dtype} along a middle axis, both orders, ties stable"),
                |a| vec![a[0].argsort(1, false), a[0].argsort(1, true), a[0].sort(0)],
                vec![values(dtype, &[3, 70, 2], 93)],
            )
            .exact(),
        );
    }
    cases.push(case(
        "einsum contractions",
        |a| {
            vec![
                kiln::einsum("bij,jk->bki", &[&a[0], &a[1]]),
                kiln::einsum("bij->j", &[&a[0]]),
            ]
        },
        vec![
            values(DType::F32, &[2, 3, 4], 91),
            values(DType::F32, &[4, 5], 92),
        ],
    ));
    cases.push(
        case(
            "stack, split, tile, repeat and pad of u8",
            |a| {
                let parts = a[0].split(2, 0).expect("2 rows");
                vec![kiln::stack(&parts, 1)
                    .tile(&[2, 1, 1])
                    .repeat(2, 2)
                    .pad(&[(1, 0), (0, 1), (0, 0)], 7.0)]
            },
            vec![Array::from_vec(vec![1u8, 2, 3, 4], &[2, 2]).expect("4 bytes")],
        )
        .exact(),
    );
    cases.push(
        case(
            "compositions of empty and 0-d arrays",
            |a| {
                vec![
                    a[0].cumsum(0),
                    a[0].sort(1),
                    a[0].prod(&[0], false),
                    a[1].round(),
                    a[1].flatten(),
                ]
            },
            vec![
                Array::zeros(&[0, 3], DType::F32),
                Array::scalar(-2.5, DType::F32),
            ],
        )
        .exact()
        .expecting(vec![
            data(DType::F32, &[]),
            data(DType::F32, &[]),
            data(DType::F32, &[1.0, 1.0, 1.0]),
            data(DType::F32, &[-2.0]),
            data(DType::F32, &[-2.5]),
        ]),
    );
}

fn all_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    unary_cases(&mut cases);
    binary_cases(&mut cases);
    select_and_cast_cases(&mut cases);
    reduction_cases(&mut cases);
    matmul_cases(&mut cases);
    layout_cases(&mut cases);
    transpose_cases(&mut cases);
    shape_edge_cases(&mut cases);
    integer_to_half_cases(&mut cases);
    f16_overflow_cases(&mut cases);
    scalar_constant_cases(&mut cases);
    mean_cases(&mut cases);
    pow_cases(&mut cases);
    subnormal_cases(&mut cases);
    array_api_cases(&mut cases);
    user_op_cases(&mut cases);
    cases
}

/// `out = x * a + b` as a user kernel (x and b of one shape).
fn axpb_kernel() -> &'static kiln::Kernel {
    static KERNEL: std::sync::OnceLock<kiln::Kernel> = std::sync::OnceLock::new();
    KERNEL.get_or_init(|| {
        kiln::Kernel::builder("axpb", ["x", "b"])
            .template("A", 1.5f32)
            .shape_rule(|inputs, cx| {
                let dims: Vec<kiln::Dim> = inputs[0]
                    .shape
                    .dims()
                    .iter()
                    .zip(inputs[1].shape.dims())
                    .map(|(a, b)| cx.unify(a, b).unwrap_or_else(|| a.clone()))
                    .collect();
                Ok(kiln::Aval::new(dims, inputs[0].dtype))
            })
            .reference(|call| {
                let a = call.template("A").unwrap_or(1.0);
                let (x, b) = (call.inputs[0].to_f64_vec(), call.inputs[1].to_f64_vec());
                let values = x
                    .iter()
                    .zip(&b)
                    .map(|(x, b)| *x as f32 * a as f32 + *b as f32);
                Ok(HostData::from_f64s(call.out_dtype, values.map(f64::from)))
            })
            .wgsl(
                "@group(0) @binding(0) var<storage, read> params: array<u32>;
                 @group(0) @binding(1) var<storage, read_write> out: array<f32>;
                 @group(0) @binding(2) var<storage, read> x: array<f32>;
                 @group(0) @binding(3) var<storage, read> b: array<f32>;
                 @compute @workgroup_size(32)
                 fn main(@builtin(global_invocation_id) id: vec3<u32>) {
                     if id.x < params[0] { out[id.x] = x[id.x] * A + b[id.x]; }
                 }",
            )
            .build()
            .expect("the axpb kernel is valid")
    })
}

/// A custom op over `(x, (scale, shift))` composing softmax and a matmul.
fn mixer_op() -> &'static kiln::CustomOp<(Array, (f32, Array))> {
    static OP: std::sync::OnceLock<kiln::CustomOp<(Array, (f32, Array))>> =
        std::sync::OnceLock::new();
    OP.get_or_init(|| {
        kiln::CustomOp::new("mixer", |(x, (scale, shift)): &(Array, (f32, Array))| {
            Ok(kiln::nn::softmax(&(x * *scale), -1).matmul(&x.transpose()) + shift)
        })
    })
}

/// User kernels and custom ops join the suite: values, fused neighbours,
/// sizes that are not multiples of the workgroup.
fn user_op_cases(cases: &mut Vec<Case>) {
    for n in [7, 64, 100] {
        cases.push(case(
            format!("user kernel axpb [{n}]"),
            |a| vec![axpb_kernel().call(&[&a[0], &a[1]])],
            vec![values(DType::F32, &[n], 3), values(DType::F32, &[n], 4)],
        ));
    }
    cases.push(case(
        "user kernel between fused ops, two templates",
        |a| {
            let k = axpb_kernel();
            let y = k.call(&[&a[0].exp(), &(&a[1] * 2.0)]);
            let z = k.call_with(&[&y, &a[1]], &[("A", (-0.5f32).into())]);
            vec![(z + 1.0).tanh(), y]
        },
        vec![
            values(DType::F32, &[3, 5], 5),
            values(DType::F32, &[3, 5], 6),
        ],
    ));
    cases.push(case(
        "custom op with a composite forward",
        |a| {
            let out = mixer_op().call(&(a[0].clone(), (0.5, a[1].clone())));
            vec![out.exp(), out]
        },
        vec![
            values(DType::F32, &[4, 6], 7),
            values(DType::F32, &[4, 4], 8),
        ],
    ));
}

/// Runs every case on `backend`, fused and unfused; `Err` lists every
/// failure.
fn run_suite<B: Backend + Clone>(backend: &B) -> Result<usize, String> {
    let mut failures = Vec::new();
    let mut ran = 0;
    for case in all_cases() {
        for fusion in [true, false] {
            ran += 1;
            let expected = case.expected.as_deref();
            if let Err(e) = check_case(
                backend.clone(),
                case.program,
                &case.inputs,
                fusion,
                case.rule,
                expected,
            ) {
                failures.push(format!("{} (fusion {fusion}): {e}", case.name));
            }
        }
    }
    if failures.is_empty() {
        Ok(ran)
    } else {
        Err(format!(
            "{} of {ran} runs failed:\n{}",
            failures.len(),
            failures.join("\n")
        ))
    }
}

/// The device limits a lowering test uses: WebGPU's guaranteed ones, with
/// or without native f16.
fn lowering_caps() -> [Caps; 2] {
    let portable = Caps::default();
    let with_f16 = Caps {
        native_f16: true,
        ..Caps::default()
    };
    [portable, with_f16]
}

/// The CPU executor under another name, compiling graphs as a GPU backend
/// gets them: it does not claim to read transposed operands, so products
/// keep their permutes (`Backend::reads_transposed_operands`).
#[derive(Clone, Copy)]
struct CompiledAsForAGpu;

impl Backend for CompiledAsForAGpu {
    type Buffer = Arc<HostData>;

    fn name(&self) -> &str {
        "cpu, compiled as for a gpu"
    }

    fn upload(&self, data: &Arc<HostData>) -> kiln::Result<Arc<HostData>> {
        CpuBackend.upload(data)
    }

    fn download(&self, buffer: Arc<HostData>) -> kiln::Result<Arc<HostData>> {
        CpuBackend.download(buffer)
    }

    fn run(
        &self,
        exe: &kiln::Executable,
        inputs: Vec<Arc<HostData>>,
        shapes: &[Vec<usize>],
    ) -> kiln::Result<Vec<Arc<HostData>>> {
        CpuBackend.run(exe, inputs, shapes)
    }
}

/// The program of `case` (fused or not) for `caps`, lowered without a device.
fn lower_case(case: &Case, fusion: bool, caps: &Caps) -> Result<(Lowered, Vec<u64>), String> {
    let program = case.program;
    let compiled = compile(move |xs: Vec<Array>| program(&xs))
        .fusion(fusion)
        .with_backend(CompiledAsForAGpu);
    let exe = compiled
        .executable(&case.inputs)
        .map_err(|e| format!("compile: {e}"))?;
    let shapes = kiln_tests::value_shapes(&exe, &case.inputs);
    let lowered = kiln_kernels::lower(&exe, &shapes, caps).map_err(|e| format!("lower: {e}"))?;
    let input_bytes = case
        .inputs
        .iter()
        .map(|x| kiln_kernels::storage_bytes(x.dtype(), x.shape().numel().known().unwrap_or(0)))
        .collect();
    Ok((lowered, input_bytes))
}

#[test]
fn every_conformance_case_lowers_without_a_device_to_a_program_that_passes_the_checks() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for case in all_cases() {
        for fusion in [true, false] {
            for caps in lowering_caps() {
                let outcome = lower_case(&case, fusion, &caps)
                    .and_then(|(program, inputs)| program.check(&caps, &inputs));
                checked += 1;
                if let Err(e) = outcome {
                    failures.push(format!(
                        "{} (fusion {fusion}, f16 {}): {e}",
                        case.name, caps.native_f16
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked}:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(checked >= 1400, "only {checked} lowerings");
}

#[test]
fn every_kernel_the_conformance_cases_lower_to_translates_to_msl() {
    let mut translated = std::collections::HashSet::new();
    let mut failures = Vec::new();
    for case in all_cases() {
        for fusion in [true, false] {
            for caps in lowering_caps() {
                let (program, _) =
                    lower_case(&case, fusion, &caps).unwrap_or_else(|e| panic!("{e}"));
                for step in &program.steps {
                    let Step::Dispatch(d) = step else { continue };
                    let key = (d.source.clone(), d.entry_point.clone(), d.bindings.len());
                    if translated.contains(&key) {
                        continue;
                    }
                    let bindings = d.bindings.len() as u32;
                    match kiln_metal::msl::translate(&d.op, &d.source, &d.entry_point, bindings) {
                        Ok(kernel) if kernel.sizes_index.is_some_and(|i| i != bindings) => failures
                            .push(format!(
                                "{}: sizes buffer at {:?}",
                                case.name, kernel.sizes_index
                            )),
                        Ok(_) => {
                            translated.insert(key);
                        }
                        Err(e) => failures.push(format!("{} (fusion {fusion}): {e}", case.name)),
                    }
                }
            }
        }
    }
    println!("{} distinct kernels translated to MSL", translated.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(translated.len() >= 200, "only {} kernels", translated.len());
}

#[test]
fn a_value_read_twice_by_one_kernel_is_bound_once() {
    let square = case(
        "x * x and x @ x",
        |x| vec![&x[0] * &x[0], x[0].matmul(&x[0])],
        vec![values(DType::F32, &[8, 8], 3)],
    );
    let caps = Caps::default();
    let (program, inputs) = lower_case(&square, false, &caps).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(program.check(&caps, &inputs), Ok(()));
    let dispatches: Vec<_> = program
        .steps
        .iter()
        .filter_map(|step| match step {
            Step::Dispatch(d) => Some(d),
            _ => None,
        })
        .collect();
    let multiply = dispatches.iter().find(|d| d.op == "mul").expect("x * x");
    assert_eq!(multiply.bindings.len(), 3, "parameters, output and x once");
    let product = dispatches.iter().find(|d| d.op == "matmul").expect("x @ x");
    assert_eq!(
        product.bindings.len(),
        4,
        "parameters, output, x and its copy"
    );
    assert!(program.arena_use.copies > 0);
}

#[test]
fn the_program_check_rejects_an_output_overlapping_an_operand_and_an_unwritten_output() {
    let case = case(
        "exp of a sum",
        |x| vec![(x[0].exp() + &x[0]).sum_all()],
        vec![values(DType::F32, &[64], 1)],
    );
    let caps = Caps::default();
    let (program, inputs) = lower_case(&case, false, &caps).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(program.check(&caps, &inputs), Ok(()));

    let mut overlapping = program.clone();
    let dispatch = overlapping
        .steps
        .iter_mut()
        .find_map(|step| match step {
            Step::Dispatch(d) if d.bindings.len() > 2 => Some(d),
            _ => None,
        })
        .expect("a dispatch with an operand");
    let output = dispatch.bindings[1];
    dispatch.bindings[2] = kiln_kernels::program::Range {
        offset: output.offset,
        bytes: output.bytes + 4,
        ..output
    };
    let error = overlapping.check(&caps, &inputs).unwrap_err();
    assert!(error.contains("overlaps binding 1"), "{error}");

    let mut unwritten = program.clone();
    unwritten.steps.retain(|step| match step {
        Step::Dispatch(d) => !matches!(d.bindings[1].buffer, Buffer::Output(_)),
        Step::Copy { to, .. } => !matches!(to.buffer, Buffer::Output(_)),
        Step::Clear(_) | Step::Branch { .. } | Step::Jump { .. } => true,
    });
    assert_eq!(
        unwritten.check(&caps, &inputs),
        Err("output 0 is never written".to_string())
    );

    // A loop's branch leaves forward; a jump goes back over a branch that
    // leaves to the step after it.
    let last = program.steps.len();
    let word = kiln_kernels::program::Range {
        buffer: Buffer::Arena,
        offset: program.arena_bytes - 4,
        bytes: 4,
    };
    let mut backwards = program.clone();
    backwards.steps.push(Step::Branch {
        predicate: word,
        exit: 0,
    });
    assert_eq!(
        backwards.check(&caps, &inputs),
        Err(format!("step {last} leaves its loop to step 0"))
    );
    let mut stray_jump = program.clone();
    stray_jump.steps.push(Step::Jump { to: 0 });
    let error = stray_jump.check(&caps, &inputs).unwrap_err();
    assert!(
        error.starts_with(&format!("step {last} jumps to step 0")),
        "{error}"
    );
    let mut looped = program.clone();
    looped.steps.insert(
        0,
        Step::Branch {
            predicate: word,
            exit: last + 2,
        },
    );
    looped.steps.push(Step::Jump { to: 0 });
    assert_eq!(looped.check(&caps, &inputs), Ok(()));
}

#[test]
fn cpu_executor_passes_the_conformance_suite() {
    let ran = run_suite(&CpuBackend).unwrap_or_else(|e| panic!("{e}"));
    assert!(ran >= 700, "only {ran} runs");
}

#[test]
fn wgpu_passes_the_conformance_suite() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let ran = run_suite(&gpu).unwrap_or_else(|e| panic!("on {}: {e}", gpu.adapter()));
    assert!(ran >= 700, "only {ran} runs");
}

#[cfg(target_vendor = "apple")]
#[test]
fn metal_passes_the_conformance_suite() {
    let Some(metal) = kiln_tests::gpu::metal() else {
        return;
    };
    let ran = run_suite(&metal).unwrap_or_else(|e| panic!("on {}: {e}", metal.name()));
    assert!(ran >= 700, "only {ran} runs");
}

#[test]
fn wgpu_with_f16_packed_in_words_passes_the_conformance_suite() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let packed = gpu.with_packed_f16();
    assert!(!packed.has_shader_f16());
    let ran = run_suite(&packed).unwrap_or_else(|e| panic!("on {}: {e}", packed.adapter()));
    assert!(ran >= 700, "only {ran} runs");
}

/// `take`/`slice` and their transposes on `x: [n, 4]`, `idx: [m]`, with the
/// transposes' sizes taken from `x`'s (symbolic, when shapeless) shape.
fn transposes_of_symbolic_sizes((x, idx): (Array, Array)) -> Vec<Array> {
    let n = x.shape().dims()[0].clone();
    let back = x.take(&idx, 0).scatter_add(&idx, 0, n);
    let axes = [sl(1, None, 2), sl(1, None, 1)];
    let padded = (x.slice(&axes) * 2.0).pad_slice(&axes, x.shape());
    vec![back, padded]
}

/// Compiles [`transposes_of_symbolic_sizes`] shapelessly for `backend` and
/// for the CPU executor, calls both at two sizes, and compares them; `Err`
/// says where they differ. The backend must trace once.
fn check_shapeless_transposes<B: Backend>(backend: B) -> Result<(), String> {
    let on_backend = compile(transposes_of_symbolic_sizes)
        .shapeless()
        .with_backend(backend);
    let on_cpu = compile(transposes_of_symbolic_sizes).shapeless();
    for (n, m) in [(5, 7), (8, 3)] {
        let x = values(DType::F32, &[n, 4], 60 + n as u64);
        let idx: Vec<i32> = (0..m as i32).map(|i| (i * 3 % 5) - 2).collect();
        let args = (x, Array::from_vec(idx, &[m]).expect("m indices"));
        let got = on_backend.call(&args).map_err(|e| format!("n={n}: {e}"))?;
        let want = on_cpu.call(&args).map_err(|e| format!("cpu n={n}: {e}"))?;
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            if g.shape() != w.shape() || g.shape().as_known() != Some(vec![n, 4]) {
                return Err(format!(
                    "n={n} output {k}: shape {} vs {}",
                    g.shape(),
                    w.shape()
                ));
            }
            let (g, w) = (
                g.data().map_err(|e| e.to_string())?,
                w.data().map_err(|e| e.to_string())?,
            );
            compare(&g, &w).map_err(|e| format!("n={n} output {k}: {e}"))?;
        }
    }
    let cache = on_backend.cache();
    if (cache.entries, cache.misses, cache.hits) != (1, 1, 1) {
        return Err(format!(
            "traced {} times for two sizes ({} hits)",
            cache.misses, cache.hits
        ));
    }
    Ok(())
}

#[test]
fn cpu_executor_runs_shapeless_transposes_at_two_sizes_with_one_trace() {
    check_shapeless_transposes(CpuBackend).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn wgpu_runs_shapeless_transposes_at_two_sizes_with_one_trace() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    check_shapeless_transposes(gpu.clone()).unwrap_or_else(|e| panic!("on {}: {e}", gpu.adapter()));
}

/// Every case exports to StableHLO, and the user-kernel cases are an `Err`
/// naming the kernel and its op id. Under `cargo xtask xla`
/// (`KILN_XLA_CASES` set) each exported case is written with its inputs
/// and the CPU executor's results, for XLA to run and compare under the
/// case's rule.
#[test]
fn every_conformance_case_exports_to_stablehlo() {
    use kiln_tests::xla::{cases_dir, write_case, Case as XlaCase, Match, Run};
    let root = cases_dir();
    let mut failures = Vec::new();
    let mut exported_cases = 0;
    for (i, case) in all_cases().into_iter().enumerate() {
        let program = case.program;
        let compiled = compile(move |xs: Vec<Array>| program(&xs));
        let result = compiled.export(&case.inputs);
        if case.name.starts_with("user kernel") {
            match result {
                Err(e) if e.to_string().contains("user kernel `axpb`") => {}
                other => {
                    failures.push(format!("{}: {other:?}, want an Err naming axpb", case.name))
                }
            }
            continue;
        }
        let exported = match result {
            Ok(exported) => exported,
            Err(e) => {
                failures.push(format!("{}: {e}", case.name));
                continue;
            }
        };
        exported_cases += 1;
        assert!(exported.stablehlo().contains("func.func public @main"));
        if let Some(root) = &root {
            let outputs = compiled
                .call(&case.inputs)
                .expect("the case runs on the CPU");
            let rule = match case.rule {
                Rule::Exact => Match::Exact,
                Rule::Tolerance => Match::Tolerance,
            };
            let xla_case = XlaCase {
                name: format!("conformance_{i:03}"),
                exported: &exported,
                rule,
                runs: vec![Run {
                    inputs: case.inputs.clone(),
                    outputs,
                }],
                mesh: None,
                training: None,
                collectives: Vec::new(),
            };
            write_case(root, &xla_case).expect("the case is written");
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(exported_cases > 100, "only {exported_cases} cases exported");
}
