//! Kiln's wgpu backend: runs executables on Vulkan, Metal, DX12 and, in the
//! browser, WebGPU.
//!
//! Every op value of an executable becomes one dispatch of a kernel from
//! `kiln-kernels` (a fused elementwise group is one kernel). The first call
//! with a set of shapes builds a plan: pipelines (cached by
//! source across executables), parameter buffers and the buffers of every
//! intermediate value. Later calls with those shapes record the same
//! commands into one command encoder; buffers for arguments and outputs
//! come from a pool that freed buffers return to, so a steady-state call
//! creates neither pipelines nor buffers (see [`WgpuBackend::counters`]);
//! the pool keeps at most [`MAX_IDLE_BUFFERS`] and [`MAX_IDLE_BYTES`] idle.
//!
//! ```no_run
//! use kiln::{Array, Backend};
//! let gpu = kiln_wgpu::WgpuBackend::new().expect("an adapter");
//! let f = kiln::compile(|x: Array| x.exp()).with_backend(gpu);
//! ```
#![warn(missing_docs)]

mod buffer;
mod device;
mod plan;
mod wait;

pub use buffer::{PoolStats, WgpuBuffer, MAX_IDLE_BUFFERS, MAX_IDLE_BYTES};
pub use device::{DeviceError, BACKEND_ENV};
pub use kiln_kernels::{MatmulVariant, Target};

use buffer::{byte_size, from_words, to_words, Pool, StatusWords};
use device::{block_on, Gpu};
use kiln::{Backend, Error, Executable, HostData, Result};
use plan::{Command, Loc, Plan};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// How many device objects the backend has created: a cached call adds
/// nothing to any of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Compute pipelines (one per distinct kernel source).
    pub pipelines: u64,
    /// Buffers of any kind (storage, parameters, readback).
    pub buffers: u64,
    /// Plans (one per executable and shape set).
    pub plans: u64,
    /// Compute dispatches submitted (a call submits one per kernel).
    pub dispatches: u64,
}

/// Runs Kiln executables through wgpu.
#[derive(Clone)]
pub struct WgpuBackend {
    shared: Arc<Shared>,
}

/// A compute pipeline and the layout of its one bind group.
type Pipeline = (Arc<wgpu::ComputePipeline>, Arc<wgpu::BindGroupLayout>);

/// The bind group layout and pipeline layout of kernels with a given
/// number of bound operands.
type Layouts = (Arc<wgpu::BindGroupLayout>, Arc<wgpu::PipelineLayout>);

/// The plans built for one executable (known by [`Executable::id`]).
struct ExePlans {
    plans: Vec<Arc<Plan>>,
    /// When a call last used one of them (a tick of `plan_clock`).
    last_used: u64,
}

/// Executables whose plans (and so buffers) are kept; beyond it the least
/// recently used one's are released.
const MAX_PLANNED_EXECUTABLES: usize = 64;

/// Shape sets kept per executable (a shapeless one sees many); beyond it
/// the oldest plan is released.
const MAX_SHAPE_SETS: usize = 16;

/// Bind groups over call buffers kept per plan before they are all
/// released (each holds its buffers).
const MAX_CACHED_BIND_GROUPS: usize = 256;

pub(crate) struct Shared {
    name: String,
    gpu: Gpu,
    pool: Arc<Pool>,
    pipelines: Mutex<HashMap<String, Pipeline>>,
    layouts: Mutex<HashMap<(usize, bool), Layouts>>,
    plans: Mutex<HashMap<u64, ExePlans>>,
    pipelines_created: AtomicU64,
    other_buffers: AtomicU64,
    plans_built: AtomicU64,
    plan_clock: AtomicU64,
    dispatches: AtomicU64,
    /// Forces one matmul kernel (benchmarks compare them).
    matmul_variant: Option<MatmulVariant>,
    /// What the kernels may use (native f16).
    target: Target,
}

fn backend_err(detail: impl Into<String>) -> Error {
    Error::Backend {
        backend: "wgpu".into(),
        detail: detail.into(),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// A backend's state on `gpu` with empty caches, pool and counters.
    fn new(
        name: String,
        gpu: Gpu,
        matmul_variant: Option<MatmulVariant>,
        target: Target,
    ) -> Shared {
        Shared {
            name,
            gpu,
            pool: Arc::new(Pool::default()),
            pipelines: Mutex::default(),
            layouts: Mutex::default(),
            plans: Mutex::default(),
            pipelines_created: AtomicU64::new(0),
            other_buffers: AtomicU64::new(0),
            plans_built: AtomicU64::new(0),
            plan_clock: AtomicU64::new(0),
            dispatches: AtomicU64::new(0),
            matmul_variant,
            target,
        }
    }

    /// `Err` naming the size and the limit when a buffer of `bytes` cannot
    /// be bound.
    fn check_size(&self, op: &str, bytes: u64) -> Result<()> {
        let limits = &self.gpu.limits;
        let limit = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size);
        if bytes > limit {
            return Err(backend_err(format!(
                "`{op}` needs a buffer of {bytes} bytes, above the adapter's maximum storage \
                 binding size of {limit} bytes"
            )));
        }
        Ok(())
    }

    /// A plan-owned storage buffer (counted).
    fn new_buffer(&self, bytes: u64) -> wgpu::Buffer {
        self.other_buffers.fetch_add(1, Ordering::Relaxed);
        self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kiln plan"),
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// The bind group layout of kernels with `operands` operands:
    /// parameters, output, the operands, then (with `status`) a status word.
    fn layout(&self, operands: usize, status: bool) -> Layouts {
        let mut layouts = lock(&self.layouts);
        let entry = layouts.entry((operands, status)).or_insert_with(|| {
            let count = operands + 2 + usize::from(status);
            let entries: Vec<wgpu::BindGroupLayoutEntry> = (0..count)
                .map(|binding| wgpu::BindGroupLayoutEntry {
                    binding: binding as u32,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage {
                            read_only: binding != 1 && binding != operands + 2,
                        },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                })
                .collect();
            let group =
                self.gpu
                    .device
                    .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                        label: Some("kiln kernel"),
                        entries: &entries,
                    });
            let pipeline =
                self.gpu
                    .device
                    .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                        label: Some("kiln kernel"),
                        bind_group_layouts: &[Some(&group)],
                        immediate_size: 0,
                    });
            (Arc::new(group), Arc::new(pipeline))
        });
        (entry.0.clone(), entry.1.clone())
    }

    /// The pipeline of `source` (validated by naga and compiled once).
    fn pipeline(
        &self,
        op: &str,
        source: &str,
        entry_point: &str,
        operands: usize,
        status: bool,
    ) -> Result<Pipeline> {
        // Keyed by entry point and source, never by name: two user kernels
        // with one name and different sources are different pipelines.
        let key = format!("{entry_point}\n{source}");
        if let Some(found) = lock(&self.pipelines).get(&key) {
            return Ok(found.clone());
        }
        kiln_kernels::validate(source).map_err(|message| {
            backend_err(
                kiln_kernels::KernelError::Invalid {
                    op: op.to_string(),
                    message,
                    wgsl: source.to_string(),
                }
                .to_string(),
            )
        })?;
        let (group, layout) = self.layout(operands, status);
        let device = &self.gpu.device;
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(op),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(op),
            layout: Some(&layout),
            module: &module,
            entry_point: Some(entry_point),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(Some(error)) = block_on(scope.pop()) {
            return Err(backend_err(format!(
                "the pipeline of `{op}` was rejected: {error}"
            )));
        }
        self.pipelines_created.fetch_add(1, Ordering::Relaxed);
        let entry = (Arc::new(pipeline), group);
        lock(&self.pipelines).insert(key, entry.clone());
        Ok(entry)
    }

    fn bind_group(
        &self,
        layout: &wgpu::BindGroupLayout,
        params: &wgpu::Buffer,
        buffers: &[&wgpu::Buffer],
    ) -> wgpu::BindGroup {
        let entries: Vec<wgpu::BindGroupEntry> = std::iter::once(params)
            .chain(buffers.iter().copied())
            .enumerate()
            .map(|(binding, buffer)| wgpu::BindGroupEntry {
                binding: binding as u32,
                resource: buffer.as_entire_binding(),
            })
            .collect();
        self.gpu
            .device
            .create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("kiln kernel"),
                layout,
                entries: &entries,
            })
    }

    /// `Err` once the device is lost: every later call says so.
    fn check_alive(&self) -> Result<()> {
        match lock(&self.gpu.lost).as_ref() {
            Some(reason) => Err(backend_err(format!(
                "the device of `{}` was lost ({reason}); create a new backend",
                self.name
            ))),
            None => Ok(()),
        }
    }

    /// Errors the device raised outside an error scope since last asked.
    fn take_uncaptured(&self) -> Result<()> {
        let errors = std::mem::take(&mut *lock(&self.gpu.uncaptured));
        if errors.is_empty() {
            Ok(())
        } else {
            Err(backend_err(errors.join("; ")))
        }
    }

    /// The plan of `exe` for `shapes`, built on first use.
    fn plan(&self, exe: &Executable, shapes: &[Vec<usize>]) -> Result<Arc<Plan>> {
        let key = exe.id();
        let tick = self.plan_clock.fetch_add(1, Ordering::Relaxed);
        {
            let mut plans = lock(&self.plans);
            if let Some(entry) = plans.get_mut(&key) {
                if let Some(plan) = entry.plans.iter().find(|p| p.shapes == shapes) {
                    entry.last_used = tick;
                    return Ok(plan.clone());
                }
            }
        }
        let plan = Arc::new(plan::build(self, exe, shapes)?);
        self.plans_built.fetch_add(1, Ordering::Relaxed);
        let mut plans = lock(&self.plans);
        if !plans.contains_key(&key) && plans.len() >= MAX_PLANNED_EXECUTABLES {
            // An executable that was dropped is never seen again: forget
            // the least recently used.
            if let Some(oldest) = plans
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| *k)
            {
                plans.remove(&oldest);
            }
        }
        let entry = plans.entry(key).or_insert_with(|| ExePlans {
            plans: Vec::new(),
            last_used: tick,
        });
        if entry.plans.len() >= MAX_SHAPE_SETS {
            entry.plans.remove(0);
        }
        entry.last_used = tick;
        entry.plans.push(plan.clone());
        Ok(plan)
    }
}

impl WgpuBackend {
    /// Opens the default adapter (see [`BACKEND_ENV`]), blocking until the
    /// device is ready. Not available in the browser: use [`Self::new_async`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new() -> Result<WgpuBackend, DeviceError> {
        pollster::block_on(Self::new_async())
    }

    /// Opens the default adapter (see [`BACKEND_ENV`]).
    pub async fn new_async() -> Result<WgpuBackend, DeviceError> {
        let gpu = device::open().await?;
        let target = Target {
            native_f16: gpu.device.features().contains(wgpu::Features::SHADER_F16),
        };
        let name = format!("wgpu:{}", gpu.info.name);
        Ok(WgpuBackend {
            shared: Arc::new(Shared::new(name, gpu, None, target)),
        })
    }

    /// The same device with every matmul computed by `variant`, and with
    /// caches, buffer pool and counters of its own.
    pub fn with_matmul_variant(&self, variant: MatmulVariant) -> WgpuBackend {
        self.derived(
            format!("+matmul={variant:?}"),
            Some(variant),
            self.shared.target,
        )
    }

    /// The same device reading and writing f16 as packed words (the path
    /// of adapters without SHADER_F16), with caches, buffer pool and
    /// counters of its own.
    pub fn with_packed_f16(&self) -> WgpuBackend {
        self.derived(
            "+packed-f16".to_string(),
            self.shared.matmul_variant,
            Target { native_f16: false },
        )
    }

    fn derived(
        &self,
        suffix: String,
        matmul_variant: Option<MatmulVariant>,
        target: Target,
    ) -> WgpuBackend {
        let s = &self.shared;
        let name = format!("{}{suffix}", s.name);
        WgpuBackend {
            shared: Arc::new(Shared::new(name, s.gpu.clone(), matmul_variant, target)),
        }
    }

    /// The adapter's description, like `llvmpipe (LLVM 15.0.6, 256 bits) / Vulkan`.
    pub fn adapter(&self) -> String {
        let info = &self.shared.gpu.info;
        format!("{} / {:?}", info.name, info.backend)
    }

    /// The device limits in force (the adapter's own).
    pub fn limits(&self) -> &wgpu::Limits {
        &self.shared.gpu.limits
    }

    /// True when the kernels read and write f16 natively (the adapter has
    /// SHADER_F16 and [`Self::with_packed_f16`] was not asked for).
    pub fn has_shader_f16(&self) -> bool {
        self.shared.target.native_f16
    }

    /// Destroys the device now, for this backend and every one derived
    /// from it: later calls return an error saying the device was lost.
    pub fn destroy(&self) {
        self.shared.gpu.device.destroy();
        #[cfg(not(target_arch = "wasm32"))]
        drop(
            self.shared
                .gpu
                .device
                .poll(wgpu::PollType::wait_indefinitely()),
        );
    }

    /// Device objects created so far.
    pub fn counters(&self) -> Counters {
        let s = &self.shared;
        Counters {
            pipelines: s.pipelines_created.load(Ordering::Relaxed),
            buffers: s.pool.created() + s.other_buffers.load(Ordering::Relaxed),
            plans: s.plans_built.load(Ordering::Relaxed),
            dispatches: s.dispatches.load(Ordering::Relaxed),
        }
    }

    /// What the buffer pool holds idle for later calls: bounded by
    /// [`MAX_IDLE_BUFFERS`] and [`MAX_IDLE_BYTES`], whatever sizes the
    /// calls used.
    pub fn pool(&self) -> PoolStats {
        self.shared.pool.stats()
    }

    /// Blocks until the device has finished all submitted work (for
    /// timing).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn wait_idle(&self) -> Result<()> {
        self.shared
            .gpu
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| backend_err(e.to_string()))
    }

    /// Copies a buffer back to the host without blocking (the browser's
    /// way; natively it also drives the device until the copy is done).
    ///
    /// Bad input that a kernel of the call writing `buffer` found (an index
    /// of `take` out of range) is reported here, as `Error::Runtime`: the
    /// status words travel back with the data.
    pub async fn download_async(&self, buffer: WgpuBuffer) -> Result<Arc<HostData>> {
        let s = &self.shared;
        s.check_alive()?;
        let bytes = byte_size(buffer.dtype, buffer.len);
        let status_bytes = buffer.status.as_ref().map_or(0, |status| status.bytes());
        let staging = s.pool.take(&s.gpu.device, bytes + status_bytes, true);
        let mut encoder = s
            .gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("kiln readback"),
            });
        encoder.copy_buffer_to_buffer(buffer.raw(), 0, &staging, 0, bytes);
        if let Some(status) = &buffer.status {
            encoder.copy_buffer_to_buffer(status.raw(), 0, &staging, bytes, status_bytes);
        }
        s.gpu.queue.submit([encoder.finish()]);
        let words = self.read_staging(&staging).await;
        s.pool.give(staging, true);
        let words = words?;
        let (data, status_words) = words.split_at((bytes / 4) as usize);
        if let Some(error) = buffer.status.as_ref().and_then(|s| s.error(status_words)) {
            return Err(error);
        }
        let data = from_words(buffer.dtype, buffer.len, data);
        s.check_alive()?;
        s.take_uncaptured()?;
        Ok(Arc::new(data))
    }

    /// The arguments with each one the plan writes in place replaced by a
    /// private copy where another handle still shares it.
    fn own_written_inputs(&self, plan: &Plan, mut inputs: Vec<WgpuBuffer>) -> Vec<WgpuBuffer> {
        let s = &self.shared;
        let shared: Vec<usize> = plan
            .written_inputs
            .iter()
            .copied()
            .filter(|&i| inputs.get(i).is_some_and(WgpuBuffer::is_shared))
            .collect();
        if shared.is_empty() {
            return inputs;
        }
        let mut encoder = s
            .gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("kiln copy of shared arguments"),
            });
        for i in shared {
            let original = &inputs[i];
            let bytes = byte_size(original.dtype, original.len);
            let copy = s.pool.take(&s.gpu.device, bytes, false);
            encoder.copy_buffer_to_buffer(original.raw(), 0, &copy, 0, bytes);
            inputs[i] = WgpuBuffer::new(copy, s.pool.clone(), original.dtype, original.len);
        }
        s.gpu.queue.submit([encoder.finish()]);
        inputs
    }

    fn execute(&self, plan: &Plan, inputs: &[WgpuBuffer]) -> Result<Vec<WgpuBuffer>> {
        let s = &self.shared;
        let device = &s.gpu.device;
        let outputs: Vec<WgpuBuffer> = plan
            .outputs
            .iter()
            .map(|&(dtype, len)| {
                let buffer = s.pool.take(device, byte_size(dtype, len), false);
                WgpuBuffer::new(buffer, s.pool.clone(), dtype, len)
            })
            .collect();
        let resolve = |loc: Loc| -> Result<&wgpu::Buffer> {
            let found = match loc {
                Loc::Input(i) => inputs.get(i).map(WgpuBuffer::raw),
                Loc::Temp(t) => plan.temps.get(t),
                Loc::Output(o) => outputs.get(o).map(WgpuBuffer::raw),
            };
            found.ok_or_else(|| backend_err(format!("the plan reads {loc:?}, which was not given")))
        };
        // Bind groups naming this call's arguments and outputs: the pool
        // tends to hand out the same buffers call after call, so the groups
        // are kept by command and buffers.
        let mut per_call: Vec<Option<wgpu::BindGroup>> = Vec::with_capacity(plan.commands.len());
        let mut cached = lock(&plan.bind_groups);
        // A group holds its buffers: once the pool has released any, drop
        // the groups so none keeps a released buffer's memory (a program
        // whose working set overflows the pool remakes its groups per call).
        let evictions = s.pool.evicted();
        if cached.groups.len() > MAX_CACHED_BIND_GROUPS || cached.pool_evictions != evictions {
            cached.groups.clear();
            cached.pool_evictions = evictions;
        }
        for (c, command) in plan.commands.iter().enumerate() {
            per_call.push(match command {
                Command::Dispatch {
                    layout,
                    params,
                    bindings,
                    bind_group: None,
                    ..
                } => {
                    let buffers = bindings
                        .iter()
                        .map(|&l| resolve(l).cloned())
                        .collect::<Result<Vec<_>>>()?;
                    let group = match cached.groups.get(&(c, buffers.clone())) {
                        Some(group) => group.clone(),
                        None => {
                            let refs: Vec<&wgpu::Buffer> = buffers.iter().collect();
                            let group = s.bind_group(layout, params, &refs);
                            cached.groups.insert((c, buffers), group.clone());
                            group
                        }
                    };
                    Some(group)
                }
                _ => None,
            });
        }
        drop(cached);
        for check in plan.checks.iter() {
            if let Some(word) = plan.temps.get(check.temp) {
                s.gpu.queue.write_buffer(word, 0, &u32::MAX.to_le_bytes());
            }
        }
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("kiln call"),
        });
        let mut pass: Option<wgpu::ComputePass<'static>> = None;
        for (command, group) in plan.commands.iter().zip(&per_call) {
            match command {
                Command::Dispatch {
                    pipeline,
                    workgroups,
                    bind_group,
                    ..
                } => {
                    let pass = pass.get_or_insert_with(|| {
                        encoder
                            .begin_compute_pass(&wgpu::ComputePassDescriptor {
                                label: Some("kiln kernels"),
                                timestamp_writes: None,
                            })
                            .forget_lifetime()
                    });
                    let Some(group) = bind_group.as_ref().or(group.as_ref()) else {
                        return Err(backend_err("a dispatch has no bind group"));
                    };
                    pass.set_pipeline(pipeline);
                    pass.set_bind_group(0, group, &[]);
                    pass.dispatch_workgroups(workgroups[0], workgroups[1], workgroups[2]);
                    s.dispatches.fetch_add(1, Ordering::Relaxed);
                }
                Command::Copy { from, to, bytes } => {
                    drop(pass.take());
                    encoder.copy_buffer_to_buffer(resolve(*from)?, 0, resolve(*to)?, 0, *bytes);
                }
            }
        }
        drop(pass);
        let status = (!plan.checks.is_empty()).then(|| {
            let words = s.pool.take(device, 4 * plan.checks.len() as u64, false);
            for (k, check) in plan.checks.iter().enumerate() {
                if let Some(word) = plan.temps.get(check.temp) {
                    encoder.copy_buffer_to_buffer(word, 0, &words, 4 * k as u64, 4);
                }
            }
            Arc::new(StatusWords::new(words, s.pool.clone(), plan.checks.clone()))
        });
        s.gpu.queue.submit([encoder.finish()]);
        Ok(outputs
            .into_iter()
            .map(|mut output| {
                output.status = status.clone();
                output
            })
            .collect())
    }

    /// The words of a staging buffer once the device has filled it.
    async fn read_staging(&self, staging: &wgpu::Buffer) -> Result<Vec<u32>> {
        let (sender, receiver) = wait::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |result| sender.send(result));
        #[cfg(not(target_arch = "wasm32"))]
        self.shared
            .gpu
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| backend_err(format!("waiting for a readback: {e}")))?;
        receiver
            .await
            .map_err(|e| backend_err(format!("mapping a readback buffer: {e}")))?;
        let words = {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| backend_err(format!("reading a readback buffer: {e}")))?;
            bytemuck::cast_slice::<u8, u32>(&view).to_vec()
        };
        staging.unmap();
        Ok(words)
    }
}

impl Backend for WgpuBackend {
    type Buffer = WgpuBuffer;

    fn name(&self) -> &str {
        &self.shared.name
    }

    fn upload(&self, data: &Arc<HostData>) -> Result<WgpuBuffer> {
        let s = &self.shared;
        s.check_alive()?;
        let bytes = byte_size(data.dtype(), data.len());
        s.check_size("upload", bytes)?;
        let buffer = s.pool.take(&s.gpu.device, bytes, false);
        let words = to_words(data);
        if !words.is_empty() {
            s.gpu
                .queue
                .write_buffer(&buffer, 0, bytemuck::cast_slice(&words));
        }
        Ok(WgpuBuffer::new(
            buffer,
            s.pool.clone(),
            data.dtype(),
            data.len(),
        ))
    }

    fn download(&self, buffer: WgpuBuffer) -> Result<Arc<HostData>> {
        block_on(self.download_async(buffer)).unwrap_or_else(|| {
            Err(backend_err(
                "a blocking readback is not available in the browser: read values with \
                 `kiln::eval_async` or call with `Compiled::call_async`",
            ))
        })
    }

    fn download_async(&self, buffer: WgpuBuffer) -> kiln::exec::DownloadFuture<'_> {
        Box::pin(WgpuBackend::download_async(self, buffer))
    }

    fn run(
        &self,
        exe: &Executable,
        inputs: Vec<WgpuBuffer>,
        shapes: &[Vec<usize>],
    ) -> Result<Vec<WgpuBuffer>> {
        let s = &self.shared;
        s.check_alive()?;
        if shapes.len() != exe.graph().nodes.len() {
            return Err(backend_err(format!(
                "{} value shapes for a graph of {} values",
                shapes.len(),
                exe.graph().nodes.len()
            )));
        }
        // Errors of an earlier call that no scope caught belong to it, not to this one.
        drop(s.take_uncaptured());
        let device = &s.gpu.device;
        let memory = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let result = s.plan(exe, shapes).and_then(|plan| {
            let inputs = self.own_written_inputs(&plan, inputs);
            self.execute(&plan, &inputs)
        });
        let invalid = block_on(validation.pop()).flatten();
        let out_of_memory = block_on(memory.pop()).flatten();
        if let Some(error) = out_of_memory.or(invalid) {
            // A failed plan may hold broken objects: forget this executable's plans.
            lock(&s.plans).remove(&exe.id());
            return Err(backend_err(format!("device error: {error}")));
        }
        s.check_alive()?;
        result
    }
}
