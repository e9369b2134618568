//! `cargo xtask xla`: Kiln's exported StableHLO run on XLA's CPU client.
//!
//! The export tests (`tests/tests/export.rs`, and the conformance suite's
//! `every_conformance_case_exports_to_stablehlo`) write each case (module,
//! inputs, Kiln's results) under `target/xla-cases/` when `KILN_XLA_CASES`
//! names it; `xtask/xla/run_cases.py` then compiles every module with XLA
//! (through jax's private entry points, so jax is pinned) on eight
//! simulated CPU devices and compares. The Python environment is a venv
//! made on first use in `target/xla-venv/`, with jax from PyPI.

use crate::process::{self, cargo, target_dir, workspace_root};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The jax the harness is written against: its compile entry points are
/// private and move between versions.
const JAX_VERSION: &str = "0.10.2";

/// What the venv installs.
const JAX_REQUIREMENT: &str = "jax[cpu]==0.10.2";

/// The variable the export tests read for the folder to write cases to.
const CASES_VAR: &str = "KILN_XLA_CASES";

/// How many CPU devices XLA simulates (the sharded cases need 8).
const XLA_FLAGS: &str = "--xla_force_host_platform_device_count=8";

/// A download that stalls must not hang CI.
const INSTALL_LIMIT: Duration = Duration::from_secs(900);

/// Runs the export tests writing their cases, then every case on XLA.
pub fn run(args: &[String]) -> Result<(), String> {
    if let Some(extra) = args.first() {
        return Err(format!("`xla` takes no arguments, got `{extra}`"));
    }
    let python = ensure_venv()?;
    let cases = target_dir().join("xla-cases");
    if cases.exists() {
        std::fs::remove_dir_all(&cases)
            .map_err(|e| format!("cannot clear {}: {e}", cases.display()))?;
    }
    std::fs::create_dir_all(&cases)
        .map_err(|e| format!("cannot create {}: {e}", cases.display()))?;
    let write_cases = |extra: &[&str]| {
        process::run(
            cargo()
                .args(["test", "-p", "kiln-tests"])
                .args(extra)
                .env(CASES_VAR, &cases),
        )
    };
    write_cases(&["--test", "export"])?;
    write_cases(&[
        "--test",
        "conformance",
        "every_conformance_case_exports_to_stablehlo",
    ])?;
    process::run(
        Command::new(&python)
            .arg(workspace_root().join("xtask/xla/run_cases.py"))
            .arg(&cases)
            .env("XLA_FLAGS", XLA_FLAGS)
            .env("JAX_PLATFORMS", "cpu"),
    )
}

/// The venv's python, with jax installed: made (or repaired) when its jax
/// is missing or another version, left alone otherwise.
fn ensure_venv() -> Result<PathBuf, String> {
    let venv = target_dir().join("xla-venv");
    let python = venv.join("bin/python");
    if installed_jax(&python).as_deref() == Some(JAX_VERSION) {
        return Ok(python);
    }
    eprintln!("  making {} with {JAX_REQUIREMENT}", venv.display());
    if !python.exists() {
        process::run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    process::run_with_timeout(
        Command::new(&python).args([
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--quiet",
            JAX_REQUIREMENT,
        ]),
        INSTALL_LIMIT,
    )?;
    match installed_jax(&python) {
        Some(version) if version == JAX_VERSION => Ok(python),
        other => Err(format!(
            "after installing {JAX_REQUIREMENT}, {} finds jax {other:?}",
            python.display()
        )),
    }
}

/// The jax version `python` imports, if any.
fn installed_jax(python: &Path) -> Option<String> {
    if !python.exists() {
        return None;
    }
    process::stdout_of(Command::new(python).args(["-c", "import jax; print(jax.__version__)"]))
        .map(|out| out.trim().to_string())
}
