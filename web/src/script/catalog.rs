//! What each script name does, in one table: the reference
//! (`docs/script-api.md`, which the page's Help embeds) prints each name's
//! line after its signatures, and the tests hold the table to the names
//! the engine registers and the native library's public array functions
//! to a binding or a stated reason ([`UNBOUND`]). Only the reference's
//! generation (a test) reads it, so it is built with the tests.

/// Each registered name as the reference shows it, and what it does
/// (plain text: the reference's readers take code spans for signatures).
pub(super) const SUMMARIES: &[(&str, &str)] = &[
    // Arrays.
    ("array", "an array from a nested list (f32, or the dtype named)"),
    ("zeros", "zeros of a shape (f32, or the dtype named)"),
    ("ones", "ones of a shape"),
    ("full", "a shape filled with one value"),
    ("scalar", "a 0-d f32 array"),
    ("arange", "a range: integer arguments give i32 as in JAX, a float stop or float arguments give f32 (or the dtype named)"),
    ("linspace", "num evenly spaced f32 values from start to stop (stop included unless endpoint is false)"),
    ("eye", "the identity matrix, or n by m with ones on diagonal k in the dtype named"),
    ("zeros_like", "zeros of this array's shape and dtype"),
    ("ones_like", "ones of this array's shape and dtype"),
    ("random_normal", "standard normal f32 samples from a seed"),
    ("random_uniform", "uniform f32 samples on [low, high) from a seed"),
    ("random_randint", "i32 integers uniform on [low, high) from a seed"),
    // Elementwise.
    ("neg", "negation"),
    ("abs", "absolute value"),
    ("exp", "e to the x"),
    ("log", "natural logarithm"),
    ("log1p", "log(1 + x), accurate for small x"),
    ("sin", "sine"),
    ("cos", "cosine"),
    ("tan", "tangent, sin / cos"),
    ("tanh", "hyperbolic tangent"),
    ("sqrt", "square root"),
    ("rsqrt", "1 / sqrt(x)"),
    ("sigmoid", "1 / (1 + e^-x)"),
    ("relu", "max(x, 0)"),
    ("erf", "the error function"),
    ("square", "x * x"),
    ("sign", "-1, 0 or 1 by sign (zeros keep theirs, NaN stays)"),
    ("floor", "the largest integer not above x"),
    ("round", "the nearest integer, halves to even"),
    ("clip", "limited to [min, max]; () for no bound; NaN stays NaN"),
    ("pow", "x to the power y, elementwise"),
    ("maximum", "the larger of two, elementwise (NaN wins)"),
    ("minimum", "the smaller of two, elementwise (NaN wins)"),
    ("cast", "converted to the dtype named"),
    // Comparisons and selection.
    ("equal", "a == b as bool, elementwise"),
    ("not_equal", "a != b as bool, elementwise"),
    ("less", "a < b as bool, elementwise"),
    ("less_equal", "a <= b as bool, elementwise"),
    ("greater", "a > b as bool, elementwise"),
    ("greater_equal", "a >= b as bool, elementwise"),
    ("select", "a where the bool condition holds, else b (broadcast)"),
    ("where", "JAX's name for select"),
    ("tril", "the lower triangle of the last two axes, diagonal k and below"),
    ("triu", "the upper triangle of the last two axes, diagonal k and above"),
    // Reductions.
    ("sum", "sum over the axes listed (all when none)"),
    ("max", "maximum over axes"),
    ("min", "minimum over axes"),
    ("mean", "mean over axes"),
    ("prod", "product over axes (integers wrap)"),
    ("variance", "variance over axes, divided by N - ddof (JAX's var: var is a Rhai keyword)"),
    ("std", "standard deviation over axes, divided by N - ddof"),
    ("logsumexp", "log of the sum of exp over axes, without overflow"),
    ("argmax", "index (u32) of the maximum along an axis, first on ties"),
    ("argmin", "index (u32) of the minimum along an axis, first on ties"),
    ("cumsum", "running sums along an axis"),
    // Sorting.
    ("sort", "sorted ascending along an axis (last by default), stably, NaN last"),
    ("argsort", "the i32 indices that sort along an axis, stably, ascending or descending"),
    ("top_k", "[values, i32 indices] of the k largest along the last axis, ties to the lower index"),
    // Shapes and layout.
    ("reshape", "the same elements in a new shape (one -1 inferred)"),
    ("permute", "axes reordered"),
    ("transpose", "axes reversed, or reordered as listed"),
    ("T", "axes reversed"),
    ("swap_axes", "two axes swapped"),
    ("broadcast_to", "broadcast to a shape"),
    ("expand_dims", "a size-1 axis inserted"),
    ("squeeze", "size-1 axes removed"),
    ("flatten", "the elements in one axis"),
    ("slice", "a strided range along one axis"),
    ("concat", "a list of arrays joined along an axis"),
    ("stack", "a list of arrays of one shape joined along a new axis"),
    ("split", "a list of equal parts, or the parts between the listed indices"),
    ("tile", "repeated whole along each axis"),
    ("repeat", "each element repeated along an axis"),
    ("pad", "[before, after] elements of a value (0 by default) around each axis"),
    ("dynamic_slice", "a window at start indices computed at run time"),
    ("dynamic_update_slice", "an update written at start indices computed at run time"),
    // Indexing, gathering and products.
    ("[]", "x[i] the row at i (negative from the end), x[a..b] and x[a..=b] rows a to b; an object's field"),
    ("take", "entries along an axis at integer indices"),
    ("take_along_axis", "per-row entries along an axis at integer indices"),
    ("one_hot", "integer indices as one-hot rows of n classes"),
    ("matmul", "the matrix product, batched and broadcast"),
    ("einsum", "a contraction of one or two arrays named by subscripts, like ij,jk->ik"),
    // Operators.
    ("+", "addition"),
    ("-", "subtraction, or negation"),
    ("*", "multiplication"),
    ("/", "division"),
    ("**", "power"),
    ("@", "the matrix product"),
    ("==", "equal, elementwise"),
    ("!=", "not equal, elementwise"),
    ("<", "less, elementwise"),
    ("<=", "less or equal, elementwise"),
    (">", "greater, elementwise"),
    (">=", "greater or equal, elementwise"),
    // Properties and output.
    ("shape", "the dims as a list (symbol names in a shapeless trace)"),
    ("dtype", "the dtype's name"),
    ("ndim", "the rank"),
    ("class", "an object's node class"),
    ("item", "the value of a one-element array"),
    ("nbytes", "bytes an array or a quantized object holds"),
    ("to_string", "how a value prints"),
    ("to_debug", "how an array prints, tracers and pending nodes named"),
    ("show", "shows a value under a label in the outputs"),
    // nn.
    ("nn::softmax", "the normalized exponential along an axis"),
    ("nn::log_softmax", "the log of the normalized exponential along an axis"),
    ("nn::gelu", "the Gaussian error linear unit (erf form)"),
    ("nn::gelu_tanh", "the Gaussian error linear unit (tanh form)"),
    ("nn::layer_norm", "normalized over the last axis, optionally scaled and shifted"),
    ("nn::silu", "x * sigmoid(x)"),
    ("nn::causal_mask", "the t by t bool mask where a query may see a key"),
    ("nn::cross_entropy", "the mean cross-entropy of logits against integer targets"),
    ("nn::rope", "rotary position embedding of the last axis at the positions given"),
    ("nn::scaled_dot_product_attention", "attention of q over k and v, with an optional bool mask"),
    // Compile and transformations.
    ("compile", "a compiled function of a closure"),
    ("run", "calls a compiled function"),
    ("shapeless", "compiles once for every size of the inputs' dims"),
    ("fusion", "turns fusion on or off"),
    ("donate", "lets the listed arguments' buffers be reused"),
    ("has_aux", "the function returns [loss, aux]"),
    ("grad", "the gradient of argument 0, or of the arguments listed"),
    ("value_and_grad", "[value, gradient]"),
    ("jvp", "[f(primals), J times tangents], run now"),
    ("jacfwd", "the Jacobian by forward mode"),
    ("jacrev", "the Jacobian by reverse mode"),
    ("hessian", "the Hessian"),
    ("vmap", "the function over a batch axis of its arguments"),
    // Control flow.
    ("scan", "a loop over the leading axis carrying a value, stacking the outputs"),
    ("fori_loop", "a counted loop carrying a value"),
    ("while_loop", "a loop while a bool scalar holds"),
    ("cond", "one of two branches by a bool scalar"),
    ("branch", "one of a list of branches by an index (JAX's switch)"),
    // Trees, custom ops, kernels and quantized weights.
    ("register_node", "a node class: children and aux data"),
    ("node", "an object of a node class"),
    ("custom_op", "one graph node over a map of arrays, with an optional vjp"),
    ("kernel", "a user WGSL kernel with its shape rule and reference"),
    ("apply", "applies a custom op or a kernel"),
    ("quantize_affine", "affine-quantized weights of a bit width and group size"),
    ("quantize_nf4", "NF4-quantized weights"),
    ("quantize_int8", "int8-quantized weights"),
    ("implicit", "a quantized object as its implicit array"),
];

/// The native library's public array functions with no script binding of
/// their name, each with the reason: the script name that serves it, or
/// why a script has no use for it.
pub(super) const UNBOUND: &[(&str, &str)] = &[
    ("from_vec", "scripts build arrays with array"),
    ("from_slice", "scripts build arrays with array"),
    ("from_data", "scripts build arrays with array"),
    ("arange_i32", "arange with integer arguments"),
    ("split_at", "split with a list of indices"),
    ("slice_axis", "slice(axis, start, stop[, step])"),
    ("sum_all", "sum() with no axes"),
    ("mean_all", "mean() with no axes"),
    (
        "reshape_to",
        "reshape; a Shape of symbolic dims has no script form",
    ),
    (
        "iota",
        "arange, or a trace's shapes, serve scripts; iota exists for symbolic sizes",
    ),
    (
        "pad_slice",
        "pad; pad_slice is slice's transpose for autodiff",
    ),
    (
        "scatter_add",
        "take's transpose for autodiff; scripts add through one_hot and matmul",
    ),
    ("failed", "scripts raise errors at the line that made them"),
    ("check", "scripts raise errors at the line that made them"),
    ("error", "scripts raise errors at the line that made them"),
    ("eval", "show, item and print evaluate"),
    ("data", "show, item and print read values"),
    ("to_vec", "show, item and print read values"),
    ("aval", "the shape and dtype properties"),
    ("dims", "the shape property"),
    (
        "composition",
        "the graph view names each node's composition",
    ),
    ("location", "the graph view shows each node's script line"),
    ("device_name", "the run report names the device"),
    ("is_computed", "the run report shows what was computed"),
    ("is_materialized", "the run report shows what was computed"),
    ("is_tracer", "to_debug names tracers"),
    ("var", "var is a Rhai keyword: scripts write variance"),
    (
        "quantized_matmul",
        "x @ q with a quantized object resolves to it",
    ),
    (
        "gather_qmm",
        "expert-indexed quantized products have no script form yet; x @ q is the dense one",
    ),
    ("dequantize", "implicit(q) materializes a quantized object"),
    (
        "in_composition",
        "it names a Rust composition; custom_op names a script's",
    ),
    (
        "nn::key_array",
        "scripts draw with a seed (random_uniform), not a key array",
    ),
    (
        "nn::random_uniform",
        "random_uniform(seed, shape, low, high)",
    ),
    (
        "nn::dropout",
        "scripts draw a mask with random_uniform and select",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::Session;
    use std::collections::BTreeSet;

    /// Each registered name as the reference shows it.
    fn registered() -> BTreeSet<String> {
        Session::new()
            .engine
            .gen_fn_signatures(false)
            .iter()
            .map(|s| {
                let name = s.split('(').next().unwrap_or(s);
                let shown = name
                    .trim_start_matches("get$")
                    .trim_start_matches("index$get$")
                    .trim_start_matches("index$set$");
                if shown.is_empty() { "[]" } else { shown }.to_string()
            })
            .collect()
    }

    #[test]
    fn every_registered_name_has_one_summary_and_every_summary_a_name() {
        let names = registered();
        let summarized: BTreeSet<String> = SUMMARIES.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(summarized.len(), SUMMARIES.len(), "a name summarized twice");
        let missing: Vec<_> = names.difference(&summarized).collect();
        let stale: Vec<_> = summarized.difference(&names).collect();
        assert!(
            missing.is_empty(),
            "registered without a summary: {missing:?}"
        );
        assert!(stale.is_empty(), "summarized but not registered: {stale:?}");
        assert!(
            SUMMARIES.iter().all(|(_, s)| !s.contains('`')),
            "summaries hold no code spans"
        );
    }

    /// The native library's public array functions: the `pub fn`s of its
    /// `impl Array` blocks, and its free functions marked
    /// `#[track_caller]` (the user-facing ones name the caller's line),
    /// those of `nn` prefixed `nn::`.
    fn native_functions() -> BTreeSet<String> {
        let core = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/src");
        let mut names = BTreeSet::new();
        let mut stack = vec![core];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("core/src reads") {
                let path = entry.expect("an entry").path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let is_test = path.file_name().is_some_and(|n| n == "tests.rs");
                if path.extension().is_some_and(|e| e == "rs") && !is_test {
                    let source = std::fs::read_to_string(&path).expect("a source file");
                    let nn = path.components().any(|c| c.as_os_str() == "nn")
                        || path.file_name().is_some_and(|n| n == "nn.rs");
                    collect_functions(&source, nn, &mut names);
                }
            }
        }
        names
    }

    fn collect_functions(source: &str, nn: bool, names: &mut BTreeSet<String>) {
        let mut in_impl = false;
        let mut previous = "";
        // A file's test module comes last; its functions are not the API.
        let api = source
            .split("#[cfg(test)]\nmod tests")
            .next()
            .unwrap_or(source);
        for line in api.lines() {
            if line.starts_with("impl Array {") {
                in_impl = true;
            } else if line.starts_with('}') {
                in_impl = false;
            }
            let name = |rest: &str| rest.split(['(', '<']).next().unwrap_or(rest).to_string();
            if let Some(rest) = line.strip_prefix("    pub fn ").filter(|_| in_impl) {
                names.insert(name(rest));
            }
            if let Some(rest) = line.strip_prefix("pub fn ") {
                if previous.trim() == "#[track_caller]" {
                    let prefix = if nn { "nn::" } else { "" };
                    names.insert(format!("{prefix}{}", name(rest)));
                }
            }
            previous = line;
        }
    }

    #[test]
    fn every_public_array_function_has_a_binding_or_a_stated_reason() {
        let native = native_functions();
        for expected in [
            "cumsum",
            "einsum",
            "stack",
            "top_k",
            "nn::softmax",
            "from_vec",
        ] {
            assert!(
                native.contains(expected),
                "the scan finds {expected}: {native:?}"
            );
        }
        let names = registered();
        let unbound: BTreeSet<&str> = UNBOUND.iter().map(|(n, _)| *n).collect();
        let missing: Vec<&String> = native
            .iter()
            .filter(|n| !names.contains(*n) && !unbound.contains(n.as_str()))
            .collect();
        assert!(missing.is_empty(), "no binding and no reason: {missing:?}");
        let needless: Vec<&&str> = unbound
            .iter()
            .filter(|n| names.contains(**n) || !native.contains(**n))
            .collect();
        assert!(
            needless.is_empty(),
            "a reason for a bound or unknown name: {needless:?}"
        );
    }
}
