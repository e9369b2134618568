//! `cargo xtask web` builds the playground into `target/web/` (a static
//! site); `cargo xtask serve [--port N]` builds it and serves it on
//! 127.0.0.1. Everything they need is installed on first use: the wasm32
//! target (see [`wasm`]), the `wasm-bindgen` CLI at the crate's pinned
//! version, and npm's `esbuild` (which bundles the page's script with
//! CodeMirror and dagre) from `web/tools`' lockfile. Each step after
//! cargo's (wasm-bindgen, esbuild) runs only when its inputs changed (see
//! [`stamp`]): on an unchanged tree the site is ready in seconds. Beside
//! the module the site serves the relaxed-SIMD kernel module, built and
//! checked by [`relaxed_kernel`].
//!
//! The module is not passed through binaryen's `wasm-opt`: rustc's output
//! (LTO, one codegen unit) is already optimized, and every `wasm-opt`
//! level measured made the gzipped module larger (by 96–106 KB of 1.76 MB
//! with `-Oz` and `-O2`), while taking minutes.

use crate::apt;
use crate::cross::{self as wasm, Route};
use crate::process::{self, target_dir, workspace_root};
use crate::relaxed_kernel;
use crate::stamp::{self, Fingerprint};
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::thread;

/// The `wasm-bindgen` version `web/Cargo.toml` pins: the CLI must match it.
const WASM_BINDGEN_VERSION: &str = "0.2.130";
/// The cargo profile of the playground build (see the workspace manifest).
const PROFILE: &str = "playground";
/// The page's own files, copied next to the generated module.
const STATIC_FILES: &[&str] = &["index.html", "worker.js", "style.css"];
const DEFAULT_PORT: u16 = 8000;

/// `cargo xtask web [--e2e [--repeat N]]`.
pub fn run(args: &[String]) -> Result<(), String> {
    let usage = || format!("usage: cargo xtask web [--e2e [--repeat N]] (got {args:?})");
    match args {
        [] => build().map(|_| ()),
        [flag] if flag == "--e2e" => e2e(),
        [flag, repeat, n] if flag == "--e2e" && repeat == "--repeat" => {
            let runs = n
                .parse()
                .ok()
                .filter(|&n: &usize| n > 0)
                .ok_or_else(usage)?;
            e2e_repeated(runs)
        }
        _ => Err(usage()),
    }
}

/// `cargo xtask serve [--port N]`.
pub fn serve(args: &[String]) -> Result<(), String> {
    let port = match args {
        [] => DEFAULT_PORT,
        [flag, port] if flag == "--port" => port
            .parse()
            .map_err(|_| format!("--port takes a port number, got `{port}`"))?,
        _ => {
            return Err(format!(
                "usage: cargo xtask serve [--port N] (got {args:?})"
            ))
        }
    };
    let site = build()?;
    let listener = TcpListener::bind(("127.0.0.1", port))
        .map_err(|e| format!("cannot listen on 127.0.0.1:{port}: {e}"))?;
    println!("serving {} at http://127.0.0.1:{port}/", site.display());
    serve_forever(listener, site);
    Ok(())
}

/// `cargo xtask web --e2e`: builds the site, serves it on a free port and
/// drives Debian's Chromium through `web/e2e/e2e.mjs` (playwright-core),
/// once with WebGPU (SwiftShader; every example verified against the CPU)
/// and once with WebGPU switched off (the CPU fallback); screenshots go to
/// `target/web-e2e/webgpu/` and `target/web-e2e/cpu/`.
pub fn e2e() -> Result<(), String> {
    let site = build()?;
    let (tools, script, port) = browser_script("web/e2e/e2e.mjs", "e2e.mjs", site)?;
    e2e_modes(&tools, &script, port)
}

/// Both modes of the browser tests against the site served on `port`.
fn e2e_modes(tools: &Path, script: &Path, port: u16) -> Result<(), String> {
    let shots = target_dir().join("web-e2e");
    // Chromium validates relaxed SIMD, so the page loads the relaxed-SIMD
    // kernel unless asked not to: WebGPU mode (which verifies every example
    // against the CPU) runs the products on it, CPU mode on simd128.
    for (mode, query) in [("webgpu", ""), ("cpu", "?simd=128")] {
        process::run(
            Command::new("node")
                .arg(script)
                .arg(format!("http://127.0.0.1:{port}/{query}"))
                .arg(&shots)
                .arg(mode)
                .current_dir(tools),
        )?;
    }
    Ok(())
}

/// `cargo xtask web --e2e --repeat N`: the browser tests `runs` times on
/// one build, every run to the end, then the pass count (a flaky check
/// shows up as a count below `runs`, with each failure's output above).
fn e2e_repeated(runs: usize) -> Result<(), String> {
    let site = build()?;
    let (tools, script, port) = browser_script("web/e2e/e2e.mjs", "e2e.mjs", site)?;
    let mut passed = 0;
    for run in 1..=runs {
        println!("e2e run {run} of {runs}");
        match e2e_modes(&tools, &script, port) {
            Ok(()) => passed += 1,
            Err(e) => println!("e2e run {run} failed: {e}"),
        }
    }
    println!("e2e: {passed} of {runs} runs passed");
    if passed == runs {
        Ok(())
    } else {
        Err(format!("{} of {runs} e2e runs failed", runs - passed))
    }
}

/// The playground's benchmark figures, by name.
const FIGURES: [&str; 7] = [
    "web_wasm_bytes",
    "web_wasm_gzip_bytes",
    "web_site_gzip_bytes",
    "web_first_render_ms",
    "web_rerun_ms",
    "web_graph_2000_ms",
    "web_kernels_view_ms",
];

/// The playground's figures `selection` asks for (all when it is empty, as
/// `cargo xtask bench` selects by prefix): module sizes from a fresh build,
/// and page timings measured in Debian's Chromium by `web/e2e/timing.mjs`.
/// Each is `(name, value, unit)`.
pub fn bench_figures(selection: &[String]) -> Result<Vec<(String, f64, &'static str)>, String> {
    let wanted =
        |name: &str| selection.is_empty() || selection.iter().any(|p| name.starts_with(p.as_str()));
    if !FIGURES.iter().any(|name| wanted(name)) {
        return Ok(Vec::new());
    }
    let site = build()?;
    let module = site.join("kiln_web_bg.wasm");
    let mut figures = Vec::new();
    let bytes = fs::metadata(&module)
        .map_err(|e| format!("cannot read {}: {e}", module.display()))?
        .len();
    figures.push(("web_wasm_bytes".to_string(), bytes as f64, "bytes"));
    let gzipped = gzip_size(&module).ok_or("cannot gzip the module (is gzip installed?)")?;
    figures.push(("web_wasm_gzip_bytes".to_string(), gzipped as f64, "bytes"));
    // The whole playground: module, bundled script, page files.
    let mut site_gzip = 0;
    for entry in fs::read_dir(&site).map_err(|e| format!("cannot list {}: {e}", site.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        site_gzip += gzip_size(&path).ok_or_else(|| format!("cannot gzip {}", path.display()))?;
    }
    figures.push(("web_site_gzip_bytes".to_string(), site_gzip as f64, "bytes"));
    const TIMINGS: [&str; 4] = [
        "web_first_render_ms",
        "web_rerun_ms",
        "web_graph_2000_ms",
        "web_kernels_view_ms",
    ];
    if TIMINGS.iter().any(|name| wanted(name)) {
        let (tools, script, port) = browser_script("web/e2e/timing.mjs", "timing.mjs", site)?;
        let out = process::stdout_of(
            Command::new("node")
                .arg(&script)
                .arg(format!("http://127.0.0.1:{port}/"))
                .current_dir(&tools),
        )
        .ok_or("the playground timing script failed")?;
        let timings: serde_json::Value = serde_json::from_str(out.trim())
            .map_err(|e| format!("the timing script printed no JSON ({e}): {out}"))?;
        for name in TIMINGS {
            let value = timings[name]
                .as_f64()
                .ok_or_else(|| format!("the timing script gave no {name}: {out}"))?;
            figures.push((name.to_string(), value, "ms"));
        }
    }
    figures.retain(|(name, ..)| wanted(name));
    Ok(figures)
}

/// Readies the browser script `source` (workspace-relative, copied as
/// `copy_as`) to drive Chromium over `site`: installs chromium
/// and the npm tools, copies the script next to their node_modules (node
/// resolves its imports there, so it runs from that directory) and serves
/// the site from a free port of 127.0.0.1. Returns the tools directory, the
/// script and the port.
pub fn browser_script(
    source: &str,
    copy_as: &str,
    site: PathBuf,
) -> Result<(PathBuf, PathBuf, u16), String> {
    apt::ensure_installed(&["chromium"])?;
    let tools = ensure_npm_tools()?;
    // node resolves playwright-core from the script's directory.
    let script = tools.join(copy_as);
    fs::copy(workspace_root().join(source), &script)
        .map_err(|e| format!("cannot copy {source}: {e}"))?;
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .map_err(|e| format!("cannot listen on 127.0.0.1: {e}"))?;
    let port = listener
        .local_addr()
        .map_err(|e| format!("no local address: {e}"))?
        .port();
    thread::spawn(move || serve_forever(listener, site));
    Ok((tools, script, port))
}

/// wasm-bindgen's arguments before the output directory.
const BINDGEN_ARGS: &[&str] = &[
    "--target",
    "web",
    "--no-typescript",
    "--remove-name-section",
    "--remove-producers-section",
];

/// Builds the site into `target/web/` and returns that directory. The
/// steps' outputs are kept in `target/web-stage/`, each with a stamp of its
/// inputs (module → wasm-bindgen; the page's scripts → esbuild), and a
/// step whose inputs did not change is skipped.
pub fn build() -> Result<PathBuf, String> {
    let root = wasm::cargo_build(Route::Auto, &["-p", "kiln-web", "--profile", PROFILE])?;
    let module = wasm::artifacts(&root, PROFILE).join("kiln_web.wasm");
    if !module.is_file() {
        return Err(format!(
            "the build succeeded but {} is missing",
            module.display()
        ));
    }
    let stage = target_dir().join("web-stage");
    let bound_dir = stage.join("bindgen");
    let (bound, glue) = (
        bound_dir.join("kiln_web_bg.wasm"),
        bound_dir.join("kiln_web.js"),
    );
    fs::create_dir_all(&bound_dir)
        .map_err(|e| format!("cannot create {}: {e}", bound_dir.display()))?;
    let bindgen = ensure_wasm_bindgen()?;
    let inputs = Fingerprint::of("wasm-bindgen")
        .with_text(WASM_BINDGEN_VERSION)
        .with_text(&BINDGEN_ARGS.join(" "))
        .with_file(&module)?;
    let outputs = [bound.clone(), glue.clone()];
    stamp::unless_fresh(
        "wasm-bindgen",
        &stage.join("bindgen.stamp"),
        &inputs,
        &outputs,
        || {
            process::run(
                Command::new(&bindgen)
                    .args(BINDGEN_ARGS)
                    .arg("--out-dir")
                    .arg(&bound_dir)
                    .arg(&module),
            )
        },
    )?;
    let kernel = relaxed_kernel::build(PROFILE)?;
    let tools = ensure_npm_tools()?;
    let bundles = bundle_views(&tools, &stage)?;
    // The site itself is assembled afresh from the staged outputs: copies
    // of a few megabytes, so a file removed from the page never lingers.
    let site = target_dir().join("web");
    if site.exists() {
        fs::remove_dir_all(&site).map_err(|e| format!("cannot clear {}: {e}", site.display()))?;
    }
    fs::create_dir_all(&site).map_err(|e| format!("cannot create {}: {e}", site.display()))?;
    let sources = workspace_root().join("web").join("static");
    let copies = [bound, glue]
        .into_iter()
        .chain(bundles)
        .chain(STATIC_FILES.iter().map(|name| sources.join(name)));
    for from in copies {
        let name = from.file_name().ok_or("a staged file has no name")?;
        fs::copy(&from, site.join(name))
            .map_err(|e| format!("cannot copy {}: {e}", from.display()))?;
    }
    fs::copy(&kernel, site.join(relaxed_kernel::SERVED))
        .map_err(|e| format!("cannot copy {}: {e}", kernel.display()))?;
    let wasm = site.join("kiln_web_bg.wasm");
    let raw = fs::metadata(&wasm).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "  built {}: kiln_web_bg.wasm {raw} bytes, {} gzipped",
        site.display(),
        gzip_size(&wasm).map_or_else(|| "?".to_string(), |n| format!("{n} bytes"))
    );
    Ok(site)
}

/// Bundles the page's scripts with the npm packages they import, minified,
/// with npm's esbuild: `web/js/views.js` (CodeMirror, pan and zoom) into
/// `views.js`, and `web/js/layout-worker.js` (dagre) into `layout.js`, the
/// graph layout's worker. Both go to `stage`, rebuilt only when a script of
/// `web/js/` or the installed packages changed; returns their paths.
fn bundle_views(tools: &Path, stage: &Path) -> Result<Vec<PathBuf>, String> {
    let esbuild = tools.join("node_modules").join(".bin").join("esbuild");
    let sources = workspace_root().join("web").join("js");
    let mut scripts: Vec<PathBuf> = fs::read_dir(&sources)
        .map_err(|e| format!("cannot list {}: {e}", sources.display()))?
        .map(|entry| entry.map(|e| e.path()).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    // A fingerprint must not depend on the directory's listing order.
    scripts.sort();
    let mut inputs = Fingerprint::of("esbuild").with_file(&tools.join(INSTALLED_LOCK))?;
    for script in &scripts {
        inputs = inputs.with_file(script)?;
    }
    let bundles = [
        ("views.js", stage.join("views.js"), Some("kilnViews")),
        ("layout-worker.js", stage.join("layout.js"), None),
    ];
    let outputs: Vec<PathBuf> = bundles.iter().map(|(_, out, _)| out.clone()).collect();
    stamp::unless_fresh(
        "esbuild",
        &stage.join("esbuild.stamp"),
        &inputs,
        &outputs,
        || {
            for (entry, output, global) in &bundles {
                let mut command = Command::new(&esbuild);
                command.arg(sources.join(entry)).args([
                    "--bundle",
                    "--format=iife",
                    "--minify",
                    "--legal-comments=none",
                    "--log-level=warning",
                ]);
                if let Some(global) = global {
                    command.arg(format!("--global-name={global}"));
                }
                process::run(
                    command
                        .arg(format!("--outfile={}", output.display()))
                        // The entries live in the source tree, their
                        // packages in the tools' install directory.
                        .env("NODE_PATH", tools.join("node_modules")),
                )?;
            }
            Ok(())
        },
    )?;
    Ok(outputs)
}

/// The `wasm-bindgen` CLI at [`WASM_BINDGEN_VERSION`], installed with
/// `cargo install` when the one on PATH is missing or another version.
fn ensure_wasm_bindgen() -> Result<PathBuf, String> {
    let wanted = format!("wasm-bindgen {WASM_BINDGEN_VERSION}");
    let installed = cargo_home().join("bin").join("wasm-bindgen");
    let version = process::stdout_of(Command::new(&installed).arg("--version"));
    if version.is_some_and(|v| v.trim() == wanted) {
        return Ok(installed);
    }
    eprintln!("  installing {wanted} (a few minutes, once)");
    process::run(process::cargo().args([
        "install",
        "wasm-bindgen-cli",
        "--version",
        WASM_BINDGEN_VERSION,
    ]))?;
    Ok(installed)
}

fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from(".cargo"))
}

/// The copy of `web/tools/package-lock.json` that says which packages
/// `target/web-tools/` holds.
const INSTALLED_LOCK: &str = "installed-lock.json";

/// Installs `web/tools`' npm packages (esbuild, CodeMirror, dagre,
/// playwright-core) into
/// `target/web-tools/` from the committed lockfile, unless that lockfile
/// is already installed there; returns the install directory.
fn ensure_npm_tools() -> Result<PathBuf, String> {
    let sources = workspace_root().join("web").join("tools");
    let tools = target_dir().join("web-tools");
    let lock = fs::read(sources.join("package-lock.json"))
        .map_err(|e| format!("cannot read web/tools/package-lock.json: {e}"))?;
    let stamp = tools.join(INSTALLED_LOCK);
    if fs::read(&stamp).is_ok_and(|installed| installed == lock) {
        return Ok(tools);
    }
    fs::create_dir_all(&tools).map_err(|e| format!("cannot create {}: {e}", tools.display()))?;
    for name in ["package.json", "package-lock.json"] {
        fs::copy(sources.join(name), tools.join(name))
            .map_err(|e| format!("cannot copy web/tools/{name}: {e}"))?;
    }
    process::run(
        Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&tools),
    )?;
    fs::write(&stamp, lock).map_err(|e| format!("cannot write {}: {e}", stamp.display()))?;
    Ok(tools)
}

fn gzip_size(path: &Path) -> Option<u64> {
    let out = process::stdout_of(
        Command::new("sh")
            .arg("-c")
            .arg("gzip -9 -c \"$0\" | wc -c")
            .arg(path),
    )?;
    out.trim().parse().ok()
}

/// Serves `site` until the process ends, one thread per connection.
fn serve_forever(listener: TcpListener, site: PathBuf) {
    for stream in listener.incoming().flatten() {
        let site = site.clone();
        thread::spawn(move || {
            // A client that hangs up early is no error of the server's.
            let _ = answer(stream, &site);
        });
    }
}

/// Answers one HTTP/1.1 GET (or HEAD) with a file of `site`, then closes.
fn answer(mut stream: TcpStream, site: &Path) -> std::io::Result<()> {
    let mut request_line = String::new();
    let mut reader = BufReader::new(stream.try_clone()?);
    reader.read_line(&mut request_line)?;
    // Drain the headers: the answer never depends on them.
    let mut header = String::new();
    while reader.read_line(&mut header)? > 2 {
        header.clear();
    }
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
    let path = target.split(['?', '#']).next().unwrap_or("/");
    let file = match resolve(site, path) {
        Some(file) if method == "GET" || method == "HEAD" => file,
        _ => {
            return respond(
                &mut stream,
                "404 Not Found",
                "text/plain",
                b"not found\n",
                true,
            )
        }
    };
    match fs::read(&file) {
        Ok(body) => respond(
            &mut stream,
            "200 OK",
            mime_type(&file),
            &body,
            method == "GET",
        ),
        Err(_) => respond(
            &mut stream,
            "404 Not Found",
            "text/plain",
            b"not found\n",
            true,
        ),
    }
}

/// The file under `site` that `path` names (`/` is `index.html`); `None`
/// for a path that would leave `site`.
fn resolve(site: &Path, path: &str) -> Option<PathBuf> {
    let relative = Path::new(path.trim_start_matches('/'));
    if relative
        .components()
        .any(|c| !matches!(c, Component::Normal(_)))
    {
        return None;
    }
    let file = site.join(relative);
    Some(if file.is_dir() {
        file.join("index.html")
    } else {
        file
    })
}

fn mime_type(file: &Path) -> &'static str {
    match file.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("wasm") => "application/wasm",
        Some("css") => "text/css; charset=utf-8",
        Some("json") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        _ => "application/octet-stream",
    }
}

fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &[u8],
    with_body: bool,
) -> std::io::Result<()> {
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Cache-Control: no-cache\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    if with_body {
        stream.write_all(body)?;
    }
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_inside_the_site_only() {
        let site = Path::new("/srv/site");
        assert_eq!(
            resolve(site, "/kiln_web.js"),
            Some(site.join("kiln_web.js"))
        );
        assert_eq!(resolve(site, "/../etc/passwd"), None);
        assert_eq!(resolve(site, "/a/./b"), Some(site.join("a/b")));
    }

    #[test]
    fn wasm_and_scripts_get_the_types_browsers_require() {
        assert_eq!(mime_type(Path::new("a.wasm")), "application/wasm");
        assert_eq!(
            mime_type(Path::new("worker.js")),
            "text/javascript; charset=utf-8"
        );
    }
}
