//! `cargo xtask ci`: the project's test command.
//!
//! Each check is one entry of [`STEPS`]; a new check (wgpu on lavapipe, web build,
//! browser tests) is one more entry. A step installs what it needs itself.

use crate::api;
use crate::apt;
use crate::cross;
use crate::process::{self, cargo};
use crate::web;
use crate::xla;
use std::time::Instant;

struct Step {
    name: &'static str,
    what: &'static str,
    run: fn() -> Result<(), String>,
}

/// The packages of the software Vulkan adapter the wgpu tests run on.
const LAVAPIPE_PACKAGES: &[&str] = &["mesa-vulkan-drivers", "libvulkan1"];

/// Makes the wgpu tests fail, not skip, when no adapter is found.
const REQUIRE_GPU: &str = "KILN_REQUIRE_GPU";

const STEPS: &[Step] = &[
    Step {
        name: "fmt",
        what: "cargo fmt --all -- --check",
        run: || process::run(cargo().args(["fmt", "--all", "--", "--check"])),
    },
    Step {
        name: "clippy",
        what: "cargo clippy --workspace --all-targets -- -D warnings",
        run: || {
            process::run(cargo().args([
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]))
        },
    },
    Step {
        name: "doc",
        what: "RUSTDOCFLAGS=-D warnings cargo doc --no-deps --workspace",
        run: || {
            process::run(
                cargo()
                    .args(["doc", "--no-deps", "--workspace"])
                    .env("RUSTDOCFLAGS", "-D warnings"),
            )
        },
    },
    Step {
        name: "api",
        what: "cargo xtask api: no public item of the published crates gone from \
               docs/public-api.txt without a CHANGELOG.md line (reads the doc step's output)",
        run: || api::run(&[]),
    },
    Step {
        name: "package",
        what: "cargo package --no-verify for the published crates (kiln, kiln-derive, \
               kiln-kernels, kiln-wgpu, kiln-metal): manifests, files and resolution",
        run: package_published,
    },
    Step {
        name: "lavapipe",
        what: "install Mesa's software Vulkan driver (mesa-vulkan-drivers libvulkan1) if missing",
        run: || apt::ensure_installed(LAVAPIPE_PACKAGES),
    },
    Step {
        name: "test",
        what: "cargo test --workspace on lavapipe (KILN_REQUIRE_GPU=1; KILN_CASES passed through)",
        run: || {
            let mut command = cargo();
            command.args(["test", "--workspace"]).env(REQUIRE_GPU, "1");
            // The Vulkan loader and Mesa want a runtime directory.
            if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
                command.env("XDG_RUNTIME_DIR", "/tmp");
            }
            process::run(&mut command)
        },
    },
    Step {
        name: "xla",
        what: "run the exported StableHLO cases on XLA's CPU client, 8 simulated devices \
               (makes target/xla-venv with jax[cpu]==0.10.2 on first use)",
        run: || xla::run(&[]),
    },
    Step {
        name: "wasm32",
        what: "build `kiln` and `kiln-wgpu` (webgpu) for wasm32-unknown-unknown (rustup target, \
               else Debian rustc-web)",
        run: || cross::build(cross::Route::Auto),
    },
    Step {
        name: "apple",
        what: "check and clippy `kiln-metal` and the Metal tests for aarch64-apple-darwin \
               (rustup target, else Debian rustc-web's cargo check)",
        run: cross::check_apple,
    },
    Step {
        name: "web",
        what: "build the playground (target/web) and run its browser tests in Debian's \
               Chromium through playwright-core (installs chromium, wasm-bindgen-cli and \
               web/tools' npm lockfile where missing; screenshots in target/web-e2e)",
        run: web::e2e,
    },
];

/// The crates meant for crates.io; the other members are `publish = false`.
pub const PUBLISHED: &[&str] = &[
    "kiln",
    "kiln-derive",
    "kiln-kernels",
    "kiln-wgpu",
    "kiln-metal",
];

/// Packages every published crate. They are named rather than taken with
/// `--workspace`, which packages `publish = false` members too (and fails on
/// `kiln-tests`, whose path dependencies are not published). Cargo resolves
/// the five together, each against the others' fresh packages (their lock
/// files name those packages' checksums), so a missing `version` or an
/// unpublished dependency fails here. `--no-verify` is for time, not
/// resolution: verifying builds each package from its tarball outside the
/// workspace, without its profiles, compiling wgpu, naga and gemm again from
/// nothing; all five verified, in 3 min 49 s on 2 shared cores (2026-12-05),
/// for sources the clippy, doc and test steps already compile.
/// `--allow-dirty`: CI checks the tree as it is, committed or not.
fn package_published() -> Result<(), String> {
    let mut command = cargo();
    command.args(["package", "--no-verify", "--allow-dirty"]);
    for krate in PUBLISHED {
        command.args(["-p", krate]);
    }
    process::run(&mut command)
}

enum Outcome {
    Passed(f64),
    Failed(f64),
    NotRun,
}

/// Runs the selected steps (all when `selection` is empty) in order, stopping at the
/// first failure, then prints a summary.
pub fn run(selection: &[String]) -> Result<(), String> {
    if let Some(unknown) = selection
        .iter()
        .find(|name| !STEPS.iter().any(|step| step.name == name.as_str()))
    {
        let names: Vec<&str> = STEPS.iter().map(|step| step.name).collect();
        return Err(format!(
            "unknown ci step `{unknown}` (steps: {})",
            names.join(" ")
        ));
    }
    let steps: Vec<&Step> = STEPS
        .iter()
        .filter(|step| selection.is_empty() || selection.iter().any(|name| name == step.name))
        .collect();

    let started = Instant::now();
    let mut outcomes: Vec<Outcome> = steps.iter().map(|_| Outcome::NotRun).collect();
    let mut failure = None;
    for (step, outcome) in steps.iter().zip(outcomes.iter_mut()) {
        eprintln!("==> {}: {}", step.name, step.what);
        let step_started = Instant::now();
        let result = (step.run)();
        let seconds = step_started.elapsed().as_secs_f64();
        match result {
            Ok(()) => {
                eprintln!("==> {} passed in {seconds:.1}s", step.name);
                *outcome = Outcome::Passed(seconds);
            }
            Err(message) => {
                eprintln!("==> {} FAILED in {seconds:.1}s: {message}", step.name);
                *outcome = Outcome::Failed(seconds);
                failure = Some(format!("ci step `{}` failed: {message}", step.name));
                break;
            }
        }
    }

    eprintln!();
    eprintln!("==> summary");
    for (step, outcome) in steps.iter().zip(&outcomes) {
        let line = match outcome {
            Outcome::Passed(seconds) => format!("ok      {seconds:7.1}s"),
            Outcome::Failed(seconds) => format!("FAILED  {seconds:7.1}s"),
            Outcome::NotRun => "not run".to_string(),
        };
        eprintln!("  {:<8} {line}", step.name);
    }
    eprintln!("  {:<8} {:7.1}s total", "", started.elapsed().as_secs_f64());
    match failure {
        Some(message) => Err(message),
        None => {
            eprintln!("==> ci passed");
            Ok(())
        }
    }
}
