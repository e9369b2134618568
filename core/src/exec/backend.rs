//! The [`Backend`] trait: what every executor (the CPU executor here,
//! wgpu and Metal in their crates) implements to run an [`Executable`].

use super::kernels::KernelList;
use super::Executable;
use crate::buffer::DeviceBuffer;
use crate::data::HostData;
use crate::error::{Error, Result};
use std::sync::Arc;

pub use crate::buffer::DownloadFuture;

/// A device that runs executables.
///
/// Buffers are the backend's own; `upload` and `download` move host data in
/// and out, and `run` executes every step of an executable, returning the
/// graph outputs.
pub trait Backend: Send + Sync + 'static {
    /// A device-resident buffer; a clone shares it (an array whose value
    /// stays on the device holds one).
    type Buffer: Clone + Send + Sync + 'static;
    /// A short name that is part of every cache key (`cpu`, `wgpu:…`).
    fn name(&self) -> &str;
    /// Copies host data to the device.
    fn upload(&self, data: &Arc<HostData>) -> Result<Self::Buffer>;
    /// True when `run` executes [`crate::Op::TransposedMatmul`], so
    /// `compile` lets products read transposed operands in place
    /// ([`crate::passes::transposed_operands`]). By default, false.
    fn reads_transposed_operands(&self) -> bool {
        false
    }
    /// Copies a buffer back to the host.
    fn download(&self, buffer: Self::Buffer) -> Result<Arc<HostData>>;
    /// Copies a buffer back to the host without blocking, for a browser,
    /// where a GPU readback completes only after the page yields. By
    /// default it completes at once through [`Backend::download`].
    fn download_async(&self, buffer: Self::Buffer) -> DownloadFuture<'_> {
        Box::pin(std::future::ready(self.download(buffer)))
    }
    /// Runs `exe` on argument buffers through its [`SlotPlan`](crate::plan::SlotPlan); `shapes` is
    /// the concrete shape of every value of its graph, as
    /// [`Executable::resolve_shapes`] gives them for this call. The
    /// buffers are given up: an argument the plan writes in place (a
    /// donated one) may be reused when nothing else holds it.
    fn run(
        &self,
        exe: &Executable,
        inputs: Vec<Self::Buffer>,
        shapes: &[Vec<usize>],
    ) -> Result<Vec<Self::Buffer>>;
    /// What `run` executes for `exe` at `shapes` (as for [`Backend::run`]),
    /// step by step: its kernels with their sources, bindings and grids, or
    /// the op nodes it evaluates. By default an `Err`: a backend that can
    /// list its steps says so.
    fn kernels(&self, exe: &Executable, shapes: &[Vec<usize>]) -> Result<KernelList> {
        let _ = (exe, shapes);
        Err(Error::Backend {
            backend: self.name().to_string(),
            detail: "this backend does not list its kernels".to_string(),
        })
    }
    /// `buffer` type-erased, as a [`crate::Device`] and an array kept on
    /// the device hold it.
    fn share(buffer: Self::Buffer) -> DeviceBuffer {
        Arc::new(buffer)
    }
    /// A buffer of this backend back from [`Backend::share`]; `None` for
    /// another backend's.
    fn unshare(buffer: &DeviceBuffer) -> Option<Self::Buffer> {
        buffer.downcast_ref::<Self::Buffer>().cloned()
    }
}
