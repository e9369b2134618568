//! `cargo xtask bench [NAME...]`: the benchmark program's JSON, to stdout and a file.

use crate::process::{self, cargo, target_dir, workspace_root};
use crate::{cpu_wasm, web};
use serde_json::{Map, Value};
use std::fs;
use std::process::Stdio;

const BENCH_BIN: &str = "kiln-bench";

/// Names with this prefix ask for the benchmark program built without
/// `kiln`'s `avx512` feature (what an AVX2-only CPU runs); their figures
/// come back under the same prefix.
const AVX2_PREFIX: &str = "avx2_";

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

    let (native, avx2) = split_avx2(names);
    let avx2_figures = match avx2.is_empty() {
        true => None,
        false => Some(program(&avx2, Build::Avx2)?),
    };
    let mut document = match &avx2_figures {
        // The AVX2 names alone run no figure of the default build (with no
        // names the program would run them all): its machine, no results.
        Some(figures) if native.is_empty() => {
            let mut shell = figures.clone();
            shell["results"] = Value::Object(Map::new());
            shell
        }
        _ => program(&native, Build::Default)?,
    };
    if let Some(figures) = avx2_figures {
        let results = results_of(&mut document)?;
        let avx2_results = figures.get("results").and_then(Value::as_object);
        for (name, figure) in avx2_results.into_iter().flatten() {
            results.insert(format!("{AVX2_PREFIX}{name}"), figure.clone());
        }
    }
    // The playground's figures and the CPU executor's wasm32 ones come from
    // wasm builds and a browser, not from the benchmark program.
    let mut figures = web::bench_figures(names)?;
    figures.extend(cpu_wasm::bench_figures(names)?);
    let results = results_of(&mut document)?;
    for (name, value, unit) in figures {
        // Byte counts print as integers, like the program's own.
        let value = if value.fract() == 0.0 && value.abs() < 2f64.powi(53) {
            serde_json::json!(value as i64)
        } else {
            serde_json::json!(value)
        };
        results.insert(name, serde_json::json!({ "value": value, "unit": unit }));
    }
    for (name, value) in wasm_matmul_ratios(results) {
        results.insert(name, serde_json::json!({ "value": value, "unit": "ratio" }));
    }
    let json = format!("{document}\n");

    let report = root.join("target").join("kiln-bench.json");
    fs::create_dir_all(root.join("target"))
        .and_then(|()| fs::write(&report, &json))
        .map_err(|err| format!("could not write {}: {err}", report.display()))?;
    print!("{json}");
    eprintln!("  wrote {}", report.display());
    Ok(())
}

/// The square products' sizes whose browser and native figures
/// [`wasm_matmul_ratios`] sets side by side.
const SQUARE_PRODUCTS: [usize; 2] = [256, 1024];

/// For each square f32 product timed natively: its GFLOP/s over the
/// browser's where the browser timed it too (`cpu_wasm_matmul_f32_N_ratio`,
/// and `cpu_wasm_relaxed_…` for the relaxed-SIMD kernel), and over the
/// core's 128-bit FMA rate where that was timed (`…_ratio_floor`): wasm32's
/// vectors are 128 bits wide, so no browser product can come closer to the
/// native one than that. The AVX2 build's native figures give the same
/// ratios under [`AVX2_PREFIX`].
fn wasm_matmul_ratios(results: &Map<String, Value>) -> Vec<(String, f64)> {
    let figure = |name: &str| {
        results
            .get(name)
            .and_then(|f| f.get("value"))
            .and_then(Value::as_f64)
            .filter(|v| *v > 0.0)
    };
    let mut ratios = Vec::new();
    for build in ["", AVX2_PREFIX] {
        for n in SQUARE_PRODUCTS {
            let Some(native) = figure(&format!("{build}cpu_matmul_f32_{n}_gflops")) else {
                continue;
            };
            for kernel in ["cpu_wasm_", "cpu_wasm_relaxed_"] {
                if let Some(browser) = figure(&format!("{kernel}matmul_f32_{n}_gflops")) {
                    let name = format!("{build}{kernel}matmul_f32_{n}_ratio");
                    ratios.push((name, native / browser));
                }
            }
            if let Some(peak) = figure(&format!("{build}cpu_fma_peak_128_gflops")) {
                let name = format!("{build}cpu_wasm_matmul_f32_{n}_ratio_floor");
                ratios.push((name, native / peak));
            }
        }
    }
    ratios
}

/// The names for the default build, and those for the AVX2 build with
/// [`AVX2_PREFIX`] taken off.
fn split_avx2(names: &[String]) -> (Vec<String>, Vec<String>) {
    let (avx2, native): (Vec<&String>, Vec<&String>) =
        names.iter().partition(|name| name.starts_with(AVX2_PREFIX));
    (
        native.into_iter().cloned().collect(),
        avx2.into_iter()
            .map(|name| name[AVX2_PREFIX.len()..].to_string())
            .collect(),
    )
}

/// How the benchmark program is built.
#[derive(Clone, Copy, PartialEq)]
enum Build {
    /// With `kiln`'s default features.
    Default,
    /// Without `kiln`'s `avx512` feature, in a target folder of its own
    /// (`target/avx2`) so that the two builds do not replace each other.
    Avx2,
}

/// The benchmark program's JSON document for `names`, built as `build`
/// says.
fn program(names: &[String], build: Build) -> Result<Value, String> {
    let mut command = cargo();
    command.args(["run", "--release", "-p", "kiln-tests", "--bin", BENCH_BIN]);
    if build == Build::Avx2 {
        command
            .arg("--no-default-features")
            .env("CARGO_TARGET_DIR", target_dir().join("avx2"));
    }
    command.arg("--").args(names);
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
    serde_json::from_str::<Value>(&json)
        .ok()
        .filter(Value::is_object)
        .ok_or_else(|| {
            format!("`{line}` did not print one JSON object on stdout; it printed:\n{json}")
        })
}

/// The `results` object of a benchmark document, made where missing.
fn results_of(document: &mut Value) -> Result<&mut Map<String, Value>, String> {
    document
        .as_object_mut()
        .map(|doc| {
            doc.entry("results")
                .or_insert_with(|| Value::Object(Map::new()))
        })
        .and_then(Value::as_object_mut)
        .ok_or_else(|| "the benchmark program printed `results` that is not an object".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn avx2_names_go_to_their_own_build_without_the_prefix() {
        let names = [
            "cpu_matmul",
            "avx2_cpu_matmul_f32_256",
            "qmm",
            "avx2_qmm_4bit",
        ]
        .map(String::from);
        let (native, avx2) = split_avx2(&names);
        assert_eq!(native, ["cpu_matmul", "qmm"]);
        assert_eq!(avx2, ["cpu_matmul_f32_256", "qmm_4bit"]);
    }

    #[test]
    fn wasm_ratios_set_each_browser_product_beside_the_native_one_and_the_128_bit_rate() {
        let results = serde_json::json!({
            "cpu_matmul_f32_1024_gflops": { "value": 180.0, "unit": "gflops" },
            "cpu_wasm_matmul_f32_1024_gflops": { "value": 40.0, "unit": "gflops" },
            "cpu_wasm_relaxed_matmul_f32_1024_gflops": { "value": 50.0, "unit": "gflops" },
            "cpu_fma_peak_128_gflops": { "value": 60.0, "unit": "gflops" },
            "cpu_wasm_matmul_f32_256_gflops": { "value": 30.0, "unit": "gflops" },
            "avx2_cpu_matmul_f32_1024_gflops": { "value": 100.0, "unit": "gflops" },
            "avx2_cpu_fma_peak_128_gflops": { "value": 50.0, "unit": "gflops" },
        });
        let ratios = wasm_matmul_ratios(results.as_object().expect("an object"));
        assert_eq!(
            ratios,
            [
                ("cpu_wasm_matmul_f32_1024_ratio".to_string(), 4.5),
                ("cpu_wasm_relaxed_matmul_f32_1024_ratio".to_string(), 3.6),
                ("cpu_wasm_matmul_f32_1024_ratio_floor".to_string(), 3.0),
                ("avx2_cpu_wasm_matmul_f32_1024_ratio".to_string(), 2.5),
                (
                    "avx2_cpu_wasm_relaxed_matmul_f32_1024_ratio".to_string(),
                    2.0
                ),
                ("avx2_cpu_wasm_matmul_f32_1024_ratio_floor".to_string(), 2.0),
            ],
            "the 256 product has no native figure, so no ratio"
        );
    }

    #[test]
    fn results_are_made_where_missing_and_refused_when_not_an_object() {
        let mut document = serde_json::json!({ "machine": "m" });
        results_of(&mut document)
            .expect("made")
            .insert("x".to_string(), Value::from(1));
        assert_eq!(document["results"]["x"], 1);
        let mut broken = serde_json::json!({ "results": [] });
        assert!(results_of(&mut broken).is_err());
    }
}
