//! The GPT of `kiln-models` end to end: cached decoding against the full
//! pass, decoding inside one compiled scan, its plan, the training step's
//! in-place updates and its progress, the CPU against wgpu, and bad input.

use kiln::optim::{AdamW, Optimizer, Schedule};
use kiln::random::Key;
use kiln::{compile, Array, DType};
use kiln_models::data::{batch, Sampler};
use kiln_models::{decode, train, Gpt, GptConfig, Sampling};
use kiln_tests::arrays::close;

const TINY: GptConfig = GptConfig {
    vocab: 32,
    context: 16,
    width: 16,
    layers: 2,
    heads: 2,
};

fn model(config: GptConfig) -> Gpt {
    Gpt::new(Key::new(7), config).expect("a model")
}

fn ids(values: &[i32]) -> Array {
    Array::from_vec(values.to_vec(), &[1, values.len()]).expect("ids")
}

#[test]
fn one_cached_decoding_step_equals_the_last_position_of_the_full_pass() {
    let gpt = model(TINY);
    let prompt = [3, 1, 4, 1, 5, 9];
    let full = gpt.forward(&ids(&prompt));
    let (_, caches) = gpt.forward_cached(&ids(&prompt[..5]), &gpt.empty_caches(1));
    let (last, caches) = gpt.forward_cached(&ids(&prompt[5..]), &caches);
    close(&last, &full.slice_axis(1, 5, None, 1), 1e-5, 0.0);
    assert_eq!(caches[1].offset.item::<i32>().expect("an offset"), 6);
}

#[test]
fn a_sequence_longer_than_the_context_is_an_error_naming_both_lengths() {
    let gpt = model(TINY);
    let error = gpt
        .forward(&ids(&[1; 17]))
        .check()
        .expect_err("17 tokens exceed a context of 16");
    let message = error.to_string();
    assert!(
        message.contains("17") && message.contains("16"),
        "{message}"
    );
    let loss = compile(|(gpt, x): (Gpt, Array)| gpt.loss(&x, &x));
    assert!(loss.call(&(gpt, ids(&[1; 17]))).is_err());
}

#[test]
fn greedy_decoding_in_one_scan_repeats_the_argmax_of_full_passes() {
    let gpt = model(TINY);
    let prompt = [2, 7, 1];
    let (logits, caches) = gpt.forward_cached(&ids(&prompt), &gpt.empty_caches(1));
    let first = logits
        .slice_axis(1, 2, Some(3), 1)
        .squeeze(&[1])
        .argmax(-1, false)
        .cast(DType::I32);
    let run = compile(
        |(gpt, caches, first): (Gpt, Vec<kiln::nn::KvCache>, Array)| {
            let key = Array::scalar(0.0, DType::U32);
            decode(&gpt, &caches, &first, &key, 5, Sampling::GREEDY)
        },
    );
    let (decoded, _) = run
        .call(&(gpt.clone(), caches, first.clone()))
        .expect("decodes");
    let mut text = prompt.to_vec();
    text.push(first.to_vec::<i32>().expect("a token")[0]);
    for _ in 0..5 {
        let logits = gpt.forward(&ids(&text)).to_vec::<f32>().expect("logits");
        let last = &logits[(text.len() - 1) * 32..];
        let best = (0..32)
            .max_by(|&a, &b| last[a].total_cmp(&last[b]))
            .expect("a vocabulary");
        text.push(best as i32);
    }
    assert_eq!(decoded.to_vec::<i32>().expect("tokens"), text[4..].to_vec());
}

#[test]
fn sampling_with_top_k_one_is_greedy_and_other_keys_draw_otherwise() {
    let logits = Array::random_normal(Key::new(3), &[4, 50], DType::F32).expect("logits");
    let greedy =
        kiln_models::pick_tokens(&logits, &Array::scalar(0.0, DType::U32), Sampling::GREEDY);
    let top1 = Sampling {
        temperature: 1.0,
        top_k: 1,
    };
    for seed in 0..3 {
        let key = kiln::nn::key_array(Key::new(seed));
        let picked = kiln_models::pick_tokens(&logits, &key, top1);
        assert_eq!(
            picked.to_vec::<i32>().expect("tokens"),
            greedy.to_vec::<i32>().expect("tokens")
        );
    }
    let hot = Sampling {
        temperature: 100.0,
        top_k: 0,
    };
    let draws: std::collections::BTreeSet<i32> = (0..8)
        .map(|seed| {
            let key = kiln::nn::key_array(Key::new(seed));
            kiln_models::pick_tokens(&logits, &key, hot)
                .to_vec::<i32>()
                .expect("tokens")[0]
        })
        .collect();
    assert!(draws.len() > 2, "8 hot draws gave {draws:?}");
}

/// The planned peak of decoding `steps` tokens of a model with a context
/// of 384 (attention reads its caches block by block).
fn decoding_peak(steps: usize) -> usize {
    let gpt = model(GptConfig {
        context: 384,
        ..TINY
    });
    let run = compile(
        move |(gpt, caches, first): (Gpt, Vec<kiln::nn::KvCache>, Array)| {
            let key = Array::scalar(0.0, DType::U32);
            decode(&gpt, &caches, &first, &key, steps, Sampling::GREEDY)
        },
    )
    .donate(["args[1]"]);
    let first = Array::from_vec(vec![1i32], &[1]).expect("a token");
    let caches = gpt.empty_caches(1);
    run.call_owned((gpt, caches, first)).expect("decodes");
    run.cache().reports[0].plan.memory.peak_bytes
}

#[test]
fn decoding_peak_grows_only_by_the_decoded_tokens() {
    let (short, long) = (decoding_peak(16), decoding_peak(256));
    // The stacked tokens are the only output that grows: 4 bytes a token.
    assert!(
        long <= short + (256 - 16) * 4,
        "peak {short} bytes for 16 tokens, {long} for 256"
    );
}

type Step = (Gpt, kiln::optim::AdamState<Gpt>, Array);

fn training_run(steps: usize) -> (Vec<f32>, kiln::CacheInfo) {
    let optimizer = AdamW::new(Schedule::warmup_cosine(1e-2, 2, steps, 1e-3)).weight_decay(0.1);
    let step = compile(train::step(optimizer.clone())).donate(train::DONATED);
    let mut gpt = model(TINY);
    let mut state = optimizer.init(&gpt).expect("a state");
    let text: Vec<u8> = (0..400).map(|i| (i * 7 % 31) as u8).collect();
    let (inputs, targets) = batch(&text, 4, 16, &mut Sampler::new(3)).expect("a batch");
    let mut losses = Vec::new();
    for i in 0..steps {
        let count = Array::scalar(i as f64, DType::F32);
        let args = (gpt, state, count, inputs.clone(), targets.clone());
        let (next, next_state, loss): Step = step.call_owned(args).expect("steps");
        losses.push(loss.item::<f32>().expect("a loss"));
        (gpt, state) = (next, next_state);
    }
    (losses, step.cache())
}

#[test]
fn twenty_training_steps_lower_the_loss_on_a_fixed_batch() {
    let (losses, cache) = training_run(20);
    assert!(
        losses[19] < 0.7 * losses[0],
        "loss {} → {}",
        losses[0],
        losses[19]
    );
    assert_eq!((cache.entries, cache.hits), (1, 19), "{}", cache.summary());
}

#[test]
fn the_training_step_updates_every_parameter_and_moment_in_place() {
    let (_, cache) = training_run(2);
    let report = &cache.reports[0];
    let leaves = kiln::tree::parameter_count(&model(TINY)).expect("a count");
    assert!(leaves > 0);
    let params = kiln::tree_flatten_with_path(&model(TINY))
        .expect("paths")
        .len();
    // Model leaves, then the two moments', then the loss.
    assert_eq!(report.plan.donated.len(), 3 * params);
    let memory = &report.plan.memory;
    assert!(
        memory.peak_bytes <= memory.lower_bound_bytes + memory.lower_bound_bytes / 1000,
        "planned peak {} bytes, lower bound {}",
        memory.peak_bytes,
        memory.lower_bound_bytes
    );
    let summary = report.to_string();
    assert!(
        summary.contains(&format!("donated: {} leaves", 3 * params)),
        "{summary}"
    );
    assert!(
        summary.lines().all(|line| line.chars().count() < 400),
        "{summary}"
    );
    for (out, input) in report.outputs.iter().zip(&report.plan.donated) {
        let node = &report.nodes[*out];
        assert_eq!(
            &node.home, input,
            "output %{out} ({}) is not written over {input}",
            node.op
        );
    }
}

#[test]
fn cpu_and_wgpu_logits_agree() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let gpt = model(TINY);
    let forward = |(gpt, x): (Gpt, Array)| gpt.forward(&x);
    let prompt = ids(&[1, 2, 3, 4, 5, 6, 7, 8]);
    let on_cpu = compile(forward)
        .call(&(gpt.clone(), prompt.clone()))
        .expect("runs");
    let on_gpu = compile(forward)
        .with_backend(gpu)
        .call(&(gpt, prompt))
        .expect("runs on wgpu");
    close(&on_gpu, &on_cpu, 1e-4, 0.0);
}

#[test]
fn a_quantized_model_decodes_close_to_the_dense_one() {
    let gpt = model(GptConfig { width: 64, ..TINY });
    let quantized = gpt
        .quantize(kiln::QuantFormat::affine(8, 32))
        .expect("quantizes");
    assert!(quantized.weight_bytes().expect("sizes") < gpt.weight_bytes().expect("sizes") / 2);
    let prompt = ids(&[3, 1, 4, 1, 5]);
    let dense = gpt.forward(&prompt);
    let (logits, _) = quantized.forward_cached(&prompt, &quantized.empty_caches(1));
    close(&logits, &dense, 2e-2, 0.0);
}

#[test]
fn a_training_step_and_greedy_decoding_on_wgpu_match_the_cpu() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    let optimizer = AdamW::new(1e-2);
    let gpt = model(TINY);
    let state = optimizer.init(&gpt).expect("a state");
    let text: Vec<u8> = (0..200).map(|i| (i * 5 % 29) as u8).collect();
    let (inputs, targets) = batch(&text, 2, 16, &mut Sampler::new(4)).expect("a batch");
    let args = (
        gpt.clone(),
        state,
        Array::scalar(0.0, DType::F32),
        inputs,
        targets,
    );
    let on_cpu: Step = compile(train::step(optimizer.clone()))
        .call(&args)
        .expect("steps");
    let on_gpu: Step = compile(train::step(optimizer))
        .with_backend(gpu.clone())
        .call(&args)
        .expect("steps on wgpu");
    close(&on_gpu.2, &on_cpu.2, 1e-4, 0.0);
    close(
        &on_gpu.0.blocks[1].mlp.up.weight,
        &on_cpu.0.blocks[1].mlp.up.weight,
        1e-4,
        0.0,
    );

    // A context of two cache blocks, and a prompt that ends just before the
    // second: decoding crosses into it.
    let gpt = model(GptConfig {
        context: 256,
        ..TINY
    });
    let prompt: Vec<i32> = (0..126).map(|i| i % 31).collect();
    let decoder = |(gpt, first): (Gpt, Array)| {
        let (_, caches) = gpt.forward_cached(&ids(&prompt), &gpt.empty_caches(1));
        let key = Array::scalar(0.0, DType::U32);
        decode(&gpt, &caches, &first, &key, 6, Sampling::GREEDY).map(|(t, _)| t)
    };
    let first = Array::from_vec(vec![3i32], &[1]).expect("a token");
    let want = compile(decoder)
        .call(&(gpt.clone(), first.clone()))
        .expect("decodes");
    let got = compile(decoder)
        .with_backend(gpu)
        .call(&(gpt, first))
        .expect("decodes on wgpu");
    assert_eq!(
        got.to_vec::<i32>().expect("tokens"),
        want.to_vec::<i32>().expect("tokens")
    );
}
