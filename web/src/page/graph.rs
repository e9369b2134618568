//! The graph view: the optimized graph (fused groups as clusters) or the
//! traced one, laid out by dagre in a worker (the page stays responsive
//! while thousands of boxes are placed), drawn as SVG, with pan, zoom,
//! search by op name and a details panel. The boxes and the SVG come from
//! [`crate::graph`]; this module only wires them to the DOM.

use super::diff::DiffMarks;
use super::views::{box_at, fit_graph, focus_graph, layout_graph, mark_only, show_graph};
use crate::graph::{
    cluster_details, collapse_compositions, details, graph_model, open_loops, render_svg, search,
    GraphLayout, GraphMode, GraphModel,
};
use crate::view::{EntryScope, Selection};
use kiln::{KernelList, Report};
use leptos::prelude::*;
use serde::Serialize;
use std::rc::Rc;
use std::sync::Arc;
use wasm_bindgen::JsCast;

/// What the details panel beside the canvas shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Detail {
    /// A box, by index.
    Box(usize),
    /// A fused group's frame, by cluster index.
    Group(usize),
}

/// The `data-cluster` index of the fused group whose frame an event
/// happened on (a member box is a box, not its group).
fn group_at(event: &web_sys::Event) -> Option<usize> {
    let target: web_sys::Element = event.target()?.dyn_into().ok()?;
    target
        .closest("[data-cluster]")
        .ok()??
        .get_attribute("data-cluster")?
        .parse()
        .ok()
}

/// What `layoutGraph` takes.
#[derive(Serialize)]
struct LayoutInput<'a> {
    boxes: Vec<LayoutBox>,
    clusters: usize,
    /// Each cluster's least width: its title's.
    titles: Vec<f64>,
    edges: &'a [(usize, usize)],
}

#[derive(Serialize)]
struct LayoutBox {
    width: f64,
    height: f64,
    cluster: Option<usize>,
}

/// Lays `model` out with dagre in the layout worker; returns the layout
/// and the milliseconds it took.
async fn lay_out(model: &GraphModel) -> Result<(GraphLayout, f64), String> {
    let input = LayoutInput {
        boxes: model
            .boxes
            .iter()
            .map(|b| LayoutBox {
                width: b.width,
                height: b.height,
                cluster: b.cluster,
            })
            .collect(),
        clusters: model.clusters.len(),
        titles: model.clusters.iter().map(|c| c.title_width()).collect(),
        edges: &model.edges,
    };
    let input = input
        .serialize(&serde_wasm_bindgen::Serializer::json_compatible())
        .map_err(|e| e.to_string())?;
    let start = js_sys::Date::now();
    let placed = wasm_bindgen_futures::JsFuture::from(layout_graph(&input))
        .await
        .map_err(|e| {
            js_sys::Error::from(e)
                .message()
                .as_string()
                .unwrap_or_default()
        })?;
    let ms = js_sys::Date::now() - start;
    let layout = serde_wasm_bindgen::from_value(placed).map_err(|e| e.to_string())?;
    Ok((layout, ms))
}

/// The selector of the boxes at `indexes`.
fn boxes_selector(indexes: &[usize]) -> String {
    indexes
        .iter()
        .map(|i| format!("[data-box=\"{i}\"]"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The graph view of `report`, the entry `scope` names. `selected` is
/// what is selected in any view (marked here when it is this entry's: its
/// node, the values of its slot or of a kernel of `kernels`); `diff` the
/// nodes the diff view marks; `reveal` shows a script line in the editor.
pub fn graph_view(
    selected: RwSignal<Option<(EntryScope, Selection)>>,
    scope: EntryScope,
    report: Arc<Report>,
    kernels: Option<Arc<KernelList>>,
    diff: RwSignal<DiffMarks>,
    reveal: impl Fn(u32) + Copy + Send + Sync + 'static,
) -> impl IntoView {
    let mode = RwSignal::new(GraphMode::Optimized);
    let query = RwSignal::new(String::new());
    let detail = RwSignal::new(None::<Detail>);
    let matches = RwSignal::new(Vec::<usize>::new());
    let next_match = RwSignal::new(0usize);
    let laid_out = RwSignal::new(String::new());
    let model = StoredValue::new_local(graph_model(&report, GraphMode::Optimized));
    let layout = StoredValue::new_local(GraphLayout::default());
    // Each call of an `nn` composition drawn as one box.
    let collapse = RwSignal::new(false);
    let has_compositions = report.nodes.iter().any(|n| n.composition.is_some());
    // Every loop body drawn as a cluster of its nodes.
    let open = RwSignal::new(false);
    let has_loops = !report.loops.is_empty();
    let drawn = StoredValue::new_local(None::<(GraphMode, bool, bool)>);
    let svg = NodeRef::<leptos::svg::Svg>::new();
    let viewport = NodeRef::<leptos::svg::G>::new();
    // Counts layouts asked for: a layout that comes back after a newer
    // one was asked for is dropped.
    let asked = StoredValue::new_local(0u64);
    let marks_report = report.clone();
    let refresh_marks = Rc::new(move || {
        let Some(svg) = svg.get_untracked() else {
            return;
        };
        let found = model.with_value(|m| search(m, &query.get_untracked()));
        mark_only(&svg, "match", &boxes_selector(&found));
        matches.set(found);
        next_match.set(0);
        let chosen = match selected.get_untracked() {
            Some((at, selection)) if at == scope => {
                selection.nodes(&marks_report, kernels.as_deref())
            }
            _ => Vec::new(),
        };
        let chosen: Vec<String> = chosen
            .iter()
            .map(|n| format!("[data-node=\"{n}\"]"))
            .collect();
        mark_only(&svg, "selected", &chosen.join(","));
        // The diff view's nodes: added and changed against another entry.
        let nodes = |ids: &[usize]| {
            ids.iter()
                .map(|n| format!("[data-node=\"{n}\"]"))
                .collect::<Vec<_>>()
                .join(",")
        };
        diff.with_untracked(|(added, changed)| {
            mark_only(&svg, "diff-added", &nodes(added));
            mark_only(&svg, "diff-changed", &nodes(changed));
        });
    });
    {
        let report = report.clone();
        let refresh_marks = refresh_marks.clone();
        Effect::new(move |_| {
            let (mode, collapsed, opened) = (mode.get(), collapse.get(), open.get());
            let (Some(svg), Some(viewport)) = (svg.get(), viewport.get()) else {
                return;
            };
            if drawn.get_value() == Some((mode, collapsed, opened)) {
                return;
            }
            drawn.set_value(Some((mode, collapsed, opened)));
            let mut fresh = graph_model(&report, mode);
            if opened && mode == GraphMode::Optimized {
                fresh = open_loops(fresh, &report);
            }
            if collapsed {
                fresh = collapse_compositions(fresh);
            }
            let ticket = asked.get_value() + 1;
            asked.set_value(ticket);
            laid_out.set(format!("laying out {} boxes…", fresh.boxes.len()));
            let refresh_marks = refresh_marks.clone();
            leptos::task::spawn_local(async move {
                let placed = lay_out(&fresh).await;
                if asked.try_get_value() != Some(ticket) {
                    return;
                }
                match placed {
                    Ok((placed, ms)) => {
                        viewport.set_inner_html(&render_svg(&fresh, &placed));
                        // What the browser tests wait for.
                        let _ = svg.set_attribute("data-drawn", mode.name());
                        let _ = svg.set_attribute("data-collapsed", &collapsed.to_string());
                        let _ = svg.set_attribute("data-loops-open", &opened.to_string());
                        laid_out.set(format!(
                            "{} boxes laid out by dagre in {ms:.0} ms",
                            fresh.boxes.len()
                        ));
                        show_graph(&svg, placed.width, placed.height);
                        layout.set_value(placed);
                    }
                    Err(e) => {
                        viewport.set_inner_html("");
                        laid_out.set(format!("layout failed: {e}"));
                    }
                }
                model.set_value(fresh);
                detail.set(None);
                refresh_marks();
            });
        });
    }
    Effect::new(move |_| {
        query.track();
        selected.track();
        diff.track();
        refresh_marks();
    });
    let on_click = move |ev: leptos::ev::MouseEvent| {
        let index = box_at(&ev);
        let node = if let Ok(index) = usize::try_from(index) {
            detail.set(Some(Detail::Box(index)));
            model.with_value(|m| m.boxes.get(index).and_then(|b| b.node))
        } else if let Some(group) = group_at(&ev) {
            detail.set(Some(Detail::Group(group)));
            model.with_value(|m| m.clusters.get(group).map(|c| c.node))
        } else {
            None
        };
        if let Some(node) = node {
            selected.set(Some((scope, Selection::Node(node))));
        }
    };
    let focus_next = move |_| {
        let found = matches.get_untracked();
        if found.is_empty() {
            return;
        }
        let k = next_match.get_untracked() % found.len();
        next_match.set(k + 1);
        let index = found[k];
        if let (Some(svg), Some(&(x, y))) = (
            svg.get_untracked(),
            layout.with_value(|l| l.boxes.get(index).copied()).as_ref(),
        ) {
            focus_graph(&svg, x, y);
        }
        detail.set(Some(Detail::Box(index)));
    };
    let fit = move |_| {
        if let Some(svg) = svg.get_untracked() {
            let (w, h) = layout.with_value(|l| (l.width, l.height));
            fit_graph(&svg, w, h);
        }
    };
    let title = format!(
        "Graph ({} nodes after passes, {} traced)",
        report.nodes.len(),
        report.traced_nodes
    );
    let panel = move || {
        let Some(shown) = detail.get() else {
            return view! {
                <p id="graph-hint" class="meta">
                    "Click a box for its op, aval, home, reinplace decision and script line; \
                     click a fused group's or loop body's frame for the group or the loop."
                </p>
            }
            .into_any();
        };
        let (rows, line) = model.with_value(|m| match shown {
            Detail::Box(index) => (
                details(&report, m, index),
                m.boxes.get(index).and_then(|b| b.location).map(|l| l.line),
            ),
            Detail::Group(group) => (
                cluster_details(&report, m, group),
                m.clusters
                    .get(group)
                    .and_then(|c| report.nodes.get(c.node))
                    .and_then(|n| n.location)
                    .map(|l| l.line),
            ),
        });
        view! {
            <table id="graph-details">
                {rows
                    .into_iter()
                    .map(|(field, value)| {
                        let cell = match (field, line) {
                            ("script", Some(line)) => view! {
                                <a href="#" class="script-line" on:click=move |ev| {
                                    ev.prevent_default();
                                    reveal(line);
                                }>{value}</a>
                            }
                            .into_any(),
                            _ => view! { <span>{value}</span> }.into_any(),
                        };
                        view! { <tr data-field=field><th>{field}</th><td>{cell}</td></tr> }
                    })
                    .collect_view()}
            </table>
        }
        .into_any()
    };
    view! {
        <div class="view graph">
            <h3>{title}</h3>
            <div class="graph-tools">
                <button id="graph-optimized" class:active=move || mode.get() == GraphMode::Optimized
                    on:click=move |_| mode.set(GraphMode::Optimized)>"Optimized"</button>
                <button id="graph-traced" class:active=move || mode.get() == GraphMode::Traced
                    on:click=move |_| mode.set(GraphMode::Traced)>"Traced (before passes)"</button>
                <input id="graph-search" type="search" placeholder="op, %12, f32[16,64], line 4"
                    prop:value=move || query.get()
                    on:input=move |ev| query.set(event_target_value(&ev))/>
                <span id="graph-matches">{move || {
                    let n = matches.get().len();
                    if query.with(|q| q.trim().is_empty()) { String::new() } else { format!("{n} found") }
                }}</span>
                <button id="graph-next" on:click=focus_next>"Next"</button>
                {has_compositions.then(|| view! {
                    <button id="graph-collapse" class:active=move || collapse.get()
                        on:click=move |_| collapse.update(|c| *c = !*c)>"Collapse nn calls"</button>
                })}
                {has_loops.then(|| view! {
                    <button id="graph-loops" class:active=move || open.get()
                        disabled=move || mode.get() != GraphMode::Optimized
                        on:click=move |_| open.update(|o| *o = !*o)>"Open loop bodies"</button>
                })}
                <button id="graph-fit" on:click=fit>"Fit"</button>
                <span id="graph-layout" class="meta">{move || laid_out.get()}</span>
            </div>
            <div class="graph-body">
                <svg class="graph-canvas" node_ref=svg on:click=on_click>
                    <defs>
                        <marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" orient="auto">
                            <path d="M0 0 L8 4 L0 8 z"></path>
                        </marker>
                    </defs>
                    <g class="viewport" node_ref=viewport></g>
                </svg>
                <aside class="graph-side">{panel}</aside>
            </div>
        </div>
    }
}
