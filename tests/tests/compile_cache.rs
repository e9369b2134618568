//! Compile and the cache: results, hits and misses, explanations, reports.

use kiln::{compile, Array, DType, MissReason, Tree};
use std::collections::BTreeMap;

fn arr(values: &[f32], shape: &[usize]) -> Array {
    Array::from_slice(values, shape).expect("test data matches its shape")
}

#[derive(Tree, Clone, Debug)]
struct Pair {
    a: Array,
    b: Array,
}

#[test]
fn compiled_call_equals_eager_call_for_a_pair() {
    let f = |p: Pair| (p.a.exp() * 2.0 + &p.b).sum(&[0], false);
    let p = Pair {
        a: arr(&[0.0, 1.0, 2.0, 3.0], &[2, 2]),
        b: arr(&[1.0, 1.0, 1.0, 1.0], &[2, 2]),
    };
    let eager = f(p.clone()).to_vec::<f32>().unwrap();
    let compiled = compile(f).call(&p).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(compiled, eager);
    let e = std::f32::consts::E;
    assert!((compiled[0] - (2.0 + 2.0 * e * e + 2.0)).abs() < 1e-4);
}

#[test]
fn second_call_with_same_signature_hits() {
    let f = compile(|x: Array| x * 3.0);
    f.call(&arr(&[1.0, 2.0], &[2])).unwrap();
    let y = f.call(&arr(&[5.0, 6.0], &[2])).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![15.0, 18.0]);
    let cache = f.cache();
    assert_eq!((cache.entries, cache.hits, cache.misses), (1, 1, 1));
    assert_eq!(cache.miss_log[0].reasons, vec![MissReason::NeverSeen]);
}

#[test]
fn new_shape_misses_and_names_the_leaf() {
    let f = compile(|p: Pair| &p.a + &p.b);
    let small = Pair {
        a: Array::zeros(&[4, 4], DType::F32),
        b: Array::zeros(&[4, 4], DType::F32),
    };
    let big = Pair {
        a: Array::zeros(&[8, 4], DType::F32),
        b: Array::zeros(&[8, 4], DType::F32),
    };
    f.call(&small).unwrap();
    f.call(&big).unwrap();
    let miss = f.cache().last_miss().cloned().unwrap();
    assert_eq!(miss.closest_entry, Some(0));
    assert_eq!(
        miss.reasons[0],
        MissReason::Aval {
            path: "args.a".into(),
            before: "f32[4,4]".into(),
            now: "f32[8,4]".into()
        }
    );
    assert_eq!(
        miss.reasons[0].to_string(),
        "aval differs at leaf args.a: f32[4,4] → f32[8,4]"
    );
    assert_eq!(miss.reasons.len(), 2);
}

#[test]
fn dtype_change_misses() {
    let f = compile(|x: Array| x.abs());
    f.call(&Array::ones(&[2], DType::F32)).unwrap();
    f.call(&Array::ones(&[2], DType::F16)).unwrap();
    let cache = f.cache();
    assert_eq!(cache.entries, 2);
    assert!(
        matches!(&cache.miss_log[1].reasons[0], MissReason::Aval { before, now, .. } if before == "f32[2]" && now == "f16[2]")
    );
}

#[test]
fn static_scalar_argument_is_part_of_the_key() {
    let f = compile(|(x, k): (Array, f64)| x * k);
    let x = arr(&[1.0, 2.0], &[2]);
    assert_eq!(
        f.call(&(x.clone(), 2.0)).unwrap().to_vec::<f32>().unwrap(),
        vec![2.0, 4.0]
    );
    assert_eq!(
        f.call(&(x.clone(), 3.0)).unwrap().to_vec::<f32>().unwrap(),
        vec![3.0, 6.0]
    );
    assert_eq!(
        f.call(&(x, 2.0)).unwrap().to_vec::<f32>().unwrap(),
        vec![2.0, 4.0]
    );
    let cache = f.cache();
    assert_eq!((cache.entries, cache.hits), (2, 1));
    assert!(
        matches!(&cache.miss_log[1].reasons[0], MissReason::Static { path, .. } if path == "args[1]")
    );
}

#[test]
fn alternating_signatures_each_hit_their_own_entry() {
    let f = compile(|(x, k): (Array, f64)| x * k);
    let x = arr(&[1.0, 2.0], &[2]);
    let wide = Array::ones(&[3], DType::F32);
    for round in 0..3 {
        assert_eq!(
            f.call(&(x.clone(), 2.0)).unwrap().to_vec::<f32>().unwrap(),
            vec![2.0, 4.0],
            "round {round}"
        );
        assert_eq!(
            f.call(&(x.clone(), 5.0)).unwrap().to_vec::<f32>().unwrap(),
            vec![5.0, 10.0],
            "round {round}"
        );
        assert_eq!(
            f.call(&(wide.clone(), 2.0))
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
            vec![2.0; 3],
            "round {round}"
        );
    }
    let cache = f.cache();
    assert_eq!((cache.entries, cache.misses, cache.hits), (3, 3, 6));
}

#[test]
fn tree_structure_change_is_explained_with_path() {
    let f = compile(|xs: Vec<Array>| {
        xs.iter()
            .fold(Array::scalar(0.0, DType::F32), |acc, x| acc + x.sum_all())
    });
    f.call(&vec![Array::ones(&[2], DType::F32); 2]).unwrap();
    let out = f.call(&vec![Array::ones(&[2], DType::F32); 3]).unwrap();
    assert_eq!(out.item::<f32>().unwrap(), 6.0);
    let miss = f.cache().last_miss().cloned().unwrap();
    assert!(
        matches!(&miss.reasons[0], MissReason::TreeStructure { path, .. } if path == "args"),
        "{miss:?}"
    );
}

#[test]
fn map_arguments_compile_and_key_on_their_keys() {
    let f = compile(|m: BTreeMap<String, Array>| {
        m.values()
            .fold(Array::scalar(0.0, DType::F32), |acc, x| acc + x.sum_all())
    });
    let mut m = BTreeMap::new();
    m.insert("w".to_string(), arr(&[1.0, 2.0], &[2]));
    m.insert("b".to_string(), arr(&[3.0], &[1]));
    assert_eq!(f.call(&m).unwrap().item::<f32>().unwrap(), 6.0);
}

#[test]
fn report_lists_graph_and_passes() {
    let f = compile(|x: Array| {
        let a = x.exp() * 2.0;
        let b = x.exp() * 2.0; // the same computation twice: CSE merges it
        a + b
    })
    .fusion(false);
    f.call(&arr(&[0.0], &[1])).unwrap();
    let report = f.cache().reports[0].clone();
    let cse = report.passes.iter().find(|p| p.pass == "cse").unwrap();
    assert!(cse.changed >= 2, "{report:?}");
    assert_eq!(report.nodes.iter().filter(|n| n.op == "exp").count(), 1);
    assert!(report.nodes[0].op.starts_with("input args"));
    let json = serde_json::to_string(&f.cache()).unwrap();
    assert!(json.contains("\"passes\""));
}

#[test]
fn elementwise_chain_fuses_into_one_op_and_matches_unfused() {
    let f = |x: Array| ((x.exp() * 2.0 + 1.0).tanh() - 0.5).sum_all();
    let x = Array::from_vec(
        (0..3000).map(|i| (i as f32 * 0.01).sin()).collect(),
        &[3000],
    )
    .unwrap();
    let fused = compile(f);
    let unfused = compile(f).fusion(false);
    assert_eq!(
        fused.call(&x).unwrap().to_vec::<f32>().unwrap(),
        unfused.call(&x).unwrap().to_vec::<f32>().unwrap()
    );
    let report = fused.cache().reports[0].clone();
    let ops: Vec<&str> = report.nodes.iter().map(|n| n.op.as_str()).collect();
    assert!(ops.contains(&"fused(exp, mul, add, tanh, sub)"), "{ops:?}");
    assert!(report
        .passes
        .iter()
        .any(|p| p.pass == "fuse" && p.changed == 4));
    assert!(unfused.cache().reports[0]
        .passes
        .iter()
        .all(|p| p.pass != "fuse"));
}

#[test]
fn group_reading_another_groups_root_matches_unfused() {
    // `e` is read by a reduction and by a second group, so it roots its own
    // group; the second group takes it as an external operand.
    let f = |x: Array| {
        let e = (x.exp() * 2.0).tanh();
        (e.sin() + 1.0) * e.sum_all()
    };
    let x = Array::from_vec((0..40).map(|i| i as f32 * 0.05 - 1.0).collect(), &[40]).unwrap();
    let fused = compile(f);
    let got = fused.call(&x).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(
        got,
        compile(f)
            .fusion(false)
            .call(&x)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    );
    let report = fused.cache().reports[0].clone();
    let groups: Vec<&str> = report
        .nodes
        .iter()
        .map(|n| n.op.as_str())
        .filter(|op| op.starts_with("fused"))
        .collect();
    assert_eq!(
        groups,
        vec!["fused(exp, mul, tanh)", "fused(sin, add, mul)"]
    );
}

#[test]
fn constant_subgraphs_fold_at_compile_time() {
    let f = compile(|x: Array| x + Array::ones(&[2], DType::F32).exp());
    let y = f.call(&arr(&[0.0, 1.0], &[2])).unwrap();
    assert_eq!(
        y.to_vec::<f32>().unwrap(),
        vec![1f32.exp(), 1.0 + 1f32.exp()]
    );
    let report = f.cache().reports[0].clone();
    assert!(report
        .passes
        .iter()
        .any(|p| p.pass == "constant_folding" && p.changed == 1));
    assert!(report.nodes.iter().all(|n| n.op != "exp"));
}

#[test]
fn returning_an_input_gives_equal_but_independent_value() {
    let f = compile(|p: Pair| Pair {
        a: p.b.clone(),
        b: p.a.clone(),
    });
    let p = Pair {
        a: arr(&[1.0], &[1]),
        b: arr(&[2.0], &[1]),
    };
    let swapped = f.call(&p).unwrap();
    assert_eq!(swapped.a.to_vec::<f32>().unwrap(), vec![2.0]);
    assert_eq!(swapped.b.to_vec::<f32>().unwrap(), vec![1.0]);
    assert_eq!(p.a.to_vec::<f32>().unwrap(), vec![1.0]);
}

#[test]
fn pending_arguments_are_evaluated_before_the_call() {
    let f = compile(|x: Array| x + 1.0);
    let lazy = arr(&[1.0, 2.0], &[2]) * 10.0;
    assert_eq!(
        f.call(&lazy).unwrap().to_vec::<f32>().unwrap(),
        vec![11.0, 21.0]
    );
}

#[test]
fn compiled_function_called_inside_another_trace_is_inlined() {
    let inner = compile(|x: Array| x.exp());
    let outer = compile(move |x: Array| inner.call(&x).expect("inlined call") + 1.0);
    let y = outer.call(&arr(&[0.0], &[1])).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0]);
}

#[test]
fn long_eager_chain_evaluates_and_drops_without_stack_overflow() {
    let mut x = arr(&[0.0], &[1]);
    for _ in 0..20_000 {
        x = x + 1.0;
    }
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![20_000.0]);
}

#[test]
fn concurrent_first_calls_of_one_signature_leave_one_entry() {
    const THREADS: usize = 8;
    // Tracing sleeps, so every thread misses before the first trace is
    // inserted: each traces, and all but one trace must be dropped.
    let f = compile(|x: Array| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        x * 2.0
    });
    let start = std::sync::Barrier::new(THREADS);
    let results: Vec<Vec<f32>> = std::thread::scope(|scope| {
        let calls: Vec<_> = (0..THREADS)
            .map(|i| {
                let (f, start) = (&f, &start);
                scope.spawn(move || {
                    start.wait();
                    f.call(&arr(&[i as f32, 1.0], &[2]))
                        .and_then(|y| y.to_vec::<f32>())
                })
            })
            .collect();
        calls
            .into_iter()
            .map(|call| call.join().expect("no panic").expect("the call runs"))
            .collect()
    });
    for (i, y) in results.iter().enumerate() {
        assert_eq!(y, &[2.0 * i as f32, 2.0]);
    }
    let cache = f.cache();
    assert_eq!(cache.entries, 1, "{}", cache.summary());
    assert_eq!(cache.reports.len(), 1);
    assert_eq!(
        cache.hits + cache.misses,
        THREADS as u64,
        "{}",
        cache.summary()
    );
    assert_eq!(cache.miss_log.len() as u64, cache.misses);
    f.call(&arr(&[1.0, 1.0], &[2])).unwrap();
    assert_eq!(
        (f.cache().entries, f.cache().hits),
        (1, cache.hits + 1),
        "a later call hits the one entry"
    );
}

#[test]
fn the_miss_log_keeps_the_most_recent_misses_and_counts_them_all() {
    let f = compile(|x: Array| x.sum_all());
    let calls = kiln::compile::MISS_LOG_CAPACITY + 44;
    for n in 1..=calls {
        f.call(&Array::ones(&[n], DType::F32)).unwrap();
    }
    let cache = f.cache();
    assert_eq!(cache.misses, calls as u64);
    assert_eq!(cache.miss_log.len(), kiln::compile::MISS_LOG_CAPACITY);
    assert_eq!(cache.miss_log.first().map(|m| m.call), Some(45));
    assert_eq!(cache.last_miss().map(|m| m.call), Some(calls as u64));
}

#[test]
fn a_call_given_a_failed_array_returns_its_error_and_caches_nothing() {
    let f = kiln::compile(|x: kiln::Array| x.exp());
    let failed = kiln::Array::zeros(&[2, 3], kiln::DType::F32)
        .matmul(&kiln::Array::zeros(&[2, 3], kiln::DType::F32));
    let want = failed.error().cloned().expect("a shape error");
    assert_eq!(f.call(&failed).err(), Some(want));
    assert_eq!(f.cache().entries, 0);
}

/// A function that refuses rank-2 arguments with an explicit `Err`.
fn refuses_matrices(x: Array) -> kiln::Result<Array> {
    if x.ndim() == 2 {
        return Err(kiln::Error::InvalidArgument {
            op: "refuses_matrices".into(),
            detail: "takes vectors only".into(),
            at: None,
        });
    }
    Ok(x * 2.0)
}

#[test]
fn a_compiled_function_returning_ok_gives_its_value_in_one_result() {
    let f = compile(refuses_matrices);
    let y: Array = f.call(&arr(&[1.0, 2.0], &[2])).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
    let owned: Array = f.call_owned(arr(&[3.0], &[1])).unwrap();
    assert_eq!(owned.to_vec::<f32>().unwrap(), vec![6.0]);
    let deferred: Array = f.call_deferred(arr(&[4.0], &[1])).unwrap();
    assert_eq!(deferred.to_vec::<f32>().unwrap(), vec![8.0]);
}

#[test]
fn a_compiled_function_returning_err_gives_that_error_and_the_cache_stays_usable() {
    let f = compile(refuses_matrices);
    let matrix = arr(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let want = refuses_matrices(matrix.clone()).unwrap_err();
    assert_eq!(f.call(&matrix).unwrap_err(), want);
    assert_eq!(f.cache().entries, 0);
    let y = f.call(&arr(&[1.0, 2.0], &[2])).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
    assert_eq!(f.call_owned(matrix).unwrap_err(), want);
    let cache = f.cache();
    assert_eq!((cache.entries, cache.misses), (1, 3));
}

#[test]
fn a_failing_transformation_inside_a_compiled_function_is_the_calls_error() {
    let f = compile(|x: Array| -> kiln::Result<Array> {
        kiln::grad(|x: Array| x.cast(DType::F32).sum_all()).call(&x)
    });
    let integers = Array::from_slice(&[1i32, 2], &[2]).unwrap();
    let Err(kiln::Error::DType { op, .. }) = f.call(&integers) else {
        panic!("the gradient of an integer leaf is a dtype error");
    };
    assert_eq!(op, "grad");
    let g = f.call(&arr(&[5.0, 6.0], &[2])).unwrap();
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![1.0, 1.0]);
}

#[test]
fn a_compiled_function_returning_err_inside_another_trace_fails_the_outer_call() {
    let inner = compile(refuses_matrices);
    let outer = compile(move |x: Array| -> kiln::Result<Array> { Ok(inner.call(&x)? + 1.0) });
    let matrix = arr(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let want = refuses_matrices(matrix.clone()).unwrap_err();
    assert_eq!(outer.call(&matrix).unwrap_err(), want);
    let y = outer.call(&arr(&[1.0], &[1])).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![3.0]);
}
