//! What a backend keeps for its device across executables: the device
//! and queue, the buffer pool, pipelines cached by source and the bind
//! group layouts, counters, and the caps programs are lowered within.

use crate::buffer::Pool;
use crate::device::{block_on, Gpu};
use kiln::{Error, Result};
use kiln_kernels::program::Caps;
use kiln_kernels::MatmulVariant;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// A compute pipeline and the layout of its one bind group.
pub(crate) type Pipeline = (Arc<wgpu::ComputePipeline>, Arc<wgpu::BindGroupLayout>);

/// The bind group layout and pipeline layout of kernels with a given
/// number of bindings.
type Layouts = (Arc<wgpu::BindGroupLayout>, Arc<wgpu::PipelineLayout>);

/// A backend's device and what it keeps across executables: the buffer
/// pool, pipelines and bind group layouts, counters, and the caps programs
/// are lowered within.
pub(crate) struct Shared {
    pub(crate) name: String,
    pub(crate) gpu: Gpu,
    pub(crate) pool: Arc<Pool>,
    pub(crate) pipelines: Mutex<HashMap<String, Pipeline>>,
    pub(crate) layouts: Mutex<HashMap<usize, Layouts>>,
    pub(crate) pipelines_created: AtomicU64,
    pub(crate) other_buffers: AtomicU64,
    pub(crate) dispatches: AtomicU64,
    /// What programs are lowered within.
    pub(crate) caps: Caps,
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
    pub(crate) fn new(name: String, gpu: Gpu, caps: Caps) -> Shared {
        Shared {
            name,
            gpu,
            pool: Arc::new(Pool::default()),
            pipelines: Mutex::default(),
            layouts: Mutex::default(),
            pipelines_created: AtomicU64::new(0),
            other_buffers: AtomicU64::new(0),
            dispatches: AtomicU64::new(0),
            caps,
        }
    }

    /// `Err` naming the size and the limit when a buffer of `bytes` cannot
    /// be bound.
    pub(crate) fn check_size(&self, op: &str, bytes: u64) -> Result<()> {
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
    pub(crate) fn new_buffer(&self, bytes: u64) -> wgpu::Buffer {
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

    /// The bind group layout of kernels with `count` bindings: the
    /// parameters read-only, every other binding writable storage (see
    /// `kiln_kernels::abi`), so one dispatch may bind several ranges of the
    /// arena.
    pub(crate) fn layout(&self, count: usize) -> Layouts {
        let mut layouts = lock(&self.layouts);
        let entry = layouts.entry(count).or_insert_with(|| {
            let entries: Vec<wgpu::BindGroupLayoutEntry> = (0..count)
                .map(|binding| wgpu::BindGroupLayoutEntry {
                    binding: binding as u32,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        // The parameters (binding 0) are read-only, in
                        // a buffer of their own; see `kiln_kernels::abi`.
                        ty: wgpu::BufferBindingType::Storage {
                            read_only: binding == 0,
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
    pub(crate) fn pipeline(
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

    pub(crate) fn bind_group(
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
    pub(crate) fn check_alive(&self) -> Result<()> {
        match lock(&self.gpu.lost).as_ref() {
            Some(reason) => Err(backend_err(format!(
                "the device of `{}` was lost ({reason}); create a new backend",
                self.name
            ))),
            None => Ok(()),
        }
    }

    /// Errors the device raised outside an error scope since last asked.
    pub(crate) fn take_uncaptured(&self) -> Result<()> {
        let errors = std::mem::take(&mut *lock(&self.gpu.uncaptured));
        if errors.is_empty() {
            Ok(())
        } else {
            Err(backend_err(errors.join("; ")))
        }
    }
}

/// What a program may use on `gpu`: its limits and features.
pub(crate) fn caps(gpu: &Gpu, native_f16: bool, forced_matmul: Option<MatmulVariant>) -> Caps {
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
