//! Every static kernel, instantiated for every dtype it supports, and
//! generated fused kernels pass naga's parser and validator.

use kiln::ops::{FusedArg, FusedKernel, FusedStep};
use kiln::{BinaryOp, DType, Op, ReduceOp, SliceAxis, UnaryOp};
use kiln_kernels::{
    argmax, check_indices, concat, copy, elementwise, matmul, pad_slice, reduce, scatter_add, take,
    validate, KernelError, KernelSpec, MatmulVariant, Target, View,
};
use std::sync::Arc;

/// Packed f16 (core WebGPU) and native f16 (SHADER_F16).
const TARGETS: [Target; 2] = [Target { native_f16: false }, Target { native_f16: true }];

fn assert_valid(what: &str, spec: &KernelSpec) {
    if let Err(message) = validate(&spec.source) {
        panic!("{what} does not validate:\n{message}\n{}", spec.source);
    }
}

#[test]
fn every_unary_and_binary_kernel_validates_for_every_dtype_it_supports() {
    for target in TARGETS {
        // 15 elements compute one per invocation, 20 four (vec4 lanes).
        for shape in [[3, 5], [4, 5]] {
            let mut built = 0;
            for dtype in DType::ALL {
                for op in UnaryOp::ALL {
                    let x = View::contiguous(dtype, &shape);
                    if let Ok(spec) = elementwise(&Op::Unary(op), &[x], &shape, dtype, target) {
                        assert_valid(op.name(), &spec);
                        built += 1;
                    }
                }
                for op in BinaryOp::ALL {
                    let a = View::broadcast(dtype, &shape[1..], &shape);
                    let b = View::broadcast(dtype, &[shape[0], 1], &shape);
                    let c = View::contiguous(dtype, &shape);
                    let out = if op.is_comparison() {
                        DType::Bool
                    } else {
                        dtype
                    };
                    for operands in [[a.clone(), b], [c, a]] {
                        if let Ok(spec) =
                            elementwise(&Op::Binary(op), &operands, &shape, out, target)
                        {
                            assert_valid(op.name(), &spec);
                            built += 1;
                        }
                    }
                }
            }
            // Unary: 12 ops on 3 float dtypes, neg/abs/relu on i32, abs/relu on
            // u32 and u8. Binary (two operand layouts each): 13 ops on 3 float
            // dtypes, 6 arithmetic ops and 6 comparisons on 3 integer dtypes,
            // maximum/minimum and 6 comparisons on bool.
            assert_eq!(built, (12 * 3 + 3 + 2 * 2) + 2 * (13 * 3 + 12 * 3 + 8));
        }
    }
}

#[test]
fn select_and_every_cast_validate() {
    for target in TARGETS {
        for n in [7, 8] {
            for from in DType::ALL {
                for to in DType::ALL {
                    let x = View::contiguous(from, &[n]);
                    assert_valid(
                        "cast",
                        &elementwise(&Op::Cast(to), &[x], &[n], to, target).unwrap(),
                    );
                }
                let c = View::contiguous(DType::Bool, &[n]);
                let a = View::contiguous(from, &[n]);
                let b = View::broadcast(from, &[1], &[n]);
                let spec = elementwise(&Op::Select, &[c, a, b], &[n], from, target).unwrap();
                assert_valid("where", &spec);
            }
        }
    }
}

#[test]
fn a_generated_fused_chain_of_one_hundred_ops_validates() {
    for target in TARGETS {
        let mut steps = vec![FusedStep {
            op: Op::Binary(BinaryOp::Add),
            args: vec![FusedArg::Input(0), FusedArg::Input(1)],
        }];
        for j in 1..100 {
            let op = if j % 2 == 0 {
                Op::Unary(UnaryOp::Tanh)
            } else {
                Op::Binary(BinaryOp::Mul)
            };
            let args = if j % 2 == 0 {
                vec![FusedArg::Step(j - 1)]
            } else {
                vec![FusedArg::Step(j - 1), FusedArg::Input(1)]
            };
            steps.push(FusedStep { op, args });
        }
        let kernel = Op::Fused(Arc::new(FusedKernel::new(steps, 2).unwrap()));
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let a = View::contiguous(dtype, &[4, 8]);
            let b = View::broadcast(dtype, &[8], &[4, 8]);
            let spec = elementwise(&kernel, &[a, b], &[4, 8], dtype, target).unwrap();
            assert_valid("fused chain", &spec);
            assert_eq!(spec.source.matches("fn element").count(), 1);
        }
    }
}

#[test]
fn layout_kernels_validate_for_every_dtype() {
    for target in TARGETS {
        for dtype in DType::ALL {
            let transposed = View::strided(dtype, 0, vec![1, 3], &[4, 3]);
            assert!(!transposed.contiguous);
            assert_valid("copy", &copy(&transposed, &[4, 3], target).unwrap());
            let spec = concat(dtype, &[&[2, 3], &[2, 1], &[2, 4]], 1, &[2, 8], target).unwrap();
            assert_valid("concat", &spec);
            for index in [DType::I32, DType::U32] {
                assert_valid(
                    "take",
                    &take(dtype, &[4, 3], index, 5, 0, &[5, 3], target).unwrap(),
                );
            }
        }
    }
}

#[test]
fn scatter_add_validates_for_every_dtype_but_bool_and_reports_through_a_status_word() {
    for target in TARGETS {
        for dtype in DType::ALL {
            for index in [DType::I32, DType::U32] {
                let built = scatter_add(dtype, index, 5, 1, &[2, 4, 3], target);
                if dtype == DType::Bool {
                    assert!(matches!(built, Err(KernelError::Unsupported { .. })));
                    continue;
                }
                let spec = built.unwrap();
                assert_valid("scatter_add", &spec);
                assert!(spec.status);
                assert_eq!(spec.bound, [0, 1]);
                // [workgroups, inner, index count, n]: a workgroup per
                // eight rows of each of the two outer slices.
                assert_eq!(spec.params, [2, 3, 5, 4]);
                assert_eq!(spec.workgroups, 2);
            }
            assert!(scatter_add(dtype, DType::F32, 5, 0, &[4], target).is_err());
        }
    }
}

#[test]
fn the_index_check_of_empty_results_validates_and_skips_axes_beyond_i32() {
    for target in TARGETS {
        for index in [DType::I32, DType::U32] {
            let spec = check_indices("take", index, 7, 3, target).unwrap().unwrap();
            assert_valid("check_indices", &spec);
            assert!(spec.status);
            assert_eq!(spec.params, [7, 3]);
            let huge = i32::MAX as usize + 1;
            assert_eq!(check_indices("take", index, 7, huge, target), Ok(None));
        }
        assert!(check_indices("take", DType::F32, 7, 3, target).is_err());
    }
}

#[test]
fn pad_slice_validates_for_every_dtype_with_one_parameter_row_per_axis() {
    let axes = [
        SliceAxis {
            start: 1,
            stop: None,
            step: 2,
        },
        SliceAxis {
            start: -2,
            stop: None,
            step: i64::MAX,
        },
    ];
    for target in TARGETS {
        for dtype in DType::ALL {
            let spec = pad_slice(dtype, &axes, &[5, 3], target).unwrap();
            assert_valid("pad_slice", &spec);
            // [count, rank, (size, start, step, taken, stride) per axis]: the
            // second axis takes one element, so its huge step becomes 1.
            assert_eq!(spec.params, [15, 2, 5, 1, 2, 2, 1, 3, 1, 1, 1, 1]);
            assert_valid(
                "pad_slice of a scalar",
                &pad_slice(dtype, &[], &[], target).unwrap(),
            );
        }
    }
}

#[test]
fn reductions_argmax_and_matmuls_validate_for_every_dtype_they_support() {
    for target in TARGETS {
        for dtype in DType::ALL {
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
                match reduce(op, dtype, &[3, 4, 5], &[0, 2], target) {
                    Ok(spec) => assert_valid(op.name(), &spec),
                    Err(_) => assert_eq!((op, dtype), (ReduceOp::Sum, DType::Bool)),
                }
            }
            assert_valid("argmax", &argmax(dtype, &[3, 4], 1, target).unwrap());
            if dtype != DType::Bool {
                for variant in [
                    MatmulVariant::Tiled,
                    MatmulVariant::Skinny,
                    MatmulVariant::Naive,
                ] {
                    // n = 5 reads b by elements, n = 8 (and k = 4) a vec4 at a
                    // time; a transposed operand by elements, in place.
                    for n in [5, 8] {
                        let shapes = |t: [bool; 2]| {
                            let a = if t[0] { vec![2, 4, 3] } else { vec![2, 3, 4] };
                            let b = if t[1] { vec![n, 4] } else { vec![4, n] };
                            (a, b)
                        };
                        for transposed in [[false, false], [true, false], [false, true]] {
                            let (a, b) = shapes(transposed);
                            let spec =
                                matmul(variant, dtype, &a, &b, &[2, 3, n], transposed, target)
                                    .unwrap();
                            assert_valid("matmul", &spec);
                        }
                    }
                }
            }
        }
    }
}
#[test]
fn an_operand_sharing_the_output_buffer_is_read_through_the_output_binding() {
    for target in TARGETS {
        for (dtype, n) in [DType::F32, DType::F16, DType::BF16, DType::U8]
            .into_iter()
            .flat_map(|d| [(d, 5), (d, 8)])
        {
            let shared = View {
                aliases_output: true,
                ..View::contiguous(dtype, &[n])
            };
            let other = View::contiguous(dtype, &[n]);
            let spec = elementwise(
                &Op::Binary(BinaryOp::Maximum),
                &[shared, other],
                &[n],
                dtype,
                target,
            )
            .unwrap();
            assert_valid("in-place maximum", &spec);
            let load = spec.source.split("fn load_0").nth(1).unwrap();
            let load = &load[..load.find('}').unwrap()];
            assert!(load.contains("out[") && !load.contains("in_0"), "{load}");
        }
        let broadcast = View {
            aliases_output: true,
            ..View::broadcast(DType::F32, &[1], &[5])
        };
        let err = elementwise(
            &Op::Unary(UnaryOp::Exp),
            &[broadcast],
            &[5],
            DType::F32,
            target,
        )
        .unwrap_err();
        assert!(err.to_string().contains("in place"), "{err}");
    }
}

#[test]
fn scalar_constants_are_baked_into_the_source_or_carried_in_the_parameters() {
    for target in TARGETS {
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::I32, DType::Bool] {
            // 0xffff_ffff is NaN for the floats, which WGSL constants cannot
            // hold; a float 0 is read at run time so that no compiler folds
            // a division by it.
            let words = [
                (1, 6),
                (0xffff_ffff, 6),
                (0, 6),
                (1, 8),
                (0xffff_ffff, 8),
                (0, 8),
            ];
            for (word, n) in words {
                let x = View::contiguous(dtype, &[n]);
                let constant = View::inline(dtype, word);
                let spec = elementwise(
                    &Op::Binary(BinaryOp::Maximum),
                    &[x, constant],
                    &[n],
                    dtype,
                    target,
                )
                .unwrap();
                assert_valid("maximum with an inlined scalar", &spec);
                assert_eq!(spec.bound, vec![0], "no binding for the constant");
                assert!(!spec.source.contains("in_1"));
                let in_params = spec.params.last() == Some(&word);
                assert_eq!(
                    in_params,
                    dtype.is_float() && word != 1,
                    "{dtype} {word:#x}"
                );
            }
        }
    }
}

#[test]
fn native_f16_kernels_enable_f16_and_bind_f16_arrays_and_packed_ones_bind_words() {
    let x = View::contiguous(DType::F16, &[3]);
    let native = elementwise(
        &Op::Unary(UnaryOp::Exp),
        std::slice::from_ref(&x),
        &[3],
        DType::F16,
        Target { native_f16: true },
    )
    .unwrap();
    assert!(native.source.starts_with("enable f16;"));
    assert!(
        native.source.contains("in_0: array<f16>") && native.source.contains("out: array<f16>")
    );
    assert_eq!(native.workgroups, 1);
    let packed = elementwise(
        &Op::Unary(UnaryOp::Exp),
        &[x],
        &[3],
        DType::F16,
        Target::default(),
    )
    .unwrap();
    assert!(!packed.source.contains("enable f16"));
    assert!(packed.source.contains("unpack2x16float") && packed.source.contains("store_pair"));
}

#[test]
fn elementwise_kernels_compute_four_one_word_elements_per_invocation_when_four_divides_the_count() {
    let target = Target::default();
    let exp = Op::Unary(UnaryOp::Exp);
    let add = Op::Binary(BinaryOp::Add);
    // 4096 f32 elements: 1024 invocations of vec4 lanes in 4 workgroups.
    let x = View::contiguous(DType::F32, &[64, 64]);
    let spec = elementwise(
        &exp,
        std::slice::from_ref(&x),
        &[64, 64],
        DType::F32,
        target,
    )
    .unwrap();
    assert_eq!(spec.params[0], 1024);
    assert_eq!(spec.workgroups, 4);
    assert!(spec.source.contains("out: array<vec4<u32>>"));
    assert!(spec.source.contains("in_0: array<vec4<u32>>"));
    // A broadcast operand is read element by element into the lanes.
    let row = View::broadcast(DType::F32, &[64], &[64, 64]);
    let spec = elementwise(&add, &[x, row], &[64, 64], DType::F32, target).unwrap();
    assert_valid("vectorized add", &spec);
    assert!(spec.source.contains("in_1: array<u32>"));
    assert_eq!(spec.params[0], 1024);
    // An odd count, or a 16-bit float, keeps one element per invocation.
    let odd = View::contiguous(DType::F32, &[63]);
    let spec = elementwise(&exp, &[odd], &[63], DType::F32, target).unwrap();
    assert_eq!(spec.params[0], 63);
    assert!(spec.source.contains("out: array<u32>"));
    let half = View::contiguous(DType::F16, &[64]);
    let spec = elementwise(&exp, &[half], &[64], DType::F16, TARGETS[1]).unwrap();
    assert_eq!(spec.params[0], 64);
    assert!(spec.source.contains("out: array<f16>"));
}
