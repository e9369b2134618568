//! The code editor: CodeMirror 6 (from `views.js`) in a Leptos element,
//! telling the page of every edit and of Ctrl+Enter, with the last run's
//! error marked at its line and column. The page decides when an edit runs.

use super::views::{create_editor, Editor};
use crate::report::ScriptError;
use leptos::prelude::*;
use wasm_bindgen::prelude::*;

/// The page's editor, once mounted.
#[derive(Clone, Copy)]
pub struct EditorHandle(StoredValue<Option<Editor>, LocalStorage>);

impl EditorHandle {
    /// A handle with no editor yet.
    pub fn new() -> EditorHandle {
        EditorHandle(StoredValue::new_local(None))
    }

    /// Shows `text` (an example loaded, not typing).
    pub fn set_text(self, text: &str) {
        self.0.with_value(|e| {
            if let Some(e) = e {
                e.set_text(text);
            }
        });
    }

    /// Marks `error` where it happened, or clears the mark.
    pub fn show_error(self, error: Option<&ScriptError>) {
        self.0.with_value(|e| {
            let Some(e) = e else { return };
            match error.and_then(|err| err.line.map(|line| (err, line))) {
                Some((err, line)) => {
                    e.mark_error(line as u32, err.column.unwrap_or(1) as u32, &err.message)
                }
                None => e.clear_error(),
            }
        });
    }

    /// Selects a script line.
    pub fn reveal_line(self, line: u32) {
        self.0.with_value(|e| {
            if let Some(e) = e {
                e.reveal_line(line);
            }
        });
    }
}

/// The editor element: mounts CodeMirror holding `script`'s text, keeps
/// `script` in step with typing, calls `edited` after each edit and `run`
/// on Ctrl+Enter.
pub fn editor_view(
    handle: EditorHandle,
    script: RwSignal<String>,
    edited: impl Fn() + 'static,
    run: impl Fn() + 'static,
) -> impl IntoView {
    let host = NodeRef::<leptos::html::Div>::new();
    host.on_load(move |element| {
        let on_change = Closure::<dyn Fn(String)>::new(move |text: String| {
            script.set(text);
            edited();
        });
        let on_run = Closure::<dyn Fn()>::new(run);
        let editor = create_editor(&element, &script.get_untracked(), &on_change, &on_run);
        // The callbacks live as long as the page does.
        on_change.forget();
        on_run.forget();
        handle.0.set_value(Some(editor));
    });
    view! { <div id="editor" node_ref=host></div> }
}
