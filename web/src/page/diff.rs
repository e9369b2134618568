//! The diff view: the shown cache entry against another entry of the same
//! function, picked in a list. It shows what differs between their cache
//! keys (Kiln's explanation, sent by the worker), the nodes added, removed
//! and changed ([`kiln::Report::diff`]) and the peak bytes before and
//! after; the graph marks the added and changed nodes.

use crate::report::KeyDiff;
use crate::view::{diff_lines, DiffLines};
use kiln::Report;
use leptos::prelude::*;
use std::sync::Arc;

/// The nodes of the shown entry the graph marks: (added, changed).
pub type DiffMarks = (Vec<usize>, Vec<usize>);

/// The diff view of `shown` against the other `entries` of its function
/// (nothing when it has no other); `marks` tells the graph what to mark.
pub fn diff_view(
    shown: Arc<Report>,
    entries: Vec<Arc<Report>>,
    key_diffs: Vec<KeyDiff>,
    marks: RwSignal<DiffMarks>,
) -> impl IntoView {
    let others: Vec<usize> = entries
        .iter()
        .map(|r| r.entry)
        .filter(|&e| e != shown.entry)
        .collect();
    if others.is_empty() {
        return ().into_any();
    }
    let against = RwSignal::new(None::<usize>);
    let compared = {
        let shown = shown.clone();
        Memo::new(move |_| {
            let before = against.get()?;
            let other = entries.iter().find(|r| r.entry == before)?;
            let diff = other.diff(&shown);
            let key: Vec<String> = key_diffs
                .iter()
                .find(|k| k.before == before && k.after == shown.entry)
                .map(|k| k.reasons.iter().map(ToString::to_string).collect())
                .unwrap_or_default();
            let changed = diff.changed.iter().map(|c| c.after).collect();
            Some((key, diff_lines(other, &shown, &diff), (diff.added, changed)))
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
            c.as_ref().map(|(key, lines, _)| {
                let key = if key.is_empty() {
                    vec!["the same key (another trace of it)".to_string()]
                } else {
                    key.clone()
                };
                diff_body(key, lines.clone())
            })
        })
    };
    view! {
        <div class="view diff">
            <h3>"Diff"</h3>
            <label class="meta">
                {format!("entry {entry} against ")}
                <select id="diff-against" on:change=move |ev| {
                    against.set(event_target_value(&ev).parse().ok());
                }>
                    <option value="" selected=true>"(pick an entry)"</option>
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
