//! The default device, as MLX has one: where eager ops (those outside
//! [`crate::compile()`]) run, and where their results stay until read.
//!
//! A [`Device`] is any [`Backend`] seen through an object-safe interface
//! whose buffers are type-erased ([`DeviceBuffer`]). [`crate::eval()`] runs
//! pending arrays on the default device; a result that is not host data
//! (a GPU buffer) stays on the device, and a reader ([`Array::data`],
//! [`Array::to_vec`]) or [`crate::eval_async`] copies it back when asked.
//! [`AnyBackend`] lets a compiled function run on a device chosen at run
//! time (the playground's backend switch).
//!
//! The default is per thread: tests running side by side, and a program
//! whose threads use different devices, do not see each other's choice.
//!
//! ```
//! use kiln::{default_device, with_default_device, Array, CpuBackend, DType};
//! use std::sync::Arc;
//! assert_eq!(default_device().name(), "cpu");
//! let y = with_default_device(Arc::new(CpuBackend), || {
//!     (Array::ones(&[3], DType::F32) * 2.0).to_vec::<f32>()
//! })?;
//! assert_eq!(y, vec![2.0; 3]);
//! # Ok::<(), kiln::Error>(())
//! ```
//!
//! [`Array::data`]: crate::Array::data
//! [`Array::to_vec`]: crate::Array::to_vec

use super::{Backend, CpuBackend, DownloadFuture, Executable, KernelList};
use crate::buffer::ReadBack;
use crate::data::HostData;
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::sync::Arc;

pub use crate::buffer::DeviceBuffer;

/// A [`Backend`] behind an object-safe interface, so the device can be
/// chosen at run time. Every backend is one.
pub trait Device: Send + Sync {
    /// The backend's name (part of every cache key).
    fn name(&self) -> &str;
    /// Copies host data to the device.
    fn upload(&self, data: &Arc<HostData>) -> Result<DeviceBuffer>;
    /// As [`Backend::reads_transposed_operands`] (by default, false).
    fn reads_transposed_operands(&self) -> bool {
        false
    }
    /// Runs `exe` like [`Backend::run`].
    fn run(
        &self,
        exe: &Executable,
        inputs: Vec<DeviceBuffer>,
        shapes: &[Vec<usize>],
    ) -> Result<Vec<DeviceBuffer>>;
    /// Lists what `run` executes, like [`Backend::kernels`] (by default
    /// an `Err`, as there).
    fn kernels(&self, exe: &Executable, shapes: &[Vec<usize>]) -> Result<KernelList> {
        let _ = (exe, shapes);
        Err(Error::Backend {
            backend: self.name().to_string(),
            detail: "this device does not list its kernels".to_string(),
        })
    }
    /// Copies a buffer back to the host, blocking (an `Err` in a browser,
    /// where only [`Device::download_async`] can read a GPU buffer).
    fn download(&self, buffer: &DeviceBuffer) -> Result<Arc<HostData>>;
    /// Copies a buffer back to the host without blocking.
    fn download_async(&self, buffer: &DeviceBuffer) -> DownloadFuture<'_>;
}

/// `buffer` as the buffer type of `B`, or an `Err` naming both devices.
fn concrete<B: Backend>(backend: &B, buffer: &DeviceBuffer) -> Result<B::Buffer> {
    B::unshare(buffer).ok_or_else(|| Error::Backend {
        backend: backend.name().to_string(),
        detail: "given a buffer of another device".to_string(),
    })
}

impl<B: Backend> Device for B {
    fn name(&self) -> &str {
        Backend::name(self)
    }

    fn upload(&self, data: &Arc<HostData>) -> Result<DeviceBuffer> {
        Ok(B::share(Backend::upload(self, data)?))
    }

    fn reads_transposed_operands(&self) -> bool {
        Backend::reads_transposed_operands(self)
    }

    fn run(
        &self,
        exe: &Executable,
        inputs: Vec<DeviceBuffer>,
        shapes: &[Vec<usize>],
    ) -> Result<Vec<DeviceBuffer>> {
        let inputs = inputs
            .iter()
            .map(|b| concrete(self, b))
            .collect::<Result<Vec<_>>>()?;
        Ok(Backend::run(self, exe, inputs, shapes)?
            .into_iter()
            .map(B::share)
            .collect())
    }

    fn kernels(&self, exe: &Executable, shapes: &[Vec<usize>]) -> Result<KernelList> {
        Backend::kernels(self, exe, shapes)
    }

    fn download(&self, buffer: &DeviceBuffer) -> Result<Arc<HostData>> {
        Backend::download(self, concrete(self, buffer)?)
    }

    fn download_async(&self, buffer: &DeviceBuffer) -> DownloadFuture<'_> {
        match concrete(self, buffer) {
            Ok(buffer) => Backend::download_async(self, buffer),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }
}

/// `device` as an array kept on it sees it: the handle sits below the
/// executors and reads its value back through [`ReadBack`] only.
pub(crate) fn read_back(device: Arc<dyn Device>) -> Arc<dyn ReadBack> {
    Arc::new(Kept(device))
}

struct Kept(Arc<dyn Device>);

impl ReadBack for Kept {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn download(&self, buffer: &DeviceBuffer) -> Result<Arc<HostData>> {
        self.0.download(buffer)
    }

    fn download_async(&self, buffer: &DeviceBuffer) -> DownloadFuture<'_> {
        self.0.download_async(buffer)
    }
}

/// A backend chosen at run time: a [`Device`] as a [`Backend`], so a
/// compiled function can run on it (`compile(f).with_backend(AnyBackend::default_device())`).
#[derive(Clone)]
pub struct AnyBackend(Arc<dyn Device>);

impl AnyBackend {
    /// Runs on `device`.
    pub fn new(device: Arc<dyn Device>) -> AnyBackend {
        AnyBackend(device)
    }

    /// Runs on this thread's default device as it is now.
    pub fn default_device() -> AnyBackend {
        AnyBackend(default_device())
    }

    /// The device it runs on.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.0
    }
}

impl Backend for AnyBackend {
    type Buffer = DeviceBuffer;

    fn name(&self) -> &str {
        self.0.name()
    }

    fn upload(&self, data: &Arc<HostData>) -> Result<DeviceBuffer> {
        self.0.upload(data)
    }

    fn reads_transposed_operands(&self) -> bool {
        self.0.reads_transposed_operands()
    }

    fn download(&self, buffer: DeviceBuffer) -> Result<Arc<HostData>> {
        self.0.download(&buffer)
    }

    fn download_async(&self, buffer: DeviceBuffer) -> DownloadFuture<'_> {
        self.0.download_async(&buffer)
    }

    fn run(
        &self,
        exe: &Executable,
        inputs: Vec<DeviceBuffer>,
        shapes: &[Vec<usize>],
    ) -> Result<Vec<DeviceBuffer>> {
        self.0.run(exe, inputs, shapes)
    }

    fn kernels(&self, exe: &Executable, shapes: &[Vec<usize>]) -> Result<KernelList> {
        self.0.kernels(exe, shapes)
    }

    // Its buffers are already erased: no second wrapping.
    fn share(buffer: DeviceBuffer) -> DeviceBuffer {
        buffer
    }

    fn unshare(buffer: &DeviceBuffer) -> Option<DeviceBuffer> {
        Some(buffer.clone())
    }
}

thread_local! {
    static DEFAULT: RefCell<Option<Arc<dyn Device>>> = const { RefCell::new(None) };
}

/// This thread's default device: the CPU executor unless
/// [`set_default_device`] chose another.
pub fn default_device() -> Arc<dyn Device> {
    DEFAULT
        .with(|d| d.borrow().clone())
        .unwrap_or_else(|| Arc::new(CpuBackend))
}

/// Makes `device` this thread's default device; returns the one before.
/// Arrays already computed stay where they are and are read back from
/// there.
pub fn set_default_device(device: Arc<dyn Device>) -> Arc<dyn Device> {
    let before = default_device();
    DEFAULT.with(|d| *d.borrow_mut() = Some(device));
    before
}

/// Runs `f` with `device` as this thread's default device, then puts the
/// previous default back (also when `f` panics).
pub fn with_default_device<R>(device: Arc<dyn Device>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Arc<dyn Device>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(before) = self.0.take() {
                set_default_device(before);
            }
        }
    }
    let _restore = Restore(Some(set_default_device(device)));
    f()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Array, DType};

    #[test]
    fn the_default_device_is_the_cpu_until_set() {
        assert_eq!(default_device().name(), "cpu");
    }

    #[test]
    fn with_default_device_restores_the_previous_default() {
        let named = |name: &str| -> Arc<dyn Device> { Arc::new(Named(name.to_string())) };
        set_default_device(named("outer"));
        with_default_device(named("inner"), || {
            assert_eq!(default_device().name(), "inner");
        });
        assert_eq!(default_device().name(), "outer");
        set_default_device(Arc::new(CpuBackend));
    }

    #[test]
    fn eager_ops_run_on_the_default_device() {
        let device = Arc::new(Counting::default());
        let y = with_default_device(device.clone(), || {
            (Array::ones(&[4], DType::F32) + 1.0).to_vec::<f32>()
        });
        assert_eq!(y.unwrap(), vec![2.0; 4]);
        assert_eq!(device.runs.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    /// A device that only has a name.
    struct Named(String);

    impl Named {
        fn refusal(&self) -> Error {
            Error::Backend {
                backend: self.0.clone(),
                detail: "a named device runs nothing".into(),
            }
        }
    }

    impl Device for Named {
        fn name(&self) -> &str {
            &self.0
        }
        fn upload(&self, _: &Arc<HostData>) -> Result<DeviceBuffer> {
            Err(self.refusal())
        }
        fn run(
            &self,
            _: &Executable,
            _: Vec<DeviceBuffer>,
            _: &[Vec<usize>],
        ) -> Result<Vec<DeviceBuffer>> {
            Err(self.refusal())
        }
        fn download(&self, _: &DeviceBuffer) -> Result<Arc<HostData>> {
            Err(self.refusal())
        }
        fn download_async(&self, _: &DeviceBuffer) -> DownloadFuture<'_> {
            Box::pin(std::future::ready(Err(self.refusal())))
        }
    }

    /// The CPU executor, counting its runs.
    #[derive(Default)]
    struct Counting {
        runs: std::sync::atomic::AtomicUsize,
    }

    impl Backend for Counting {
        type Buffer = Arc<HostData>;
        fn name(&self) -> &str {
            "counting cpu"
        }
        fn upload(&self, data: &Arc<HostData>) -> Result<Arc<HostData>> {
            Ok(data.clone())
        }
        fn download(&self, buffer: Arc<HostData>) -> Result<Arc<HostData>> {
            Ok(buffer)
        }
        fn run(
            &self,
            exe: &Executable,
            inputs: Vec<Arc<HostData>>,
            shapes: &[Vec<usize>],
        ) -> Result<Vec<Arc<HostData>>> {
            self.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Backend::run(&CpuBackend, exe, inputs, shapes)
        }
    }
}
