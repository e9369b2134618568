//! The Web Worker half: owns the [`Session`] (scripts, compile caches and
//! the backend) and answers each [`Request`] with a [`Response`].
//!
//! Scripts run on WebGPU through `kiln-wgpu` when the browser gives an
//! adapter, else on the CPU executor. A run's compiled calls and eager ops
//! leave their results on the GPU; the shown values are read back after
//! the script, while the worker yields ([`Session::run_async`]). Requests
//! are answered one at a time, in order.

use crate::backend::{AdapterInfo, BackendChoice, BackendStatus};
use crate::protocol::{Request, Response};
use crate::report::{CallClock, DeviceTime, RunReport};
use crate::script::{DeviceCallCounter, ScriptLimits, Session};
use crate::timed_cpu::TimedCpu;
use js_sys::{Function, Promise, Reflect};
use kiln::Device;
use kiln_wgpu::WgpuBackend;
use serde::Serialize;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{spawn_local, JsFuture};
use web_sys::{DedicatedWorkerGlobalScope, MessageEvent};

/// The name the page gives a worker it starts after Stop (or a crash)
/// while WebGPU ran: a stopped run's GPU work cannot be cancelled, and
/// until the GPU has finished it the browser blocks any thread that
/// touches WebGPU. Such a worker runs scripts on the CPU and never touches
/// WebGPU; the page replaces it by one that opened WebGPU meanwhile.
pub(super) const CPU_FIRST_WORKER: &str = "kiln-cpu-first";

/// Everything the worker keeps.
struct Worker {
    scope: DedicatedWorkerGlobalScope,
    /// Taken out while a request is answered (answers may await).
    session: RefCell<Option<Session>>,
    queue: RefCell<VecDeque<Request>>,
    /// Whether requests are being answered (or the backend opened).
    busy: Cell<bool>,
    gpu: RefCell<Option<WgpuBackend>>,
    /// The CPU executor, timing its steps.
    cpu: TimedCpu,
    adapter: RefCell<Option<AdapterInfo>>,
    unavailable: RefCell<Option<String>>,
    /// Whether it runs on the CPU while another worker opens WebGPU
    /// (a [`CPU_FIRST_WORKER`]).
    reopening: bool,
}

#[wasm_bindgen]
extern "C" {
    /// The relaxed-SIMD kernel module's `block_product`, which `worker.js`
    /// puts on the worker's global scope (instantiated on this module's
    /// memory) before it calls [`use_relaxed_kernel`].
    #[wasm_bindgen(js_namespace = globalThis, js_name = kilnRelaxedBlockProduct)]
    #[allow(clippy::too_many_arguments)]
    fn relaxed_block_product_js(
        a: usize,
        b: usize,
        depth: usize,
        height: usize,
        width: usize,
        c: usize,
        ldc: usize,
        add: u32,
        scratch: usize,
    );

    /// The relaxed-SIMD kernel module's `affine_codes_dot`, put beside
    /// [`relaxed_block_product_js`] by `worker.js`.
    #[wasm_bindgen(js_namespace = globalThis, js_name = kilnRelaxedAffineCodesDot)]
    fn relaxed_affine_codes_dot_js(
        bits: u32,
        words: usize,
        x: usize,
        scales: usize,
        groups: usize,
        group_words: usize,
    ) -> f32;
}

/// [`kiln::ops::relaxed::BlockProduct`] by the kernel module: this
/// module's memory is the one the kernel module imported, so the pointers
/// are its addresses.
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn relaxed_block_product(
    a: *const f32,
    b: *const f32,
    depth: usize,
    height: usize,
    width: usize,
    c: *mut f32,
    ldc: usize,
    add: u32,
    scratch: *mut f32,
) {
    relaxed_block_product_js(
        a as usize,
        b as usize,
        depth,
        height,
        width,
        c as usize,
        ldc,
        add,
        scratch as usize,
    );
}

/// [`kiln::ops::relaxed::AffineCodesDot`] by the kernel module, on this
/// module's addresses as [`relaxed_block_product`].
unsafe extern "C" fn relaxed_affine_codes_dot(
    bits: u32,
    words: *const u32,
    x: *const f32,
    scales: *const f32,
    groups: usize,
    group_words: usize,
) -> f32 {
    relaxed_affine_codes_dot_js(
        bits,
        words as usize,
        x as usize,
        scales as usize,
        groups,
        group_words,
    )
}

/// Runs the CPU executor's f32 products and affine quantized
/// matrix-vector products on the relaxed-SIMD kernel module from now on;
/// called by `worker.js` (before [`start_worker`]) where the page loaded
/// that module. Returns whether it took effect.
#[wasm_bindgen]
pub fn use_relaxed_kernel() -> bool {
    let kernels = kiln::ops::relaxed::RelaxedKernels {
        block_product: relaxed_block_product,
        affine_codes_dot: relaxed_affine_codes_dot,
    };
    // SAFETY: the globals are the kernel module's functions, instantiated
    // on this module's memory (`worker.js`), which keep their contracts
    // (`kiln-relaxed-kernel`).
    unsafe { kiln::ops::relaxed::use_relaxed_kernels(kernels) }
}

/// Starts answering the page's messages; called by `worker.js` once the
/// module is loaded. Requests that come while WebGPU is being opened wait
/// (a worker named [`CPU_FIRST_WORKER`] answers on the CPU at once).
#[wasm_bindgen]
pub fn start_worker() -> Result<(), JsValue> {
    let scope: DedicatedWorkerGlobalScope = js_sys::global().dyn_into()?;
    let cpu_first = scope.name() == CPU_FIRST_WORKER;
    let worker = Rc::new(Worker {
        scope: scope.clone(),
        session: RefCell::new(Some(Session::new())),
        queue: RefCell::default(),
        busy: Cell::new(true),
        gpu: RefCell::new(None),
        cpu: TimedCpu::default(),
        adapter: RefCell::new(None),
        unavailable: RefCell::new(None),
        reopening: cpu_first,
    });
    let on_message = {
        let worker = worker.clone();
        Closure::<dyn Fn(MessageEvent)>::new(move |event: MessageEvent| {
            match serde_wasm_bindgen::from_value::<Request>(event.data()) {
                Ok(request) => {
                    worker.queue.borrow_mut().push_back(request);
                    if !worker.busy.get() {
                        spawn_local(answer_queued(worker.clone()));
                    }
                }
                Err(e) => console_error(&format!("kiln worker: unreadable request: {e}")),
            }
        })
    };
    scope.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    // The handler lives as long as the worker.
    on_message.forget();
    if cpu_first {
        spawn_local(start_answering(worker, BackendChoice::Cpu));
    } else {
        spawn_local(open_webgpu_and_answer(worker));
    }
    Ok(())
}

/// Opens WebGPU (its first call may block until the GPU is free), then
/// answers on it, or on the CPU where it did not open.
async fn open_webgpu_and_answer(worker: Rc<Worker>) {
    match open_webgpu().await {
        Ok((gpu, adapter)) => {
            // Calls are timed on the GPU where the adapter writes
            // timestamps.
            gpu.set_gpu_timing(true);
            *worker.gpu.borrow_mut() = Some(gpu);
            *worker.adapter.borrow_mut() = Some(adapter);
        }
        Err(reason) => *worker.unavailable.borrow_mut() = Some(reason),
    }
    start_answering(worker, BackendChoice::Webgpu).await;
}

/// Says Ready on `choice` (the CPU where WebGPU is missing) and answers the
/// requests that waited.
async fn start_answering(worker: Rc<Worker>, choice: BackendChoice) {
    if worker.reopening {
        *worker.unavailable.borrow_mut() = Some(
            "the GPU is finishing the stopped run's work (a browser cannot cancel submitted GPU \
             work): scripts run on the CPU until WebGPU reopens"
                .to_string(),
        );
    }
    let counter = worker.use_backend(choice);
    if let Some(session) = worker.session.borrow_mut().as_mut() {
        session.count_device_calls(Some(counter));
    }
    worker.post(&Response::Ready {
        backend: worker.status(),
    });
    answer_queued(worker).await;
}

/// Answers queued requests until none is left.
async fn answer_queued(worker: Rc<Worker>) {
    worker.busy.set(true);
    loop {
        let next = worker.queue.borrow_mut().pop_front();
        let Some(request) = next else { break };
        worker.answer(request).await;
    }
    worker.busy.set(false);
}

/// Resolves once `ms` milliseconds have passed (the worker's
/// `setTimeout`); at once where there is none.
async fn sleep_ms(ms: f64) {
    let promise = Promise::new(&mut |resolve, _| {
        let global = js_sys::global();
        let set_timeout = Reflect::get(&global, &"setTimeout".into())
            .ok()
            .and_then(|f| f.dyn_into::<Function>().ok());
        let scheduled = set_timeout.and_then(|f| f.call2(&global, &resolve, &ms.into()).ok());
        if scheduled.is_none() {
            let _ = resolve.call0(&JsValue::NULL);
        }
    });
    let _ = JsFuture::from(promise).await;
}

/// `work`'s output, unless `ms` milliseconds pass first (then `work` is
/// dropped where it waits).
async fn within<T>(ms: f64, work: impl Future<Output = T>) -> Option<T> {
    let mut work = pin!(work);
    let mut timer = pin!(sleep_ms(ms));
    poll_fn(|cx| {
        if let Poll::Ready(output) = work.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        if timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
}

impl Worker {
    fn status(&self) -> BackendStatus {
        let mut choices = Vec::new();
        if self.gpu.borrow().is_some() {
            choices.push(BackendChoice::Webgpu);
        }
        choices.push(BackendChoice::Cpu);
        BackendStatus {
            active: kiln::default_device().name().to_string(),
            choices,
            adapter: self.adapter.borrow().clone(),
            unavailable: self.unavailable.borrow().clone(),
            reopening: self.reopening,
            relaxed_products: kiln::ops::relaxed::relaxed_kernels_in_use(),
        }
    }

    async fn answer(&self, request: Request) {
        let Some(mut session) = self.session.borrow_mut().take() else {
            console_error("kiln worker: the session is in use");
            return;
        };
        // The run limit covers the GPU's work too: a script submits its
        // GPU work at once, and waiting for it (the readback of the shown
        // values, the timestamps) ends at the limit.
        let limit_ms = ScriptLimits::PLAYGROUND.time_limit.as_secs_f64() * 1e3;
        let response = match request {
            Request::Run { id, script } => {
                let run = async {
                    let mut report = session.run_async(&script).await;
                    self.measure(&mut report).await;
                    report
                };
                let report = within(limit_ms, run)
                    .await
                    .unwrap_or_else(|| RunReport::past_gpu_limit(&script, limit_ms));
                Response::Report { id, report }
            }
            Request::Compare { id, script } => Response::Comparison {
                id,
                rows: session.compare(&script),
            },
            Request::Verify { id, script } => {
                let verify = async {
                    let (mut report, verification) = session.verify(&script).await;
                    self.measure(&mut report).await;
                    (report, verification)
                };
                match within(limit_ms, verify).await {
                    Some((report, verification)) => Response::Verified {
                        id,
                        report,
                        verification,
                    },
                    None => Response::Report {
                        id,
                        report: RunReport::past_gpu_limit(&script, limit_ms),
                    },
                }
            }
            Request::SetBackend { backend } => {
                session.count_device_calls(Some(self.use_backend(backend)));
                Response::Ready {
                    backend: self.status(),
                }
            }
        };
        *self.session.borrow_mut() = Some(session);
        self.post(&response);
    }

    /// Runs later scripts on `choice` (the CPU where WebGPU is missing);
    /// returns the counter of that device's runs, by which each compiled
    /// call notes the runs it made.
    fn use_backend(&self, choice: BackendChoice) -> DeviceCallCounter {
        let gpu = self.gpu.borrow().clone();
        let (device, counter): (Arc<dyn Device>, DeviceCallCounter) = match (choice, gpu) {
            (BackendChoice::Webgpu, Some(gpu)) => {
                let counter = gpu.clone();
                (Arc::new(gpu), Rc::new(move || counter.gpu_calls_timed()))
            }
            _ => {
                let counter = self.cpu.clone();
                (Arc::new(self.cpu.clone()), Rc::new(move || counter.runs()))
            }
        };
        kiln::set_default_device(device);
        counter
    }

    /// Says what `report`'s call times measure and gives its calls and
    /// kernels their device times: the CPU executor's per step, the GPU's
    /// from timestamps where the adapter writes them.
    async fn measure(&self, report: &mut RunReport) {
        let cpu_times = self.cpu.take_times();
        let gpu = self.gpu.borrow().clone();
        let Some(gpu) = gpu.filter(|g| kiln::Backend::name(g) == report.backend) else {
            report.attach_device_times(&cpu_times);
            report.clock = CallClock::Wall;
            return;
        };
        if !gpu.has_gpu_timestamps() {
            report.clock = CallClock::SubmitOnly;
            return;
        }
        match gpu.take_gpu_times().await {
            Ok(times) => {
                let times: Vec<DeviceTime> = times
                    .into_iter()
                    .map(|t| DeviceTime {
                        call: t.call,
                        executable: t.executable,
                        steps_ms: t.steps_ns.iter().map(|ns| ns.map(|ns| ns * 1e-6)).collect(),
                        total_ms: t.total_ns * 1e-6,
                        runs: 1,
                        tick_ms: 0.0,
                        repeat_ms: 0.0,
                    })
                    .collect();
                report.attach_device_times(&times);
                report.clock = CallClock::GpuTimestamps;
            }
            Err(e) => {
                console_error(&format!("kiln worker: GPU times unread: {e}"));
                report.clock = CallClock::SubmitOnly;
            }
        }
    }

    fn post(&self, response: &Response) {
        let sent = response
            .serialize(&serde_wasm_bindgen::Serializer::json_compatible())
            .map_err(JsValue::from)
            .and_then(|message| self.scope.post_message(&message));
        if let Err(e) = sent {
            console_error(&format!("kiln worker: cannot post the answer: {e:?}"));
        }
    }
}

/// Kiln's wgpu backend on the browser's WebGPU, and what the browser says
/// of its adapter; or why there is none.
async fn open_webgpu() -> Result<(WgpuBackend, AdapterInfo), String> {
    let global = js_sys::global();
    let gpu = Reflect::get(&global, &"navigator".into())
        .and_then(|navigator| Reflect::get(&navigator, &"gpu".into()))
        .ok()
        .filter(|gpu| !gpu.is_undefined() && !gpu.is_null())
        .ok_or("this browser offers no WebGPU (navigator.gpu is missing)")?;
    let request: Function = Reflect::get(&gpu, &"requestAdapter".into())
        .ok()
        .and_then(|f| f.dyn_into().ok())
        .ok_or("navigator.gpu has no requestAdapter")?;
    let promise: Promise = request
        .call0(&gpu)
        .ok()
        .and_then(|p| p.dyn_into().ok())
        .ok_or("requestAdapter did not return a promise")?;
    let adapter = JsFuture::from(promise)
        .await
        .map_err(|e| format!("requestAdapter failed: {e:?}"))?;
    if adapter.is_null() || adapter.is_undefined() {
        return Err("the browser has no WebGPU adapter".to_string());
    }
    let info = Reflect::get(&adapter, &"info".into()).unwrap_or(JsValue::UNDEFINED);
    let text = |name: &str| {
        Reflect::get(&info, &name.into())
            .ok()
            .and_then(|v| v.as_string())
            .unwrap_or_default()
    };
    // Newer browsers say it in the info, older ones on the adapter.
    let fallback = |on: &JsValue| {
        Reflect::get(on, &"isFallbackAdapter".into())
            .ok()
            .and_then(|v| v.as_bool())
    };
    let adapter_info = AdapterInfo {
        vendor: text("vendor"),
        architecture: text("architecture"),
        device: text("device"),
        description: text("description"),
        is_fallback: fallback(&info)
            .or_else(|| fallback(&adapter))
            .unwrap_or(false),
    };
    let backend = WgpuBackend::new_async()
        .await
        .map_err(|e| format!("kiln-wgpu could not open the device: {e}"))?;
    Ok((backend, adapter_info))
}

fn console_error(message: &str) {
    web_sys::console::error_1(&JsValue::from_str(message));
}
