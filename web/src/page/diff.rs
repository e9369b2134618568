//! The diff view: the shown cache entry against another entry of the same
//! function, picked in a list, or against the previous run's entry of the
//! same function (the script as it was before the edit). It shows what
//! differs between their cache keys (Kiln's explanation, sent by the
//! worker), the nodes added, removed and changed ([`kiln::Report::diff`])
//! and the peak bytes before and after; the graph marks the added and
//! changed nodes.

use crate::report::{KeyDiff, PreviousRun};
use crate::view::{diff_lines, previous_key_lines, DiffLines};
use kiln::Report;
use leptos::prelude::*;
use std::sync::Arc;

/// The nodes of the shown entry the graph marks: (added, changed).
pub type DiffMarks = (Vec<usize>, Vec<usize>);

/// What the shown entry is compared against.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Against {
    /// Another entry of the function's cache.
    Entry(usize),
    /// The function's entry as the previous run left it.
    PreviousRun,
}

/// The select's value for "the previous run".
const PREVIOUS_RUN: &str = "previous";

/// The diff view of `shown` against the other `entries` of its function
/// and against `previous` (nothing when there is neither); `marks` tells
/// the graph what to mark.
pub fn diff_view(
    shown: Arc<Report>,
    entries: Vec<Arc<Report>>,
    key_diffs: Vec<KeyDiff>,
    previous: Option<PreviousRun>,
    marks: RwSignal<DiffMarks>,
) -> impl IntoView {
    let others: Vec<usize> = entries
        .iter()
        .map(|r| r.entry)
        .filter(|&e| e != shown.entry)
        .collect();
    if others.is_empty() && previous.is_none() {
        return ().into_any();
    }
    let previous_label = previous.as_ref().map(|p| {
        format!(
            "the previous run (entry {}, compile at line {})",
            p.report.entry, p.line
        )
    });
    let against = RwSignal::new(None::<Against>);
    let compared = {
        let shown = shown.clone();
        Memo::new(move |_| {
            let (other, key) = match against.get()? {
                Against::Entry(before) => {
                    let other = entries.iter().find(|r| r.entry == before)?.clone();
                    let key: Vec<String> = key_diffs
                        .iter()
                        .find(|k| k.before == before && k.after == shown.entry)
                        .map(|k| k.reasons.iter().map(ToString::to_string).collect())
                        .filter(|k: &Vec<String>| !k.is_empty())
                        .unwrap_or_else(|| vec!["the same key (another trace of it)".to_string()]);
                    (other, key)
                }
                Against::PreviousRun => {
                    let previous = previous.as_ref()?;
                    (
                        previous.report.clone(),
                        previous_key_lines(previous, shown.entry),
                    )
                }
            };
            let diff = other.diff(&shown);
            let changed = diff.changed.iter().map(|c| c.after).collect();
            Some((
                key,
                diff_lines(&other, &shown, &diff),
                (diff.added, changed),
            ))
        })
    };
    Effect::new(move |_| {
        marks.set(
            compared
                .with(|c| c.as_ref().map(|(_, _, m)| m.clone()))
                .unwrap_or_default(),
        );
    });
    let entry = shown.entry;
    let body = move || {
        compared.with(|c| {
            c.as_ref()
                .map(|(key, lines, _)| diff_body(key.clone(), lines.clone()))
        })
    };
    view! {
        <div class="view diff">
            <h3>"Diff"</h3>
            <label class="meta">
                {format!("entry {entry} against ")}
                <select id="diff-against" on:change=move |ev| {
                    let value = event_target_value(&ev);
                    against.set(if value == PREVIOUS_RUN {
                        Some(Against::PreviousRun)
                    } else {
                        value.parse().ok().map(Against::Entry)
                    });
                }>
                    <option value="" selected=true>"(pick an entry or the previous run)"</option>
                    {previous_label.map(|label| view! { <option value=PREVIOUS_RUN>{label}</option> })}
                    {others
                        .into_iter()
                        .map(|e| view! { <option value=e.to_string()>{format!("entry {e}")}</option> })
                        .collect_view()}
                </select>
            </label>
            {body}
        </div>
    }
    .into_any()
}

fn diff_body(key: Vec<String>, lines: DiffLines) -> impl IntoView {
    let list = |class: &'static str, title: &'static str, items: Vec<String>| {
        let count = items.len();
        view! {
            <div class=format!("diff-part {class}")>
                <h4>{format!("{title} ({count})")}</h4>
                <ul>{items.into_iter().map(|i| view! { <li>{i}</li> }).collect_view()}</ul>
            </div>
        }
    };
    view! {
        <div class="diff-body">
            <div class="diff-part diff-key">
                <h4>"cache key"</h4>
                <ul>{key.into_iter().map(|k| view! { <li>{k}</li> }).collect_view()}</ul>
            </div>
            <p class="diff-peak">{lines.peak}</p>
            {list("diff-added", "added", lines.added)}
            {list("diff-removed", "removed", lines.removed)}
            {list("diff-changed", "changed", lines.changed)}
        </div>
    }
}
