//! A compiled function's report knows where every node came from: the
//! traced graph before the passes, which traced nodes each optimized node
//! computes, the members of each fused group, and the program location
//! that made each node.

use kiln::report::GroupArg;
use kiln::{at_location, compile, stop_gradient, Array, DType, Report, SourceLocation};

fn at(line: u32) -> Option<SourceLocation> {
    Some(SourceLocation { line, column: 1 })
}

fn report_of(fusion: bool, f: impl Fn(Array) -> Array + Send + Sync + 'static) -> Report {
    let compiled = compile(f).fusion(fusion);
    compiled
        .call(&Array::ones(&[2, 3], DType::F32))
        .expect("the test function compiles");
    let cache = compiled.cache();
    (*cache.reports[0]).clone()
}

fn ops(report: &Report) -> Vec<&str> {
    report.nodes.iter().map(|n| n.op.as_str()).collect()
}

#[test]
fn the_report_lists_the_traced_graph_before_the_passes() {
    let report = report_of(false, |x| {
        let a = x.exp();
        let b = x.exp();
        stop_gradient(&(&a + &b))
    });
    let traced: Vec<&str> = report.traced.iter().map(|n| n.op.as_str()).collect();
    assert_eq!(traced, ["input args", "exp", "exp", "add", "stop_gradient"]);
    assert_eq!(report.traced_nodes, 5);
    assert_eq!(report.traced[3].inputs, vec![1, 2]);
    assert_eq!(report.traced[3].aval, "f32[2,3]");
    assert_eq!(ops(&report), ["input args", "exp", "add"]);
}

#[test]
fn merged_and_forwarded_nodes_point_to_the_node_that_computes_them() {
    let report = report_of(false, |x| {
        let a = x.exp();
        let b = x.exp();
        stop_gradient(&(&a + &b))
    });
    // CSE merged the second exp into the first; simplify dropped the
    // stop_gradient, which forwards the add.
    assert_eq!(report.nodes[1].traced, vec![1, 2]);
    assert_eq!(report.nodes[2].traced, vec![3, 4]);
    let optimized: Vec<Option<usize>> = report.traced.iter().map(|n| n.optimized).collect();
    assert_eq!(optimized, [Some(0), Some(1), Some(1), Some(2), Some(2)]);
}

#[test]
fn every_node_carries_the_location_that_made_it() {
    let report = report_of(false, |x| {
        let e = at_location(at(2), || x.exp());
        at_location(at(3), || &e * &x)
    });
    let locations: Vec<Option<u32>> = report
        .nodes
        .iter()
        .map(|n| n.location.map(|l| l.line))
        .collect();
    assert_eq!(locations, [None, Some(2), Some(3)]);
    assert_eq!(report.traced[1].location, at(2));
}

#[test]
fn a_fused_group_lists_its_members_with_their_traced_nodes_and_lines() {
    let report = report_of(true, |x| {
        let e = at_location(at(2), || x.exp());
        let t = at_location(at(3), || e.tanh());
        at_location(at(4), || &t * &x)
    });
    assert_eq!(ops(&report).len(), 2, "{:?}", ops(&report));
    let fused = &report.nodes[1];
    let members: Vec<&str> = fused.group.iter().map(|s| s.op.as_str()).collect();
    assert_eq!(members, ["exp", "tanh", "mul"]);
    assert_eq!(fused.traced, vec![1, 2, 3]);
    assert_eq!(fused.location, at(4), "the group's result is the mul");
    let lines: Vec<Option<u32>> = fused
        .group
        .iter()
        .map(|s| s.location.map(|l| l.line))
        .collect();
    assert_eq!(lines, [Some(2), Some(3), Some(4)]);
    assert_eq!(fused.group[0].args, vec![GroupArg::Node(0)]);
    assert_eq!(fused.group[1].args, vec![GroupArg::Step(0)]);
    assert_eq!(
        fused.group[2].args,
        vec![GroupArg::Step(1), GroupArg::Node(0)]
    );
    assert_eq!(fused.group[2].aval, "f32[2,3]");
    assert!(report.nodes[0].group.is_empty());
}

#[test]
fn the_report_round_trips_through_json_with_its_provenance() {
    let report = report_of(true, |x| at_location(at(5), || x.exp() + 1.0));
    let json = serde_json::to_string(&report).expect("a report serializes");
    let back: Report = serde_json::from_str(&json).expect("and reads back");
    assert_eq!(back, report);
    assert!(json.contains(r#""args":[{"kind":"node","id":0}"#), "{json}");
}
