//! Control flow under compile: `scan` equals the unrolled loop (random
//! bodies from the shared program generator), `cond` equals `select` of
//! both branches, `switch` clamps its index, `while_loop` and `fori_loop`
//! run their trip counts, `dynamic_slice` / `dynamic_update_slice` agree
//! with a host reference for every start (clamped ones included); a loop
//! is one node whose body is planned once, a carry the body overwrites
//! stays in one buffer (or is double-buffered with the reason recorded),
//! the planned peak of a decoding loop does not grow with its steps, a
//! shapeless scan runs three lengths with one trace, and bad bodies are
//! `Err`s naming the path and avals. Case count of the property tests:
//! `KILN_CASES` (CI default 16).

use kiln::{
    compile, cond, fori_loop, scan, scan_with, select, switch, while_loop, Array, Backend, Branch,
    DType, Executable, Refusal, ScanOptions, StepKind, ValueKind,
};
use kiln_tests::arrays::{close, example, normal, stack};
use kiln_tests::decoding::decode;
use kiln_tests::programs::{cases, instr, run, Instr};
use proptest::prelude::*;

fn int(v: i32) -> Array {
    Array::from_vec(vec![v], &[]).unwrap()
}

/// The ids of the nodes of `exe`'s graph whose op is named `name`.
fn nodes_named(exe: &Executable, name: &str) -> Vec<usize> {
    exe.graph()
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| matches!(&n.kind, ValueKind::Op(op) if op.name() == name))
        .map(|(v, _)| v)
        .collect()
}

/// A random body over a `[n, n]` carry, a `[1, n]` and a `[n, 1]` slice
/// and a captured `[n]` weight: the program's values, bounded by tanh so
/// long loops stay finite, broadcast back to the carry's and ys' shapes.
fn random_body(
    program: &[Instr],
    n: usize,
    w: &Array,
    c: Array,
    x: (Array, Array),
) -> (Array, Array) {
    let out = run(program, vec![c, x.0, x.1, w.clone()]);
    let carry = out[0].broadcast_to([n, n]).tanh();
    let y = out[1].broadcast_to([n, n]);
    (carry, y)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(16), ..ProptestConfig::default() })]

    #[test]
    fn scan_equals_the_unrolled_loop(
        program in prop::collection::vec(instr(), 1..10),
        steps in 1usize..6,
        reverse in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let n = 3;
        let (init, rows, cols, w) = (
            normal(seed, &[n, n]),
            normal(seed + 1, &[steps, 1, n]),
            normal(seed + 2, &[steps, n, 1]),
            normal(seed + 3, &[n]),
        );
        let f = compile(|(init, rows, cols, w): (Array, Array, Array, Array)| {
            scan_with(
                |c: Array, x: (Array, Array)| Ok(random_body(&program, n, &w, c, x)),
                &init,
                &(rows, cols),
                ScanOptions { reverse, ..ScanOptions::default() },
            )
        });
        let (carry, ys) = f.call(&(init.clone(), rows.clone(), cols.clone(), w.clone())).unwrap();
        let mut c = init;
        let mut want_ys = vec![None; steps];
        for step in 0..steps {
            let i = if reverse { steps - 1 - step } else { step };
            let x = (rows.slice_axis(0, i as i64, Some(i as i64 + 1), 1).squeeze(&[0]),
                     cols.slice_axis(0, i as i64, Some(i as i64 + 1), 1).squeeze(&[0]));
            let (next, y) = random_body(&program, n, &w, c, x);
            c = next;
            want_ys[i] = Some(y);
        }
        let want_ys: Vec<Array> = want_ys.into_iter().map(Option::unwrap).collect();
        close(&carry, &c, 1e-5, 1e-4);
        close(&ys, &stack(&want_ys, 0), 1e-5, 1e-4);
    }

    #[test]
    fn cond_equals_select_of_both_branches(seed in 0u64..1000, threshold in -1.0f32..1.0) {
        let (x, y) = (normal(seed, &[4]), normal(seed + 1, &[4]));
        let f = compile(|(x, y, t): (Array, Array, Array)| {
            let pred = x.sum_all().greater(&t);
            cond(&pred, |(x, y): (Array, Array)| Ok(&x * &y + 1.0), |(x, y): (Array, Array)| Ok(x.exp() - &y), &(x, y))
        });
        let t = Array::from_vec(vec![threshold], &[]).unwrap();
        let got = f.call(&(x.clone(), y.clone(), t.clone())).unwrap();
        let want = select(&x.sum_all().greater(&t), &(&x * &y + 1.0), &(x.exp() - &y));
        close(&got, &want, 0.0, 0.0);
    }

    #[test]
    fn dynamic_update_slice_matches_a_host_reference_for_any_start(
        i in -4i32..9, j in -4i32..9, seed in 0u64..1000,
    ) {
        let (x, u) = (normal(seed, &[5, 4]), normal(seed + 1, &[2, 3]));
        let f = compile(|(x, u, i, j): (Array, Array, Array, Array)| {
            let updated = x.dynamic_update_slice(&u, &[i.clone(), j.clone()]);
            let window = updated.dynamic_slice(&[i, j], &[2, 3]);
            (updated, window)
        });
        let (updated, window) = f.call(&(x.clone(), u.clone(), int(i), int(j))).unwrap();
        let (si, sj) = (i.clamp(0, 3) as usize, j.clamp(0, 1) as usize);
        let mut want = x.to_vec::<f32>().unwrap();
        let uv = u.to_vec::<f32>().unwrap();
        for r in 0..2 {
            for c in 0..3 {
                want[(si + r) * 4 + sj + c] = uv[r * 3 + c];
            }
        }
        prop_assert_eq!(updated.to_vec::<f32>().unwrap(), want);
        prop_assert_eq!(window.to_vec::<f32>().unwrap(), uv);
    }
}

#[test]
fn a_reverse_scan_without_xs_runs_its_length_and_keeps_the_slices_order() {
    let f = compile(|x: Array| {
        scan_with(
            |c: Array, (): ()| Ok((&c * 2.0, c)),
            &x,
            &(),
            ScanOptions {
                length: Some(4),
                reverse: true,
            },
        )
    });
    let (c, ys) = f.call(&int(1).cast(DType::F32)).unwrap();
    assert_eq!(c.item::<f32>().unwrap(), 16.0);
    // Iteration k (k = 0 first) writes row 3 - k.
    assert_eq!(ys.to_vec::<f32>().unwrap(), vec![8.0, 4.0, 2.0, 1.0]);
}

#[test]
fn fori_loop_and_while_loop_run_their_trip_counts_under_compile() {
    let f = compile(|x: Array| fori_loop(2, 7, |i, x: Array| Ok(&x + &i.cast(DType::F32)), &x));
    assert_eq!(
        f.call(&Array::scalar(0.5, DType::F32))
            .unwrap()
            .item::<f32>()
            .unwrap(),
        20.5
    );
    // Triples 1 until it passes 100: five steps, to 243.
    let triple = compile(|x: Array| {
        while_loop(
            |(x, _): (Array, Array)| Ok(x.less(100.0)),
            |(x, steps): (Array, Array)| Ok((&x * 3.0, steps + 1)),
            &(x, int(0)),
        )
    });
    let (x, steps) = triple.call(&Array::scalar(1.0, DType::F32)).unwrap();
    assert_eq!(
        (x.item::<f32>().unwrap(), steps.item::<i32>().unwrap()),
        (243.0, 5)
    );
}

#[test]
fn switch_clamps_its_index_to_the_branches() {
    let f = compile(|(i, x): (Array, Array)| {
        let branches: Vec<Branch<Array, Array>> = vec![
            Box::new(|x: Array| Ok(&x + 1.0)),
            Box::new(|x: Array| Ok(&x * 10.0)),
            Box::new(|x: Array| Ok(-&x)),
        ];
        switch(&i, branches, &x)
    });
    let x = Array::from_vec(vec![2.0f32, 3.0], &[2]).unwrap();
    let at = |i: i32| {
        f.call(&(int(i), x.clone()))
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    };
    assert_eq!(at(-5), vec![3.0, 4.0]);
    assert_eq!(at(1), vec![20.0, 30.0]);
    assert_eq!(at(99), vec![-2.0, -3.0]);
    assert_eq!(f.cache().entries, 1);
}

#[test]
fn a_thousand_step_scan_is_one_node_with_its_invariants_hoisted() {
    let f = compile(|(h, w, xs): (Array, Array, Array)| {
        scan(
            // `w.exp()` reads no carried or scanned value: computed once, outside.
            |h: Array, x: Array| Ok(((h.matmul(&w.exp()) + x).tanh(), ())),
            &h,
            &xs,
        )
        .map(|(h, ())| h)
    });
    let args = (
        normal(1, &[1, 8]),
        &normal(2, &[8, 8]) * 0.1,
        normal(3, &[1000, 1, 8]),
    );
    let exe = f.executable(&args).unwrap();
    let loops = nodes_named(&exe, "scan");
    assert_eq!(loops.len(), 1);
    assert_eq!(
        nodes_named(&exe, "exp").len(),
        1,
        "exp is computed outside the body"
    );
    assert!(nodes_named(&exe.bodies(loops[0])[0], "exp").is_empty());
    assert!(
        exe.graph().nodes.len() < 20,
        "{} nodes",
        exe.graph().nodes.len()
    );
    let h = f.call(&args).unwrap();
    assert!(h.to_vec::<f32>().unwrap().iter().all(|v| v.abs() <= 1.0));
}

fn decode_args(steps: usize) -> (Array, Array, Array) {
    kiln_tests::decoding::decode_args(steps, 16)
}

#[test]
fn a_decoding_loop_writes_its_cache_in_place_and_its_peak_does_not_grow_with_steps() {
    let mut peaks = Vec::new();
    for steps in [16, 256] {
        let f = compile(decode(steps));
        let args = decode_args(steps);
        let exe = f.executable(&args).unwrap();
        let scan_node = nodes_named(&exe, "scan")[0];
        let body = &exe.bodies(scan_node)[0];
        let update = nodes_named(body, "dynamic_update_slice")[0];
        // The cache (the body's input of its aval) is written in place
        // every iteration.
        assert!(
            body.plan().in_place_of(update).is_some(),
            "{:?}",
            body.plan().decisions()
        );
        assert_eq!(
            body.plan().home(update),
            body.plan().home(
                body.graph()
                    .nodes
                    .iter()
                    .position(|n| matches!(n.kind, ValueKind::Input(_))
                        && n.aval.to_string() == "f32[256,16]")
                    .unwrap()
            )
        );
        let shapes = exe.resolve_shapes(&[]).unwrap();
        let body_shapes = body.resolve_shapes(&[]).unwrap();
        peaks.push(
            exe.plan().memory(exe.graph(), &shapes).peak_bytes
                + body.plan().memory(body.graph(), &body_shapes).peak_bytes,
        );
        let (cache, _) = f.call(&args).unwrap();
        let written = cache.slice_axis(0, 0, Some(steps as i64), 1);
        close(&written, &args.2, 0.0, 0.0);
    }
    assert_eq!(peaks[0], peaks[1], "planned peak at 16 and 256 steps");
}

#[test]
fn a_body_reading_the_old_carry_after_writing_the_new_one_is_double_buffered_with_the_reason() {
    let f = compile(|(cache, rows): (Array, Array)| {
        let zero = Array::scalar(0.0, DType::I32);
        scan(
            |cache: Array, row: Array| {
                let t = Array::scalar(1.0, DType::I32);
                let new = cache.dynamic_update_slice(&row.expand_dims(0), &[t, zero.clone()]);
                // The old cache is read after the new one is written.
                let old_sum = cache.sum_all();
                Ok((new, old_sum))
            },
            &cache,
            &rows,
        )
    });
    let args = (Array::zeros(&[4, 2], DType::F32), normal(3, &[3, 2]));
    let exe = f.executable(&args).unwrap();
    let body = &exe.bodies(nodes_named(&exe, "scan")[0])[0];
    let update = nodes_named(body, "dynamic_update_slice")[0];
    let decision = body
        .plan()
        .decisions()
        .iter()
        .find(|d| d.node == update)
        .unwrap();
    assert_eq!(decision.target(), None);
    assert!(
        decision
            .operands
            .iter()
            .any(|o| matches!(o.refusal, Some(Refusal::ReadLater { .. }))),
        "{decision:?}"
    );
    let (cache, sums) = f.call(&args).unwrap();
    let rows = args.1.to_vec::<f32>().unwrap();
    assert_eq!(cache.to_vec::<f32>().unwrap()[2..4], rows[4..6]);
    assert_eq!(sums.to_vec::<f32>().unwrap()[0], 0.0);
    assert_eq!(sums.to_vec::<f32>().unwrap()[1], rows[0] + rows[1]);
}

#[test]
fn a_shapeless_scan_runs_three_lengths_with_one_trace() {
    let f = compile(|xs: Array| {
        scan(
            |c: Array, x: Array| Ok((&c + &x, c.sum_all())),
            &Array::zeros(&[3], DType::F32),
            &xs,
        )
    })
    .shapeless();
    for length in [2usize, 5, 9] {
        let xs = normal(length as u64, &[length, 3]);
        let (c, ys) = f.call(&xs).unwrap();
        close(&c, &xs.sum(&[0], false), 1e-5, 1e-5);
        assert_eq!(ys.dims().unwrap(), vec![length]);
    }
    assert_eq!((f.cache().entries, f.cache().misses), (1, 1));
}

#[test]
fn bodies_are_optimized_like_any_graph() {
    let f = compile(|(c, xs): (Array, Array)| {
        scan(
            |c: Array, x: Array| Ok(((&x * 2.0).exp() + (&x * 2.0).exp() + &c, ())),
            &c,
            &xs,
        )
        .map(|(c, ())| c)
    });
    let args = (normal(1, &[4]), normal(2, &[3, 4]));
    let exe = f.executable(&args).unwrap();
    let body = &exe.bodies(nodes_named(&exe, "scan")[0])[0];
    // CSE merges the two `exp(2x)` and fusion makes the rest one group.
    assert_eq!(
        nodes_named(body, "fused").len(),
        1,
        "{:?}",
        body.graph().nodes
    );
    assert!(nodes_named(body, "exp").is_empty());
    let want = args.0.clone() + ((&args.1 * 2.0).exp() * 2.0).sum(&[0], false);
    close(&f.call(&args).unwrap(), &want, 1e-5, 1e-5);
}

#[test]
fn bad_bodies_are_errors_naming_the_path_and_avals() {
    let x = normal(1, &[2]);
    let err = cond(
        &x.sum_all().greater(0.0),
        |x: Array| Ok((x.clone(), x)),
        |x: Array| Ok((x.clone(), x.cast(DType::F16))),
        &x,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("[1]") && err.contains("f32[2]") && err.contains("f16[2]"),
        "{err}"
    );
    let err = scan(
        |c: (Array, Array), x: Array| Ok(((c.0, c.1.sum_all()), x)),
        &(x.clone(), x.clone()),
        &normal(2, &[3, 1]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("[1]") && err.contains("carry") && err.contains("f32[]"),
        "{err}"
    );
    let err = cond(&x.greater(0.0), |x: Array| Ok(x), |x: Array| Ok(-&x), &x)
        .unwrap_err()
        .to_string();
    assert!(err.contains("cond") && err.contains("bool[2]"), "{err}");
    let err = while_loop(|x: Array| Ok(x.greater(0.0)), |x: Array| Ok(x), &x)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("bool scalar") && err.contains("bool[2]"),
        "{err}"
    );
    let err = scan(
        |c: Array, (a, b): (Array, Array)| Ok((c, &a + &b)),
        &x,
        &(normal(3, &[3, 2]), normal(4, &[4, 2])),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("[0]") && err.contains("[1]") && err.contains('3') && err.contains('4'),
        "{err}"
    );
}

/// A tanh RNN over `xs` from `h`, with weights `w`, unrolled or as a scan;
/// the loss reads the final state and every step's output.
fn rnn_loss(unrolled: bool) -> impl Fn((Array, Array, Array)) -> Array {
    move |(h, w, xs): (Array, Array, Array)| {
        let step = |h: &Array, x: &Array| (h.matmul(&w) + x).tanh();
        let (last, ys) = if unrolled {
            let steps = xs.dims().unwrap()[0];
            let mut h = h.clone();
            let mut ys = Vec::new();
            for i in 0..steps {
                h = step(
                    &h,
                    &xs.slice_axis(0, i as i64, Some(i as i64 + 1), 1)
                        .squeeze(&[0]),
                );
                ys.push(h.clone());
            }
            (h, stack(&ys, 0))
        } else {
            scan(
                |h: Array, x: Array| {
                    let h = step(&h, &x);
                    Ok((h.clone(), h))
                },
                &h,
                &xs,
            )
            .unwrap()
        };
        last.sum_all() * 0.5 + (&ys * &ys).sum_all()
    }
}

/// Arguments of [`rnn_loss`]: a `[1, 4]` state, a `[4, 4]` weight and
/// `steps` inputs.
fn rnn_args(steps: usize) -> (Array, Array, Array) {
    (
        normal(1, &[1, 4]),
        &normal(2, &[4, 4]) * 0.5,
        normal(3, &[steps, 1, 4]),
    )
}

#[test]
fn the_gradient_of_a_scan_equals_the_unrolled_loops() {
    let args = rnn_args(5);
    let want = kiln::grad(rnn_loss(true)).call(&args).unwrap();
    let g = compile(kiln::grad(rnn_loss(false)));
    let got = g.call(&args).unwrap();
    // The forward scan runs once: the residual scan (the same body
    // stacking its carries too) is merged with it; the other is the
    // backward scan.
    let exe = g.executable(&args).unwrap();
    assert_eq!(nodes_named(&exe, "scan").len(), 2);
    let merges = g.cache().reports[0]
        .passes
        .iter()
        .find(|p| p.pass == "merge_scans")
        .map(|p| p.changed);
    assert_eq!(merges, Some(1));
    close(&got.0, &want.0, 1e-5, 1e-4);
    close(&got.1, &want.1, 1e-5, 1e-4);
    close(&got.2, &want.2, 1e-5, 1e-4);
    // And a central difference on one weight.
    let f = compile(rnn_loss(false));
    let eps = 1e-2f32;
    let bump = |d: f32| {
        let mut w = args.1.to_vec::<f32>().unwrap();
        w[5] += d;
        let w = Array::from_vec(w, &[4, 4]).unwrap();
        f.call(&(args.0.clone(), w, args.2.clone()))
            .unwrap()
            .item::<f32>()
            .unwrap()
    };
    let numeric = (bump(eps) - bump(-eps)) / (2.0 * eps);
    let analytic = got.1.to_vec::<f32>().unwrap()[5];
    assert!(
        (numeric - analytic).abs() < 2e-2 * analytic.abs().max(1.0),
        "{numeric} vs {analytic}"
    );
}

/// The nodes of each scan body of `exe` that depend only on the body's
/// consts: loop-invariant work left inside the loop.
fn invariant_body_nodes(exe: &Executable) -> Vec<String> {
    let mut found = Vec::new();
    for scan in nodes_named(exe, "scan") {
        let ValueKind::Op(kiln::Op::Control(call)) = &exe.graph().nodes[scan].kind else {
            continue;
        };
        for body in exe.bodies(scan) {
            let nodes = &body.graph().nodes;
            let mut invariant = vec![false; nodes.len()];
            for (v, node) in nodes.iter().enumerate() {
                invariant[v] = match &node.kind {
                    ValueKind::Input(i) => *i < call.num_consts,
                    ValueKind::Constant(_) => true,
                    ValueKind::Op(op) => {
                        let hoistable =
                            !node.inputs.is_empty() && node.inputs.iter().all(|&i| invariant[i]);
                        if hoistable {
                            found.push(format!("%{v} {}", op.name()));
                        }
                        hoistable
                    }
                };
            }
        }
    }
    found
}

#[test]
fn a_gradient_scan_computes_what_depends_only_on_its_consts_once_outside_the_loop() {
    let args = rnn_args(5);
    let g = compile(kiln::grad(rnn_loss(false)));
    let exe = g.executable(&args).unwrap();
    assert_eq!(invariant_body_nodes(&exe), Vec::<String>::new());
    if let Some(gpu) = kiln_tests::gpu::backend() {
        // The GPU's product reads no transposed operand: `wᵀ` is made once.
        let on_gpu = compile(kiln::grad(rnn_loss(false))).with_backend(gpu);
        let exe = on_gpu.executable(&args).unwrap();
        assert_eq!(invariant_body_nodes(&exe), Vec::<String>::new());
        let want = g.call(&args).unwrap();
        let got = on_gpu.call(&args).unwrap();
        close(&got.1, &want.1, 1e-5, 1e-4);
    }
}

#[test]
fn forward_mode_through_scan_and_while_equals_the_unrolled_tangents() {
    let args = rnn_args(4);
    let tangents = (
        normal(4, &[1, 4]),
        normal(5, &[4, 4]),
        normal(6, &[4, 1, 4]),
    );
    let (_, want) = kiln::jvp(rnn_loss(true), &args, &tangents).unwrap();
    let (_, got) = kiln::jvp(rnn_loss(false), &args, &tangents).unwrap();
    close(&got, &want, 1e-5, 1e-4);
    // x ↦ x·3ᵏ with k the steps until x passes 100: the tangent is 3ᵏ·t.
    let (y, t) = kiln::jvp(
        |x: Array| {
            while_loop(
                |x: Array| Ok(x.sum_all().less(100.0)),
                |x: Array| Ok(&x * 3.0),
                &x,
            )
            .unwrap()
        },
        &Array::from_vec(vec![1.0f32, 2.0], &[2]).unwrap(),
        &Array::from_vec(vec![1.0f32, 0.5], &[2]).unwrap(),
    )
    .unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![81.0, 162.0]);
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![81.0, 40.5]);
}

#[test]
fn gradients_of_cond_and_dynamic_updates_match_central_differences() {
    let loss = |(x, u, t): (Array, Array, Array)| {
        let zero = Array::scalar(0.0, DType::I32);
        let pred = t.greater(0);
        let y = cond(
            &pred,
            |x: Array| Ok(x.sin() * 2.0),
            |x: Array| Ok(&x * &x),
            &x,
        )
        .unwrap();
        let y = y.dynamic_update_slice(&(&u * 3.0), &[t.clone(), zero.clone()]);
        y.dynamic_slice(&[t, zero], &[2, 3]).exp().sum_all() + y.sum_all()
    };
    let g = compile(kiln::grad(loss).wrt(["args[0]", "args[1]"]));
    let f = compile(loss);
    for t in [0, 1, 7] {
        let args = (normal(t as u64, &[4, 3]), normal(9, &[1, 3]), int(t));
        let (gx, gu, _) = g.call(&args).unwrap();
        let numeric = |which: usize, i: usize| {
            let eps = 1e-2f32;
            let at = |d: f32| {
                let mut a = args.clone();
                let target = if which == 0 { &mut a.0 } else { &mut a.1 };
                let mut v = target.to_vec::<f32>().unwrap();
                v[i] += d;
                *target = Array::from_vec(v, &target.dims().unwrap()).unwrap();
                f.call(&a).unwrap().item::<f32>().unwrap()
            };
            (at(eps) - at(-eps)) / (2.0 * eps)
        };
        for i in [0, 4, 11] {
            let (n, a) = (numeric(0, i), gx.to_vec::<f32>().unwrap()[i]);
            assert!(
                (n - a).abs() < 3e-2 * a.abs().max(1.0),
                "t={t} x[{i}]: {n} vs {a}"
            );
        }
        for i in [0, 2] {
            let (n, a) = (numeric(1, i), gu.to_vec::<f32>().unwrap()[i]);
            assert!(
                (n - a).abs() < 3e-2 * a.abs().max(1.0),
                "t={t} u[{i}]: {n} vs {a}"
            );
        }
    }
}

#[test]
fn the_gradient_of_a_while_loop_is_an_error_naming_it() {
    let g = kiln::grad(|x: Array| {
        while_loop(
            |x: Array| Ok(x.sum_all().less(10.0)),
            |x: Array| Ok(&x * 2.0),
            &x,
        )
        .unwrap()
        .sum_all()
    });
    let err = g
        .call(&Array::from_vec(vec![1.0f32], &[1]).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("while_loop") && err.contains("forward-only"),
        "{err}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(6), ..ProptestConfig::default() })]

    #[test]
    fn on_wgpu_scan_equals_the_cpu_scan(
        program in prop::collection::vec(instr(), 1..8),
        steps in 1usize..4,
        reverse in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let Some(gpu) = kiln_tests::gpu::backend() else { return Ok(()) };
        let n = 3;
        let args = (normal(seed, &[n, n]), normal(seed + 1, &[steps, 1, n]), normal(seed + 2, &[steps, n, 1]), normal(seed + 3, &[n]));
        let f = |(init, rows, cols, w): (Array, Array, Array, Array)| {
            scan_with(
                |c: Array, x: (Array, Array)| Ok(random_body(&program, n, &w, c, x)),
                &init,
                &(rows, cols),
                ScanOptions { reverse, ..ScanOptions::default() },
            )
        };
        let (want_c, want_ys) = compile(f).call(&args).unwrap();
        let (c, ys) = compile(f).with_backend(gpu).call(&args).unwrap();
        close(&c, &want_c, 1e-4, 1e-3);
        close(&ys, &want_ys, 1e-4, 1e-3);
    }
}

#[test]
fn on_wgpu_switch_dynamic_updates_and_the_decoding_loop_match_the_cpu() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let f = |(i, x): (Array, Array)| {
        let branches: Vec<Branch<Array, Array>> = vec![
            Box::new(|x: Array| Ok(&x + 1.0)),
            Box::new(|x: Array| Ok(&x * 10.0)),
            Box::new(|x: Array| Ok(-&x)),
        ];
        switch(&i, branches, &x)
    };
    let on_gpu = compile(f).with_backend(gpu.clone());
    let x = Array::from_vec(vec![2.0f32, 3.0], &[2]).unwrap();
    for (i, want) in [
        (-5, vec![3.0, 4.0]),
        (1, vec![20.0, 30.0]),
        (7, vec![-2.0, -3.0]),
    ] {
        let got = on_gpu.call(&(int(i), x.clone())).unwrap();
        assert_eq!(got.to_vec::<f32>().unwrap(), want, "index {i}");
    }
    let update = |(x, u, i, j): (Array, Array, Array, Array)| {
        let updated = x.dynamic_update_slice(&u, &[i.clone(), j.clone()]);
        (updated.dynamic_slice(&[i, j], &[2, 3]).exp(), updated)
    };
    for (i, j) in [(0, 0), (2, 1), (-3, 9)] {
        let args = (normal(1, &[5, 4]), normal(2, &[2, 3]), int(i), int(j));
        let want = compile(update).call(&args).unwrap();
        let got = compile(update)
            .with_backend(gpu.clone())
            .call(&args)
            .unwrap();
        close(&got.0, &want.0, 1e-6, 1e-5);
        close(&got.1, &want.1, 0.0, 0.0);
    }
    // A donated array is updated in place: only the window is written.
    let in_place = |(x, u, i): (Array, Array, Array)| x.dynamic_update_slice(&u, &[i, int(1)]);
    for i in [-2, 1, 3] {
        let args = (normal(3, &[4, 3]), normal(4, &[2, 2]), int(i));
        let want = compile(in_place).call(&args).unwrap();
        let donated = compile(in_place)
            .donate(["args[0]"])
            .with_backend(gpu.clone());
        let exe = donated.executable(&args).unwrap();
        let update = nodes_named(&exe, "dynamic_update_slice")[0];
        assert!(exe.plan().in_place_of(update).is_some());
        close(&donated.call(&args).unwrap(), &want, 0.0, 0.0);
    }
    // Per-iteration results nobody reads still have a range of their size.
    let carry_only = |(c, xs): (Array, Array)| {
        scan(
            |c: Array, x: Array| Ok((c.matmul(&x).tanh(), (&x * 2.0).exp())),
            &c,
            &xs,
        )
        .map(|(c, _unread)| c)
    };
    let args = (normal(5, &[3, 3]), normal(6, &[4, 3, 3]));
    let want = compile(carry_only).call(&args).unwrap();
    let got = compile(carry_only)
        .with_backend(gpu.clone())
        .call(&args)
        .unwrap();
    close(&got, &want, 1e-5, 1e-4);
    let args = decode_args(16);
    let (want_cache, want_out) = compile(decode(16)).call(&args).unwrap();
    let (cache, out) = compile(decode(16))
        .with_backend(gpu.clone())
        .call(&args)
        .unwrap();
    close(&cache, &want_cache, 0.0, 0.0);
    close(&out, &want_out, 1e-5, 1e-4);
}

/// Triples `x` until it passes 100, counting the steps.
fn triple_past_100(x: Array) -> kiln::Result<(Array, Array)> {
    while_loop(
        |(x, _): (Array, Array)| Ok(x.less(100.0)),
        |(x, steps): (Array, Array)| Ok((&x * 3.0, steps + 1)),
        &(x, int(0)),
    )
}

/// Three outer steps, each running an inner loop (`y ← y·w + 1` while
/// `Σy` is below a limit the outer step computes) and writing its step
/// number into row `i` of a cache.
fn nested_while_loops((y, w, cache): (Array, Array, Array)) -> kiln::Result<(Array, Array, Array)> {
    let (_, y, cache) = while_loop(
        |(i, _, _): (Array, Array, Array)| Ok(i.less(3)),
        |(i, y, cache): (Array, Array, Array)| {
            let limit = (&i.cast(DType::F32) + 1.0) * 10.0;
            let w = w.clone();
            let y = while_loop(
                move |y: Array| Ok(y.sum_all().less(&limit)),
                move |y: Array| Ok(&y * &w + 1.0),
                &y,
            )?;
            let row = (&y * (&i.cast(DType::F32) + 1.0)).expand_dims(0);
            let cache = cache.dynamic_update_slice(&row, &[i.clone(), int(0)]);
            Ok((i + 1, y, cache))
        },
        &(int(0), y, cache),
    )?;
    Ok((y.clone(), cache, y.sum_all()))
}

#[test]
fn on_wgpu_while_loops_read_their_predicate_back_each_iteration_and_match_the_cpu() {
    let args = (
        Array::from_vec(vec![0.5f32, 0.25], &[2]).unwrap(),
        Array::from_vec(vec![1.5f32, 1.25], &[2]).unwrap(),
        Array::zeros(&[4, 2], DType::F32),
    );
    // The lowering is checked without a device: a branch reading one word
    // and leaving forward, jumps back over it, nested loops renumbered.
    let leaves = [args.0.clone(), args.1.clone(), args.2.clone()];
    let exe = compile(nested_while_loops).executable(&args).unwrap();
    let shapes = kiln_tests::value_shapes(&exe, &leaves);
    let caps = kiln_kernels::program::Caps::default();
    let program = kiln_kernels::lower(&exe, &shapes, &caps).unwrap();
    let input_bytes = [8, 8, 32];
    assert_eq!(program.check(&caps, &input_bytes), Ok(()));
    let branches = program
        .steps
        .iter()
        .filter(|s| matches!(s, kiln_kernels::program::Step::Branch { .. }))
        .count();
    assert_eq!(branches, 2, "the outer and the inner loop's tests");
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let on_gpu = compile(triple_past_100).with_backend(gpu.clone());
    for (x, want) in [(1.0, (243.0, 5)), (500.0, (500.0, 0)), (99.0, (297.0, 1))] {
        let (got, steps) = on_gpu.call(&Array::scalar(x, DType::F32)).unwrap();
        assert_eq!(
            (got.item::<f32>().unwrap(), steps.item::<i32>().unwrap()),
            want,
            "from {x}"
        );
    }
    let want = compile(nested_while_loops).call(&args).unwrap();
    let nested = compile(nested_while_loops).with_backend(gpu.clone());
    let got = nested.call(&args).unwrap();
    close(&got.0, &want.0, 0.0, 0.0);
    close(&got.1, &want.1, 0.0, 0.0);
    close(&got.2, &want.2, 0.0, 0.0);
    let cache = got.1.to_vec::<f32>().unwrap();
    assert!(
        cache[..6].iter().all(|&v| v > 0.0) && cache[6..] == [0.0, 0.0],
        "{cache:?}"
    );
    // The Kernels listing shows each loop's test and its way back.
    let exe = nested.executable(&args).unwrap();
    let list = gpu
        .kernels(&exe, &kiln_tests::value_shapes(&exe, &leaves))
        .unwrap();
    let kinds = |kind| list.steps.iter().filter(|s| s.kind == kind).count();
    assert_eq!((kinds(StepKind::Branch), kinds(StepKind::Jump)), (2, 2));
}

#[test]
fn vmap_of_control_flow_equals_stacking_each_example() {
    let b = 3;
    // A scan per example: batched initial states and sequences, shared weights.
    let (h, w, xs) = (
        normal(1, &[b, 1, 4]),
        &normal(2, &[4, 4]) * 0.5,
        normal(3, &[b, 5, 1, 4]),
    );
    let per_example = |(h, w, xs): (Array, Array, Array)| {
        scan(
            |h: Array, x: Array| {
                let h = (h.matmul(&w) + x).tanh();
                Ok((h.clone(), h.sum_all()))
            },
            &h,
            &xs,
        )
        .unwrap()
    };
    let (hs, ys) = compile(kiln::vmap(per_example).in_axes([("args[1]", None)]))
        .call(&(h.clone(), w.clone(), xs.clone()))
        .unwrap();
    let want: Vec<(Array, Array)> = (0..b)
        .map(|i| per_example((example(&h, 0, i), w.clone(), example(&xs, 0, i))))
        .collect();
    close(
        &hs,
        &stack(&want.iter().map(|p| p.0.clone()).collect::<Vec<_>>(), 0),
        1e-6,
        1e-5,
    );
    close(
        &ys,
        &stack(&want.iter().map(|p| p.1.clone()).collect::<Vec<_>>(), 0),
        1e-6,
        1e-5,
    );

    // cond with a per-example predicate; a while loop whose trip count
    // differs per example.
    let x = Array::from_vec(vec![-2.0f32, 1.0, 7.0], &[3]).unwrap();
    let branchy = |x: Array| {
        let c = cond(
            &x.greater(0.0),
            |x: Array| Ok(&x * 10.0),
            |x: Array| Ok(-&x),
            &x,
        )
        .unwrap();
        let w = while_loop(
            |v: Array| Ok(v.less(50.0)),
            |v: Array| Ok(&v * 3.0 + 1.0),
            &(&x.abs() + 1.0),
        )
        .unwrap();
        (c, w)
    };
    let (c, until) = compile(kiln::vmap(branchy)).call(&x).unwrap();
    let want: Vec<(Array, Array)> = (0..3).map(|i| branchy(example(&x, 0, i))).collect();
    close(
        &c,
        &stack(&want.iter().map(|p| p.0.clone()).collect::<Vec<_>>(), 0),
        0.0,
        0.0,
    );
    close(
        &until,
        &stack(&want.iter().map(|p| p.1.clone()).collect::<Vec<_>>(), 0),
        0.0,
        0.0,
    );

    // Per-example gradients through a scan.
    let loss = |(h, w, xs): (Array, Array, Array)| {
        let (h, ()) = scan(
            |h: Array, x: Array| Ok(((h.matmul(&w) + x).tanh(), ())),
            &h,
            &xs,
        )
        .unwrap();
        (&h * &h).sum_all()
    };
    let want: Vec<Array> = (0..b)
        .map(|i| {
            kiln::grad(loss)
                .wrt(["args[1]"])
                .call(&(example(&h, 0, i), w.clone(), example(&xs, 0, i)))
                .unwrap()
                .1
        })
        .collect();
    let g = compile(kiln::vmap(kiln::grad(loss).wrt(["args[1]"])).in_axes([("args[1]", None)]))
        .call(&(h.clone(), w.clone(), xs.clone()))
        .unwrap();
    close(&g.1, &stack(&want, 0), 1e-5, 1e-4);
    assert!(f_has_no_fallbacks(&compile(kiln::vmap(branchy)), &x));
}

fn f_has_no_fallbacks<F: kiln::Function<Array, (Array, Array), M>, M>(
    f: &kiln::Compiled<Array, (Array, Array), F, kiln::CpuBackend, M>,
    x: &Array,
) -> bool {
    f.call(x).unwrap();
    f.cache().reports[0].vmap_fallbacks.is_empty()
}

#[test]
fn a_loop_reads_a_captured_transposed_weight_in_place_instead_of_a_copy_per_call() {
    // `x @ wᵀ` inside a scan with `w` made outside: the trace hoists the
    // transpose out of the body; the passes hand the body `w` itself and
    // its product reads it transposed.
    let f = compile(|(w, xs): (Array, Array)| -> kiln::Result<Array> {
        let (_, ys) = scan(
            |c: Array, x: Array| Ok((c.clone(), x.matmul(&w.swap_axes(-1, -2)) + &c)),
            &Array::zeros(&[1, 3], DType::F32),
            &xs,
        )?;
        Ok(ys)
    });
    let (w, xs) = (normal(1, &[3, 4]), normal(2, &[5, 1, 4]));
    let ys = f.call(&(w.clone(), xs.clone())).unwrap();
    let exe = f.executable(&(w.clone(), xs.clone())).unwrap();
    assert!(
        nodes_named(&exe, "permute").is_empty(),
        "a transpose is copied per call"
    );
    let want = stack(
        &(0..5)
            .map(|i| {
                xs.slice_axis(0, i, Some(i + 1), 1)
                    .squeeze(&[0])
                    .matmul(&w.transpose())
            })
            .collect::<Vec<_>>(),
        0,
    );
    close(&ys, &want, 1e-5, 1e-5);
}
