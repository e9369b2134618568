//! Weight files (`kiln::io`): round trips, the name mapping, files written
//! by hand as the safetensors format and MLX lay them out, and the errors
//! a file that does not fit its tree gives.

use half::{bf16, f16};
use kiln::implicit::{AffineQuantized, Int8, Nf4};
use kiln::io::{
    from_safetensors_bytes, load_safetensors_into, load_safetensors_map,
    map_from_safetensors_bytes, save_safetensors, tensor_name, tensor_names, to_safetensors_bytes,
};
use kiln::{
    tree_flatten_with_path, Array, DType, Error, HostData, ImplicitArray, KeyPath, PathEntry,
    QuantFormat, Tree,
};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// A safetensors file: the header's length (u64 little-endian), the JSON
/// header, then the data, as the format's specification lays it out.
fn file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

fn le_f32(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn le_u32(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn le_f16(values: &[f16]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The `(tensor, detail)` of a weights error.
fn weights_error<T>(result: kiln::Result<T>) -> (String, String) {
    match result {
        Err(Error::Weights { tensor, detail }) => (tensor, detail),
        Err(other) => panic!("expected a weights error, got {other:?}"),
        Ok(_) => panic!("expected a weights error, got Ok"),
    }
}

fn host(a: &Array) -> HostData {
    (*a.data().unwrap()).clone()
}

fn map_of(entries: Vec<(&str, Array)>) -> BTreeMap<String, Array> {
    entries
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

#[derive(Tree)]
struct Attn {
    w: Array,
}

#[derive(Tree)]
struct Block {
    attn: Attn,
    norm: Option<Array>,
}

#[derive(Tree)]
struct Model {
    embed: Array,
    layers: Vec<Block>,
    head: Option<Array>,
    #[tree(static)]
    name: String,
}

fn model(scale: f32) -> Model {
    let a = |shape: &[usize], offset: f32| {
        let n = shape.iter().product::<usize>();
        let values = (0..n).map(|i| scale * (i as f32 + offset)).collect();
        Array::from_vec(values, shape).unwrap()
    };
    Model {
        embed: a(&[3, 2], 0.0),
        layers: vec![
            Block {
                attn: Attn { w: a(&[2, 2], 1.0) },
                norm: Some(a(&[2], 2.0)),
            },
            Block {
                attn: Attn { w: a(&[2, 2], 3.0) },
                norm: None,
            },
        ],
        head: Some(a(&[2, 3], 4.0)),
        name: "tiny".into(),
    }
}

#[test]
fn every_dtype_round_trips_bit_exactly() {
    let tree = map_of(vec![
        (
            "f32",
            Array::from_vec(vec![1.5f32, -0.0, f32::INFINITY, 1e-45], &[2, 2]).unwrap(),
        ),
        (
            "f16",
            Array::from_vec(vec![f16::from_f32(-2.5), f16::MAX, f16::MIN_POSITIVE], &[3]).unwrap(),
        ),
        (
            "bf16",
            Array::from_vec(vec![bf16::from_f32(3.0), bf16::MIN], &[1, 2]).unwrap(),
        ),
        (
            "i32",
            Array::from_vec(vec![i32::MIN, -1, i32::MAX], &[3]).unwrap(),
        ),
        ("u32", Array::from_vec(vec![0u32, u32::MAX], &[2]).unwrap()),
        (
            "bool",
            Array::from_vec(vec![true, false, true], &[3]).unwrap(),
        ),
        ("u8", Array::from_vec(vec![0u8, 7, 255], &[3, 1]).unwrap()),
        ("scalar", Array::from_vec(vec![9.0f32], &[]).unwrap()),
        ("empty", Array::zeros(&[0, 4], DType::I32)),
    ]);
    let bytes = to_safetensors_bytes(&tree).unwrap();
    let loaded = from_safetensors_bytes(&bytes, &tree).unwrap();
    for (name, array) in &tree {
        let got = &loaded[name];
        assert_eq!(got.dims(), array.dims(), "{name}");
        assert_eq!(got.dtype(), array.dtype(), "{name}");
        assert_eq!(host(got), host(array), "{name}");
    }
    let map = map_from_safetensors_bytes(&bytes).unwrap();
    assert_eq!(
        map.keys().collect::<Vec<_>>(),
        tree.keys().collect::<Vec<_>>()
    );
    assert_eq!(host(&map["bf16"]), host(&tree["bf16"]));
}

#[test]
fn nested_tree_round_trips_under_dotted_names() {
    let original = model(1.0);
    assert_eq!(
        tensor_names(&original).unwrap(),
        [
            "embed",
            "layers.0.attn.w",
            "layers.0.norm",
            "layers.1.attn.w",
            "head"
        ]
    );
    let bytes = to_safetensors_bytes(&original).unwrap();
    let loaded = from_safetensors_bytes(&bytes, &model(0.0)).unwrap();
    assert_eq!(host(&loaded.embed), host(&original.embed));
    assert_eq!(
        host(&loaded.layers[1].attn.w),
        host(&original.layers[1].attn.w)
    );
    let norm = loaded.layers[0].norm.as_ref().unwrap();
    assert_eq!(host(norm), host(original.layers[0].norm.as_ref().unwrap()));
    assert!(loaded.layers[1].norm.is_none());
    assert_eq!(
        host(loaded.head.as_ref().unwrap()),
        host(original.head.as_ref().unwrap())
    );
    assert_eq!(loaded.name, "tiny");
}

#[test]
fn tensor_names_are_the_displayed_paths_with_indices_as_dotted_steps() {
    let tree = model(1.0);
    let names = tensor_names(&tree).unwrap();
    let paths = tree_flatten_with_path(&tree).unwrap();
    let displayed: Vec<String> = paths.iter().map(|(p, _)| p.to_string()).collect();
    assert_eq!(
        displayed,
        [
            "embed",
            "layers[0].attn.w",
            "layers[0].norm",
            "layers[1].attn.w",
            "head"
        ]
    );
    for ((path, _), name) in paths.iter().zip(&names) {
        assert_eq!(&tensor_name(path), name);
    }
    let keyed = KeyPath(vec![
        PathEntry::Field("experts".into()),
        PathEntry::Key("up".into()),
        PathEntry::Index(1),
        PathEntry::Field("".into()),
    ]);
    assert_eq!(keyed.to_string(), r#"experts["up"][1]"#);
    assert_eq!(tensor_name(&keyed), "experts.up.1");
}

#[test]
fn a_file_written_by_hand_loads_into_the_tree_by_its_dotted_names() {
    // Tensors in the file in another order than the tree's, one of them
    // bf16, with metadata, and names as PyTorch and MLX write them.
    let header = r#"{"__metadata__":{"format":"pt"},
        "layers.1.attn.w":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]},
        "layers.0.attn.w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let mut data = [bf16::from_f32(0.5), bf16::from_f32(-4.0)]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect::<Vec<u8>>();
    data.extend(le_f32(&[1.0, 2.0]));
    let bytes = file(header, &data);

    #[derive(Tree)]
    struct Net {
        layers: Vec<Block>,
    }
    let block = |shape: &[usize], dtype| Block {
        attn: Attn {
            w: Array::zeros(shape, dtype),
        },
        norm: None,
    };
    let template = Net {
        layers: vec![block(&[2], DType::F32), block(&[1, 2], DType::BF16)],
    };
    let net = from_safetensors_bytes(&bytes, &template).unwrap();
    assert_eq!(net.layers[0].attn.w.to_vec::<f32>().unwrap(), [1.0, 2.0]);
    assert_eq!(
        net.layers[1].attn.w.to_vec::<bf16>().unwrap(),
        [bf16::from_f32(0.5), bf16::from_f32(-4.0)]
    );
    let map = map_from_safetensors_bytes(&bytes).unwrap();
    assert_eq!(
        map.keys().collect::<Vec<_>>(),
        ["layers.0.attn.w", "layers.1.attn.w"]
    );
    assert_eq!(map["layers.0.attn.w"].dims(), Some(vec![2]));
}

#[test]
fn a_tensor_missing_from_the_file_is_an_err_naming_it() {
    let bytes = to_safetensors_bytes(&map_of(vec![("a", Array::zeros(&[2], DType::F32))])).unwrap();
    let template = map_of(vec![
        ("a", Array::zeros(&[2], DType::F32)),
        ("b", Array::zeros(&[3], DType::F32)),
    ]);
    let (tensor, detail) = weights_error(from_safetensors_bytes(&bytes, &template));
    assert_eq!(tensor, "b");
    assert!(
        detail.contains("missing") && detail.contains("f32[3]"),
        "{detail}"
    );
    let message = from_safetensors_bytes(&bytes, &template)
        .err()
        .unwrap()
        .to_string();
    assert_eq!(
        message,
        "weights: tensor `b`: missing from the file (the tree has it as f32[3])"
    );
}

#[test]
fn a_tensor_the_tree_lacks_is_an_err_naming_it() {
    let tree = map_of(vec![
        ("a", Array::zeros(&[2], DType::F32)),
        ("extra", Array::zeros(&[1], DType::U8)),
    ]);
    let bytes = to_safetensors_bytes(&tree).unwrap();
    let template = map_of(vec![("a", Array::zeros(&[2], DType::F32))]);
    let (tensor, detail) = weights_error(from_safetensors_bytes(&bytes, &template));
    assert_eq!(tensor, "extra");
    assert!(detail.contains("not in the tree"), "{detail}");
}

#[test]
fn a_shape_mismatch_is_an_err_naming_the_tensor_and_both_shapes() {
    let bytes =
        to_safetensors_bytes(&map_of(vec![("w", Array::zeros(&[2, 3], DType::F32))])).unwrap();
    let template = map_of(vec![("w", Array::zeros(&[3, 2], DType::F32))]);
    let (tensor, detail) = weights_error(from_safetensors_bytes(&bytes, &template));
    assert_eq!(tensor, "w");
    assert!(
        detail.contains("[2, 3]") && detail.contains("[3, 2]"),
        "{detail}"
    );
}

#[test]
fn a_dtype_mismatch_is_an_err_naming_the_tensor_and_both_dtypes() {
    let bytes = to_safetensors_bytes(&map_of(vec![("w", Array::zeros(&[2], DType::F16))])).unwrap();
    let template = map_of(vec![("w", Array::zeros(&[2], DType::BF16))]);
    let (tensor, detail) = weights_error(from_safetensors_bytes(&bytes, &template));
    assert_eq!(tensor, "w");
    assert!(
        detail.contains("f16") && detail.contains("bf16"),
        "{detail}"
    );
}

#[test]
fn the_first_mismatch_in_the_trees_order_is_the_one_named() {
    let bytes = to_safetensors_bytes(&model(1.0)).unwrap();
    let mut template = model(0.0);
    template.layers[1].attn.w = Array::zeros(&[4], DType::F32);
    template.head = Some(Array::zeros(&[1], DType::F32));
    let (tensor, _) = weights_error(from_safetensors_bytes(&bytes, &template));
    assert_eq!(tensor, "layers.1.attn.w");
}

#[test]
fn a_dtype_kiln_lacks_is_an_err_naming_the_tensor() {
    let header = r#"{"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}"#;
    let bytes = file(header, &1.0f64.to_le_bytes());
    let (tensor, detail) = weights_error(map_from_safetensors_bytes(&bytes));
    assert_eq!(tensor, "x");
    assert!(detail.contains("F64"), "{detail}");
    let template = map_of(vec![("x", Array::zeros(&[1], DType::F32))]);
    let (tensor, detail) = weights_error(from_safetensors_bytes(&bytes, &template));
    assert_eq!(tensor, "x");
    assert!(detail.contains("F64") && detail.contains("f32"), "{detail}");
}

#[test]
fn corrupt_or_truncated_files_are_errs_not_panics() {
    let good = to_safetensors_bytes(&model(1.0)).unwrap();
    let header_len = 8 + u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let mut bad_json = good.clone();
    bad_json[8] = b'[';
    let mut huge_length = good.clone();
    huge_length[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let bad_offsets = file(
        r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
        &[0; 8],
    );
    let wrong_size = file(
        r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}}"#,
        &[0; 16],
    );
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("shorter than the length", good[..5].to_vec()),
        ("cut in the header", good[..header_len - 3].to_vec()),
        ("cut in the data", good[..good.len() - 1].to_vec()),
        ("one byte too many", [&good[..], &[0]].concat()),
        ("not json", bad_json),
        ("a length past the end", huge_length),
        ("offsets past the data", bad_offsets),
        ("offsets that do not fit the shape", wrong_size),
        (
            "not utf-8",
            [&2u64.to_le_bytes()[..], &[0xff, 0xfe]].concat(),
        ),
    ];
    for (what, bytes) in cases {
        let (tensor, detail) = weights_error(map_from_safetensors_bytes(&bytes));
        assert_eq!(tensor, "", "{what}: {detail}");
        assert!(detail.contains("safetensors"), "{what}: {detail}");
        let message = map_from_safetensors_bytes(&bytes)
            .err()
            .unwrap()
            .to_string();
        assert!(
            message.starts_with("weights: not a valid"),
            "{what}: {message}"
        );
        weights_error(from_safetensors_bytes(&bytes, &model(0.0)));
    }
}

#[test]
fn names_two_leaves_share_are_an_err_on_save_and_load() {
    let leaf = || Array::zeros(&[1], DType::F32);
    // A map key holding a `.` spells the name of a nested path.
    let tree = BTreeMap::from([
        ("a".to_string(), map_of(vec![("b.c", leaf())])),
        ("a.b".to_string(), map_of(vec![("c", leaf())])),
    ]);
    let (tensor, detail) = weights_error(to_safetensors_bytes(&tree));
    assert_eq!(tensor, "a.b.c");
    assert!(detail.contains("two leaves"), "{detail}");
    let bytes = to_safetensors_bytes(&map_of(vec![("a.b.c", leaf())])).unwrap();
    let (tensor, _) = weights_error(from_safetensors_bytes(&bytes, &tree));
    assert_eq!(tensor, "a.b.c");
}

#[test]
fn a_bare_array_has_no_name_and_is_an_err() {
    let (tensor, detail) = weights_error(to_safetensors_bytes(&Array::zeros(&[1], DType::F32)));
    assert_eq!(tensor, "");
    assert!(detail.contains("no name"), "{detail}");
}

#[derive(Tree)]
struct QuantizedLayers {
    q_proj: AffineQuantized,
    experts: Vec<Nf4>,
    out: Int8,
    bias: Array,
}

fn quantized_layers(seed: f32) -> QuantizedLayers {
    let w = |k: usize, n: usize| {
        let values = (0..k * n)
            .map(|i| seed * ((i * 37 % 101) as f32 / 50.0 - 1.0))
            .collect();
        Array::from_vec(values, &[k, n]).unwrap()
    };
    QuantizedLayers {
        q_proj: AffineQuantized::quantize(&w(128, 4), 4, 64),
        experts: vec![Nf4::quantize(&w(64, 2))],
        out: Int8::quantize(&w(8, 3)),
        bias: w(1, 4),
    }
}

#[test]
fn quantized_weights_are_written_as_weight_scales_and_biases() {
    let layers = quantized_layers(1.0);
    assert_eq!(
        tensor_names(&layers).unwrap(),
        [
            "q_proj.weight",
            "q_proj.scales",
            "q_proj.biases",
            "experts.0.weight",
            "experts.0.scales",
            "out.weight",
            "out.scales",
            "bias",
        ]
    );
    let bytes = to_safetensors_bytes(&layers).unwrap();
    let map = map_from_safetensors_bytes(&bytes).unwrap();
    assert_eq!(map["q_proj.weight"].dims(), Some(vec![4, 128 * 4 / 32]));
    assert_eq!(map["q_proj.weight"].dtype(), DType::U32);
    assert_eq!(map["q_proj.scales"].dims(), Some(vec![4, 2]));
    assert_eq!(map["q_proj.biases"].dims(), Some(vec![4, 2]));

    let loaded = from_safetensors_bytes(&bytes, &quantized_layers(0.0)).unwrap();
    assert_eq!(host(&loaded.q_proj.packed), host(&layers.q_proj.packed));
    assert_eq!(host(&loaded.q_proj.scales), host(&layers.q_proj.scales));
    let (got, want) = (loaded.q_proj.biases.as_ref(), layers.q_proj.biases.as_ref());
    assert_eq!(host(got.unwrap()), host(want.unwrap()));
    assert_eq!(loaded.q_proj.format, QuantFormat::affine(4, 64));
    assert_eq!(
        host(&loaded.experts[0].packed),
        host(&layers.experts[0].packed)
    );
    assert_eq!(
        host(&loaded.out.materialize().unwrap()),
        host(&layers.out.materialize().unwrap())
    );
}

#[test]
fn a_quantized_file_of_another_format_is_an_err_naming_a_tensor() {
    let bytes = to_safetensors_bytes(&quantized_layers(1.0)).unwrap();
    let mut template = quantized_layers(0.0);
    template.q_proj = AffineQuantized::quantize(&Array::zeros(&[128, 4], DType::F32), 8, 64);
    let (tensor, detail) = weights_error(from_safetensors_bytes(&bytes, &template));
    assert_eq!(tensor, "q_proj.weight");
    assert!(
        detail.contains("[4, 16]") && detail.contains("[4, 32]"),
        "{detail}"
    );
}

/// Packs codes as MLX's `mx.quantize` documents it: along each row,
/// `32/bits` codes per u32 lowest bits first for 2, 4 and 8 bits; for 3
/// and 6 bits, 8 and 4 codes per 3-byte pack and for 5 bits 8 codes per
/// 5-byte pack, lowest bits first, the bytes read as little-endian u32.
fn mlx_pack(codes: &[u32], bits: u32) -> Vec<u32> {
    let codes_per_pack = match bits {
        3 | 5 => 8,
        6 => 4,
        _ => (32 / bits) as usize,
    };
    let bytes: Vec<u8> = codes
        .chunks(codes_per_pack)
        .flat_map(|pack| {
            let value = pack.iter().enumerate().fold(0u64, |acc, (j, &c)| {
                acc | (u64::from(c) << (j as u32 * bits))
            });
            let pack_bytes = codes_per_pack * bits as usize / 8;
            value.to_le_bytes()[..pack_bytes].to_vec()
        })
        .collect();
    bytes
        .chunks(4)
        .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
        .collect()
}

/// A file as `mx.save_safetensors` writes `mx.quantize`'s output for a
/// `[out, in]` f16 weight: `weight` u32 `[out, in·bits/32]`, `scales` and
/// `biases` f16 `[out, in/group]`; returns it with the weight it stands
/// for (`scale·code + bias`, row-major `[out, in]`).
fn mlx_quantized_file(out: usize, inputs: usize, bits: u32, group: usize) -> (Vec<u8>, Vec<f32>) {
    let codes: Vec<u32> = (0..out * inputs)
        .map(|i| (i as u32 * 7 + 3) % (1 << bits))
        .collect();
    let groups = out * inputs / group;
    let scales: Vec<f16> = (0..groups)
        .map(|g| f16::from_f32(0.25 + g as f32 / 8.0))
        .collect();
    let biases: Vec<f16> = (0..groups)
        .map(|g| f16::from_f32(-1.0 + g as f32))
        .collect();
    let weight = mlx_pack(&codes, bits);
    let expected = codes
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            let g = i / group;
            let w = scales[g].to_f32() * c as f32 + biases[g].to_f32();
            f16::from_f32(w).to_f32()
        })
        .collect();
    let (w_len, s_len) = (weight.len() * 4, groups * 2);
    let header = format!(
        r#"{{"__metadata__":{{"format":"mlx"}},
        "model.q_proj.biases":{{"dtype":"F16","shape":[{out},{g}],"data_offsets":[0,{s_len}]}},
        "model.q_proj.scales":{{"dtype":"F16","shape":[{out},{g}],"data_offsets":[{s_len},{s2}]}},
        "model.q_proj.weight":{{"dtype":"U32","shape":[{out},{wc}],"data_offsets":[{s2},{end}]}}}}"#,
        g = inputs / group,
        s2 = 2 * s_len,
        wc = inputs * bits as usize / 32,
        end = 2 * s_len + w_len,
    );
    let data = [le_f16(&biases), le_f16(&scales), le_u32(&weight)].concat();
    (file(&header, &data), expected)
}

#[derive(Tree)]
struct MlxModel {
    model: MlxAttn,
}

#[derive(Tree)]
struct MlxAttn {
    q_proj: AffineQuantized,
}

#[test]
fn a_file_in_mlx_quantized_layout_loads_and_dequantizes_to_scale_code_plus_bias() {
    for bits in [4, 3, 6, 8] {
        let (out, inputs, group) = (3, 128, 64);
        let (bytes, expected) = mlx_quantized_file(out, inputs, bits, group);
        // The template stands for the `[in, out]` matrix `x @ w` takes.
        let like = Array::zeros(&[inputs, out], DType::F16);
        let template = MlxModel {
            model: MlxAttn {
                q_proj: AffineQuantized::quantize(&like, bits, group),
            },
        };
        let loaded = from_safetensors_bytes(&bytes, &template).unwrap();
        let w = loaded.model.q_proj.quantized().dequantize();
        assert_eq!(w.dims(), Some(vec![out, inputs]), "{bits} bits");
        let got = w.cast(DType::F32).to_vec::<f32>().unwrap();
        assert_eq!(got, expected, "{bits} bits");
    }
}

#[test]
fn files_on_disk_round_trip_and_a_missing_file_is_an_err() {
    let dir = std::env::temp_dir().join(format!("kiln-io-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.safetensors");
    save_safetensors(&path, &model(2.0)).unwrap();
    let loaded = load_safetensors_into(&path, &model(0.0)).unwrap();
    assert_eq!(host(&loaded.embed), host(&model(2.0).embed));
    let map = load_safetensors_map(&path).unwrap();
    assert_eq!(map.len(), 5);
    std::fs::remove_dir_all(&dir).unwrap();
    let (tensor, detail) = weights_error(load_safetensors_map(&path));
    assert_eq!(tensor, "");
    assert!(detail.contains("cannot read"), "{detail}");
}

fn cases() -> u32 {
    std::env::var("KILN_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64)
}

fn any_array() -> impl Strategy<Value = Array> {
    let dtype = proptest::sample::select(DType::ALL.to_vec());
    let shape = proptest::collection::vec(0usize..4, 0..4);
    (dtype, shape, any::<u64>()).prop_map(|(dtype, shape, seed)| {
        let n = shape.iter().product::<usize>();
        let values =
            (0..n as u64).map(|i| ((seed.wrapping_mul(i + 1) >> 40) % 1000) as f64 - 300.0);
        Array::from_data(HostData::from_f64s(dtype, values), &shape).unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn random_trees_round_trip(leaves in proptest::collection::vec(any_array(), 1..6)) {
        let tree: BTreeMap<String, Vec<Array>> =
            BTreeMap::from([("params".to_string(), leaves)]);
        let bytes = to_safetensors_bytes(&tree).unwrap();
        let loaded = from_safetensors_bytes(&bytes, &tree).unwrap();
        for (got, want) in loaded["params"].iter().zip(&tree["params"]) {
            prop_assert_eq!(got.dims(), want.dims());
            prop_assert_eq!(host(got), host(want));
        }
    }
}
