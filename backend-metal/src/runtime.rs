//! The Metal runtime (Apple targets only): a thin executor of the
//! [`Program`]s `kiln-kernels` lowers, as `kiln-wgpu` is for wgpu.
//!
//! * **Memory.** Every buffer is `MTLStorageModeShared`: on unified memory
//!   the CPU and GPU see the same pages, so an upload is one copy of the
//!   host array into a buffer's `contents()`, and a readback reads
//!   `contents()` once the call's own command buffer has completed: no
//!   staging buffers and no blits. A program's arena is one buffer, its
//!   initial data written once.
//! * **Commands.** One command buffer per call: a serial compute encoder
//!   (each dispatch sees the previous one's writes) for runs of
//!   dispatches, a blit encoder for copies, clears and the status words.
//!   A readback waits only for the command buffer that wrote its buffer.
//! * **Reuse.** Pipelines are cached by source and entry point, programs by
//!   executable and shapes, and freed buffers return to a pool, so a
//!   steady-state call creates no pipeline and no buffer ([`Counters`]).

use crate::msl::{self, MslKernel};
use kiln::pool::IdleBuffers;
use kiln::{Backend, DType, Error, Executable, HostData, Result};
use kiln_kernels::program::{Buffer, Caps, Check, Program, Range, Step};
use kiln_kernels::{from_words, storage_bytes, to_words};
use objc2::rc::Retained;
use objc2::runtime::{NSObjectProtocol, ProtocolObject};
use objc2::sel;
use objc2_foundation::{NSRange, NSString};
use objc2_metal::{
    MTLBlitCommandEncoder, MTLBuffer, MTLCommandBuffer, MTLCommandBufferStatus, MTLCommandEncoder,
    MTLCommandQueue, MTLCompileOptions, MTLComputeCommandEncoder, MTLComputePipelineState,
    MTLCopyAllDevices, MTLCreateSystemDefaultDevice, MTLDevice, MTLLibrary,
    MTLMathFloatingPointFunctions, MTLMathMode, MTLResourceOptions, MTLSize,
};
use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Shape sets whose programs are kept per executable.
const MAX_SHAPE_SETS: usize = 16;

/// Executables whose programs are kept.
const MAX_PREPARED_EXECUTABLES: usize = 64;

type Device = Retained<ProtocolObject<dyn MTLDevice>>;

/// A Metal buffer that may be handed between threads: Metal resources are
/// thread-safe objects, and the CPU reads or writes `contents()` only
/// before its first use by a command buffer or after that command buffer
/// completed.
struct Storage(Retained<ProtocolObject<dyn MTLBuffer>>);

// SAFETY: see `Storage`; every CPU access is ordered with the GPU's by
// `waitUntilCompleted` on the command buffer that used it last.
unsafe impl Send for Storage {}
// SAFETY: as above; shared references only read the handle.
unsafe impl Sync for Storage {}

/// A committed command buffer, waited on by any thread reading what it
/// wrote: after `commit`, Metal allows `waitUntilCompleted`, `status` and
/// `error` from any thread.
struct Committed(Retained<ProtocolObject<dyn MTLCommandBuffer>>);

// SAFETY: see `Committed`: no encoding happens after commit.
unsafe impl Send for Committed {}
// SAFETY: as above.
unsafe impl Sync for Committed {}

fn backend_err(detail: impl Into<String>) -> Error {
    Error::Backend {
        backend: "metal".into(),
        detail: detail.into(),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Why no Metal device could be opened.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("no Metal device: {0}")]
pub struct DeviceError(String);

/// A device error as Kiln's [`kiln::Error::Backend`], keeping its
/// message, so `?` on [`MetalBackend::new`] works in a function returning
/// [`kiln::Result`].
impl From<DeviceError> for kiln::Error {
    fn from(error: DeviceError) -> kiln::Error {
        kiln::Error::Backend {
            backend: "metal".to_string(),
            detail: error.to_string(),
        }
    }
}

/// How many device objects the backend has made: a cached call adds
/// nothing to pipelines, buffers or programs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Compute pipelines (one per distinct kernel source).
    pub pipelines: u64,
    /// Buffers (arenas, arguments, outputs, status words).
    pub buffers: u64,
    /// Programs lowered and prepared.
    pub programs: u64,
    /// Dispatches encoded.
    pub dispatches: u64,
}

/// A freed buffer and the last command buffer that used it: a host write
/// into it waits for that one first (the GPU may still read it).
type Idle = (Storage, Option<Arc<Committed>>);

/// Freed buffers for later calls, by the policy every GPU executor shares
/// (`kiln_kernels::pool`).
#[derive(Default)]
struct Pool {
    idle: Mutex<IdleBuffers<Idle>>,
}

impl Pool {
    fn give(&self, idle_buffer: Idle) {
        let bytes = idle_buffer.0 .0.length() as u64;
        let released = lock(&self.idle).give((bytes, false), idle_buffer);
        // Releasing Metal objects is not done under the pool's lock.
        drop(released);
    }

    fn take(&self, bytes: u64) -> Option<Idle> {
        lock(&self.idle).take((bytes, false))
    }
}

/// Storage that returns to its pool when the last handle drops, with the
/// last command buffer that used it.
struct Held {
    storage: Option<Storage>,
    pool: Arc<Pool>,
    last_use: Mutex<Option<Arc<Committed>>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(storage) = self.storage.take() {
            let last_use = lock(&self.last_use).take();
            self.pool.give((storage, last_use));
        }
    }
}

impl Held {
    /// Records that `call` uses the buffer.
    fn used_by(&self, call: &Arc<Committed>) {
        *lock(&self.last_use) = Some(call.clone());
    }

    fn buffer(&self) -> &ProtocolObject<dyn MTLBuffer> {
        match &self.storage {
            Some(storage) => &storage.0,
            None => unreachable!("storage leaves a Held only when it drops"),
        }
    }
}

/// The command buffer of a call, with the status words its kernels wrote.
struct CallDone {
    command_buffer: Arc<Committed>,
    status: Option<(Held, Arc<[Check]>)>,
}

impl CallDone {
    /// Waits for the call, then `Err` for a failed command buffer or bad
    /// input its kernels reported.
    fn wait(&self) -> Result<()> {
        wait_for(&self.command_buffer.0)?;
        let Some((words, checks)) = &self.status else {
            return Ok(());
        };
        let words = read_words(words.buffer(), checks.len());
        Check::first_error(checks, &words).map_or(Ok(()), Err)
    }
}

/// Waits for a committed command buffer; `Err` when it failed.
fn wait_for(command_buffer: &ProtocolObject<dyn MTLCommandBuffer>) -> Result<()> {
    command_buffer.waitUntilCompleted();
    if command_buffer.status() == MTLCommandBufferStatus::Error {
        let reason = command_buffer.error().map_or_else(
            || "unknown".to_string(),
            |e| e.localizedDescription().to_string(),
        );
        return Err(backend_err(format!(
            "the call's command buffer failed: {reason}"
        )));
    }
    Ok(())
}

/// `count` words of a shared buffer's contents.
fn read_words(buffer: &ProtocolObject<dyn MTLBuffer>, count: usize) -> Vec<u32> {
    let count = count.min(buffer.length() / 4);
    // SAFETY: a shared buffer's contents are `length()` bytes of host
    // memory, read only after the command buffer writing them completed.
    unsafe { std::slice::from_raw_parts(buffer.contents().cast::<u32>().as_ptr(), count) }.to_vec()
}

/// A device-resident array. Clones share the storage.
#[derive(Clone)]
pub struct MetalBuffer {
    held: Arc<Held>,
    dtype: DType,
    len: usize,
    /// The call that wrote it, waited for before reading.
    written_by: Option<Arc<CallDone>>,
}

impl MetalBuffer {
    /// The element dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The element count.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for MetalBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MetalBuffer({}[{}])", self.dtype, self.len)
    }
}

/// A kernel's pipeline and what its translation binds.
struct Pipeline {
    state: Retained<ProtocolObject<dyn MTLComputePipelineState>>,
    kernel: MslKernel,
}

/// A program with its arena and pipelines.
struct Prepared {
    program: Program,
    arena: Held,
    params: Held,
    pipelines: Vec<Option<Arc<Pipeline>>>,
}

struct Shared {
    name: String,
    device: Device,
    queue: Retained<ProtocolObject<dyn MTLCommandQueue>>,
    caps: Caps,
    pool: Arc<Pool>,
    pipelines: Mutex<HashMap<String, Arc<Pipeline>>>,
    programs: Mutex<HashMap<u64, Vec<Arc<Prepared>>>>,
    pipelines_made: AtomicU64,
    buffers_made: AtomicU64,
    programs_made: AtomicU64,
    dispatches: AtomicU64,
}

impl Shared {
    /// A shared buffer of `bytes` (at least one word): a freed one when
    /// there is one, once the GPU is done with it if the host will write it
    /// (`host_writes`); the GPU's own later uses are ordered by the queue.
    fn buffer(&self, bytes: u64, host_writes: bool) -> Result<Held> {
        let bytes = bytes.max(4);
        let storage = match self.pool.take(bytes) {
            Some((storage, last_use)) => {
                if let (true, Some(call)) = (host_writes, last_use) {
                    call.0.waitUntilCompleted();
                }
                storage
            }
            None => {
                let made = self
                    .device
                    .newBufferWithLength_options(
                        bytes as usize,
                        MTLResourceOptions::StorageModeShared,
                    )
                    .ok_or(Error::Allocation {
                        op: "metal buffer".into(),
                        bytes: bytes as usize,
                    })?;
                self.buffers_made.fetch_add(1, Ordering::Relaxed);
                Storage(made)
            }
        };
        Ok(Held {
            storage: Some(storage),
            pool: self.pool.clone(),
            last_use: Mutex::default(),
        })
    }

    /// The pipeline of a dispatch's WGSL, translated and compiled once.
    fn pipeline(
        &self,
        op: &str,
        wgsl: &str,
        entry_point: &str,
        bindings: usize,
    ) -> Result<Arc<Pipeline>> {
        let key = format!("{entry_point}\n{bindings}\n{wgsl}");
        if let Some(found) = lock(&self.pipelines).get(&key) {
            return Ok(found.clone());
        }
        let kernel = msl::translate(op, wgsl, entry_point, bindings as u32)
            .map_err(|e| backend_err(e.to_string()))?;
        let library = self
            .device
            .newLibraryWithSource_options_error(
                &NSString::from_str(&kernel.source),
                Some(&precise_math_options()),
            )
            .map_err(|e| {
                backend_err(format!(
                    "the MSL of `{op}` does not compile: {}",
                    e.localizedDescription()
                ))
            })?;
        let function = library
            .newFunctionWithName(&NSString::from_str(&kernel.function))
            .ok_or_else(|| backend_err(format!("the MSL of `{op}` lost its kernel function")))?;
        let state = self
            .device
            .newComputePipelineStateWithFunction_error(&function)
            .map_err(|e| {
                backend_err(format!(
                    "the pipeline of `{op}` was rejected: {}",
                    e.localizedDescription()
                ))
            })?;
        let threads: usize = kernel
            .threads_per_group
            .iter()
            .map(|&t| t as usize)
            .product();
        if threads > state.maxTotalThreadsPerThreadgroup() {
            return Err(Error::Kernel {
                kernel: op.to_string(),
                detail: format!(
                    "its {threads} threads per group exceed this pipeline's {}",
                    state.maxTotalThreadsPerThreadgroup()
                ),
            });
        }
        self.pipelines_made.fetch_add(1, Ordering::Relaxed);
        let pipeline = Arc::new(Pipeline { state, kernel });
        lock(&self.pipelines).insert(key, pipeline.clone());
        Ok(pipeline)
    }

    /// The prepared program of `exe` for `shapes`, lowered on first use.
    fn prepared(&self, exe: &Executable, shapes: &[Vec<usize>]) -> Result<Arc<Prepared>> {
        if let Some(found) = lock(&self.programs)
            .get(&exe.id())
            .and_then(|programs| programs.iter().find(|p| p.program.shapes == shapes))
        {
            return Ok(found.clone());
        }
        let program = kiln_kernels::lower(exe, shapes, &self.caps)?;
        let arena = self.buffer(program.arena_bytes, true)?;
        for init in &program.arena_init {
            write_words(arena.buffer(), init.offset, &init.words)?;
        }
        let params = self.buffer(program.params_bytes, true)?;
        for init in &program.params_init {
            write_words(params.buffer(), init.offset, &init.words)?;
        }
        let pipelines = program
            .steps
            .iter()
            .map(|step| match step {
                Step::Dispatch(d) => self
                    .pipeline(&d.op, &d.source, &d.entry_point, d.bindings.len())
                    .map(Some),
                _ => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        self.programs_made.fetch_add(1, Ordering::Relaxed);
        let prepared = Arc::new(Prepared {
            program,
            arena,
            params,
            pipelines,
        });
        let mut programs = lock(&self.programs);
        if !programs.contains_key(&exe.id()) && programs.len() >= MAX_PREPARED_EXECUTABLES {
            programs.clear();
        }
        let entry = programs.entry(exe.id()).or_default();
        if entry.len() >= MAX_SHAPE_SETS {
            entry.remove(0);
        }
        entry.push(prepared.clone());
        Ok(prepared)
    }
}

/// Compile options without fast math, which Metal enables by default: it
/// may reassociate float arithmetic and assume NaN and infinities never
/// occur, which would undo the WGSL library's exact error terms and its
/// special values (the CPU's results, within their bounds). `mathMode`
/// exists from macOS 15 / iOS 18; older systems take the flag it replaced.
fn precise_math_options() -> Retained<MTLCompileOptions> {
    let options = MTLCompileOptions::new();
    if options.respondsToSelector(sel!(setMathMode:)) {
        options.setMathMode(MTLMathMode::Safe);
        options.setMathFloatingPointFunctions(MTLMathFloatingPointFunctions::Precise);
    } else {
        #[allow(deprecated)]
        options.setFastMathEnabled(false);
    }
    options
}

/// Writes `words` at byte `offset` of a shared buffer no command buffer
/// is using.
fn write_words(buffer: &ProtocolObject<dyn MTLBuffer>, offset: u64, words: &[u32]) -> Result<()> {
    let bytes = 4 * words.len();
    if offset as usize + bytes > buffer.length() {
        return Err(backend_err(format!(
            "{bytes} bytes at {offset} overflow a buffer of {}",
            buffer.length()
        )));
    }
    // SAFETY: in bounds (checked above) of host-visible shared memory that
    // no command buffer uses yet.
    unsafe {
        std::ptr::copy_nonoverlapping(
            words.as_ptr().cast::<u8>(),
            buffer.contents().cast::<u8>().as_ptr().add(offset as usize),
            bytes,
        );
    }
    Ok(())
}

/// Runs Kiln executables through Metal.
#[derive(Clone)]
pub struct MetalBackend {
    shared: Arc<Shared>,
}

impl MetalBackend {
    /// Opens the system's default Metal device (or, failing that, the
    /// first of all devices).
    pub fn new() -> std::result::Result<MetalBackend, DeviceError> {
        let device = MTLCreateSystemDefaultDevice()
            .or_else(|| MTLCopyAllDevices().firstObject())
            .ok_or_else(|| DeviceError("this machine has no Metal device".into()))?;
        let queue = device
            .newCommandQueue()
            .ok_or_else(|| DeviceError("the device gave no command queue".into()))?;
        let most = device.maxThreadsPerThreadgroup();
        let caps = Caps {
            backend: "metal".into(),
            // 31 buffer slots, one of them the sizes buffer.
            max_storage_buffers_per_stage: 30,
            max_workgroups_per_dimension: 65_535,
            max_workgroup_size: [most.width, most.height, most.depth].map(|n| n as u32),
            max_invocations_per_workgroup: 1024,
            max_binding_bytes: device.maxBufferLength() as u64,
            max_buffer_bytes: device.maxBufferLength() as u64,
            binding_offset_alignment: 256,
            native_f16: true,
            forced_matmul: None,
        };
        let name = format!("metal:{}", device.name());
        Ok(MetalBackend {
            shared: Arc::new(Shared {
                name,
                device,
                queue,
                caps,
                pool: Arc::default(),
                pipelines: Mutex::default(),
                programs: Mutex::default(),
                pipelines_made: AtomicU64::new(0),
                buffers_made: AtomicU64::new(0),
                programs_made: AtomicU64::new(0),
                dispatches: AtomicU64::new(0),
            }),
        })
    }

    /// Device objects made so far.
    pub fn counters(&self) -> Counters {
        let s = &self.shared;
        Counters {
            pipelines: s.pipelines_made.load(Ordering::Relaxed),
            buffers: s.buffers_made.load(Ordering::Relaxed),
            programs: s.programs_made.load(Ordering::Relaxed),
            dispatches: s.dispatches.load(Ordering::Relaxed),
        }
    }

    /// What programs are lowered within on this device.
    pub fn caps(&self) -> &Caps {
        &self.shared.caps
    }

    fn encode(
        &self,
        prepared: &Prepared,
        inputs: &[MetalBuffer],
        outputs: &[Held],
        command_buffer: &mut Retained<ProtocolObject<dyn MTLCommandBuffer>>,
        encoder: &mut Encoder,
    ) -> Result<()> {
        let resolve = |buffer: Buffer| -> Result<&ProtocolObject<dyn MTLBuffer>> {
            match buffer {
                Buffer::Arena => Some(prepared.arena.buffer()),
                Buffer::Params => Some(prepared.params.buffer()),
                Buffer::Input(i) => inputs.get(i).map(|b| b.held.buffer()),
                Buffer::Output(o) => outputs.get(o).map(Held::buffer),
            }
            .ok_or_else(|| {
                backend_err(format!("the program reads {buffer:?}, which was not given"))
            })
        };
        let inside = |range: &Range| -> Result<&ProtocolObject<dyn MTLBuffer>> {
            let buffer = resolve(range.buffer)?;
            if range.end() as usize > buffer.length() {
                return Err(backend_err(format!("{range:?} lies outside its buffer")));
            }
            Ok(buffer)
        };
        let steps = &prepared.program.steps;
        let mut c = 0;
        while let Some(step) = steps.get(c) {
            let pipeline = &prepared.pipelines[c];
            let mut next = c + 1;
            match (step, pipeline) {
                (Step::Dispatch(d), Some(pipeline)) => {
                    let compute = encoder.compute(command_buffer)?;
                    compute.setComputePipelineState(&pipeline.state);
                    for (index, range) in d.bindings.iter().enumerate() {
                        let buffer = inside(range)?;
                        // SAFETY: the range lies inside the buffer (checked).
                        unsafe {
                            compute.setBuffer_offset_atIndex(
                                Some(buffer),
                                range.offset as usize,
                                index,
                            )
                        };
                    }
                    if let Some(index) = pipeline.kernel.sizes_index {
                        let sizes: Vec<u32> = pipeline
                            .kernel
                            .sized_bindings
                            .iter()
                            .map(|&b| d.bindings.get(b as usize).map_or(0, |r| r.bytes as u32))
                            .collect();
                        // SAFETY: Metal copies the bytes before returning.
                        unsafe {
                            compute.setBytes_length_atIndex(
                                NonNull::from(&sizes[..]).cast::<c_void>(),
                                4 * sizes.len(),
                                index as usize,
                            );
                        }
                    }
                    let [x, y, z] = d.grid.map(|n| n as usize);
                    let [tx, ty, tz] = pipeline.kernel.threads_per_group.map(|n| n as usize);
                    compute.dispatchThreadgroups_threadsPerThreadgroup(
                        MTLSize {
                            width: x,
                            height: y,
                            depth: z,
                        },
                        MTLSize {
                            width: tx,
                            height: ty,
                            depth: tz,
                        },
                    );
                    self.shared.dispatches.fetch_add(1, Ordering::Relaxed);
                }
                (Step::Copy { from, to }, _) => {
                    let (source, target) = (inside(from)?, inside(to)?);
                    let blit = encoder.blit(command_buffer)?;
                    // SAFETY: both ranges lie inside their buffers (checked).
                    unsafe {
                        blit.copyFromBuffer_sourceOffset_toBuffer_destinationOffset_size(
                            source,
                            from.offset as usize,
                            target,
                            to.offset as usize,
                            from.bytes as usize,
                        );
                    }
                }
                (Step::Clear(range), _) => {
                    let buffer = inside(range)?;
                    let range = NSRange::new(range.offset as usize, range.bytes as usize);
                    encoder
                        .blit(command_buffer)?
                        .fillBuffer_range_value(buffer, range, 0);
                }
                (Step::Dispatch(d), None) => {
                    return Err(backend_err(format!("`{}` has no pipeline", d.op)))
                }
                // A `while_loop`'s test: what is encoded so far runs, and
                // the predicate is read from the shared arena.
                (Step::Branch { predicate, exit }, _) => {
                    let arena = inside(predicate)?;
                    encoder.end();
                    command_buffer.commit();
                    wait_for(command_buffer)?;
                    // SAFETY: the word lies inside the shared arena (checked)
                    // and the command buffer writing it has completed.
                    let word = unsafe {
                        arena
                            .contents()
                            .cast::<u8>()
                            .add(predicate.offset as usize)
                            .cast::<u32>()
                            .read_unaligned()
                    };
                    *command_buffer = self
                        .shared
                        .queue
                        .commandBuffer()
                        .ok_or_else(|| backend_err("the queue gave no command buffer"))?;
                    if word == 0 {
                        next = *exit;
                    }
                }
                (Step::Jump { to }, _) => next = *to,
            }
            c = next;
        }
        Ok(())
    }
}

/// The encoder a call is recording into.
enum Encoder {
    None,
    Compute(Retained<ProtocolObject<dyn MTLComputeCommandEncoder>>),
    Blit(Retained<ProtocolObject<dyn MTLBlitCommandEncoder>>),
}

// Metal requires every encoder to end before it is released, also when a
// call stops early with an error.
impl Drop for Encoder {
    fn drop(&mut self) {
        self.end();
    }
}

impl Encoder {
    fn end(&mut self) {
        match self {
            Encoder::Compute(e) => e.endEncoding(),
            Encoder::Blit(e) => e.endEncoding(),
            Encoder::None => {}
        }
        *self = Encoder::None;
    }

    fn compute(
        &mut self,
        command_buffer: &ProtocolObject<dyn MTLCommandBuffer>,
    ) -> Result<&ProtocolObject<dyn MTLComputeCommandEncoder>> {
        if !matches!(self, Encoder::Compute(_)) {
            self.end();
            let encoder = command_buffer
                .computeCommandEncoder()
                .ok_or_else(|| backend_err("no compute encoder"))?;
            *self = Encoder::Compute(encoder);
        }
        match self {
            Encoder::Compute(e) => Ok(e),
            _ => Err(backend_err("no compute encoder")),
        }
    }

    fn blit(
        &mut self,
        command_buffer: &ProtocolObject<dyn MTLCommandBuffer>,
    ) -> Result<&ProtocolObject<dyn MTLBlitCommandEncoder>> {
        if !matches!(self, Encoder::Blit(_)) {
            self.end();
            let encoder = command_buffer
                .blitCommandEncoder()
                .ok_or_else(|| backend_err("no blit encoder"))?;
            *self = Encoder::Blit(encoder);
        }
        match self {
            Encoder::Blit(e) => Ok(e),
            _ => Err(backend_err("no blit encoder")),
        }
    }
}

impl Backend for MetalBackend {
    type Buffer = MetalBuffer;

    fn name(&self) -> &str {
        &self.shared.name
    }

    /// The lowering's matmul kernels read a transposed operand in place
    /// (`kiln_kernels::family::matmul`).
    fn reads_transposed_operands(&self) -> bool {
        true
    }

    fn upload(&self, data: &Arc<HostData>) -> Result<MetalBuffer> {
        let held = self
            .shared
            .buffer(storage_bytes(data.dtype(), data.len()), true)?;
        write_words(held.buffer(), 0, &to_words(data))?;
        Ok(MetalBuffer {
            held: Arc::new(held),
            dtype: data.dtype(),
            len: data.len(),
            written_by: None,
        })
    }

    fn download(&self, buffer: MetalBuffer) -> Result<Arc<HostData>> {
        if let Some(call) = &buffer.written_by {
            call.wait()?;
        }
        let words = read_words(
            buffer.held.buffer(),
            kiln_kernels::words(buffer.dtype, buffer.len),
        );
        Ok(Arc::new(from_words(buffer.dtype, buffer.len, &words)))
    }

    fn run(
        &self,
        exe: &Executable,
        inputs: Vec<MetalBuffer>,
        shapes: &[Vec<usize>],
    ) -> Result<Vec<MetalBuffer>> {
        let s = &self.shared;
        if shapes.len() != exe.graph().nodes.len() {
            return Err(backend_err(format!(
                "{} value shapes for a graph of {} values",
                shapes.len(),
                exe.graph().nodes.len()
            )));
        }
        let prepared = s.prepared(exe, shapes)?;
        let program = &prepared.program;
        let mut command_buffer = s
            .queue
            .commandBuffer()
            .ok_or_else(|| backend_err("the queue gave no command buffer"))?;
        // An argument written in place gets a private copy where another
        // handle still shares it, blitted at the start of this call.
        let mut inputs = inputs;
        let mut copies = Vec::new();
        for &i in &program.written_inputs {
            let Some(original) = inputs.get(i) else {
                continue;
            };
            if Arc::strong_count(&original.held) > 1 {
                let copy = s.buffer(storage_bytes(original.dtype, original.len), false)?;
                copies.push((original.held.clone(), i, copy));
            }
        }
        let mut encoder = Encoder::None;
        let mut originals = Vec::with_capacity(copies.len());
        for (original, i, copy) in copies {
            let blit = encoder.blit(&command_buffer)?;
            let bytes = original.buffer().length().min(copy.buffer().length());
            // SAFETY: `bytes` fits both buffers.
            unsafe {
                blit.copyFromBuffer_sourceOffset_toBuffer_destinationOffset_size(
                    original.buffer(),
                    0,
                    copy.buffer(),
                    0,
                    bytes,
                );
            }
            let (dtype, len) = (inputs[i].dtype, inputs[i].len);
            inputs[i] = MetalBuffer {
                held: Arc::new(copy),
                dtype,
                len,
                written_by: None,
            };
            originals.push(original);
        }
        let outputs = program
            .outputs
            .iter()
            .map(|output| s.buffer(output.bytes, false))
            .collect::<Result<Vec<_>>>()?;
        self.encode(
            &prepared,
            &inputs,
            &outputs,
            &mut command_buffer,
            &mut encoder,
        )?;
        let status = if program.checks.is_empty() {
            None
        } else {
            let words = s.buffer(4 * program.checks.len() as u64, false)?;
            let blit = encoder.blit(&command_buffer)?;
            for (k, check) in program.checks.iter().enumerate() {
                // SAFETY: the word lies in the arena and `k` in `words`.
                unsafe {
                    blit.copyFromBuffer_sourceOffset_toBuffer_destinationOffset_size(
                        prepared.arena.buffer(),
                        check.word.offset as usize,
                        words.buffer(),
                        4 * k,
                        4,
                    );
                }
            }
            Some((words, program.checks.clone().into()))
        };
        encoder.end();
        command_buffer.commit();
        let committed = Arc::new(Committed(command_buffer));
        prepared.arena.used_by(&committed);
        prepared.params.used_by(&committed);
        // Every buffer the call reads or writes, so that none returns to the
        // pool and takes a host write while the GPU may still use it.
        let status_words = status.as_ref().map(|(words, _)| words);
        for buffer in (inputs.iter().map(|b| &*b.held))
            .chain(&outputs)
            .chain(originals.iter().map(|held| &**held))
            .chain(status_words)
        {
            buffer.used_by(&committed);
        }
        let call = Arc::new(CallDone {
            command_buffer: committed,
            status,
        });
        Ok(outputs
            .into_iter()
            .zip(&program.outputs)
            .map(|(held, output)| MetalBuffer {
                held: Arc::new(held),
                dtype: output.dtype,
                len: output.len,
                written_by: Some(call.clone()),
            })
            .collect())
    }
}
