//! The kernels view: every step the backend runs for the shown cache
//! entry, in order (WebGPU dispatches with their WGSL, bindings and grid,
//! copies and clears; on the CPU the op nodes the executor evaluates), and
//! the selected step's details, its WGSL in a read-only CodeMirror. The
//! list is the worker's ([`kiln::Compiled::kernels`]); selecting a step
//! selects its nodes in every view, and selecting a node its steps.

use super::views::{create_code_view, CodeView};
use crate::report::{CallClock, EntryKernels};
use crate::view::{
    duration, kernel_rows, kernels_summary, node_ids, step_time, EntryScope, Selection,
};
use kiln::{KernelList, Report};
use leptos::prelude::*;
use std::sync::Arc;

/// The kernels view of `scope`'s entry; `selected` is the page's
/// selection.
pub fn kernels_view(
    selected: RwSignal<Option<(EntryScope, Selection)>>,
    scope: EntryScope,
    report: Arc<Report>,
    kernels: Option<EntryKernels>,
    clock: CallClock,
) -> impl IntoView {
    let (list, steps_ms, runs, resolution_ms) = match kernels {
        Some(EntryKernels {
            list: Some(list),
            steps_ms,
            timed_runs,
            resolution_ms,
            ..
        }) => (Arc::new(list), steps_ms, timed_runs, resolution_ms),
        Some(EntryKernels {
            error: Some(error), ..
        }) => {
            return view! {
                <div class="view kernels">
                    <h3>"Kernels"</h3>
                    <p class="kernels-error meta">{format!("not listed: {error}")}</p>
                </div>
            }
            .into_any()
        }
        _ => return ().into_any(),
    };
    let marked = {
        let (report, list) = (report.clone(), list.clone());
        Memo::new(move |_| match selected.get() {
            Some((at, selection)) if at == scope => selection.kernels(&report, Some(&list)),
            _ => Vec::new(),
        })
    };
    // The step whose details show: the selected one (the first of a
    // selected node's), else the first dispatch.
    let first = list
        .steps
        .iter()
        .position(|s| s.source.is_some())
        .unwrap_or(0);
    let shown = Memo::new(move |_| marked.with(|m| m.first().copied()).unwrap_or(first));
    let rows = kernel_rows(&list);
    let summary = kernels_summary(&list);
    let timed = match clock {
        CallClock::GpuTimestamps if !steps_ms.is_empty() => {
            let total: f64 = steps_ms.iter().flatten().sum();
            format!(
                "GPU time per kernel, the mean of {runs} timed call{}, from timestamp queries: {} \
                 in all",
                if runs == 1 { "" } else { "s" },
                duration(total)
            )
        }
        CallClock::GpuTimestamps => "no call of this entry was timed in this run".to_string(),
        CallClock::SubmitOnly => {
            "no GPU time per kernel: the adapter has no timestamp queries (call times are submit \
             time)"
                .to_string()
        }
        CallClock::Wall if !steps_ms.is_empty() => {
            let total: f64 = steps_ms.iter().flatten().sum();
            format!(
                "CPU executor time per step, the mean of {runs} run{} (the clock ticks every {}, \
                 so a step under {} reads \u{201c}{}\u{201d}): {} in all",
                if runs == 1 { "" } else { "s" },
                duration(resolution_ms * f64::from(runs)),
                duration(resolution_ms),
                step_time(0.0, resolution_ms),
                duration(total)
            )
        }
        CallClock::Wall => String::new(),
    };
    let code_host = NodeRef::<leptos::html::Div>::new();
    let code = StoredValue::new_local(None::<CodeView>);
    {
        let list = list.clone();
        Effect::new(move |_| {
            let k = shown.get();
            let Some(host) = code_host.get() else {
                return;
            };
            let text = list
                .steps
                .get(k)
                .and_then(|s| s.source)
                .and_then(|i| list.sources.get(i))
                .map_or("", String::as_str);
            // A CodeMirror view is made only for a step with source (none on
            // the CPU): the first render does not wait for an empty one.
            if code.with_value(Option::is_none) {
                if text.is_empty() {
                    let _ = host.set_attribute("data-kernel", &k.to_string());
                    return;
                }
                code.set_value(Some(create_code_view(&host)));
            }
            code.with_value(|c| {
                if let Some(c) = c {
                    c.set_code(text);
                }
            });
            let _ = host.set_attribute("data-kernel", &k.to_string());
        });
    }
    let detail_list = list.clone();
    let detail = move || step_details(&detail_list, shown.get());
    let has_source = {
        let list = list.clone();
        move || {
            list.steps
                .get(shown.get())
                .is_some_and(|s| s.source.is_some())
        }
    };
    view! {
        <div class="view kernels" data-steps=list.steps.len()>
            <h3>"Kernels"</h3>
            <p class="kernels-summary meta">{summary}</p>
            <p class="kernels-timing meta">{timed}</p>
            <div class="kernels-body">
                <ol class="kernel-list">
                    {rows
                        .into_iter()
                        .map(|row| {
                            let k = row.index;
                            let (nodes, label) = (row.nodes.clone(), row.nodes);
                            let mean = steps_ms.get(k).copied().flatten();
                            let time = mean.map(|ms| step_time(ms, resolution_ms)).unwrap_or_default();
                            let below = mean.is_some_and(|ms| ms < resolution_ms);
                            let note = below.then(|| format!(
                                "below the clock's resolution: its tick over the {runs} runs timed"
                            ));
                            view! {
                                <li class="kernel" data-kernel=k data-nodes=nodes
                                    class:selected=move || marked.with(|m| m.contains(&k))
                                    on:click=move |_| selected.set(Some((scope, Selection::Kernel(k))))>
                                    <span class="kernel-index">{format!("#{k}")}</span>
                                    <span class="kernel-kind">{row.kind}</span>
                                    <span class="kernel-op">{row.op}</span>
                                    <span class="kernel-nodes">{label}</span>
                                    <span class="kernel-extent">{row.extent}</span>
                                    <span class="kernel-time" class:below-resolution=below title=note>{time}</span>
                                </li>
                            }
                        })
                        .collect_view()}
                </ol>
                <div class="kernel-detail">
                    {detail}
                    <div class="code-view" node_ref=code_host class:hidden=move || !has_source()></div>
                </div>
            </div>
        </div>
    }
    .into_any()
}

/// The detail table of step `k`: kind and op, the nodes it serves, entry
/// point, grid and each binding's byte range.
fn step_details(list: &KernelList, k: usize) -> impl IntoView {
    let Some(step) = list.steps.get(k) else {
        return ().into_any();
    };
    let mut rows: Vec<(&'static str, String)> = vec![
        ("step", format!("#{k} {} {}", step.kind.name(), step.op)),
        ("nodes", node_ids(&step.nodes)),
    ];
    if let Some(entry) = &step.entry_point {
        rows.push(("entry point", entry.clone()));
    }
    if let Some([x, y, z]) = step.grid {
        rows.push(("grid", format!("{x} × {y} × {z} workgroups")));
    }
    let bindings = step.bindings.clone();
    view! {
        <table class="kernel-fields" data-kernel=k>
            {rows
                .into_iter()
                .map(|(field, value)| view! { <tr data-field=field><th>{field}</th><td>{value}</td></tr> })
                .collect_view()}
            <tr data-field="bindings">
                <th>"bindings"</th>
                <td>
                    <ol class="bindings" start="0">
                        {bindings.into_iter().map(|b| view! { <li class="binding">{b.to_string()}</li> }).collect_view()}
                    </ol>
                </td>
            </tr>
        </table>
    }
    .into_any()
}
