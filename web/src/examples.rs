//! The examples gallery: scripts that each show one thing the compiler
//! does, with a short note on what to look at.

/// One example of the gallery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Example {
    /// A short stable name, used in links and tests.
    pub id: &'static str,
    /// The title the gallery shows.
    pub title: &'static str,
    /// What to look at once it ran.
    pub explanation: &'static str,
    /// The Rhai script.
    pub script: &'static str,
}

/// Every example, in gallery order.
pub const EXAMPLES: [Example; 11] = [
    CUSTOM_NODE,
    SHAPELESS,
    READ_LATER,
    MLP,
    DONATION,
    GRADIENT,
    PER_EXAMPLE,
    KV_DECODE,
    CUSTOM_OP,
    QUANTIZED,
    PRODUCTS,
];

/// A product larger than the CPU kernel's packed blocks, checked two
/// ways.
pub const PRODUCTS: Example = Example {
    id: "products",
    title: "Matrix products on the CPU's kernels",
    explanation: "`a @ b` is 100×300 by 300×800: several packed blocks of the CPU executor's \
                  kernel, two 256-deep passes, and partial tiles at every edge. `v @ q` is one \
                  row times a 4-bit weight: each output decodes one row of packed codes in \
                  registers. In a browser that runs relaxed SIMD both go to a small kernel \
                  module of their own (fused multiply-adds; the rest of Kiln never uses \
                  relaxed SIMD, whose minimum and maximum vary by processor); elsewhere, and \
                  with `?simd=128` in the address, to the simd128 kernels (a multiply, then an \
                  add). The header's tooltip names the one in use. The column sums of `a @ b` \
                  equal `(column sums of a) @ b`, and `v @ q` the product with the decoded \
                  weight, up to rounding; Verify compares everything with WebGPU.",
    script: r#"// 100×300 by 300×800: more than one packed block of the CPU kernel.
// Operands in [0, 1): sums without cancellation, so rounding stays
// relative to each value.
let product = compile(|a, b| a @ b);
let a = random_uniform(1, [100, 300], 0.0, 1.0);
let b = random_uniform(2, [300, 800], 0.0, 1.0);
let c = product.run(a, b);
show("column sums of a @ b", c.sum([0]));
show("(column sums of a) @ b", a.sum([0]) @ b);

// One row times a 4-bit weight (groups of 64): a matrix-vector product
// straight from the packed codes.
let w = random_uniform(3, [512, 256], 0.0, 1.0);
let q = quantize_affine(w, 4, 64);
let v = random_uniform(4, [1, 512], 0.0, 1.0);
let y = compile(|v, q| v @ q).run(v, q);
show("v @ q, 4-bit", y);
// The decoded f32 weight: no handler adds to a quantized weight, so it is
// materialized.
let decoded = compile(|q| implicit(q) + 0.0).run(q);
show("largest difference to v @ (decoded weight)", (v @ decoded - y).abs().max());
"#,
};

/// The example named `id`.
pub fn example(id: &str) -> Option<&'static Example> {
    EXAMPLES.iter().find(|e| e.id == id)
}

/// A registered node type whose aux data is part of the cache key (seed 000).
pub const CUSTOM_NODE: Example = Example {
    id: "custom-node",
    title: "A custom node with aux data",
    explanation: "`Linear` is registered as a tree node: `w` and `b` are children (leaves of \
                  the graph), `act` is aux data. The cache view shows two entries: the third \
                  call differs only in `act`, and the miss names it (`static/aux differs at \
                  node args[0]`). The second call is a hit.",
    script: r#"// `w` and `b` are children (arrays), `act` is aux data: part of
// the cache key, compared by equality.
register_node("Linear", ["w", "b"], ["act"]);

let apply = compile(|layer, x| {
    let y = x @ layer.w + layer.b;
    if layer.act == "relu" { y.relu() } else { y.tanh() }
});

let x = array([[1.0, -2.0], [3.0, 4.0]]);
let w = array([[0.5, -1.0], [1.0, 0.25]]);
let b = array([0.1, -0.1]);

show("relu", apply.run(node("Linear", #{ w: w, b: b, act: "relu" }), x));
show("relu again (a hit)", apply.run(node("Linear", #{ w: w, b: b, act: "relu" }), x));
show("tanh (a miss: act differs)", apply.run(node("Linear", #{ w: w, b: b, act: "tanh" }), x));
"#,
};

/// One shapeless trace serving three sizes (seed 003).
pub const SHAPELESS: Example = Example {
    id: "shapeless",
    title: "Shapeless: three sizes, one trace",
    explanation: "`.shapeless()` keys the cache on dtype and rank only: the first call traces \
                  with symbolic dims (`s0`, `s1` in the graph's avals), the next two sizes \
                  reuse it. The cache view shows one entry, one miss and two hits.",
    script: r#"// Dims become symbols: one trace serves every size.
let f = compile(|x| (x * 2.0 + 1.0).tanh().sum([1])).shapeless();

for n in [2, 5, 9] {
    show(`n = ${n}`, f.run(ones([n, 3])));
}
"#,
};

/// The reinplace read-after-write refusal (seed 004).
pub const READ_LATER: Example = Example {
    id: "read-later",
    title: "Reinplace: read after write",
    explanation: "`t = exp(x)` is read by two adds. `a = t + sin(x)` comes first and would \
                  like to write into `t`'s buffer, but `b = cos(x) + t` reads `t` later: the \
                  reinplace view shows the refusal `ReadLater` naming `b` as the reader. \
                  Fusion is off so each op is its own node.",
    script: r#"// a would overwrite t, but b still reads t: refused (ReadLater).
let f = compile(|x| {
    let t = x.exp();
    let a = t + x.sin();
    let b = x.cos() + t;
    a * b
}).fusion(false);

show("out", f.run(array([0.5, -1.0, 2.0, 0.0])));
"#,
};

/// An MLP forward pass and its slot timeline.
pub const MLP: Example = Example {
    id: "mlp",
    title: "An MLP forward pass",
    explanation: "A two-layer perceptron with a softmax. The memory view draws every slot's \
                  values over the schedule: the plan's peak equals the lower bound (the most \
                  bytes live at any step), well under the bytes without reuse.",
    script: r#"// Two layers and a softmax; parameters travel as a map (a tree).
let mlp = compile(|p, x| {
    let h = (x @ p.w1 + p.b1).relu();
    nn::softmax(h @ p.w2 + p.b2, -1)
});

let p = #{
    w1: random_normal(1, [16, 64]) * 0.25, b1: zeros([64]),
    w2: random_normal(2, [64, 10]) * 0.25, b2: zeros([10]),
};
let x = random_normal(0, [8, 16]);

let y = mlp.run(p, x);
show("probabilities", y);
show("row sums", y.sum([1]));
"#,
};

/// Donation: the result written into an argument's buffer.
pub const DONATION: Example = Example {
    id: "donation",
    title: "Donation writes in place",
    explanation: "`.donate([\"args[0]\"])` gives the first argument's buffer to the \
                  executable: the reinplace view shows the update taking `args[0]`'s buffer, \
                  and the plan lists `args[0]` as donated. Without the donation (try \
                  removing it) the same node is refused with `CallerInput`.",
    script: r#"// An SGD step: params - lr * grads, written into the params' buffer.
let step = compile(|params, grads| params - grads * 0.1).donate(["args[0]"]);

let grads = array([1.0, 2.0, 3.0, 4.0]);
// The temporary `zeros` is given up by the script, so its buffer is reused.
show("params", step.run(zeros([4]), grads));
"#,
};

/// Gradients: `value_and_grad` traces a loss and its backward pass into one
/// compiled function, and a loop of SGD steps fits a linear regression.
pub const GRADIENT: Example = Example {
    id: "gradient",
    title: "Gradients: a linear regression fit",
    explanation: "`value_and_grad(f)` is one compiled function holding the forward pass and \
                  the backward pass: the graph has both (the second matmul is the gradient's \
                  xᵀ·2r/n), and Kiln's report marks every backward node and lists the \
                  residuals it reads (see Export report). It traces once; the 40 steps of \
                  the loop are cache hits, and w approaches the exact solution [1, 2].",
    script: r#"// Least squares: the loss and its gradient with respect to w (argument 0).
let loss_and_grad = value_and_grad(|w, x, y| {
    let r = x @ w - y;
    (r * r).mean()
});

let x = array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]);
let y = array([[1.0], [2.0], [3.0]]);
let w = zeros([2, 1]);

let start = loss_and_grad.run(w, x, y);
show("loss at w = 0", start[0]);
show("gradient at w = 0", start[1]);

for step in 0..40 {
    let g = loss_and_grad.run(w, x, y)[1];
    w = w - g * 0.3;
}
show("w after 40 steps", w);
show("loss after 40 steps", loss_and_grad.run(w, x, y)[0]);
"#,
};

/// Per-example gradients through `vmap(grad(..))` and a Hessian-vector
/// product (forward over reverse).
pub const PER_EXAMPLE: Example = Example {
    id: "per-example",
    title: "vmap: per-example gradient norms",
    explanation: "`vmap(grad(loss, [2, 3]), [0, 0, (), ()])` maps the gradient of one \
                  example's loss over a batch of 16: the examples are batched along axis 0, \
                  the weights are shared. It is one compiled function, and its graph holds \
                  batched matmuls, not a loop of 16 (the report lists any op vmap had to run \
                  per example: none here). `jvp(grad(f), ..)` pushes a tangent through the \
                  gradient: a Hessian-vector product without forming the Hessian; \
                  `hessian(f)` forms it to compare.",
    script: r#"// One example's loss: x is a vector of 4, y one target.
let loss = |x, y, w1, w2| {
    let h = (x @ w1).tanh();
    let e = h @ w2 - y;
    (e * e).sum()
};
let w1 = random_normal(1, [4, 8]) * 0.5;
let w2 = random_normal(2, [8, 1]) * 0.5;
let xs = random_normal(3, [16, 4]);
let ys = random_normal(4, [16, 1]);

// The gradient with respect to the weights, per example.
let per_example = vmap(grad(loss, [2, 3]), [0, 0, (), ()]);
let g = per_example.run(xs, ys, w1, w2);
let norms = ((g[0] * g[0]).sum([1, 2]) + (g[1] * g[1]).sum([1, 2])).sqrt();
show("per-example gradient norms", norms);

// A Hessian-vector product: forward mode over reverse mode.
let f = |w| (w * w * w).sum();
let w = array([1.0, 2.0, 3.0]);
let v = array([1.0, 0.0, -1.0]);
show("H·v by jvp(grad(f))", jvp(grad(f), [w], [v])[1]);
show("H by hessian(f)", hessian(f).run(w));
"#,
};

/// A decoding loop inside `scan` writing one row of a KV cache per step
/// with `dynamic_update_slice`: the cache stays in one buffer.
pub const KV_DECODE: Example = Example {
    id: "kv-cache",
    title: "scan: decoding with a KV cache",
    explanation: "`scan` traces its body once: the loop is one node of the graph, however \
                  many steps it runs (the Loops view shows its body, planned once). Each \
                  step writes its key into row `t` of the cache with \
                  `dynamic_update_slice` and attends over the cache; nothing reads the old \
                  cache afterwards, so the update writes in place and the cache stays in one \
                  buffer for the whole loop (\"updated in place\"). The planned peak is the \
                  same for 16 and 64 steps: it does not grow with the loop.",
    script: r#"// One decoding step: write key k at row t, attend with query q.
// The carry is [cache, query, last output]; no per-step output is
// stacked, so nothing grows with the number of steps.
let step = |carry, kt| {
    let cache = carry[0].dynamic_update_slice(kt[0].reshape([1, 16]), [kt[1], 0]);
    let scores = (cache @ carry[1].reshape([16, 1])).reshape([64]);
    let out = nn::softmax(scores, -1).reshape([1, 64]) @ cache;
    [[cache, carry[1], out.reshape([16])], ()]
};
let decode = compile(|cache, q, keys, t| scan(step, [cache, q, zeros([16])], [keys, t])[0]);

let cache = zeros([64, 16]);
let q = random_normal(1, [16]);
let short = decode.run(cache, q, random_normal(2, [16, 16]), arange(16));
let long = decode.run(cache, q, random_normal(3, [64, 16]), arange(64));
show("last output, 16 steps", short[2]);
show("cache rows written, 64 steps", (long[0].abs().sum(1) > 0.0).cast("float32").sum());
"#,
};

/// A custom op over a config map and a WGSL kernel with its shape rule
/// (seeds magi #32 and mlx #3485).
pub const CUSTOM_OP: Example = Example {
    id: "custom-op",
    title: "A custom op and a WGSL kernel",
    explanation: "`attention` is one node in the graph, shown with its schema: the arrays \
                  are operands, `cfg.scale` and `cfg.causal` attributes. They are part of the \
                  cache key: the third call flips `causal` and the miss names it. \
                  `scale_shift` is a WGSL kernel with a shape rule and a CPU reference; its \
                  grid is computed from each call's shapes, so the shapeless function writes \
                  every element at both sizes (one trace). On WebGPU the WGSL runs; on the \
                  CPU the reference does.",
    script: r#"// A custom op over a config map: arrays are operands; the fields listed
// must be static (numbers, bools, strings) and are part of the cache key.
let attention = custom_op("attention", |a| {
    let s = (a.q @ a.k.transpose()) * a.cfg.scale;
    let s = if a.cfg.causal { s + a.mask } else { s };
    nn::softmax(s, -1) @ a.v
}, ["cfg.scale", "cfg.causal"]);

// A WGSL kernel: bindings 0 (sizes), 1 (output), 2.. (inputs); a shape rule
// from the input shapes; a CPU reference; a grid from each call's shapes.
let scale_shift = kernel(#{
    name: "scale_shift",
    inputs: ["x"],
    templates: #{ SCALE: 2.0 },
    shape: |shapes| shapes[0],
    reference: |x| x * 2.0 + 1.0,
    grid: |out| [(out[0] * out[1] + 63) / 64, 1, 1],
    wgsl: `
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if id.x < params[0] { out[id.x] = x[id.x] * SCALE + 1.0; }
}`,
});

let layer = compile(|q, k, v, mask, cfg| {
    attention.apply(#{ q: q, k: k, v: v, mask: mask, cfg: cfg })
});

let q = random_normal(1, [4, 3]);
let k = random_normal(2, [4, 3]);
let v = random_normal(3, [4, 2]);
let mask = array([[0.0, -1e9, -1e9, -1e9], [0.0, 0.0, -1e9, -1e9],
                  [0.0, 0.0, 0.0, -1e9], [0.0, 0.0, 0.0, 0.0]]);

show("causal", layer.run(q, k, v, mask, #{ scale: 0.5, causal: true }));
show("causal again (a hit)", layer.run(q, k, v, mask, #{ scale: 0.5, causal: true }));
show("not causal (a miss naming causal)", layer.run(q, k, v, mask, #{ scale: 0.5, causal: false }));

let shift = compile(|x| scale_shift.apply(x)).shapeless();
show("kernel, 5 x 3", shift.run(ones([5, 3])));
show("kernel, 70 x 3", shift.run(ones([70, 3])));
"#,
};

/// An MLP with 4-bit weights: implicit arrays resolved by handlers
/// (seed eformer/jaximus).
pub const QUANTIZED: Example = Example {
    id: "quantized",
    title: "4-bit weights: implicit arrays",
    explanation: "The weights are quantized to 4 bits (MLX's affine format): objects whose \
                  codes, scales and biases pass through `compile` as leaves and whose format \
                  is part of the cache key. `x @ q` is an implicit array: the lowering pass \
                  picks the handler `matmul_affine_quantized`, which runs the quantized \
                  matmul straight from the packed codes (the Implicit view lists it; nothing \
                  is materialized). The weights take about a sixth of the f32 bytes. The last \
                  function squares the weight itself: no handler matches, so it is \
                  materialized and the view names the op that forced it.",
    script: r#"// Quantize two f32 weights to 4 bits, groups of 32 along the input axis.
let w1 = random_normal(1, [64, 32]) * 0.2;
let w2 = random_normal(2, [32, 8]) * 0.2;
let q1 = quantize_affine(w1, 4, 32);
let q2 = quantize_affine(w2, 4, 32);

// `x @ q` runs the quantized matmul from the packed codes.
let mlp = compile(|x, l1, l2| (x @ l1).relu() @ l2);
let x = random_normal(3, [16, 64]);
let y = mlp.run(x, q1, q2);
show("4-bit output", y);
show("largest difference to the f32 model", ((x @ w1).relu() @ w2 - y).abs().max());
show("weight bytes, 4-bit", nbytes(q1) + nbytes(q2));
show("weight bytes, f32", nbytes(w1) + nbytes(w2));

// No handler squares a quantized weight: it is materialized.
let norm = compile(|l1| {
    let w = implicit(l1);
    (w * w).sum()
});
show("squared norm of W1, materialized", norm.run(q1));
"#,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::RunReport;
    use crate::script::Session;
    use kiln::{MissReason, Refusal, Report};

    fn run(example: &Example) -> RunReport {
        let report = Session::new().run(example.script);
        assert_eq!(report.error, None, "{}", example.id);
        report
    }

    fn output<'a>(report: &'a RunReport, label: &str) -> &'a str {
        let found = report.outputs.iter().find(|o| o.label == label);
        &found
            .unwrap_or_else(|| panic!("no output {label}: {report:?}"))
            .text
    }

    /// The numbers of a printed array, in order.
    fn numbers(text: &str) -> Vec<f64> {
        let body = text
            .trim_start_matches("array(")
            .split(", dtype")
            .next()
            .unwrap_or_default();
        body.split(|c: char| c == ',' || c == '[' || c == ']' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().unwrap_or_else(|_| panic!("{s} in {text}")))
            .collect()
    }

    fn only_report(report: &RunReport) -> &Report {
        assert_eq!(report.functions.len(), 1);
        &report.functions[0].cache.reports[0]
    }

    #[test]
    fn custom_op_is_one_node_and_a_flipped_static_names_its_path() {
        let report = run(&CUSTOM_OP);
        let layer = &report.functions[0];
        let cache = &layer.cache;
        assert_eq!((cache.entries, cache.hits, cache.misses), (2, 1, 2));
        let reasons: Vec<String> = cache.miss_log[1]
            .reasons
            .iter()
            .map(|r| r.to_string())
            .collect();
        assert!(
            reasons.len() == 1 && reasons[0].contains("causal") && reasons[0].contains("true"),
            "{reasons:?}"
        );
        let graph = &cache.reports[0];
        let custom: Vec<&str> = graph
            .nodes
            .iter()
            .map(|n| n.op.as_str())
            .filter(|op| op.starts_with("attention("))
            .collect();
        assert_eq!(custom.len(), 1, "one node: {custom:?}");
        assert!(
            custom[0].contains("scale") && custom[0].contains("causal=true"),
            "{}",
            custom[0]
        );
        assert!(!graph.nodes.iter().any(|n| n.op.starts_with("matmul")));
        // The kernel: one shapeless trace, every element written at both sizes.
        let kernel = &report.functions[1].cache;
        assert_eq!((kernel.entries, kernel.misses), (1, 1));
        for label in ["kernel, 5 x 3", "kernel, 70 x 3"] {
            let values = numbers(output(&report, label));
            assert!(
                !values.is_empty() && values.iter().all(|&v| v == 3.0),
                "{label}: {values:?}"
            );
        }
        assert_eq!(numbers(output(&report, "kernel, 70 x 3")).len(), 210);
    }

    #[test]
    fn a_static_field_given_an_array_is_an_error_naming_it() {
        let report = Session::new().run(
            "let op = custom_op(\"twice\", |a| a.x * a.cfg.k, [\"cfg.k\"]);\n\
             op.apply(#{ x: ones([2]), cfg: #{ k: ones([2]) } })",
        );
        let error = report.error.expect("the call fails");
        assert!(
            error.message.contains("`cfg.k` must be a static value") && error.line == Some(2),
            "{error:?}"
        );
    }

    #[test]
    fn an_invalid_kernel_is_an_error_with_nagas_message() {
        let report = Session::new().run(
            "kernel(#{ name: \"bad\", inputs: [\"x\"], shape: |s| s[0], reference: |x| x,\n\
             wgsl: \"fn main( {\" })",
        );
        let error = report.error.expect("the kernel is rejected");
        assert!(
            error.message.contains("kernel `bad`") && error.message.contains("does not validate"),
            "{error:?}"
        );
    }

    #[test]
    fn quantized_runs_the_handler_and_names_the_forced_materialization() {
        use kiln::ImplicitDecision;
        let report = run(&QUANTIZED);
        let mlp = &report.functions[0].cache.reports[0];
        assert_eq!(mlp.materializations(), 0);
        let handlers: Vec<&str> = mlp
            .implicit
            .iter()
            .filter_map(|d| match d {
                ImplicitDecision::Handled { handler, .. } => Some(handler.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(handlers, vec!["matmul_affine_quantized"; 2]);
        let difference = numbers(output(&report, "largest difference to the f32 model"));
        // 4-bit rounding of both layers: close to the f32 model, not equal.
        assert!(difference[0] > 0.0 && difference[0] < 0.5, "{difference:?}");
        let small = numbers(output(&report, "weight bytes, 4-bit"))[0];
        let large = numbers(output(&report, "weight bytes, f32"))[0];
        assert_eq!(large, ((64 * 32 + 32 * 8) * 4) as f64);
        assert!(small * 5.0 < large, "{small} vs {large}");
        let norm = &report.functions[1].cache.reports[0];
        assert!(
            matches!(
                &norm.implicit[..],
                [ImplicitDecision::Materialized { kind, forced_by, .. }]
                    if kind == "affine_quantized" && forced_by == "mul"
            ),
            "{:?}",
            norm.implicit
        );
    }

    #[test]
    fn the_kv_cache_is_written_in_place_and_the_peak_does_not_grow_with_steps() {
        let report = run(&KV_DECODE);
        let function = &report.functions[0];
        let entries = &function.cache.reports;
        assert_eq!(entries.len(), 2, "16 and 64 steps are two entries");
        for entry in entries.iter() {
            assert_eq!(entry.loops.len(), 1, "{:?}", entry.loops);
            let body = &entry.loops[0].bodies[0];
            assert!(body.carried[0].in_place, "{:?}", body.carried);
            assert!(
                body.carried[0].detail.contains("dynamic_update_slice"),
                "{:?}",
                body.carried
            );
        }
        assert_eq!(entries[0].loops[0].trip_count.as_deref(), Some("16"));
        assert_eq!(entries[1].loops[0].trip_count.as_deref(), Some("64"));
        assert_eq!(entries[0].total_peak_bytes(), entries[1].total_peak_bytes());
        assert_eq!(
            numbers(output(&report, "cache rows written, 64 steps")),
            vec![64.0]
        );
    }

    #[test]
    fn per_example_gradients_are_batched_matmuls_and_the_hvp_is_exact() {
        let report = run(&PER_EXAMPLE);
        let function = &report.functions[0];
        let entry = &function.cache.reports[0];
        assert!(
            entry.vmap_fallbacks.is_empty(),
            "{:?}",
            entry.vmap_fallbacks
        );
        // Forward (2 products) and backward (the gradients of h and of the
        // two weights: 3 more): batched, whatever the batch size.
        let products = entry
            .nodes
            .iter()
            .filter(|n| n.op.starts_with("matmul"))
            .count();
        assert_eq!(products, 5, "{:?}", entry.nodes);
        assert_eq!(
            numbers(output(&report, "per-example gradient norms")).len(),
            16
        );
        // H = diag(6w) = diag(6, 12, 18).
        assert_eq!(
            numbers(output(&report, "H·v by jvp(grad(f))")),
            vec![6.0, 0.0, -18.0]
        );
        assert_eq!(
            numbers(output(&report, "H by hessian(f)")),
            vec![6.0, 0.0, 0.0, 0.0, 12.0, 0.0, 0.0, 0.0, 18.0]
        );
    }

    #[test]
    fn products_agree_with_their_reassociation_and_the_decoded_weight() {
        let report = run(&PRODUCTS);
        let sums = numbers(output(&report, "column sums of a @ b"));
        let reassociated = numbers(output(&report, "(column sums of a) @ b"));
        assert_eq!((sums.len(), reassociated.len()), (800, 800));
        for (j, (x, y)) in sums.iter().zip(&reassociated).enumerate() {
            // Two summation orders of 30,000 positive products.
            assert!((x - y).abs() <= 1e-5 * y, "column {j}: {x} vs {y}");
        }
        let y = numbers(output(&report, "v @ q, 4-bit"));
        assert_eq!(y.len(), 256);
        let largest = y.iter().copied().fold(0.0f64, f64::max);
        // Sums of 512 products in [0, 1), each side within the classical
        // bound (one more rounding for the decoded weights); nothing lost
        // to quantization, which both products share.
        let difference = numbers(output(
            &report,
            "largest difference to v @ (decoded weight)",
        ));
        let bound = 2.0 * kiln::ops::matmul::error_bound(513, largest);
        assert!(
            difference.len() == 1 && difference[0] <= bound,
            "{difference:?} vs {bound}"
        );
        assert!(
            difference[0] < 1e-3 && largest > 64.0,
            "{difference:?}, {largest}"
        );
    }

    #[test]
    fn every_example_id_is_found() {
        for e in EXAMPLES {
            assert_eq!(example(e.id), Some(&e));
        }
        assert_eq!(example("nope"), None);
    }

    #[test]
    fn custom_node_makes_two_entries_and_names_the_aux_difference() {
        let report = run(&CUSTOM_NODE);
        let cache = &report.functions[0].cache;
        assert_eq!((cache.entries, cache.hits, cache.misses), (2, 1, 2));
        assert_eq!(
            cache.miss_log[1].reasons,
            vec![MissReason::Static {
                path: "args[0]".to_string(),
                before: "{act: \"relu\"}".to_string(),
                now: "{act: \"tanh\"}".to_string(),
            }]
        );
        assert_eq!(
            cache.miss_log[1].reasons[0].to_string(),
            "static/aux differs at node args[0]: before {act: \"relu\"}, now {act: \"tanh\"}"
        );
        // x @ w + b = [[-1.4, -1.6], [5.6, -2.1]]
        assert_eq!(numbers(output(&report, "relu")), vec![0.0, 0.0, 5.6, 0.0]);
        let tanh = numbers(output(&report, "tanh (a miss: act differs)"));
        let expected = [-1.4f64, -1.6, 5.6, -2.1].map(f64::tanh);
        for (got, want) in tanh.iter().zip(expected) {
            assert!((got - want).abs() < 1e-6, "{tanh:?}");
        }
    }

    #[test]
    fn shapeless_traces_once_for_three_sizes() {
        let report = run(&SHAPELESS);
        let function = &report.functions[0];
        let cache = &function.cache;
        assert_eq!((cache.entries, cache.hits, cache.misses), (1, 2, 1));
        let traced: Vec<bool> = function.calls.iter().map(|c| c.traced).collect();
        assert_eq!(traced, vec![true, false, false]);
        assert!(cache.reports[0].shapeless);
        assert!(!cache.reports[0].symbols.is_empty());
        let row = (3.0f64).tanh() * 3.0;
        assert_eq!(numbers(output(&report, "n = 5")).len(), 5);
        for v in numbers(output(&report, "n = 9")) {
            assert!((v - row).abs() < 1e-6, "{v}");
        }
    }

    #[test]
    fn read_later_refuses_the_first_add_naming_the_second_as_reader() {
        let report = run(&READ_LATER);
        let graph = only_report(&report);
        let refusals: Vec<(usize, usize, usize)> = graph
            .nodes
            .iter()
            .filter_map(|n| n.reinplace.as_ref().map(|d| (n.id, d)))
            .flat_map(|(id, d)| {
                d.operands.iter().filter_map(move |v| match v.refusal {
                    Some(Refusal::ReadLater { reader }) => Some((id, v.operand, reader)),
                    _ => None,
                })
            })
            .collect();
        assert_eq!(refusals.len(), 1, "{refusals:?}");
        let (node, operand, reader) = refusals[0];
        let op = |id: usize| graph.nodes[id].op.as_str();
        assert_eq!((op(node), op(operand), op(reader)), ("add", "exp", "add"));
        assert!(reader > node, "the reader runs later");
        assert!(graph.nodes[reader].inputs.contains(&operand));
        let xs = [0.5f64, -1.0, 2.0, 0.0];
        let out = numbers(output(&report, "out"));
        for (got, x) in out.iter().zip(xs) {
            let want = (x.exp() + x.sin()) * (x.cos() + x.exp());
            assert!((got - want).abs() < 1e-5 * want.abs().max(1.0), "{out:?}");
        }
    }

    #[test]
    fn mlp_peak_equals_the_lower_bound_and_rows_sum_to_one() {
        let report = run(&MLP);
        let memory = only_report(&report).plan.memory;
        assert!(memory.peak_bytes > 0);
        assert_eq!(memory.peak_bytes, memory.lower_bound_bytes);
        assert!(memory.no_reuse_bytes > memory.peak_bytes, "{memory:?}");
        let sums = numbers(output(&report, "row sums"));
        assert_eq!(sums.len(), 8);
        for s in sums {
            assert!((s - 1.0).abs() < 1e-5, "{s}");
        }
    }

    #[test]
    fn donation_writes_the_update_into_the_donated_argument() {
        let report = run(&DONATION);
        let graph = only_report(&report);
        assert_eq!(graph.plan.donated, vec!["args[0]".to_string()]);
        let input = graph
            .nodes
            .iter()
            .find(|n| n.op == "input args[0]")
            .unwrap_or_else(|| panic!("{graph:?}"));
        let update = &graph.nodes[graph.outputs[0]];
        let decision = update
            .reinplace
            .as_ref()
            .unwrap_or_else(|| panic!("{update:?}"));
        assert_eq!(decision.target(), Some(input.id));
        assert_eq!(update.home, input.home);
        assert_eq!(
            numbers(output(&report, "params")),
            vec![-0.1, -0.2, -0.3, -0.4]
        );
    }

    #[test]
    fn without_donation_the_update_is_refused_as_a_caller_input() {
        let script = DONATION.script.replace(".donate([\"args[0]\"])", "");
        let report = Session::new().run(&script);
        let graph = only_report(&report);
        let update = &graph.nodes[graph.outputs[0]];
        let decision = update
            .reinplace
            .as_ref()
            .unwrap_or_else(|| panic!("{update:?}"));
        assert_eq!(decision.target(), None);
        assert!(decision
            .operands
            .iter()
            .any(|v| matches!(v.refusal, Some(Refusal::CallerInput { leaf: 0 }))));
    }

    #[test]
    fn gradient_gives_the_least_squares_gradient_and_fits_w() {
        let report = run(&GRADIENT);
        // Loss mean((x w - y)^2) at w = 0: (1 + 4 + 9) / 3; its gradient
        // 2/3 xᵀ(x w - y) = -2/3 [1 + 3, 2 + 3].
        let loss = numbers(output(&report, "loss at w = 0"));
        assert!((loss[0] - 14.0 / 3.0).abs() < 1e-5, "{loss:?}");
        let gradient = numbers(output(&report, "gradient at w = 0"));
        let want = [-8.0 / 3.0, -10.0 / 3.0];
        for (g, w) in gradient.iter().zip(want) {
            assert!((g - w).abs() < 1e-5, "{gradient:?}");
        }
        // x w = y has the exact solution w = [1, 2]; each step shrinks the
        // error by at least 0.8.
        let w = numbers(output(&report, "w after 40 steps"));
        assert!(
            (w[0] - 1.0).abs() < 1e-2 && (w[1] - 2.0).abs() < 1e-2,
            "{w:?}"
        );
        assert!(numbers(output(&report, "loss after 40 steps"))[0] < 1e-4);
        let function = &report.functions[0];
        assert_eq!(function.source.split('(').next(), Some("value_and_grad"));
        let cache = &function.cache;
        assert_eq!((cache.entries, cache.misses, cache.hits), (1, 1, 41));
        let graph = &cache.reports[0];
        assert!(graph.nodes.iter().any(|n| n.backward));
        assert!(graph.nodes.iter().any(|n| !n.backward));
        assert!(!graph.residuals.is_empty());
    }
}
