//! The page half: a Leptos app that sends scripts to the worker and renders
//! the [`RunReport`]s it gets back. It derives nothing itself: every figure
//! comes from the report, arranged by [`crate::view`].

use super::diff::{diff_view, DiffMarks};
use super::editor::{editor_view, EditorHandle};
use super::graph::graph_view;
use super::kernels::kernels_view;
use super::worker::CPU_FIRST_WORKER;
use crate::backend::{BackendChoice, BackendStatus};
use crate::examples::{Example, EXAMPLES};
use crate::help::{code_spans, filter_help, help_sections, HelpSection, SCRIPT_API, SHORTCUTS};
use crate::protocol::{Request, Response};
use crate::report::{
    CallClock, Comparison, EntryKernels, FunctionReport, KeyDiff, PreviousRun, RunReport,
    ScriptError, Verification,
};
use crate::share::{encode_fragment, export_report, import_report, program_in_link};
use crate::view::{
    body_timelines, call_time, calls_summary, entry_leaves, human_bytes, miss_lines,
    reinplace_rows, round_ms, timeline, EntryScope, Selection, Timeline,
};
use kiln::{KernelList, LoopReport, Report};
use leptos::prelude::*;
use serde::Serialize;
use std::sync::Arc;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use web_sys::{
    Blob, BlobPropertyBag, HtmlAnchorElement, HtmlInputElement, MessageEvent, Url, Worker,
    WorkerOptions, WorkerType,
};

/// Mounts the app; called by `index.html` once the module is loaded.
#[wasm_bindgen]
pub fn start_ui() {
    leptos::mount::mount_to_body(App);
}

/// Milliseconds of quiet typing before an edited script runs by itself.
const RUN_AFTER_MS: u64 = 600;

/// Where the page remembers whether edits run by themselves.
const AUTO_RUN_KEY: &str = "kiln.autoRun";

/// Where the page stands with its worker.
#[derive(Clone, Debug, PartialEq)]
enum Status {
    Loading,
    Ready,
    Running,
    Stopped,
    /// Showing a report opened from a file.
    Imported,
    /// No worker could be started; a run tries again.
    Failed(String),
}

/// The signals every part of the page reads.
#[derive(Clone, Copy)]
struct Page {
    script: RwSignal<String>,
    example: RwSignal<&'static str>,
    report: RwSignal<Option<RunReport>>,
    /// The what-if comparison of the script last run, once asked for.
    comparison: RwSignal<Option<Vec<Comparison>>>,
    status: RwSignal<Status>,
    /// The worker's backends, once it said Ready.
    backend: RwSignal<Option<BackendStatus>>,
    /// The backend the user picked: kept across a restarted worker.
    chosen: RwSignal<Option<BackendChoice>>,
    /// What the Verify button found for the script last verified.
    verification: RwSignal<Option<Verification>>,
    /// The id of the latest request: older reports are stale.
    latest: RwSignal<u64>,
    /// The node or slot selected in any view of an entry, highlighted in
    /// all of that entry's views.
    selected: RwSignal<Option<(EntryScope, Selection)>>,
    worker: StoredValue<Option<Worker>, LocalStorage>,
    /// The worker opening WebGPU after Stop on it, which takes over once
    /// WebGPU is open (see [`Page::start_successor`]).
    successor: StoredValue<Option<Worker>, LocalStorage>,
    /// The successor's Ready, until it is adopted.
    successor_ready: StoredValue<Option<JsValue>, LocalStorage>,
    /// Whether the worker has said Ready (its handler is installed).
    ready: RwSignal<bool>,
    /// Whether a run waits for the worker to be ready.
    pending: RwSignal<bool>,
    /// What went wrong outside a script (a damaged link, a file that is
    /// not a report, a crashed worker): shown until the next run.
    notice: RwSignal<Option<String>>,
    /// Whether an edit runs the script after a pause in typing.
    auto_run: RwSignal<bool>,
    /// Counts edits and explicit runs: a pending run after a pause goes
    /// only if nothing happened since it was scheduled.
    edits: RwSignal<u64>,
    /// The id of the latest run started by a pause in typing.
    auto_request: RwSignal<u64>,
    /// The error of a run started by a pause in typing: held back (the
    /// views keep the last report) until an explicit run shows it.
    held: RwSignal<Option<ScriptError>>,
    /// Whether the help panel is open.
    help: RwSignal<bool>,
    editor: EditorHandle,
}

/// The first message to a worker (`worker.js`): this module, and the
/// relaxed-SIMD kernel module `index.html` compiled (null where it did
/// not).
fn worker_start_message() -> JsValue {
    let message = js_sys::Object::new();
    let kernel = js_sys::Reflect::get(&js_sys::global(), &"kilnRelaxedKernel".into())
        .ok()
        .filter(|kernel| !kernel.is_undefined())
        .unwrap_or(JsValue::NULL);
    for (key, value) in [("module", wasm_bindgen::module()), ("kernel", kernel)] {
        // Setting a property of a fresh plain object cannot fail.
        let _ = js_sys::Reflect::set(&message, &key.into(), &value);
    }
    message.into()
}

impl Page {
    /// Starts the worker that runs scripts (the one `index.html` started,
    /// the first time); `cpu_first` for one that must not touch WebGPU
    /// (see [`CPU_FIRST_WORKER`]).
    fn spawn_worker(self, cpu_first: bool) {
        let (worker, early) = match adopt_boot_worker() {
            Some(adopted) => adopted,
            None => match start_module_worker(cpu_first) {
                Ok(worker) => (worker, Early::default()),
                Err(e) => {
                    self.status.set(Status::Failed(e));
                    return;
                }
            },
        };
        self.install_worker(worker, early);
    }

    /// Makes `worker` the one that runs scripts: what it said before
    /// (`early`), then all it says, goes to the page's handler.
    fn install_worker(self, worker: Worker, early: Early) {
        let on_message = Closure::<dyn Fn(MessageEvent)>::new(move |event: MessageEvent| {
            match serde_wasm_bindgen::from_value::<Response>(event.data()) {
                Ok(Response::Ready { backend }) => {
                    let active = BackendChoice::of_backend(&backend.active);
                    let wanted = self
                        .chosen
                        .get_untracked()
                        .filter(|c| Some(*c) != active && backend.choices.contains(c));
                    self.backend.set(Some(backend));
                    self.ready.set(true);
                    // A restarted worker opens the default backend, and
                    // one started after Stop may offer WebGPU only later:
                    // switch back to the one picked. A run waiting for the
                    // worker goes after the switch; none is started.
                    if let Some(choice) = wanted {
                        self.post(&Request::SetBackend { backend: choice });
                        if self.status.get_untracked() == Status::Loading {
                            self.status.set(Status::Ready);
                            self.pending.set(true);
                        }
                        return;
                    }
                    if self.status.get_untracked() == Status::Loading {
                        self.status.set(Status::Ready);
                        self.pending.set(true);
                    }
                    // A run asked for while the worker was loading (the
                    // first example, or a run right after Stop) goes now.
                    if self.pending.get_untracked() {
                        self.run_pending();
                    }
                }
                Ok(Response::Report { id, report }) if id == self.latest.get_untracked() => {
                    // The run hit its limit while the GPU still worked: a
                    // fresh worker drops the device and that work.
                    if report.gpu_work_abandoned {
                        self.replace_worker();
                    }
                    self.status.set(Status::Ready);
                    if id == self.auto_request.get_untracked() && report.error.is_some() {
                        self.held.set(report.error);
                    } else {
                        self.held.set(None);
                        self.report.set(Some(report));
                    }
                }
                Ok(Response::Comparison { id, rows }) if id == self.latest.get_untracked() => {
                    self.comparison.set(Some(rows));
                    self.status.set(Status::Ready);
                }
                Ok(Response::Verified {
                    id,
                    report,
                    verification,
                }) if id == self.latest.get_untracked() => {
                    self.report.set(Some(report));
                    self.verification.set(Some(verification));
                    self.status.set(Status::Ready);
                }
                Ok(
                    Response::Report { .. }
                    | Response::Comparison { .. }
                    | Response::Verified { .. },
                ) => {}
                Err(e) => self.status.set(Status::Failed(format!(
                    "unreadable message from the worker: {e}"
                ))),
            }
        });
        worker.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
        // An uncaught error in the worker (a panic traps its module) leaves
        // it unable to answer: replace it.
        let on_error = Closure::<dyn Fn(web_sys::Event)>::new(move |event: web_sys::Event| {
            self.replace_worker();
            self.notice.set(Some(format!(
                "the worker running scripts crashed ({}); a fresh one was started: \
                 run the script again",
                error_message(&event)
            )));
        });
        worker.set_onerror(Some(on_error.as_ref().unchecked_ref()));
        self.worker.set_value(Some(worker));
        self.ready.set(false);
        // What the worker said before it was adopted, in order, then the
        // first error it had (which replaces it).
        let handle: &js_sys::Function = on_message.as_ref().unchecked_ref();
        for event in early.messages {
            if let Err(e) = handle.call1(&JsValue::NULL, &event) {
                self.status.set(Status::Failed(format!(
                    "cannot read the worker's message: {e:?}"
                )));
            }
        }
        if let Some(error) = early.errors.into_iter().next() {
            let handle: &js_sys::Function = on_error.as_ref().unchecked_ref();
            if let Err(e) = handle.call1(&JsValue::NULL, &error) {
                self.status.set(Status::Failed(format!(
                    "cannot read the worker's error: {e:?}"
                )));
            }
        }
        // The handlers live as long as the worker does.
        on_message.forget();
        on_error.forget();
    }

    /// Runs the editor's script now (Run, Ctrl+Enter, an example): a run
    /// scheduled by a pause in typing is dropped, so the script runs once.
    fn run(self) {
        self.notice.set(None);
        self.run_pending();
    }

    /// Runs the run that waited for the worker (the first example, a run
    /// asked for right after Stop or a crash). Unlike [`Page::run`] it is no
    /// act of the user's, so a notice about the link or the crash stays.
    fn run_pending(self) {
        self.edits.update(|n| *n += 1);
        self.run_script(false);
    }

    /// Called after every edit: runs the script once typing has paused for
    /// [`RUN_AFTER_MS`], when runs after a pause are on.
    fn edited(self) {
        self.edits.update(|n| *n += 1);
        let generation = self.edits.get_untracked();
        set_timeout(
            move || {
                if self.edits.get_untracked() == generation && self.auto_run.get_untracked() {
                    self.run_script(true);
                }
            },
            std::time::Duration::from_millis(RUN_AFTER_MS),
        );
    }

    /// Switches runs after a pause on or off, remembered across visits.
    fn set_auto_run(self, on: bool) {
        self.auto_run.set(on);
        if let Ok(Some(storage)) = window().local_storage() {
            storage
                .set_item(AUTO_RUN_KEY, if on { "on" } else { "off" })
                .ok();
        }
    }

    /// Runs the script; `auto` when a pause in typing started it (its
    /// error, if any, is held back).
    fn run_script(self, auto: bool) {
        if self.worker.with_value(Option::is_none) {
            self.spawn_worker(false);
        }
        // A message posted before the worker's handler is installed is
        // lost: wait for its Ready.
        if !self.ready.get_untracked() {
            self.pending.set(true);
            return;
        }
        self.pending.set(false);
        let script = self.script.get_untracked();
        // The link in the address bar always carries the program run last.
        if let Ok(history) = window().history() {
            let fragment = encode_fragment(&script);
            history
                .replace_state_with_url(&JsValue::NULL, "", Some(&fragment))
                .ok();
        }
        self.comparison.set(None);
        self.verification.set(None);
        self.send(|id| Request::Run { id, script });
        if auto {
            self.auto_request.set(self.latest.get_untracked());
        }
    }

    /// Runs the editor's script on the active backend and on the CPU, and
    /// shows the largest difference.
    fn verify(self) {
        if self.ready.get_untracked() {
            let script = self.script.get_untracked();
            self.verification.set(None);
            self.send(|id| Request::Verify { id, script });
        }
    }

    /// Switches the worker to `choice`, then re-runs the script there.
    fn choose_backend(self, choice: BackendChoice) {
        self.chosen.set(Some(choice));
        if self.ready.get_untracked() {
            self.pending.set(true);
            self.verification.set(None);
            self.send(|_| Request::SetBackend { backend: choice });
        }
    }

    /// Runs the what-if variants of the editor's script.
    fn compare(self) {
        if self.ready.get_untracked() {
            let script = self.script.get_untracked();
            self.send(|id| Request::Compare { id, script });
        }
    }

    /// Posts the request `make` builds with a fresh id.
    fn send(self, make: impl FnOnce(u64) -> Request) {
        let id = self.latest.get_untracked() + 1;
        self.latest.set(id);
        if self.post(&make(id)) {
            self.status.set(Status::Running);
        }
    }

    /// Posts `request` to the worker; whether it went. Unlike
    /// [`Page::send`] it starts nothing the page waits for: a run under
    /// way stays the latest.
    fn post(self, request: &Request) -> bool {
        let message = match request.serialize(&serde_wasm_bindgen::Serializer::json_compatible()) {
            Ok(message) => message,
            Err(e) => {
                self.status.set(Status::Failed(e.to_string()));
                return false;
            }
        };
        self.worker.with_value(|worker| match worker {
            Some(worker) => match worker.post_message(&message) {
                Ok(()) => true,
                Err(e) => {
                    self.status.set(Status::Failed(format!("{e:?}")));
                    false
                }
            },
            None => false,
        })
    }

    /// Ends a run at once: the worker is terminated (a script cannot be
    /// interrupted from outside) and a fresh one started, so compile
    /// caches start empty.
    fn stop(self) {
        self.edits.update(|n| *n += 1);
        self.pending.set(false);
        self.replace_worker();
        self.status.set(Status::Stopped);
    }

    /// Terminates the worker and starts a fresh one; requests still
    /// unanswered are dropped. Where the worker ran on WebGPU, GPU work it
    /// submitted may still run (no browser cancels it), and until it is
    /// done the first WebGPU call of any thread blocks that thread: the
    /// fresh worker runs scripts on the CPU without touching WebGPU, while
    /// a successor opens WebGPU and takes over once it is open.
    fn replace_worker(self) {
        let on_gpu = self.backend.with_untracked(|b| {
            b.as_ref()
                .and_then(|b| BackendChoice::of_backend(&b.active))
                == Some(BackendChoice::Webgpu)
        });
        // A successor still opening WebGPU: the GPU may still be busy.
        let gpu_busy = on_gpu || self.successor.with_value(Option::is_some);
        terminate_held(self.worker);
        // Answers of the old worker, were any still in flight, are stale.
        self.latest.update(|id| *id += 1);
        self.held.set(None);
        self.backend.set(None);
        self.spawn_worker(gpu_busy);
        if on_gpu {
            // Back to WebGPU once it reopens, unless the user picks.
            if self.chosen.get_untracked().is_none() {
                self.chosen.set(Some(BackendChoice::Webgpu));
            }
            self.start_successor();
        }
        self.status.set(Status::Stopped);
    }

    /// Starts the worker that takes over once WebGPU opens again: its
    /// first WebGPU call blocks it until the GPU has finished a stopped
    /// run's work, which never holds up the scripts the worker in place
    /// runs on the CPU meanwhile. Its Ready waits in
    /// [`Page::successor_ready`] until no request is in flight
    /// ([`Page::adopt_successor`]).
    fn start_successor(self) {
        terminate_held(self.successor);
        self.successor_ready.set_value(None);
        let successor = match start_module_worker(false) {
            Ok(successor) => successor,
            Err(e) => {
                self.successor.set_value(None);
                self.notice.set(Some(format!("WebGPU cannot reopen: {e}")));
                return;
            }
        };
        // Until it is adopted the successor says one thing: Ready.
        let on_ready = Closure::<dyn Fn(MessageEvent)>::new(move |event: MessageEvent| {
            self.successor_ready.set_value(Some(event.into()));
            self.adopt_successor();
        });
        let on_error = Closure::<dyn Fn(web_sys::Event)>::new(move |event: web_sys::Event| {
            terminate_held(self.successor);
            self.successor.set_value(None);
            self.successor_ready.set_value(None);
            self.notice.set(Some(format!(
                "WebGPU cannot reopen: the worker opening it failed ({})",
                error_message(&event)
            )));
        });
        successor.set_onmessage(Some(on_ready.as_ref().unchecked_ref()));
        successor.set_onerror(Some(on_error.as_ref().unchecked_ref()));
        // The handlers live as long as the successor does.
        on_ready.forget();
        on_error.forget();
        self.successor.set_value(Some(successor));
    }

    /// Puts the successor, once it said Ready, in the place of the worker
    /// answering on the CPU, unless a request is in flight (then this is
    /// called again when the page is idle).
    fn adopt_successor(self) {
        if self.status.get_untracked() == Status::Running
            || self.successor_ready.with_value(Option::is_none)
        {
            return;
        }
        let (mut successor, mut ready) = (None, None);
        self.successor.update_value(|held| successor = held.take());
        self.successor_ready
            .update_value(|held| ready = held.take());
        let (Some(successor), Some(ready)) = (successor, ready) else {
            return;
        };
        terminate_held(self.worker);
        self.latest.update(|id| *id += 1);
        self.backend.set(None);
        self.install_worker(
            successor,
            Early {
                messages: vec![ready],
                errors: Vec::new(),
            },
        );
    }

    /// Saves the shown report as `kiln-report.json`.
    fn export(self) -> Result<(), JsValue> {
        let Some(report) = self.report.get_untracked() else {
            return Ok(());
        };
        let json = export_report(&report).map_err(|e| JsValue::from_str(&e))?;
        let options = BlobPropertyBag::new();
        options.set_type("application/json");
        let parts = js_sys::Array::of1(&JsValue::from_str(&json));
        let blob = Blob::new_with_str_sequence_and_options(&parts, &options)?;
        let url = Url::create_object_url_with_blob(&blob)?;
        let anchor: HtmlAnchorElement = document().create_element("a")?.dyn_into()?;
        anchor.set_href(&url);
        anchor.set_download("kiln-report.json");
        anchor.click();
        Url::revoke_object_url(&url)
    }

    /// Shows a report from an exported file instead of a run's.
    fn import(self, input: HtmlInputElement) {
        let Some(file) = input.files().and_then(|files| files.get(0)) else {
            return;
        };
        leptos::task::spawn_local(async move {
            let text = JsFuture::from(file.text()).await;
            match text.ok().and_then(|t| t.as_string()) {
                Some(json) => match import_report(&json) {
                    Ok(report) => {
                        // A run still under way, or one scheduled by a
                        // pause in typing, must not replace it.
                        self.latest.update(|id| *id += 1);
                        self.edits.update(|n| *n += 1);
                        self.example.set("");
                        self.editor.set_text(&report.script);
                        self.script.set(report.script.clone());
                        self.held.set(None);
                        self.notice.set(None);
                        self.report.set(Some(report));
                        self.status.set(Status::Imported);
                    }
                    Err(e) => self
                        .notice
                        .set(Some(format!("cannot open the report: {e}"))),
                },
                None => self
                    .notice
                    .set(Some("cannot read the chosen file".to_string())),
            }
            // The same file chosen again is a change too.
            input.set_value("");
        });
    }

    fn load_example(self, example: &'static Example) {
        self.example.set(example.id);
        self.script.set(example.script.to_string());
        self.editor.set_text(example.script);
        self.run();
    }
}

/// Terminates the worker `held` holds, if any (it stays held).
fn terminate_held(held: StoredValue<Option<Worker>, LocalStorage>) {
    held.with_value(|worker| {
        if let Some(worker) = worker {
            worker.terminate();
        }
    });
}

/// The message of a worker's error event.
fn error_message(event: &web_sys::Event) -> String {
    js_sys::Reflect::get(event, &"message".into())
        .ok()
        .and_then(|m| m.as_string())
        .unwrap_or_else(|| "no message".to_string())
}

/// Starts `worker.js` on the page's module; named [`CPU_FIRST_WORKER`]
/// where `cpu_first`.
fn start_module_worker(cpu_first: bool) -> Result<Worker, String> {
    let options = WorkerOptions::new();
    options.set_type(WorkerType::Module);
    if cpu_first {
        options.set_name(CPU_FIRST_WORKER);
    }
    let worker = Worker::new_with_options("./worker.js", &options)
        .map_err(|e| format!("cannot start the worker: {e:?}"))?;
    // The worker instantiates the page's own compiled module rather than
    // fetching and compiling it again (`worker.js` waits for it), and the
    // relaxed-SIMD kernel where `index.html` loaded it.
    if let Err(e) = worker.post_message(&worker_start_message()) {
        worker.terminate();
        return Err(format!("cannot hand the module to the worker: {e:?}"));
    }
    Ok(worker)
}

/// What a worker sent before the page listened: its messages, in order,
/// and its errors.
#[derive(Default)]
struct Early {
    messages: Vec<JsValue>,
    errors: Vec<JsValue>,
}

/// The worker `index.html` started beside the page (see there), with what
/// it sent before this page could listen, once: later workers (after Stop
/// or a crash) are the page's own.
fn adopt_boot_worker() -> Option<(Worker, Early)> {
    let global = js_sys::global();
    let key = JsValue::from_str("kilnBootWorker");
    let boot = js_sys::Reflect::get(&global, &key).ok()?;
    if boot.is_undefined() || boot.is_null() {
        return None;
    }
    js_sys::Reflect::delete_property(&global, &key).ok()?;
    let worker: Worker = js_sys::Reflect::get(&boot, &"worker".into())
        .ok()?
        .dyn_into()
        .ok()?;
    let list = |name: &str| {
        js_sys::Reflect::get(&boot, &name.into())
            .ok()
            .and_then(|list| list.dyn_into::<js_sys::Array>().ok())
            .map(|list| list.iter().collect())
            .unwrap_or_default()
    };
    let early = Early {
        messages: list("early"),
        errors: list("errors"),
    };
    Some((worker, early))
}

#[component]
fn App() -> impl IntoView {
    let first = &EXAMPLES[0];
    // A share link's program wins over the first example; a damaged one
    // is said so.
    let hash = window().location().hash().unwrap_or_default();
    let (shared, notice) = match program_in_link(&hash) {
        Ok(shared) => (shared, None),
        Err(e) => (None, Some(e)),
    };
    let (script, example) = match shared {
        Some(script) => (script, ""),
        None => (first.script.to_string(), first.id),
    };
    let auto_run = window()
        .local_storage()
        .ok()
        .flatten()
        .and_then(|storage| storage.get_item(AUTO_RUN_KEY).ok().flatten())
        .is_none_or(|value| value != "off");
    let page = Page {
        script: RwSignal::new(script),
        example: RwSignal::new(example),
        report: RwSignal::new(None),
        comparison: RwSignal::new(None),
        status: RwSignal::new(Status::Loading),
        backend: RwSignal::new(None),
        chosen: RwSignal::new(None),
        verification: RwSignal::new(None),
        latest: RwSignal::new(0),
        selected: RwSignal::new(None),
        worker: StoredValue::new_local(None),
        successor: StoredValue::new_local(None),
        successor_ready: StoredValue::new_local(None),
        ready: RwSignal::new(false),
        pending: RwSignal::new(false),
        notice: RwSignal::new(notice),
        auto_run: RwSignal::new(auto_run),
        edits: RwSignal::new(0),
        auto_request: RwSignal::new(0),
        held: RwSignal::new(None),
        help: RwSignal::new(false),
        editor: EditorHandle::new(),
    };
    page.spawn_worker(false);
    // A successor ready while a request was in flight takes over after it.
    Effect::new(move |_| {
        if page.status.get() != Status::Running {
            page.adopt_successor();
        }
    });
    let status_text = move || match page.status.get() {
        Status::Loading => "loading".to_string(),
        Status::Ready => "ready".to_string(),
        Status::Running => "running…".to_string(),
        Status::Stopped => "stopped".to_string(),
        Status::Imported => "showing an imported report".to_string(),
        Status::Failed(e) => format!("failed: {e}"),
    };
    // The last run's error is marked in the editor.
    Effect::new(move |_| {
        page.report.with(|r| {
            page.editor
                .show_error(r.as_ref().and_then(|r| r.error.as_ref()))
        });
    });
    let explanation = move || {
        EXAMPLES
            .iter()
            .find(|e| e.id == page.example.get())
            .map(|e| e.explanation)
            .unwrap_or_default()
    };
    view! {
        <header>
            <h1>"Kiln playground"</h1>
            {move || backend_controls(page)}
            <span id="status">{status_text}</span>
            <button id="run" on:click=move |_| page.run()>"Run (Ctrl+Enter)"</button>
            <button id="stop" on:click=move |_| page.stop()>"Stop"</button>
            <button id="verify" title="Run the same script on the CPU and compare" on:click=move |_| page.verify()>
                "Verify"
            </button>
            <span id="verification">
                {move || page.verification.get().map(|v| v.summary())}
            </span>
            <button
                id="export"
                on:click=move |_| {
                    if let Err(e) = page.export() {
                        page.status.set(Status::Failed(format!("export failed: {e:?}")));
                    }
                }
            >
                "Export report"
            </button>
            <label class="auto-run" title="Run the script after a pause in typing">
                <input
                    id="auto-run"
                    type="checkbox"
                    prop:checked=move || page.auto_run.get()
                    on:change=move |ev| page.set_auto_run(event_target_checked(&ev))
                />
                " run after a pause"
            </label>
            <button id="help-toggle" aria-expanded=move || page.help.get().to_string()
                on:click=move |_| page.help.update(|open| *open = !*open)>
                "Help"
            </button>
            <label class="import">
                "Open report "
                <input
                    id="import"
                    type="file"
                    accept=".json,application/json"
                    on:change=move |ev| page.import(event_target::<HtmlInputElement>(&ev))
                />
            </label>
        </header>
        {move || page.notice.get().map(|n| view! { <div id="notice" class="notice" role="alert">{n}</div> })}
        <main>
            <section id="left">
                <nav id="examples">
                    {EXAMPLES
                        .iter()
                        .map(|e| {
                            view! {
                                <button
                                    class="example"
                                    data-id=e.id
                                    class:active=move || page.example.get() == e.id
                                    on:click=move |_| page.load_example(e)
                                >
                                    {e.title}
                                </button>
                            }
                        })
                        .collect_view()}
                </nav>
                <p id="explanation">{explanation}</p>
                <p id="how-to" class="meta">
                    "Pick an example or write a script; Run (Ctrl+Enter) shows what Kiln did: \
                     outputs, cache, graph, reinplace decisions, memory. Click anything in a view \
                     to select it everywhere; Help lists every script function."
                </p>
                {editor_view(page.editor, page.script, move || page.edited(), move || page.run())}
                {move || page.held.get().map(|e| view! {
                    <p id="held" class="held">
                        {format!(
                            "the edited script fails{}; Run or Ctrl+Enter shows the error",
                            e.line.map(|l| format!(" at line {l}")).unwrap_or_default(),
                        )}
                    </p>
                })}
            </section>
            <section id="right">
                {move || page.report.get().map(|r| report_view(page, r))}
                <div class="view what-if">
                    <h3>"What if"</h3>
                    <button id="compare" on:click=move |_| page.compare()>
                        "Compare: fusion off, donation off, shapeless"
                    </button>
                    {move || page.comparison.get().map(comparison_view)}
                </div>
            </section>
        </main>
        {move || page.help.get().then(|| help_panel(page))}
    }
}

/// The help panel: how the page works, the keyboard shortcuts, and the
/// script API reference (`docs/script-api.md`, embedded at build time)
/// filtered by a search box.
fn help_panel(page: Page) -> impl IntoView {
    let sections = help_sections(SCRIPT_API);
    let query = RwSignal::new(String::new());
    let shown = move || filter_help(&sections, &query.get());
    view! {
        <aside id="help-panel" role="dialog" aria-label="Help"
            on:keydown=move |ev| if ev.key() == "Escape" { page.help.set(false) }>
            <div class="help-head">
                <h2>"Help"</h2>
                <button id="help-close" title="Close (Esc)" on:click=move |_| page.help.set(false)>"×"</button>
            </div>
            <h3>"How to use"</h3>
            <p>
                "Run or Ctrl+Enter runs the script and shows any error. With \u{201c}run after a \
                 pause\u{201d} on, an edit also runs it once typing pauses; the error of such \
                 a run is held back (the views keep the last good run) until you run it. \
                 Each compiled function shows its calls, its cache (click an entry to show \
                 its views), the graph (click a box or a fused group for its details), the \
                 reinplace decisions and the slot timeline (hover a bar for its value)."
            </p>
            <h3>"Keyboard and pointer"</h3>
            <table id="help-shortcuts">
                {SHORTCUTS
                    .iter()
                    .map(|(keys, what)| view! { <tr><th><kbd>{*keys}</kbd></th><td>{*what}</td></tr> })
                    .collect_view()}
            </table>
            <h3>"Script API"</h3>
            <input id="help-search" type="search" placeholder="search functions, methods, operators"
                prop:value=move || query.get()
                on:input=move |ev| query.set(event_target_value(&ev))/>
            <div id="help-sections">
                {move || {
                    let found = shown();
                    if found.is_empty() {
                        return view! { <p class="meta">"nothing found"</p> }.into_any();
                    }
                    found.into_iter().map(help_section).collect_view().into_any()
                }}
            </div>
        </aside>
    }
}

fn help_section(section: HelpSection) -> impl IntoView {
    view! {
        <section class="help-section">
            <h4>{section.title}</h4>
            {section.text.iter().map(|t| view! { <p>{markdown_code(t)}</p> }).collect_view()}
            <ul>
                {section
                    .entries
                    .into_iter()
                    .map(|e| view! {
                        <li class="help-entry" data-name=e.name.clone()>
                            <code class="name">{e.name.clone()}</code>": "{markdown_code(&e.text)}
                        </li>
                    })
                    .collect_view()}
            </ul>
        </section>
    }
}

/// Markdown text with its code spans set in `<code>`.
fn markdown_code(text: &str) -> impl IntoView {
    code_spans(text)
        .into_iter()
        .map(|(code, part)| {
            let part = part.to_string();
            if code {
                view! { <code>{part}</code> }.into_any()
            } else {
                part.into_any()
            }
        })
        .collect_view()
}

/// The header's backend: what runs, the adapter, and the switch.
fn backend_controls(page: Page) -> impl IntoView {
    let Some(status) = page.backend.get() else {
        return view! { <span id="backend">"backend: …"</span> }.into_any();
    };
    let active = BackendChoice::of_backend(&status.active);
    let note = match &status.unavailable {
        Some(why) => format!("{why}\n{}", status.cpu_products()),
        None => status.cpu_products().to_string(),
    };
    let choices = status.choices.clone();
    view! {
        <span id="backend" title=note>"backend: " {status.label()}</span>
        <select
            id="backend-choice"
            on:change=move |ev| {
                let choice = match event_target_value(&ev).as_str() {
                    "webgpu" => BackendChoice::Webgpu,
                    _ => BackendChoice::Cpu,
                };
                page.choose_backend(choice);
            }
        >
            {choices
                .into_iter()
                .map(|c| {
                    let value = match c {
                        BackendChoice::Webgpu => "webgpu",
                        BackendChoice::Cpu => "cpu",
                    };
                    view! { <option value=value selected=active == Some(c)>{c.label()}</option> }
                })
                .collect_view()}
        </select>
    }
    .into_any()
}

fn report_view(page: Page, report: RunReport) -> impl IntoView {
    let error = report.error.clone().map(|e| {
        view! { <div id="error" class="error">{e.to_string()}</div> }
    });
    // Which request this report answers (the latest when it came): tests
    // wait for a new one rather than read a view the last run left.
    let request = page.latest.get_untracked().to_string();
    view! {
        {error}
        <div id="outputs" class="view" data-report=request>
            <h2>"Outputs"</h2>
            <p class="meta">
                {format!(
                    "{} ms on {}",
                    round_ms(report.total_ms),
                    BackendChoice::of_backend(&report.backend)
                        .map_or(report.backend.as_str(), |c| c.label()),
                )}
            </p>
            {report
                .outputs
                .iter()
                .map(|o| {
                    view! {
                        <div class="output">
                            <span class="label">{o.label.clone()}</span>
                            <pre>{o.text.clone()}</pre>
                        </div>
                    }
                })
                .collect_view()}
            {(!report.log.is_empty()).then(|| view! { <pre class="log">{report.log.join("\n")}</pre> })}
        </div>
        {report.functions.into_iter().map(|f| function_view(page, f, report.clock)).collect_view()}
    }
}

fn function_view(page: Page, function: FunctionReport, clock: CallClock) -> impl IntoView {
    let summary = calls_summary(&function.calls, clock);
    // Every call, drawn only once the list is opened: a loop of thousands
    // of calls costs nothing until asked for.
    let all_calls = function.calls.clone();
    let calls_open = RwSignal::new(false);
    let calls = move || {
        calls_open.get().then(|| {
            all_calls
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let text = format!("call {}: {}", i + 1, call_time(c, clock));
                    view! { <li>{text}</li> }
                })
                .collect_view()
        })
    };
    // The entry whose views are shown: the latest, or the one picked in
    // the cache view.
    let reports = function.cache.reports.clone();
    let kernels = function.kernels.clone();
    let key_diffs = function.key_diffs.clone();
    let previous = function.previous.clone();
    let shown = RwSignal::new(reports.len().checked_sub(1));
    let line = function.line;
    view! {
        <div class="function">
            <h2>{format!("compile(…) at line {}", function.line)}</h2>
            <pre class="source">{function.source.clone()}</pre>
            <p class="meta">
                {format!(
                    "shapeless: {}, fusion: {}, donated: [{}]",
                    function.shapeless,
                    function.fusion,
                    function.donate.join(", "),
                )}
            </p>
            // `open` follows the signal: the page patches the last run's
            // elements in place, and a list the user opened there must
            // not stay open (and empty) for the next run's function.
            <details class="calls" prop:open=move || calls_open.get()
                on:toggle=move |ev| calls_open.set(event_target::<web_sys::HtmlDetailsElement>(&ev).open())>
                <summary class="calls-summary">{summary}</summary>
                <ol class="calls">{calls}</ol>
            </details>
            <div class="dashboard">
                {cache_view(&function, shown)}
                {move || {
                    let report = (**reports.get(shown.get()?)?).clone();
                    let scope = EntryScope { line, entry: report.entry };
                    let listed = kernels.iter().find(|k| k.entry == report.entry).cloned();
                    let family = Family {
                        entries: reports.clone(),
                        key_diffs: key_diffs.clone(),
                        previous: previous.clone(),
                    };
                    Some(entry_views(page, scope, report, listed, family, clock))
                }}
            </div>
        </div>
    }
}

/// The cache view; clicking an entry shows its views (`shown`).
fn cache_view(function: &FunctionReport, shown: RwSignal<Option<usize>>) -> impl IntoView {
    let cache = &function.cache;
    view! {
        <div class="view cache">
            <h3>"Cache"</h3>
            <p class="summary">{cache.summary()}</p>
            <ol class="entries">
                {cache
                    .reports
                    .iter()
                    .enumerate()
                    .map(|(index, r)| {
                        let kind = if r.shapeless { "shapeless" } else { "static" };
                        view! {
                            <li class="entry" data-entry=r.entry
                                class:selected=move || shown.get() == Some(index)
                                on:click=move |_| shown.set(Some(index))>
                                {format!("entry {} ({kind}): {}", r.entry, r.input_tree)}
                                <span class="leaves">{entry_leaves(r).join(", ")}</span>
                            </li>
                        }
                    })
                    .collect_view()}
            </ol>
            <ul class="misses">
                {miss_lines(cache).into_iter().map(|l| view! { <li class="miss">{l}</li> }).collect_view()}
            </ul>
        </div>
    }
}

/// The other entries of a function and its previous run, for the diff
/// view.
struct Family {
    entries: Vec<Arc<Report>>,
    key_diffs: Vec<KeyDiff>,
    previous: Option<PreviousRun>,
}

fn entry_views(
    page: Page,
    scope: EntryScope,
    report: Report,
    kernels: Option<EntryKernels>,
    family: Family,
    clock: CallClock,
) -> impl IntoView {
    let report = Arc::new(report);
    let marks = RwSignal::new(DiffMarks::default());
    let list = kernels.as_ref().and_then(|k| k.list.clone()).map(Arc::new);
    let marked = highlighted(page, scope, &report, list.clone());
    view! {
        <p class="shown-entry meta">
            {format!("entry {}: its graph, kernels, reinplace decisions and memory", scope.entry)}
        </p>
        {implicit_view(&report)}
        {vmap_view(&report)}
        {loops_view(&report)}
        {graph_view(page.selected, scope, report.clone(), list.clone(), marks, move |line| page.editor.reveal_line(line))}
        {diff_view(report.clone(), family.entries, family.key_diffs, family.previous, marks)}
        {kernels_view(page.selected, scope, report.clone(), kernels, clock)}
        {reinplace_view(page, scope, &report, marked)}
        {memory_view(page, scope, &report, marked)}
    }
}

/// The nodes and the slot `page`'s selection highlights in the views of
/// `scope`'s entry: a memo, so each view's marks follow it.
fn highlighted(
    page: Page,
    scope: EntryScope,
    report: &Arc<Report>,
    kernels: Option<Arc<KernelList>>,
) -> Marked {
    let report = report.clone();
    Memo::new(move |_| match page.selected.get() {
        Some((at, selection)) if at == scope => {
            let kernels = kernels.as_deref();
            (
                selection.nodes(&report, kernels),
                selection.slot(&report, kernels),
            )
        }
        _ => (Vec::new(), None),
    })
}

/// How implicit lowering resolved each op reading an implicit array: the
/// handler chosen, or the op that forced a materialization.
fn implicit_view(report: &Report) -> Option<impl IntoView> {
    if report.implicit.is_empty() {
        return None;
    }
    let materialized = report.materializations();
    let handled = report.implicit.len() - materialized;
    let lines: Vec<String> = report.implicit.iter().map(ToString::to_string).collect();
    Some(view! {
        <div class="view implicit">
            <h3>"Implicit arrays"</h3>
            <p class="implicit-summary">
                {format!("{handled} handled, {materialized} materialized")}
            </p>
            <ul>{lines.into_iter().map(|l| view! { <li class="decision">{l}</li> }).collect_view()}</ul>
        </div>
    })
}

/// The ops `vmap` ran once per example (no batching rule for their
/// operands) and the implicit values it materialized: a loop or a dense
/// value hidden in a batched program, shown.
fn vmap_view(report: &Report) -> Option<impl IntoView> {
    if report.vmap_fallbacks.is_empty() && report.vmap_materialized.is_empty() {
        return None;
    }
    let loops = report.vmap_fallbacks.iter().map(|f| {
        format!(
            "{} runs once per example ({}×): {}",
            f.op, f.examples, f.reason
        )
    });
    let dense = report
        .vmap_materialized
        .iter()
        .map(|m| format!("{} is materialized: {}", m.value, m.reason));
    let lines: Vec<String> = loops.chain(dense).collect();
    Some(view! {
        <div class="view vmap-fallbacks">
            <h3>"vmap fallbacks"</h3>
            <ul>{lines.into_iter().map(|l| view! { <li class="decision">{l}</li> }).collect_view()}</ul>
        </div>
    })
}

/// Every control-flow node with its trip count and its bodies, each
/// planned once: how every carry moves between iterations (in one buffer,
/// or double-buffered and why), the body's peak, and its nodes in an
/// expandable list.
fn loops_view(report: &Report) -> Option<impl IntoView> {
    if report.loops.is_empty() {
        return None;
    }
    let summary = format!(
        "planned peak with the loop bodies: {} (each body planned once, reused by every \
         iteration)",
        human_bytes(report.total_peak_bytes())
    );
    Some(view! {
        <div class="view loops">
            <h3>"Loops"</h3>
            <p class="loops-summary meta">{summary}</p>
            {report.loops.iter().map(loop_view).collect_view()}
        </div>
    })
}

/// One control-flow node and its bodies (nested loops inside them too).
fn loop_view(l: &LoopReport) -> AnyView {
    let head = match &l.trip_count {
        Some(n) => format!("%{} {}: {n} iterations", l.node, l.op),
        None => format!("%{} {}", l.node, l.op),
    };
    let bodies = l
        .bodies
        .iter()
        .map(|b| {
            let title = format!(
                "{}: {} nodes, peak {}",
                b.name,
                b.nodes.len(),
                human_bytes(b.plan.memory.peak_bytes)
            );
            let carried = b
                .carried
                .iter()
                .map(|c| {
                    let text = format!("carry[{}] {}: {}", c.carry, c.aval, c.detail);
                    view! { <li class="carried" class:in-place=c.in_place class:double-buffered=!c.in_place>{text}</li> }
                })
                .collect_view();
            let nodes = b
                .nodes
                .iter()
                .map(|n| {
                    let text = format!("%{} {} → {} @ {}", n.id, n.op, n.aval, n.home);
                    view! { <li class="body-node">{text}</li> }
                })
                .collect_view();
            let nested = b.loops.iter().map(loop_view).collect_view();
            view! {
                <details class="loop-body" open=true>
                    <summary>{title}</summary>
                    <ul class="carries">{carried}</ul>
                    <ol class="body-nodes" start="0">{nodes}</ol>
                    {nested}
                </details>
            }
        })
        .collect_view();
    view! {
        <div class="loop" data-node=l.node>
            <p class="loop-head">{head}</p>
            {bodies}
        </div>
    }
    .into_any()
}

/// What the selection marks in an entry's views: (nodes, slot).
type Marked = Memo<(Vec<usize>, Option<usize>)>;

fn reinplace_view(page: Page, scope: EntryScope, report: &Report, marked: Marked) -> impl IntoView {
    let rows = reinplace_rows(report);
    view! {
        <div class="view reinplace">
            <h3>"Reinplace decisions"</h3>
            <table>
                <tr><th>"node"</th><th>"operand"</th><th>"verdict"</th></tr>
                {rows
                    .into_iter()
                    .map(|r| {
                        let node = r.node;
                        let verdict = match r.reader {
                            Some(reader) => view! {
                                <a class="reader" href="#" data-reader=reader
                                    on:click=move |ev| {
                                        ev.prevent_default();
                                        // Not the row's own selection.
                                        ev.stop_propagation();
                                        page.selected.set(Some((scope, Selection::Node(reader))));
                                    }>
                                    {format!("ReadLater: {}", r.verdict)}
                                </a>
                            }.into_any(),
                            None => view! { <span>{r.verdict.clone()}</span> }.into_any(),
                        };
                        view! {
                            <tr data-node=node
                                class:selected=move || marked.with(|(nodes, _)| nodes.contains(&node))
                                on:click=move |_| page.selected.set(Some((scope, Selection::Node(node))))>
                                <td>{format!("%{} {}", r.node, r.op)}</td>
                                <td>{format!("%{} {}", r.operand, r.operand_op)}</td>
                                <td>{verdict}</td>
                            </tr>
                        }
                    })
                    .collect_view()}
            </table>
        </div>
    }
}

/// Pixels per slot row of the timeline (the steps share the box's width).
const ROW_H: usize = 22;
/// The most step numbers the timeline's axis prints.
const AXIS_TICKS: usize = 10;

/// The slot timeline, fitted to its box: slot labels in a column of their
/// own, the bars in an SVG whose x axis is the schedule scaled to the
/// width left (one unit per step), a step axis under it, a legend, and a
/// tooltip per bar. Under it, each loop body's own timeline (one plan for
/// every iteration), folded.
fn memory_view(page: Page, scope: EntryScope, report: &Report, marked: Marked) -> impl IntoView {
    let t = timeline(report);
    let bodies = body_timelines(report);
    view! {
        <div class="view memory">
            <h3>"Memory"</h3>
            {plan_figures(&t)}
            <p class="legend">
                <span class="swatch value"></span>" a value, from the step defining it to its last read "
                <span class="swatch in-place"></span>" written in place (continues its operand's slot) "
                <span class="swatch selected"></span>" selected"
            </p>
            {timeline_chart(page, scope, t, marked, None)}
            {(!bodies.is_empty()).then(|| view! {
                <h4>"Loop bodies: one plan for every iteration"</h4>
                {bodies
                    .into_iter()
                    .map(|body| view! {
                        <details class="body-timeline" data-loop=body.loop_node>
                            <summary>{format!("{} · peak {}", body.title, human_bytes(body.timeline.peak_bytes))}</summary>
                            {plan_figures(&body.timeline)}
                            <ul class="carried">
                                {body.carried.into_iter().map(|line| view! { <li>{line}</li> }).collect_view()}
                            </ul>
                            {timeline_chart(page, scope, body.timeline, marked, Some((body.loop_node, body.top_level)))}
                        </details>
                    })
                    .collect_view()}
            })}
        </div>
    }
}

/// A plan's peak, lower bound and no-reuse bytes.
fn plan_figures(t: &Timeline) -> impl IntoView {
    view! {
        <p class="figures">
            <span class="peak" title=human_bytes(t.peak_bytes)>{format!("peak {} B", t.peak_bytes)}</span>
            " · "
            <span class="lower-bound" title=human_bytes(t.lower_bound_bytes)>{format!("lower bound {} B", t.lower_bound_bytes)}</span>
            " · "
            <span class="no-reuse" title=human_bytes(t.no_reuse_bytes)>{format!("no reuse {} B", t.no_reuse_bytes)}</span>
        </p>
    }
}

/// The slot labels, bars and step axis of `t`. The entry's own timeline
/// (`body` `None`) selects and marks values and slots; a body's (its loop
/// node, and whether that node is the entry's) selects the loop's node.
fn timeline_chart(
    page: Page,
    scope: EntryScope,
    t: Timeline,
    marked: Marked,
    body: Option<(usize, bool)>,
) -> impl IntoView {
    let steps = t.steps.max(1);
    let height = t.rows.len() * ROW_H;
    let ticks = t.axis_ticks(AXIS_TICKS);
    let labels: Vec<(usize, usize)> = t.rows.iter().map(|r| (r.slot, r.bytes)).collect();
    let own = body.is_none();
    // What clicking a value or a slot selects: in a body, its loop's node
    // when that node is the entry's (a nested loop's node is not).
    let select = move |selection: Selection| {
        let chosen = match body {
            None => Some(selection),
            Some((node, true)) => Some(Selection::Node(node)),
            Some((_, false)) => None,
        };
        if let Some(chosen) = chosen {
            page.selected.set(Some((scope, chosen)));
        }
    };
    view! {
        <div class="timeline">
            <div class="slot-labels">
                {labels
                    .into_iter()
                    .map(|(index, bytes)| view! {
                        <div class="slot-label" data-slot=index title=format!("{bytes} B")
                            class:selected=move || own && marked.with(|(_, s)| *s == Some(index))
                            on:click=move |_| select(Selection::Slot(index))>
                            {format!("slot {index} · {}", human_bytes(bytes))}
                        </div>
                    })
                    .collect_view()}
            </div>
            <div class="lanes">
                <svg class="bars" width="100%" height=height viewBox=format!("0 0 {steps} {height}")
                    preserveAspectRatio="none">
                    {t
                        .rows
                        .into_iter()
                        .enumerate()
                        .map(|(row, slot)| {
                            let y = row * ROW_H + 3;
                            let index = slot.slot;
                            slot.bars
                                .into_iter()
                                .map(|b| {
                                    let tip = b.tooltip(index, slot.bytes);
                                    let value = b.value;
                                    // A gap of a tenth of a step keeps
                                    // neighbouring lifetimes apart.
                                    let width = (b.last.saturating_sub(b.def) + 1) as f64 - 0.1;
                                    view! {
                                        <rect
                                            class="bar"
                                            class:in-place=b.in_place
                                            class:selected=move || own && marked.with(|(nodes, _)| nodes.contains(&value))
                                            data-value=value
                                            data-slot=index
                                            x=b.def y=y width=width height=ROW_H - 6
                                            on:click=move |_| select(Selection::Node(value))
                                        >
                                            <title>{tip}</title>
                                        </rect>
                                    }
                                })
                                .collect_view()
                        })
                        .collect_view()}
                </svg>
                <div class="axis">
                    {ticks
                        .into_iter()
                        .map(|step| {
                            let left = (step as f64 + 0.5) / steps as f64 * 100.0;
                            view! { <span class="tick" style=format!("left: {left:.3}%")>{step}</span> }
                        })
                        .collect_view()}
                </div>
                <p class="axis-title">"schedule step"</p>
            </div>
        </div>
    }
}

fn comparison_view(rows: Vec<Comparison>) -> impl IntoView {
    view! {
        <table class="comparison">
            <tr>
                <th>"variant"</th><th>"compile at line"</th><th>"nodes"</th>
                <th>"in place"</th><th>"peak B"</th><th>"lower bound B"</th><th>"no reuse B"</th>
            </tr>
            {rows
                .into_iter()
                .map(|row| {
                    let variant = row.variant.clone();
                    match row.error {
                        Some(e) => view! {
                            <tr data-variant=variant.clone()>
                                <td>{row.variant}</td><td colspan="6" class="error">{e.to_string()}</td>
                            </tr>
                        }
                        .into_any(),
                        None => row
                            .functions
                            .into_iter()
                            .map(|f| {
                                view! {
                                    <tr data-variant=variant.clone()>
                                        <td>{variant.clone()}</td>
                                        <td>{f.line}</td>
                                        <td class="nodes">{f.nodes}</td>
                                        <td class="reinplaced">{f.reinplaced}</td>
                                        <td class="peak">{f.memory.peak_bytes}</td>
                                        <td>{f.memory.lower_bound_bytes}</td>
                                        <td>{f.memory.no_reuse_bytes}</td>
                                    </tr>
                                }
                            })
                            .collect_view()
                            .into_any(),
                    }
                })
                .collect_view()}
        </table>
    }
}
