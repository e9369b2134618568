//! The wasm32 build of `kiln` and of `kiln-wgpu` on the browser's WebGPU.
//!
//! First choice: rustup's `wasm32-unknown-unknown` target with the normal cargo.
//! Where rustup cannot install it (no route to static.rust-lang.org), Debian's
//! `rustc-web` toolchain builds std from `rust-web-src` with `-Z build-std`, into a
//! target dir of its own so it never clobbers the rustup build cache.

use crate::apt;
use crate::process::{self, cargo, target_dir};
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const TARGET: &str = "wasm32-unknown-unknown";
/// What is built: the core, and the wgpu backend with only its `webgpu` feature.
const PACKAGES: &[&str] = &[
    "-p",
    "kiln",
    "-p",
    "kiln-wgpu",
    "--no-default-features",
    "--features",
    "kiln-wgpu/webgpu",
];
/// The libraries the build must leave behind.
const RLIBS: &[&str] = &["libkiln.rlib", "libkiln_wgpu.rlib"];
/// Target-specific flags of every wasm32 build: the `simd128` proposal, so
/// the CPU executor's loops (tiles, transcendental maps) vectorize to
/// 128-bit lanes in the browser. Set as `target.wasm32-….rustflags`, which
/// build scripts and proc macros (host artifacts) never see.
const TARGET_RUSTFLAGS: (&str, &str) = (
    "CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS",
    "-C target-feature=+simd128",
);
/// How long `rustup target add` may try to download before we fall back.
const RUSTUP_ADD_LIMIT: Duration = Duration::from_secs(180);

/// Debian packages of the fallback: compiler, cargo, std sources, `wasm-ld`.
const DEBIAN_PACKAGES: &[&str] = &["rustc-web", "cargo-web", "rust-web-src", "lld"];
const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
const DEBIAN_CARGO: &str = "/usr/bin/cargo";

/// Variables that a `cargo xtask` run (rustup proxy + cargo) or the caller may set and
/// that would point the Debian build at rustup's toolchain or at host-only flags.
const FOREIGN_BUILD_VARS: &[&str] = &[
    "RUSTUP_TOOLCHAIN",
    "RUSTC",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "RUSTDOC",
    "RUSTFLAGS",
    "RUSTDOCFLAGS",
    "CARGO",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_ENCODED_RUSTDOCFLAGS",
    "CARGO_BUILD_RUSTC",
    "CARGO_BUILD_RUSTC_WRAPPER",
    "CARGO_BUILD_RUSTC_WORKSPACE_WRAPPER",
    "CARGO_BUILD_RUSTDOC",
    "CARGO_BUILD_RUSTFLAGS",
    "CARGO_BUILD_TARGET",
    "CARGO_BUILD_TARGET_DIR",
    "CARGO_TARGET_DIR",
    "CARGO_MAKEFLAGS",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// rustup's target if it is installed or can be installed, else Debian's.
    Auto,
    /// Debian's rustc-web with build-std, even where rustup could do it.
    Debian,
}

/// `cargo xtask wasm [--debian]`.
pub fn run(args: &[String]) -> Result<(), String> {
    let route = match args {
        [] => Route::Auto,
        [flag] if flag == "--debian" => Route::Debian,
        _ => return Err(format!("usage: cargo xtask wasm [--debian] (got {args:?})")),
    };
    build(route)
}

/// Builds `kiln` and `kiln-wgpu` (webgpu) for wasm32 and checks that their
/// `.rlib`s exist.
pub fn build(route: Route) -> Result<(), String> {
    let target_root = cargo_build(route, PACKAGES)?;
    for name in RLIBS {
        let rlib = target_root.join(TARGET).join("debug").join(name);
        if !rlib.is_file() {
            return Err(format!(
                "the build succeeded but {} is missing",
                rlib.display()
            ));
        }
        eprintln!("  built {}", rlib.display());
    }
    Ok(())
}

/// Runs `cargo build --target wasm32-unknown-unknown ARGS` by `route` and
/// returns the target root the build wrote to (its artifacts are under
/// `<root>/wasm32-unknown-unknown/<profile>/`).
pub fn cargo_build(route: Route, args: &[&str]) -> Result<PathBuf, String> {
    match route {
        Route::Auto if rustup_target_available() => {
            eprintln!("  using rustup's {TARGET} target");
            process::run(
                cargo()
                    .env(TARGET_RUSTFLAGS.0, TARGET_RUSTFLAGS.1)
                    .args(["build", "--target", TARGET])
                    .args(args),
            )?;
            Ok(target_dir())
        }
        Route::Auto => {
            eprintln!("  rustup cannot provide {TARGET}; falling back to Debian's rustc-web");
            build_with_debian(args)
        }
        Route::Debian => build_with_debian(args),
    }
}

/// Where a wasm32 build by [`cargo_build`] puts the artifacts of `profile`.
pub fn artifacts(target_root: &Path, profile: &str) -> PathBuf {
    target_root.join(TARGET).join(profile)
}

/// Whether the active rustup toolchain has the wasm32 std, installing it if it can.
fn rustup_target_available() -> bool {
    let installed =
        process::stdout_of(Command::new("rustup").args(["target", "list", "--installed"]));
    match installed {
        None => false,
        Some(list) if list.lines().any(|line| line.trim() == TARGET) => true,
        Some(_) => process::run_with_timeout(
            Command::new("rustup").args(["target", "add", TARGET]),
            RUSTUP_ADD_LIMIT,
        )
        .is_ok(),
    }
}

/// Installs the Debian toolchain if needed and builds into `<target>/wasm-debian`.
fn build_with_debian(args: &[&str]) -> Result<PathBuf, String> {
    ensure_debian_packages()?;
    let library = std_sources()?;
    eprintln!("  std sources: {}", library.display());
    eprintln!(
        "  toolchain: {DEBIAN_CARGO} with RUSTC={DEBIAN_RUSTC} RUSTC_BOOTSTRAP=1, linker wasm-ld"
    );
    let target_root = target_dir().join("wasm-debian");
    let mut command = Command::new(DEBIAN_CARGO);
    command.current_dir(process::workspace_root());
    for var in FOREIGN_BUILD_VARS {
        command.env_remove(var);
    }
    // rustup's proxy puts its toolchain's libraries on LD_LIBRARY_PATH; Debian's
    // rustc must load its own.
    if let Some(paths) = env::var_os("LD_LIBRARY_PATH") {
        let rustup_home = env::var_os("RUSTUP_HOME").map(PathBuf::from);
        let from_rustup = |path: &PathBuf| {
            rustup_home
                .as_ref()
                .is_some_and(|home| path.starts_with(home))
                || path.components().any(|part| part.as_os_str() == ".rustup")
        };
        let kept: Vec<PathBuf> = env::split_paths(&paths)
            .filter(|path| !from_rustup(path))
            .collect();
        match env::join_paths(kept) {
            Ok(joined) if !joined.is_empty() => command.env("LD_LIBRARY_PATH", joined),
            _ => command.env_remove("LD_LIBRARY_PATH"),
        };
    }
    command
        .env("RUSTC", DEBIAN_RUSTC)
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER", "wasm-ld")
        .env(TARGET_RUSTFLAGS.0, TARGET_RUSTFLAGS.1)
        .env("CARGO_TARGET_DIR", &target_root)
        .args([
            "build",
            "-Z",
            "build-std=std,panic_abort",
            "--target",
            TARGET,
        ])
        .args(args);
    process::run(&mut command)?;
    Ok(target_root)
}

/// Installs whichever of [`DEBIAN_PACKAGES`] is missing.
fn ensure_debian_packages() -> Result<(), String> {
    if !Path::new("/etc/debian_version").exists() {
        return Err(format!(
            "rustup cannot install {TARGET} and this is not Debian, so the fallback \
             ({}) is unavailable: install the target with `rustup target add {TARGET}`",
            DEBIAN_PACKAGES.join(" ")
        ));
    }
    apt::ensure_installed(DEBIAN_PACKAGES)
}

/// The std sources build-std reads: `<sysroot>/lib/rustlib/src/rust/library`, which
/// rust-web-src provides as a link to `/usr/src/rustc-<version>`.
fn std_sources() -> Result<PathBuf, String> {
    let sysroot = process::stdout_of(Command::new(DEBIAN_RUSTC).args(["--print", "sysroot"]))
        .ok_or_else(|| format!("`{DEBIAN_RUSTC} --print sysroot` failed"))?;
    let library = Path::new(sysroot.trim()).join("lib/rustlib/src/rust/library");
    if library.join("std/Cargo.toml").is_file() {
        Ok(library)
    } else {
        Err(format!(
            "no std sources at {} (package rust-web-src)",
            library.display()
        ))
    }
}
