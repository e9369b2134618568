//! The MSL of a few kernels, one per kind of binding and feature, compared
//! with reviewed snapshots in `tests/snapshots/`, so a change of naga or of
//! the translation options cannot pass silently. `KILN_BLESS=1` rewrites
//! them (review the diff).

use kiln::{DType, Op, ReduceOp, UnaryOp};
use kiln_kernels::{KernelSpec, Target, View};
use kiln_metal::msl::{translate, MslKernel};
use std::path::PathBuf;

/// The translation of `spec` as a program binds it: parameters, output,
/// the bound operands and, for a checking kernel, the status word.
fn translated(op: &str, spec: &KernelSpec) -> MslKernel {
    let bindings = 2 + spec.bound.len() as u32 + u32::from(spec.status);
    translate(op, &spec.source, "main", bindings).unwrap_or_else(|e| panic!("{e}"))
}

/// What a snapshot keeps of a kernel's MSL: the sizes struct and the
/// kernel function, where bindings, bounds checks and launch attributes
/// show (the op library before them is the same in every kernel).
fn reviewed_part(source: &str) -> String {
    let sizes = source
        .split_once("struct _mslBufferSizes {")
        .and_then(|(_, rest)| rest.split_once("};"))
        .map_or(String::new(), |(members, _)| {
            format!("struct _mslBufferSizes {{{members}}};\n\n")
        });
    let kernel = source
        .lines()
        .skip_while(|line| !line.contains("kernel void"))
        .collect::<Vec<_>>()
        .join("\n");
    format!("{sizes}{kernel}\n")
}

fn check_snapshot(name: &str, kernel: &MslKernel) {
    let reviewed = reviewed_part(&kernel.source);
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(format!("{name}.msl"));
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::write(&path, &reviewed).expect("the snapshot is written");
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (KILN_BLESS=1 writes it)", path.display()));
    assert!(
        reviewed == want,
        "the MSL of `{name}` changed; review it and rerun with KILN_BLESS=1:\n{reviewed}"
    );
}

#[test]
fn an_f32_exp_kernel_translates_with_its_buffers_at_their_binding_indices() {
    let x = View::contiguous(DType::F32, &[1024]);
    let spec = kiln_kernels::elementwise(
        &Op::Unary(UnaryOp::Exp),
        &[x],
        &[1024],
        DType::F32,
        Target::default(),
    )
    .expect("exp has a kernel");
    let kernel = translated("exp", &spec);
    assert_eq!(kernel.threads_per_group, [256, 1, 1]);
    assert_eq!(kernel.sizes_index, Some(3));
    assert_eq!(kernel.sized_bindings, vec![0, 1, 2]);
    for index in 0..3 {
        assert!(
            kernel.source.contains(&format!("[[buffer({index})]]")),
            "buffer {index} missing:\n{}",
            kernel.source
        );
    }
    check_snapshot("exp_f32", &kernel);
}

#[test]
fn a_native_f16_cast_translates_to_metal_half() {
    let x = View::contiguous(DType::F32, &[64]);
    let spec = kiln_kernels::elementwise(
        &Op::Cast(DType::F16),
        &[x],
        &[64],
        DType::F16,
        Target { native_f16: true },
    )
    .expect("casts have kernels");
    let kernel = translated("cast", &spec);
    assert!(kernel.source.contains("half"), "{}", kernel.source);
    check_snapshot("cast_f32_to_f16_native", &kernel);
}

#[test]
fn a_take_kernel_binds_its_status_word_after_its_operands() {
    let spec = kiln_kernels::take(
        DType::F32,
        &[8, 4],
        DType::I32,
        3,
        0,
        &[3, 4],
        Target::default(),
    )
    .expect("take has a kernel");
    assert!(spec.status);
    let kernel = translated("take", &spec);
    assert_eq!(kernel.sizes_index, Some(5));
    assert!(kernel.source.contains("[[buffer(4)]]"));
    assert!(
        kernel.source.contains("atomic_fetch_max"),
        "{}",
        kernel.source
    );
    check_snapshot("take_f32_i32", &kernel);
}

#[test]
fn a_sum_with_workgroup_memory_translates_with_it_zeroed() {
    let spec = kiln_kernels::reduce(
        ReduceOp::Sum,
        DType::F32,
        &[16, 300],
        &[1],
        Target::default(),
    )
    .expect("sum has a kernel");
    let kernel = translated("sum", &spec);
    assert!(kernel.source.contains("threadgroup"), "{}", kernel.source);
    check_snapshot("sum_f32_rows", &kernel);
}

#[test]
fn a_missing_entry_point_is_an_error_naming_it() {
    let x = View::contiguous(DType::F32, &[4]);
    let spec = kiln_kernels::elementwise(
        &Op::Unary(UnaryOp::Exp),
        &[x],
        &[4],
        DType::F32,
        Target::default(),
    )
    .expect("exp has a kernel");
    let error = translate("exp", &spec.source, "nowhere", 3).unwrap_err();
    assert_eq!(
        error.to_string(),
        "the WGSL of `exp` has no compute entry point `nowhere`"
    );
}
