//! A lowered [`Program`] made ready on the device: its arena buffer with
//! the initial data written, a pipeline per dispatch and the bind groups
//! that name only the arena. Made on the first call with a set of shapes
//! and replayed by every later one.

use crate::shared::{backend_err, lock, Pipeline, Shared};
use kiln::{Executable, Result};
use kiln_kernels::program::{Buffer, Check, Program, Range, Step};
use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A program with its device objects.
pub(crate) struct Prepared {
    pub program: Program,
    /// The one buffer of slots, constants, parameters, status words and
    /// scratch.
    pub arena: wgpu::Buffer,
    /// The parameter words of every dispatch, bound read-only.
    pub params: wgpu::Buffer,
    /// Per step: the pipeline of a dispatch.
    pub pipelines: Vec<Option<Pipeline>>,
    /// Per step: the bind group of a dispatch binding only the arena.
    pub fixed_groups: Vec<Option<wgpu::BindGroup>>,
    /// The checks, shared with each call's status words.
    pub checks: Arc<[Check]>,
    /// Bind groups of dispatches naming argument or output buffers.
    pub call_groups: Mutex<CallBindGroups>,
}

/// A program's bind groups over call buffers, by step index and the
/// buffers bound. Each group holds its buffers, so the groups are dropped
/// whenever the pool has released buffers since they were made
/// (`pool_evictions` is the pool's count then): a released buffer's memory
/// is freed only once no group names it.
#[derive(Default)]
pub(crate) struct CallBindGroups {
    pub groups: HashMap<(usize, Vec<wgpu::Buffer>), wgpu::BindGroup>,
    pub pool_evictions: u64,
}

/// The binding of `range` of `buffer`, checked to lie inside it.
pub(crate) fn binding<'a>(
    buffer: &'a wgpu::Buffer,
    range: &Range,
) -> Result<wgpu::BufferBinding<'a>> {
    if range.end() > buffer.size() {
        return Err(backend_err(format!(
            "a binding of bytes {}..{} of {:?} lies outside its {} bytes",
            range.offset,
            range.end(),
            range.buffer,
            buffer.size()
        )));
    }
    Ok(wgpu::BufferBinding {
        buffer,
        offset: range.offset,
        size: NonZeroU64::new(range.bytes),
    })
}

impl Prepared {
    /// Makes `program`'s arena (initial data written), pipelines and fixed
    /// bind groups on `shared`'s device.
    pub(crate) fn new(shared: &Shared, program: Program) -> Result<Prepared> {
        let filled = |bytes: u64, init: &[kiln_kernels::program::ArenaInit]| {
            let buffer = shared.new_buffer(bytes);
            for part in init {
                shared.gpu.queue.write_buffer(
                    &buffer,
                    part.offset,
                    bytemuck::cast_slice(&part.words),
                );
            }
            buffer
        };
        let arena = filled(program.arena_bytes, &program.arena_init);
        let params = filled(program.params_bytes, &program.params_init);
        let fixed_buffer = |buffer: Buffer| match buffer {
            Buffer::Arena => Some(&arena),
            Buffer::Params => Some(&params),
            Buffer::Input(_) | Buffer::Output(_) => None,
        };
        let mut pipelines = Vec::with_capacity(program.steps.len());
        let mut fixed_groups = Vec::with_capacity(program.steps.len());
        for step in &program.steps {
            let Step::Dispatch(dispatch) = step else {
                pipelines.push(None);
                fixed_groups.push(None);
                continue;
            };
            let (pipeline, layout) = shared.pipeline(
                &dispatch.op,
                &dispatch.source,
                &dispatch.entry_point,
                dispatch.bindings.len(),
            )?;
            let fixed: Option<Vec<&wgpu::Buffer>> = dispatch
                .bindings
                .iter()
                .map(|range| fixed_buffer(range.buffer))
                .collect();
            let fixed = match fixed {
                Some(buffers) => {
                    let bindings = buffers
                        .into_iter()
                        .zip(&dispatch.bindings)
                        .map(|(buffer, range)| binding(buffer, range))
                        .collect::<Result<Vec<_>>>()?;
                    Some(shared.bind_group(&layout, bindings))
                }
                None => None,
            };
            pipelines.push(Some((pipeline, layout)));
            fixed_groups.push(fixed);
        }
        let checks = program.checks.clone().into();
        Ok(Prepared {
            program,
            arena,
            params,
            pipelines,
            fixed_groups,
            checks,
            call_groups: Mutex::default(),
        })
    }

    /// The bind group of dispatch step `c` over this call's `resolve`d
    /// buffers: made once per distinct set of buffers (the pool tends to
    /// hand out the same ones call after call).
    pub(crate) fn call_group<'a>(
        &self,
        shared: &Shared,
        cached: &mut CallBindGroups,
        c: usize,
        ranges: &[Range],
        resolve: &impl Fn(Buffer) -> Result<&'a wgpu::Buffer>,
    ) -> Result<wgpu::BindGroup> {
        let buffers = ranges
            .iter()
            .map(|range| resolve(range.buffer).cloned())
            .collect::<Result<Vec<_>>>()?;
        let key = (c, buffers);
        if let Some(group) = cached.groups.get(&key) {
            return Ok(group.clone());
        }
        let Some((_, layout)) = &self.pipelines[c] else {
            return Err(backend_err(format!("step {c} is not a dispatch")));
        };
        let bindings = key
            .1
            .iter()
            .zip(ranges)
            .map(|(buffer, range)| binding(buffer, range))
            .collect::<Result<Vec<_>>>()?;
        let group = shared.bind_group(layout, bindings);
        cached.groups.insert(key, group.clone());
        Ok(group)
    }
}

/// Executables whose programs (and so arenas) are kept; beyond it the least
/// recently used one's are released.
const MAX_PREPARED_EXECUTABLES: usize = 64;

/// Shape sets kept per executable (a shapeless one sees many); beyond it
/// the oldest program is released.
const MAX_SHAPE_SETS: usize = 16;

/// The programs prepared for one executable (known by [`Executable::id`]).
struct ExePrograms {
    programs: Vec<Arc<Prepared>>,
    /// When a call last used one of them (a tick of `program_clock`).
    last_used: u64,
}

/// The programs a backend has prepared, by executable and shapes; an
/// executable's programs hold its arenas.
#[derive(Default)]
pub(crate) struct ProgramCache {
    programs: Mutex<HashMap<u64, ExePrograms>>,
    /// Programs prepared so far.
    pub built: AtomicU64,
    clock: AtomicU64,
}

impl ProgramCache {
    /// The prepared program of `exe` for `shapes`, if one was prepared
    /// (and is still kept); counts as no use.
    pub(crate) fn prepared(
        &self,
        exe: &Executable,
        shapes: &[Vec<usize>],
    ) -> Option<Arc<Prepared>> {
        let programs = lock(&self.programs);
        let entry = programs.get(&exe.id())?;
        entry
            .programs
            .iter()
            .find(|p| p.program.shapes == shapes)
            .cloned()
    }

    /// The prepared program of `exe` for `shapes` on `shared`'s device,
    /// lowered and prepared on first use.
    pub(crate) fn get(
        &self,
        shared: &Shared,
        exe: &Executable,
        shapes: &[Vec<usize>],
    ) -> Result<Arc<Prepared>> {
        let key = exe.id();
        let tick = self.clock.fetch_add(1, Ordering::Relaxed);
        {
            let mut programs = lock(&self.programs);
            if let Some(entry) = programs.get_mut(&key) {
                if let Some(found) = entry.programs.iter().find(|p| p.program.shapes == shapes) {
                    entry.last_used = tick;
                    return Ok(found.clone());
                }
            }
        }
        let program = kiln_kernels::lower(exe, shapes, &shared.caps)?;
        let prepared = Arc::new(Prepared::new(shared, program)?);
        self.built.fetch_add(1, Ordering::Relaxed);
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

    /// Forgets every program of `exe` (after a device error).
    pub(crate) fn forget(&self, exe: &Executable) {
        lock(&self.programs).remove(&exe.id());
    }

    /// Bytes of the arenas and parameter buffers held.
    pub(crate) fn held_bytes(&self) -> u64 {
        lock(&self.programs)
            .values()
            .flat_map(|entry| &entry.programs)
            .map(|prepared| prepared.arena.size() + prepared.params.size())
            .sum()
    }
}

/// Locks a program's call bind groups.
pub(crate) fn call_groups(prepared: &Prepared) -> std::sync::MutexGuard<'_, CallBindGroups> {
    lock(&prepared.call_groups)
}
