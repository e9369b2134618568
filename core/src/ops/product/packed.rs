//! Kiln's own packed f32 GEMM for four-lane vectors: the product on
//! wasm32, where `simd128` is the widest vector.
//!
//! The `gemm` crate's simd128 kernels hold a 12×4 tile of accumulators;
//! with the operands and a product in flight that is more than the 15
//! vector registers V8 allocates on x86-64, and the spills cost a fifth of
//! the throughput (in V8 on an Intel Xeon, an L1-resident kernel: 12×4
//! reaches 39 GFLOP/s, 4×8 and 2×16 tiles 47).
//! This one keeps a [`ROWS`]×[`COLS`] tile (eight accumulators) and blocks
//! the operands the usual way: a [`DEPTH`]-deep panel of `b`'s columns
//! stays in L1 while the packed rows of `a` stream from L2.
//!
//! Numerics: each product is a multiply, then an add (simd128 has no fused
//! multiply-add), summed in `k` order within each [`DEPTH`] block and the
//! blocks added to `c` in order: the same bits on every run, and within
//! the classical bound of [`super::super::matmul::error_bound`].
//!
//! Where the host loaded the relaxed-SIMD kernel module
//! (`kiln-relaxed-kernel`) and handed its kernels to
//! `ops::relaxed::use_relaxed_kernels`, the operands are packed for its
//! [`RELAXED_ROWS`]×[`RELAXED_COLS`] tiles instead and each packed block
//! goes to it: the same blocking and order, each step one fused
//! multiply-add where the processor has FMA (in Chromium on an Intel Xeon,
//! 54–56 GFLOP/s against this module's 42–45).
//!
//! The lane type is `v128` on wasm32; elsewhere a plain array with the same
//! operations, so the native tests check the packing and blocking that the
//! browser runs.

use crate::ops::relaxed::BlockProduct;
use lanes::F32x4;
use std::cell::RefCell;

/// Rows of `c` in a register tile (each of `a`'s values is splatted).
const ROWS: usize = 4;

/// Columns of `c` in a register tile: two vectors.
const COLS: usize = 2 * LANES;

/// Values in one vector.
const LANES: usize = 4;

/// Products summed per pass over `c`: a packed panel of `b` is
/// `DEPTH`×[`COLS`] (8 KiB), one of `a` `DEPTH`×[`ROWS`] (4 KiB).
const DEPTH: usize = 256;

/// Panels of `a` packed at once: 64 rows×[`DEPTH`] for this module's
/// tiles, 48 rows for the relaxed kernel's (64 or 48 KiB: L2).
const BLOCK_PANELS_A: usize = 16;

/// Panels of `b` packed at once: [`DEPTH`]×512 columns for this module's
/// tiles, ×768 for the relaxed kernel's (512 or 768 KiB: L2 or L3).
const BLOCK_PANELS_B: usize = 64;

/// Rows of the relaxed kernel's tiles (`kiln_relaxed_kernel::ROWS`).
pub(crate) const RELAXED_ROWS: usize = 3;

/// Columns of the relaxed kernel's tiles (`kiln_relaxed_kernel::COLS`).
pub(crate) const RELAXED_COLS: usize = 12;

/// What computes the product of a packed block.
#[derive(Clone, Copy)]
pub(crate) enum Product {
    /// [`ROWS`]×[`COLS`] tiles in this module, a multiply, then an add.
    Plain,
    /// The relaxed kernel's block product.
    Relaxed(BlockProduct),
}

impl Product {
    /// The relaxed kernel's block product where the host handed it over,
    /// else this module's tiles.
    #[cfg(target_arch = "wasm32")]
    pub(crate) fn current() -> Product {
        crate::ops::relaxed::kernels().map_or(Product::Plain, |kernels| {
            Product::Relaxed(kernels.block_product)
        })
    }
}

/// A strided read-only matrix: element `(i, j)` at `ptr + i·row_stride +
/// j·col_stride`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Strided {
    /// Element `(0, 0)`.
    pub ptr: *const f32,
    /// Elements from one row to the next.
    pub row_stride: usize,
    /// Elements from one column to the next.
    pub col_stride: usize,
}

impl Strided {
    /// The transpose, read in place.
    fn transposed(self) -> Strided {
        Strided {
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }
}

thread_local! {
    /// The packed blocks of `a` and `b`, and the relaxed kernel's scratch,
    /// kept between calls.
    static PACKED: RefCell<(Vec<f32>, Vec<f32>, [f32; RELAXED_ROWS * RELAXED_COLS])> =
        const { RefCell::new((Vec::new(), Vec::new(), [0.0; RELAXED_ROWS * RELAXED_COLS])) };
}

/// `c = a·b`, or `c += a·b` when `accumulate`, for the `m`×`k` matrix `a`,
/// the `k`×`n` matrix `b` and the row-major `m`×`n` matrix `c` with row
/// stride `ldc`, its packed blocks computed by `product`.
///
/// # Safety
///
/// `a` covers `m`×`k`, `b` covers `k`×`n`, `c` points to `m` rows of `ldc ≥
/// n` writable elements that nothing else touches during the call; a
/// [`Product::Relaxed`] keeps its contract.
pub(crate) unsafe fn gemm(
    product: Product,
    shape: (usize, usize, usize),
    a: Strided,
    b: Strided,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    match product {
        // SAFETY (both): the same contract.
        Product::Plain => unsafe {
            blocked::<ROWS, COLS>(shape, a, b, c, ldc, accumulate, |block, c, ldc, add, _| {
                block.multiply(c, ldc, add)
            })
        },
        Product::Relaxed(product) => unsafe {
            blocked::<RELAXED_ROWS, RELAXED_COLS>(
                shape,
                a,
                b,
                c,
                ldc,
                accumulate,
                |block, c, ldc, add, scratch| {
                    product(
                        block.a.as_ptr(),
                        block.b.as_ptr(),
                        block.depth,
                        block.height,
                        block.width,
                        c,
                        ldc,
                        u32::from(add),
                        scratch,
                    )
                },
            )
        },
    }
}

/// [`gemm`] with `a` packed in panels of `PANEL_ROWS` rows and `b` in
/// panels of `PANEL_COLS` columns, each packed block's product (with its
/// part of `c`, `ldc`, whether to add, and the scratch) by `product`.
///
/// # Safety
///
/// As for [`gemm`]; `product` writes only the block of `c` it is given
/// (and the scratch), and is called with nothing else.
unsafe fn blocked<const PANEL_ROWS: usize, const PANEL_COLS: usize>(
    (m, k, n): (usize, usize, usize),
    a: Strided,
    b: Strided,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    product: impl Fn(&Block, *mut f32, usize, bool, *mut f32),
) {
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                // SAFETY: row `i` of `c` holds `n` elements (contract).
                unsafe { std::ptr::write_bytes(c.add(i * ldc), 0, n) };
            }
        }
        return;
    }
    let (block_rows, block_cols) = (BLOCK_PANELS_A * PANEL_ROWS, BLOCK_PANELS_B * PANEL_COLS);
    PACKED.with_borrow_mut(|(packed_a, packed_b, scratch)| {
        for j0 in (0..n).step_by(block_cols) {
            let width = block_cols.min(n - j0);
            for p0 in (0..k).step_by(DEPTH) {
                let depth = DEPTH.min(k - p0);
                // SAFETY: the block is inside `b` (contract).
                unsafe { pack::<PANEL_COLS>(b.transposed(), (j0, width), (p0, depth), packed_b) };
                let add = accumulate || p0 > 0;
                for i0 in (0..m).step_by(block_rows) {
                    let height = block_rows.min(m - i0);
                    // SAFETY: the block is inside `a` (contract).
                    unsafe { pack::<PANEL_ROWS>(a, (i0, height), (p0, depth), packed_a) };
                    let block = Block {
                        a: packed_a,
                        b: packed_b,
                        depth,
                        height,
                        width,
                    };
                    // SAFETY: rows `i0..i0 + height`, columns `j0..j0 +
                    // width` of `c` are in bounds (contract).
                    product(
                        &block,
                        unsafe { c.add(i0 * ldc + j0) },
                        ldc,
                        add,
                        scratch.as_mut_ptr(),
                    );
                }
            }
        }
    });
}

/// Packs rows `first..first + count`, columns `p0..p0 + depth` of `m` into
/// panels of `WIDTH` rows, each `depth` groups of one value per row (rows
/// past `count` are zeros): `a`'s panels, and `b`'s from its transpose.
///
/// # Safety
///
/// The block is inside `m`.
unsafe fn pack<const WIDTH: usize>(
    m: Strided,
    (first, count): (usize, usize),
    (p0, depth): (usize, usize),
    out: &mut Vec<f32>,
) {
    out.clear();
    out.resize(count.next_multiple_of(WIDTH) * depth, 0.0);
    for (panel, r0) in out
        .chunks_exact_mut(WIDTH * depth)
        .zip((0..count).step_by(WIDTH))
    {
        let rows = WIDTH.min(count - r0);
        if m.row_stride == 1 && rows == WIDTH {
            // A column's rows are adjacent (`b` row-major): a whole group
            // in one read (a copy of unknown length would call memcpy).
            for (p, group) in panel.chunks_exact_mut(WIDTH).enumerate() {
                // SAFETY: rows `first + r0..first + r0 + WIDTH` of column
                // `p0 + p` are inside the block (contract).
                let column: [f32; WIDTH] = unsafe {
                    let start = m.ptr.add(first + r0 + (p0 + p) * m.col_stride);
                    start.cast::<[f32; WIDTH]>().read_unaligned()
                };
                group.copy_from_slice(&column);
            }
            continue;
        }
        // SAFETY: rows `first + r0 + r`, `r < rows`, from column `p0` are
        // inside the block (contract); past `rows`, the last row repeats.
        let starts: [*const f32; WIDTH] = std::array::from_fn(|r| unsafe {
            let row = first + r0 + r.min(rows - 1);
            m.ptr.add(row * m.row_stride + p0 * m.col_stride)
        });
        // A group of rows at a time: the panel is written in order.
        for (p, group) in panel.chunks_exact_mut(WIDTH).enumerate() {
            for (value, start) in group[..rows].iter_mut().zip(starts) {
                // SAFETY: column `p0 + p` < `p0 + depth` (contract).
                *value = unsafe { *start.add(p * m.col_stride) };
            }
        }
    }
}

/// A packed block of `a` (`height` rows) and of `b` (`width` columns), both
/// `depth` deep.
struct Block<'a> {
    a: &'a [f32],
    b: &'a [f32],
    depth: usize,
    height: usize,
    width: usize,
}

impl Block<'_> {
    /// Writes (or, with `add`, adds) the block's product to the `height`×
    /// `width` part of `c` (row stride `ldc`).
    ///
    /// # Safety
    ///
    /// That part of `c` is writable and nothing else touches it.
    unsafe fn multiply(&self, c: *mut f32, ldc: usize, add: bool) {
        for (panel_b, c0) in self
            .b
            .chunks_exact(self.depth * COLS)
            .zip((0..).step_by(COLS))
        {
            let cols = COLS.min(self.width - c0);
            for (panel_a, r0) in self
                .a
                .chunks_exact(self.depth * ROWS)
                .zip((0..).step_by(ROWS))
            {
                let rows = ROWS.min(self.height - r0);
                let tile = tile(panel_a, panel_b, self.depth);
                // SAFETY: the tile's `rows`×`cols` part of `c` is inside
                // the block's (contract).
                unsafe { store(&tile, c.add(r0 * ldc + c0), ldc, rows, cols, add) };
            }
        }
    }
}

/// The [`ROWS`]×[`COLS`] product of a packed panel of `a` and one of `b`,
/// each `depth` deep: row `r`'s two vectors at `[2r]` and `[2r + 1]`.
#[inline(always)]
fn tile(panel_a: &[f32], panel_b: &[f32], depth: usize) -> [F32x4; 2 * ROWS] {
    assert!(panel_a.len() >= depth * ROWS && panel_b.len() >= depth * COLS);
    let (a, b) = (panel_a.as_ptr(), panel_b.as_ptr());
    let mut acc = [F32x4::ZERO; 2 * ROWS];
    for p in 0..depth {
        // SAFETY: step `p` of both panels is in bounds (checked above,
        // once for every step).
        unsafe {
            let b0 = F32x4::read(b.add(p * COLS));
            let b1 = F32x4::read(b.add(p * COLS + LANES));
            for r in 0..ROWS {
                let x = F32x4::splat(*a.add(p * ROWS + r));
                acc[2 * r] = acc[2 * r].add(x.mul(b0));
                acc[2 * r + 1] = acc[2 * r + 1].add(x.mul(b1));
            }
        }
    }
    acc
}

/// Writes (or, with `add`, adds) the top-left `rows`×`cols` of `tile` to
/// `c`.
///
/// # Safety
///
/// `c` has `rows` rows of `cols` writable elements at stride `ldc`.
#[inline(always)]
unsafe fn store(
    tile: &[F32x4; 2 * ROWS],
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    add: bool,
) {
    if rows == ROWS && cols == COLS {
        // A whole tile, in vectors: through the scalar path below, products
        // up to 512² ran 4–30% slower in V8 (the smallest the most).
        for (r, halves) in tile.chunks_exact(2).enumerate() {
            for (h, &half) in halves.iter().enumerate() {
                // SAFETY: row `r` of `c` has `COLS` elements (contract).
                unsafe {
                    let out = c.add(r * ldc + h * LANES);
                    let sum = if add {
                        F32x4::read(out).add(half)
                    } else {
                        half
                    };
                    sum.write(out);
                }
            }
        }
        return;
    }
    for r in 0..rows {
        let mut values = [0.0f32; COLS];
        // SAFETY: `values` holds two vectors.
        unsafe {
            tile[2 * r].write(values.as_mut_ptr());
            tile[2 * r + 1].write(values.as_mut_ptr().add(LANES));
        }
        // SAFETY: row `r` of `c` has `cols` elements (contract).
        let row = unsafe { std::slice::from_raw_parts_mut(c.add(r * ldc), cols) };
        if add {
            row.iter_mut().zip(values).for_each(|(c, v)| *c += v);
        } else {
            row.copy_from_slice(&values[..cols]);
        }
    }
}

#[cfg(target_arch = "wasm32")]
mod lanes {
    //! The four-lane vector as wasm's `v128`.
    use core::arch::wasm32::{
        f32x4, f32x4_add, f32x4_mul, f32x4_splat, v128, v128_load, v128_store,
    };

    /// Four f32 values.
    #[derive(Clone, Copy)]
    pub(super) struct F32x4(v128);

    impl F32x4 {
        /// Zeros.
        pub const ZERO: F32x4 = F32x4(f32x4(0.0, 0.0, 0.0, 0.0));

        /// The four values at `ptr`.
        ///
        /// # Safety
        ///
        /// Four values are readable at `ptr` (v128 loads need no
        /// alignment).
        #[inline(always)]
        pub unsafe fn read(ptr: *const f32) -> F32x4 {
            // SAFETY: contract.
            F32x4(unsafe { v128_load(ptr.cast()) })
        }

        /// Writes the lanes to the four values at `ptr`.
        ///
        /// # Safety
        ///
        /// Four values are writable at `ptr`.
        #[inline(always)]
        pub unsafe fn write(self, ptr: *mut f32) {
            // SAFETY: contract.
            unsafe { v128_store(ptr.cast(), self.0) }
        }

        /// `x` in every lane.
        #[inline(always)]
        pub fn splat(x: f32) -> F32x4 {
            F32x4(f32x4_splat(x))
        }

        /// Lanewise product.
        #[inline(always)]
        pub fn mul(self, rhs: F32x4) -> F32x4 {
            F32x4(f32x4_mul(self.0, rhs.0))
        }

        /// Lanewise sum.
        #[inline(always)]
        pub fn add(self, rhs: F32x4) -> F32x4 {
            F32x4(f32x4_add(self.0, rhs.0))
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod lanes {
    //! The four-lane vector as an array: the same operations, lane by lane,
    //! so the tests run the browser's arithmetic.

    /// Four f32 values.
    #[derive(Clone, Copy)]
    pub(super) struct F32x4([f32; 4]);

    impl F32x4 {
        /// Zeros.
        pub const ZERO: F32x4 = F32x4([0.0; 4]);

        /// The four values at `ptr`.
        ///
        /// # Safety
        ///
        /// Four values are readable at `ptr`.
        pub unsafe fn read(ptr: *const f32) -> F32x4 {
            // SAFETY: contract.
            F32x4(unsafe { ptr.cast::<[f32; 4]>().read_unaligned() })
        }

        /// Writes the lanes to the four values at `ptr`.
        ///
        /// # Safety
        ///
        /// Four values are writable at `ptr`.
        pub unsafe fn write(self, ptr: *mut f32) {
            // SAFETY: contract.
            unsafe { ptr.cast::<[f32; 4]>().write_unaligned(self.0) }
        }

        /// `x` in every lane.
        pub fn splat(x: f32) -> F32x4 {
            F32x4([x; 4])
        }

        /// Lanewise product.
        pub fn mul(self, rhs: F32x4) -> F32x4 {
            F32x4(std::array::from_fn(|l| self.0[l] * rhs.0[l]))
        }

        /// Lanewise sum.
        pub fn add(self, rhs: F32x4) -> F32x4 {
            F32x4(std::array::from_fn(|l| self.0[l] + rhs.0[l]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::matmul::error_bound;
    use crate::ops::strided::proptest_config;
    use proptest::prelude::*;

    /// A matrix in a buffer: row-major, or stored transposed, with `pad`
    /// unused elements after each stored line.
    struct Stored {
        data: Vec<f32>,
        row_stride: usize,
        col_stride: usize,
    }

    impl Stored {
        fn new(rows: usize, cols: usize, transposed: bool, pad: usize, seed: u64) -> Stored {
            let (lines, line) = if transposed {
                (cols, rows)
            } else {
                (rows, cols)
            };
            let data = super::super::tests::values(lines * (line + pad), seed);
            let (row_stride, col_stride) = if transposed {
                (1, line + pad)
            } else {
                (line + pad, 1)
            };
            Stored {
                data,
                row_stride,
                col_stride,
            }
        }

        fn at(&self, i: usize, j: usize) -> f32 {
            self.data[i * self.row_stride + j * self.col_stride]
        }

        fn strided(&self) -> Strided {
            Strided {
                ptr: self.data.as_ptr(),
                row_stride: self.row_stride,
                col_stride: self.col_stride,
            }
        }
    }

    /// Both block products: this module's, and the relaxed kernel's
    /// (natively its lanes are arrays with `f32::mul_add`), with whether
    /// their steps fuse and their blocks' sizes.
    fn products() -> [(&'static str, Product, bool, usize, usize); 2] {
        [
            (
                "plain",
                Product::Plain,
                false,
                BLOCK_PANELS_A * ROWS,
                BLOCK_PANELS_B * COLS,
            ),
            (
                "relaxed",
                Product::Relaxed(kiln_relaxed_kernel::block_product),
                true,
                BLOCK_PANELS_A * RELAXED_ROWS,
                BLOCK_PANELS_B * RELAXED_COLS,
            ),
        ]
    }

    #[test]
    fn the_relaxed_kernel_packs_as_this_module_does() {
        assert_eq!(
            (kiln_relaxed_kernel::ROWS, kiln_relaxed_kernel::COLS),
            (RELAXED_ROWS, RELAXED_COLS)
        );
        assert_eq!(kiln_relaxed_kernel::SCRATCH, RELAXED_ROWS * RELAXED_COLS);
    }

    /// The kernels' arithmetic, one output at a time: each [`DEPTH`]
    /// block's products summed in `k` order from zero (fused multiply-adds
    /// when `fused`, else a multiply, then an add), the block sums added to
    /// `c` in order; the first block's sum replaces `c` unless `accumulate`
    /// (with no blocks, zero does).
    fn blocked_sums(
        (a, b): (&Stored, &Stored),
        (m, k, n): (usize, usize, usize),
        c: &mut [f32],
        ldc: usize,
        accumulate: bool,
        fused: bool,
    ) {
        for i in 0..m {
            for j in 0..n {
                let out = &mut c[i * ldc + j];
                if k == 0 && !accumulate {
                    *out = 0.0;
                }
                for p0 in (0..k).step_by(DEPTH) {
                    let mut sum = 0.0f32;
                    for p in p0..(p0 + DEPTH).min(k) {
                        sum = if fused {
                            a.at(i, p).mul_add(b.at(p, j), sum)
                        } else {
                            sum + a.at(i, p) * b.at(p, j)
                        };
                    }
                    *out = if p0 == 0 && !accumulate {
                        sum
                    } else {
                        *out + sum
                    };
                }
            }
        }
    }

    /// Runs each block product on `c` (row stride `ldc`) and checks it
    /// against [`blocked_sums`], bit for bit, leaving the columns past `n`
    /// alone; returns the products.
    fn check(
        operands: (&Stored, &Stored),
        shape: (usize, usize, usize),
        ldc: usize,
        accumulate: bool,
        seed: u64,
    ) -> Vec<Vec<f32>> {
        let start = super::super::tests::values(shape.0 * ldc, seed);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut results = Vec::new();
        for (name, product, fused, ..) in products() {
            let mut want = start.clone();
            blocked_sums(operands, shape, &mut want, ldc, accumulate, fused);
            let mut got = start.clone();
            // SAFETY: `a` and `b` cover their matrices; `c` is m rows of
            // `ldc ≥ n`; the relaxed product keeps its contract.
            unsafe {
                gemm(
                    product,
                    shape,
                    operands.0.strided(),
                    operands.1.strided(),
                    got.as_mut_ptr(),
                    ldc,
                    accumulate,
                )
            };
            assert_eq!(
                bits(&got),
                bits(&want),
                "{name}: {shape:?}, ldc {ldc}, accumulate {accumulate}"
            );
            results.push(got);
        }
        results
    }

    proptest! {
        #![proptest_config(proptest_config())]
        #[test]
        fn products_of_any_layout_have_the_bits_of_the_blocked_sums(
            m in 1usize..13,
            k in prop_oneof![0usize..20, (DEPTH - 2)..(DEPTH + 20)],
            n in 1usize..27,
            a_transposed in any::<bool>(),
            b_transposed in any::<bool>(),
            pads in (0usize..3, 0usize..3, 0usize..3),
            accumulate in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let a = Stored::new(m, k, a_transposed, pads.0, seed);
            let b = Stored::new(k, n, b_transposed, pads.1, seed ^ 0x5555);
            check((&a, &b), (m, k, n), n + pads.2, accumulate, seed ^ 0xaaaa);
        }
    }

    #[test]
    fn products_crossing_every_block_edge_are_within_the_error_bound() {
        // Every loop of both products runs more than once and ends on a
        // partial tile.
        let [(_, _, _, rows_a, cols_a), (_, _, _, rows_b, cols_b)] = products();
        let shape @ (m, k, n) = (rows_a.max(rows_b) + 5, DEPTH + 3, cols_a.max(cols_b) + 9);
        let a = Stored::new(m, k, false, 0, 1);
        let b = Stored::new(k, n, true, 1, 2);
        for got in check((&a, &b), shape, n, false, 3) {
            for i in 0..m {
                for j in 0..n {
                    let products = (0..k).map(|p| f64::from(a.at(i, p)) * f64::from(b.at(p, j)));
                    let exact: f64 = products.clone().sum();
                    let bound = error_bound(k, products.map(f64::abs).sum());
                    let error = (f64::from(got[i * n + j]) - exact).abs();
                    assert!(error <= bound, "({i}, {j}): error {error} > bound {bound}");
                }
            }
        }
    }

    #[test]
    fn a_product_over_no_terms_zeros_c_or_leaves_it() {
        let a = Stored::new(3, 0, false, 0, 1);
        let b = Stored::new(0, 5, false, 0, 2);
        let start = super::super::tests::values(3 * 6, 3);
        for ((name, product, ..), accumulate) in
            products().into_iter().flat_map(|p| [(p, false), (p, true)])
        {
            let mut c = start.clone();
            // SAFETY: `c` is 3 rows of 6 ≥ 5 elements; no element of a or b is read.
            unsafe {
                gemm(
                    product,
                    (3, 0, 5),
                    a.strided(),
                    b.strided(),
                    c.as_mut_ptr(),
                    6,
                    accumulate,
                )
            };
            for (i, (got, was)) in c.iter().zip(&start).enumerate() {
                let want = if accumulate || i % 6 == 5 { *was } else { 0.0 };
                assert_eq!(got.to_bits(), want.to_bits(), "{name}: element {i}");
            }
        }
    }
}
