//! The CPU executor's throughput in the browser: `tests/cpu-bench` built
//! for wasm32 (with `simd128`, as the playground is) and timed in Debian's
//! Chromium by `tests/cpu-bench/browser.mjs`. Figures `cpu_wasm_*`, beside
//! the native `cpu_*` ones of the benchmark program, and the f32 and 4-bit
//! products on the relaxed-SIMD kernel module as `cpu_wasm_relaxed_*`.

use crate::cross::{self as wasm, Route};
use crate::process::{self, target_dir};
use crate::relaxed_kernel;
use crate::web;
use std::fs;
use std::process::Command;

/// Every figure this module reports starts with this.
const PREFIX: &str = "cpu_wasm_";

/// The browser figures `selection` asks for (all when it is empty; names
/// select by prefix, so `cpu` and `cpu_wasm` select them all). Each is
/// `(name, value, unit)`.
pub fn bench_figures(selection: &[String]) -> Result<Vec<(String, f64, &'static str)>, String> {
    let asks = |p: &String| PREFIX.starts_with(p.as_str()) || p.starts_with(PREFIX);
    if !selection.is_empty() && !selection.iter().any(asks) {
        return Ok(Vec::new());
    }
    let root = wasm::cargo_build(Route::Auto, &["-p", "kiln-cpu-bench", "--release"])?;
    let module = wasm::artifacts(&root, "release").join("kiln_cpu_bench.wasm");
    let site = target_dir().join("cpu-wasm-bench");
    fs::create_dir_all(&site).map_err(|e| format!("cannot create {}: {e}", site.display()))?;
    fs::copy(&module, site.join("kiln_cpu_bench.wasm"))
        .map_err(|e| format!("cannot copy {}: {e}", module.display()))?;
    let kernel = relaxed_kernel::build("release")?;
    fs::copy(&kernel, site.join(relaxed_kernel::SERVED))
        .map_err(|e| format!("cannot copy {}: {e}", kernel.display()))?;
    fs::write(
        site.join("index.html"),
        "<!doctype html><title>Kiln CPU benchmark</title>\n",
    )
    .map_err(|e| format!("cannot write the benchmark page: {e}"))?;

    let (tools, script, port) =
        web::browser_script("tests/cpu-bench/browser.mjs", "cpu-bench.mjs", site)?;
    let out = process::stdout_of(
        Command::new("node")
            .arg(&script)
            .arg(format!("http://127.0.0.1:{port}/"))
            .current_dir(&tools),
    )
    .ok_or("the browser benchmark script failed")?;
    let figures: serde_json::Map<String, serde_json::Value> = serde_json::from_str(out.trim())
        .map_err(|e| format!("the browser benchmark printed no JSON object ({e}): {out}"))?;
    let wanted =
        |name: &str| selection.is_empty() || selection.iter().any(|p| name.starts_with(p.as_str()));
    figures
        .into_iter()
        .filter(|(name, _)| wanted(name))
        .map(|(name, value)| {
            let unit = if name.ends_with("_ns") {
                "ns"
            } else if name.ends_with("_gflops") {
                "gflops"
            } else if name.ends_with("_us") {
                "us"
            } else {
                "ms"
            };
            value
                .as_f64()
                .map(|v| (name.clone(), v, unit))
                .ok_or_else(|| format!("the browser benchmark gave {name} = {value}"))
        })
        .collect()
}
