//! Kiln's f32 block product with relaxed-SIMD fused multiply-adds, built
//! for wasm32 as a module of its own (a few kilobytes) that imports the
//! playground's memory and is called once per packed block.
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
//! an add), then written to `c` or added to it. Natively the lanes are
//! arrays with `f32::mul_add`, so `kiln`'s tests check this code's bits.
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
        f32x4_add, f32x4_relaxed_madd, f32x4_splat, v128, v128_load, v128_store,
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
    }
}

use lanes::F32x4;

#[cfg(target_arch = "wasm32")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // Nothing here panics (the build check finds no data a panic message
    // would need); a trap if it ever did.
    core::arch::wasm32::unreachable()
}
