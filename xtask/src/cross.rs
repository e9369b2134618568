//! Builds for targets other than the host: wasm32 (`kiln`, `kiln-wgpu` on the
//! browser's WebGPU, the playground) and aarch64-apple-darwin (`kiln-metal`,
//! type-checked without a Mac).
//!
//! First choice: rustup's target with the normal cargo. Where rustup cannot
//! install it (no route to static.rust-lang.org), Debian's `rustc-web`
//! toolchain builds std from `rust-web-src` with `-Z build-std`, into a target
//! dir of its own so it never clobbers the rustup build cache.

use crate::apt;
use crate::process::{self, cargo, target_dir};
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A target the xtask builds or checks for.
pub struct Cross {
    /// The target triple.
    triple: &'static str,
    /// Variables of every build for it.
    env: &'static [(&'static str, &'static str)],
    /// Variables of the Debian route only (its linker).
    debian_env: &'static [(&'static str, &'static str)],
    /// The target dir of the Debian route, under the normal one.
    debian_dir: &'static str,
}

/// wasm32 with the `simd128` proposal, so the CPU executor's loops (tiles,
/// transcendental maps) vectorize to 128-bit lanes in the browser. The flags
/// are `target.wasm32-….rustflags`, which build scripts and proc macros
/// (host artifacts) never see.
pub const WASM32: Cross = Cross {
    triple: "wasm32-unknown-unknown",
    env: &[(
        "CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS",
        "-C target-feature=+simd128",
    )],
    debian_env: &[("CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER", "wasm-ld")],
    debian_dir: "wasm-debian",
};

/// Apple silicon macOS: only checked (nothing is linked), so no Apple SDK
/// is needed.
pub const APPLE: Cross = Cross {
    triple: "aarch64-apple-darwin",
    env: &[],
    debian_env: &[],
    debian_dir: "apple-debian",
};

/// What is built for wasm32: the core, and the wgpu backend with only its
/// `webgpu` feature.
const PACKAGES: &[&str] = &[
    "-p",
    "kiln",
    "-p",
    "kiln-wgpu",
    "--no-default-features",
    "--features",
    "kiln-wgpu/webgpu",
];
/// The libraries the wasm32 build must leave behind.
const RLIBS: &[&str] = &["libkiln.rlib", "libkiln_wgpu.rlib"];
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
        let rlib = artifacts(&target_root, "debug").join(name);
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
    let mut command = vec!["build"];
    command.extend(args);
    cargo_for(route, &WASM32, &command)
}

/// Type-checks `kiln-metal` (and the tests that run it on a Mac) for Apple
/// silicon, with clippy's lints where rustup's toolchain is used (Debian's
/// has no clippy: there it is `cargo check`).
pub fn check_apple() -> Result<(), String> {
    let packages = ["-p", "kiln-metal", "-p", "kiln-tests", "--all-targets"];
    if rustup_target_available(&APPLE) {
        let mut command = vec!["clippy"];
        command.extend(packages);
        command.extend(["--", "-D", "warnings"]);
        cargo_for(Route::Auto, &APPLE, &command).map(drop)
    } else {
        let mut command = vec!["check"];
        command.extend(packages);
        cargo_for(Route::Debian, &APPLE, &command).map(drop)
    }
}

/// Runs `cargo SUBCOMMAND --target TRIPLE ARGS` (`args` starts with the
/// subcommand) for `cross` by `route`; returns the target root it wrote to.
fn cargo_for(route: Route, cross: &Cross, args: &[&str]) -> Result<PathBuf, String> {
    let triple = cross.triple;
    let (subcommand, rest) = args.split_first().ok_or("no cargo subcommand")?;
    let with_target = |command: &mut Command| {
        command.args([subcommand, "--target", triple]).args(rest);
    };
    match route {
        Route::Auto if rustup_target_available(cross) => {
            eprintln!("  using rustup's {triple} target");
            let mut command = cargo();
            command.envs(cross.env.iter().copied());
            with_target(&mut command);
            process::run(&mut command)?;
            Ok(target_dir())
        }
        Route::Auto => {
            eprintln!("  rustup cannot provide {triple}; falling back to Debian's rustc-web");
            build_with_debian(cross, subcommand, rest)
        }
        Route::Debian => build_with_debian(cross, subcommand, rest),
    }
}

/// Where a wasm32 build by [`cargo_build`] puts the artifacts of `profile`.
pub fn artifacts(target_root: &Path, profile: &str) -> PathBuf {
    target_root.join(WASM32.triple).join(profile)
}

/// Whether the active rustup toolchain has `cross`'s std, installing it if it can.
fn rustup_target_available(cross: &Cross) -> bool {
    let installed =
        process::stdout_of(Command::new("rustup").args(["target", "list", "--installed"]));
    match installed {
        None => false,
        Some(list) if list.lines().any(|line| line.trim() == cross.triple) => true,
        Some(_) => process::run_with_timeout(
            Command::new("rustup").args(["target", "add", cross.triple]),
            RUSTUP_ADD_LIMIT,
        )
        .is_ok(),
    }
}

/// Installs the Debian toolchain if needed and runs `cargo SUBCOMMAND` with
/// build-std into `<target>/<cross.debian_dir>`.
fn build_with_debian(cross: &Cross, subcommand: &str, args: &[&str]) -> Result<PathBuf, String> {
    ensure_debian_packages()?;
    let library = std_sources()?;
    eprintln!("  std sources: {}", library.display());
    eprintln!(
        "  toolchain: {DEBIAN_CARGO} with RUSTC={DEBIAN_RUSTC} RUSTC_BOOTSTRAP=1, linker wasm-ld"
    );
    let target_root = target_dir().join(cross.debian_dir);
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
        .envs(cross.env.iter().chain(cross.debian_env).copied())
        .env("CARGO_TARGET_DIR", &target_root)
        .args([
            subcommand,
            "-Z",
            "build-std=std,panic_abort",
            "--target",
            cross.triple,
        ])
        .args(args);
    process::run(&mut command)?;
    Ok(target_root)
}

/// Installs whichever of [`DEBIAN_PACKAGES`] is missing.
fn ensure_debian_packages() -> Result<(), String> {
    if !Path::new("/etc/debian_version").exists() {
        return Err(format!(
            "rustup cannot install the target and this is not Debian, so the fallback \
             ({}) is unavailable: install it with `rustup target add`",
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
