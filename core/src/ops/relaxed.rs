//! The relaxed-SIMD kernel module's functions (`kiln-relaxed-kernel`),
//! handed over by a wasm32 host that loaded that module on this module's
//! memory (the playground does where the browser validates relaxed SIMD).
//!
//! They live in a module of their own because wasm32's LLVM backend
//! applies a function's target features to the whole module: compiled
//! here, `relaxed-simd` would also turn the elementwise ops' `f32x4.pmin`
//! and `pmax` into `relaxed_min` and `relaxed_max`, whose results for NaN
//! and zeros of either sign depend on the processor.
//!
//! Once [`use_relaxed_kernels`] has them, f32 products run their packed
//! blocks on [`RelaxedKernels::block_product`], and matrix-vector
//! products of affine quantized weights (2, 4 or 8 bits, groups of a
//! multiple of four words) their rows on [`RelaxedKernels::affine_codes_dot`]:
//! fused multiply-adds where the processor has FMA. Both stay within the
//! products' stated bounds; every other op keeps its bits.

/// A block product with the contract of `kiln_relaxed_kernel::block_product`:
/// `(a, b, depth, height, width, c, ldc, add, scratch)` writes (or, when
/// `add` is non-zero, adds) the product of a packed block of `a`
/// (3-row panels, `depth` deep) and one of `b` (12-column panels) to the
/// `height`×`width` block of `c` at row stride `ldc`, using `scratch`
/// (36 values) for partial tiles. Pointers and sizes are the host's
/// (32-bit on wasm32).
pub type BlockProduct = unsafe extern "C" fn(
    *const f32,
    *const f32,
    usize,
    usize,
    usize,
    *mut f32,
    usize,
    u32,
    *mut f32,
);

/// A row dot with the contract of `kiln_relaxed_kernel::affine_codes_dot`:
/// `(bits, words, x, scales, groups, group_words)` is the codes' share of
/// `x · w` for one row `w` of an affine quantized weight with `bits`-bit
/// codes (2, 4 or 8) in `groups` groups of `group_words` words (a multiple
/// of four): `Σ_g scales[g]·Σ code·x`, the biases' share left to Kiln. `x`
/// is in the order of Kiln's fused quantized kernels (group by group, for
/// each code position of a word, that code's `x` for every word of the
/// group).
pub type AffineCodesDot =
    unsafe extern "C" fn(u32, *const u32, *const f32, *const f32, usize, usize) -> f32;

/// The relaxed-SIMD kernel module's functions.
#[derive(Clone, Copy, Debug)]
pub struct RelaxedKernels {
    /// Its `block_product`: the packed blocks of every f32 product.
    pub block_product: BlockProduct,
    /// Its `affine_codes_dot`: the rows of a matrix-vector product of an affine
    /// quantized weight.
    pub affine_codes_dot: AffineCodesDot,
}

/// The kernels, once the host handed them over.
#[cfg(target_arch = "wasm32")]
static KERNELS: std::sync::OnceLock<RelaxedKernels> = std::sync::OnceLock::new();

/// Makes every later f32 product and affine quantized matrix-vector
/// product on this target run on `kernels`. The first kernels handed over
/// stay; returns whether they were these.
///
/// # Safety
///
/// Both functions keep the contracts of [`BlockProduct`] and
/// [`AffineCodesDot`] for as long as the process runs: they read only their
/// operands, write only the block of `c` and the scratch, and compute what
/// the contract says.
#[cfg(target_arch = "wasm32")]
pub unsafe fn use_relaxed_kernels(kernels: RelaxedKernels) -> bool {
    KERNELS.set(kernels).is_ok()
}

/// Whether products run on the relaxed kernels ([`use_relaxed_kernels`]).
#[cfg(target_arch = "wasm32")]
pub fn relaxed_kernels_in_use() -> bool {
    KERNELS.get().is_some()
}

/// The kernels the host handed over, if it did.
#[cfg(target_arch = "wasm32")]
pub(crate) fn kernels() -> Option<RelaxedKernels> {
    KERNELS.get().copied()
}
