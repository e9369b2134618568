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
mod shared;
mod timing;
mod wait;

pub use buffer::WgpuBuffer;
pub use device::{DeviceError, BACKEND_ENV};
pub use kiln::pool::{PoolStats, MAX_IDLE_BUFFERS, MAX_IDLE_BYTES};
pub use kiln_kernels::{MatmulVariant, Target};
pub use timing::{CallGpuTime, MAX_PENDING_TIMES};

use buffer::StatusWords;
use device::block_on;
use kiln::{Backend, Executable, HostData, KernelList, Result};
use kiln_kernels::program::{Buffer, Caps, Program, Range, Step};
use kiln_kernels::{from_words, storage_bytes, to_words};
use program::{binding, Prepared, ProgramCache};
use shared::{backend_err, caps, Shared};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use timing::{PendingTime, Timing};

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
    programs: Arc<ProgramCache>,
    timing: Arc<Timing>,
}

/// Bind groups over call buffers kept per program before they are all
/// released (each holds its buffers).
const MAX_CACHED_BIND_GROUPS: usize = 256;

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
            programs: Arc::default(),
            timing: Arc::default(),
        })
    }

    /// The same device with every matmul computed by `variant`, and with
    /// caches, buffer pool and counters of its own.
    pub fn with_matmul_variant(&self, variant: MatmulVariant) -> WgpuBackend {
        self.derived(format!("+matmul={variant:?}"), |caps| {
            caps.forced_matmul = Some(variant)
        })
    }

    /// The same device reading and writing f16 as packed words (the path
    /// of adapters without SHADER_F16), with caches, buffer pool and
    /// counters of its own.
    pub fn with_packed_f16(&self) -> WgpuBackend {
        self.derived("+packed-f16".to_string(), |caps| caps.native_f16 = false)
    }

    /// The same device with every kernel binding at most `limit` storage
    /// buffers (and at least WebGPU's guaranteed 8): programs lowered as on
    /// a device with that limit, such as a browser's default of 8, where
    /// this one allows more (NVIDIA's allow millions). Caches, buffer pool
    /// and counters are its own.
    pub fn with_storage_buffer_limit(&self, limit: u32) -> WgpuBackend {
        self.derived(format!("+storage-buffers={limit}"), |caps| {
            caps.max_storage_buffers_per_stage =
                caps.max_storage_buffers_per_stage.min(limit.max(8))
        })
    }

    /// A backend on the same device whose caps are this one's changed by
    /// `adjust`, named with `suffix` added.
    fn derived(&self, suffix: String, adjust: impl FnOnce(&mut Caps)) -> WgpuBackend {
        let s = &self.shared;
        let name = format!("{}{suffix}", s.name);
        let mut caps = s.caps.clone();
        adjust(&mut caps);
        WgpuBackend {
            shared: Arc::new(Shared::new(name, s.gpu.clone(), caps)),
            programs: Arc::default(),
            timing: Arc::default(),
        }
    }

    /// True when the device writes timestamps (the adapter has
    /// [`wgpu::Features::TIMESTAMP_QUERY`]), so calls can be timed on the
    /// GPU ([`Self::set_gpu_timing`]).
    pub fn has_gpu_timestamps(&self) -> bool {
        self.shared
            .gpu
            .device
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY)
    }

    /// Times every later call on the GPU (`on`), or stops: each dispatch
    /// then runs in a compute pass of its own bracketed by timestamps, and
    /// each call makes a query set and two small buffers. Read the times
    /// with [`Self::take_gpu_times`]. Returns whether calls are timed:
    /// false where the device has no timestamps.
    ///
    /// ```no_run
    /// use kiln::Array;
    /// let gpu = kiln_wgpu::WgpuBackend::new().expect("an adapter");
    /// if gpu.set_gpu_timing(true) {
    ///     let f = kiln::compile(|x: Array| x.exp()).with_backend(gpu.clone());
    ///     f.call(&Array::ones(&[1024], kiln::DType::F32))?;
    ///     let times = pollster::block_on(gpu.take_gpu_times())?;
    ///     println!("{} ns on the GPU", times[0].total_ns);
    /// }
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn set_gpu_timing(&self, on: bool) -> bool {
        let timed = on && self.has_gpu_timestamps();
        self.timing.enabled.store(timed, Ordering::Relaxed);
        timed
    }

    /// Calls timed so far: the calls a piece of work made are the ones it
    /// added ([`CallGpuTime::call`] numbers them from 0).
    pub fn gpu_calls_timed(&self) -> u64 {
        self.timing.calls.load(Ordering::Relaxed)
    }

    /// The GPU times of the timed calls not read yet (at most
    /// [`MAX_PENDING_TIMES`], the latest), in call order, read back
    /// without blocking (natively it drives the device until they are
    /// there).
    pub async fn take_gpu_times(&self) -> Result<Vec<CallGpuTime>> {
        let s = &self.shared;
        let pending: Vec<PendingTime> = shared::lock(&self.timing.pending).drain(..).collect();
        let period = f64::from(s.gpu.queue.get_timestamp_period());
        let mut times = Vec::with_capacity(pending.len());
        for p in pending {
            let words = self.read_staging(&p.staging).await;
            s.pool.give(p.staging, true);
            let ticks: Vec<u64> = words?
                .chunks_exact(2)
                .map(|w| u64::from(w[0]) | (u64::from(w[1]) << 32))
                .collect();
            let (steps_ns, total_ns) = timing::spans(&p.pairs, &ticks, period);
            times.push(CallGpuTime {
                executable: p.executable,
                call: p.call,
                steps_ns,
                total_ns,
            });
        }
        Ok(times)
    }

    /// The adapter's description, like `llvmpipe (LLVM 15.0.6, 256 bits) / Vulkan`.
    pub fn adapter(&self) -> String {
        let info = &self.shared.gpu.info;
        format!("{} / {:?}", info.name, info.backend)
    }

    /// True when the adapter runs on the CPU (lavapipe, llvmpipe,
    /// SwiftShader): work sized for a GPU would take minutes there.
    pub fn is_software(&self) -> bool {
        self.shared.gpu.info.device_type == wgpu::DeviceType::Cpu
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
    /// calls (their arenas and parameter buffers: [`Program::arena_bytes`],
    /// [`Program::params_bytes`]); arguments, outputs and the idle pool are
    /// not counted.
    pub fn program_bytes(&self) -> u64 {
        self.programs.held_bytes()
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
            programs: self.programs.built.load(Ordering::Relaxed),
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
    fn execute(
        &self,
        exe: &Executable,
        prepared: &Prepared,
        inputs: &[WgpuBuffer],
    ) -> Result<Vec<WgpuBuffer>> {
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
                Buffer::Params => Some(&prepared.params),
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
        let new_encoder = || {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("kiln call"),
            })
        };
        let mut encoder = new_encoder();
        let mut pass: Option<wgpu::ComputePass<'static>> = None;
        // Per-kernel times are matched to steps in order, which a loop
        // repeats: a program with loops is not timed.
        let mut timer = if program.has_loops() {
            None
        } else {
            self.call_timer(device, program)
        };
        let mut c = 0;
        while let Some(step) = program.steps.get(c) {
            let mut next = c + 1;
            match step {
                Step::Dispatch(dispatch) => {
                    // A timed dispatch runs in a pass of its own, between
                    // its timestamps.
                    let bracket = timer.as_mut().and_then(CallTimer::next_pair);
                    if let Some(writes) = &bracket {
                        drop(pass.take());
                        pass = Some(
                            encoder
                                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                                    label: Some("kiln timed kernel"),
                                    timestamp_writes: Some(writes.clone()),
                                })
                                .forget_lifetime(),
                        );
                    }
                    let open = pass.get_or_insert_with(|| {
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
                    open.set_pipeline(pipeline);
                    open.set_bind_group(0, group, &[]);
                    let [x, y, z] = dispatch.grid;
                    open.dispatch_workgroups(x, y, z);
                    s.dispatches.fetch_add(1, Ordering::Relaxed);
                    if bracket.is_some() {
                        drop(pass.take());
                    }
                }
                Step::Copy { from, to } => {
                    if let Some(timer) = &mut timer {
                        timer.pairs.push(None);
                    }
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
                    if let Some(timer) = &mut timer {
                        timer.pairs.push(None);
                    }
                    drop(pass.take());
                    let buffer = resolve(range.buffer)?;
                    binding(buffer, range)?;
                    encoder.clear_buffer(buffer, range.offset, Some(range.bytes));
                }
                Step::Branch { predicate, exit } => {
                    drop(pass.take());
                    let finished = std::mem::replace(&mut encoder, new_encoder());
                    if self.read_predicate(finished, &prepared.arena, predicate)? == 0 {
                        next = *exit;
                    }
                }
                Step::Jump { to } => next = *to,
            }
            c = next;
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
        let timed = timer.map(|timer| timer.resolve(s, &mut encoder, exe.id(), &self.timing));
        s.gpu.queue.submit([encoder.finish()]);
        if let Some(pending) = timed {
            self.timing.push(pending);
        }
        Ok(outputs
            .into_iter()
            .map(|mut output| {
                output.status = status.clone();
                output
            })
            .collect())
    }

    /// Submits `encoder` with a copy of the predicate word at `predicate`
    /// of `arena` and reads the word back, waiting for the device: a
    /// `while_loop`'s test.
    fn read_predicate(
        &self,
        mut encoder: wgpu::CommandEncoder,
        arena: &wgpu::Buffer,
        predicate: &Range,
    ) -> Result<u32> {
        let s = &self.shared;
        let staging = s.pool.take(&s.gpu.device, 4, true);
        encoder.copy_buffer_to_buffer(arena, predicate.offset, &staging, 0, 4);
        s.gpu.queue.submit([encoder.finish()]);
        let words =
            block_on(self.read_staging(&staging)).unwrap_or_else(|| Err(loop_cannot_wait()));
        s.pool.give(staging, true);
        Ok(words?.first().copied().unwrap_or(0))
    }

    /// The timer of a call of `program` when calls are timed.
    fn call_timer(&self, device: &wgpu::Device, program: &Program) -> Option<CallTimer> {
        if !self.timing.enabled.load(Ordering::Relaxed) {
            return None;
        }
        let dispatches = program
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Dispatch(_)))
            .count()
            .min(MAX_TIMED_DISPATCHES) as u32;
        (dispatches > 0).then(|| CallTimer {
            queries: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("kiln kernel timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: 2 * dispatches,
            }),
            capacity: dispatches,
            pairs: Vec::with_capacity(program.steps.len()),
            used: 0,
        })
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

/// Dispatches of one call timed at most: two queries each, within
/// WebGPU's 4,096 queries per query set (later dispatches go untimed).
const MAX_TIMED_DISPATCHES: usize = 2048;

/// The timestamps of one call being recorded.
struct CallTimer {
    queries: wgpu::QuerySet,
    /// Pairs of queries the set holds.
    capacity: u32,
    /// Per step so far: its pair.
    pairs: Vec<Option<u32>>,
    used: u32,
}

impl CallTimer {
    /// The timestamp writes of the next dispatch (recorded as its step's
    /// pair), or `None` once the set is full.
    fn next_pair(&mut self) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        if self.used == self.capacity {
            self.pairs.push(None);
            return None;
        }
        let pair = self.used;
        self.used += 1;
        self.pairs.push(Some(pair));
        Some(wgpu::ComputePassTimestampWrites {
            query_set: &self.queries,
            beginning_of_pass_write_index: Some(2 * pair),
            end_of_pass_write_index: Some(2 * pair + 1),
        })
    }

    /// Resolves the timestamps into a readback buffer at the end of
    /// `encoder`'s commands.
    fn resolve(
        self,
        s: &Shared,
        encoder: &mut wgpu::CommandEncoder,
        executable: u64,
        timing: &Timing,
    ) -> PendingTime {
        let bytes = 16 * u64::from(self.used);
        let resolved = s.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kiln resolved timestamps"),
            size: bytes,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        encoder.resolve_query_set(&self.queries, 0..2 * self.used, &resolved, 0);
        let staging = s.pool.take(&s.gpu.device, bytes, true);
        encoder.copy_buffer_to_buffer(&resolved, 0, &staging, 0, bytes);
        PendingTime {
            executable,
            call: timing.next_call(),
            pairs: self.pairs,
            staging,
        }
    }
}

impl Backend for WgpuBackend {
    type Buffer = WgpuBuffer;

    fn name(&self) -> &str {
        &self.shared.name
    }

    /// The lowering's matmul kernels read a transposed operand in place
    /// (`kiln_kernels::family::matmul`).
    fn reads_transposed_operands(&self) -> bool {
        true
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

    /// The steps of the program a call at `shapes` runs: the one prepared
    /// for it, else the same lowering done afresh (nothing is prepared on
    /// the device).
    fn kernels(&self, exe: &Executable, shapes: &[Vec<usize>]) -> Result<KernelList> {
        let s = &self.shared;
        Ok(match self.programs.prepared(exe, shapes) {
            Some(prepared) => prepared.program.kernel_list(&s.name, exe.id()),
            None => kiln_kernels::lower(exe, shapes, &s.caps)?.kernel_list(&s.name, exe.id()),
        })
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
        let result = self.programs.get(s, exe, shapes).and_then(|prepared| {
            if prepared.program.has_loops() && !device::CAN_BLOCK {
                return Err(loop_cannot_wait());
            }
            let inputs = self.own_written_inputs(&prepared.program, inputs);
            self.execute(exe, &prepared, &inputs)
        });
        let invalid = block_on(validation.pop()).flatten();
        let out_of_memory = block_on(memory.pop()).flatten();
        if let Some(error) = out_of_memory.or(invalid) {
            // A failed program may hold broken objects: forget this executable's programs.
            self.programs.forget(exe);
            return Err(backend_err(format!("device error: {error}")));
        }
        s.check_alive()?;
        result
    }
}

/// The `Err` of a program with a `while_loop` where a call cannot wait for
/// the device: a browser completes a readback only after the script
/// yields, and the loop reads its predicate back every iteration.
fn loop_cannot_wait() -> kiln::Error {
    backend_err(
        "`while_loop` reads its predicate back after every iteration, and a browser completes \
         a readback only after the script yields: run it on the CPU backend, or bound it with \
         `fori_loop` or `scan`",
    )
}
