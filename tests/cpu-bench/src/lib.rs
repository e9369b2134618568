//! The programs behind Kiln's CPU throughput figures (`cargo xtask bench
//! cpu`): one unary op per call on a 256×256 f32 array with values in
//! (−1, 1), the anchors' chain (exp, ×c, +c, tanh repeated) and a chain of
//! cheap scalar ops. The native benchmark program times them directly; on
//! wasm32 this crate is a module of its own whose exports the browser
//! harness (`browser.mjs`) calls and times.
//!
//! ```
//! use kiln_cpu_bench::{anchor_chain, input, UNARY};
//! let x = input();
//! let (name, op) = UNARY[1];
//! assert_eq!(name, "exp");
//! assert_eq!(op(&x).shape(), x.shape());
//! assert_eq!(anchor_chain(x.clone(), 8).shape(), x.shape());
//! ```
//!
//! ```
//! use kiln_cpu_bench::{product_is_within_bound, square};
//! let (a, b) = (square(70, 1), square(70, 2));
//! let c = a.matmul(&b);
//! assert!(product_is_within_bound(70, &a, &b, &c));
//! assert!(!product_is_within_bound(70, &a, &b, &(c * 1.0001)));
//! ```

use kiln::{quantize, quantized_matmul, Array, DType, QuantFormat, Quantized};

/// Rows and columns of every benchmark input.
pub const SIDE: usize = 256;

/// Elements of every benchmark input.
pub const ELEMENTS: usize = SIDE * SIDE;

/// A benchmarked op as a function of the input.
pub type UnaryProgram = fn(&Array) -> Array;

/// The unary programs: the name in `cpu_unary_<name>_ns`, and the op.
pub const UNARY: [(&str, UnaryProgram); 10] = [
    ("mul", |x| x * 1.0001),
    ("exp", Array::exp),
    ("tanh", Array::tanh),
    ("log", Array::log),
    ("sigmoid", Array::sigmoid),
    ("erf", Array::erf),
    ("sin", Array::sin),
    ("cos", Array::cos),
    ("sqrt", Array::sqrt),
    ("rsqrt", Array::rsqrt),
];

/// The ops whose loops skip a branch in chunks that do not select it
/// (tanh and erf take a polynomial alone where |x| < 1), timed again on
/// inputs in (−3, 3) as `cpu_unary_<name>_wide_ns`: the cost when both
/// branches are live.
pub const WIDE: [(&str, UnaryProgram); 2] = [("tanh", Array::tanh), ("erf", Array::erf)];

/// Lengths of the anchors' chain (`cpu_chain_<n>`).
pub const CHAINS: [usize; 3] = [10, 100, 1000];

/// Length of the cheap chain (`cpu_scalar_chain_100`).
pub const SCALAR_CHAIN: usize = 100;

/// An `n`×`n` f32 operand with values uniform in (−1, 1), evaluated: the
/// square products the browser times (`cpu_wasm_matmul_f32_<n>_gflops`,
/// beside the native `cpu_matmul_f32_<n>_gflops`).
pub fn square(n: usize, seed: u64) -> Array {
    uniform(&[n, n], seed)
}

/// An f32 array of `shape` with values uniform in (−1, 1) drawn from
/// `seed`, evaluated.
fn uniform(shape: &[usize], seed: u64) -> Array {
    let x = Array::random_uniform(kiln::random::Key::new(seed), shape, -1.0, 1.0, DType::F32)
        .expect("a benchmark operand is within every limit");
    x.eval().expect("the operand evaluates");
    x
}

/// True when the product `product = a·b` of two `n`×`n` f32
/// operands is within the f32 error bound of the exact sums
/// ([`kiln::ops::matmul::error_bound`]) on every 61st row and the last, all
/// columns: the browser's timed product is checked before it is timed.
pub fn product_is_within_bound(n: usize, a: &Array, b: &Array, product: &Array) -> bool {
    rows_within_bound((n, n, n), 0, a, [b, &b.abs()], product)
}

/// True when `product`, [`quantized_product`] (when `quantized`) or
/// [`dense_product`] of `operands` ([`weight_operands`]), is within the f32
/// error bound of the exact sums of `x` and the dequantized weight on
/// every 61st row of `x` and the last, all columns. For the quantized
/// product that is Kiln's stated bound, `error_bound(k + 4, Σ (|s·c| +
/// |b|)·|x|)` (kernels may take each group's bias out of its sum), with two
/// roundings more for the magnitudes `|s·c| + |b|` computed here.
pub fn weight_product_is_within_bound(
    operands: &[Array],
    product: &Array,
    quantized: bool,
) -> bool {
    let Some(&[m, k]) = operands[0].shape().as_known().as_deref() else {
        return false;
    };
    let (roundings, magnitudes) = if quantized {
        let parts = [operands[1].clone(), operands[2].abs(), operands[3].abs()];
        // Affine codes are not negative: decoding with |s| and |b| gives
        // |s|·c + |b|.
        (6, quantized_weight(&parts).dequantize().transpose())
    } else {
        (0, operands[4].abs())
    };
    rows_within_bound(
        (m, k, k),
        roundings,
        &operands[0],
        [&operands[4], &magnitudes],
        product,
    )
}

/// True when `product = a·b` (`m`×`k` by `k`×`n`) is within
/// [`kiln::ops::matmul::error_bound`] of `k + roundings` terms of the
/// exact sums on every 61st row and the last, all columns, the bound's
/// sum taken of `|a|` times `b_magnitudes` (`|b|`, or what a quantized
/// product's bound sums in its place).
fn rows_within_bound(
    (m, k, n): (usize, usize, usize),
    roundings: usize,
    a: &Array,
    [b, b_magnitudes]: [&Array; 2],
    product: &Array,
) -> bool {
    let (Ok(a), Ok(b), Ok(magnitudes), Ok(c)) = (
        a.to_vec::<f32>(),
        b.to_vec::<f32>(),
        b_magnitudes.to_vec::<f32>(),
        product.to_vec::<f32>(),
    ) else {
        return false;
    };
    if m == 0
        || a.len() != m * k
        || b.len() != k * n
        || magnitudes.len() != k * n
        || c.len() != m * n
    {
        return false;
    }
    let rows = (0..m).filter(|&i| i % 61 == 0 || i + 1 == m);
    rows.flat_map(|i| (0..n).map(move |j| (i, j)))
        .all(|(i, j)| {
            let (mut exact, mut abs_sum) = (0.0f64, 0.0f64);
            for p in 0..k {
                let x = f64::from(a[i * k + p]);
                exact += x * f64::from(b[p * n + j]);
                abs_sum += x.abs() * f64::from(magnitudes[p * n + j]);
            }
            let bound = kiln::ops::matmul::error_bound(k + roundings, abs_sum);
            (f64::from(c[i * n + j]) - exact).abs() <= bound
        })
}

/// Side of the weight of the browser's quantized and dense products
/// (`cpu_wasm_{qmm_4bit,dense_matmul}_4096x4096_m<m>_us`, beside the native
/// `{qmm_4bit,dense_matmul}_4096x4096_m<m>_cpu`).
pub const WEIGHT_SIDE: usize = 4096;

/// The quantized products' format, as the native figures': 4-bit affine,
/// groups of 64.
pub const QMM_FORMAT: QuantFormat = QuantFormat::Affine {
    bits: 4,
    group_size: 64,
};

/// `[x, packed, scales, biases, dense]`, evaluated: an `m`×[`WEIGHT_SIDE`]
/// `x` with values in (−1, 1), a square weight `w` quantized in
/// [`QMM_FORMAT`], and `wᵀ` dequantized to dense f32, the fastest dense
/// path's operand.
pub fn weight_operands(m: usize) -> Vec<Array> {
    weight_operands_of(WEIGHT_SIDE, m)
}

/// [`weight_operands`] with a `side`×`side` weight.
fn weight_operands_of(side: usize, m: usize) -> Vec<Array> {
    let w = square(side, 3);
    let x = uniform(&[m, side], 4);
    let q = quantize(&w, QMM_FORMAT);
    let biases = q.biases.expect("the affine format has biases");
    let dense = quantized_weight(&[q.packed.clone(), q.scales.clone(), biases.clone()])
        .dequantize()
        .transpose();
    let operands = vec![x, q.packed, q.scales, biases, dense];
    for operand in &operands {
        operand.eval().expect("the operands evaluate");
    }
    operands
}

/// The weight of `[packed, scales, biases]` in [`QMM_FORMAT`].
fn quantized_weight(parts: &[Array]) -> Quantized {
    Quantized {
        packed: parts[0].clone(),
        scales: parts[1].clone(),
        biases: Some(parts[2].clone()),
        format: QMM_FORMAT,
    }
}

/// `x @ wᵀ` read from the packed codes of [`weight_operands`].
pub fn quantized_product(operands: &[Array]) -> Array {
    quantized_matmul(&operands[0], &quantized_weight(&operands[1..4]), true)
}

/// `x @ wᵀ` through the dense weight of [`weight_operands`].
pub fn dense_product(operands: &[Array]) -> Array {
    operands[0].matmul(&operands[4])
}

/// The 256×256 f32 input with values uniform in (−1, 1), evaluated.
pub fn input() -> Array {
    uniform(&[SIDE, SIDE], 7)
}

/// The input the unary program `name` reads: |x| + 0.5 for the ops that
/// need a positive operand (`log`, `sqrt`, `rsqrt`), else `x`.
pub fn unary_input(name: &str, x: &Array) -> Array {
    if matches!(name, "log" | "sqrt" | "rsqrt") {
        let positive = x.abs() + 0.5;
        positive.eval().expect("the input evaluates");
        positive
    } else {
        x.clone()
    }
}

/// The anchors' chain: exp, ×c, +c, tanh repeated to `n` ops.
pub fn anchor_chain(x: Array, n: usize) -> Array {
    (0..n).fold(x, |x, i| match i % 4 {
        0 => x.exp(),
        1 => x * 0.5,
        2 => x + 0.25,
        _ => x.tanh(),
    })
}

/// A chain of `n` cheap elementwise ops: ×c, +c, −c, max c repeated.
pub fn scalar_chain(x: Array, n: usize) -> Array {
    (0..n).fold(x, |x, i| match i % 4 {
        0 => x * 1.0001,
        1 => x + 0.001,
        2 => x - 0.0005,
        _ => x.maximum(-10.0),
    })
}

#[cfg(target_arch = "wasm32")]
mod wasm {
    //! The module's exports. The harness reads the unary names, prepares
    //! one program at a time (its first call compiles it) and times
    //! batches of cached calls.

    use super::{
        anchor_chain, dense_product, input, product_is_within_bound, quantized_product,
        scalar_chain, square, unary_input, weight_operands, weight_product_is_within_bound, UNARY,
    };
    use kiln::{compile, Array};
    use std::cell::RefCell;
    use std::sync::OnceLock;

    thread_local! {
        /// One cached call of the prepared program; `false` when it fails.
        static PREPARED: RefCell<Option<Box<dyn Fn() -> bool>>> = RefCell::new(None);
    }

    /// The unary names, comma-separated, for the harness.
    fn names() -> &'static str {
        static NAMES: OnceLock<String> = OnceLock::new();
        NAMES.get_or_init(|| UNARY.map(|(name, _)| name).join(","))
    }

    /// Address of the comma-separated unary names in linear memory.
    #[no_mangle]
    pub extern "C" fn kiln_bench_names() -> *const u8 {
        names().as_ptr()
    }

    /// Length in bytes of the names at [`kiln_bench_names`].
    #[no_mangle]
    pub extern "C" fn kiln_bench_names_len() -> usize {
        names().len()
    }

    #[link(wasm_import_module = "kiln")]
    extern "C" {
        /// The relaxed-SIMD kernel module's `block_product`, instantiated
        /// by the harness on this module's memory.
        fn relaxed_block_product(
            a: *const f32,
            b: *const f32,
            depth: usize,
            height: usize,
            width: usize,
            c: *mut f32,
            ldc: usize,
            add: u32,
            scratch: *mut f32,
        );

        /// The relaxed-SIMD kernel module's `affine_codes_dot`, instantiated
        /// by the harness on this module's memory.
        fn relaxed_affine_codes_dot(
            bits: u32,
            words: *const u32,
            x: *const f32,
            scales: *const f32,
            groups: usize,
            group_words: usize,
        ) -> f32;
    }

    /// Runs the f32 products and the affine quantized matrix-vector
    /// products on the relaxed-SIMD kernel module from now on
    /// (`cpu_wasm_relaxed_*`); returns 1 when that took effect.
    #[no_mangle]
    pub extern "C" fn kiln_bench_use_relaxed_kernel() -> u32 {
        let kernels = kiln::ops::relaxed::RelaxedKernels {
            block_product: relaxed_block_product,
            affine_codes_dot: relaxed_affine_codes_dot,
        };
        // SAFETY: the harness provides the kernel module's functions,
        // instantiated on this module's memory, which keep their contracts
        // (`kiln-relaxed-kernel`).
        u32::from(unsafe { kiln::ops::relaxed::use_relaxed_kernels(kernels) })
    }

    /// Prepares a program: `0..UNARY.len()` a unary op, `100` the anchors'
    /// chain of `length` ops, `101` the cheap chain of `length` ops, `102`
    /// the f32 product of two `length`×`length` operands (its result
    /// checked by [`product_is_within_bound`]), `103` the 4-bit product and
    /// `104` the dense one of a `length`-row `x` and the 4096×4096 weight
    /// ([`weight_operands`], checked by [`weight_product_is_within_bound`]). Makes its first call; returns 1 when that
    /// succeeded, 0 otherwise.
    #[no_mangle]
    pub extern "C" fn kiln_bench_prepare(program: u32, length: u32) -> u32 {
        let x = input();
        let n = length as usize;
        let call: Box<dyn Fn() -> bool> = match program {
            100 => {
                let f = compile(move |x: Array| anchor_chain(x, n));
                Box::new(move || f.call(&x).is_ok())
            }
            101 => {
                let f = compile(move |x: Array| scalar_chain(x, n));
                Box::new(move || f.call(&x).is_ok())
            }
            102 => {
                let operands = (square(n, 1), square(n, 2));
                let f = compile(|(a, b): (Array, Array)| a.matmul(&b));
                let checked = f
                    .call(&operands)
                    .is_ok_and(|c| product_is_within_bound(n, &operands.0, &operands.1, &c));
                if !checked {
                    return 0;
                }
                Box::new(move || f.call(&operands).is_ok())
            }
            103 | 104 => {
                let operands = weight_operands(n);
                let quantized = program == 103;
                let program = if quantized {
                    quantized_product
                } else {
                    dense_product
                };
                let f = compile(move |operands: Vec<Array>| program(&operands));
                let checked = f
                    .call(&operands)
                    .is_ok_and(|out| weight_product_is_within_bound(&operands, &out, quantized));
                if !checked {
                    return 0;
                }
                Box::new(move || f.call(&operands).is_ok_and(|out| out.eval().is_ok()))
            }
            k => match UNARY.get(k as usize) {
                Some(&(name, op)) => {
                    let x = unary_input(name, &x);
                    let f = compile(move |x: Array| op(&x));
                    Box::new(move || f.call(&x).is_ok())
                }
                None => return 0,
            },
        };
        let ok = call();
        PREPARED.with(|p| *p.borrow_mut() = Some(call));
        u32::from(ok)
    }

    /// Makes `calls` cached calls of the prepared program; returns 1 when
    /// all succeeded, 0 otherwise (or with nothing prepared).
    #[no_mangle]
    pub extern "C" fn kiln_bench_run(calls: u32) -> u32 {
        PREPARED.with(|p| match p.borrow().as_ref() {
            Some(call) => u32::from((0..calls).all(|_| call())),
            None => 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weight_products_are_within_the_bound_and_a_perturbed_one_is_not() {
        for m in [1, 5] {
            let operands = weight_operands_of(128, m);
            let quantized = quantized_product(&operands);
            let dense = dense_product(&operands);
            assert!(weight_product_is_within_bound(&operands, &quantized, true));
            assert!(weight_product_is_within_bound(&operands, &dense, false));
            assert!(!weight_product_is_within_bound(
                &operands,
                &(quantized * 1.001),
                true
            ));
            // An error of 1e-3, above the dense bound (about 2.4e-4 here),
            // and one of 1e-2, above the quantized one (about 1e-3).
            let nudged = dense.clone() + 1e-3;
            assert!(!weight_product_is_within_bound(&operands, &nudged, false));
            let nudged = dense + 1e-2;
            assert!(!weight_product_is_within_bound(&operands, &nudged, true));
        }
    }
}
