//! Kiln's f32 block product and affine quantized row dot with relaxed-SIMD
//! fused multiply-adds, built for wasm32 as a module of its own (a few
//! kilobytes) that imports the playground's memory: the block product is
//! called once per packed block, the row dot once per row of a quantized
//! weight in a matrix-vector product.
//!
//! Why a module of its own: wasm32's LLVM backend applies a function's
//! target features to the whole module, so enabling `relaxed-simd` in the
//! playground's module would also turn its elementwise ops' `f32x4.pmin`
//! and `pmax` into `relaxed_min` and `relaxed_max`, whose results for NaN
//! and zeros of either sign depend on the processor. Here the proposal
//! reaches this product only.
//!
//! Sharing the memory asks two things of the module, which `cargo xtask
//! web` checks on every build: no data segment and no use of its shadow
//! stack (both would write into the main module's memory). So the code
//! holds the tile in locals, reads and writes only through the pointers
//! it is given, and stages a partial tile through the caller's scratch.
//!
//! Numerics: each output of the block is `depth` steps of
//! `f32x4.relaxed_madd` in `k` order from zero (fused where the processor
//! has FMA: every x86-64 with AVX2 and every arm64; else a multiply, then
//! an add), then written to `c` or added to it. The row dot multiplies
//! each code (a float exactly) into `x` with one `relaxed_madd`, in
//! [`ACCUMULATORS`] partial sums per group, and scales each group's sum
//! once, as Kiln's own row kernels do. Natively the lanes are arrays with
//! `f32::mul_add`, so `kiln`'s tests check this code.
#![cfg_attr(target_arch = "wasm32", no_std)]
#![warn(missing_docs)]

/// Rows of a register tile (`a`'s packed panels are this wide).
pub const ROWS: usize = 3;

/// Vectors of a register tile's row.
const VECTORS: usize = 3;

/// Values in one vector.
const LANES: usize = 4;

/// Columns of a register tile (`b`'s packed panels are this wide).
pub const COLS: usize = VECTORS * LANES;

/// Values the scratch holds: one tile.
pub const SCRATCH: usize = ROWS * COLS;

/// Writes (or, when `add` is non-zero, adds) the product of a packed block
/// of `a` and one of `b` to the `height`×`width` block of `c` (row stride
/// `ldc`). `a` holds `height` rows rounded up to [`ROWS`], in panels of
/// `ROWS` rows, each `depth` groups of one value per row; `b` holds
/// `width` columns rounded up to [`COLS`], in panels of `COLS` columns,
/// each `depth` groups of one value per column (padding zeros).
///
/// # Safety
///
/// The packed blocks are readable, the block of `c` writable, `scratch`
/// has [`SCRATCH`] writable values, and nothing else touches `c` or
/// `scratch` during the call.
#[cfg_attr(target_arch = "wasm32", no_mangle)]
#[cfg_attr(
    target_arch = "wasm32",
    target_feature(enable = "simd128,relaxed-simd")
)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn block_product(
    a: *const f32,
    b: *const f32,
    depth: usize,
    height: usize,
    width: usize,
    c: *mut f32,
    ldc: usize,
    add: u32,
    scratch: *mut f32,
) {
    let mut c0 = 0;
    while c0 < width {
        let cols = COLS.min(width - c0);
        // SAFETY (this loop): panels `c0 / COLS` of `b` and `r0 / ROWS` of
        // `a` are inside the packed blocks, and the tile's part of `c`
        // inside its block (contract).
        let panel_b = unsafe { b.add(c0 * depth) };
        let mut r0 = 0;
        while r0 < height {
            let rows = ROWS.min(height - r0);
            let tile = unsafe { tile(a.add(r0 * depth), panel_b, depth) };
            let whole = rows == ROWS && cols == COLS;
            let (out, stride) = if whole {
                (unsafe { c.add(r0 * ldc + c0) }, ldc)
            } else {
                (scratch, COLS)
            };
            for (r, vectors) in tile.iter().enumerate() {
                for (v, &vector) in vectors.iter().enumerate() {
                    unsafe {
                        let at = out.add(r * stride + v * LANES);
                        let sum = if add != 0 && whole {
                            F32x4::read(at).add(vector)
                        } else {
                            vector
                        };
                        sum.write(at);
                    }
                }
            }
            if !whole {
                for r in 0..rows {
                    for col in 0..cols {
                        unsafe {
                            let at = c.add((r0 + r) * ldc + c0 + col);
                            let value = *scratch.add(r * COLS + col);
                            *at = if add != 0 { *at + value } else { value };
                        }
                    }
                }
            }
            r0 += ROWS;
        }
        c0 += COLS;
    }
}

/// Partial sums of [`affine_codes_dot`] in a group, each of four lanes:
/// enough that the fused multiply-adds into them do not wait on one
/// another.
pub const ACCUMULATORS: usize = 4;

/// The codes' share of `x · w` for one row `w` of an affine quantized
/// weight with `bits`-bit codes (2, 4 or 8), in `groups` groups of
/// `group_words` words (a multiple of four): `Σ_g scales[g]·Σ code·x` over
/// each group's codes. A decoded weight is `scale·code + bias`; the
/// biases' share, `Σ_g bias_g·Σ x`, is the caller's (one multiply-add per
/// group where decoding each code took one more per code). Codes lie in
/// each word from the low bits up; `x` is in the order the dot reads it:
/// group by group, for each code position `j` of a word, the `x` value of
/// code `j` of every word of the group, word by word.
///
/// In each group, code `j` of every word goes to partial sum `j mod`
/// [`ACCUMULATORS`], four words (one vector) at a time in word order; the
/// sums are added pairwise and scaled into the row's sum, whose lanes are
/// added at the end.
///
/// # Safety
///
/// `bits` is 2, 4 or 8, `group_words` a multiple of four, and `words`
/// (`groups·group_words`), `x` (`groups·group_words·32/bits`) and `scales`
/// (`groups`) are readable.
#[cfg_attr(target_arch = "wasm32", no_mangle)]
#[cfg_attr(
    target_arch = "wasm32",
    target_feature(enable = "simd128,relaxed-simd")
)]
pub unsafe extern "C" fn affine_codes_dot(
    bits: u32,
    words: *const u32,
    x: *const f32,
    scales: *const f32,
    groups: usize,
    group_words: usize,
) -> f32 {
    let row = Row {
        words,
        x,
        scales,
        groups,
        group_words,
    };
    // SAFETY (all three): the contract.
    match bits {
        2 => unsafe { row.dot::<2>() },
        4 => unsafe { row.dot::<4>() },
        8 => unsafe { row.dot::<8>() },
        _ => refuse(),
    }
}

/// The operands of [`affine_codes_dot`].
struct Row {
    words: *const u32,
    x: *const f32,
    scales: *const f32,
    groups: usize,
    group_words: usize,
}

impl Row {
    /// [`affine_codes_dot`] for `BITS`-bit codes.
    ///
    /// # Safety
    ///
    /// As for [`affine_codes_dot`].
    #[inline(always)]
    unsafe fn dot<const BITS: u32>(&self) -> f32 {
        let codes = (32 / BITS) as usize;
        let mask = U32x4::splat((1 << BITS) - 1);
        let mut scaled = F32x4::ZERO;
        for g in 0..self.groups {
            // SAFETY (this loop): group `g` of every operand (contract).
            unsafe {
                let mut acc = [F32x4::ZERO; ACCUMULATORS];
                let words = self.words.add(g * self.group_words);
                let x = self.x.add(g * self.group_words * codes);
                for v in (0..self.group_words).step_by(LANES) {
                    let packed = U32x4::read(words.add(v));
                    // Indexed by a constant once unrolled, the partial sums
                    // stay in locals (a variable index would put them on
                    // the shadow stack, in the shared memory).
                    for first in (0..codes).step_by(ACCUMULATORS) {
                        for (a, sum) in acc.iter_mut().enumerate() {
                            let j = first + a;
                            let code = packed.shr(j as u32 * BITS).and(mask).to_f32();
                            let xs = F32x4::read(x.add(j * self.group_words + v));
                            *sum = sum.mul_add(code, xs);
                        }
                    }
                }
                let codes = acc[0].add(acc[1]).add(acc[2].add(acc[3]));
                scaled = scaled.mul_add(F32x4::splat(*self.scales.add(g)), codes);
            }
        }
        scaled.sum()
    }
}

/// The end of a call that broke its contract.
#[cfg(target_arch = "wasm32")]
fn refuse() -> ! {
    core::arch::wasm32::unreachable()
}

/// The end of a call that broke its contract.
#[cfg(not(target_arch = "wasm32"))]
fn refuse() -> ! {
    unreachable!("affine_codes_dot takes codes of 2, 4 or 8 bits")
}

/// The [`ROWS`]×[`COLS`] product of a packed panel of `a` and one of `b`,
/// each `depth` deep.
///
/// # Safety
///
/// Both panels are readable.
#[inline(always)]
unsafe fn tile(a: *const f32, b: *const f32, depth: usize) -> [[F32x4; VECTORS]; ROWS] {
    let mut acc = [[F32x4::ZERO; VECTORS]; ROWS];
    for p in 0..depth {
        // SAFETY: step `p` of both panels (contract).
        unsafe {
            let row: [F32x4; VECTORS] =
                core::array::from_fn(|v| F32x4::read(b.add(p * COLS + v * LANES)));
            for (r, sums) in acc.iter_mut().enumerate() {
                let x = F32x4::splat(*a.add(p * ROWS + r));
                for (sum, &y) in sums.iter_mut().zip(&row) {
                    *sum = sum.mul_add(x, y);
                }
            }
        }
    }
    acc
}

#[cfg(target_arch = "wasm32")]
mod lanes {
    //! The four-lane vector as wasm's `v128`.
    use core::arch::wasm32::{
        f32x4_add, f32x4_convert_i32x4, f32x4_extract_lane, f32x4_relaxed_madd, f32x4_splat,
        u32x4_shr, u32x4_splat, v128, v128_and, v128_load, v128_store,
    };

    /// Four f32 values.
    #[derive(Clone, Copy)]
    pub(super) struct F32x4(v128);

    impl F32x4 {
        pub const ZERO: F32x4 = F32x4(core::arch::wasm32::f32x4(0.0, 0.0, 0.0, 0.0));

        /// # Safety
        ///
        /// Four values are readable at `ptr`.
        #[inline(always)]
        pub unsafe fn read(ptr: *const f32) -> F32x4 {
            // SAFETY: contract.
            F32x4(unsafe { v128_load(ptr.cast()) })
        }

        /// # Safety
        ///
        /// Four values are writable at `ptr`.
        #[inline(always)]
        pub unsafe fn write(self, ptr: *mut f32) {
            // SAFETY: contract.
            unsafe { v128_store(ptr.cast(), self.0) }
        }

        #[inline(always)]
        pub fn splat(x: f32) -> F32x4 {
            F32x4(f32x4_splat(x))
        }

        #[inline(always)]
        pub fn add(self, rhs: F32x4) -> F32x4 {
            F32x4(f32x4_add(self.0, rhs.0))
        }

        /// `self + x·y`, one `f32x4.relaxed_madd`.
        #[inline(always)]
        pub fn mul_add(self, x: F32x4, y: F32x4) -> F32x4 {
            F32x4(f32x4_relaxed_madd(x.0, y.0, self.0))
        }

        /// `(l0 + l1) + (l2 + l3)`.
        #[inline(always)]
        pub fn sum(self) -> f32 {
            (f32x4_extract_lane::<0>(self.0) + f32x4_extract_lane::<1>(self.0))
                + (f32x4_extract_lane::<2>(self.0) + f32x4_extract_lane::<3>(self.0))
        }
    }

    /// Four u32 values.
    #[derive(Clone, Copy)]
    pub(super) struct U32x4(v128);

    impl U32x4 {
        /// # Safety
        ///
        /// Four values are readable at `ptr`.
        #[inline(always)]
        pub unsafe fn read(ptr: *const u32) -> U32x4 {
            // SAFETY: contract.
            U32x4(unsafe { v128_load(ptr.cast()) })
        }

        #[inline(always)]
        pub fn splat(x: u32) -> U32x4 {
            U32x4(u32x4_splat(x))
        }

        #[inline(always)]
        pub fn shr(self, bits: u32) -> U32x4 {
            U32x4(u32x4_shr(self.0, bits))
        }

        #[inline(always)]
        pub fn and(self, rhs: U32x4) -> U32x4 {
            U32x4(v128_and(self.0, rhs.0))
        }

        /// Each lane as f32; lanes below 2³¹, so a signed conversion (one
        /// instruction) is exact.
        #[inline(always)]
        pub fn to_f32(self) -> F32x4 {
            F32x4(f32x4_convert_i32x4(self.0))
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod lanes {
    //! The four-lane vector as an array, `mul_add` fused (what
    //! `relaxed_madd` gives on a processor with FMA).

    /// Four f32 values.
    #[derive(Clone, Copy)]
    pub(super) struct F32x4([f32; 4]);

    impl F32x4 {
        pub const ZERO: F32x4 = F32x4([0.0; 4]);

        /// # Safety
        ///
        /// Four values are readable at `ptr`.
        pub unsafe fn read(ptr: *const f32) -> F32x4 {
            // SAFETY: contract.
            F32x4(unsafe { ptr.cast::<[f32; 4]>().read_unaligned() })
        }

        /// # Safety
        ///
        /// Four values are writable at `ptr`.
        pub unsafe fn write(self, ptr: *mut f32) {
            // SAFETY: contract.
            unsafe { ptr.cast::<[f32; 4]>().write_unaligned(self.0) }
        }

        pub fn splat(x: f32) -> F32x4 {
            F32x4([x; 4])
        }

        pub fn add(self, rhs: F32x4) -> F32x4 {
            F32x4(core::array::from_fn(|l| self.0[l] + rhs.0[l]))
        }

        pub fn mul_add(self, x: F32x4, y: F32x4) -> F32x4 {
            F32x4(core::array::from_fn(|l| x.0[l].mul_add(y.0[l], self.0[l])))
        }

        /// `(l0 + l1) + (l2 + l3)`.
        pub fn sum(self) -> f32 {
            (self.0[0] + self.0[1]) + (self.0[2] + self.0[3])
        }
    }

    /// Four u32 values.
    #[derive(Clone, Copy)]
    pub(super) struct U32x4([u32; 4]);

    impl U32x4 {
        /// # Safety
        ///
        /// Four values are readable at `ptr`.
        pub unsafe fn read(ptr: *const u32) -> U32x4 {
            // SAFETY: contract.
            U32x4(unsafe { ptr.cast::<[u32; 4]>().read_unaligned() })
        }

        pub fn splat(x: u32) -> U32x4 {
            U32x4([x; 4])
        }

        pub fn shr(self, bits: u32) -> U32x4 {
            U32x4(self.0.map(|v| v >> bits))
        }

        pub fn and(self, rhs: U32x4) -> U32x4 {
            U32x4(core::array::from_fn(|l| self.0[l] & rhs.0[l]))
        }

        pub fn to_f32(self) -> F32x4 {
            F32x4(self.0.map(|v| v as f32))
        }
    }
}

use lanes::{F32x4, U32x4};

#[cfg(target_arch = "wasm32")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // Nothing here panics (the build check finds no data a panic message
    // would need); a trap if it ever did.
    core::arch::wasm32::unreachable()
}
