//! The code editor: CodeMirror 6 (from `views.js`) in a Leptos element,
//! running the script on Ctrl+Enter and after a pause in typing, with the
//! last run's error marked at its line and column.

use super::views::{create_editor, Editor};
use crate::report::ScriptError;
use leptos::prelude::*;
use wasm_bindgen::prelude::*;

/// Milliseconds of quiet typing before the script re-runs.
const RUN_AFTER_MS: u64 = 600;

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
/// `script` in step with typing and calls `run` on Ctrl+Enter and after
/// a pause in typing.
pub fn editor_view(
    handle: EditorHandle,
    script: RwSignal<String>,
    run: impl Fn() + Copy + 'static,
) -> impl IntoView {
    let host = NodeRef::<leptos::html::Div>::new();
    let typed = RwSignal::new(0u64);
    host.on_load(move |element| {
        let on_change = Closure::<dyn Fn(String)>::new(move |text: String| {
            script.set(text);
            // Runs after a pause in typing: only the last keystroke's
            // timer runs.
            let generation = typed.get_untracked() + 1;
            typed.set(generation);
            set_timeout(
                move || {
                    if typed.get_untracked() == generation {
                        run();
                    }
                },
                std::time::Duration::from_millis(RUN_AFTER_MS),
            );
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
