//! Kiln's wgpu backend: runs executables on Vulkan, Metal, DX12 and, in the
//! browser, WebGPU.
//!
//! A thin executor of the programs `kiln-kernels` lowers: the first call
//! of an executable with a set of shapes lowers it
//! ([`kiln_kernels::lower`]) and prepares the [`Program`]: one arena buffer
//! (the executable's slot plan, plus constants, parameter words and status
//! words) with its initial data, pipelines (cached by source across
//! executables) and the bind groups of dispatches that bind only the arena.
//! Every call records the program's steps into one command encoder; buffers
//! for arguments and outputs come from a pool that freed buffers return to,
//! so a steady-state call creates neither pipelines nor buffers (see
//! [`WgpuBackend::counters`]); the pool keeps at most [`MAX_IDLE_BUFFERS`]
//! and [`MAX_IDLE_BYTES`] idle. Which kernel serves an op is decided by the
//! lowering, never here.
//!
//! ```no_run
//! use kiln::{Array, Backend};
//! let gpu = kiln_wgpu::WgpuBackend::new().expect("an adapter");
//! let f = kiln::compile(|x: Array| x.exp()).with_backend(gpu);
//! ```
#![warn(missing_docs)]

mod buffer;
mod device;
mod program;
mod wait;

pub use buffer::{PoolStats, WgpuBuffer, MAX_IDLE_BUFFERS, MAX_IDLE_BYTES};
pub use device::{DeviceError, BACKEND_ENV};
pub use kiln_kernels::{MatmulVariant, Target};

use buffer::{Pool, StatusWords};
use device::{block_on, Gpu};
use kiln::{Backend, Error, Executable, HostData, Result};
use kiln_kernels::program::{Buffer, Caps, Program, Step};
use kiln_kernels::{from_words, storage_bytes, to_words};
use program::{binding, Pipeline, Prepared};
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
    /// Programs lowered and prepared (one per executable and shape set).
    pub programs: u64,
    /// Compute dispatches submitted (a call submits one per kernel).
    pub dispatches: u64,
}

/// Runs Kiln executables through wgpu.
#[derive(Clone)]
pub struct WgpuBackend {
    shared: Arc<Shared>,
}

/// The bind group layout and pipeline layout of kernels with a given
/// number of bindings.
type Layouts = (Arc<wgpu::BindGroupLayout>, Arc<wgpu::PipelineLayout>);

/// The programs prepared for one executable (known by [`Executable::id`]).
struct ExePrograms {
    programs: Vec<Arc<Prepared>>,
    /// When a call last used one of them (a tick of `program_clock`).
    last_used: u64,
}

/// Executables whose programs (and so arenas) are kept; beyond it the least
/// recently used one's are released.
const MAX_PREPARED_EXECUTABLES: usize = 64;

/// Shape sets kept per executable (a shapeless one sees many); beyond it
/// the oldest program is released.
const MAX_SHAPE_SETS: usize = 16;

/// Bind groups over call buffers kept per program before they are all
/// released (each holds its buffers).
const MAX_CACHED_BIND_GROUPS: usize = 256;

pub(crate) struct Shared {
    name: String,
    gpu: Gpu,
    pool: Arc<Pool>,
    pipelines: Mutex<HashMap<String, Pipeline>>,
    layouts: Mutex<HashMap<usize, Layouts>>,
    programs: Mutex<HashMap<u64, ExePrograms>>,
    pipelines_created: AtomicU64,
    other_buffers: AtomicU64,
    programs_built: AtomicU64,
    program_clock: AtomicU64,
    dispatches: AtomicU64,
    /// What programs are lowered within.
    caps: Caps,
}

pub(crate) fn backend_err(detail: impl Into<String>) -> Error {
    Error::Backend {
        backend: "wgpu".into(),
        detail: detail.into(),
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// A backend's state on `gpu` with empty caches, pool and counters.
    fn new(name: String, gpu: Gpu, caps: Caps) -> Shared {
        Shared {
            name,
            gpu,
            pool: Arc::new(Pool::default()),
            pipelines: Mutex::default(),
            layouts: Mutex::default(),
            programs: Mutex::default(),
            pipelines_created: AtomicU64::new(0),
            other_buffers: AtomicU64::new(0),
            programs_built: AtomicU64::new(0),
            program_clock: AtomicU64::new(0),
            dispatches: AtomicU64::new(0),
            caps,
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

    /// A program's arena (counted).
    fn new_buffer(&self, bytes: u64) -> wgpu::Buffer {
        self.other_buffers.fetch_add(1, Ordering::Relaxed);
        self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kiln arena"),
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// The bind group layout of kernels with `count` bindings: all
    /// writable storage (see `kiln_kernels::abi`), so one dispatch may
    /// bind several ranges of the arena.
    fn layout(&self, count: usize) -> Layouts {
        let mut layouts = lock(&self.layouts);
        let entry = layouts.entry(count).or_insert_with(|| {
            let entries: Vec<wgpu::BindGroupLayoutEntry> = (0..count)
                .map(|binding| wgpu::BindGroupLayoutEntry {
                    binding: binding as u32,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage { read_only: false },
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
        bindings: usize,
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
        let (group, layout) = self.layout(bindings);
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
        bindings: Vec<wgpu::BufferBinding<'_>>,
    ) -> wgpu::BindGroup {
        let entries: Vec<wgpu::BindGroupEntry> = bindings
            .into_iter()
            .enumerate()
            .map(|(binding, buffer)| wgpu::BindGroupEntry {
                binding: binding as u32,
                resource: wgpu::BindingResource::Buffer(buffer),
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

    /// The prepared program of `exe` for `shapes`, lowered on first use.
    fn prepared(&self, exe: &Executable, shapes: &[Vec<usize>]) -> Result<Arc<Prepared>> {
        let key = exe.id();
        let tick = self.program_clock.fetch_add(1, Ordering::Relaxed);
        {
            let mut programs = lock(&self.programs);
            if let Some(entry) = programs.get_mut(&key) {
                if let Some(found) = entry.programs.iter().find(|p| p.program.shapes == shapes) {
                    entry.last_used = tick;
                    return Ok(found.clone());
                }
            }
        }
        let program = kiln_kernels::lower(exe, shapes, &self.caps)?;
        let prepared = Arc::new(Prepared::new(self, program)?);
        self.programs_built.fetch_add(1, Ordering::Relaxed);
        let mut programs = lock(&self.programs);
        if !programs.contains_key(&key) && programs.len() >= MAX_PREPARED_EXECUTABLES {
            // An executable that was dropped is never seen again: forget
            // the least recently used.
            if let Some(oldest) = programs
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| *k)
            {
                programs.remove(&oldest);
            }
        }
        let entry = programs.entry(key).or_insert_with(|| ExePrograms {
            programs: Vec::new(),
            last_used: tick,
        });
        if entry.programs.len() >= MAX_SHAPE_SETS {
            entry.programs.remove(0);
        }
        entry.last_used = tick;
        entry.programs.push(prepared.clone());
        Ok(prepared)
    }
}

/// What a program may use on `gpu`: its limits and features.
fn caps(gpu: &Gpu, native_f16: bool, forced_matmul: Option<MatmulVariant>) -> Caps {
    let limits = &gpu.limits;
    Caps {
        backend: "wgpu".into(),
        max_storage_buffers_per_stage: limits.max_storage_buffers_per_shader_stage,
        max_workgroups_per_dimension: limits.max_compute_workgroups_per_dimension,
        max_workgroup_size: [
            limits.max_compute_workgroup_size_x,
            limits.max_compute_workgroup_size_y,
            limits.max_compute_workgroup_size_z,
        ],
        max_invocations_per_workgroup: limits.max_compute_invocations_per_workgroup,
        max_binding_bytes: limits.max_storage_buffer_binding_size,
        max_buffer_bytes: limits.max_buffer_size,
        binding_offset_alignment: limits.min_storage_buffer_offset_alignment,
        native_f16,
        forced_matmul,
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
        let native_f16 = gpu.device.features().contains(wgpu::Features::SHADER_F16);
        let name = format!("wgpu:{}", gpu.info.name);
        let caps = caps(&gpu, native_f16, None);
        Ok(WgpuBackend {
            shared: Arc::new(Shared::new(name, gpu, caps)),
        })
    }

    /// The same device with every matmul computed by `variant`, and with
    /// caches, buffer pool and counters of its own.
    pub fn with_matmul_variant(&self, variant: MatmulVariant) -> WgpuBackend {
        self.derived(
            format!("+matmul={variant:?}"),
            self.shared.caps.native_f16,
            Some(variant),
        )
    }

    /// The same device reading and writing f16 as packed words (the path
    /// of adapters without SHADER_F16), with caches, buffer pool and
    /// counters of its own.
    pub fn with_packed_f16(&self) -> WgpuBackend {
        self.derived(
            "+packed-f16".to_string(),
            false,
            self.shared.caps.forced_matmul,
        )
    }

    fn derived(
        &self,
        suffix: String,
        native_f16: bool,
        forced_matmul: Option<MatmulVariant>,
    ) -> WgpuBackend {
        let s = &self.shared;
        let name = format!("{}{suffix}", s.name);
        let caps = caps(&s.gpu, native_f16, forced_matmul);
        WgpuBackend {
            shared: Arc::new(Shared::new(name, s.gpu.clone(), caps)),
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
        self.shared.caps.native_f16
    }

    /// What programs are lowered within on this device.
    pub fn caps(&self) -> &Caps {
        &self.shared.caps
    }

    /// Bytes of the device buffers the prepared programs hold between
    /// calls (their arenas: [`Program::arena_bytes`]); arguments, outputs
    /// and the idle pool are not counted.
    pub fn program_bytes(&self) -> u64 {
        lock(&self.shared.programs)
            .values()
            .flat_map(|entry| &entry.programs)
            .map(|prepared| prepared.arena.size())
            .sum()
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
            programs: s.programs_built.load(Ordering::Relaxed),
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
        let bytes = storage_bytes(buffer.dtype, buffer.len);
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

    /// The arguments with each one the program writes in place replaced by
    /// a private copy where another handle still shares it.
    fn own_written_inputs(
        &self,
        program: &Program,
        mut inputs: Vec<WgpuBuffer>,
    ) -> Vec<WgpuBuffer> {
        let s = &self.shared;
        let shared: Vec<usize> = program
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
            let bytes = storage_bytes(original.dtype, original.len);
            let copy = s.pool.take(&s.gpu.device, bytes, false);
            encoder.copy_buffer_to_buffer(original.raw(), 0, &copy, 0, bytes);
            inputs[i] = WgpuBuffer::new(copy, s.pool.clone(), original.dtype, original.len);
        }
        s.gpu.queue.submit([encoder.finish()]);
        inputs
    }

    /// Records `prepared`'s steps over `inputs` and fresh output buffers
    /// into one encoder and submits it.
    fn execute(&self, prepared: &Prepared, inputs: &[WgpuBuffer]) -> Result<Vec<WgpuBuffer>> {
        let s = &self.shared;
        let device = &s.gpu.device;
        let program = &prepared.program;
        let outputs: Vec<WgpuBuffer> = program
            .outputs
            .iter()
            .map(|output| {
                let buffer = s.pool.take(device, output.bytes, false);
                WgpuBuffer::new(buffer, s.pool.clone(), output.dtype, output.len)
            })
            .collect();
        let resolve = |buffer: Buffer| -> Result<&wgpu::Buffer> {
            let found = match buffer {
                Buffer::Arena => Some(&prepared.arena),
                Buffer::Input(i) => inputs.get(i).map(WgpuBuffer::raw),
                Buffer::Output(o) => outputs.get(o).map(WgpuBuffer::raw),
            };
            found.ok_or_else(|| {
                backend_err(format!("the program reads {buffer:?}, which was not given"))
            })
        };
        let mut per_call: Vec<Option<wgpu::BindGroup>> = Vec::with_capacity(program.steps.len());
        let mut cached = program::call_groups(prepared);
        // A group holds its buffers: once the pool has released any, drop
        // the groups so none keeps a released buffer's memory (a program
        // whose working set overflows the pool remakes its groups per call).
        let evictions = s.pool.evicted();
        if cached.groups.len() > MAX_CACHED_BIND_GROUPS || cached.pool_evictions != evictions {
            cached.groups.clear();
            cached.pool_evictions = evictions;
        }
        for (c, step) in program.steps.iter().enumerate() {
            per_call.push(match step {
                Step::Dispatch(dispatch) if prepared.fixed_groups[c].is_none() => {
                    Some(prepared.call_group(s, &mut cached, c, &dispatch.bindings, &resolve)?)
                }
                _ => None,
            });
        }
        drop(cached);
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("kiln call"),
        });
        let mut pass: Option<wgpu::ComputePass<'static>> = None;
        for (c, step) in program.steps.iter().enumerate() {
            match step {
                Step::Dispatch(dispatch) => {
                    let pass = pass.get_or_insert_with(|| {
                        encoder
                            .begin_compute_pass(&wgpu::ComputePassDescriptor {
                                label: Some("kiln kernels"),
                                timestamp_writes: None,
                            })
                            .forget_lifetime()
                    });
                    let group = prepared.fixed_groups[c].as_ref().or(per_call[c].as_ref());
                    let (Some((pipeline, _)), Some(group)) = (&prepared.pipelines[c], group) else {
                        return Err(backend_err("a dispatch has no pipeline or bind group"));
                    };
                    pass.set_pipeline(pipeline);
                    pass.set_bind_group(0, group, &[]);
                    let [x, y, z] = dispatch.grid;
                    pass.dispatch_workgroups(x, y, z);
                    s.dispatches.fetch_add(1, Ordering::Relaxed);
                }
                Step::Copy { from, to } => {
                    drop(pass.take());
                    let (source, target) = (resolve(from.buffer)?, resolve(to.buffer)?);
                    binding(source, from)?;
                    binding(target, to)?;
                    encoder.copy_buffer_to_buffer(
                        source,
                        from.offset,
                        target,
                        to.offset,
                        from.bytes,
                    );
                }
                Step::Clear(range) => {
                    drop(pass.take());
                    let buffer = resolve(range.buffer)?;
                    binding(buffer, range)?;
                    encoder.clear_buffer(buffer, range.offset, Some(range.bytes));
                }
            }
        }
        drop(pass);
        let status = (!prepared.checks.is_empty()).then(|| {
            let words = s.pool.take(device, 4 * prepared.checks.len() as u64, false);
            for (k, check) in prepared.checks.iter().enumerate() {
                encoder.copy_buffer_to_buffer(
                    &prepared.arena,
                    check.word.offset,
                    &words,
                    4 * k as u64,
                    4,
                );
            }
            Arc::new(StatusWords::new(
                words,
                s.pool.clone(),
                prepared.checks.clone(),
            ))
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
        let bytes = storage_bytes(data.dtype(), data.len());
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
        let result = s.prepared(exe, shapes).and_then(|prepared| {
            let inputs = self.own_written_inputs(&prepared.program, inputs);
            self.execute(&prepared, &inputs)
        });
        let invalid = block_on(validation.pop()).flatten();
        let out_of_memory = block_on(memory.pop()).flatten();
        if let Some(error) = out_of_memory.or(invalid) {
            // A failed program may hold broken objects: forget this executable's programs.
            lock(&s.programs).remove(&exe.id());
            return Err(backend_err(format!("device error: {error}")));
        }
        s.check_alive()?;
        result
    }
}
