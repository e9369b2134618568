//! The wgpu backend for tests and benchmarks, or the reason there is none.

use kiln_wgpu::WgpuBackend;
use std::sync::OnceLock;

/// Set (to anything but `0`) where a missing adapter must fail the tests
/// rather than skip them: `cargo xtask ci` sets it, since CI installs
/// lavapipe.
pub const REQUIRE_ENV: &str = "KILN_REQUIRE_GPU";

/// The shared wgpu backend, opened once per process. Without an adapter
/// this panics when [`REQUIRE_ENV`] is set and otherwise prints why the
/// caller skips and returns `None`.
pub fn backend() -> Option<WgpuBackend> {
    static BACKEND: OnceLock<Result<WgpuBackend, String>> = OnceLock::new();
    let opened = BACKEND.get_or_init(|| WgpuBackend::new().map_err(|e| e.to_string()));
    match opened {
        Ok(backend) => Some(backend.clone()),
        Err(reason) => {
            let required = std::env::var(REQUIRE_ENV).is_ok_and(|v| v != "0");
            assert!(!required, "{REQUIRE_ENV} is set but {reason}");
            eprintln!("skipping wgpu test: {reason} (set {REQUIRE_ENV}=1 to make this fail)");
            None
        }
    }
}

/// The Metal backend (Apple targets), opened once per process, or `None`
/// (saying why) where this machine has no Metal device; with
/// [`REQUIRE_ENV`] set a missing device fails instead.
#[cfg(target_vendor = "apple")]
pub fn metal() -> Option<kiln_metal::MetalBackend> {
    static BACKEND: OnceLock<Result<kiln_metal::MetalBackend, String>> = OnceLock::new();
    let opened = BACKEND.get_or_init(|| kiln_metal::MetalBackend::new().map_err(|e| e.to_string()));
    match opened {
        Ok(backend) => Some(backend.clone()),
        Err(reason) => {
            let required = std::env::var(REQUIRE_ENV).is_ok_and(|v| v != "0");
            assert!(!required, "{REQUIRE_ENV} is set but {reason}");
            eprintln!("skipping Metal test: {reason} (set {REQUIRE_ENV}=1 to make this fail)");
            None
        }
    }
}
