//! Each layer and function against a host reference written with plain
//! loops, and its gradient against central differences.

use super::*;
use crate::random::Key;
use crate::{compile, grad, Array, DType, QuantFormat};

fn normal(seed: u64, shape: &[usize]) -> Array {
    Array::random_normal(Key::new(seed), shape, DType::F32).expect("a valid shape")
}

fn values(x: &Array) -> Vec<f32> {
    x.to_vec::<f32>().expect("the array evaluates")
}

fn assert_close(actual: &[f32], expected: &[f32], tolerance: f32) {
    assert_eq!(actual.len(), expected.len(), "lengths differ");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= tolerance * (1.0 + e.abs()),
            "element {i}: {a} differs from {e}"
        );
    }
}

/// `y[r, o] = Σ_i x[r, i] w[o, i] + b[o]`.
fn linear_reference(x: &[f32], w: &[f32], b: &[f32], inputs: usize, outputs: usize) -> Vec<f32> {
    let rows = x.len() / inputs;
    let mut y = vec![0.0; rows * outputs];
    for r in 0..rows {
        for o in 0..outputs {
            let dot: f32 = (0..inputs)
                .map(|i| x[r * inputs + i] * w[o * inputs + i])
                .sum();
            y[r * outputs + o] = dot + b[o];
        }
    }
    y
}

/// Row-wise `(x - mean) / sqrt(var + eps)`.
fn normalize_rows(x: &[f32], dim: usize, eps: f32) -> Vec<f32> {
    x.chunks(dim)
        .flat_map(|row| {
            let mean = row.iter().sum::<f32>() / dim as f32;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / dim as f32;
            row.iter()
                .map(move |v| (v - mean) / (var + eps).sqrt())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn softmax_rows(scores: &mut [f32], width: usize) {
    for row in scores.chunks_mut(width) {
        let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = row.iter().map(|s| (s - max).exp()).sum();
        row.iter_mut().for_each(|s| *s = (*s - max).exp() / sum);
    }
}

/// Checks the gradient of the scalar `f` at `x` against central
/// differences at every coordinate.
fn check_gradient(f: impl Fn(Array) -> Array + Copy, x: &Array) {
    let analytic = values(&grad(f).call(x).expect("the gradient traces"));
    let point = values(x);
    let shape = x.dims().expect("a known shape");
    let h = 1e-2f32;
    for i in 0..point.len() {
        let at = |delta: f32| {
            let mut moved = point.clone();
            moved[i] += delta;
            let moved = Array::from_vec(moved, &shape).expect("same shape");
            f(moved).item::<f32>().expect("a scalar")
        };
        let numeric = (at(h) - at(-h)) / (2.0 * h);
        assert!(
            (numeric - analytic[i]).abs() <= 2e-2 * (1.0 + numeric.abs()),
            "coordinate {i}: central difference {numeric}, gradient {}",
            analytic[i]
        );
    }
}

#[test]
fn linear_is_x_times_the_transposed_weight_plus_bias() {
    let layer = Linear::from_weight(normal(1, &[3, 4]), Some(normal(2, &[3])));
    let x = normal(3, &[2, 4]);
    let expected = linear_reference(
        &values(&x),
        &values(&layer.weight),
        &values(layer.bias.as_ref().expect("a bias")),
        4,
        3,
    );
    assert_close(&values(&layer.forward(&x)), &expected, 1e-5);
}

#[test]
fn a_quantized_linear_computes_with_its_dequantized_weight() {
    let layer = Linear::new(Key::new(4), 64, 8, true).expect("a layer");
    let format = QuantFormat::affine(4, 32);
    let quantized = layer.quantize(format).expect("quantizes");
    assert_eq!(quantized.weight.dtype(), DType::U32);
    assert_eq!(quantized.weight.dims(), Some(vec![8, 64 * 4 / 32]));
    let dense = Linear::from_weight(
        quantized.quantized().expect("quantized").dequantize(),
        layer.bias.clone(),
    );
    let x = normal(5, &[3, 64]);
    assert_close(
        &values(&quantized.forward(&x)),
        &values(&dense.forward(&x)),
        1e-4,
    );
    assert!(quantized.quantize(format).is_err());
}

#[test]
fn embedding_picks_rows_and_ties_as_the_output_layer() {
    let table = Embedding::from_table(
        Array::from_vec((0..12).map(|v| v as f32).collect(), &[4, 3]).expect("a table"),
    );
    let ids = Array::from_vec(vec![2i32, 0], &[2]).expect("ids");
    assert_eq!(values(&table.forward(&ids)), [6.0, 7.0, 8.0, 0.0, 1.0, 2.0]);
    let x = Array::from_vec(vec![1.0f32, 0.0, 1.0], &[1, 3]).expect("x");
    assert_eq!(values(&table.as_linear(&x)), [2.0, 8.0, 14.0, 20.0]);
}

#[test]
fn a_quantized_embedding_looks_up_and_projects_with_its_dequantized_table() {
    let table = Embedding::new(Key::new(40), 6, 64, 1.0).expect("a table");
    let quantized = table
        .quantize(QuantFormat::affine(4, 32))
        .expect("quantizes");
    let dense = Embedding::from_table(quantized.quantized().expect("quantized").dequantize());
    let ids = Array::from_vec(vec![5i32, 0, 5], &[3]).expect("ids");
    assert_close(
        &values(&quantized.forward(&ids)),
        &values(&dense.forward(&ids)),
        1e-6,
    );
    let x = normal(41, &[2, 64]);
    assert_close(
        &values(&quantized.as_linear(&x)),
        &values(&dense.as_linear(&x)),
        1e-4,
    );
    assert!(quantized.quantize(QuantFormat::affine(4, 32)).is_err());
}

#[test]
fn layer_norm_and_rms_norm_match_row_loops() {
    let x = normal(6, &[3, 5]);
    let mut norm = LayerNorm::new(5, 1e-5);
    norm.weight = Some(normal(7, &[5]));
    norm.bias = Some(normal(8, &[5]));
    let (gamma, beta) = (
        values(norm.weight.as_ref().unwrap()),
        values(norm.bias.as_ref().unwrap()),
    );
    let expected: Vec<f32> = normalize_rows(&values(&x), 5, 1e-5)
        .iter()
        .enumerate()
        .map(|(i, v)| v * gamma[i % 5] + beta[i % 5])
        .collect();
    assert_close(&values(&norm.forward(&x)), &expected, 1e-4);

    let rms = RmsNorm {
        weight: normal(9, &[5]),
        eps: 1e-6,
    };
    let scale = values(&rms.weight);
    let expected: Vec<f32> = values(&x)
        .chunks(5)
        .flat_map(|row| {
            let ms = row.iter().map(|v| v * v).sum::<f32>() / 5.0;
            row.iter()
                .enumerate()
                .map(|(i, v)| v / (ms + 1e-6).sqrt() * scale[i])
                .collect::<Vec<_>>()
        })
        .collect();
    assert_close(&values(&rms.forward(&x)), &expected, 1e-4);
}

#[test]
fn silu_is_x_times_its_sigmoid() {
    let x = normal(10, &[7]);
    let expected: Vec<f32> = values(&x).iter().map(|v| v / (1.0 + (-v).exp())).collect();
    assert_close(&values(&silu(&x)), &expected, 1e-6);
}

#[test]
fn rope_rotates_each_half_pair_by_position_times_frequency() {
    let (t, d, base) = (3, 4, 100.0f32);
    let x = normal(11, &[t, d]);
    let positions = Array::from_vec(vec![0i32, 2, 5], &[3]).expect("positions");
    let xs = values(&x);
    let mut expected = vec![0.0; t * d];
    for (row, p) in [0.0f32, 2.0, 5.0].iter().enumerate() {
        for i in 0..d / 2 {
            let angle = p * base.powf(-2.0 * i as f32 / d as f32);
            let (a, b) = (xs[row * d + i], xs[row * d + i + d / 2]);
            expected[row * d + i] = a * angle.cos() - b * angle.sin();
            expected[row * d + i + d / 2] = a * angle.sin() + b * angle.cos();
        }
    }
    assert_close(&values(&rope(&x, &positions, base as f64)), &expected, 1e-5);
    assert!(rope(&normal(12, &[2, 3]), &positions, 10.0)
        .check()
        .is_err());
}

/// Attention of one head `[t, d]` with a causal mask, by loops.
fn causal_attention_reference(q: &[f32], k: &[f32], v: &[f32], t: usize, d: usize) -> Vec<f32> {
    let mut scores = vec![f32::NEG_INFINITY; t * t];
    for i in 0..t {
        for j in 0..=i {
            let dot: f32 = (0..d).map(|c| q[i * d + c] * k[j * d + c]).sum();
            scores[i * t + j] = dot / (d as f32).sqrt();
        }
    }
    softmax_rows(&mut scores, t);
    let mut out = vec![0.0; t * d];
    for i in 0..t {
        for j in 0..t {
            for c in 0..d {
                out[i * d + c] += scores[i * t + j] * v[j * d + c];
            }
        }
    }
    out
}

#[test]
fn masked_attention_matches_the_reference_on_the_allowed_positions() {
    let (t, d) = (4, 3);
    let (q, k, v) = (
        normal(13, &[t, d]),
        normal(14, &[t, d]),
        normal(15, &[t, d]),
    );
    let y = scaled_dot_product_attention(&q, &k, &v, Some(&causal_mask(t)));
    let expected = causal_attention_reference(&values(&q), &values(&k), &values(&v), t, d);
    assert_close(&values(&y), &expected, 1e-5);
    // The last row may see every key: it is the unmasked attention's.
    let unmasked = scaled_dot_product_attention(&q, &k, &v, None);
    assert_close(
        &values(&y)[(t - 1) * d..],
        &values(&unmasked)[(t - 1) * d..],
        1e-6,
    );
    assert_eq!(
        causal_mask(3).to_vec::<bool>().expect("a mask"),
        [true, false, false, true, true, false, true, true, true]
    );
}

#[test]
fn a_fully_masked_row_averages_the_values_instead_of_nan() {
    let (q, k, v) = (
        normal(16, &[1, 2]),
        normal(17, &[3, 2]),
        normal(18, &[3, 2]),
    );
    let none = Array::from_vec(vec![false; 3], &[1, 3]).expect("a mask");
    let y = values(&scaled_dot_product_attention(&q, &k, &v, Some(&none)));
    let vs = values(&v);
    let mean = [(vs[0] + vs[2] + vs[4]) / 3.0, (vs[1] + vs[3] + vs[5]) / 3.0];
    assert_close(&y, &mean, 1e-6);
}

#[test]
fn cross_entropy_is_the_mean_negative_log_probability_of_kept_targets() {
    let logits = normal(19, &[3, 4]);
    let targets = Array::from_vec(vec![1i32, -1, 3], &[3]).expect("targets");
    let rows = values(&logits);
    let nll = |row: &[f32], target: usize| {
        let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let lse = row.iter().map(|v| (v - max).exp()).sum::<f32>().ln() + max;
        lse - row[target]
    };
    let expected = (nll(&rows[0..4], 1) + nll(&rows[8..12], 3)) / 2.0;
    let loss = cross_entropy(&logits, &targets, Some(-1));
    assert!((loss.item::<f32>().expect("a scalar") - expected).abs() < 1e-5);
    let all_ignored = Array::from_vec(vec![-1i32; 3], &[3]).expect("targets");
    assert_eq!(
        cross_entropy(&logits, &all_ignored, Some(-1))
            .item::<f32>()
            .expect("a scalar"),
        0.0
    );
}

#[test]
fn in_graph_uniform_draws_are_keyed_spread_and_in_range() {
    let key = key_array(Key::new(3));
    let draws = values(&random_uniform(&key, &[4096]));
    assert!(draws.iter().all(|v| (0.0..1.0).contains(v)));
    let mean = draws.iter().sum::<f32>() / draws.len() as f32;
    assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
    let below_tenth = draws.iter().filter(|v| **v < 0.1).count();
    assert!((330..490).contains(&below_tenth), "{below_tenth} below 0.1");
    assert_eq!(draws, values(&random_uniform(&key, &[4096])));
    assert_ne!(
        draws,
        values(&random_uniform(&key_array(Key::new(4)), &[4096]))
    );
}

#[test]
fn dropout_zeroes_about_its_rate_and_scales_the_rest() {
    let x = Array::ones(&[2000], DType::F32);
    let layer = Dropout::new(0.25);
    let key = key_array(Key::new(9));
    let y = values(&layer.forward(&x, Some(&key)));
    let zeros = y.iter().filter(|v| **v == 0.0).count();
    assert!((400..600).contains(&zeros), "{zeros} zeroed");
    assert!(y.iter().all(|v| *v == 0.0 || (v - 4.0 / 3.0).abs() < 1e-6));
    assert_eq!(values(&layer.forward(&x, None)), values(&x));
    assert!(dropout(&x, 1.0, &key).check().is_err());
}

#[test]
fn a_compiled_dropout_draws_anew_for_a_new_key_without_retracing() {
    let f = compile(|(x, key): (Array, Array)| dropout(&x, 0.5, &key));
    let x = Array::ones(&[64], DType::F32);
    let a = values(&f.call(&(x.clone(), key_array(Key::new(1)))).expect("runs"));
    let b = values(&f.call(&(x, key_array(Key::new(2)))).expect("runs"));
    assert_ne!(a, b);
    assert_eq!(f.cache().entries, 1);
}

#[test]
fn swiglu_mlp_gates_the_up_projection_with_silu() {
    let mlp = Mlp::new(Key::new(20), 4, 6, Activation::SwiGlu, 0.5).expect("a block");
    assert!(mlp.up.bias.is_none());
    let x = normal(21, &[2, 4]);
    let gate = mlp.gate.as_ref().expect("a gate");
    let expected = mlp
        .proj
        .forward(&(silu(&gate.forward(&x)) * mlp.up.forward(&x)));
    assert_close(&values(&mlp.forward(&x)), &values(&expected), 1e-6);
    let gelu_mlp = Mlp::new(Key::new(22), 4, 6, Activation::GeluTanh, 0.5).expect("a block");
    let expected = gelu_mlp
        .proj
        .forward(&crate::nn::gelu_tanh(&gelu_mlp.up.forward(&x)));
    assert_close(&values(&gelu_mlp.forward(&x)), &values(&expected), 1e-6);
}

#[test]
fn attention_matches_per_head_causal_attention_by_loops() {
    let (t, dim, heads) = (3, 4, 2);
    let layer = Attention::new(Key::new(23), dim, heads, 0.5).expect("a layer");
    let x = normal(24, &[1, t, dim]);
    let qkv = values(&layer.qkv.forward(&x));
    let hd = dim / heads;
    let mut merged = vec![0.0; t * dim];
    for h in 0..heads {
        let column = |part: usize| -> Vec<f32> {
            (0..t)
                .flat_map(|r| {
                    let start = r * 3 * dim + part * dim + h * hd;
                    qkv[start..start + hd].to_vec()
                })
                .collect()
        };
        let out = causal_attention_reference(&column(0), &column(1), &column(2), t, hd);
        for r in 0..t {
            merged[r * dim + h * hd..r * dim + (h + 1) * hd]
                .copy_from_slice(&out[r * hd..(r + 1) * hd]);
        }
    }
    let merged = Array::from_vec(merged, &[1, t, dim]).expect("merged heads");
    assert_close(
        &values(&layer.forward(&x)),
        &values(&layer.proj.forward(&merged)),
        1e-5,
    );
}

#[test]
fn decoding_with_the_cache_equals_the_full_pass_at_every_position() {
    for rope_base in [None, Some(10_000.0)] {
        let mut layer = Attention::new(Key::new(25), 8, 2, 0.3).expect("a layer");
        layer.rope_base = rope_base;
        let x = normal(26, &[1, 5, 8]);
        let full = values(&layer.forward(&x));
        // A prompt of two positions, then one at a time.
        let mut cache = KvCache::new(1, 2, 8, 4);
        let (y, next) = layer.forward_cached(&x.slice_axis(1, 0, Some(2), 1), &cache);
        assert_close(&values(&y), &full[..16], 1e-5);
        cache = next;
        for t in 2..5 {
            let (y, next) = layer.forward_cached(&x.slice_axis(1, t, Some(t + 1), 1), &cache);
            assert_close(
                &values(&y),
                &full[t as usize * 8..(t as usize + 1) * 8],
                1e-5,
            );
            cache = next;
        }
        assert_eq!(cache.offset.item::<i32>().expect("an offset"), 5);
    }
}

#[test]
fn a_cache_of_several_blocks_is_read_block_by_block_with_the_full_pass_values() {
    // A cache of three blocks: the chunks start and end inside blocks, on
    // a boundary and across two of them.
    let block = super::attention::CACHE_BLOCK;
    let (dim, heads) = (8, 2);
    let mut layer = Attention::new(Key::new(31), dim, heads, 0.3).expect("a layer");
    layer.rope_base = Some(10_000.0);
    let len = 2 * block + 44;
    let x = normal(32, &[1, len, dim]);
    let full = values(&layer.forward(&x));
    let mut cache = KvCache::new(1, heads, 3 * block, dim / heads);
    let bounds = [0, 3, block, block + 1, 2 * block + 34, len];
    for pair in bounds.windows(2) {
        let (start, stop) = (pair[0], pair[1]);
        let chunk = x.slice_axis(1, start as i64, Some(stop as i64), 1);
        let (y, next) = layer.forward_cached(&chunk, &cache);
        assert_close(&values(&y), &full[start * dim..stop * dim], 1e-5);
        cache = next;
    }
    assert_eq!(cache.offset.item::<i32>().expect("an offset"), len as i32);
}

#[test]
fn layers_record_their_composition_in_reports() {
    let f = compile(|(layer, x): (Linear, Array)| layer.forward(&x));
    let layer = Linear::new(Key::new(27), 3, 2, true).expect("a layer");
    f.call(&(layer, normal(28, &[2, 3]))).expect("runs");
    let report = f.cache().reports[0].clone();
    assert!(report
        .traced
        .iter()
        .all(|node| node.op.starts_with("input") || node.composition.as_deref() == Some("linear")));
}

#[test]
fn layer_gradients_match_central_differences() {
    let x = normal(29, &[2, 4]);
    check_gradient(
        |x| LayerNorm::new(4, 1e-5).forward(&x).pow(3.0).sum_all(),
        &x,
    );
    check_gradient(|x| RmsNorm::new(4, 1e-6).forward(&x).pow(3.0).sum_all(), &x);
    check_gradient(|x| silu(&x).sum_all(), &x);
    check_gradient(
        |x| {
            let targets = Array::from_vec(vec![3i32, 0], &[2]).expect("targets");
            cross_entropy(&x, &targets, None)
        },
        &x,
    );
    check_gradient(
        |x| {
            let layer = Attention::new(Key::new(30), 4, 2, 0.5)
                .expect("a layer")
                .with_rope(100.0);
            (layer.forward(&x.reshape(&[1, 2, 4])) * x.reshape(&[1, 2, 4])).sum_all()
        },
        &x,
    );
    check_gradient(
        |x| {
            let mlp = Mlp::new(Key::new(32), 4, 3, Activation::SwiGlu, 0.5).expect("a block");
            mlp.forward(&x).pow(2.0).sum_all()
        },
        &x,
    );
    check_gradient(
        |table| {
            let ids = Array::from_vec(vec![1i32, 1, 0], &[3]).expect("ids");
            Embedding::from_table(table).forward(&ids).sin().sum_all()
        },
        &x,
    );
    check_gradient(
        |w| {
            let layer = Linear::from_weight(w, None);
            layer.forward(&normal(31, &[3, 4])).tanh().sum_all()
        },
        &x,
    );
}
