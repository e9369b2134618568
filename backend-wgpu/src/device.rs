//! Adapter and device acquisition, and how device errors become `Err`s.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

/// Environment variable naming the wgpu backends to try (`vulkan`, `metal`,
/// `dx12`, `gl`, `webgpu`, comma separated); wgpu's own `WGPU_BACKEND` is
/// honoured when this one is unset.
pub const BACKEND_ENV: &str = "KILN_WGPU_BACKEND";

/// Why no device could be had.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeviceError {
    /// No adapter matched (no GPU and no software rasterizer installed).
    #[error("no wgpu adapter found for backends {backends}: {detail}")]
    NoAdapter {
        /// The backends searched.
        backends: String,
        /// wgpu's explanation.
        detail: String,
    },
    /// The adapter refused the device request.
    #[error("adapter `{adapter}` refused a device: {detail}")]
    RequestDevice {
        /// The adapter's name.
        adapter: String,
        /// wgpu's explanation.
        detail: String,
    },
}

/// A device error as Kiln's [`kiln::Error::Backend`], keeping its
/// message, so `?` on [`crate::WgpuBackend::new`] works in a function
/// returning [`kiln::Result`].
///
/// ```no_run
/// fn run() -> kiln::Result<()> {
///     let backend = kiln_wgpu::WgpuBackend::new()?;
///     # drop(backend);
///     Ok(())
/// }
/// ```
impl From<DeviceError> for kiln::Error {
    fn from(error: DeviceError) -> kiln::Error {
        kiln::Error::Backend {
            backend: "wgpu".to_string(),
            detail: error.to_string(),
        }
    }
}

/// Device, queue and what the device reports outside an error scope;
/// clones share the device and its reports.
#[derive(Clone)]
pub(crate) struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub limits: wgpu::Limits,
    pub info: wgpu::AdapterInfo,
    /// Set when the device is lost; every later call reports it.
    pub lost: Arc<Mutex<Option<String>>>,
    /// Errors raised outside any error scope since the last call.
    pub uncaptured: Arc<Mutex<Vec<String>>>,
}

/// The backends to search: `KILN_WGPU_BACKEND`, else `WGPU_BACKEND`, else all.
fn backends() -> wgpu::Backends {
    match std::env::var(BACKEND_ENV) {
        Ok(list) if !list.trim().is_empty() => wgpu::Backends::from_comma_list(&list),
        _ => wgpu::Backends::all().with_env(),
    }
}

/// Opens the default adapter with its own limits and, where offered,
/// SHADER_F16.
pub(crate) async fn open() -> Result<Gpu, DeviceError> {
    let backends = backends();
    let mut descriptor = wgpu::InstanceDescriptor::new_without_display_handle().with_env();
    descriptor.backends = backends;
    let instance = wgpu::Instance::new(descriptor);
    let adapter = instance
        .request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::from_env()
                .unwrap_or(wgpu::PowerPreference::HighPerformance),
            force_fallback_adapter: false,
            compatible_surface: None,
            apply_limit_buckets: false,
        })
        .await
        .map_err(|e| DeviceError::NoAdapter {
            backends: format!("{backends:?}"),
            detail: e.to_string(),
        })?;
    let info = adapter.get_info();
    let limits = adapter.limits();
    // f16 arithmetic where the adapter has it; timestamps for
    // `WgpuBackend::set_gpu_timing`.
    let features =
        adapter.features() & (wgpu::Features::SHADER_F16 | wgpu::Features::TIMESTAMP_QUERY);
    let (device, queue) = adapter
        .request_device(&wgpu::DeviceDescriptor {
            label: Some("kiln"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        })
        .await
        .map_err(|e| DeviceError::RequestDevice {
            adapter: info.name.clone(),
            detail: e.to_string(),
        })?;
    let lost = Arc::new(Mutex::new(None));
    let lost_in_callback = lost.clone();
    device.set_device_lost_callback(move |reason, message| {
        *lost_in_callback
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(format!("{reason:?}: {message}"));
    });
    let uncaptured = Arc::new(Mutex::new(Vec::new()));
    let uncaptured_in_handler = uncaptured.clone();
    device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| {
        uncaptured_in_handler
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(error.to_string());
    }));
    Ok(Gpu {
        device,
        queue,
        limits,
        info,
        lost,
        uncaptured,
    })
}

/// True where a call may wait for the device ([`block_on`] completes).
pub(crate) const CAN_BLOCK: bool = cfg!(not(target_arch = "wasm32"));

/// Waits for `future` where the platform can block (native), `None` in the
/// browser, where only the event loop can drive it.
pub(crate) fn block_on<F: Future>(future: F) -> Option<F::Output> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        Some(pollster::block_on(future))
    }
    #[cfg(target_arch = "wasm32")]
    {
        drop(future);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::DeviceError;

    fn open(result: Result<(), DeviceError>) -> kiln::Result<()> {
        result?;
        Ok(())
    }

    #[test]
    fn a_device_error_becomes_a_backend_error_keeping_its_message() {
        let error = DeviceError::NoAdapter {
            backends: "vulkan".to_string(),
            detail: "none installed".to_string(),
        };
        let converted = open(Err(error.clone())).unwrap_err();
        assert_eq!(
            converted,
            kiln::Error::Backend {
                backend: "wgpu".to_string(),
                detail: error.to_string(),
            }
        );
        assert_eq!(
            converted.to_string(),
            "backend `wgpu`: no wgpu adapter found for backends vulkan: none installed"
        );
    }
}
