use super::*;
use kiln::MissReason;

fn run_ok(session: &mut Session, script: &str) -> RunReport {
    let report = session.run(script);
    assert_eq!(report.error, None, "{script}");
    report
}

fn text<'a>(report: &'a RunReport, label: &str) -> &'a str {
    let found = report.outputs.iter().find(|o| o.label == label);
    &found
        .unwrap_or_else(|| panic!("no output {label}: {report:?}"))
        .text
}

fn error(report: &RunReport) -> &ScriptError {
    report.error.as_ref().expect("the run fails")
}

#[test]
fn operators_methods_and_nn_functions_compute_kilns_values() {
    let mut s = Session::new();
    let report = run_ok(
        &mut s,
        r#"
        let a = array([[1, 2], [3, 4]]);
        show("arith", (a + 1) * 2.0 - a / 2 + 2 ** a);
        show("matmul", a @ a.T);
        show("compare", a > 2);
        show("reduce", a.sum([0]));
        show("softmax", nn::softmax(array([0.0, 0.0]), -1));
        show("dtype", a.cast("i32"));
        show("shape", a.reshape([4, 1]).shape);
        "#,
    );
    assert_eq!(
        text(&report, "arith"),
        "array([[ 5.5,  9. ],\n       [14.5, 24. ]], dtype=float32)"
    );
    assert_eq!(
        text(&report, "matmul"),
        "array([[ 5., 11.],\n       [11., 25.]], dtype=float32)"
    );
    assert_eq!(
        text(&report, "compare"),
        "array([[False, False],\n       [ True,  True]], dtype=bool)"
    );
    assert_eq!(text(&report, "reduce"), "array([4., 6.], dtype=float32)");
    assert_eq!(text(&report, "softmax"), "array([0.5, 0.5], dtype=float32)");
    assert_eq!(
        text(&report, "dtype"),
        "array([[1, 2],\n       [3, 4]], dtype=int32)"
    );
    assert_eq!(text(&report, "shape"), "[4, 1]");
}

#[test]
fn the_final_value_is_shown_as_result_and_print_goes_to_the_log() {
    let mut s = Session::new();
    let report = run_ok(&mut s, "print(ones([2]).sum()); 40 + 2");
    assert_eq!(report.log, vec!["array(2., dtype=float32)".to_string()]);
    assert_eq!(text(&report, "result"), "42");
}

#[test]
fn a_kiln_error_names_the_problem_at_its_line_and_column() {
    let mut s = Session::new();
    let report =
        s.run("let a = ones([2, 3]);\nlet b = ones([4]);\nlet c =  a + b;\nshow(\"c\", c);");
    let e = error(&report);
    assert_eq!((e.line, e.column), (Some(3), Some(12)), "{e:?}");
    assert!(
        e.message.contains("f32[2,3]") && e.message.contains("f32[4]"),
        "{e}"
    );
}

#[test]
fn a_syntax_error_has_its_position_and_the_next_run_works() {
    let mut s = Session::new();
    let report = s.run("let a = ones([2]);\nlet = 3;");
    let e = error(&report);
    assert_eq!(e.line, Some(2), "{e:?}");
    assert!(e.message.starts_with("syntax error"), "{e}");
    let report = run_ok(&mut s, "ones([2])");
    assert_eq!(text(&report, "result"), "array([1., 1.], dtype=float32)");
}

#[test]
fn an_error_inside_a_compiled_function_points_inside_it_and_leaves_the_cache_usable() {
    let mut s = Session::new();
    let script = "let f = compile(|x| {\n    x.reshape([7])\n});\nf.run(ones([2, 3]))";
    let report = s.run(script);
    let e = error(&report);
    assert_eq!(e.line, Some(2), "{e:?}");
    assert!(e.message.contains("reshape"), "{e}");
    let cache = &report.functions[0].cache;
    assert_eq!(cache.entries, 0);
    let report = run_ok(&mut s, &script.replace("[7]", "[6]"));
    assert_eq!(report.functions[0].cache.entries, 1);
}

#[test]
fn an_unchanged_function_keeps_its_cache_across_edits_and_explains_the_miss() {
    let mut s = Session::new();
    let before = "let f = compile(|x| x * 2.0);\nf.run(zeros([2, 3]))";
    run_ok(&mut s, before);
    let after =
        "// an edit above the function\nlet f = compile(|x| x * 2.0);\nf.run(zeros([5, 3]))";
    let report = run_ok(&mut s, after);
    let function = &report.functions[0];
    assert_eq!(function.line, 2);
    assert_eq!((function.cache.entries, function.cache.misses), (2, 2));
    assert_eq!(
        function.cache.miss_log[1].reasons,
        vec![MissReason::Aval {
            path: "args[0]".to_string(),
            before: "f32[2,3]".to_string(),
            now: "f32[5,3]".to_string(),
        }]
    );
    assert_eq!(
        function.calls,
        vec![crate::report::CallTiming {
            traced: true,
            ms: function.calls[0].ms,
            device_ms: None,
            device_calls: None,
        }]
    );
}

#[test]
fn an_edited_function_option_or_capture_starts_a_new_cache() {
    let mut s = Session::new();
    run_ok(&mut s, "let k = 2.0; compile(|x| x * k).run(ones([2]))");
    for edited in [
        "let k = 2.0; compile(|x| x * k + 0.0).run(ones([2]))",
        "let k = 2.0; compile(|x| x * k).fusion(false).run(ones([2]))",
        "let k = 3.0; compile(|x| x * k).run(ones([2]))",
    ] {
        let report = run_ok(&mut s, edited);
        assert_eq!(report.functions[0].cache.misses, 1, "{edited}");
    }
    let report = run_ok(&mut s, "let k = 3.0; compile(|x| x * k).run(ones([2]))");
    assert_eq!(report.functions[0].cache.hits, 1);
    assert_eq!(text(&report, "result"), "array([3., 3.], dtype=float32)");
}

#[test]
fn an_edited_helper_function_starts_a_new_cache() {
    let mut s = Session::new();
    let script = "fn g(x) { x + 1.0 }\nlet f = compile(|x| g(x));\nf.run(ones([2]))";
    run_ok(&mut s, script);
    let report = run_ok(&mut s, &script.replace("x + 1.0", "x + 2.0"));
    assert_eq!(report.functions[0].cache.misses, 1);
    assert_eq!(text(&report, "result"), "array([3., 3.], dtype=float32)");
}

#[test]
fn an_endless_loop_is_stopped_by_the_operation_limit() {
    let mut s = Session::with_limits(ScriptLimits {
        max_operations: 10_000,
        ..ScriptLimits::PLAYGROUND
    });
    let report = s.run("let i = 0;\nloop { i += 1; }");
    let e = error(&report);
    assert!(e.message.contains("Too many operations"), "{e}");
    assert_eq!(e.line, Some(2));
    run_ok(&mut s, "1");
}

#[test]
fn an_endless_loop_is_stopped_by_the_time_limit() {
    let mut s = Session::with_limits(ScriptLimits {
        time_limit: Duration::from_millis(50),
        max_operations: 1 << 50,
        ..ScriptLimits::PLAYGROUND
    });
    let start = Instant::now();
    let report = s.run("loop { }");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(
        error(&report).message,
        "the run took longer than its 0.05 s limit and was stopped"
    );
}

#[test]
fn kilns_size_limit_stops_a_huge_array_with_a_clear_message() {
    let mut s = Session::new();
    let report = s.run("zeros([100000, 1000])");
    let e = error(&report);
    // The playground's limit, in MiB: not the Rust API that raises it.
    assert!(
        e.message.ends_with(
            "`zeros`: f32[100000,1000] needs 381.5 MiB, above the playground's limit of \
             64 MiB per array"
        ),
        "{e}"
    );
    assert!(!e.message.contains("Limits"), "{e}");
    assert_eq!(e.line, Some(1));
}

#[test]
fn compiled_functions_nest_up_to_the_limit_and_no_deeper() {
    let script = "let f0 = compile(|x| x + 1.0);\n\
                  let f1 = compile(|x| f0.run(x) * 2.0);\n\
                  let f2 = compile(|x| f1.run(x) - 1.0);\n\
                  f2.run(ones([1]))";
    let report = run_ok(&mut Session::new(), script);
    assert_eq!(text(&report, "result"), "array([3.], dtype=float32)");
    let mut shallow = Session::with_limits(ScriptLimits {
        max_nested_compiled_calls: 2,
        ..ScriptLimits::PLAYGROUND
    });
    let report = shallow.run(script);
    let e = error(&report);
    assert_eq!(e.message, "compiled functions are nested more than 2 deep");
    assert_eq!(e.line, Some(2));
}

#[test]
fn maps_and_nodes_pass_through_compile_as_trees() {
    let mut s = Session::new();
    let report = run_ok(
        &mut s,
        r#"
        register_node("tests.Pair", ["a"], ["kind"]);
        let f = compile(|m| #{ sum: m.x + m.y, pair: node("tests.Pair", #{ a: m.x * 2.0, kind: "t" }) });
        let out = f.run(#{ x: ones([2]), y: ones([2]) });
        show("sum", out.sum);
        show("pair", out.pair);
        show("kind", out.pair.kind);
        "#,
    );
    assert_eq!(text(&report, "sum"), "array([2., 2.], dtype=float32)");
    assert_eq!(
        text(&report, "pair"),
        "tests.Pair {a: array([2., 2.], dtype=float32), kind: t}"
    );
    assert_eq!(text(&report, "kind"), "t");
    assert_eq!(
        report.functions[0].cache.reports[0].input_tree,
        "({\"x\": *, \"y\": *},)"
    );
}

#[test]
fn unused_functions_are_dropped_after_twenty_runs() {
    let mut s = Session::new();
    run_ok(&mut s, "compile(|x| x).run(ones([1]))");
    assert_eq!(s.cached_functions(), 1);
    for _ in 0..KEEP_UNUSED_RUNS {
        run_ok(&mut s, "1");
    }
    assert_eq!(s.cached_functions(), 0);
}

#[test]
fn a_run_report_round_trips_through_json() {
    let mut s = Session::new();
    let report = run_ok(&mut s, "compile(|x| x.exp()).run(ones([2]))");
    let json = serde_json::to_string(&report).unwrap();
    let back: RunReport = serde_json::from_str(&json).unwrap();
    assert_eq!(back.outputs, report.outputs);
    assert_eq!(
        back.functions[0].cache.reports,
        report.functions[0].cache.reports
    );
}

#[test]
fn what_if_variants_change_the_plans_as_their_names_say() {
    let mut s = Session::new();
    let rows = s.compare(crate::examples::DONATION.script);
    let names: Vec<&str> = rows.iter().map(|r| r.variant.as_str()).collect();
    assert_eq!(
        names,
        ["as written", "fusion off", "donation off", "shapeless"]
    );
    assert!(rows
        .iter()
        .all(|r| r.error.is_none() && r.functions.len() == 1));
    let figures = |i: usize| &rows[i].functions[0];
    // params - grads * 0.1: one fused node, or a multiply and a subtract.
    assert_eq!(figures(1).nodes, figures(0).nodes + 1);
    // Donated, the update writes into args[0]: no slot at all.
    assert_eq!(figures(0).memory.peak_bytes, 0);
    assert!(figures(2).memory.peak_bytes > 0);
    assert_eq!(figures(2).reinplaced, 0);
    // The next plain run is served by the first variant's cache.
    let report = s.run(crate::examples::DONATION.script);
    assert_eq!(report.functions[0].cache.hits, 1);
}

#[test]
fn grad_differentiates_argument_zero_and_argnums_choose_others() {
    let mut s = Session::new();
    let report = run_ok(
        &mut s,
        r#"
        let f = |a, b| (a * a * b).sum();
        let a = array([1.0, 2.0]);
        let b = array([3.0, 5.0]);
        show("da", grad(f).run(a, b));
        show("both", grad(f, [0, 1]).run(a, b));
        show("compiled", compile(grad(f)).run(a, b));
        "#,
    );
    // d/da = 2 a b, d/db = a².
    assert_eq!(text(&report, "da"), "array([ 6., 20.], dtype=float32)");
    assert_eq!(
        text(&report, "both"),
        "[array([ 6., 20.], dtype=float32), array([1., 4.], dtype=float32)]"
    );
    assert_eq!(text(&report, "compiled"), text(&report, "da"));
    assert_eq!(report.functions.len(), 2, "compile(grad(f)) is grad(f)");
    assert!(report.functions[0].source.starts_with("grad("));
}

#[test]
fn value_and_grad_returns_the_loss_beside_the_gradient_and_aux_with_has_aux() {
    let mut s = Session::new();
    let report = run_ok(
        &mut s,
        r#"
        let x = array([1.0, -2.0]);
        let vg = value_and_grad(|x| (x * x).sum()).run(x);
        show("loss", vg[0]);
        show("gradient", vg[1]);
        let aux = value_and_grad(|x| [(x * x).sum(), x.max()]).has_aux().run(x);
        show("aux", aux[0][1]);
        show("aux gradient", aux[1]);
        "#,
    );
    assert_eq!(text(&report, "loss"), "array(5., dtype=float32)");
    assert_eq!(
        text(&report, "gradient"),
        "array([ 2., -4.], dtype=float32)"
    );
    assert_eq!(text(&report, "aux"), "array(1., dtype=float32)");
    assert_eq!(text(&report, "aux gradient"), text(&report, "gradient"));
}

#[test]
fn gradient_errors_name_the_problem_at_the_scripts_line() {
    let mut s = Session::new();
    let report = s.run("let x = ones([2]);\ngrad(|x| x * 2.0).run(x)");
    let e = error(&report);
    assert_eq!(e.line, Some(2), "{e:?}");
    assert!(e.message.contains("grad"), "{e:?}");
    let report = s.run("let x = ones([2]);\n\ngrad(|x| [x.sum()]).run(x)");
    let e = error(&report);
    assert_eq!(e.line, Some(3), "{e:?}");
    assert!(e.message.contains("returning a scalar array"), "{e:?}");
    let report = s.run("grad(|x| x.sum()).has_aux()");
    assert!(
        error(&report)
            .message
            .contains(".has_aux() applies to value_and_grad"),
        "{report:?}"
    );
    let report = s.run("grad(|x| x.sum(), [])");
    assert!(
        error(&report)
            .message
            .contains("at least one argument position"),
        "{report:?}"
    );
    // The next run works.
    run_ok(&mut s, "show(\"ok\", grad(|x| x.sum()).run(ones([2])))");
}

#[test]
fn an_error_found_while_reading_a_shown_value_is_reported_at_the_show() {
    let mut s = Session::new();
    let report = s.run("let x = ones([3]);\nshow(\"bad\", x.take(array([7], \"i32\"), 0));");
    let e = error(&report);
    assert_eq!(e.line, Some(2), "{e:?}");
    assert!(e.message.contains("take"), "{e:?}");
}

#[test]
fn verify_on_the_cpu_compares_every_shown_element_and_finds_no_difference() {
    let mut s = Session::new();
    let script = "let f = compile(|x| x.exp() * 2.0);\nshow(\"y\", f.run(arange(6.0)));\nshow(\"z\", [ones([2]), 3]);";
    let (report, verification) = pollster::block_on(s.verify(script));
    assert_eq!(report.error, None);
    assert_eq!(report.backend, "cpu");
    assert_eq!(
        verification,
        Verification {
            backend: "cpu".to_string(),
            compared: 8,
            max_abs_diff: 0.0,
            max_rel_diff: 0.0,
            largest: None,
            error: None,
        }
    );
}

#[test]
fn verification_reports_the_largest_difference_and_mismatched_shapes() {
    let shown = |a: kiln::Array| ("y".to_string(), a);
    let a = kiln::Array::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    let b = kiln::Array::from_vec(vec![1.5f32, 4.0], &[2]).unwrap();
    let v = Verification::compare("gpu".to_string(), &[shown(a.clone())], &[shown(b)]);
    assert_eq!((v.compared, v.max_abs_diff, v.error), (2, 2.0, None));
    // |2 - 4| / 4 beats |1 - 1.5| / 1.
    assert_eq!(v.max_rel_diff, 0.5);
    let c = kiln::Array::from_vec(vec![1.0f32], &[1]).unwrap();
    let v = Verification::compare("gpu".to_string(), &[shown(a)], &[shown(c)]);
    assert!(v
        .error
        .unwrap()
        .contains("f32[2] on the device, f32[1] on the CPU"));
}

#[test]
fn every_traced_node_names_the_script_line_and_column_that_made_it() {
    let mut s = Session::new();
    let script = "let f = compile(|x| {\n    let e = x.exp();\n    nn::gelu(e) + x\n}).fusion(false);\nf.run(ones([3]))";
    let report = run_ok(&mut s, script);
    let entry = &report.functions[0].cache.reports[0];
    let at = |op: &str| {
        let node = entry.nodes.iter().find(|n| n.op == op);
        node.and_then(|n| n.location).map(|l| (l.line, l.column))
    };
    assert_eq!(at("exp"), Some((2, 15)), "{entry:?}");
    // The last add of the line is the script's `+`, at its column; gelu's
    // own ops are all made by the `nn::gelu` call (Rhai places a call of a
    // module's function at the function's name).
    let line_3: Vec<(String, u32)> = entry
        .nodes
        .iter()
        .filter_map(|n| {
            n.location
                .filter(|l| l.line == 3)
                .map(|l| (n.op.clone(), l.column))
        })
        .collect();
    assert_eq!(line_3.last(), Some(&("add".to_string(), 17)), "{line_3:?}");
    assert!(
        line_3[..line_3.len() - 1]
            .iter()
            .all(|(_, column)| *column == 9),
        "{line_3:?}"
    );
    assert_eq!(
        at("input args[0]"),
        None,
        "inputs are the caller's, not the script's"
    );
}

#[test]
fn a_closure_called_with_the_wrong_arguments_is_named_by_its_line() {
    let report = Session::new().run("let a = ones([2]);\n\nlet g = |x, y| x + y;\ng.call(a)");
    let e = error(&report);
    assert_eq!(
        e.message,
        "the closure at line 3 (`|x, y|`) takes 2 arguments, but was called with 1 (ndarray)"
    );
    assert_eq!(e.line, Some(4));
}

#[test]
fn a_compiled_closure_with_the_wrong_arguments_is_named_by_its_line() {
    let report =
        Session::new().run("let k = 2.0;\nlet f = compile(|x, y| x * k + y);\nf.run(ones([2]))");
    let e = error(&report);
    assert!(!e.message.contains("anon$"), "{}", e.message);
    assert!(
        e.message
            .starts_with("the closure at line 2 (`|x, y|`) takes 2 arguments"),
        "{}",
        e.message
    );
}

#[test]
fn a_missing_overload_lists_the_existing_ones() {
    let report = Session::new().run("let h = ones([2, 3]);\nh.sum(1, true)");
    assert_eq!(
        error(&report).message,
        "no `sum` takes (ndarray, i64, bool); did you mean x.sum(), x.sum(i64), x.sum(list) \
         or x.sum(list, bool)?"
    );
}

#[test]
fn grad_of_a_vector_suggests_only_what_scripts_have() {
    let report = Session::new().run("let g = grad(|x| x * 2.0);\ng.run(ones([3]))");
    let message = &error(&report).message;
    assert!(message.contains("scalar float loss"), "{message}");
    assert!(message.contains("`.sum()`"), "{message}");
    assert!(!message.contains("vjp"), "{message}");
}

#[test]
fn cast_takes_the_dtype_names_arrays_print() {
    let mut s = Session::new();
    let report = run_ok(
        &mut s,
        r#"show("f16", ones([2]).cast("float16")); show("i32", zeros([1], "int32"))"#,
    );
    assert_eq!(text(&report, "f16"), "array([1., 1.], dtype=float16)");
    assert_eq!(text(&report, "i32"), "array([0], dtype=int32)");
}

#[test]
fn verification_names_the_shown_value_and_the_index_of_the_largest_difference() {
    let shown = |label: &str, values: Vec<f32>, dims: &[usize]| {
        (
            label.to_string(),
            kiln::Array::from_vec(values, dims).unwrap(),
        )
    };
    let device = [
        shown("x", vec![1.0, 2.0], &[2]),
        shown("log", vec![0.0, 1.0, 2.0, 0.0, 5.0, 0.0], &[2, 3]),
    ];
    let cpu = [
        shown("x", vec![1.0, 2.0], &[2]),
        shown("log", vec![0.0, 1.0, 2.0, 0.0, 5.0, f32::NAN], &[2, 3]),
    ];
    let v = Verification::compare("gpu".to_string(), &device, &cpu);
    let largest = v.largest.unwrap();
    assert_eq!((largest.label.as_str(), largest.index), ("log", vec![1, 2]));
    assert_eq!(largest.device, 0.0);
    assert!(largest.cpu.is_nan());
}

#[test]
fn verify_labels_each_array_of_a_shown_list_by_its_place() {
    let mut s = Session::new();
    s.run("show(\"pair\", [ones([1]), zeros([1])]); show(\"one\", ones([2]))");
    let labels: Vec<String> = s.shown_arrays().into_iter().map(|(l, _)| l).collect();
    assert_eq!(labels, ["pair (array 1)", "pair (array 2)", "one"]);
}

#[test]
fn vmap_jvp_and_jacobians_are_bound_and_compose() {
    let mut s = Session::new();
    let report = run_ok(
        &mut s,
        r#"
        let w = array([[1.0, 2.0], [3.0, 4.0]]);
        let xs = array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]);
        show("vmap", vmap(|x, w| x.matmul(w), [0, ()]).run(xs, w));
        show("out axis", vmap(|x| x * 2.0, [0], 1).run(xs));
        let loss = |x, w| (x.matmul(w) * x.matmul(w)).sum();
        let per_example = vmap(grad(loss), [0, ()]).run(xs, w);
        show("per-example", per_example);
        let pushed = jvp(|x| x * x, [array([1.0, 3.0])], [array([1.0, 1.0])]);
        show("jvp", pushed[1]);
        show("jacfwd", jacfwd(|x| x * x).run(array([1.0, 3.0])));
        show("jacrev", jacrev(|x| (x * x).sum()).run(array([1.0, 3.0])));
        show("hessian", hessian(|x| (x * x * x).sum()).run(array([1.0, 2.0])));
        let hvp = jvp(grad(|x| (x * x * x).sum()), [array([1.0, 2.0])], [array([1.0, 0.0])]);
        show("hvp", hvp[1]);
        "#,
    );
    assert_eq!(
        text(&report, "vmap"),
        "array([[1., 2.],\n       [3., 4.],\n       [4., 6.]], dtype=float32)"
    );
    assert_eq!(
        text(&report, "out axis"),
        "array([[2., 0., 2.],\n       [0., 2., 2.]], dtype=float32)"
    );
    // d/dx Σ(x·w)² = 2·w·(x·w)ᵀ per example.
    assert_eq!(
        text(&report, "per-example"),
        "array([[10., 22.],\n       [22., 50.],\n       [32., 72.]], dtype=float32)"
    );
    assert_eq!(text(&report, "jvp"), "array([2., 6.], dtype=float32)");
    assert_eq!(
        text(&report, "jacfwd"),
        "array([[2., 0.],\n       [0., 6.]], dtype=float32)"
    );
    assert_eq!(text(&report, "jacrev"), "array([2., 6.], dtype=float32)");
    assert_eq!(
        text(&report, "hessian"),
        "array([[ 6.,  0.],\n       [ 0., 12.]], dtype=float32)"
    );
    assert_eq!(text(&report, "hvp"), "array([6., 0.], dtype=float32)");
}

#[test]
fn vmap_of_a_custom_op_without_a_rule_runs_per_example_and_the_report_says_so() {
    let mut s = Session::new();
    let report = run_ok(
        &mut s,
        r#"
        let norm = custom_op("norm2", |a| (a.x * a.x).sum());
        show("norms", vmap(|x| norm.apply(#{ x: x })).run(ones([3, 2])));
        "#,
    );
    assert_eq!(text(&report, "norms"), "array([2., 2., 2.], dtype=float32)");
    let fallbacks = &report.functions[0].cache.reports[0].vmap_fallbacks;
    assert_eq!(fallbacks.len(), 1, "{fallbacks:?}");
    assert!(fallbacks[0].op.contains("norm2"), "{fallbacks:?}");
    assert_eq!(fallbacks[0].examples, 3);
}

#[test]
fn control_flow_runs_as_one_node_and_reports_the_cache_written_in_place() {
    let mut s = Session::new();
    let report = run_ok(
        &mut s,
        r#"
        let sums = compile(|xs| scan(|c, x| [c + x, x.sum()], zeros([2]), xs));
        let out = sums.run(ones([3, 2]));
        show("carry", out[0]);
        show("ys", out[1]);
        show("fori", compile(|x| fori_loop(0, 4, |i, c| c * 2.0, x)).run(ones([1])));
        show("while", compile(|x| while_loop(|c| c.sum() < 50.0, |c| c * 3.0, x)).run(ones([1])));
        show("cond", compile(|x| cond(x.sum() > 0.0, |v| v * 10.0, |v| -v, x)).run(ones([2])));
        show("switch", compile(|i, x| branch(i, [|v| v + 1.0, |v| v * 5.0], x)).run(array([1], "int32").reshape([]), ones([2])));
        let write = compile(|cache, row, t| cache.dynamic_update_slice(row, [t, 0]));
        show("update", write.run(zeros([3, 2]), ones([1, 2]), array([2], "int32").reshape([])));
        "#,
    );
    assert_eq!(text(&report, "carry"), "array([3., 3.], dtype=float32)");
    assert_eq!(text(&report, "ys"), "array([2., 2., 2.], dtype=float32)");
    assert_eq!(text(&report, "fori"), "array([16.], dtype=float32)");
    assert_eq!(text(&report, "while"), "array([81.], dtype=float32)");
    assert_eq!(text(&report, "cond"), "array([10., 10.], dtype=float32)");
    assert_eq!(text(&report, "switch"), "array([5., 5.], dtype=float32)");
    assert_eq!(
        text(&report, "update"),
        "array([[0., 0.],\n       [0., 0.],\n       [1., 1.]], dtype=float32)"
    );
    let entry = &report.functions[0].cache.reports[0];
    assert_eq!(entry.loops.len(), 1, "{:?}", entry.loops);
    assert_eq!(entry.loops[0].trip_count.as_deref(), Some("3"));
    assert!(
        entry.loops[0].bodies[0].carried[0].in_place,
        "{:?}",
        entry.loops[0].bodies[0].carried
    );
}

#[test]
fn an_error_inside_a_loop_body_points_at_the_bodys_line() {
    let mut s = Session::new();
    let report = s.run(
        "let f = compile(|xs| scan(|c, x| [c + x.nope(), c], zeros([2]), xs));\nf.run(ones([3, 2]))",
    );
    let e = error(&report);
    assert!(e.message.contains("nope"), "{e:?}");
    assert_eq!(e.line, Some(1), "{e:?}");
}

#[test]
fn an_edited_function_is_diffed_against_the_previous_run() {
    let mut s = Session::new();
    let first = run_ok(
        &mut s,
        "let f = compile(|x| x.exp().sum()); f.run(ones([4]))",
    );
    assert!(
        first.functions[0].previous.is_none(),
        "a first run has none"
    );
    let edited = run_ok(
        &mut s,
        "let f = compile(|x| (x * 2.0).exp().sum()); f.run(ones([8]))",
    );
    let function = &edited.functions[0];
    let previous = function.previous.as_ref().expect("the run before the edit");
    assert!(previous.source_changed);
    let shown = function.cache.reports.last().expect("an entry");
    let key = previous
        .key_diffs
        .iter()
        .find(|k| k.after == shown.entry)
        .expect("the shown entry's key difference");
    let reasons: Vec<String> = key.reasons.iter().map(ToString::to_string).collect();
    assert_eq!(reasons, ["aval differs at leaf args[0]: f32[4] → f32[8]"]);
    let diff = previous.report.diff(shown);
    assert!(
        !diff.added.is_empty() || !diff.changed.is_empty(),
        "the multiply shows: {diff:?}"
    );
}

#[test]
fn an_unchanged_function_is_its_own_previous_run() {
    let mut s = Session::new();
    let script = "let f = compile(|x| x.exp()); f.run(ones([4]))";
    run_ok(&mut s, script);
    let again = run_ok(&mut s, script);
    let previous = again.functions[0]
        .previous
        .as_ref()
        .expect("the run before");
    assert!(!previous.source_changed);
    assert_eq!(previous.report.entry, 0);
    assert!(previous.key_diffs.iter().all(|k| k.reasons.is_empty()));
}

#[test]
fn the_jax_numpy_names_compute_kilns_values() {
    let mut s = Session::new();
    let report = run_ok(
        &mut s,
        r#"
        let a = array([[3, 1], [2, 4]]);
        show("where", where(a > 2, a, 0.0));
        show("tril", ones([2, 2]).tril());
        show("one_hot", array([1, 0], "i32").one_hot(2));
        show("einsum", einsum("ij,jk->ik", a, a));
        show("split", split(a, 2, 0)[1]);
        show("stack", stack([a, a], 0).shape);
        show("cumsum", a.cumsum(1));
        show("sort", a.sort());
        show("top_k", a.top_k(1)[1]);
        show("argmin", a.argmin(0));
        show("stats", [a.variance(), a.std([0]), a.logsumexp([1]), a.prod()]);
        show("round", array([0.5, 1.5, -2.5, 2.7]).round());
        show("clip", a.clip((), 2.0));
        show("layout", [a.pad([[1, 0], [0, 0]]), a.tile([1, 2]), a.repeat(2, 0), a.flatten(), a.transpose([1, 0])]);
        show("arange", arange(3));
        show("arange_float", arange(3.0));
        show("eye", eye(2));
        show("row", a[1]);
        show("rows", arange(5)[1..3]);
        show("last", arange(5)[-1]);
        show("math", [a.square(), a.tan(), a.sign(), a.floor(), a.log1p(), a.zeros_like(), a.ones_like()]);
        "#,
    );
    let cases = [
        (
            "where",
            "array([[3., 0.],\n       [0., 4.]], dtype=float32)",
        ),
        ("tril", "array([[1., 0.],\n       [1., 1.]], dtype=float32)"),
        (
            "one_hot",
            "array([[0., 1.],\n       [1., 0.]], dtype=float32)",
        ),
        (
            "einsum",
            "array([[11.,  7.],\n       [14., 18.]], dtype=float32)",
        ),
        ("split", "array([[2., 4.]], dtype=float32)"),
        ("stack", "[2, 2, 2]"),
        (
            "cumsum",
            "array([[3., 4.],\n       [2., 6.]], dtype=float32)",
        ),
        ("sort", "array([[1., 3.],\n       [2., 4.]], dtype=float32)"),
        ("top_k", "array([[0],\n       [1]], dtype=int32)"),
        ("argmin", "array([1, 0], dtype=uint32)"),
        ("round", "array([ 0.,  2., -2.,  3.], dtype=float32)"),
        ("clip", "array([[2., 1.],\n       [2., 2.]], dtype=float32)"),
        ("arange", "array([0, 1, 2], dtype=int32)"),
        ("arange_float", "array([0., 1., 2.], dtype=float32)"),
        ("eye", "array([[1., 0.],\n       [0., 1.]], dtype=float32)"),
        ("row", "array([2., 4.], dtype=float32)"),
        ("rows", "array([1, 2], dtype=int32)"),
        ("last", "array(4, dtype=int32)"),
    ];
    for (label, want) in cases {
        assert_eq!(text(&report, label), want, "{label}");
    }
}

#[test]
fn the_jax_numpy_names_raise_errors_naming_the_problem_and_line() {
    let mut s = Session::new();
    for (script, detail) in [
        (
            "let a = ones([2, 2]);\nlet b = einsum(\"ii->i\", a);",
            "repeats within one operand",
        ),
        (
            "let a = ones([2, 2]);\nlet b = a[2];",
            "index 2 is out of range",
        ),
        (
            "let a = ones([3]);\nlet b = split(a, 2, 0);",
            "into 2 equal parts",
        ),
        ("let a = ones([3]);\nlet b = a.top_k(4);", "k = 4"),
        (
            "let a = ones([3]);\nlet b = arange(0, 3, 0);",
            "non-zero step",
        ),
        ("let a = scalar(1.0);\nlet b = a[0..1];", "0-d"),
    ] {
        let report = s.run(script);
        let e = error(&report);
        assert_eq!(e.line, Some(2), "{script}: {e:?}");
        assert!(e.message.contains(detail), "{script}: {e:?}");
    }
}

#[test]
fn a_range_of_rows_slices_a_symbolic_first_axis_in_a_shapeless_function() {
    let mut s = Session::new();
    let report = run_ok(
        &mut s,
        "let f = compile(|x| x[1..3].sum()).shapeless();\nshow(\"a\", f.run(arange(5.0)));\nshow(\"b\", f.run(arange(7.0)));",
    );
    assert_eq!(text(&report, "a"), "array(3., dtype=float32)");
    assert_eq!(text(&report, "b"), "array(3., dtype=float32)");
}
