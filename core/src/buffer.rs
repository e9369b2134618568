//! Device buffers as the layers below the executors see them: a
//! type-erased buffer, the future of its readback, and `ReadBack`, the
//! narrow interface through which an array kept on a device reads its
//! value back. The `Array` handle holds these; the executors
//! ([`crate::exec`]) implement them, so the handle never imports an
//! executor.

use crate::data::HostData;
use crate::error::Result;
use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// A buffer of some device, its type erased: what [`crate::Device`] moves
/// around. A [`crate::CpuBackend`] buffer is an `Arc<HostData>` inside.
pub type DeviceBuffer = Arc<dyn Any + Send + Sync>;

/// The readback of [`crate::Backend::download_async`].
pub type DownloadFuture<'a> = Pin<Box<dyn Future<Output = Result<Arc<HostData>>> + 'a>>;

/// What an array whose value stays on a device needs from that device:
/// its name and reading the buffer back. Every [`crate::Device`] provides
/// it (see `exec::device::read_back`).
pub(crate) trait ReadBack: Send + Sync {
    /// The device's name.
    fn name(&self) -> &str;
    /// Copies `buffer` back to the host, blocking.
    fn download(&self, buffer: &DeviceBuffer) -> Result<Arc<HostData>>;
    /// Copies `buffer` back to the host without blocking.
    fn download_async(&self, buffer: &DeviceBuffer) -> DownloadFuture<'_>;
}

/// The host data inside `buffer` when it is a host buffer (the CPU
/// executor's): such a value needs no readback.
pub(crate) fn host_data(buffer: &DeviceBuffer) -> Option<Arc<HostData>> {
    buffer.downcast_ref::<Arc<HostData>>().cloned()
}
