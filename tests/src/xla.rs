//! Cases for XLA: an exported module with the inputs Kiln ran it on and
//! Kiln's results, written where `cargo xtask xla` points
//! (`KILN_XLA_CASES`) for `xtask/xla/run_cases.py` to run on XLA's CPU
//! client and compare.
//!
//! A case is a folder: `module.mlir`, `case.json` and one raw
//! little-endian file per array (bool as one byte).

use kiln::export::{Exported, Mesh};
use kiln::{Array, HostData};
use serde_json::{json, Value};
use std::path::PathBuf;

/// The variable naming the folder the cases go to.
pub const CASES_VAR: &str = "KILN_XLA_CASES";

/// The folder cases go to, when `cargo xtask xla` asked for them.
pub fn cases_dir() -> Option<PathBuf> {
    std::env::var_os(CASES_VAR).map(PathBuf::from)
}

/// How XLA's results must match Kiln's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Match {
    /// Bit for bit (NaNs alike).
    Exact,
    /// Within `kiln_tests::conformance::tolerance` of the dtype.
    Tolerance,
}

/// One call: the argument leaves and Kiln's result leaves.
pub struct Run {
    /// The flattened arguments.
    pub inputs: Vec<Array>,
    /// Kiln's flattened results (for a training loop, after its last step).
    pub outputs: Vec<Array>,
}

/// A training loop XLA repeats: after each step, result `feed[i].0`
/// becomes argument `feed[i].1`; result `loss` is compared step by step
/// with Kiln's `losses`.
pub struct Loop {
    /// (result, argument) pairs carried to the next step.
    pub feed: Vec<(usize, usize)>,
    /// The loss result.
    pub loss: usize,
    /// Kiln's loss at each step (their number is the step count).
    pub losses: Vec<f32>,
}

/// A case to write.
pub struct Case<'a> {
    /// Its folder's name.
    pub name: String,
    /// The module.
    pub exported: &'a Exported,
    /// How results must match.
    pub rule: Match,
    /// The calls to run (several sizes for a shapeless module).
    pub runs: Vec<Run>,
    /// The mesh and, per argument, the mesh axis of each dim.
    pub mesh: Option<(&'a Mesh, Vec<Vec<Option<&'a str>>>)>,
    /// A training loop, if the case is one.
    pub training: Option<Loop>,
    /// Names that must appear in XLA's optimized HLO (`all-reduce`).
    pub collectives: Vec<&'a str>,
}

fn bytes(data: &HostData) -> Vec<u8> {
    match data {
        HostData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::U32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::U8(v) => v.clone(),
        HostData::Bool(v) => v.iter().map(|&b| u8::from(b)).collect(),
    }
}

/// Writes `array` as `file` in `folder` and returns its manifest entry.
fn write_array(folder: &std::path::Path, file: String, array: &Array) -> Result<Value, String> {
    let data = array.data().map_err(|e| e.to_string())?;
    let shape = array
        .shape()
        .as_known()
        .ok_or_else(|| format!("{file} has a symbolic shape"))?;
    std::fs::write(folder.join(&file), bytes(&data)).map_err(|e| format!("{file}: {e}"))?;
    Ok(json!({ "file": file, "dtype": array.dtype().name(), "shape": shape }))
}

/// Writes `case` under `root` (its own folder, replaced if present).
pub fn write_case(root: &std::path::Path, case: &Case<'_>) -> Result<(), String> {
    let folder = root.join(&case.name);
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(&folder).map_err(|e| format!("{}: {e}", folder.display()))?;
    case.exported
        .write(folder.join("module.mlir"))
        .map_err(|e| e.to_string())?;
    let mut runs = Vec::new();
    for (r, run) in case.runs.iter().enumerate() {
        let inputs = run
            .inputs
            .iter()
            .enumerate()
            .map(|(i, a)| write_array(&folder, format!("run{r}_in{i}.bin"), a))
            .collect::<Result<Vec<_>, _>>()?;
        let outputs = run
            .outputs
            .iter()
            .enumerate()
            .map(|(i, a)| write_array(&folder, format!("run{r}_out{i}.bin"), a))
            .collect::<Result<Vec<_>, _>>()?;
        runs.push(json!({ "inputs": inputs, "outputs": outputs }));
    }
    let manifest = json!({
        "name": case.name,
        "rule": match case.rule { Match::Exact => "exact", Match::Tolerance => "tolerance" },
        "runs": runs,
        "mesh": case.mesh.as_ref().map(|(m, _)| m.axes().to_vec()),
        "shardings": case.mesh.as_ref().map(|(_, s)| s.clone()),
        "loop": case.training.as_ref().map(|l| json!({
            "steps": l.losses.len(), "feed": l.feed, "loss": l.loss, "losses": l.losses,
        })),
        "collectives": case.collectives,
    });
    let text = serde_json::to_string_pretty(&manifest).map_err(|e| e.to_string())?;
    std::fs::write(folder.join("case.json"), text).map_err(|e| e.to_string())
}
