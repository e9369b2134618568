//! Trains a byte-level GPT on this repository's sources and decodes from it.
//!
//! ```text
//! cargo run --release --example gpt -- train [--steps 300] [--data FILE] [--device cpu|wgpu]
//! cargo run --release --example gpt -- generate --prompt "fn " --tokens 200 \
//!     [--temperature 0.8 --top-k 40] [--quantize 4] [--device cpu|wgpu]
//! ```
//!
//! `train` runs AdamW (warm-up, then cosine decay) inside one compiled,
//! donated step, evaluates on the held-out tenth of the corpus, prints the
//! held-out loss beside a bigram model's, and saves the weights as
//! safetensors. `generate` loads them and decodes inside compiled `scan`s
//! with the KV caches written in place.

use indicatif::{ProgressBar, ProgressStyle};
use kiln::optim::{AdamW, Optimizer, Schedule};
use kiln::random::Key;
use kiln::{compile, AnyBackend, Array, CpuBackend, DType, Error, QuantFormat, Result};
use kiln_models::data::{batch, Bigram, Corpus, Sampler};
use kiln_models::{decode, pick_tokens, train, Gpt, GptConfig, Sampling};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

const USAGE: &str =
    "usage: gpt train [--steps N] [--batch N] [--data FILE] [--weights FILE] [--device cpu|wgpu]
       gpt generate [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] [--seed S]
                    [--quantize 4|8] [--weights FILE] [--device cpu|wgpu]";

/// The command line's `--name value` options.
struct Options(HashMap<String, String>);

impl Options {
    fn parse(args: &[String]) -> Result<Options> {
        let mut options = HashMap::new();
        let mut rest = args.iter();
        while let Some(flag) = rest.next() {
            let name = flag.strip_prefix("--").ok_or_else(|| usage(flag))?;
            let value = rest.next().ok_or_else(|| usage(flag))?;
            options.insert(name.to_string(), value.clone());
        }
        Ok(Options(options))
    }

    fn text(&self, name: &str, default: &str) -> String {
        self.0
            .get(name)
            .cloned()
            .unwrap_or_else(|| default.to_string())
    }

    fn number<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T> {
        match self.0.get(name) {
            None => Ok(default),
            Some(text) => text.parse().map_err(|_| Error::InvalidArgument {
                at: None,
                op: "gpt".into(),
                detail: format!("--{name} takes a number, got {text:?}"),
            }),
        }
    }

    fn weights(&self) -> PathBuf {
        PathBuf::from(self.text("weights", "target/gpt-small.safetensors"))
    }

    fn backend(&self) -> Result<AnyBackend> {
        match self.text("device", "cpu").as_str() {
            "cpu" => Ok(AnyBackend::new(Arc::new(CpuBackend))),
            "wgpu" => Ok(AnyBackend::new(Arc::new(kiln_wgpu::WgpuBackend::new()?))),
            other => Err(usage(other)),
        }
    }
}

fn usage(near: &str) -> Error {
    Error::InvalidArgument {
        at: None,
        op: "gpt".into(),
        detail: format!("unexpected {near:?}\n{USAGE}"),
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = Options::parse(args.get(1..).unwrap_or(&[]))?;
    match args.first().map(String::as_str) {
        Some("train") => train_command(&options),
        Some("generate") => generate_command(&options),
        _ => Err(usage(args.first().map_or("", String::as_str))),
    }
}

fn train_command(options: &Options) -> Result<()> {
    let config = GptConfig::SMALL;
    let steps: usize = options.number("steps", 300)?;
    let batch_size: usize = options.number("batch", 8)?;
    let corpus = match options.0.get("data") {
        Some(file) => Corpus::from_file(file.as_ref())?,
        None => Corpus::from_sources(&workspace_root())?,
    };
    println!(
        "corpus: {} training bytes, {} held out",
        corpus.train.len(),
        corpus.held_out.len()
    );
    let optimizer = AdamW::new(Schedule::warmup_cosine(1e-3, steps / 10, steps, 1e-4))
        .betas(0.9, 0.95)
        .weight_decay(0.1)
        .clip(1.0);
    let step = compile(train::step(optimizer.clone()))
        .donate(train::DONATED)
        .with_backend(options.backend()?);
    let mut model = Gpt::new(Key::new(0), config)?;
    let mut state = optimizer.init(&model)?;
    println!("model: {} parameters", kiln::tree::parameter_count(&model)?);
    let bar = ProgressBar::new(steps as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
            .map_err(|e| usage(&e.to_string()))?,
    );
    let mut sampler = Sampler::new(1);
    let started = Instant::now();
    for i in 0..steps {
        let (inputs, targets) = batch(&corpus.train, batch_size, config.context, &mut sampler)?;
        let count = Array::scalar(i as f64, DType::F32);
        let (next_model, next_state, loss) =
            step.call_owned((model, state, count, inputs, targets))?;
        (model, state) = (next_model, next_state);
        let tokens = ((i + 1) * batch_size * config.context) as f64;
        bar.set_message(format!(
            "loss {:.3}  {:.0} tokens/s",
            loss.item::<f32>()?,
            tokens / started.elapsed().as_secs_f64()
        ));
        bar.inc(1);
    }
    bar.finish();
    let held_out = held_out_loss(&model, &corpus.held_out, batch_size)?;
    let bigram = Bigram::fit(&corpus.train, 0.1).loss(&corpus.held_out);
    println!("held-out loss: GPT {held_out:.4}, bigram {bigram:.4} (nats per byte)");
    let path = options.weights();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| usage(&e.to_string()))?;
    }
    kiln::io::save_safetensors(&path, &model)?;
    println!("saved {}", path.display());
    Ok(())
}

/// The workspace's root: the folder above this crate's.
fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map_or(manifest.clone(), PathBuf::from)
}

/// The mean loss over 16 fixed batches of the held-out bytes.
fn held_out_loss(model: &Gpt, held_out: &[u8], batch_size: usize) -> Result<f64> {
    let loss =
        compile(|(model, inputs, targets): (Gpt, Array, Array)| model.loss(&inputs, &targets));
    let mut sampler = Sampler::new(2);
    let mut total = 0.0;
    for _ in 0..16 {
        let (inputs, targets) = batch(held_out, batch_size, model.config.context, &mut sampler)?;
        total += f64::from(
            loss.call(&(model.clone(), inputs, targets))?
                .item::<f32>()?,
        );
    }
    Ok(total / 16.0)
}

fn generate_command(options: &Options) -> Result<()> {
    let config = GptConfig::SMALL;
    let template = Gpt::new(Key::new(0), config)?;
    let mut model = kiln::io::load_safetensors_into(options.weights(), &template)?;
    let bits: u32 = options.number("quantize", 0)?;
    if bits != 0 {
        model = model.quantize(QuantFormat::affine(bits, 64))?;
    }
    let sampling = Sampling {
        temperature: options.number("temperature", 0.0)?,
        top_k: options.number("top-k", 0)?,
    };
    let prompt = options.text("prompt", "fn ").into_bytes();
    let tokens: usize = options.number("tokens", 200)?;
    let seed: u64 = options.number("seed", 0)?;
    let started = Instant::now();
    let text = generate(&model, &prompt, tokens, sampling, seed, options.backend()?)?;
    let elapsed = started.elapsed().as_secs_f64();
    println!("{}", String::from_utf8_lossy(&text));
    eprintln!(
        "{tokens} tokens in {elapsed:.2} s ({:.1} tokens/s)",
        tokens as f64 / elapsed
    );
    Ok(())
}

/// The prompt followed by `tokens` decoded bytes. The caches hold the
/// model's context: when they fill, the last half of the text is prefilled
/// into fresh caches and decoding goes on (a sliding window).
fn generate(
    model: &Gpt,
    prompt: &[u8],
    tokens: usize,
    sampling: Sampling,
    seed: u64,
    backend: AnyBackend,
) -> Result<Vec<u8>> {
    let context = model.config.context;
    if prompt.is_empty() || prompt.len() >= context {
        return Err(Error::InvalidArgument { at: None,
            op: "generate".into(),
            detail: format!(
                "the prompt of {} bytes must hold 1 to {} bytes, the model's context of {context} less one",
                prompt.len(),
                context - 1
            ),
        });
    }
    let prefill = compile(|(model, ids, key): (Gpt, Array, Array)| {
        let (logits, caches) = model.forward_cached(&ids, &model.empty_caches(1));
        let t = logits.dims().map_or(1, |d| d[1]) as i64;
        let last = logits.slice_axis(1, t - 1, Some(t), 1).squeeze(&[1]);
        (pick_tokens(&last, &key, sampling), caches)
    })
    .with_backend(backend.clone());
    let decode_steps = compile(
        |(model, caches, first, key, steps): (Gpt, Vec<kiln::nn::KvCache>, Array, Array, usize)| {
            decode(&model, &caches, &first, &key, steps, sampling)
        },
    )
    .donate(["args[1]"])
    .with_backend(backend);
    let mut text = prompt.to_vec();
    let mut round = 0u64;
    while text.len() < prompt.len() + tokens {
        let start = if text.len() < context {
            0
        } else {
            text.len() - context / 2
        };
        let window = &text[start..];
        let ids = Array::from_vec(
            window.iter().map(|&b| i32::from(b)).collect(),
            &[1, window.len()],
        )?;
        let key = kiln::nn::key_array(Key::new(seed).fold_in(round));
        let (first, caches) = prefill.call(&(model.clone(), ids, key.clone()))?;
        let room = context - window.len();
        text.push(first.to_vec::<i32>()?[0] as u8);
        let steps = room.min(prompt.len() + tokens - text.len());
        if steps > 0 {
            let step_key = kiln::nn::key_array(Key::new(seed).fold_in(round).fold_in(1));
            let (decoded, _) =
                decode_steps.call_owned((model.clone(), caches, first, step_key, steps))?;
            text.extend(decoded.to_vec::<i32>()?.iter().map(|&t| t as u8));
        }
        round += 1;
    }
    Ok(text)
}
