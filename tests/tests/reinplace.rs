//! Reinplacing and slot planning, one behaviour per test: which operand a
//! node may overwrite and why the others are refused, donation, and the
//! plans that result. Graphs are built by hand where the schedule matters.

use kiln::graph::{Graph, GraphNode, Literal, Operands, ValueId};
use kiln::{
    compile, Array, Aval, Backend, BinaryOp, CpuBackend, DType, Executable, Home, HostData, Op,
    Refusal, SlotPlan, UnaryOp, ValueKind,
};
use std::sync::Arc;

/// A graph under construction: each call appends a value in schedule order.
#[derive(Default)]
struct Builder {
    graph: Graph,
}

impl Builder {
    fn push(
        &mut self,
        kind: ValueKind,
        inputs: &[ValueId],
        shape: &[usize],
        dtype: DType,
    ) -> ValueId {
        self.graph.nodes.push(GraphNode {
            kind,
            inputs: Operands::from_slice(inputs),
            aval: Aval::new(shape, dtype),
        });
        self.graph.nodes.len() - 1
    }

    fn input(&mut self, shape: &[usize]) -> ValueId {
        let leaf = self.graph.num_inputs;
        self.graph.num_inputs += 1;
        self.push(ValueKind::Input(leaf), &[], shape, DType::F32)
    }

    fn constant(&mut self, value: f32) -> ValueId {
        let data = Arc::new(HostData::F32(vec![value]));
        self.push(ValueKind::Constant(Literal(data)), &[], &[], DType::F32)
    }

    fn unary(&mut self, op: UnaryOp, x: ValueId) -> ValueId {
        let aval = self.graph.nodes[x].aval.clone();
        self.push(
            ValueKind::Op(Op::Unary(op)),
            &[x],
            &shape_of(&aval),
            aval.dtype,
        )
    }

    fn binary(&mut self, op: BinaryOp, a: ValueId, b: ValueId, shape: &[usize]) -> ValueId {
        let dtype = if op.is_comparison() {
            DType::Bool
        } else {
            self.graph.nodes[a].aval.dtype
        };
        self.push(ValueKind::Op(Op::Binary(op)), &[a, b], shape, dtype)
    }

    fn finish(mut self, outputs: &[ValueId]) -> Graph {
        self.graph.outputs = outputs.to_vec();
        self.graph
    }
}

fn shape_of(aval: &Aval) -> Vec<usize> {
    aval.shape.as_known().expect("known shape")
}

fn plan(graph: &Graph, donated: &[bool]) -> SlotPlan {
    let shapes: Vec<Vec<usize>> = graph.nodes.iter().map(|n| shape_of(&n.aval)).collect();
    let plan = SlotPlan::build(graph, donated, &shapes);
    plan.verify(graph, &shapes)
        .expect("the verifier accepts the plan");
    plan
}

/// The verdict on `operand` in `node`'s decision (`None`: taken).
fn verdict(plan: &SlotPlan, node: ValueId, operand: ValueId) -> Option<Refusal> {
    let decision = plan
        .decisions()
        .iter()
        .find(|d| d.node == node)
        .expect("an elementwise node has a decision");
    decision
        .operands
        .iter()
        .find(|v| v.operand == operand)
        .expect("a verdict per operand")
        .refusal
        .clone()
}

/// Runs `graph` on the CPU through its plan and returns the outputs.
fn run(graph: Graph, donated: &[bool], inputs: Vec<Vec<f32>>) -> Vec<Vec<f32>> {
    let shapes: Vec<Vec<usize>> = graph.nodes.iter().map(|n| shape_of(&n.aval)).collect();
    let exe = Executable::new(graph, Vec::new(), donated, &[]).expect("plans");
    let inputs = inputs
        .into_iter()
        .map(|v| Arc::new(HostData::F32(v)))
        .collect();
    CpuBackend
        .run(&exe, inputs, &shapes)
        .expect("runs")
        .iter()
        .map(|d| d.to_vec::<f32>())
        .collect()
}

#[test]
fn operand_read_later_by_a_reinplaced_node_blocks_an_earlier_reinplace() {
    // a = t + y runs first; b = w + t is reinplaced into w but still reads
    // t, so a must not overwrite t.
    let mut g = Builder::default();
    let x = g.input(&[4]);
    let t = g.unary(UnaryOp::Exp, x);
    let y = g.unary(UnaryOp::Sin, x);
    let w = g.unary(UnaryOp::Cos, x);
    let a = g.binary(BinaryOp::Add, t, y, &[4]);
    let b = g.binary(BinaryOp::Add, w, t, &[4]);
    let c = g.binary(BinaryOp::Mul, a, b, &[4]);
    let graph = g.finish(&[c]);
    let p = plan(&graph, &[false]);
    assert_eq!(verdict(&p, a, t), Some(Refusal::ReadLater { reader: b }));
    assert_eq!(verdict(&p, a, y), None);
    assert_eq!(p.in_place_of(b), Some(w));
    assert_eq!(
        verdict(&p, b, t),
        Some(Refusal::MultipleCandidates { chosen: w })
    );

    let xs = [0.5f32, -1.0, 2.0, 0.0];
    let expected: Vec<f32> = xs
        .iter()
        .map(|&v| (v.exp() + v.sin()) * (v.cos() + v.exp()))
        .collect();
    let got = run(graph, &[false], vec![xs.to_vec()]);
    for (g, e) in got[0].iter().zip(&expected) {
        assert!(
            (g - e).abs() <= 1e-5 * e.abs().max(1.0),
            "{got:?} vs {expected:?}"
        );
    }
}

#[test]
fn operand_with_several_readers_is_taken_only_by_its_last_reader() {
    let mut g = Builder::default();
    let x = g.input(&[3]);
    let t = g.unary(UnaryOp::Exp, x);
    let a = g.unary(UnaryOp::Neg, t);
    let b = g.binary(BinaryOp::Mul, t, a, &[3]);
    let graph = g.finish(&[b]);
    let p = plan(&graph, &[false]);
    assert_eq!(verdict(&p, a, t), Some(Refusal::ReadLater { reader: b }));
    assert_eq!(p.in_place_of(b), Some(t));
    assert_eq!(run(graph, &[false], vec![vec![0.0, 1.0, -1.0]])[0], {
        [0.0f32, 1.0, -1.0]
            .iter()
            .map(|v| -(v.exp() * v.exp()))
            .collect::<Vec<_>>()
    });
}

#[test]
fn broadcast_operand_is_refused_because_the_output_grows() {
    let mut g = Builder::default();
    let row = g.input(&[1, 4]);
    let full = g.input(&[4, 4]);
    let r = g.unary(UnaryOp::Exp, row);
    let m = g.unary(UnaryOp::Exp, full);
    let s = g.binary(BinaryOp::Add, r, m, &[4, 4]);
    let graph = g.finish(&[s]);
    let p = plan(&graph, &[false, false]);
    assert_eq!(
        verdict(&p, s, r),
        Some(Refusal::ShapeGrows {
            operand: "[1,4]".into(),
            output: "[4,4]".into()
        })
    );
    assert_eq!(p.in_place_of(s), Some(m));
}

#[test]
fn comparisons_and_casts_are_refused_because_the_dtype_changes() {
    let mut g = Builder::default();
    let x = g.input(&[4]);
    let t = g.unary(UnaryOp::Exp, x);
    let u = g.unary(UnaryOp::Sin, x);
    let less = g.binary(BinaryOp::Lt, t, u, &[4]);
    let v = g.unary(UnaryOp::Cos, x);
    let half = g.push(ValueKind::Op(Op::Cast(DType::F16)), &[v], &[4], DType::F16);
    let graph = g.finish(&[less, half]);
    let p = plan(&graph, &[false]);
    let f32_to_bool = Some(Refusal::DtypeChanges {
        operand: DType::F32,
        output: DType::Bool,
    });
    assert_eq!(verdict(&p, less, t), f32_to_bool);
    assert_eq!(verdict(&p, less, u), f32_to_bool);
    assert_eq!(
        verdict(&p, half, v),
        Some(Refusal::DtypeChanges {
            operand: DType::F32,
            output: DType::F16
        })
    );
}

#[test]
fn caller_input_is_refused_unless_donated() {
    let build = || {
        let mut g = Builder::default();
        let x = g.input(&[4]);
        let e = g.unary(UnaryOp::Exp, x);
        (g.finish(&[e]), x, e)
    };
    let (graph, x, e) = build();
    let kept = plan(&graph, &[false]);
    assert_eq!(verdict(&kept, e, x), Some(Refusal::CallerInput { leaf: 0 }));
    assert_eq!(kept.home(e), Home::Slot(0));
    let donated = plan(&graph, &[true]);
    assert_eq!(verdict(&donated, e, x), None);
    assert_eq!(donated.home(e), Home::Input(0));
    assert_eq!(donated.num_slots(), 0);
}

#[test]
fn constant_operand_is_refused() {
    let mut g = Builder::default();
    let x = g.input(&[1]);
    let one = g.constant(1.0);
    let t = g.unary(UnaryOp::Exp, x);
    let s = g.binary(BinaryOp::Add, one, t, &[1]);
    let graph = g.finish(&[s]);
    let p = plan(&graph, &[false]);
    assert_eq!(verdict(&p, s, one), Some(Refusal::Constant));
    assert_eq!(p.in_place_of(s), Some(t));
}

#[test]
fn donated_argument_buffer_holds_the_result_when_nothing_else_holds_it() {
    let f = compile(|x: Array| (x.exp() * 2.0 + 1.0).tanh()).donate(["args"]);
    let x = Array::from_vec(vec![0.0f32, 0.5, -0.5, 1.0], &[4]).expect("array");
    let address = |a: &Array| match &*a.data().expect("data") {
        HostData::F32(v) => v.as_ptr() as usize,
        other => panic!("unexpected {other:?}"),
    };
    let probe = address(&x);
    let out = f.call_owned(x).expect("call");
    assert_eq!(
        address(&out),
        probe,
        "the result was not written into the donated buffer"
    );
    let expected: Vec<f32> = [0.0f32, 0.5, -0.5, 1.0]
        .iter()
        .map(|v| (v.exp() * 2.0 + 1.0).tanh())
        .collect();
    let got = out.to_vec::<f32>().expect("values");
    for (g, e) in got.iter().zip(&expected) {
        assert!((g - e).abs() <= 1e-6, "{got:?} vs {expected:?}");
    }
    let report = &f.cache().reports[0];
    assert_eq!(report.plan.donated, vec!["args".to_string()]);
    assert_eq!(report.plan.slots.len(), 0);
}

#[test]
fn donated_argument_still_held_by_the_caller_is_copied_not_written() {
    let f = compile(|x: Array| x.exp().tanh()).donate(["args"]);
    let x = Array::from_vec(vec![0.25f32, 2.0], &[2]).expect("array");
    let out = f.call(&x).expect("call");
    assert_eq!(x.to_vec::<f32>().expect("intact"), vec![0.25, 2.0]);
    assert_eq!(
        out.to_vec::<f32>().expect("values"),
        vec![0.25f32.exp().tanh(), 2.0f32.exp().tanh()]
    );
}

#[test]
fn donating_a_path_that_names_no_leaf_is_an_error_and_caches_nothing() {
    let f = compile(|(x, y): (Array, Array)| x + y).donate(["args.z"]);
    let args = (
        Array::from_vec(vec![1.0f32], &[1]).expect("x"),
        Array::from_vec(vec![2.0f32], &[1]).expect("y"),
    );
    let err = f.call(&args).expect_err("no leaf at args.z").to_string();
    assert!(err.contains("args.z") && err.contains("args[0]"), "{err}");
    assert_eq!(f.cache().entries, 0);
}

#[test]
fn graph_output_is_not_overwritten_by_a_later_node() {
    let mut g = Builder::default();
    let x = g.input(&[2]);
    let t = g.unary(UnaryOp::Exp, x);
    let u = g.unary(UnaryOp::Neg, t);
    let graph = g.finish(&[t, u]);
    let p = plan(&graph, &[false]);
    assert_eq!(verdict(&p, u, t), Some(Refusal::GraphOutput { index: 0 }));
    let got = run(graph, &[false], vec![vec![0.0, 1.0]]);
    assert_eq!(got[0], vec![1.0, 1.0f32.exp()]);
    assert_eq!(got[1], vec![-1.0, -(1.0f32.exp())]);
}

#[test]
fn symbolic_dims_a_guard_made_equal_are_reinplaced_and_the_plan_is_checked() {
    // x: [s0] and y: [s1]; the first add guards s0 == s1, after which an
    // operand of either shape may hold the [s0] result.
    let f = compile(|(x, y): (Array, Array)| x.exp() + y.exp() + x.sin())
        .shapeless()
        .fusion(false);
    let args = (
        Array::from_vec(vec![0.5f32; 3], &[3]).expect("x"),
        Array::from_vec(vec![0.25f32; 3], &[3]).expect("y"),
    );
    let out = f.call(&args).expect("call");
    let expected = 0.5f32.exp() + 0.25f32.exp() + 0.5f32.sin();
    assert!(out
        .to_vec::<f32>()
        .expect("values")
        .iter()
        .all(|v| (v - expected).abs() < 1e-6));
    let report = &f.cache().reports[0];
    let refusals: Vec<String> = report
        .nodes
        .iter()
        .filter_map(|n| n.reinplace.as_ref())
        .flat_map(|d| d.operands.iter().filter_map(|v| v.refusal.as_ref()))
        .map(|r| format!("{r:?}"))
        .collect();
    assert!(
        !refusals.iter().any(|r| r.contains("ShapeNotProvablyEqual")),
        "{refusals:?}"
    );
    assert!(
        report.guards.iter().any(|g| g.contains("s0 == s1")),
        "{:?}",
        report.guards
    );
    assert_eq!(report.plan.reinplaced, 2, "{:#?}", report.nodes);
    // A call breaking the guard retraces instead of running the plan.
    let err = f
        .call(&(Array::ones(&[3], DType::F32), Array::ones(&[4], DType::F32)))
        .unwrap_err();
    assert!(err.to_string().contains("add"), "{err}");
}

#[test]
fn chain_exp_mul_add_tanh_runs_in_one_slot() {
    for fusion in [false, true] {
        let f = compile(|x: Array| (x.exp() * 2.0 + 1.0).tanh()).fusion(fusion);
        let x = Array::from_vec(vec![0.0f32, 0.5, -0.5, 1.0], &[2, 2]).expect("array");
        let out = f.call(&x).expect("call");
        let eager = (x.exp() * 2.0 + 1.0).tanh();
        assert_eq!(out.to_vec::<f32>().unwrap(), eager.to_vec::<f32>().unwrap());
        let report = &f.cache().reports[0];
        assert_eq!(
            report.plan.slots.len(),
            1,
            "fusion {fusion}: {:#?}",
            report.plan
        );
        let homes: Vec<&str> = report.nodes.iter().map(|n| n.home.as_str()).collect();
        assert!(homes
            .iter()
            .filter(|h| h.starts_with("slot"))
            .all(|h| *h == "slot 0"));
        if !fusion {
            // exp takes a new slot (x is the caller's); mul, add and tanh
            // continue in it.
            assert_eq!(report.plan.reinplaced, 3, "{:#?}", report.nodes);
        }
        // 16 bytes of f32, rounded up to the slot alignment.
        assert_eq!(report.plan.memory.peak_bytes, kiln::plan::SLOT_ALIGN);
        assert_eq!(report.plan.memory.lower_bound_bytes, kiln::plan::SLOT_ALIGN);
    }
}
