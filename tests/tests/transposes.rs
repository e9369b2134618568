//! `scatter_add` and `pad_slice`, the transposes of `take` and `slice` that
//! autodiff emits: their place in the passes (never fused, never in place,
//! plans that verify), their runtime errors on every backend, and the
//! transposition identities checked end to end on the CPU executor and on
//! wgpu with integer data, where every sum is exact.

use kiln::{compile, Array, Backend, CpuBackend, DType, Op, SliceAxis, ValueKind};
use kiln_tests::programs::cases;
use proptest::prelude::*;

/// An elementwise chain around each transpose, so fusion and reinplacing
/// have every chance to absorb or overwrite them.
fn chains((x, idx, g): (Array, Array, Array)) -> Vec<Array> {
    let scattered = (g.exp() + 1.0).scatter_add(&idx, 0, 6) * 2.0 + 1.0;
    let axes = [
        SliceAxis {
            start: 1,
            stop: None,
            step: 2,
        },
        SliceAxis::full(),
    ];
    let padded = (x.slice(&axes).tanh() - 1.0)
        .pad_slice(&axes, x.shape())
        .exp();
    vec![scattered, padded]
}

fn chain_inputs() -> (Array, Array, Array) {
    let x = Array::from_vec((0..24).map(|i| i as f32 * 0.1).collect(), &[6, 4]).expect("x");
    let idx = Array::from_vec(vec![5, -1, 0], &[3]).expect("idx");
    let g = Array::from_vec((0..12).map(|i| i as f32 * -0.2).collect(), &[3, 4]).expect("g");
    (x, idx, g)
}

#[test]
fn fusion_keeps_the_transposes_out_of_groups_and_never_runs_them_in_place() {
    let f = compile(chains);
    let exe = f.executable(&chain_inputs()).expect("compiles");
    let graph = exe.graph();
    let mut seen = Vec::new();
    for (v, node) in graph.nodes.iter().enumerate() {
        let ValueKind::Op(op) = &node.kind else {
            continue;
        };
        if let Op::Fused(group) = op {
            for step in group.steps() {
                assert!(
                    !matches!(step.op, Op::ScatterAdd { .. } | Op::PadSlice { .. }),
                    "{} fused",
                    step.op
                );
            }
        }
        if matches!(op, Op::ScatterAdd { .. } | Op::PadSlice { .. }) {
            seen.push(op.name().to_string());
            assert_eq!(exe.plan().in_place_of(v), None, "{op} ran in place");
        }
    }
    assert_eq!(seen, ["scatter_add", "pad_slice"]);
    let shapes: Vec<Vec<usize>> = graph
        .nodes
        .iter()
        .map(|n| n.aval.shape.as_known().expect("static"))
        .collect();
    exe.plan()
        .verify(graph, &shapes)
        .expect("the plan verifies");
    // Fused and reinplaced execution equals op by op.
    let unfused = compile(chains).fusion(false);
    let (a, b) = (f.call(&chain_inputs()), unfused.call(&chain_inputs()));
    let (a, b) = (a.expect("fused"), b.expect("unfused"));
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(
            x.to_vec::<f32>().expect("f32"),
            y.to_vec::<f32>().expect("f32")
        );
    }
}

#[test]
fn scatter_add_values_on_the_cpu_executor() {
    let updates = Array::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]).expect("u");
    let idx = Array::from_vec(vec![2u32, 0, 2], &[3]).expect("idx");
    let out = updates.scatter_add(&idx, 0, 4);
    assert_eq!(out.shape().as_known(), Some(vec![4, 2]));
    assert_eq!(
        out.to_vec::<f32>().expect("f32"),
        [3.0, 4.0, 0.0, 0.0, 6.0, 8.0, 0.0, 0.0]
    );
}

#[test]
fn scatter_add_and_pad_slice_errors_name_the_op_and_shapes() {
    let updates = Array::ones(&[3, 2], DType::F32);
    let idx = Array::from_vec(vec![0i32, 1], &[2]).expect("idx");
    let err = updates
        .scatter_add(&idx, 0, 4)
        .data()
        .expect_err("3 rows, 2 indices");
    let msg = err.to_string();
    assert!(
        msg.contains("scatter_add") && msg.contains("f32[3,2], i32[2]"),
        "{msg}"
    );
    let flags = Array::ones(&[2], DType::Bool);
    let err = flags
        .scatter_add(&idx, 0, 4)
        .data()
        .expect_err("bool updates");
    assert!(err.to_string().contains("cannot add bool updates"), "{err}");
    let every_other = [SliceAxis {
        start: 0,
        stop: None,
        step: 2,
    }];
    let err = Array::ones(&[2], DType::F32)
        .pad_slice(&every_other, [6])
        .data()
        .expect_err("the slice has 3 elements");
    let msg = err.to_string();
    assert!(
        msg.contains("pad_slice") && msg.contains("f32[2]") && msg.contains("[3]"),
        "{msg}"
    );
    let err = Array::ones(&[2], DType::F32)
        .scatter_add(&idx, 0, usize::MAX)
        .data()
        .expect_err("too large");
    assert!(err.to_string().contains("scatter_add"), "{err}");
}

/// `x.scatter_add` with an index out of range fails at run time, naming
/// the op, the axis and its size, on `backend` as on the CPU executor.
fn check_out_of_range<B: Backend>(backend: B) {
    let scatter = |(g, i): (Array, Array)| g.scatter_add(&i, 0, 3);
    let f = compile(scatter).with_backend(backend);
    let g = Array::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4]).expect("g");
    let bad = Array::from_vec(vec![0, 2, 3, -4], &[4]).expect("indices");
    let err = f.call(&(g.clone(), bad)).expect_err("index 3 of 3");
    let message = err.to_string();
    assert!(
        message.contains("`scatter_add`") && message.contains("out of range for axis 0 of size 3"),
        "{message}"
    );
    let good = Array::from_vec(vec![-1, 0, 2, 0], &[4]).expect("indices");
    let y = f.call(&(g, good)).expect("in range");
    assert_eq!(y.to_vec::<f32>().expect("f32"), [6.0, 0.0, 4.0]);
}

#[test]
fn an_index_out_of_range_in_scatter_add_is_a_runtime_error_on_the_cpu() {
    check_out_of_range(CpuBackend);
}

#[test]
fn an_index_out_of_range_in_scatter_add_is_a_runtime_error_on_wgpu() {
    if let Some(gpu) = kiln_tests::gpu::backend() {
        check_out_of_range(gpu);
    }
}

/// Results with no elements still check their indices, as the reference
/// does: `take` and `scatter_add` with empty rows, and `scatter_add` into
/// an empty axis, on `backend` as on the CPU executor.
fn check_empty_results_check_indices<B: Backend + Clone>(backend: B) {
    let both = |(x, g, i): (Array, Array, Array)| vec![x.take(&i, 0), g.scatter_add(&i, 0, 2)];
    let f = compile(both).with_backend(backend.clone());
    let x = Array::zeros(&[2, 0], DType::F32);
    let g = Array::zeros(&[1, 0], DType::F32);
    let bad = Array::from_vec(vec![2], &[1]).expect("index");
    let err = f
        .call(&(x.clone(), g.clone(), bad))
        .expect_err("index 2 of 2");
    assert!(
        err.to_string()
            .contains("out of range for axis 0 of size 2"),
        "{err}"
    );
    let good = Array::from_vec(vec![-2], &[1]).expect("index");
    let out = f.call(&(x, g, good)).expect("in range");
    assert_eq!(out[0].shape().as_known(), Some(vec![1, 0]));
    assert_eq!(out[1].shape().as_known(), Some(vec![2, 0]));
    let into_nothing =
        compile(|(g, i): (Array, Array)| g.scatter_add(&i, 0, 0)).with_backend(backend);
    let g = Array::ones(&[1], DType::F32);
    let err = into_nothing
        .call(&(g, Array::from_vec(vec![0u32], &[1]).expect("index")))
        .expect_err("no row 0 in an empty axis");
    let message = err.to_string();
    assert!(
        message.contains("`scatter_add`") && message.contains("axis 0 of size 0"),
        "{message}"
    );
}

#[test]
fn empty_results_still_check_their_indices_on_the_cpu() {
    check_empty_results_check_indices(CpuBackend);
}

#[test]
fn empty_results_still_check_their_indices_on_wgpu() {
    if let Some(gpu) = kiln_tests::gpu::backend() {
        check_empty_results_check_indices(gpu);
    }
}

/// Integer data in f32: every product and sum below is an exact integer.
fn ints(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7 + seed) % 9) as f32 - 4.0)
        .collect()
}

/// A `[rows, cols]` operand, indices (some negative) and a strided slice.
fn problem() -> impl Strategy<Value = (usize, usize, Vec<i32>, SliceAxis, SliceAxis)> {
    (1usize..7, 0usize..5).prop_flat_map(|(rows, cols)| {
        let r = rows as i32;
        let axis = |n: i64| {
            (0i64..=n, proptest::option::of(-n..=n), 1i64..4)
                .prop_map(|(start, stop, step)| SliceAxis { start, stop, step })
        };
        (
            Just(rows),
            Just(cols),
            prop::collection::vec(-r..r, 0..9),
            axis(rows as i64),
            axis(cols as i64),
        )
    })
}

/// `sum(take(x, i) * g) - sum(x * scatter_add(g, i))` and the same for
/// `slice`/`pad_slice`, compiled for `backend`: both must be 0.
fn transposition_gaps<B: Backend>(
    backend: B,
    (rows, cols, idx, a0, a1): (usize, usize, Vec<i32>, SliceAxis, SliceAxis),
) -> Vec<f32> {
    let x = Array::from_vec(ints(rows * cols, 1), &[rows, cols]).expect("x");
    let k = idx.len();
    let g = Array::from_vec(ints(k * cols, 5), &[k, cols]).expect("g");
    let indices = Array::from_vec(idx, &[k]).expect("indices");
    let axes = [a0, a1];
    let sliced = x.slice(&axes);
    let h = Array::from_vec(
        ints(sliced.shape().numel_known().expect("static"), 3),
        &sliced.shape().as_known().expect("static"),
    )
    .expect("h");
    let f = compile(move |(x, g, i, h): (Array, Array, Array, Array)| {
        let take_gap = (x.take(&i, 0) * &g).sum_all()
            - (&x * g.scatter_add(&i, 0, x.shape().0[0].clone())).sum_all();
        let slice_gap =
            (x.slice(&axes) * &h).sum_all() - (&x * h.pad_slice(&axes, x.shape())).sum_all();
        vec![take_gap, slice_gap]
    })
    .with_backend(backend);
    f.call(&(x, g, indices, h))
        .expect("runs")
        .iter()
        .map(|gap| gap.item::<f32>().expect("scalar"))
        .collect()
}

/// A `scatter_add` into `[outer, n, inner]` along axis 1 of f32 updates
/// at `indices` (negative ones counting from the end): sizes that cross
/// the wgpu kernel's blocks of eight rows, 64 columns and 512-index chunks.
fn scatter_problem() -> impl Strategy<Value = (usize, usize, usize, Vec<i32>)> {
    (1usize..3, 1usize..20, 1usize..70).prop_flat_map(|(outer, n, inner)| {
        let index = -(n as i32)..(n as i32);
        let indices = prop::collection::vec(index, 0..1300);
        (Just(outer), Just(n), Just(inner), indices)
    })
}

/// The scatter_add of [`scatter_problem`] on `backend`, as f32 bits.
fn scatter_bits<B: Backend>(
    backend: B,
    (outer, n, inner, indices): &(usize, usize, usize, Vec<i32>),
) -> Vec<u32> {
    let count = indices.len();
    let updates: Vec<f32> = (0..outer * count * inner)
        .map(|i| ((i * 7919) % 1000) as f32 / 7.0 - 70.0)
        .collect();
    let updates = Array::from_vec(updates, &[*outer, count, *inner]).expect("updates");
    let idx = Array::from_vec(indices.clone(), &[count]).expect("indices");
    let n = *n;
    let f = compile(move |(g, i): (Array, Array)| g.scatter_add(&i, 1, n)).with_backend(backend);
    let out = f
        .call(&(updates, idx))
        .expect("runs")
        .to_vec::<f32>()
        .expect("f32");
    out.iter().map(|v| v.to_bits()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(16)))]

    /// Every output sums its updates in index order on wgpu as on the CPU
    /// executor, so the f32 sums agree to the bit.
    #[test]
    fn scatter_add_on_wgpu_matches_the_cpu_executor_bit_for_bit(p in scatter_problem()) {
        if let Some(gpu) = kiln_tests::gpu::backend() {
            prop_assert_eq!(scatter_bits(gpu, &p), scatter_bits(CpuBackend, &p));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(64)))]

    #[test]
    fn transposition_holds_on_the_cpu_executor(p in problem()) {
        prop_assert_eq!(transposition_gaps(CpuBackend, p), vec![0.0, 0.0]);
    }

    #[test]
    fn transposition_holds_on_wgpu(p in problem()) {
        if let Some(gpu) = kiln_tests::gpu::backend() {
            prop_assert_eq!(transposition_gaps(gpu, p), vec![0.0, 0.0]);
        }
    }

    #[cfg(target_vendor = "apple")]
    #[test]
    fn transposition_holds_on_metal(p in problem()) {
        if let Some(metal) = kiln_tests::gpu::metal() {
            prop_assert_eq!(transposition_gaps(metal, p), vec![0.0, 0.0]);
        }
    }
}
