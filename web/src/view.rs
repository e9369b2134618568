//! View models: a [`Report`] arranged the way each view draws it. They
//! only rearrange Kiln's data (rows, bars, layers); every fact — decisions,
//! reasons, lifetimes, byte counts — is Kiln's own.

use crate::report::{CallClock, CallTiming, PreviousRun};
use kiln::report::{BodyReport, LoopReport, PlanReport, ReportNode};
use kiln::{CacheInfo, KernelList, Refusal, Report, ReportDiff};
use serde::{Deserialize, Serialize};

/// One row of the reinplace view: a verdict on one operand of one
/// elementwise node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReinplaceRow {
    /// The elementwise node.
    pub node: usize,
    /// Its op.
    pub op: String,
    /// The operand judged.
    pub operand: usize,
    /// The operand's op.
    pub operand_op: String,
    /// `taken`, or Kiln's reason for refusing.
    pub verdict: String,
    /// For a `ReadLater` refusal, the node that reads the operand later.
    pub reader: Option<usize>,
}

/// Every reinplace verdict of `report`, in schedule order.
pub fn reinplace_rows(report: &Report) -> Vec<ReinplaceRow> {
    let op_of = |id: usize| {
        report
            .nodes
            .get(id)
            .map_or_else(|| format!("%{id}"), |n| n.op.clone())
    };
    report
        .nodes
        .iter()
        .filter_map(|n| n.reinplace.as_ref().map(|d| (n, d)))
        .flat_map(|(n, d)| {
            d.operands.iter().map(move |v| ReinplaceRow {
                node: n.id,
                op: n.op.clone(),
                operand: v.operand,
                operand_op: op_of(v.operand),
                verdict: match &v.refusal {
                    None => "taken".to_string(),
                    Some(r) => r.to_string(),
                },
                reader: match v.refusal {
                    Some(Refusal::ReadLater { reader }) => Some(reader),
                    _ => None,
                },
            })
        })
        .collect()
}

/// The memory view: one row per slot, bars for the values it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeline {
    /// Schedule steps (the x axis runs from 0 to this).
    pub steps: usize,
    /// One row per slot.
    pub rows: Vec<TimelineRow>,
    /// The arena's bytes.
    pub peak_bytes: usize,
    /// The most bytes live at any step.
    pub lower_bound_bytes: usize,
    /// Bytes without any reuse.
    pub no_reuse_bytes: usize,
}

/// One slot of the timeline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineRow {
    /// The slot.
    pub slot: usize,
    /// Its bytes.
    pub bytes: usize,
    /// Its values, in schedule order.
    pub bars: Vec<TimelineBar>,
}

/// One value's lifetime in its slot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineBar {
    /// The value.
    pub value: usize,
    /// Its op.
    pub op: String,
    /// Its shape and dtype.
    pub aval: String,
    /// The step defining it.
    pub def: usize,
    /// The last step reading it.
    pub last: usize,
    /// Whether it was written in place of the slot's previous value (an
    /// in-place chain continues).
    pub in_place: bool,
}

/// The slot timeline of `report`'s plan.
pub fn timeline(report: &Report) -> Timeline {
    plan_timeline(&report.plan, &report.nodes)
}

/// A loop body's own slot timeline: one plan reused by every iteration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BodyTimeline {
    /// `scan %5 · body · 1000 iterations`.
    pub title: String,
    /// The control node whose body it is (in the graph holding the loop:
    /// the entry's for a top-level loop).
    pub loop_node: usize,
    /// True for a loop of the entry's own graph (not inside a body).
    pub top_level: bool,
    /// Its slots over the body's schedule.
    pub timeline: Timeline,
    /// How each carry moves between iterations: `carry[0] f32[64,16]:
    /// updated in place by %5 dynamic_update_slice`.
    pub carried: Vec<String>,
}

/// The timeline of every body and branch of `report`'s control-flow nodes,
/// loops inside bodies after their enclosing body.
pub fn body_timelines(report: &Report) -> Vec<BodyTimeline> {
    fn walk(loops: &[LoopReport], top_level: bool, out: &mut Vec<BodyTimeline>) {
        for lp in loops {
            for body in &lp.bodies {
                out.push(BodyTimeline {
                    title: crate::graph::loop_body_title(lp, body),
                    loop_node: lp.node,
                    top_level,
                    timeline: plan_timeline(&body.plan, &body.nodes),
                    carried: carried_lines(body),
                });
                walk(&body.loops, false, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&report.loops, true, &mut out);
    out
}

fn carried_lines(body: &BodyReport) -> Vec<String> {
    body.carried
        .iter()
        .map(|c| format!("carry[{}] {}: {}", c.carry, c.aval, c.detail))
        .collect()
}

/// The timeline of `plan` over a graph of `nodes`.
fn plan_timeline(plan: &PlanReport, nodes: &[ReportNode]) -> Timeline {
    let rows = plan
        .slots
        .iter()
        .map(|slot| TimelineRow {
            slot: slot.slot,
            bytes: slot.bytes,
            bars: slot
                .values
                .iter()
                .map(|v| {
                    let node = nodes.iter().find(|n| n.id == v.value);
                    TimelineBar {
                        value: v.value,
                        op: node.map(|n| n.op.clone()).unwrap_or_default(),
                        aval: node.map(|n| n.aval.clone()).unwrap_or_default(),
                        def: v.def,
                        last: v.last,
                        in_place: node
                            .and_then(|n| n.reinplace.as_ref())
                            .is_some_and(|d| d.target().is_some()),
                    }
                })
                .collect(),
        })
        .collect();
    Timeline {
        steps: nodes.len(),
        rows,
        peak_bytes: plan.memory.peak_bytes,
        lower_bound_bytes: plan.memory.lower_bound_bytes,
        no_reuse_bytes: plan.memory.no_reuse_bytes,
    }
}

impl TimelineBar {
    /// The bar's tooltip: `%5 exp · f32[64,64] · steps 3–7 · slot 2 of 16
    /// KiB`, with `, in place` when it continues its operand's slot. The
    /// size is the slot's, as the plan gives it.
    pub fn tooltip(&self, slot: usize, slot_bytes: usize) -> String {
        let in_place = if self.in_place { ", in place" } else { "" };
        format!(
            "%{} {} · {} · steps {}–{} · slot {slot} of {}{in_place}",
            self.value,
            self.op,
            self.aval,
            self.def,
            self.last,
            human_bytes(slot_bytes)
        )
    }
}

impl Timeline {
    /// The steps the axis labels: 0, the last step, and round steps
    /// between, at most about `most` of them, so a long schedule keeps a
    /// readable axis.
    pub fn axis_ticks(&self, most: usize) -> Vec<usize> {
        let last = self.steps.saturating_sub(1);
        let wanted = last / most.max(1) + 1;
        // The first of 1, 2, 5, 10, 20, 50, … at least `wanted` (a
        // saturated base is at least anything, so the loop ends).
        let mut base = 1usize;
        let stride = loop {
            let candidates = [base, base.saturating_mul(2), base.saturating_mul(5)];
            if let Some(&stride) = candidates.iter().find(|&&s| s >= wanted) {
                break stride;
            }
            base = base.saturating_mul(10);
        };
        let mut ticks: Vec<usize> = (0..=last).step_by(stride).collect();
        if ticks.last() != Some(&last) {
            // A round tick too close to the last step would overlap it.
            if ticks.len() > 1 && last - ticks[ticks.len() - 1] < stride / 2 {
                ticks.pop();
            }
            ticks.push(last);
        }
        ticks
    }
}

/// Bytes for people: `512 B`, `16 KiB`, `1.5 MiB`, `2 GiB` (one decimal
/// where it is not whole).
pub fn human_bytes(bytes: usize) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let rounded = (value * 10.0).round() / 10.0;
    if rounded.fract() == 0.0 {
        format!("{rounded:.0} {}", UNITS[unit])
    } else {
        format!("{rounded:.1} {}", UNITS[unit])
    }
}

/// A function's calls in one line, however many there are: `200 calls:
/// 1 traced, 199 cached · first 3.1 ms (traced) · last 0.05 ms (cached)`.
/// The page shows every call only when asked (a script calling a function
/// in a loop would otherwise push every view down by a line per call).
pub fn calls_summary(calls: &[CallTiming], clock: CallClock) -> String {
    let describe = |c: &CallTiming| call_time(c, clock);
    let traced = calls.iter().filter(|c| c.traced).count();
    let counts = format!(
        "{} call{}: {traced} traced, {} cached",
        calls.len(),
        if calls.len() == 1 { "" } else { "s" },
        calls.len() - traced
    );
    match calls {
        [] => "no calls".to_string(),
        [only] => format!("{counts} · {}", describe(only)),
        [first, .., last] => format!(
            "{counts} · first {} · last {}",
            describe(first),
            describe(last)
        ),
    }
}

/// A call's time as the calls list prints it: `4.57 ms (traced)` on the
/// CPU; on a GPU, which returns once the work is submitted, `4.57 ms
/// submit · 0.31 ms GPU (cached)` with timestamps, else `4.57 ms submit
/// time (cached)`.
pub fn call_time(call: &CallTiming, clock: CallClock) -> String {
    let kind = if call.traced { "traced" } else { "cached" };
    let ms = round_ms(call.ms);
    match (clock, call.device_ms) {
        (CallClock::Wall, _) => format!("{ms} ms ({kind})"),
        (CallClock::GpuTimestamps, Some(gpu)) => {
            format!("{ms} ms submit · {} GPU ({kind})", duration(gpu))
        }
        _ => format!("{ms} ms submit time ({kind})"),
    }
}

/// A measured duration in the unit that suits it: `850 ns`, `12.5 µs`,
/// `3.25 ms`.
pub fn duration(ms: f64) -> String {
    if ms >= 1.0 {
        format!("{} ms", round_ms(ms))
    } else if ms >= 1e-3 {
        format!("{} µs", (ms * 1e4).round() / 10.0)
    } else {
        format!("{} ns", (ms * 1e6).round())
    }
}

/// A step's mean time as the kernels view prints it: `< 5 µs` where it is
/// under `resolution_ms` (the clock's tick over the runs timed), where a
/// figure would only be the clock's rounding.
///
/// ```
/// use kiln_web::view::step_time;
/// assert_eq!(step_time(0.0, 0.005), "< 5 µs");
/// assert_eq!(step_time(0.012, 0.005), "12 µs");
/// ```
pub fn step_time(ms: f64, resolution_ms: f64) -> String {
    if ms < resolution_ms {
        format!("< {}", duration(resolution_ms))
    } else {
        duration(ms)
    }
}

/// Milliseconds to two decimals, as the page prints times.
pub fn round_ms(ms: f64) -> f64 {
    (ms * 100.0).round() / 100.0
}

/// The cache view's lines for each miss: `call 3: static/aux differs at
/// node args[0]: before {act: "relu"}, now {act: "tanh"}`.
pub fn miss_lines(cache: &CacheInfo) -> Vec<String> {
    cache
        .miss_log
        .iter()
        .map(|miss| {
            let reasons: Vec<String> = miss.reasons.iter().map(|r| r.to_string()).collect();
            format!("call {}: {}", miss.call, reasons.join("; "))
        })
        .collect()
}

/// A cache entry's argument leaves as the cache keys them: `args[0].w:
/// f32[2,2]` (symbolic dims as symbols for a shapeless entry), in leaf
/// order, then where each symbol comes from.
pub fn entry_leaves(report: &Report) -> Vec<String> {
    // The trace meets the inputs in the order the function reads them.
    let mut leaves: Vec<(&str, &str)> = report
        .traced
        .iter()
        .filter_map(|t| Some((t.op.strip_prefix("input ")?, t.aval.as_str())))
        .collect();
    leaves.sort_by_key(|(path, _)| path_order(path));
    leaves
        .into_iter()
        .map(|(path, aval)| format!("{path}: {aval}"))
        .chain(report.symbols.iter().cloned())
        .collect()
}

/// A tree path's sort key: its text with every run of digits read as a
/// number, so `args[2]` comes before `args[10]`.
fn path_order(path: &str) -> Vec<(String, u64)> {
    let mut key = Vec::new();
    let mut text = String::new();
    let mut chars = path.chars().peekable();
    while let Some(c) = chars.next() {
        if let Some(digit) = c.to_digit(10) {
            let mut number = u64::from(digit);
            while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                number = number.saturating_mul(10).saturating_add(u64::from(d));
                chars.next();
            }
            key.push((std::mem::take(&mut text), number));
        } else {
            text.push(c);
        }
    }
    key.push((text, 0));
    key
}

/// One row of the kernels view: a step of the entry's [`KernelList`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelRow {
    /// Its index in the list.
    pub index: usize,
    /// `dispatch`, `copy`, `clear` or `evaluate`.
    pub kind: &'static str,
    /// The op it computes.
    pub op: String,
    /// The graph values it serves: `%5`, `%5 %6`, or empty.
    pub nodes: String,
    /// `grid 4×1×1` for a dispatch, the bytes moved for a copy or clear,
    /// empty for a CPU step.
    pub extent: String,
}

/// The kernels view's rows: every step of `list`, in order.
pub fn kernel_rows(list: &KernelList) -> Vec<KernelRow> {
    list.steps
        .iter()
        .enumerate()
        .map(|(index, step)| KernelRow {
            index,
            kind: step.kind.name(),
            op: step.op.clone(),
            nodes: node_ids(&step.nodes),
            extent: match (step.grid, step.kind) {
                (Some([x, y, z]), _) => format!("grid {x}×{y}×{z}"),
                (None, kiln::StepKind::Copy | kiln::StepKind::Clear) => step
                    .bindings
                    .first()
                    .map(|b| human_bytes(b.bytes as usize))
                    .unwrap_or_default(),
                (None, _) => String::new(),
            },
        })
        .collect()
}

/// `%5 %6`: node ids as the graph labels them.
pub fn node_ids(nodes: &[usize]) -> String {
    nodes
        .iter()
        .map(|n| format!("%{n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What the kernels view says of a list: `12 steps on cpu: 12 evaluate`,
/// `9 steps on wgpu:…: 7 dispatch, 2 copy · arena 1.5 KiB`.
pub fn kernels_summary(list: &KernelList) -> String {
    let mut counts: Vec<(&'static str, usize)> = Vec::new();
    for step in &list.steps {
        match counts.iter_mut().find(|(k, _)| *k == step.kind.name()) {
            Some((_, n)) => *n += 1,
            None => counts.push((step.kind.name(), 1)),
        }
    }
    let kinds: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let mut text = format!(
        "{} steps on {}: {}",
        list.steps.len(),
        list.backend,
        kinds.join(", ")
    );
    if let Some(bytes) = list.arena_bytes {
        text.push_str(&format!(" · arena {}", human_bytes(bytes as usize)));
    }
    text
}

/// The diff view's lines: `%4 tanh f32[4]` per node added (in the later
/// report) or removed (in the earlier), `%3 → %3: aval f32[2] → f32[4]`
/// per node changed, and the peak bytes before and after.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffLines {
    /// Nodes only the later report has.
    pub added: Vec<String>,
    /// Nodes only the earlier report has.
    pub removed: Vec<String>,
    /// Nodes both have that differ, with what differs.
    pub changed: Vec<String>,
    /// `peak 512 B → 1 KiB (+512 B)`.
    pub peak: String,
}

/// `diff` (from `before` to `after`, as [`Report::diff`] gives it) as
/// lines.
pub fn diff_lines(before: &Report, after: &Report, diff: &ReportDiff) -> DiffLines {
    let node = |report: &Report, id: usize| {
        report.nodes.get(id).map_or_else(
            || format!("%{id}"),
            |n| format!("%{id} {} {}", n.op, n.aval),
        )
    };
    let change = diff.peak_after as i64 - diff.peak_before as i64;
    let sign = if change < 0 { "-" } else { "+" };
    DiffLines {
        added: diff.added.iter().map(|&id| node(after, id)).collect(),
        removed: diff.removed.iter().map(|&id| node(before, id)).collect(),
        changed: diff
            .changed
            .iter()
            .map(|c| format!("%{} → %{}: {}", c.before, c.after, c.what.join("; ")))
            .collect(),
        peak: format!(
            "peak {} → {} ({sign}{})",
            human_bytes(diff.peak_before),
            human_bytes(diff.peak_after),
            human_bytes(change.unsigned_abs() as usize)
        ),
    }
}

/// The cache-key lines of the diff of entry `shown` against `previous`,
/// the same function as the previous run left it: a changed function text
/// first, then what differs between the two keys.
pub fn previous_key_lines(previous: &PreviousRun, shown: usize) -> Vec<String> {
    let mut lines = Vec::new();
    if previous.source_changed {
        lines.push(format!(
            "the function's text or options changed since the previous run (compile at line {})",
            previous.line
        ));
    }
    if let Some(key) = previous.key_diffs.iter().find(|k| k.after == shown) {
        lines.extend(key.reasons.iter().map(ToString::to_string));
    }
    if lines.is_empty() {
        lines.push(if previous.report.entry == shown {
            "the same entry as the previous run: nothing changed".to_string()
        } else {
            "the same key (another trace of it)".to_string()
        });
    }
    lines
}

/// Which compiled function's which cache entry a view shows: a selection
/// holds in the views of that entry only (node ids of other entries name
/// other nodes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EntryScope {
    /// The script line of the function's `compile`.
    pub line: usize,
    /// The cache entry.
    pub entry: usize,
}

/// What is selected in one entry's views. Every view highlights its part
/// of it: the graph the boxes, the reinplace table the rows, the memory
/// timeline the bars and the slot row, the kernels view the kernel rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Selection {
    /// A node, that is the value it computes.
    Node(usize),
    /// A slot, with every value it holds.
    Slot(usize),
    /// A step of the entry's kernel list, with the values it serves.
    Kernel(usize),
}

impl Selection {
    /// The nodes highlighted: the node, the values the slot holds, or the
    /// values the kernel serves (a fused kernel's one node stands for all
    /// its members).
    pub fn nodes(self, report: &Report, kernels: Option<&KernelList>) -> Vec<usize> {
        match self {
            Selection::Node(node) => vec![node],
            Selection::Slot(slot) => report
                .plan
                .slots
                .iter()
                .filter(|s| s.slot == slot)
                .flat_map(|s| s.values.iter().map(|v| v.value))
                .collect(),
            Selection::Kernel(k) => kernels
                .and_then(|list| list.steps.get(k))
                .map(|step| step.nodes.clone())
                .unwrap_or_default(),
        }
    }

    /// The slot row highlighted: the slot, or the one holding the node's
    /// (or the kernel's first) value (none for a value outside the plan,
    /// such as an argument).
    pub fn slot(self, report: &Report, kernels: Option<&KernelList>) -> Option<usize> {
        let node = match self {
            Selection::Slot(slot) => return Some(slot),
            Selection::Node(node) => node,
            Selection::Kernel(_) => *self.nodes(report, kernels).first()?,
        };
        report
            .plan
            .slots
            .iter()
            .find(|s| s.values.iter().any(|v| v.value == node))
            .map(|s| s.slot)
    }

    /// The kernel steps highlighted: the kernel, or every step serving a
    /// highlighted node.
    pub fn kernels(self, report: &Report, kernels: Option<&KernelList>) -> Vec<usize> {
        let Some(list) = kernels else {
            return Vec::new();
        };
        if let Selection::Kernel(k) = self {
            return vec![k];
        }
        let nodes = self.nodes(report, kernels);
        (0..list.steps.len())
            .filter(|&k| list.steps[k].nodes.iter().any(|n| nodes.contains(n)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::examples::{MLP, READ_LATER};
    use crate::script::Session;

    fn first_report(script: &str) -> Report {
        let run = Session::new().run(script);
        assert_eq!(run.error, None);
        (*run.functions[0].cache.reports[0]).clone()
    }

    #[test]
    fn reinplace_rows_link_a_read_later_refusal_to_its_reader() {
        let report = first_report(READ_LATER.script);
        let rows = reinplace_rows(&report);
        let refused: Vec<&ReinplaceRow> = rows.iter().filter(|r| r.reader.is_some()).collect();
        assert_eq!(refused.len(), 1, "{rows:?}");
        let row = refused[0];
        let reader = row.reader.unwrap_or_default();
        assert_eq!((row.op.as_str(), row.operand_op.as_str()), ("add", "exp"));
        assert_eq!(row.verdict, format!("read later by %{reader}"));
        assert_eq!(report.nodes[reader].op, "add");
    }

    #[test]
    fn the_timeline_has_a_row_per_slot_and_the_plans_figures() {
        let report = first_report(MLP.script);
        let t = timeline(&report);
        assert_eq!(t.rows.len(), report.plan.slots.len());
        assert_eq!(t.peak_bytes, t.lower_bound_bytes);
        let bars: usize = t.rows.iter().map(|r| r.bars.len()).sum();
        let planned: usize = report.plan.slots.iter().map(|s| s.values.len()).sum();
        assert_eq!(bars, planned);
        assert!(t
            .rows
            .iter()
            .flat_map(|r| &r.bars)
            .all(|b| b.def <= b.last && b.last <= t.steps));
    }

    #[test]
    fn every_loop_body_has_a_timeline_of_its_own_plan_and_its_carries() {
        let report = first_report(
            "let f = compile(|x| fori_loop(0, 3, |i, c| while_loop(|v| v.sum() < 40.0, |v| (v * 2.0).exp().log(), c), x));\nf.run(ones([2]))",
        );
        let bodies = body_timelines(&report);
        let titles: Vec<&str> = bodies.iter().map(|b| b.title.as_str()).collect();
        let scan = report.loops[0].node;
        assert_eq!(titles[0], format!("scan %{scan} · body · 3 iterations"));
        assert!(
            titles[1].starts_with("while_loop %") && titles[1].ends_with("cond"),
            "{titles:?}"
        );
        assert!(titles[2].ends_with("body"), "{titles:?}");
        assert_eq!(
            bodies.iter().map(|b| b.top_level).collect::<Vec<_>>(),
            [true, false, false]
        );
        let inner = &bodies[2];
        let body = &report.loops[0].bodies[0].loops[0].bodies[1];
        assert_eq!(inner.timeline.steps, body.nodes.len());
        assert_eq!(inner.timeline.peak_bytes, body.plan.memory.peak_bytes);
        let bars: usize = inner.timeline.rows.iter().map(|r| r.bars.len()).sum();
        let planned: usize = body.plan.slots.iter().map(|s| s.values.len()).sum();
        assert_eq!(bars, planned);
        assert!(inner
            .timeline
            .rows
            .iter()
            .flat_map(|r| &r.bars)
            .all(|b| !b.op.is_empty()));
        assert_eq!(inner.carried.len(), 1);
        assert!(
            inner.carried[0].starts_with("carry[0] f32[2]: "),
            "{:?}",
            inner.carried
        );
    }

    #[test]
    fn selecting_a_slot_selects_every_value_it_holds_and_back() {
        let report = first_report(MLP.script);
        let shared = report
            .plan
            .slots
            .iter()
            .find(|s| s.values.len() > 1)
            .expect("the MLP reuses a slot");
        let values: Vec<usize> = shared.values.iter().map(|v| v.value).collect();
        let slot = Selection::Slot(shared.slot);
        assert_eq!(slot.nodes(&report, None), values);
        assert_eq!(slot.slot(&report, None), Some(shared.slot));
        for &value in &values {
            let node = Selection::Node(value);
            assert_eq!(node.nodes(&report, None), vec![value]);
            assert_eq!(node.slot(&report, None), Some(shared.slot), "%{value}");
        }
        assert_eq!(
            Selection::Slot(usize::MAX).nodes(&report, None),
            Vec::<usize>::new()
        );
    }

    #[test]
    fn entry_leaves_give_each_leafs_path_and_aval() {
        let report =
            first_report("let f = compile(|p, x| p.w * x); f.run(#{ w: ones([2, 3]) }, ones([3]))");
        assert_eq!(
            entry_leaves(&report),
            vec![
                r#"args[0]["w"]: f32[2,3]"#.to_string(),
                "args[1]: f32[3]".to_string()
            ]
        );
        let shapeless =
            first_report("let f = compile(|x| x.exp()).shapeless(); f.run(ones([5, 3]))");
        let leaves = entry_leaves(&shapeless);
        assert_eq!(leaves.len(), 1 + shapeless.symbols.len(), "{leaves:?}");
        assert!(leaves[0].starts_with("args[0]: f32[s"), "{leaves:?}");
    }

    #[test]
    fn a_bars_tooltip_names_value_op_aval_and_size() {
        let report = first_report(MLP.script);
        let t = timeline(&report);
        let row = &t.rows[0];
        let bar = &row.bars[0];
        let tip = bar.tooltip(row.slot, row.bytes);
        let node = &report.nodes[bar.value];
        assert!(
            tip.starts_with(&format!(
                "%{} {} · {} · steps ",
                node.id, node.op, node.aval
            )),
            "{tip}"
        );
        assert!(tip.contains(&human_bytes(row.bytes)), "{tip}");
    }

    #[test]
    fn kernel_rows_follow_the_cpu_executors_schedule_and_link_each_node() {
        let mut session = Session::new();
        let report = session.run(MLP.script);
        let function = &report.functions[0];
        let entry = function.cache.reports.len() - 1;
        let kernels = &function.kernels[entry];
        assert_eq!(kernels.entry, function.cache.reports[entry].entry);
        let list = kernels.list.as_ref().expect("the CPU lists its steps");
        let rows = kernel_rows(list);
        let ops = function.cache.reports[entry]
            .nodes
            .iter()
            .filter(|n| !n.op.starts_with("input ") && n.op != "constant")
            .count();
        assert_eq!(rows.len(), ops, "one step per op node");
        assert!(rows
            .iter()
            .all(|r| r.kind == "evaluate" && r.nodes.starts_with('%')));
        assert!(
            kernels_summary(list).starts_with(&format!("{} steps on cpu: {} evaluate", ops, ops))
        );
        // A fused node's step selects the node every member box carries.
        let fused = list
            .steps
            .iter()
            .position(|s| s.op.starts_with("fused"))
            .expect("the MLP fuses its elementwise tail");
        let node = list.steps[fused].nodes[0];
        let selection = Selection::Kernel(fused);
        let report = &function.cache.reports[entry];
        assert_eq!(selection.nodes(report, Some(list)), vec![node]);
        assert_eq!(
            Selection::Node(node).kernels(report, Some(list)),
            vec![fused]
        );
        assert_eq!(
            selection.slot(report, Some(list)),
            Selection::Node(node).slot(report, None)
        );
    }

    #[test]
    fn a_diff_of_two_entries_names_the_key_the_changed_avals_and_the_peaks() {
        let mut session = Session::new();
        let report = session.run(
            "let f = compile(|x| (x.exp() * 2.0).sum()); f.run(ones([4])); f.run(ones([1024]))",
        );
        let function = &report.functions[0];
        let (before, after) = (&function.cache.reports[0], &function.cache.reports[1]);
        let key = function
            .key_diffs
            .iter()
            .find(|k| k.before == 0 && k.after == 1)
            .expect("the pair is compared");
        assert_eq!(
            key.reasons[0].to_string(),
            "aval differs at leaf args[0]: f32[4] → f32[1024]"
        );
        let lines = diff_lines(before, after, &before.diff(after));
        assert!(
            lines.added.is_empty() && lines.removed.is_empty(),
            "{lines:?}"
        );
        assert!(
            lines
                .changed
                .iter()
                .any(|l| l.ends_with("aval f32[4] → f32[1024]")),
            "{lines:?}"
        );
        let (b, a) = (before.plan.memory.peak_bytes, after.plan.memory.peak_bytes);
        assert!(a > b, "a bigger intermediate: {b} → {a}");
        assert_eq!(
            lines.peak,
            format!(
                "peak {} → {} (+{})",
                human_bytes(b),
                human_bytes(a),
                human_bytes(a - b)
            )
        );
    }

    #[test]
    fn human_bytes_picks_the_unit_and_keeps_one_decimal() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(16 * 1024), "16 KiB");
        assert_eq!(human_bytes(1536 * 1024), "1.5 MiB");
        assert_eq!(human_bytes(3 << 30), "3 GiB");
    }

    #[test]
    fn axis_ticks_are_round_and_end_at_the_last_step() {
        let ticks = |steps| {
            Timeline {
                steps,
                rows: Vec::new(),
                peak_bytes: 0,
                lower_bound_bytes: 0,
                no_reuse_bytes: 0,
            }
            .axis_ticks(10)
        };
        assert_eq!(ticks(5), vec![0, 1, 2, 3, 4]);
        assert_eq!(
            ticks(200),
            vec![0, 20, 40, 60, 80, 100, 120, 140, 160, 180, 199]
        );
        assert_eq!(ticks(42), vec![0, 5, 10, 15, 20, 25, 30, 35, 41]);
        assert_eq!(ticks(1), vec![0]);
    }

    #[test]
    fn calls_are_summarized_by_count_first_and_last() {
        let call = |traced, ms| CallTiming {
            traced,
            ms,
            device_ms: None,
            device_calls: None,
        };
        let mut calls = vec![call(true, 4.56789)];
        calls.extend((0..199).map(|_| call(false, 0.05)));
        assert_eq!(
            calls_summary(&calls, CallClock::Wall),
            "200 calls: 1 traced, 199 cached · first 4.57 ms (traced) · last 0.05 ms (cached)"
        );
        assert_eq!(
            calls_summary(&calls[..1], CallClock::Wall),
            "1 call: 1 traced, 0 cached · 4.57 ms (traced)"
        );
        assert_eq!(calls_summary(&[], CallClock::Wall), "no calls");
    }

    #[test]
    fn a_gpu_calls_time_says_submit_time_and_gives_the_gpu_time_where_measured() {
        let mut call = CallTiming {
            traced: false,
            ms: 6.912,
            device_ms: None,
            device_calls: None,
        };
        assert_eq!(
            call_time(&call, CallClock::SubmitOnly),
            "6.91 ms submit time (cached)"
        );
        assert_eq!(
            call_time(&call, CallClock::GpuTimestamps),
            "6.91 ms submit time (cached)"
        );
        call.device_ms = Some(0.31234);
        assert_eq!(
            call_time(&call, CallClock::GpuTimestamps),
            "6.91 ms submit · 312.3 µs GPU (cached)"
        );
        assert_eq!(duration(6393.0), "6393 ms");
        assert_eq!(duration(0.00085), "850 ns");
    }

    #[test]
    fn device_times_go_to_the_calls_that_made_them_and_to_the_entrys_kernels() {
        use crate::report::DeviceTime;
        let mut report = Session::new()
            .run("let f = compile(|x| x.exp().sum()); f.run(ones([4])); f.run(ones([4]))");
        let function = &mut report.functions[0];
        function.calls[0].device_calls = Some((0, 1));
        function.calls[1].device_calls = Some((1, 3));
        let list = function.kernels[0].list.clone().unwrap();
        let steps = list.steps.len();
        let time = |call, total_ms, runs| DeviceTime {
            call,
            executable: list.executable,
            steps_ms: vec![Some(total_ms); steps],
            total_ms,
            runs,
            tick_ms: 0.1,
            repeat_ms: 0.0,
        };
        report.attach_device_times(&[time(0, 1.0, 1), time(1, 2.0, 2), time(2, 0.5, 1)]);
        let function = &report.functions[0];
        assert_eq!(function.calls[0].device_ms, Some(1.0));
        assert_eq!(function.calls[1].device_ms, Some(2.5));
        // Each step's mean over the four runs, whose tick it resolves to a
        // quarter.
        let kernels = &function.kernels[0];
        assert_eq!(
            kernels.steps_ms,
            vec![Some((1.0 + 2.0 * 2.0 + 0.5) / 4.0); steps]
        );
        assert_eq!(kernels.timed_runs, 4);
        assert_eq!(kernels.resolution_ms, 0.1 / 4.0);
    }

    #[test]
    fn the_previous_run_diff_names_a_changed_function_first() {
        let mut s = Session::new();
        s.run("let f = compile(|x| x.exp()); f.run(ones([2]))");
        let edited = s.run("let f = compile(|x| x.sin()); f.run(ones([3]))");
        let function = &edited.functions[0];
        let previous = function.previous.as_ref().expect("the run before");
        assert_eq!(
            previous_key_lines(previous, 0),
            vec![
                "the function's text or options changed since the previous run (compile at \
                 line 1)"
                    .to_string(),
                "aval differs at leaf args[0]: f32[2] → f32[3]".to_string()
            ]
        );
        let again = s.run("let f = compile(|x| x.sin()); f.run(ones([3]))");
        let previous = again.functions[0]
            .previous
            .as_ref()
            .expect("the run before");
        assert_eq!(
            previous_key_lines(previous, 0),
            vec!["the same entry as the previous run: nothing changed".to_string()]
        );
    }

    #[test]
    fn miss_lines_name_the_call_and_the_difference() {
        let mut s = Session::new();
        let run = s.run("let f = compile(|x| x); f.run(ones([2])); f.run(ones([3]))");
        let lines = miss_lines(&run.functions[0].cache);
        assert_eq!(
            lines,
            vec![
                "call 1: never seen".to_string(),
                "call 2: aval differs at leaf args[0]: f32[2] → f32[3]".to_string()
            ]
        );
    }
}
