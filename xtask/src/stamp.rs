//! Build steps that skip themselves when their inputs did not change: each
//! step's output sits beside a stamp holding a fingerprint of everything
//! it read (the input files' bytes, the tool's arguments and version), so a
//! second `cargo xtask serve` on an unchanged tree runs neither
//! wasm-bindgen nor esbuild again.

use std::fs;
use std::path::{Path, PathBuf};

/// A fingerprint of a step's inputs: FNV-1a (64 bits) over each input,
/// length-prefixed so that inputs cannot run into each other. Not a
/// security hash: it only has to notice an edit.
#[derive(Clone, Debug)]
pub struct Fingerprint(u64);

impl Fingerprint {
    /// A fingerprint of `step` (its name and arguments) alone.
    pub fn of(step: &str) -> Fingerprint {
        Fingerprint(FNV_OFFSET).with_bytes(step.as_bytes())
    }

    /// Adds `text` (an argument, a tool's version).
    pub fn with_text(self, text: &str) -> Fingerprint {
        self.with_bytes(text.as_bytes())
    }

    /// Adds the bytes of `file`.
    pub fn with_file(self, file: &Path) -> Result<Fingerprint, String> {
        let bytes = fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        Ok(self
            .with_text(&file.display().to_string())
            .with_bytes(&bytes))
    }

    fn with_bytes(self, bytes: &[u8]) -> Fingerprint {
        let mut hash = self.0;
        for &byte in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(FNV_PRIME);
        }
        Fingerprint(hash)
    }

    fn text(&self) -> String {
        format!("{:016x}\n", self.0)
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Runs `step` (named `name` in the log) unless every one of `outputs`
/// exists and `stamp` holds `inputs`; afterwards writes the stamp. The
/// stamp is removed first, so a step that fails or is interrupted runs
/// again next time.
pub fn unless_fresh(
    name: &str,
    stamp: &Path,
    inputs: &Fingerprint,
    outputs: &[PathBuf],
    step: impl FnOnce() -> Result<(), String>,
) -> Result<(), String> {
    let fresh = fs::read_to_string(stamp).is_ok_and(|s| s == inputs.text())
        && outputs.iter().all(|o| o.exists());
    if fresh {
        eprintln!("  {name}: inputs unchanged, kept {}", describe(outputs));
        return Ok(());
    }
    if stamp.exists() {
        fs::remove_file(stamp).map_err(|e| format!("cannot remove {}: {e}", stamp.display()))?;
    }
    step()?;
    fs::write(stamp, inputs.text()).map_err(|e| format!("cannot write {}: {e}", stamp.display()))
}

fn describe(outputs: &[PathBuf]) -> String {
    outputs
        .iter()
        .map(|o| o.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kiln-stamp-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn fingerprints_differ_when_any_input_differs() {
        let a = Fingerprint::of("step").with_text("x").text();
        assert_eq!(a, Fingerprint::of("step").with_text("x").text());
        assert_ne!(a, Fingerprint::of("step").with_text("y").text());
        assert_ne!(a, Fingerprint::of("other").with_text("x").text());
        // Length prefixes: ("ab", "c") is not ("a", "bc").
        assert_ne!(
            Fingerprint::of("s").with_text("ab").with_text("c").text(),
            Fingerprint::of("s").with_text("a").with_text("bc").text()
        );
    }

    #[test]
    fn a_step_runs_again_only_when_its_inputs_or_outputs_changed() {
        let dir = scratch("rerun");
        let (input, output, stamp) = (dir.join("in"), dir.join("out"), dir.join("out.stamp"));
        let runs = Cell::new(0);
        let step = |fingerprint: &Fingerprint| {
            unless_fresh(
                "copy",
                &stamp,
                fingerprint,
                std::slice::from_ref(&output),
                || {
                    runs.set(runs.get() + 1);
                    fs::copy(&input, &output)
                        .map(drop)
                        .map_err(|e| e.to_string())
                },
            )
            .unwrap();
        };
        let fingerprint = || Fingerprint::of("copy").with_file(&input).unwrap();
        fs::write(&input, "one").unwrap();
        step(&fingerprint());
        step(&fingerprint());
        assert_eq!(runs.get(), 1, "unchanged inputs");
        fs::write(&input, "two").unwrap();
        step(&fingerprint());
        assert_eq!(runs.get(), 2, "an edited input");
        fs::remove_file(&output).unwrap();
        step(&fingerprint());
        assert_eq!(runs.get(), 3, "a missing output");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_step_leaves_no_stamp() {
        let dir = scratch("fail");
        let stamp = dir.join("stamp");
        let inputs = Fingerprint::of("fails");
        fs::write(&stamp, inputs.text()).unwrap();
        let missing = [dir.join("never-made")];
        let result = unless_fresh("fails", &stamp, &inputs, &missing, || Err("no".into()));
        assert_eq!(result, Err("no".to_string()));
        assert!(!stamp.exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}
