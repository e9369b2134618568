//! Byte-level text data: a corpus, its training and held-out splits,
//! random batches, and the bigram model a trained GPT must beat.

use kiln::random::Key;
use kiln::{Array, Error, Result};
use std::path::{Path, PathBuf};

/// A corpus split into training and held-out bytes.
#[derive(Clone, Debug)]
pub struct Corpus {
    /// The first 90 %.
    pub train: Vec<u8>,
    /// The last 10 %.
    pub held_out: Vec<u8>,
}

impl Corpus {
    /// `bytes` split 90 / 10 (the held-out part is the end, so no
    /// training window overlaps it).
    pub fn split(bytes: Vec<u8>) -> Corpus {
        let cut = bytes.len() * 9 / 10;
        let mut train = bytes;
        let held_out = train.split_off(cut);
        Corpus { train, held_out }
    }

    /// The Rust and Markdown sources under `root` (skipping `target/` and
    /// hidden folders), in path order, concatenated.
    pub fn from_sources(root: &Path) -> Result<Corpus> {
        let mut files = Vec::new();
        collect_sources(root, &mut files)?;
        files.sort();
        let mut bytes = Vec::new();
        for file in &files {
            bytes.extend(std::fs::read(file).map_err(|e| io_error(file, e))?);
            bytes.push(b'\n');
        }
        Ok(Corpus::split(bytes))
    }

    /// The bytes of `path`.
    pub fn from_file(path: &Path) -> Result<Corpus> {
        Ok(Corpus::split(
            std::fs::read(path).map_err(|e| io_error(path, e))?,
        ))
    }
}

fn io_error(path: &Path, error: std::io::Error) -> Error {
    Error::InvalidArgument {
        at: None,
        op: "corpus".into(),
        detail: format!("cannot read {}: {error}", path.display()),
    }
}

fn collect_sources(dir: &Path, files: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| io_error(dir, e))? {
        let path = entry.map_err(|e| io_error(dir, e))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with('.') || name == "target" || name == "node_modules" {
            continue;
        }
        if path.is_dir() {
            collect_sources(&path, files)?;
        } else if name.ends_with(".rs") || name.ends_with(".md") {
            files.push(path);
        }
    }
    Ok(())
}

/// A deterministic generator of batch offsets: draw `i` is the seed of
/// `key.fold_in(i)`, Kiln's own key derivation.
#[derive(Clone, Debug)]
pub struct Sampler {
    key: Key,
    draws: u64,
}

impl Sampler {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Sampler {
        Sampler {
            key: Key::new(seed),
            draws: 0,
        }
    }

    /// A value in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        self.draws += 1;
        (self.key.fold_in(self.draws).seed() % n as u64) as usize
    }
}

/// `batch` random windows of `t + 1` bytes of `bytes`: the inputs `[batch,
/// t]` and the targets (the inputs shifted by one), both `i32`. An `Err`
/// when `bytes` is shorter than one window.
pub fn batch(
    bytes: &[u8],
    batch: usize,
    t: usize,
    sampler: &mut Sampler,
) -> Result<(Array, Array)> {
    if bytes.len() <= t {
        return Err(Error::InvalidArgument {
            at: None,
            op: "batch".into(),
            detail: format!("{} bytes hold no window of {} bytes", bytes.len(), t + 1),
        });
    }
    let mut inputs = Vec::with_capacity(batch * t);
    let mut targets = Vec::with_capacity(batch * t);
    for _ in 0..batch {
        let start = sampler.below(bytes.len() - t);
        let window = &bytes[start..start + t + 1];
        inputs.extend(window[..t].iter().map(|&b| i32::from(b)));
        targets.extend(window[1..].iter().map(|&b| i32::from(b)));
    }
    Ok((
        Array::from_vec(inputs, &[batch, t])?,
        Array::from_vec(targets, &[batch, t])?,
    ))
}

/// A bigram model of bytes with add-`alpha` smoothing.
#[derive(Clone, Debug)]
pub struct Bigram {
    /// `counts[a * 256 + b]`: how often `b` follows `a`.
    counts: Vec<f64>,
    alpha: f64,
}

impl Bigram {
    /// Counts the pairs of `bytes`.
    pub fn fit(bytes: &[u8], alpha: f64) -> Bigram {
        let mut counts = vec![0.0; 256 * 256];
        for pair in bytes.windows(2) {
            counts[usize::from(pair[0]) * 256 + usize::from(pair[1])] += 1.0;
        }
        Bigram { counts, alpha }
    }

    /// The mean negative log-likelihood (nats per byte) of each byte of
    /// `bytes` given the one before it.
    pub fn loss(&self, bytes: &[u8]) -> f64 {
        let totals: Vec<f64> = self
            .counts
            .chunks(256)
            .map(|row| row.iter().sum::<f64>() + 256.0 * self.alpha)
            .collect();
        let pairs = bytes.windows(2);
        let n = pairs.len().max(1);
        let sum: f64 = pairs
            .map(|p| {
                let (a, b) = (usize::from(p[0]), usize::from(p[1]));
                -((self.counts[a * 256 + b] + self.alpha) / totals[a]).ln()
            })
            .sum();
        sum / n as f64
    }
}
