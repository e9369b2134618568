//! The graph view: the optimized graph (fused groups as clusters) or the
//! traced one, laid out by dagre, drawn as SVG, with pan, zoom, search by
//! op name and a details panel. The boxes and the SVG come from
//! [`crate::graph`]; this module only wires them to the DOM.

use super::views::{box_at, fit_graph, focus_graph, layout_graph, mark_only};
use crate::graph::{details, graph_model, render_svg, search, GraphLayout, GraphMode, GraphModel};
use kiln::Report;
use leptos::prelude::*;
use serde::Serialize;
use std::sync::Arc;

/// What `layoutGraph` takes.
#[derive(Serialize)]
struct LayoutInput<'a> {
    boxes: Vec<LayoutBox>,
    clusters: usize,
    edges: &'a [(usize, usize)],
}

#[derive(Serialize)]
struct LayoutBox {
    width: f64,
    height: f64,
    cluster: Option<usize>,
}

/// Lays `model` out with dagre; returns the layout and the milliseconds
/// it took.
fn lay_out(model: &GraphModel) -> Result<(GraphLayout, f64), String> {
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
        edges: &model.edges,
    };
    let input = input
        .serialize(&serde_wasm_bindgen::Serializer::json_compatible())
        .map_err(|e| e.to_string())?;
    let start = js_sys::Date::now();
    let placed = layout_graph(&input).map_err(|e| format!("{e:?}"))?;
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

/// The graph view of `report`. `selected` is the node selected in any
/// view; `reveal` shows a script line in the editor.
pub fn graph_view(
    selected: RwSignal<Option<usize>>,
    report: Report,
    reveal: impl Fn(u32) + Copy + Send + Sync + 'static,
) -> impl IntoView {
    let report = Arc::new(report);
    let mode = RwSignal::new(GraphMode::Optimized);
    let query = RwSignal::new(String::new());
    let detail = RwSignal::new(None::<usize>);
    let matches = RwSignal::new(Vec::<usize>::new());
    let next_match = RwSignal::new(0usize);
    let laid_out = RwSignal::new(String::new());
    let model = StoredValue::new_local(graph_model(&report, GraphMode::Optimized));
    let layout = StoredValue::new_local(GraphLayout::default());
    let drawn = StoredValue::new_local(None::<GraphMode>);
    let svg = NodeRef::<leptos::svg::Svg>::new();
    let viewport = NodeRef::<leptos::svg::G>::new();
    {
        let report = report.clone();
        Effect::new(move |_| {
            let mode = mode.get();
            let (Some(svg), Some(viewport)) = (svg.get(), viewport.get()) else {
                return;
            };
            if drawn.get_value() != Some(mode) {
                let fresh = graph_model(&report, mode);
                match lay_out(&fresh) {
                    Ok((placed, ms)) => {
                        viewport.set_inner_html(&render_svg(&fresh, &placed));
                        laid_out.set(format!(
                            "{} boxes laid out by dagre in {ms:.0} ms",
                            fresh.boxes.len()
                        ));
                        fit_graph(&svg, placed.width, placed.height);
                        layout.set_value(placed);
                    }
                    Err(e) => {
                        viewport.set_inner_html("");
                        laid_out.set(format!("layout failed: {e}"));
                    }
                }
                model.set_value(fresh);
                drawn.set_value(Some(mode));
                detail.set(None);
            }
            let found = model.with_value(|m| search(m, &query.get()));
            mark_only(&svg, "match", &boxes_selector(&found));
            matches.set(found);
            next_match.set(0);
            let chosen = selected
                .get()
                .map(|n| format!("[data-node=\"{n}\"]"))
                .unwrap_or_default();
            mark_only(&svg, "selected", &chosen);
        });
    }
    let on_click = move |ev: leptos::ev::MouseEvent| {
        let index = box_at(&ev);
        if let Ok(index) = usize::try_from(index) {
            detail.set(Some(index));
            if let Some(node) = model.with_value(|m| m.boxes.get(index).and_then(|b| b.node)) {
                selected.set(Some(node));
            }
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
        detail.set(Some(index));
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
        let index = detail.get()?;
        let rows = model.with_value(|m| details(&report, m, index));
        let line =
            model.with_value(|m| m.boxes.get(index).and_then(|b| b.location).map(|l| l.line));
        Some(view! {
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
        })
    };
    view! {
        <div class="view graph">
            <h3>{title}</h3>
            <div class="graph-tools">
                <button id="graph-optimized" class:active=move || mode.get() == GraphMode::Optimized
                    on:click=move |_| mode.set(GraphMode::Optimized)>"Optimized"</button>
                <button id="graph-traced" class:active=move || mode.get() == GraphMode::Traced
                    on:click=move |_| mode.set(GraphMode::Traced)>"Traced (before passes)"</button>
                <input id="graph-search" type="search" placeholder="search ops"
                    prop:value=move || query.get()
                    on:input=move |ev| query.set(event_target_value(&ev))/>
                <span id="graph-matches">{move || {
                    let n = matches.get().len();
                    if query.with(|q| q.trim().is_empty()) { String::new() } else { format!("{n} found") }
                }}</span>
                <button id="graph-next" on:click=focus_next>"Next"</button>
                <button id="graph-fit" on:click=fit>"Fit"</button>
                <span id="graph-layout" class="meta">{move || laid_out.get()}</span>
            </div>
            <svg class="graph-canvas" node_ref=svg on:click=on_click>
                <defs>
                    <marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" orient="auto">
                        <path d="M0 0 L8 4 L0 8 z"></path>
                    </marker>
                </defs>
                <g class="viewport" node_ref=viewport></g>
            </svg>
            {panel}
        </div>
    }
}
