//! `cargo xtask <command>`: Kiln's project commands (see README.md).

mod api;
mod apt;
mod bench;
mod ci;
mod cpu_wasm;
mod cross;
mod process;
mod relaxed_kernel;
mod stamp;
mod web;
mod xla;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <command> [args]

commands:
  ci [STEP...]      fmt, clippy, doc, test, the wasm32 build of `kiln`, the Metal
                    backend's check for Apple silicon and the playground's browser
                    tests, stopping at the first failure; STEPs pick a subset
                    (steps: fmt clippy doc api package lavapipe test xla wasm32
                    apple web)
  api [--bless]     the published crates' public items (from rustdoc's HTML) against
                    docs/public-api.txt: an item gone without a CHANGELOG.md line
                    fails, naming it; --bless rewrites the snapshot
  bench [NAME...]   run the benchmarks in release mode, print their JSON and write it
                    to target/kiln-bench.json; NAMEs select benchmarks by name or prefix
                    (`cpu` the CPU executor's figures, native and, as cpu_wasm_*, wasm32
                    in headless Chromium; `avx2_NAME` the figure NAME of a build without
                    kiln's `avx512` feature, as an AVX2-only CPU runs it)
  wasm [--debian]   build `kiln` for wasm32-unknown-unknown (rustup target if it can be
                    installed, else Debian's rustc-web with build-std; --debian forces it)
  web [--e2e [--repeat N]]
                    build the playground into target/web/ (a static site): kiln-web for
                    wasm32, wasm-bindgen, esbuild; installs what it needs on first use;
                    --e2e then runs the browser tests in headless Chromium (screenshots
                    in target/web-e2e/); --repeat N runs them N times and counts passes
  xla               run Kiln's exported StableHLO on XLA's CPU client (8 simulated devices)
                    and compare with Kiln: the export tests write their cases to
                    target/xla-cases/; a venv with jax[cpu]==0.10.2 is made in
                    target/xla-venv/ on first use
  serve [--port N]  build the playground and serve it on http://127.0.0.1:N/ (8000)
  help              this text
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (command, rest) = match args.split_first() {
        Some((command, rest)) => (command.as_str(), rest),
        None => ("help", &[][..]),
    };
    let outcome = match command {
        "ci" => ci::run(rest),
        "api" => api::run(rest),
        "bench" => bench::run(rest),
        "wasm" => cross::run(rest),
        "web" => web::run(rest),
        "serve" => web::serve(rest),
        "xla" => xla::run(rest),
        "help" | "-h" | "--help" => {
            print!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown command `{other}`\n\n{USAGE}")),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: error: {message}");
            ExitCode::FAILURE
        }
    }
}
