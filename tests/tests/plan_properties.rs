//! Property tests of reinplacing and slot planning over random programs
//! (elementwise, broadcast, reduce, matmul and layout ops, repeated
//! operands, values with many readers): planned, reinplaced execution on
//! the CPU equals a plain functional evaluation of the same graph bit for
//! bit, every plan passes the verifier, and corrupted plans never do.
//! Case count: `KILN_CASES` (CI default 2000).

use kiln::plan::{verify_plan, Arena, Home, PlanViolation};
use kiln::{compile, Array, Backend, CpuBackend, DType, Executable, HostData, ValueKind};
use kiln_tests::conformance::bits;
use kiln_tests::programs::{cases, instr, make_inputs, run, Instr};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use std::sync::Arc;

/// Every value of the graph evaluated op by op into buffers of its own: the
/// functional oracle.
fn functional(exe: &Executable, inputs: &[Arc<HostData>], shapes: &[Vec<usize>]) -> Vec<HostData> {
    let graph = exe.graph();
    let mut values: Vec<HostData> = Vec::with_capacity(graph.nodes.len());
    for node in &graph.nodes {
        let value = match &node.kind {
            ValueKind::Input(i) => (*inputs[*i]).clone(),
            ValueKind::Constant(literal) => (*literal.0).clone(),
            ValueKind::Op(op) => {
                let operands: Vec<&HostData> = node.inputs.iter().map(|&j| &values[j]).collect();
                let operand_shapes: Vec<&[usize]> =
                    node.inputs.iter().map(|&j| shapes[j].as_slice()).collect();
                op.eval(&operands, &operand_shapes, &shapes[values.len()])
                    .expect("functional evaluation")
            }
        };
        values.push(value);
    }
    graph.outputs.iter().map(|&o| values[o].clone()).collect()
}

/// One configuration of a case.
#[derive(Clone, Copy, Debug)]
struct Setup {
    fuse: bool,
    shapeless: bool,
    /// Bit `i` donates argument leaf `i`.
    donated: u8,
    n: usize,
    dtype: DType,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        any::<bool>(),
        any::<bool>(),
        0u8..16,
        prop::sample::select(vec![1usize, 3, 6]),
        prop::sample::select(vec![DType::F32, DType::F32, DType::F16]),
    )
        .prop_map(|(fuse, shapeless, donated, n, dtype)| Setup {
            fuse,
            shapeless,
            donated,
            n,
            dtype,
        })
}

type Program = Arc<Vec<Instr>>;

fn compiled(
    program: &Program,
    setup: Setup,
) -> kiln::Compiled<Vec<Array>, Vec<Array>, impl Fn(Vec<Array>) -> Vec<Array>> {
    let p = program.clone();
    let donated: Vec<String> = (0..4)
        .filter(|i| setup.donated & (1 << i) != 0)
        .map(|i| format!("args[{i}]"))
        .collect();
    let f = compile(move |xs: Vec<Array>| run(&p, xs))
        .fusion(setup.fuse)
        .donate(donated);
    if setup.shapeless {
        f.shapeless()
    } else {
        f
    }
}

/// The executable, the argument data (fresh buffers nobody else holds, so
/// donated ones are really written) and every value's shape.
fn prepare(
    program: &Program,
    setup: Setup,
    seed: u64,
) -> (Arc<Executable>, Vec<Arc<HostData>>, Vec<Vec<usize>>) {
    let f = compiled(program, setup);
    let inputs = make_inputs(setup.n, seed, setup.dtype);
    let exe = f.executable(&inputs).expect("compiles");
    let shapes = kiln_tests::value_shapes(&exe, &inputs);
    let data = inputs
        .iter()
        .map(|a| Arc::new((*a.data().expect("input data")).clone()))
        .collect();
    (exe, data, shapes)
}

fn check(program: Vec<Instr>, setup: Setup, seed: u64) -> Result<(), TestCaseError> {
    let program: Program = Arc::new(program);
    let (exe, data, shapes) = prepare(&program, setup, seed);
    let graph = exe.graph();
    if let Err(violation) = exe.plan().verify(graph, &shapes) {
        return Err(TestCaseError::fail(format!(
            "verifier rejects the plan: {violation}"
        )));
    }
    let expected: Vec<_> = functional(&exe, &data, &shapes).iter().map(bits).collect();
    let planned: Vec<_> = CpuBackend
        .run(&exe, data, &shapes)
        .expect("planned run")
        .iter()
        .map(|d| bits(d))
        .collect();
    prop_assert_eq!(planned, expected, "planned != functional for {:?}", setup);

    // A shapeless executable called with other sizes: the same slots,
    // placed again in the arena for these sizes.
    if setup.shapeless {
        let other = make_inputs(setup.n + 2, seed ^ 1, setup.dtype);
        let leaf_shapes: Vec<Vec<usize>> = other
            .iter()
            .map(|a| a.shape().as_known().expect("known"))
            .collect();
        let refs: Vec<&[usize]> = leaf_shapes.iter().map(Vec::as_slice).collect();
        if let Ok(shapes) = exe.resolve_shapes(&refs) {
            if let Err(violation) = exe.plan().verify(graph, &shapes) {
                return Err(TestCaseError::fail(format!(
                    "verifier rejects the plan at other sizes: {violation}"
                )));
            }
            let data: Vec<Arc<HostData>> = other
                .iter()
                .map(|a| Arc::new((*a.data().expect("input data")).clone()))
                .collect();
            let expected: Vec<_> = functional(&exe, &data, &shapes).iter().map(bits).collect();
            let planned: Vec<_> = CpuBackend
                .run(&exe, data, &shapes)
                .expect("planned run at other sizes")
                .iter()
                .map(|d| bits(d))
                .collect();
            prop_assert_eq!(planned, expected, "planned != functional at other sizes");
        }
    }

    // Through the API with borrowed (so shared) donated arguments: same
    // answer, and the caller's arrays are left intact.
    let f = compiled(&program, setup);
    let inputs = make_inputs(setup.n, seed, setup.dtype);
    let before: Vec<_> = inputs
        .iter()
        .map(|a| bits(&a.data().expect("data")))
        .collect();
    let eager: Vec<_> = run(&program, inputs.clone())
        .iter()
        .map(|a| bits(&a.data().expect("eager")))
        .collect();
    let got: Vec<_> = f
        .call(&inputs)
        .expect("call")
        .iter()
        .map(|a| bits(&a.data().expect("result")))
        .collect();
    if setup.fuse {
        prop_assert_eq!(got, eager, "compiled != eager for {:?}", setup);
    }
    let after: Vec<_> = inputs
        .iter()
        .map(|a| bits(&a.data().expect("data")))
        .collect();
    prop_assert_eq!(before, after, "a borrowed donated argument was modified");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(2000)))]

    #[test]
    fn planned_reinplaced_execution_equals_functional_execution(
        program in prop::collection::vec(instr(), 1..16),
        setup in setup(),
        seed in any::<u64>(),
    ) {
        check(program, setup, seed)?;
    }
}

/// The ways a plan is corrupted in the mutation test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Corruption {
    SlotTooSmall,
    OverwriteLiveValue,
    ReadAfterOverwrite,
    UndonatedInputWritten,
    NonElementwiseInPlace,
    SharedArenaBytes,
}

/// A plan's homes, slot sizes and donations after one corruption.
type Corrupted = (Corruption, Vec<Home>, Arena, Vec<bool>);

/// Every corruption that applies to this plan.
fn corruptions(exe: &Executable, shapes: &[Vec<usize>]) -> Vec<Corrupted> {
    let graph = exe.graph();
    let plan = exe.plan();
    let homes = plan.homes().to_vec();
    let arena = plan.arena(graph, shapes, DType::size_bytes);
    let slot_bytes = arena.bytes.clone();
    let with_sizes = |sizes: Vec<usize>| Arena {
        bytes: sizes,
        ..arena.clone()
    };
    let donated = plan.donated().to_vec();
    let n = graph.nodes.len();
    let bytes =
        |v: usize| shapes[v].iter().product::<usize>() * graph.nodes[v].aval.dtype.size_bytes();
    // The step of each value's last read (n for outputs).
    let last_read = |v: usize| plan.lifetime(v).last;
    let mut out = Vec::new();
    // A slot one byte smaller than its largest value.
    if let Some((v, s)) = (0..n)
        .filter_map(|v| match homes[v] {
            Home::Slot(s) if bytes(v) > 0 => Some((v, s)),
            _ => None,
        })
        .max_by_key(|&(v, _)| bytes(v))
    {
        let mut sizes = slot_bytes.clone();
        sizes[s] = bytes(v) - 1;
        out.push((
            Corruption::SlotTooSmall,
            homes.clone(),
            with_sizes(sizes),
            donated.clone(),
        ));
    }
    // Value `v` moved from slot `s` into slot `t`, grown to hold it.
    let moved_to_slot = |corruption: Corruption, v: usize, s: usize, t: usize| {
        let mut moved = homes.clone();
        moved[v] = Home::Slot(t);
        let mut sizes = slot_bytes.clone();
        sizes[t] = sizes[t].max(sizes[s]);
        (corruption, moved, with_sizes(sizes), donated.clone())
    };
    // A value written into a slot while the slot's value is still needed.
    'live: for v in 0..n {
        let Home::Slot(s) = homes[v] else { continue };
        for (u, home) in homes.iter().enumerate().take(v) {
            if let Home::Slot(t) = *home {
                if t != s && last_read(u) > v {
                    out.push(moved_to_slot(Corruption::OverwriteLiveValue, v, s, t));
                    break 'live;
                }
            }
        }
    }
    // A value moved to the slot of a later value defined before its last
    // read (the slot's value at its own step is not one it reads, so the
    // write itself is not an in-place one).
    let holder_at = |t: usize, step: usize| (0..step).rev().find(|&w| homes[w] == Home::Slot(t));
    'read: for v in 0..n {
        let Home::Slot(s) = homes[v] else { continue };
        for (u, home) in homes.iter().enumerate().take(last_read(v)).skip(v + 1) {
            if let Home::Slot(t) = *home {
                let quiet = holder_at(t, v).is_none_or(|w| !graph.nodes[v].inputs.contains(&w));
                if t != s && quiet && !graph.nodes[u].inputs.contains(&v) {
                    out.push(moved_to_slot(Corruption::ReadAfterOverwrite, v, s, t));
                    break 'read;
                }
            }
        }
    }
    // A computed value written into an argument that was not donated.
    if let Some(i) = donated.iter().position(|d| !d) {
        if let Some(v) = (0..n).find(|&v| matches!(graph.nodes[v].kind, ValueKind::Op(_))) {
            let mut moved = homes.clone();
            moved[v] = Home::Input(i);
            out.push((
                Corruption::UndonatedInputWritten,
                moved,
                arena.clone(),
                donated.clone(),
            ));
        }
    }
    // A reduction or matmul written over the operand it consumes last.
    'ew: for (v, node) in graph.nodes.iter().enumerate() {
        let ValueKind::Op(op) = &node.kind else {
            continue;
        };
        if op.is_elementwise() {
            continue;
        }
        for &u in &node.inputs {
            if let Home::Slot(s) = homes[u] {
                if last_read(u) == v {
                    let mut moved = homes.clone();
                    moved[v] = Home::Slot(s);
                    let mut sizes = slot_bytes.clone();
                    sizes[s] = sizes[s].max(bytes(v));
                    out.push((
                        Corruption::NonElementwiseInPlace,
                        moved,
                        with_sizes(sizes),
                        donated.clone(),
                    ));
                    break 'ew;
                }
            }
        }
    }
    // Two slots busy at a common step moved onto the same arena bytes.
    let coexist = |s: usize, t: usize| {
        plan.slot_busy(s)
            .iter()
            .any(|a| plan.slot_busy(t).iter().any(|b| a.overlaps(b)))
    };
    let slots = arena.offsets.len();
    if let Some((s, t)) = (0..slots)
        .flat_map(|s| (0..slots).map(move |t| (s, t)))
        .find(|&(s, t)| s != t && arena.bytes[s] > 0 && arena.bytes[t] > 0 && coexist(s, t))
    {
        let mut moved = arena.clone();
        moved.offsets[s] = moved.offsets[t];
        out.push((
            Corruption::SharedArenaBytes,
            homes.clone(),
            moved,
            donated.clone(),
        ));
    }
    out
}

#[test]
fn verifier_rejects_every_kind_of_corrupted_plan() {
    let mut runner = TestRunner::deterministic();
    let programs = prop::collection::vec(instr(), 2..16);
    let mut applied: std::collections::HashMap<Corruption, usize> = Default::default();
    for case in 0..cases(2000).min(300) {
        let program: Program = Arc::new(programs.new_tree(&mut runner).expect("program").current());
        let setup = Setup {
            fuse: case % 2 == 0,
            shapeless: case % 3 == 0,
            donated: (case % 16) as u8,
            n: 3,
            dtype: DType::F32,
        };
        let (exe, _, shapes) = prepare(&program, setup, case as u64);
        for (kind, homes, sizes, donated) in corruptions(&exe, &shapes) {
            let verdict = verify_plan(exe.graph(), &homes, &sizes, &donated, &shapes);
            let expected = matches!(
                (kind, &verdict),
                (
                    Corruption::SlotTooSmall,
                    Err(PlanViolation::SlotTooSmall { .. })
                ) | (
                    Corruption::OverwriteLiveValue | Corruption::ReadAfterOverwrite,
                    Err(PlanViolation::ReadAfterOverwrite { .. })
                ) | (
                    Corruption::UndonatedInputWritten,
                    Err(PlanViolation::UndonatedInputWritten { .. })
                ) | (
                    Corruption::NonElementwiseInPlace,
                    Err(PlanViolation::InvalidInPlace { .. })
                ) | (
                    Corruption::SharedArenaBytes,
                    Err(PlanViolation::SharedBytes { .. })
                )
            );
            assert!(
                expected,
                "{kind:?} gave {verdict:?} for {program:?} with {setup:?}"
            );
            *applied.entry(kind).or_default() += 1;
        }
    }
    for kind in [
        Corruption::SlotTooSmall,
        Corruption::OverwriteLiveValue,
        Corruption::ReadAfterOverwrite,
        Corruption::UndonatedInputWritten,
        Corruption::NonElementwiseInPlace,
        Corruption::SharedArenaBytes,
    ] {
        assert!(
            applied.get(&kind).copied().unwrap_or(0) > 0,
            "{kind:?} was never applied"
        );
    }
}
