//! The graph view's model: a [`Report`]'s optimized graph (fused groups
//! opened into clusters of their member ops, loop bodies on request) or
//! its traced graph before the passes, as boxes and edges for a layout library to place, and the
//! SVG drawn from the placed boxes. Every fact shown — ops, avals, homes,
//! reinplace decisions, group members, script lines — is the report's.

use kiln::report::{BodyReport, GroupArg, LoopReport};
use kiln::{Report, SourceLocation};
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// Which graph the view draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GraphMode {
    /// The graph after the passes, as it runs.
    Optimized,
    /// The graph as traced, before any pass.
    Traced,
}

impl GraphMode {
    /// `optimized` or `traced`.
    pub fn name(self) -> &'static str {
        match self {
            GraphMode::Optimized => "optimized",
            GraphMode::Traced => "traced",
        }
    }
}

/// How a box is coloured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BoxKind {
    /// An elementwise node written in place of an operand.
    Taken,
    /// An elementwise node whose every operand was refused.
    Refused,
    /// A member of a fused group other than its result.
    Member,
    /// A traced node no optimized node computes (simplified away or dead).
    Dropped,
    /// A loop body or branch drawn as a cluster.
    Loop,
    /// Anything else.
    Plain,
}

impl BoxKind {
    /// The CSS class the page styles it with.
    pub fn class(self) -> &'static str {
        match self {
            BoxKind::Taken => "taken",
            BoxKind::Refused => "refused",
            BoxKind::Member => "member",
            BoxKind::Dropped => "dropped",
            BoxKind::Loop => "loop",
            BoxKind::Plain => "plain",
        }
    }
}

/// One box of the drawing: a node, or one member op of a fused group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphBox {
    /// `%4 exp`, or `%5.1 tanh` for member 1 of fused node 5.
    pub label: String,
    /// The op's name, what search matches: `exp`, `input`, `matmul`.
    pub op: String,
    /// Shape and dtype, symbolic dims as their symbols.
    pub aval: String,
    /// Its colour.
    pub kind: BoxKind,
    /// The optimized node it belongs to (what selecting it selects).
    pub node: Option<usize>,
    /// In the traced graph, the traced node it is.
    pub traced: Option<usize>,
    /// For a fused group's member, its position in the group.
    pub step: Option<usize>,
    /// The script position that made it.
    pub location: Option<SourceLocation>,
    /// The `nn` composition that made it (`softmax`, `layer_norm`).
    #[serde(default)]
    pub composition: Option<String>,
    /// The cluster it is drawn in.
    pub cluster: Option<usize>,
    /// Inside an opened loop body (its cluster's), the body's node it is.
    #[serde(default)]
    pub body_node: Option<usize>,
    /// Its size in pixels.
    pub width: f64,
    /// Its height in pixels.
    pub height: f64,
}

/// A fused group or an opened loop body, drawn as a frame around its
/// members.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cluster {
    /// The fused node, or the control node whose body it is.
    pub node: usize,
    /// `fused %5: 3 ops`, `scan %5 · body · 1000 iterations`.
    pub label: String,
    /// The group's reinplace colour ([`BoxKind::Loop`] for a body).
    pub kind: BoxKind,
    /// For a loop body, where it is in [`Report::loops`].
    #[serde(default)]
    pub body: Option<BodyPath>,
}

impl Cluster {
    /// The width its title needs, in pixels: a frame is at least this wide.
    pub fn title_width(&self) -> f64 {
        self.label.chars().count() as f64 * CHAR_WIDTH + 12.0
    }
}

/// Where a loop body is in a report: from [`Report::loops`] down, each
/// step the loop's position in its list and the body's in the loop's.
pub type BodyPath = Vec<(usize, usize)>;

/// The loop and body `path` names in `report`.
pub fn body_at<'r>(
    report: &'r Report,
    path: &[(usize, usize)],
) -> Option<(&'r LoopReport, &'r BodyReport)> {
    let mut loops = &report.loops;
    let mut found = None;
    for &(l, b) in path {
        let lp = loops.get(l)?;
        let body = lp.bodies.get(b)?;
        loops = &body.loops;
        found = Some((lp, body));
    }
    found
}

/// A graph ready for layout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphModel {
    /// Which graph it is.
    pub mode: GraphMode,
    /// The boxes.
    pub boxes: Vec<GraphBox>,
    /// The fused groups.
    pub clusters: Vec<Cluster>,
    /// Data edges, as (from box, to box), each pair once.
    pub edges: Vec<(usize, usize)>,
}

/// Where a layout library placed a [`GraphModel`]'s parts: box centres,
/// cluster frames (centre, width, height) and one polyline per edge, in
/// model order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GraphLayout {
    /// The drawing's width.
    pub width: f64,
    /// The drawing's height.
    pub height: f64,
    /// Each box's centre.
    pub boxes: Vec<(f64, f64)>,
    /// Each cluster's centre, width and height.
    pub clusters: Vec<(f64, f64, f64, f64)>,
    /// Each edge's points.
    pub edges: Vec<Vec<(f64, f64)>>,
    /// The edges drawn straight instead of routed around boxes (in a large
    /// graph, those spanning many ranks), by index, ascending.
    #[serde(default)]
    pub long: Vec<usize>,
}

/// Box height, and the width of one character of the labels' monospace
/// font (11 px): boxes are sized to their text.
const BOX_HEIGHT: f64 = 34.0;
const CHAR_WIDTH: f64 = 6.7;
const MIN_WIDTH: f64 = 60.0;
/// Labels longer than this are cut (the details panel has them whole).
const MAX_LABEL: usize = 40;

fn op_name(op: &str) -> String {
    op.split(['(', '[', ' '])
        .next()
        .unwrap_or_default()
        .to_string()
}

fn cut(text: &str) -> String {
    if text.chars().count() <= MAX_LABEL {
        text.to_string()
    } else {
        let kept: String = text.chars().take(MAX_LABEL - 1).collect();
        format!("{kept}…")
    }
}

fn sized(mut b: GraphBox) -> GraphBox {
    let chars = cut(&b.label)
        .chars()
        .count()
        .max(b.aval.chars().count() + 8);
    b.width = (chars as f64 * CHAR_WIDTH + 12.0).max(MIN_WIDTH);
    b.height = BOX_HEIGHT;
    b
}

fn decision_kind(report: &Report, node: usize) -> BoxKind {
    match report.nodes.get(node).and_then(|n| n.reinplace.as_ref()) {
        Some(d) if d.target().is_some() => BoxKind::Taken,
        Some(_) => BoxKind::Refused,
        None => BoxKind::Plain,
    }
}

/// The boxes and edges of `report`'s graph in `mode`.
pub fn graph_model(report: &Report, mode: GraphMode) -> GraphModel {
    match mode {
        GraphMode::Optimized => optimized_model(report),
        GraphMode::Traced => traced_model(report),
    }
}

fn optimized_model(report: &Report) -> GraphModel {
    let mut boxes = Vec::with_capacity(report.nodes.len());
    let mut clusters = Vec::new();
    let mut edges = Vec::new();
    // The box holding each node's value: a fused node's is its last member.
    let mut output_box = vec![0usize; report.nodes.len()];
    for node in &report.nodes {
        let kind = decision_kind(report, node.id);
        if node.group.is_empty() {
            for &input in &node.inputs {
                edges.push((output_box[input], boxes.len()));
            }
            output_box[node.id] = boxes.len();
            boxes.push(sized(GraphBox {
                label: format!("%{} {}", node.id, node.op),
                op: op_name(&node.op),
                aval: node.aval.clone(),
                kind,
                node: Some(node.id),
                traced: None,
                step: None,
                location: node.location,
                composition: node.composition.clone(),
                cluster: None,
                body_node: None,
                width: 0.0,
                height: 0.0,
            }));
            continue;
        }
        let cluster = clusters.len();
        clusters.push(Cluster {
            node: node.id,
            label: format!("fused %{}: {} ops", node.id, node.group.len()),
            kind,
            body: None,
        });
        let first = boxes.len();
        let last = node.group.len() - 1;
        for (k, step) in node.group.iter().enumerate() {
            for arg in &step.args {
                let from = match *arg {
                    GroupArg::Node(input) => output_box[input],
                    GroupArg::Step(s) => first + s,
                };
                edges.push((from, boxes.len()));
            }
            boxes.push(sized(GraphBox {
                label: format!("%{}.{k} {}", node.id, step.op),
                op: op_name(&step.op),
                aval: step.aval.clone(),
                kind: if k == last { kind } else { BoxKind::Member },
                node: Some(node.id),
                traced: None,
                step: Some(k),
                location: step.location,
                composition: step.composition.clone(),
                cluster: Some(cluster),
                body_node: None,
                width: 0.0,
                height: 0.0,
            }));
        }
        output_box[node.id] = first + last;
    }
    edges.sort_unstable();
    edges.dedup();
    GraphModel {
        mode: GraphMode::Optimized,
        boxes,
        clusters,
        edges,
    }
}

fn traced_model(report: &Report) -> GraphModel {
    let boxes = report
        .traced
        .iter()
        .map(|t| {
            sized(GraphBox {
                label: format!("%{} {}", t.id, t.op),
                op: op_name(&t.op),
                aval: t.aval.clone(),
                kind: if t.optimized.is_some() {
                    BoxKind::Plain
                } else {
                    BoxKind::Dropped
                },
                node: t.optimized,
                traced: Some(t.id),
                step: None,
                location: t.location,
                composition: t.composition.clone(),
                cluster: None,
                body_node: None,
                width: 0.0,
                height: 0.0,
            })
        })
        .collect();
    let mut edges: Vec<(usize, usize)> = report
        .traced
        .iter()
        .flat_map(|t| t.inputs.iter().map(move |&i| (i, t.id)))
        .collect();
    edges.sort_unstable();
    edges.dedup();
    GraphModel {
        mode: GraphMode::Traced,
        boxes,
        clusters: Vec::new(),
        edges,
    }
}

/// `model` (the optimized graph) with every body of every control-flow
/// node of `report` opened: a cluster per body or branch, labelled with its
/// loop, trip count and how each carry moves between iterations, holding a
/// box per body node (selecting one selects the loop's node), with an edge
/// from the loop's box to the body's inputs. Loops inside bodies open too.
pub fn open_loops(mut model: GraphModel, report: &Report) -> GraphModel {
    let loop_box = |model: &GraphModel, node: usize| {
        model
            .boxes
            .iter()
            .position(|b| b.node == Some(node) && b.step.is_none() && b.body_node.is_none())
    };
    let mut pending: Vec<(BodyPath, Option<usize>)> = report
        .loops
        .iter()
        .enumerate()
        .flat_map(|(l, lp)| {
            let from = loop_box(&model, lp.node);
            (0..lp.bodies.len()).map(move |b| (vec![(l, b)], from))
        })
        .collect();
    let mut next = 0;
    while let Some((path, from)) = pending.get(next).cloned() {
        next += 1;
        let Some((lp, body)) = body_at(report, &path) else {
            continue;
        };
        let cluster = model.clusters.len();
        model.clusters.push(Cluster {
            node: lp.node,
            label: body_label(lp, body),
            kind: BoxKind::Loop,
            body: Some(path.clone()),
        });
        let first = model.boxes.len();
        let index_of = |id: usize| {
            body.nodes
                .iter()
                .position(|n| n.id == id)
                .map(|i| first + i)
        };
        for node in &body.nodes {
            let at = model.boxes.len();
            match (node.inputs.is_empty(), from) {
                (true, Some(from)) => model.edges.push((from, at)),
                _ => model.edges.extend(
                    node.inputs
                        .iter()
                        .filter_map(|&i| index_of(i))
                        .map(|i| (i, at)),
                ),
            }
            model.boxes.push(sized(GraphBox {
                label: format!("%{} {}", node.id, node.op),
                op: op_name(&node.op),
                aval: node.aval.clone(),
                kind: match &node.reinplace {
                    Some(d) if d.target().is_some() => BoxKind::Taken,
                    Some(_) => BoxKind::Refused,
                    None => BoxKind::Plain,
                },
                node: Some(lp.node),
                traced: None,
                step: None,
                location: node.location,
                composition: node.composition.clone(),
                cluster: Some(cluster),
                body_node: Some(node.id),
                width: 0.0,
                height: 0.0,
            }));
        }
        for (l, inner) in body.loops.iter().enumerate() {
            let inner_box = index_of(inner.node);
            for b in 0..inner.bodies.len() {
                let mut inner_path = path.clone();
                inner_path.push((l, b));
                pending.push((inner_path, inner_box));
            }
        }
    }
    model.edges.sort_unstable();
    model.edges.dedup();
    model
}

/// `scan %5 · body · 1000 iterations`: the loop, the body's name and the
/// trip count where it is known.
pub fn loop_body_title(lp: &LoopReport, body: &BodyReport) -> String {
    let mut title = format!("{} %{} · {}", op_name(&lp.op), lp.node, body.name);
    if let Some(trips) = &lp.trip_count {
        let _ = write!(title, " · {trips} iterations");
    }
    title
}

/// The title with how each carry moves: `scan %5 · body · 1000 iterations
/// · carry[0] in place`.
fn body_label(lp: &LoopReport, body: &BodyReport) -> String {
    let mut label = loop_body_title(lp, body);
    for carried in &body.carried {
        let how = if carried.in_place {
            "in place"
        } else {
            "double-buffered"
        };
        let _ = write!(label, " · carry[{}] {how}", carried.carry);
    }
    label
}

/// `model` with each call of an `nn` composition (the boxes one
/// composition made at one script position) drawn as one box, `layer_norm
/// (7 ops)`, standing for its last node. Fused groups keep the members
/// outside compositions (a group left empty is not drawn).
pub fn collapse_compositions(model: GraphModel) -> GraphModel {
    type Call = (String, Option<SourceLocation>);
    let mut calls: Vec<(Call, Vec<usize>)> = Vec::new();
    for (i, b) in model.boxes.iter().enumerate() {
        if let Some(c) = &b.composition {
            let call = (c.clone(), b.location);
            match calls.iter_mut().find(|(k, _)| *k == call) {
                Some((_, members)) => members.push(i),
                None => calls.push((call, vec![i])),
            }
        }
    }
    let mut into: Vec<Option<usize>> = vec![None; model.boxes.len()];
    let mut boxes: Vec<GraphBox> = Vec::new();
    // Each box in order; a composition's box where its last member was.
    let last_of: Vec<Option<&Vec<usize>>> = (0..model.boxes.len())
        .map(|i| {
            calls
                .iter()
                .find(|(_, m)| m.len() > 1 && m.last() == Some(&i))
                .map(|(_, m)| m)
        })
        .collect();
    for (i, b) in model.boxes.iter().enumerate() {
        let collapsed = b.composition.as_ref().and_then(|c| {
            calls
                .iter()
                .find(|((k, at), m)| k == c && *at == b.location && m.len() > 1)
        });
        if collapsed.is_some() && last_of[i].is_none() {
            continue;
        }
        into[i] = Some(boxes.len());
        match last_of[i] {
            Some(members) => {
                for &m in members {
                    into[m] = Some(boxes.len());
                }
                let name = b.composition.clone().unwrap_or_default();
                boxes.push(sized(GraphBox {
                    label: format!("{name} ({} ops)", members.len()),
                    op: name,
                    kind: BoxKind::Plain,
                    step: None,
                    cluster: None,
                    ..b.clone()
                }));
            }
            None => boxes.push(b.clone()),
        }
    }
    // Clusters that still hold a box, renumbered.
    let mut kept: Vec<Option<usize>> = vec![None; model.clusters.len()];
    let mut clusters = Vec::new();
    for b in &mut boxes {
        if let Some(c) = b.cluster {
            if kept[c].is_none() {
                kept[c] = Some(clusters.len());
                clusters.push(model.clusters[c].clone());
            }
            b.cluster = kept[c];
        }
    }
    let mut edges: Vec<(usize, usize)> = model
        .edges
        .iter()
        .filter_map(|&(a, b)| Some((into[a]?, into[b]?)))
        .filter(|(a, b)| a != b)
        .collect();
    edges.sort_unstable();
    edges.dedup();
    GraphModel {
        mode: model.mode,
        boxes,
        clusters,
        edges,
    }
}

/// The boxes `query` finds (ignoring case and spaces; none for an empty
/// query): `%12` the boxes of node 12 (every member of a fused node),
/// `%12.1` one member; an aval (`f32[16,64]`, any query with a `[`) the
/// boxes of that aval; `line 4` or `:4` the boxes script line 4 made; an
/// `nn` composition (`layer_norm`, `nn::gelu`) the boxes it made;
/// anything else the boxes whose op name contains it.
pub fn search(model: &GraphModel, query: &str) -> Vec<usize> {
    let query: String = query
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase();
    if query.is_empty() {
        return Vec::new();
    }
    let line = query
        .strip_prefix("line ")
        .or_else(|| query.strip_prefix(':'))
        .and_then(|l| l.trim().parse::<u32>().ok());
    let compact = query.replace(' ', "");
    let matches = |b: &GraphBox| -> bool {
        if let Some(id) = query.strip_prefix('%') {
            let label = b.label.split(' ').next().unwrap_or("");
            let own = label.trim_start_matches('%');
            return own == id || (!id.contains('.') && own.split('.').next() == Some(id));
        }
        if let Some(line) = line {
            return b.location.is_some_and(|l| l.line == line);
        }
        if compact.contains('[') {
            return b.aval.replace(' ', "").to_lowercase() == compact;
        }
        let composition = query.strip_prefix("nn::").unwrap_or(&query);
        b.op.to_lowercase().contains(&query)
            || b.composition.as_deref().is_some_and(|c| c == composition)
    };
    model
        .boxes
        .iter()
        .enumerate()
        .filter(|(_, b)| matches(b))
        .map(|(i, _)| i)
        .collect()
}

/// The details panel of box `index`: (field, value) rows for its op,
/// aval, home, reinplace decision and reason, group and script line.
pub fn details(report: &Report, model: &GraphModel, index: usize) -> Vec<(&'static str, String)> {
    let Some(b) = model.boxes.get(index) else {
        return Vec::new();
    };
    let mut rows = vec![("op", b.label.clone()), ("aval", b.aval.clone())];
    if let Some(c) = &b.composition {
        rows.push(("composition", format!("nn::{c}")));
    }
    let body = b
        .cluster
        .and_then(|c| model.clusters.get(c))
        .and_then(|c| c.body.as_deref())
        .and_then(|path| body_at(report, path));
    let node = match (b.body_node, body) {
        (Some(id), Some((lp, body))) => {
            rows.push((
                "loop",
                format!(
                    "in the {} of {} %{} (planned once for every iteration)",
                    body.name,
                    op_name(&lp.op),
                    lp.node
                ),
            ));
            body.nodes.iter().find(|n| n.id == id)
        }
        _ => b.node.and_then(|n| report.nodes.get(n)),
    };
    if b.traced.is_some() {
        rows.push((
            "after passes",
            match node {
                Some(n) => format!("computed by %{} {}", n.id, n.op),
                None => "removed by the passes".to_string(),
            },
        ));
    }
    if let Some(n) = node {
        if b.step.is_some() {
            rows.push(("group", format!("member of fused %{} ({})", n.id, n.op)));
        }
        rows.push(("home", n.home.clone()));
        rows.push((
            "reinplace",
            n.reinplace
                .as_ref()
                .map_or_else(|| "not elementwise".to_string(), |d| d.summary()),
        ));
        if n.backward {
            rows.push(("pass", "backward (gradient)".to_string()));
        }
        if b.traced.is_none() && b.step.is_none() && n.traced.len() > 1 {
            let merged: Vec<String> = n.traced.iter().map(|t| format!("%{t}")).collect();
            rows.push(("traced", format!("computes {}", merged.join(", "))));
        }
    }
    rows.push((
        "script",
        b.location
            .map_or_else(|| "no script position".to_string(), |l| l.to_string()),
    ));
    rows
}

/// The details panel of fused group `cluster`: its members in order, and
/// the fused node's aval, home, reinplace decision and script line.
pub fn cluster_details(
    report: &Report,
    model: &GraphModel,
    cluster: usize,
) -> Vec<(&'static str, String)> {
    if let Some((lp, body)) = model
        .clusters
        .get(cluster)
        .and_then(|c| c.body.as_deref())
        .and_then(|path| body_at(report, path))
    {
        return loop_body_details(lp, body);
    }
    let Some(node) = model
        .clusters
        .get(cluster)
        .and_then(|c| report.nodes.get(c.node))
    else {
        return Vec::new();
    };
    let members: Vec<String> = node
        .group
        .iter()
        .enumerate()
        .map(|(k, step)| format!("%{}.{k} {}", node.id, op_name(&step.op)))
        .collect();
    let mut rows = vec![
        (
            "group",
            format!("fused %{}: {} ops", node.id, node.group.len()),
        ),
        ("members", members.join(", ")),
        ("aval", node.aval.clone()),
        ("home", node.home.clone()),
        (
            "reinplace",
            node.reinplace
                .as_ref()
                .map_or_else(|| "not elementwise".to_string(), |d| d.summary()),
        ),
    ];
    if node.backward {
        rows.push(("pass", "backward (gradient)".to_string()));
    }
    rows.push((
        "script",
        node.location
            .map_or_else(|| "no script position".to_string(), |l| l.to_string()),
    ));
    rows
}

/// The rows of an opened loop body: the loop, its trip count, the body's
/// nodes and planned peak, and how each carry moves between iterations.
fn loop_body_details(lp: &LoopReport, body: &BodyReport) -> Vec<(&'static str, String)> {
    let mut rows = vec![
        ("loop", format!("%{} {}", lp.node, lp.op)),
        (
            "iterations",
            lp.trip_count
                .clone()
                .unwrap_or_else(|| "known only as it runs".to_string()),
        ),
        (
            "body",
            format!(
                "{}: {} nodes, one plan for every iteration, peak {}",
                body.name,
                body.nodes.len(),
                crate::view::human_bytes(body.plan.memory.peak_bytes)
            ),
        ),
    ];
    for carried in &body.carried {
        rows.push((
            "carry",
            format!(
                "carry[{}] {}: {}",
                carried.carry, carried.aval, carried.detail
            ),
        ));
    }
    rows
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            _ => out.push(c),
        }
    }
    out
}

/// The SVG elements (clusters, then edges, then boxes) of `model` placed
/// by `layout`, to go inside the view's `<svg>`. Boxes carry `data-box`
/// (their index) and `data-node` (the node they select), so the page finds
/// them without a handler per box.
pub fn render_svg(model: &GraphModel, layout: &GraphLayout) -> String {
    let mut svg = String::with_capacity(model.boxes.len() * 300);
    for (index, (cluster, &(x, y, w, h))) in model.clusters.iter().zip(&layout.clusters).enumerate()
    {
        let _ = write!(
            svg,
            r#"<g class="cluster {}" data-cluster="{index}" data-node="{}"><rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" rx="6"></rect><text x="{:.1}" y="{:.1}">{}</text></g>"#,
            cluster.kind.class(),
            cluster.node,
            x - w / 2.0,
            y - h / 2.0,
            w,
            h,
            x - w / 2.0 + 6.0,
            y - h / 2.0 + 12.0,
            escape(&cluster.label),
        );
    }
    for (index, points) in layout.edges.iter().enumerate() {
        let mut d = String::new();
        for (k, (x, y)) in points.iter().enumerate() {
            let _ = write!(d, "{}{x:.1} {y:.1}", if k == 0 { "M" } else { " L" });
        }
        // `long` comes in ascending order.
        let class = if layout.long.binary_search(&index).is_ok() {
            "edge long"
        } else {
            "edge"
        };
        let _ = write!(svg, r#"<path class="{class}" d="{d}"></path>"#);
    }
    for (index, (b, &(x, y))) in model.boxes.iter().zip(&layout.boxes).enumerate() {
        let (left, top) = (x - b.width / 2.0, y - b.height / 2.0);
        let node = b
            .node
            .map_or_else(String::new, |n| format!(r#" data-node="{n}""#));
        let line = b
            .location
            .map_or_else(String::new, |l| format!(" · line {}", l.line));
        let _ = write!(
            svg,
            r#"<g class="box {}" data-box="{index}"{node} data-op="{}"><rect x="{left:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" rx="4"></rect><text x="{:.1}" y="{:.1}">{}</text><text class="aval" x="{:.1}" y="{:.1}">{}{line}</text></g>"#,
            b.kind.class(),
            escape(&b.op),
            b.width,
            b.height,
            left + 6.0,
            top + 14.0,
            escape(&cut(&b.label)),
            left + 6.0,
            top + 28.0,
            escape(&b.aval),
        );
    }
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::Session;

    fn report_of(script: &str) -> Report {
        let run = Session::new().run(script);
        assert_eq!(run.error, None, "{script}");
        (*run.functions[0].cache.reports[0]).clone()
    }

    const FUSED: &str = "let f = compile(|x| {\n  let e = x.exp();\n  let t = e.tanh() * x;\n  t.sum()\n});\nf.run(ones([4]))";

    #[test]
    fn a_fused_group_becomes_a_cluster_of_its_member_ops() {
        let report = report_of(FUSED);
        let model = graph_model(&report, GraphMode::Optimized);
        assert_eq!(model.clusters.len(), 1, "{model:?}");
        let fused = model.clusters[0].node;
        let members: Vec<&str> = model
            .boxes
            .iter()
            .filter(|b| b.cluster == Some(0))
            .map(|b| b.op.as_str())
            .collect();
        assert_eq!(members, ["exp", "tanh", "mul"]);
        assert!(model
            .boxes
            .iter()
            .filter(|b| b.cluster == Some(0))
            .all(|b| b.node == Some(fused)));
        let lines: Vec<Option<u32>> = model
            .boxes
            .iter()
            .map(|b| b.location.map(|l| l.line))
            .collect();
        assert_eq!(lines, [None, Some(2), Some(3), Some(3), Some(4)]);
    }

    #[test]
    fn opened_loops_draw_each_body_as_a_cluster_with_its_trip_count_and_carries() {
        let report = report_of(
            "let f = compile(|xs| scan(|c, x| [c + x, x.sum()], zeros([2]), xs));\nf.run(ones([3, 2]))",
        );
        let closed = graph_model(&report, GraphMode::Optimized);
        assert!(closed.clusters.iter().all(|c| c.body.is_none()));
        let model = open_loops(closed.clone(), &report);
        let scan = report.loops[0].node;
        let bodies: Vec<&Cluster> = model.clusters.iter().filter(|c| c.body.is_some()).collect();
        assert_eq!(bodies.len(), 1, "{:?}", model.clusters);
        let label = &bodies[0].label;
        assert!(
            label.starts_with(&format!("scan %{scan} · body · 3 iterations · carry[0] ")),
            "{label}"
        );
        let cluster = model
            .clusters
            .iter()
            .position(|c| c.body.is_some())
            .unwrap();
        let members: Vec<&GraphBox> = model
            .boxes
            .iter()
            .filter(|b| b.cluster == Some(cluster))
            .collect();
        assert_eq!(members.len(), report.loops[0].bodies[0].nodes.len());
        assert!(members
            .iter()
            .all(|b| b.node == Some(scan) && b.body_node.is_some()));
        assert!(members.iter().any(|b| b.op == "add") && members.iter().any(|b| b.op == "sum"));
        // The loop's box feeds the body's inputs; the closed graph's edges stay.
        let loop_box = model
            .boxes
            .iter()
            .position(|b| b.node == Some(scan) && b.body_node.is_none())
            .unwrap();
        assert!(model
            .edges
            .iter()
            .any(|&(a, b)| a == loop_box && model.boxes[b].cluster == Some(cluster)));
        assert!(closed.edges.iter().all(|e| model.edges.contains(e)));
        let rows = cluster_details(&report, &model, cluster);
        assert!(rows.contains(&("iterations", "3".to_string())), "{rows:?}");
        assert!(
            rows.iter()
                .any(|(f, v)| *f == "carry" && v.starts_with("carry[0] f32[2]")),
            "{rows:?}"
        );
        let add = model
            .boxes
            .iter()
            .position(|b| b.cluster == Some(cluster) && b.op == "add")
            .unwrap();
        let rows = details(&report, &model, add);
        assert!(
            rows.iter()
                .any(|(f, v)| *f == "loop" && v.contains(&format!("body of scan %{scan}"))),
            "{rows:?}"
        );
    }

    #[test]
    fn a_loop_inside_a_body_opens_as_its_own_cluster_fed_by_its_node() {
        let report = report_of(
            "let f = compile(|x| fori_loop(0, 2, |i, c| while_loop(|v| v.sum() < 40.0, |v| v * 2.0, c), x));\nf.run(ones([2]))",
        );
        let model = open_loops(graph_model(&report, GraphMode::Optimized), &report);
        let labels: Vec<&str> = model
            .clusters
            .iter()
            .filter(|c| c.body.is_some())
            .map(|c| c.label.as_str())
            .collect();
        assert_eq!(
            labels.len(),
            3,
            "the scan's body, the while loop's cond and body: {labels:?}"
        );
        assert!(
            labels[1].starts_with("while_loop %") && labels[1].contains("cond"),
            "{labels:?}"
        );
        let inner = model
            .boxes
            .iter()
            .position(|b| b.body_node.is_some() && b.op == "while_loop")
            .unwrap();
        let fed: Vec<Option<usize>> = model
            .edges
            .iter()
            .filter(|e| e.0 == inner)
            .map(|e| model.boxes[e.1].cluster)
            .collect();
        assert!(
            fed.iter().any(|c| *c != model.boxes[inner].cluster),
            "{fed:?}"
        );
    }

    #[test]
    fn edges_run_from_the_box_holding_each_value() {
        let report = report_of(FUSED);
        let model = graph_model(&report, GraphMode::Optimized);
        let index = |op: &str| model.boxes.iter().position(|b| b.op == op);
        let (input, exp, tanh, mul, sum) = (
            index("input"),
            index("exp"),
            index("tanh"),
            index("mul"),
            index("sum"),
        );
        let edge = |a: Option<usize>, b: Option<usize>| a.zip(b).map(|e| model.edges.contains(&e));
        assert_eq!(edge(input, exp), Some(true));
        assert_eq!(edge(exp, tanh), Some(true));
        assert_eq!(edge(tanh, mul), Some(true));
        assert_eq!(edge(input, mul), Some(true));
        assert_eq!(
            edge(mul, sum),
            Some(true),
            "the group's value is its last member's"
        );
        assert_eq!(model.edges.len(), 5);
    }

    #[test]
    fn the_traced_graph_has_a_box_per_traced_node_and_marks_the_dropped_ones() {
        let report = report_of("let f = compile(|x| (x.exp() + x.exp()).reshape([4]).reshape([2, 2])).fusion(false);\nf.run(ones([2, 2]))");
        let model = graph_model(&report, GraphMode::Traced);
        assert_eq!(model.boxes.len(), report.traced.len());
        assert!(model.clusters.is_empty());
        let exps: Vec<Option<usize>> = model
            .boxes
            .iter()
            .filter(|b| b.op == "exp")
            .map(|b| b.node)
            .collect();
        assert_eq!(exps.len(), 2);
        assert_eq!(exps[0], exps[1], "CSE merged both into one node");
        let optimized = graph_model(&report, GraphMode::Optimized);
        assert!(optimized.boxes.len() < model.boxes.len());
    }

    #[test]
    fn boxes_are_coloured_by_their_reinplace_decision() {
        // The exp cannot take the caller's input; the sin takes the exp's.
        let report =
            report_of("let f = compile(|x| x.exp().sin().sum()).fusion(false);\nf.run(ones([4]))");
        let model = graph_model(&report, GraphMode::Optimized);
        let kinds: Vec<(&str, BoxKind)> = model
            .boxes
            .iter()
            .map(|b| (b.op.as_str(), b.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                ("input", BoxKind::Plain),
                ("exp", BoxKind::Refused),
                ("sin", BoxKind::Taken),
                ("sum", BoxKind::Plain)
            ]
        );
    }

    #[test]
    fn search_finds_boxes_by_op_name_ignoring_case() {
        let report = report_of(FUSED);
        let model = graph_model(&report, GraphMode::Optimized);
        let found: Vec<&str> = search(&model, "TAN")
            .into_iter()
            .map(|i| model.boxes[i].label.as_str())
            .collect();
        assert_eq!(found.len(), 1);
        assert!(found[0].ends_with(".1 tanh"), "{found:?}");
        assert!(search(&model, "  ").is_empty());
        assert!(search(&model, "matmul").is_empty());
    }

    #[test]
    fn a_composition_is_found_by_name_and_collapses_into_one_box() {
        let script = "let f = compile(|x| nn::gelu(x).exp()).fusion(false);\nf.run(ones([4]))";
        let report = report_of(script);
        let model = graph_model(&report, GraphMode::Optimized);
        let gelu = search(&model, "nn::gelu");
        assert!(gelu.len() > 2, "gelu's ops: {gelu:?}");
        assert_eq!(search(&model, "GELU"), gelu);
        assert!(gelu
            .iter()
            .all(|&i| model.boxes[i].composition.as_deref() == Some("gelu")));
        let before = model.boxes.len();
        let collapsed = collapse_compositions(model);
        assert_eq!(collapsed.boxes.len(), before - gelu.len() + 1);
        let one = search(&collapsed, "gelu");
        assert_eq!(one.len(), 1);
        assert_eq!(
            collapsed.boxes[one[0]].label,
            format!("gelu ({} ops)", gelu.len())
        );
        // The input feeds the gelu box, the gelu box the exp.
        let exp = search(&collapsed, "exp")[0];
        assert!(collapsed.edges.contains(&(one[0], exp)));
        assert!(collapsed.edges.iter().all(|(a, b)| a != b));
    }

    #[test]
    fn search_finds_boxes_by_node_id_aval_and_script_line() {
        let report = report_of(FUSED);
        let model = graph_model(&report, GraphMode::Optimized);
        let labels = |query: &str| -> Vec<String> {
            search(&model, query)
                .into_iter()
                .map(|i| model.boxes[i].label.clone())
                .collect()
        };
        // Node 1 is the fused group: all three members; `%1.1` one.
        let group = labels("%1");
        assert_eq!(group.len(), 3, "{group:?}");
        assert!(group.iter().all(|l| l.starts_with("%1.")));
        assert_eq!(labels("%1.1"), vec!["%1.1 tanh".to_string()]);
        assert_eq!(labels("F32[ ]"), labels("f32[]"));
        assert_eq!(labels("f32[]").len(), 1, "the sum");
        assert_eq!(labels("f32[4]").len(), 4, "the argument and the members");
        assert_eq!(labels("line 3"), labels(":3"));
        assert!(labels("line 3").iter().any(|l| l.ends_with("tanh")));
        assert!(labels("line 99").is_empty());
    }

    #[test]
    fn details_name_the_decision_the_home_and_the_script_line() {
        let report = report_of(FUSED);
        let model = graph_model(&report, GraphMode::Optimized);
        let tanh = search(&model, "tanh")[0];
        let rows = details(&report, &model, tanh);
        let row = |field: &str| {
            rows.iter()
                .find(|(f, _)| *f == field)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(row("aval"), Some("f32[4]"));
        assert!(row("group").is_some_and(|g| g.starts_with("member of fused %1")));
        assert_eq!(row("home"), Some("slot 0"));
        assert_eq!(row("script"), Some("line 3, column 13"));
        assert!(row("reinplace").is_some());
        assert!(details(&report, &model, model.boxes.len()).is_empty());
    }

    #[test]
    fn a_groups_details_list_its_members_and_the_fused_nodes_facts() {
        let report = report_of(FUSED);
        let model = graph_model(&report, GraphMode::Optimized);
        let rows = cluster_details(&report, &model, 0);
        let row = |field: &str| {
            rows.iter()
                .find(|(f, _)| *f == field)
                .map(|(_, v)| v.as_str())
        };
        let fused = model.clusters[0].node;
        assert_eq!(
            row("group"),
            Some(format!("fused %{fused}: 3 ops").as_str())
        );
        assert_eq!(
            row("members"),
            Some(format!("%{fused}.0 exp, %{fused}.1 tanh, %{fused}.2 mul").as_str())
        );
        assert_eq!(row("home"), Some(report.nodes[fused].home.as_str()));
        assert!(row("reinplace").is_some());
        assert!(cluster_details(&report, &model, 1).is_empty());
    }

    #[test]
    fn the_svg_holds_every_box_edge_and_cluster_with_escaped_text() {
        let report = report_of(FUSED);
        let model = graph_model(&report, GraphMode::Optimized);
        let layout = GraphLayout {
            width: 400.0,
            height: 400.0,
            boxes: (0..model.boxes.len())
                .map(|i| (100.0, 50.0 * i as f64 + 20.0))
                .collect(),
            clusters: vec![(100.0, 120.0, 200.0, 180.0)],
            edges: model
                .edges
                .iter()
                .map(|_| vec![(0.0, 0.0), (1.0, 1.5)])
                .collect(),
            long: vec![0],
        };
        let svg = render_svg(&model, &layout);
        assert_eq!(svg.matches("data-box=").count(), model.boxes.len());
        assert_eq!(
            svg.matches(r#"class="edge""#).count(),
            model.edges.len() - 1
        );
        assert_eq!(svg.matches(r#"class="edge long""#).count(), 1);
        assert_eq!(svg.matches(r#"class="cluster"#).count(), 1);
        assert!(svg.contains(r#"d="M0.0 0.0 L1.0 1.5""#), "{svg}");
        assert!(!svg.contains("<script"));
        assert_eq!(
            escape(r#"input args["a"] <b>"#),
            "input args[&quot;a&quot;] &lt;b&gt;"
        );
    }
}
