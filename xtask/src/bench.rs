//! `cargo xtask bench [NAME...]`: the benchmark program's JSON, to stdout and a file.

use crate::process::{self, cargo, workspace_root};
use crate::{cpu_wasm, web};
use std::fs;
use std::process::Stdio;

const BENCH_BIN: &str = "kiln-bench";

pub fn run(names: &[String]) -> Result<(), String> {
    let root = workspace_root();
    let sources = [
        root.join("tests/src/bin/kiln-bench.rs"),
        root.join("tests/src/bin/kiln-bench/main.rs"),
    ];
    if !sources.iter().any(|path| path.is_file()) {
        return Err(format!(
            "the benchmark program does not exist yet (expected {})",
            sources[0].display()
        ));
    }

    let mut command = cargo();
    command
        .args([
            "run",
            "--release",
            "-p",
            "kiln-tests",
            "--bin",
            BENCH_BIN,
            "--",
        ])
        .args(names);
    let line = process::display(&command);
    eprintln!("  $ {line}");
    // stderr stays on the terminal (build progress, the program's notes); stdout is the
    // JSON document.
    let output = command
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|err| format!("could not start `{line}`: {err}"))?;
    if !output.status.success() {
        return Err(format!("`{line}` failed ({})", output.status));
    }
    let json = String::from_utf8(output.stdout)
        .map_err(|_| format!("`{line}` printed output that is not UTF-8"))?;
    let mut document = serde_json::from_str::<serde_json::Value>(&json)
        .ok()
        .filter(serde_json::Value::is_object)
        .ok_or_else(|| {
            format!("`{line}` did not print one JSON object on stdout; it printed:\n{json}")
        })?;
    // The playground's figures and the CPU executor's wasm32 ones come from
    // wasm builds and a browser, not from the benchmark program.
    let mut figures = web::bench_figures(names)?;
    figures.extend(cpu_wasm::bench_figures(names)?);
    let json = if figures.is_empty() {
        json
    } else {
        let results = document
            .as_object_mut()
            .map(|doc| {
                doc.entry("results")
                    .or_insert_with(|| serde_json::json!({}))
            })
            .and_then(serde_json::Value::as_object_mut)
            .ok_or_else(|| format!("`{line}` printed `results` that is not an object"))?;
        for (name, value, unit) in figures {
            // Byte counts print as integers, like the program's own.
            let value = if value.fract() == 0.0 && value.abs() < 2f64.powi(53) {
                serde_json::json!(value as i64)
            } else {
                serde_json::json!(value)
            };
            results.insert(name, serde_json::json!({ "value": value, "unit": unit }));
        }
        format!("{document}\n")
    };

    let report = root.join("target").join("kiln-bench.json");
    fs::create_dir_all(root.join("target"))
        .and_then(|()| fs::write(&report, &json))
        .map_err(|err| format!("could not write {}: {err}", report.display()))?;
    print!("{json}");
    eprintln!("  wrote {}", report.display());
    Ok(())
}
