//! The CPU kernels of `quantized_matmul` and `gather_qmm`: the packed codes
//! are decoded as they are used and the dequantized matrix never exists.
//!
//! * Few rows of `x` (fewer than [`PANEL_MIN_ROWS`]) and `x @ wᵀ` in f32:
//!   the codes are unpacked in vector lanes with shifts and masks (one
//!   word per lane; for 3-, 5- and 6-bit codes the `bits` words of 32
//!   codes per lane) and multiplied into `x` permuted once into the same
//!   lane order, each group's sum scaled once: one pass over the codes.
//!   In the portable kernels (wasm32's, vectorized for simd128), 2- and
//!   4-bit codes are masked in place, `x` scaled to match.
//!   With AVX-512, 2- and 4-bit codes (affine, and NF4)
//!   index a 16-entry table of their group's decoded values held in a
//!   register (`vpermps`): a shift, a lookup and an FMA per 16 codes; with
//!   AVX2, 2-bit codes an 8-entry one, 4-bit affine codes are moved
//!   into place by byte shuffles, and NF4 codes look up each byte of
//!   their levels with one. With either unit, 3-, 5- and 6-bit codes
//!   in groups of 32, 64 or 128 have kernels of their own that transpose a
//!   run's words into the lanes by permutes, and int8 codes are widened
//!   from bytes by one load each eight, `x` left in its own order.
//! * More rows: a panel of decoded weights (for `x @ wᵀ` at most
//!   [`PANEL_ROWS`] rows by [`PANEL_DEPTH`] columns, transposed in place
//!   so that the GEMM reads it without packing; cache-resident) feeds the
//!   dense GEMM microkernels, so each decoded tile serves every row of `x`
//!   (4-bit rows are decoded with the same table lookups).
//! * Otherwise (`x @ w` with few rows, f16/bf16 weights) one decoded row
//!   at a time.
//!
//! Output columns are split across [`crate::exec::cpu_threads`] threads.
//! Sums are blocked and may use FMA, and the kernels that decode by
//! arithmetic or look up unscaled levels (all but the tables of a group's
//! decoded values) sum `level·x` per group and scale the sum once, the
//! biases' share `Σ b·Σ x` taken from the group sums of `x`
//! ([`PermutedRow`]): outputs agree with dequantize → matmul
//! within the bound `quant` states, `error_bound(k + 4, Σ (|s·c| + |b|)·|x|)`
//! ([`super::matmul::error_bound`]).

use super::product::{self, Product, View};
use super::quant::{QuantFormat, Weight, NF4_LEVELS};
use crate::threads::for_each_task;
use crate::DType;
use std::ops::Range;
use std::sync::OnceLock;

/// Rows of `x` from which the product goes through decoded panels and
/// the GEMM microkernels.
const PANEL_MIN_ROWS: usize = 4;

/// Weight rows decoded into one panel.
const PANEL_ROWS: usize = 64;

/// Columns of `x @ wᵀ`'s panels (rounded up to whole groups): with
/// [`PANEL_ROWS`] rows, 64 KiB as decoded and as many transposed, held in
/// a core's L2 cache between the two. On an AMD EPYC (Zen 5) at one thread
/// 64×4096·(4096×4096)ᵀ in 4 bits took 15.1–15.2 ms so, 16.6–17.2 at 512
/// or 1,024 columns and 15.6–15.7 with whole rows.
const PANEL_DEPTH: usize = 256;

/// Code units unpacked side by side: one AVX-512 register of u32 lanes.
const LANES: usize = 16;

/// Words per block of [`aligned_row`]: eight lanes of 32 bits, one AVX2
/// register.
const BLOCK: usize = 8;

/// Multiply-adds under which a product runs on one thread.
const PARALLEL_MIN_WORK: usize = 1 << 20;

/// Column bands a split product makes per thread.
const TASKS_PER_THREAD: usize = 8;

/// The products `x[i] @ w[j](ᵀ)` for each `(i, j)` of `pairs`, one output
/// matrix after another; `x` holds row-major `[m, k]` matrices.
pub(super) fn product(
    x: &[f32],
    (m, k): (usize, usize),
    w: &Weight,
    transpose: bool,
    pairs: &[(usize, usize)],
) -> Vec<f32> {
    let n = if transpose { w.rows_per_matrix } else { w.cols };
    let mut out = crate::pool::zeroed_f32(pairs.len() * m * n);
    if m * n == 0 || k == 0 {
        return out;
    }
    let threads = crate::exec::cpu_threads();
    let tasks = if threads == 1 || m * n * k * pairs.len() < PARALLEL_MIN_WORK {
        1
    } else {
        // Several bands per thread, claimed one at a time (see
        // `for_each_task`).
        threads * TASKS_PER_THREAD
    };
    // Bands of whole groups for `x @ w`, so a band decodes only its own
    // groups; of whole panels where the panels serve several rows.
    let align = match (transpose, m >= PANEL_MIN_ROWS) {
        (false, _) => w.format.group_size().unwrap_or(4),
        (true, true) => PANEL_ROWS,
        (true, false) => 1,
    };
    let band = n.div_ceil(tasks).next_multiple_of(align).min(n);
    let isa = Isa::detect();
    let bands: Vec<Range<usize>> = (0..n).step_by(band).map(|c| c..(c + band).min(n)).collect();
    for (c, &(i, j)) in out.chunks_exact_mut(m * n).zip(pairs) {
        let a = &x[i * m * k..(i + 1) * m * k];
        // x permuted into the codes' lane order once per product, not once
        // per band.
        let fused = transpose && m < PANEL_MIN_ROWS && w.dtype == DType::F32;
        let permuted = if fused {
            a.chunks_exact(k)
                .map(|row| PermutedRow::new(row, w.format, isa))
                .collect()
        } else {
            Vec::new()
        };
        let matrix = Matrix {
            w,
            isa,
            first_row: j * w.rows_per_matrix,
            m,
            k,
            permuted,
        };
        let results: Vec<OnceLock<Vec<f32>>> = bands.iter().map(|_| OnceLock::new()).collect();
        for_each_task(bands.len(), |b| {
            results[b].get_or_init(|| matrix.band(a, transpose, bands[b].clone()));
        });
        for (cols, result) in bands.iter().zip(&results) {
            // Every task has run when `for_each_task` returns.
            let result = result.get().map_or(&[][..], Vec::as_slice);
            for (row, band_row) in c.chunks_exact_mut(n).zip(result.chunks_exact(cols.len())) {
                row[cols.clone()].copy_from_slice(band_row);
            }
        }
    }
    out
}

/// One weight matrix of a product.
struct Matrix<'w, 'a> {
    w: &'w Weight<'a>,
    /// The vector unit whose kernels run, detected once per product.
    isa: Isa,
    first_row: usize,
    m: usize,
    k: usize,
    /// The rows of x as the fused kernels read them, where the product
    /// takes the fused path, else empty.
    permuted: Vec<PermutedRow>,
}

/// One row of `x` as [`fused_dot`] reads it: [`permute`]d into the codes'
/// lane order (int8 codes that [`int8_avx2`] takes read it as it is:
/// [`widens_int8`]), and for the affine format the sum of each group's values,
/// so that kernels can take the bias out of each group
/// (`Σ (s·c + b)·x = s·Σ c·x + b·Σ x`).
pub(super) struct PermutedRow {
    values: Vec<f32>,
    group_sums: Vec<f32>,
    /// For the portable kernels of 2- and 4-bit affine codes, `values` with
    /// code `j`'s values scaled by `2^-(bits·(j mod 4))`, which lets
    /// [`block_dot`] mask codes in place; empty otherwise, and where some
    /// value would leave the normal range ([`codes_in_place`]).
    in_place_values: Vec<f32>,
}

impl PermutedRow {
    /// `x` (one row of length k) for weights of `format`, laid out for the
    /// kernels of `isa`.
    pub(super) fn new(x: &[f32], format: QuantFormat, isa: Isa) -> PermutedRow {
        let group_sums = match format {
            QuantFormat::Affine { group_size, .. } => x
                .chunks(group_size.max(1))
                .map(|g| g.iter().sum())
                .collect(),
            _ => Vec::new(),
        };
        let values = if widens_int8(format, x.len(), isa) {
            x.to_vec()
        } else {
            permute(x, format)
        };
        let in_place_values = match isa {
            Isa::Portable => codes_in_place(&values, format).unwrap_or_default(),
            #[cfg(target_arch = "x86_64")]
            _ => Vec::new(),
        };
        PermutedRow {
            values,
            group_sums,
            in_place_values,
        }
    }

    /// The same row without the layout for codes masked in place, so that
    /// tests can hold the two kernels side by side.
    #[cfg(test)]
    pub(super) fn shifting_codes_only(&self) -> PermutedRow {
        PermutedRow {
            values: self.values.clone(),
            group_sums: self.group_sums.clone(),
            in_place_values: Vec::new(),
        }
    }

    /// Whether the portable kernels mask this row's codes in place.
    #[cfg(test)]
    pub(super) fn masks_codes_in_place(&self) -> bool {
        !self.in_place_values.is_empty()
    }
}

/// `values` ([`permute`]d for 2- or 4-bit affine codes, `[group][j][word]`)
/// with code `j`'s values scaled by `2^-(bits·(j mod 4))`: [`block_dot`]
/// then multiplies code `j` masked in place (`c·2^(bits·(j mod 4))`, below
/// 2¹⁶, converted exactly) into it, one shift per value fewer, and each
/// product is the real number `c·x` rounded as before. `None` for other
/// formats, and where a value other than zero lies below
/// `2^(3·bits − 126)` (or is NaN): scaled, it would leave the normal range
/// and lose bits, so the row keeps the shifting kernel.
fn codes_in_place(values: &[f32], format: QuantFormat) -> Option<Vec<f32>> {
    let QuantFormat::Affine {
        bits: bits @ (2 | 4),
        group_size,
    } = format
    else {
        return None;
    };
    let bits = bits as i32;
    let smallest = 2f32.powi(3 * bits - 126);
    if !values.iter().all(|&v| v == 0.0 || v.abs() >= smallest) {
        return None;
    }
    let per_word = 32 / bits as usize;
    let group_words = (group_size / per_word).max(1);
    let scaled = values
        .chunks(group_words)
        .enumerate()
        .flat_map(|(c, code_j)| {
            let factor = 2f32.powi(-bits * (c % per_word % 4) as i32);
            code_j.iter().map(move |v| v * factor)
        })
        .collect();
    Some(scaled)
}

impl Matrix<'_, '_> {
    /// The output columns `cols` of `a @ w(ᵀ)`, row-major `[m, cols.len()]`.
    fn band(&self, a: &[f32], transpose: bool, cols: Range<usize>) -> Vec<f32> {
        let (m, k) = (self.m, self.k);
        let width = cols.len();
        let mut out = vec![0.0f32; m * width];
        let isa = self.isa;
        if !self.permuted.is_empty() {
            for (t, r) in cols.clone().enumerate() {
                let row = self.first_row + r;
                for (i, x) in self.permuted.iter().enumerate() {
                    out[i * width + t] = fused_dot(isa, self.w, row, x);
                }
            }
        } else if m >= PANEL_MIN_ROWS {
            self.panels(isa, a, transpose, cols, &mut out);
        } else if transpose {
            let mut decoded = vec![0.0f32; k];
            for (t, r) in cols.clone().enumerate() {
                self.w.decode_cols(self.first_row + r, 0, &mut decoded);
                for (i, a_row) in a.chunks_exact(k).enumerate() {
                    out[i * width + t] = dot(a_row, &decoded);
                }
            }
        } else {
            let mut decoded = vec![0.0f32; width];
            for kk in 0..k {
                decode_row(isa, self.w, self.first_row + kk, cols.start, &mut decoded);
                for (i, o) in out.chunks_exact_mut(width).enumerate() {
                    axpy(a[i * k + kk], &decoded, o);
                }
            }
        }
        out
    }

    /// [`Matrix::band`] through decoded panels and the GEMM microkernels.
    fn panels(&self, isa: Isa, a: &[f32], transpose: bool, cols: Range<usize>, out: &mut [f32]) {
        let (m, k) = (self.m, self.k);
        let (cols_start, width) = (cols.start, cols.len());
        if transpose {
            // A panel holds `depth` columns of up to PANEL_ROWS weight rows,
            // decoded row by row and transposed to `[depth, rows]`, which
            // the GEMM reads in place. Handed the rows themselves, the
            // `gemm` crate packed them through their transpose an element
            // at a time, four times its microkernel's time: 64×4096 ·
            // (4096×4096)ᵀ in 4 bits took 37.7 ms at one thread on an AMD
            // EPYC (Zen 5) against 15.1 so, and 26.6 at two against 7.0.
            // Where the GEMM packs every layout alike (wasm32) the rows are
            // handed over whole and read transposed: there, 256-column
            // chunks made the 4-bit product 12% slower in Chromium.
            let group = self.w.format.group_size().unwrap_or(1);
            let depth = if product::PACKS_EVERY_LAYOUT {
                k
            } else {
                PANEL_DEPTH.next_multiple_of(group).min(k)
            };
            let most = PANEL_ROWS.min(width);
            let mut rows_first = vec![0.0f32; most * depth];
            let mut panel = match product::PACKS_EVERY_LAYOUT {
                true => Vec::new(),
                false => vec![0.0f32; most * depth],
            };
            let mut block = vec![0.0f32; m * most];
            for first in (0..width).step_by(PANEL_ROWS) {
                let rows = PANEL_ROWS.min(width - first);
                let block = &mut block[..m * rows];
                for k0 in (0..k).step_by(depth) {
                    let cols = depth.min(k - k0);
                    let decoded = &mut rows_first[..rows * cols];
                    for (t, row) in decoded.chunks_exact_mut(cols).enumerate() {
                        let r = self.first_row + cols_start + first + t;
                        decode_row(isa, self.w, r, k0, row);
                    }
                    let b = if product::PACKS_EVERY_LAYOUT {
                        View::row_major(decoded, cols).transposed()
                    } else {
                        let panel = &mut panel[..rows * cols];
                        product::transpose(decoded, (rows, cols), panel);
                        View::row_major(panel, rows)
                    };
                    let job = Product {
                        m,
                        k: cols,
                        n: rows,
                        a: View {
                            data: &a[k0..],
                            row_stride: k,
                            col_stride: 1,
                        },
                        b,
                        accumulate: k0 > 0,
                    };
                    product::run_on_this_thread(&job, block);
                }
                for (o, b) in out.chunks_exact_mut(width).zip(block.chunks_exact(rows)) {
                    o[first..first + rows].copy_from_slice(b);
                }
            }
        } else {
            // A panel holds PANEL_DEPTH rows of w restricted to a block
            // of the band's columns (whole groups: bands and blocks start
            // on group boundaries), `[depth, columns]`, which the GEMM
            // reads in place, accumulated into the block's outputs. Blocks
            // keep those outputs cache-resident across the panels: with
            // panels of four rows across a band's whole width, 64×4096 ·
            // 4096×4096 in 4 bits took 26.7 ms at one thread on an AMD EPYC
            // (Zen 5), and takes 12.3 so.
            let group = self.w.format.group_size().unwrap_or(1);
            let most = PANEL_DEPTH.next_multiple_of(group).min(width);
            let depth = PANEL_DEPTH.min(k);
            let mut panel = vec![0.0f32; depth * most];
            let mut block = vec![0.0f32; m * most];
            for first in (0..width).step_by(most) {
                let columns = most.min(width - first);
                let block = &mut block[..m * columns];
                for k0 in (0..k).step_by(depth) {
                    let rows = depth.min(k - k0);
                    let panel = &mut panel[..rows * columns];
                    for (t, decoded) in panel.chunks_exact_mut(columns).enumerate() {
                        let row = self.first_row + k0 + t;
                        decode_row(isa, self.w, row, cols_start + first, decoded);
                    }
                    let job = Product {
                        m,
                        k: rows,
                        n: columns,
                        a: View {
                            data: &a[k0..],
                            row_stride: k,
                            col_stride: 1,
                        },
                        b: View::row_major(panel, columns),
                        accumulate: k0 > 0,
                    };
                    product::run_on_this_thread(&job, block);
                }
                for (o, b) in out.chunks_exact_mut(width).zip(block.chunks_exact(columns)) {
                    o[first..first + columns].copy_from_slice(b);
                }
            }
        }
    }
}

/// `Σ a_i·b_i` in eight independent partial sums.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    product::lane_dot::<8>(a, b)
}

/// `out += s·v`.
fn axpy(s: f32, v: &[f32], out: &mut [f32]) {
    for (o, &q) in out.iter_mut().zip(v) {
        *o += s * q;
    }
}

/// Words per code unit and codes per unit of `bits`-bit codes: one word
/// when codes never straddle words, else the `bits` words of 32 codes.
const fn unit(bits: u32) -> (usize, usize) {
    if 32 % bits == 0 {
        (1, 32 / bits as usize)
    } else {
        (bits as usize, 32)
    }
}

/// `x` (one row of length k) in the order [`fused_dot`] reads it where it
/// takes codes from words (all but [`int8_avx2`]). Codes that never
/// straddle words: group by group, code `j` of every word of
/// the group, word by word (`[group][j][word]`; int8's group is the
/// row). Otherwise, for each run of [`LANES`] units, code `j` of every
/// lane's unit, lane by lane; the tail after the last full run stays in
/// order.
fn permute(x: &[f32], format: QuantFormat) -> Vec<f32> {
    let (words_per_unit, codes) = unit(format.bits());
    if words_per_unit == 1 {
        let group = format.group_size().unwrap_or(x.len()).max(1);
        let group_words = group / codes;
        return x
            .chunks_exact(group)
            .flat_map(|g| {
                (0..codes).flat_map(move |j| (0..group_words).map(move |w| g[w * codes + j]))
            })
            .collect();
    }
    let run = LANES * codes;
    let full = x.len() / run * run;
    let mut out = Vec::with_capacity(x.len());
    for chunk in x[..full].chunks_exact(run) {
        for j in 0..codes {
            out.extend((0..LANES).map(|l| chunk[l * codes + j]));
        }
    }
    out.extend_from_slice(&x[full..]);
    out
}

/// Whether [`int8_avx2`] takes int8 rows of `cols` codes on `isa`: a
/// whole number of its steps, with a vector unit. Its `x` keeps its own
/// order.
fn widens_int8(format: QuantFormat, cols: usize, isa: Isa) -> bool {
    let vector_unit = match isa {
        Isa::Portable => false,
        #[cfg(target_arch = "x86_64")]
        _ => true,
    };
    vector_unit && format == QuantFormat::Int8 && cols > 0 && cols.is_multiple_of(INT8_STEP)
}

/// Codes a step of [`int8_avx2`] takes: four vectors of eight.
const INT8_STEP: usize = 32;

/// The vector unit the kernels of one band use, chosen once per band by
/// [`Isa::detect`]: a variant exists only where the CPU has that unit.
#[derive(Clone, Copy, Debug)]
#[repr(u8)]
pub(super) enum Isa {
    /// Scalar code that the compiler may vectorize for the build target.
    Portable = 0,
    /// AVX2 and FMA: eight f32 lanes.
    #[cfg(target_arch = "x86_64")]
    Avx2 = 1,
    /// AVX-512F/BW: sixteen f32 lanes.
    #[cfg(target_arch = "x86_64")]
    Avx512 = 2,
}

impl Isa {
    /// The widest unit this CPU has (the check is a cached load), no wider
    /// than AVX2 without the `avx512` feature, nor than `WIDEST_ISA` in
    /// unit tests.
    fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            #[cfg(test)]
            let cap = WIDEST_ISA.load(std::sync::atomic::Ordering::Relaxed);
            #[cfg(not(test))]
            let cap = Isa::Avx512 as u8;
            if cfg!(feature = "avx512")
                && cap >= Isa::Avx512 as u8
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
            {
                return Isa::Avx512;
            }
            if cap >= Isa::Avx2 as u8
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }
}

/// Set by unit tests to an [`Isa`] (as `u8`) to run the kernels of a
/// narrower unit than the CPU has, which would otherwise always take the
/// widest: so every kernel is tested on a CPU with AVX-512.
#[cfg(test)]
pub(super) static WIDEST_ISA: std::sync::atomic::AtomicU8 =
    std::sync::atomic::AtomicU8::new(u8::MAX);

/// Every [`Isa`] this build has kernels for, narrowest first.
#[cfg(test)]
pub(super) const ISAS: &[Isa] = &[
    Isa::Portable,
    #[cfg(target_arch = "x86_64")]
    Isa::Avx2,
    #[cfg(target_arch = "x86_64")]
    Isa::Avx512,
];

/// `x · w[row]`, decoding the codes in registers with the kernels of
/// `isa`, or on wasm32 with the relaxed kernel module's row dot where the
/// host handed it over and it takes the format.
pub(super) fn fused_dot(isa: Isa, w: &Weight, row: usize, x: &PermutedRow) -> f32 {
    #[cfg(target_arch = "wasm32")]
    if let Some(dot) = crate::ops::relaxed::kernels()
        .and_then(|kernels| relaxed_affine_dot(kernels.affine_codes_dot, w, row, x))
    {
        return dot;
    }
    match w.format {
        QuantFormat::Affine { bits: 2, .. } => dispatch::<2, 0>(isa, w, row, x),
        QuantFormat::Affine { bits: 3, .. } => dispatch::<3, 0>(isa, w, row, x),
        QuantFormat::Affine { bits: 4, .. } => dispatch::<4, 0>(isa, w, row, x),
        QuantFormat::Affine { bits: 5, .. } => dispatch::<5, 0>(isa, w, row, x),
        QuantFormat::Affine { bits: 6, .. } => dispatch::<6, 0>(isa, w, row, x),
        QuantFormat::Affine { .. } => dispatch::<8, 0>(isa, w, row, x),
        QuantFormat::Nf4 => dispatch::<4, 1>(isa, w, row, x),
        QuantFormat::Int8 => dispatch::<8, 2>(isa, w, row, x),
    }
}

/// `x · w[row]` with the codes' share on `dot`, the relaxed kernel
/// module's row dot, for the affine formats it takes (2, 4 or 8 bits in
/// groups of a multiple of four words), and the biases' share
/// ([`bias_share`]); `None` for any other format.
#[cfg(any(target_arch = "wasm32", test))]
pub(super) fn relaxed_affine_dot(
    dot: crate::ops::relaxed::AffineCodesDot,
    w: &Weight,
    row: usize,
    x: &PermutedRow,
) -> Option<f32> {
    let xp = x.values.as_slice();
    let QuantFormat::Affine {
        bits: bits @ (2 | 4 | 8),
        group_size,
    } = w.format
    else {
        return None;
    };
    let per_word = (32 / bits) as usize;
    let group_words = group_size / per_word;
    if !group_words.is_multiple_of(4) || w.dtype != DType::F32 || xp.len() != w.cols {
        return None;
    }
    let words = row_words(w, row);
    let (scales, _) = row_scales(w, row);
    // SAFETY: `dot` keeps the contract of `AffineCodesDot` (the host's
    // promise to `use_relaxed_kernels`, or the kernel crate's own function
    // in tests); it reads `groups_per_row` groups of `group_words` words,
    // of `group_size` values of `xp` and one scale each: the row's slices,
    // whole.
    let codes = unsafe {
        dot(
            bits,
            words.as_ptr(),
            xp.as_ptr(),
            scales.as_ptr(),
            w.groups_per_row,
            group_words,
        )
    };
    Some(codes + bias_share(w, row, x))
}

/// [`row_kernel`] compiled for `isa`, or for 2-bit affine and 4-bit codes
/// (affine and NF4) in groups of a word layout it has one for, its
/// table-lookup kernel ([`lut_avx512`], [`affine2_avx2`], and for 2-bit
/// groups of 32 on either unit [`affine2_pairs_avx2`]) or with AVX2 for
/// 4-bit codes its byte-shuffle kernel ([`affine4_avx2`], [`nf4_avx2`]),
/// for 3-, 5- and 6-bit affine codes in groups of 32, 64 or 128 its
/// straddling kernel ([`straddling_avx512`], [`straddling_avx2`]), and
/// for int8 codes on either unit the widening kernel ([`int8_avx2`]).
/// `KIND`: 0 affine, 1 NF4, 2 int8.
fn dispatch<const BITS: u32, const KIND: u8>(
    isa: Isa,
    w: &Weight,
    row: usize,
    x: &PermutedRow,
) -> f32 {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
    fn avx512<const BITS: u32, const KIND: u8>(w: &Weight, row: usize, x: &PermutedRow) -> f32 {
        row_kernel::<BITS, KIND, true>(w, row, x)
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn avx2<const BITS: u32, const KIND: u8>(w: &Weight, row: usize, x: &PermutedRow) -> f32 {
        row_kernel::<BITS, KIND, true>(w, row, x)
    }
    // The lookup kernels read `x` alone; the others add the biases' share
    // from its group sums.
    #[cfg(target_arch = "x86_64")]
    let xp = x.values.as_slice();
    // Whether the straddling kernels take the format: codes across words,
    // in groups of one, two or four units.
    #[cfg(target_arch = "x86_64")]
    let straddling =
        32 % BITS != 0 && KIND == 0 && matches!(w.format.group_size(), Some(32 | 64 | 128));
    // Whether the widening kernel takes the row: int8, whole steps.
    #[cfg(target_arch = "x86_64")]
    let widened = KIND == 2 && widens_int8(w.format, w.cols, isa);
    // Words per group of the formats the lookup kernels take; none for
    // the other formats.
    #[cfg(target_arch = "x86_64")]
    let lut_words = ((BITS == 4 && KIND < 2) || (BITS == 2 && KIND == 0))
        .then(|| w.format.group_size().unwrap_or(w.cols) / (32 / BITS) as usize)
        .filter(|&g| g > 0);
    // SAFETY (every call below): `Isa::detect` names a unit only where the
    // CPU has it (AVX-512F/BW implies AVX2 and FMA).
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe {
            match lut_words {
                Some(4) => lut_avx512::<BITS, KIND, 4>(w, row, xp),
                Some(8) => lut_avx512::<BITS, KIND, 8>(w, row, xp),
                Some(g) if g.is_multiple_of(16) => lut_avx512::<BITS, KIND, 16>(w, row, xp),
                // Two words a group: the AVX2 kernel, a table per half.
                Some(2) if BITS == 2 => affine2_pairs_avx2(w, row, xp),
                None if straddling => straddling_avx512::<BITS>(w, row, x),
                _ if widened => int8_avx2(w, row, x),
                _ => avx512::<BITS, KIND>(w, row, x),
            }
        },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe {
            match (BITS, lut_words) {
                (4, Some(4)) if KIND == 0 => affine4_avx2::<4>(w, row, x),
                (4, Some(g)) if KIND == 0 && g.is_multiple_of(8) => affine4_avx2::<8>(w, row, x),
                (4, Some(8)) if KIND == 1 => nf4_avx2(w, row, xp),
                (2, Some(2)) => affine2_pairs_avx2(w, row, xp),
                (2, Some(4)) => affine2_avx2::<4>(w, row, xp),
                (2, Some(g)) if g.is_multiple_of(8) => affine2_avx2::<8>(w, row, xp),
                (_, None) if straddling => straddling_avx2::<BITS>(w, row, x),
                _ if widened => int8_avx2(w, row, x),
                _ => avx2::<BITS, KIND>(w, row, x),
            }
        },
        Isa::Portable => portable::<BITS, KIND>(w, row, x),
    }
}

/// [`row_kernel`] without FMA (the kernels wasm32 runs), a function of its
/// own: inlined into [`fused_dot`] beside every other format's, its loops
/// ran 1.5× slower in V8.
#[inline(never)]
fn portable<const BITS: u32, const KIND: u8>(w: &Weight, row: usize, x: &PermutedRow) -> f32 {
    row_kernel::<BITS, KIND, false>(w, row, x)
}

/// [`aligned_row`] (masking codes in place where the row has the layout
/// for it) or [`fused_row`], by whether codes straddle words, and the
/// biases' share ([`bias_share`]).
#[inline(always)]
fn row_kernel<const BITS: u32, const KIND: u8, const FMA: bool>(
    w: &Weight,
    row: usize,
    x: &PermutedRow,
) -> f32 {
    let scaled = if 32 % BITS != 0 {
        fused_row::<BITS, KIND, FMA>(w, row, &x.values)
    } else if KIND == 0 && BITS <= 4 && !x.in_place_values.is_empty() {
        aligned::<BITS, KIND, FMA, true>(w, row, &x.in_place_values)
    } else {
        aligned::<BITS, KIND, FMA, false>(w, row, &x.values)
    };
    scaled + bias_share(w, row, x)
}

/// [`aligned_row`] for the row's words per group: every affine group size
/// gets kernels of its own, so that with the words per group known the
/// loops over a group unroll and take constant shifts (1.8× faster for
/// 4-bit groups of 64 in V8). Int8's group is the row.
#[inline(always)]
fn aligned<const BITS: u32, const KIND: u8, const FMA: bool, const IN_PLACE: bool>(
    w: &Weight,
    row: usize,
    xp: &[f32],
) -> f32 {
    let group = w.format.group_size().unwrap_or(w.cols);
    match group / (32 / BITS) as usize {
        2 => aligned_row::<BITS, KIND, FMA, IN_PLACE, 2>(w, row, xp),
        4 => aligned_row::<BITS, KIND, FMA, IN_PLACE, 4>(w, row, xp),
        8 => aligned_row::<BITS, KIND, FMA, IN_PLACE, 8>(w, row, xp),
        16 => aligned_row::<BITS, KIND, FMA, IN_PLACE, 16>(w, row, xp),
        32 => aligned_row::<BITS, KIND, FMA, IN_PLACE, 32>(w, row, xp),
        _ => aligned_row::<BITS, KIND, FMA, IN_PLACE, 0>(w, row, xp),
    }
}

/// `Σ_g b_g·Σ_{i∈g} x_i`, the biases' share of `x · w[row]` (0 without
/// biases), from the group sums of `x`: the kernels that factor each
/// group's bias out (`Σ (s·c + b)·x = s·Σ c·x + b·Σ x`) sum the codes'
/// share alone, one multiply-add per code where decoding took two.
fn bias_share(w: &Weight, row: usize, x: &PermutedRow) -> f32 {
    row_scales(w, row)
        .1
        .map_or(0.0, |biases| dot(biases, &x.group_sums))
}

/// `a·b + c`, fused into one rounding where the target has FMA (without
/// it, `mul_add` is a slow library call).
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// The value that `code` (`BITS` wide, in the low bits) stands for before
/// its group's scale: the code itself (affine; the bias is left to
/// [`bias_share`]), its NF4 level, or the signed byte (int8).
#[inline(always)]
fn level<const BITS: u32, const KIND: u8>(code: u32) -> f32 {
    match KIND {
        0 => code as f32,
        1 => NF4_LEVELS[(code & 15) as usize],
        _ => f32::from(code as u8 as i8),
    }
}

/// `Σ_g s_g·Σ_{i∈g} level(c_i)·x_i` ([`level`]) for codes that never
/// straddle words, in blocks of eight words (a loop the compiler
/// vectorizes, one lane per word): for each code position `j`, every word
/// of the block is unpacked (one shift, mask and convert per lane; a mask
/// and a convert for codes masked in place) and multiplied into `x`, into
/// partial sum `j mod 4`; each group's sums are
/// scaled once. A group of eight words or more is a whole number of blocks
/// where the word count allows (the rest one code at a time); groups of
/// two or four words share a block, lane `l` reading word
/// `l mod GROUP_WORDS` of the block's group `l / GROUP_WORDS`, and each
/// block's sums are scaled lane by lane. With one partial sum, each code
/// waited on the last FMA, and groups of four words ran four lanes: for a
/// 4096×4096 weight at one thread on an Intel Xeon, 2-bit (groups of 64)
/// took 5.7–5.8 ms and 1.5–1.7 after, 8-bit 2.8–3.2 and 1.6–1.9 after,
/// int8 3.1–3.3 and 1.9–2.1 after.
///
/// `IN_PLACE`: `xp` is the row's layout for codes masked in place
/// ([`codes_in_place`]); in Chromium the 4-bit GEMV of a 4096×4096 weight
/// took 2,975–3,300 µs with it against 3,200–3,425 shifting (the two page
/// modules alternated eight times in one page; two rounds of the shifting
/// one, disturbed, read 4,225 and 6,125).
/// `GROUP_WORDS`: the words per group, or 0 for a kernel that reads it
/// from the format.
#[inline(always)]
fn aligned_row<
    const BITS: u32,
    const KIND: u8,
    const FMA: bool,
    const IN_PLACE: bool,
    const GROUP_WORDS: usize,
>(
    w: &Weight,
    row: usize,
    xp: &[f32],
) -> f32 {
    let per_word = (32 / BITS) as usize;
    let words = row_words(w, row);
    let group_words = if GROUP_WORDS > 0 {
        GROUP_WORDS
    } else {
        w.format.group_size().unwrap_or(w.cols) / per_word
    };
    let group = group_words * per_word;
    let (scales, _) = row_scales(w, row);
    let mut scaled = [0.0f32; BLOCK];
    let mut tail = 0.0f32;
    // Σ level·x of the codes of word `k` of group `g`, one at a time, for
    // words a block does not take.
    let one_by_one = |g: usize, k: usize| {
        let mut sum = 0.0f32;
        for j in 0..per_word {
            // As `block_dot` reads it: the word shifted down to code `j`'s
            // step of four, then code `j mod 4` of it.
            let step = words[g * group_words + k] >> (j as u32 / 4 * 4 * BITS);
            sum = madd::<FMA>(
                code_of::<BITS, KIND, IN_PLACE>(step, j as u32 % 4 * BITS),
                xp[g * group + j * group_words + k],
                sum,
            );
        }
        sum
    };
    if GROUP_WORDS > 0 && GROUP_WORDS < BLOCK {
        let groups_per_block = BLOCK / GROUP_WORDS;
        let blocks = words
            .chunks_exact(BLOCK)
            .zip(xp.chunks_exact(BLOCK * per_word));
        let full_blocks = blocks.len();
        for (p, (block, x)) in blocks.enumerate() {
            let block = block.try_into().expect("a block of BLOCK words");
            let first = p * groups_per_block;
            let mut sums = [[0.0f32; BLOCK]; 4];
            block_dot::<BITS, KIND, FMA, IN_PLACE>(block, &mut sums, |j| {
                std::array::from_fn(|l| {
                    x[l / GROUP_WORDS * group + j * GROUP_WORDS + l % GROUP_WORDS]
                })
            });
            for l in 0..BLOCK {
                let lane = (sums[0][l] + sums[1][l]) + (sums[2][l] + sums[3][l]);
                scaled[l] = madd::<FMA>(scales[first + l / GROUP_WORDS], lane, scaled[l]);
            }
        }
        let first_left = full_blocks * groups_per_block;
        for (g, &scale) in scales.iter().enumerate().skip(first_left) {
            let sum: f32 = (0..group_words).map(|k| one_by_one(g, k)).sum();
            tail = madd::<FMA>(scale, sum, tail);
        }
    } else {
        let full = group_words / BLOCK * BLOCK;
        for (g, (gwords, x)) in words
            .chunks_exact(group_words)
            .zip(xp.chunks_exact(group))
            .enumerate()
        {
            let mut sums = [[0.0f32; BLOCK]; 4];
            for (c, block) in gwords[..full].chunks_exact(BLOCK).enumerate() {
                let block = block.try_into().expect("a block of BLOCK words");
                block_dot::<BITS, KIND, FMA, IN_PLACE>(block, &mut sums, |j| {
                    let start = j * group_words + c * BLOCK;
                    x[start..start + BLOCK].try_into().expect("BLOCK values")
                });
            }
            for l in 0..BLOCK {
                let lane = (sums[0][l] + sums[1][l]) + (sums[2][l] + sums[3][l]);
                scaled[l] = madd::<FMA>(scales[g], lane, scaled[l]);
            }
            if full < group_words {
                let sum: f32 = (full..group_words).map(|k| one_by_one(g, k)).sum();
                tail = madd::<FMA>(scales[g], sum, tail);
            }
        }
    }
    scaled.iter().sum::<f32>() + tail
}

/// One block of [`aligned_row`]: `Σ level·x` of the codes of eight words,
/// lane `l` multiplied by lane `l` of `x(j)` (code `j` of each word), code
/// `j` into partial sum `j mod 4`. The four codes of a step are a loop of
/// constant length, so that the sums stay in registers.
#[inline(always)]
fn block_dot<const BITS: u32, const KIND: u8, const FMA: bool, const IN_PLACE: bool>(
    block: &[u32; BLOCK],
    acc: &mut [[f32; BLOCK]; 4],
    x: impl Fn(usize) -> [f32; BLOCK],
) {
    // The words shifted down four codes a step: the codes of a step take
    // constant shifts whether or not the compiler unrolls the steps.
    let mut words = *block;
    for step in 0..32 / BITS as usize / 4 {
        for (u, a) in acc.iter_mut().enumerate() {
            let (shift, x) = (u as u32 * BITS, x(4 * step + u));
            for l in 0..BLOCK {
                let v = code_of::<BITS, KIND, IN_PLACE>(words[l], shift);
                a[l] = madd::<FMA>(v, x[l], a[l]);
            }
        }
        for word in &mut words {
            *word = word.checked_shr(4 * BITS).unwrap_or(0);
        }
    }
}

/// The code `shift` bits up in `word` as [`block_dot`] multiplies it into
/// `x`: its [`level`]; for int8 the code's byte moved to the top, then an
/// arithmetic shift down sign-extends it (two shifts, where masking and
/// widening the byte took four operations); masked `IN_PLACE` (2- and
/// 4-bit affine codes, `shift` below 16), `code·2^shift`, exactly, for `x`
/// scaled by `2^-shift` ([`codes_in_place`]): one mask, no shift.
#[inline(always)]
fn code_of<const BITS: u32, const KIND: u8, const IN_PLACE: bool>(word: u32, shift: u32) -> f32 {
    let mask = ((1u64 << BITS) - 1) as u32;
    if KIND == 2 {
        let top = (word << (32 - BITS - shift)) as i32;
        (top >> (32 - BITS)) as f32
    } else if IN_PLACE {
        (word & (mask << shift)) as i32 as f32
    } else {
        level::<BITS, KIND>((word >> shift) & mask)
    }
}

/// The packed words of weight row `row`.
fn row_words<'w>(w: &'w Weight, row: usize) -> &'w [u32] {
    let per_row = w.cols * w.format.bits() as usize / 32;
    &w.words[row * per_row..(row + 1) * per_row]
}

/// The scales and biases of weight row `row`, one per group.
fn row_scales<'w>(w: &'w Weight, row: usize) -> (&'w [f32], Option<&'w [f32]>) {
    let groups = row * w.groups_per_row..(row + 1) * w.groups_per_row;
    (
        &w.scales[groups.clone()],
        w.biases.as_ref().map(|b| &b[groups]),
    )
}

/// One group's table of 16 decoded values ([`lut_levels`]): `s·q + b` (a
/// product and a sum, rounded as [`Weight::decode_cols`] rounds them) or
/// `s·level`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn lut_table<const KIND: u8>(
    s: std::arch::x86_64::__m512,
    levels: std::arch::x86_64::__m512,
    bias: Option<f32>,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    match bias {
        Some(b) if KIND == 0 => _mm512_add_ps(_mm512_mul_ps(s, levels), _mm512_set1_ps(b)),
        _ => _mm512_mul_ps(s, levels),
    }
}

/// The levels of a table of 16 entries indexed by a lane's low four bits:
/// `0..16` for 4-bit affine codes, [`NF4_LEVELS`] for NF4, and for 2-bit
/// codes `0..4` four times (entry `i` is level `i mod 4`), so that the
/// next code's bits above a code pick the same entry and need no mask.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn lut_levels<const BITS: u32, const KIND: u8>() -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    if KIND == 0 {
        let levels: [f32; 16] = std::array::from_fn(|i| (i % (1 << BITS)) as f32);
        _mm512_loadu_ps(levels.as_ptr())
    } else {
        _mm512_loadu_ps(NF4_LEVELS.as_ptr())
    }
}

/// The two halves of [`lut_table`] in AVX2 registers (`vpermps` of
/// eight lanes reads three index bits; bit 3 picks the half).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn lut4_table_avx2<const KIND: u8>(
    s: f32,
    levels: [std::arch::x86_64::__m256; 2],
    bias: Option<f32>,
) -> [std::arch::x86_64::__m256; 2] {
    use std::arch::x86_64::*;
    let s = _mm256_set1_ps(s);
    let scaled = [_mm256_mul_ps(s, levels[0]), _mm256_mul_ps(s, levels[1])];
    match bias {
        Some(b) if KIND == 0 => {
            let b = _mm256_set1_ps(b);
            [_mm256_add_ps(scaled[0], b), _mm256_add_ps(scaled[1], b)]
        }
        _ => scaled,
    }
}

/// [`lut_levels`] of 4-bit codes in two AVX2 halves.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn lut4_levels_avx2<const KIND: u8>() -> [std::arch::x86_64::__m256; 2] {
    use std::arch::x86_64::*;
    if KIND == 0 {
        [
            _mm256_cvtepi32_ps(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
            _mm256_cvtepi32_ps(_mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15)),
        ]
    } else {
        [
            _mm256_loadu_ps(NF4_LEVELS.as_ptr()),
            _mm256_loadu_ps(NF4_LEVELS[8..].as_ptr()),
        ]
    }
}

/// The entries of `table` that the low four bits of each lane of `codes`
/// pick; `sign` holds each code's bit 3 in its sign bit.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn lut4_lookup_avx2(
    codes: std::arch::x86_64::__m256i,
    sign: std::arch::x86_64::__m256i,
    table: [std::arch::x86_64::__m256; 2],
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    _mm256_blendv_ps(
        _mm256_permutevar8x32_ps(table[0], codes),
        _mm256_permutevar8x32_ps(table[1], codes),
        _mm256_castsi256_ps(sign),
    )
}

/// The sum of a kernel's four partial sums, every lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn sum_of_partials_avx512(acc: [std::arch::x86_64::__m512; 4]) -> f32 {
    use std::arch::x86_64::*;
    let pair = (_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    _mm512_reduce_add_ps(_mm512_add_ps(pair.0, pair.1))
}

/// The sum of an AVX2 kernel's partial sums (four, or two), every lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn sum_of_partials_avx2<const N: usize>(acc: [std::arch::x86_64::__m256; N]) -> f32 {
    use std::arch::x86_64::*;
    let sum = match acc.as_slice() {
        [a, b, c, d] => _mm256_add_ps(_mm256_add_ps(*a, *b), _mm256_add_ps(*c, *d)),
        _ => acc
            .iter()
            .fold(_mm256_setzero_ps(), |sum, a| _mm256_add_ps(sum, *a)),
    };
    let half = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    let quad = _mm_add_ps(half, _mm_movehl_ps(half, half));
    _mm_cvtss_f32(_mm_add_ss(quad, _mm_movehdup_ps(quad)))
}

/// Columns `first..first + out.len()` of weight row `row` decoded into
/// `out`, as [`Weight::decode_cols`] decodes them, with table lookups for
/// 4-bit affine and NF4 codes with f32 scales where `isa` has a vector
/// unit. `first` and `out.len()` are multiples of the format's group
/// where it has one, or `out` ends the row.
pub(super) fn decode_row(isa: Isa, w: &Weight, row: usize, first: usize, out: &mut [f32]) {
    let kind = match w.format {
        _ if w.dtype != DType::F32 => None,
        QuantFormat::Affine { bits: 4, .. } => Some(0),
        QuantFormat::Nf4 => Some(1),
        _ => None,
    };
    let group = w.format.group_size().unwrap_or(w.cols);
    #[cfg(target_arch = "x86_64")]
    let group_is_multiple_of = |n: usize| group.is_multiple_of(n);
    let groups = first / group..(first + out.len()).div_ceil(group);
    // SAFETY (every call below): `Isa::detect` names a unit only where the
    // CPU has it.
    match (isa, kind) {
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512, Some(0)) if group_is_multiple_of(16) => unsafe {
            decode4_avx512::<0>(w, row, groups, out)
        },
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512, Some(_)) if group_is_multiple_of(16) => unsafe {
            decode4_avx512::<1>(w, row, groups, out)
        },
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, Some(0)) if group_is_multiple_of(8) => unsafe {
            decode4_avx2::<0>(w, row, groups, out)
        },
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, Some(_)) if group_is_multiple_of(8) => unsafe {
            decode4_avx2::<1>(w, row, groups, out)
        },
        (Isa::Portable, Some(0)) => decode4_affine(w, row, groups, out),
        _ => w.decode_cols(row, first, out),
    }
}

/// [`decode_row`] for 4-bit affine codes without a vector unit of Kiln's
/// own (wasm32, arm64): code `l` of each half word is masked in place, its
/// value `c·16^l` exact in f32, and scaled back down by a power of two, so
/// a compiler vectorizes a word with one broadcast, mask and conversion per
/// half and no per-lane shift (wasm SIMD has none). In Chromium a 64-row
/// product with a 4096×4096 4-bit weight took 81 ms through
/// [`Weight::decode_cols`] and takes 64 ms with this. Each value is
/// `scale·code + bias`, a product, then a sum: the reference's bits.
fn decode4_affine(w: &Weight, row: usize, groups: Range<usize>, out: &mut [f32]) {
    const UNSHIFT: [f32; 4] = [1.0, 1.0 / 16.0, 1.0 / 256.0, 1.0 / 4096.0];
    let group = w.format.group_size().unwrap_or(w.cols);
    let words = &row_words(w, row)[groups.start * group / 8..];
    let (scales, biases) = row_scales(w, row);
    let Some(biases) = biases.filter(|_| group.is_multiple_of(8)) else {
        return w.decode_cols(row, groups.start * group, out);
    };
    let groups = out
        .chunks_exact_mut(group)
        .zip(words.chunks_exact(group / 8))
        .zip(scales[groups.clone()].iter().zip(&biases[groups]));
    for ((values, words), (&scale, &bias)) in groups {
        for (values, &word) in values.chunks_exact_mut(8).zip(words) {
            for (half, word) in values.chunks_exact_mut(4).zip([word, word >> 16]) {
                for (l, value) in half.iter_mut().enumerate() {
                    let code = code_of::<4, 0, true>(word, 4 * l as u32) * UNSHIFT[l];
                    *value = scale * code + bias;
                }
            }
        }
    }
}

/// [`decode_row`] for 4-bit codes in groups of a multiple of 16: two words
/// (16 codes) per step, spread over the lanes, shifted into place and
/// looked up in the group's [`lut_table`].
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn decode4_avx512<const KIND: u8>(
    w: &Weight,
    row: usize,
    groups: Range<usize>,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let group = w.format.group_size().unwrap_or(w.cols);
    let words = row_words(w, row);
    let (scales, biases) = row_scales(w, row);
    assert!(
        out.len() == groups.len() * group
            && group.is_multiple_of(16)
            && words.len() * 8 == scales.len() * group
            && groups.end <= scales.len()
    );
    let levels = lut_levels::<4, KIND>();
    let pick = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let shifts = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    let base = groups.start * group;
    for g in groups {
        let table = lut_table::<KIND>(_mm512_set1_ps(scales[g]), levels, biases.map(|b| b[g]));
        for t in 0..group / 16 {
            let first = g * group + 16 * t;
            let pair = _mm_loadl_epi64(words.as_ptr().add(first / 8).cast());
            let spread = _mm512_permutexvar_epi32(pick, _mm512_castsi128_si512(pair));
            let codes = _mm512_srlv_epi32(spread, shifts);
            _mm512_storeu_ps(
                out.as_mut_ptr().add(first - base),
                _mm512_permutexvar_ps(codes, table),
            );
        }
    }
}

/// [`decode_row`] for 4-bit codes in groups of a multiple of 8 with AVX2:
/// one word (8 codes) per step, broadcast, shifted into place and looked
/// up in the group's [`lut4_table_avx2`].
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn decode4_avx2<const KIND: u8>(
    w: &Weight,
    row: usize,
    groups: Range<usize>,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let group = w.format.group_size().unwrap_or(w.cols);
    let words = row_words(w, row);
    let (scales, biases) = row_scales(w, row);
    assert!(
        out.len() == groups.len() * group
            && group.is_multiple_of(8)
            && words.len() * 8 == scales.len() * group
            && groups.end <= scales.len()
    );
    let levels = lut4_levels_avx2::<KIND>();
    // Code `l` of the word to the low bits of lane `l`, and its bit 3 to
    // the lane's sign bit.
    let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    let sign_shifts = _mm256_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0);
    let base = groups.start * group;
    for g in groups {
        let table = lut4_table_avx2::<KIND>(scales[g], levels, biases.map(|b| b[g]));
        for t in 0..group / 8 {
            let first = g * group + 8 * t;
            let word = _mm256_set1_epi32(words[first / 8] as i32);
            let decoded = lut4_lookup_avx2(
                _mm256_srlv_epi32(word, shifts),
                _mm256_sllv_epi32(word, sign_shifts),
                table,
            );
            _mm256_storeu_ps(out.as_mut_ptr().add(first - base), decoded);
        }
    }
}

/// [`fused_dot`] of 2- or 4-bit affine (`KIND` 0) or NF4 (`KIND` 1)
/// codes with AVX-512, in groups of `GW` words (4 or 8), or of a multiple
/// of 16 words (`GW` = 16): each group's decoded values ([`lut_table`] of
/// [`lut_levels`]) form a table of 16 entries in one register, and a code,
/// shifted into the low bits of its lane, indexes it (`vpermps` reads
/// only the low 4 bits), so a vector of 16 products costs a shift, a
/// permute and an FMA. Lane `l` of step `t` of a group reads flat position
/// `16t + l` of the group's [`permute`]d `x`: word `(16t + l) % GW`, code
/// `(16t + l) / GW`. The word layout is a type parameter so that the steps
/// of a group unroll with their shifts and accumulators in registers.
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn lut_avx512<const BITS: u32, const KIND: u8, const GW: usize>(
    w: &Weight,
    row: usize,
    xp: &[f32],
) -> f32 {
    use std::arch::x86_64::*;
    let per_word = (32 / BITS) as usize;
    let group = w.format.group_size().unwrap_or(w.cols);
    let group_words = group / per_word;
    let words = row_words(w, row);
    let (scales, biases) = row_scales(w, row);
    let layout = if GW < 16 {
        group_words == GW
    } else {
        group_words.is_multiple_of(16)
    };
    assert!(layout && xp.len() >= w.cols && words.len() * per_word == scales.len() * group);
    let levels = lut_levels::<BITS, KIND>();
    let mut acc = [_mm512_setzero_ps(); 4];
    if GW < 16 {
        // A group's words broadcast to every block of GW lanes: step 0
        // shifts lane `l` to code `l / GW` of its word, and each further
        // step moves every lane on by 16 / GW codes (a shift by a
        // constant, which compiles to one immediate shift).
        let first: [i32; 16] = std::array::from_fn(|l| (BITS as usize * (l / GW)) as i32);
        let first = _mm512_loadu_si512(first.as_ptr().cast());
        let step = _mm512_set1_epi32((BITS as usize * 16 / GW) as i32);
        for (g, &s) in scales.iter().enumerate() {
            let table = lut_table::<KIND>(_mm512_set1_ps(s), levels, biases.map(|b| b[g]));
            let gwords = words.as_ptr().add(g * GW);
            let x = xp.as_ptr().add(g * group);
            let broadcast = match GW {
                4 => _mm512_broadcast_i32x4(_mm_loadu_si128(gwords.cast())),
                _ => _mm512_broadcast_i64x4(_mm256_loadu_si256(gwords.cast())),
            };
            let mut codes = _mm512_srlv_epi32(broadcast, first);
            for t in 0..GW * per_word / 16 {
                if t > 0 {
                    codes = _mm512_srlv_epi32(codes, step);
                }
                let decoded = _mm512_permutexvar_ps(codes, table);
                let a = &mut acc[t % 4];
                *a = _mm512_fmadd_ps(decoded, _mm512_loadu_ps(x.add(16 * t)), *a);
            }
        }
    } else {
        // Sixteen words at a time, each step the next code of all of them.
        for (g, &s) in scales.iter().enumerate() {
            let table = lut_table::<KIND>(_mm512_set1_ps(s), levels, biases.map(|b| b[g]));
            let gwords = words.as_ptr().add(g * group_words);
            let x = xp.as_ptr().add(g * group);
            for c in 0..group_words / 16 {
                let v = _mm512_loadu_si512(gwords.add(16 * c).cast());
                for j in 0..per_word {
                    let codes = _mm512_srlv_epi32(v, _mm512_set1_epi32((BITS as usize * j) as i32));
                    let x = _mm512_loadu_ps(x.add(j * group_words + 16 * c));
                    let a = &mut acc[j % 4];
                    *a = _mm512_fmadd_ps(_mm512_permutexvar_ps(codes, table), x, *a);
                }
            }
        }
    }
    sum_of_partials_avx512(acc)
}

/// Byte `b` of the f32 bits of each of the [`NF4_LEVELS`]: four tables of
/// 16 bytes, each indexed by code with one `vpshufb`.
#[cfg(target_arch = "x86_64")]
const NF4_LEVEL_BYTES: [[u8; 16]; 4] = {
    let mut planes = [[0; 16]; 4];
    let mut code = 0;
    while code < 16 {
        let bytes = NF4_LEVELS[code].to_bits().to_le_bytes();
        let mut b = 0;
        while b < 4 {
            planes[b][code] = bytes[b];
            b += 1;
        }
        code += 1;
    }
    planes
};

/// [`fused_dot`] of NF4 codes with AVX2, a group's eight words
/// ([`NF4_BLOCK`](super::quant::NF4_BLOCK) codes) at a time: their codes
/// looked up as the bytes of their levels ([`nf4_levels_avx2`]) and
/// multiplied into `x` in two partial sums, each group's sum scaled once.
/// A byte shuffle first moves byte `t` of each half's four words next to
/// each other, so that each vector of levels holds one code of all eight
/// words: lane `l` of code `j` reads position `8j + l` of the group's
/// [`permute`]d `x`.
///
/// Of the 38 operations per group (loads aside), 25 are in-lane byte
/// shuffles, which an Intel Xeon with AVX-512 ran two a cycle (timed
/// alone). The kernel before looked each code up in two 8-entry tables
/// (`vpermps`, one a cycle there) and blended the two by the code's top
/// bit (`vblendvps`, one a cycle), after two shifts: at one thread,
/// 4096×4096, 1.31 against 1.99 ms (fastest of 400 calls, four
/// alternating runs), and with the weight in L2 (1024×1024) 89 against
/// 132 µs. Written for groups of any multiple of eight words, the loop
/// over each group's words cost 9%.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn nf4_avx2(w: &Weight, row: usize, xp: &[f32]) -> f32 {
    use super::quant::NF4_BLOCK;
    use std::arch::x86_64::*;
    let words = row_words(w, row);
    let (scales, _) = row_scales(w, row);
    assert!(
        w.format.group_size() == Some(NF4_BLOCK)
            && xp.len() >= w.cols
            && words.len() * 8 == scales.len() * NF4_BLOCK
    );
    let planes =
        NF4_LEVEL_BYTES.map(|p| _mm256_broadcastsi128_si256(_mm_loadu_si128(p.as_ptr().cast())));
    // Byte `t` of word `i` (of each half's four) to byte `4t + i`.
    let by_byte = _mm256_setr_epi8(
        0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10,
        14, 3, 7, 11, 15,
    );
    let nibbles = _mm256_set1_epi8(15);
    let mut scaled = _mm256_setzero_ps();
    for (g, &s) in scales.iter().enumerate() {
        let x = xp.as_ptr().add(g * NF4_BLOCK);
        let v = _mm256_loadu_si256(words.as_ptr().add(g * NF4_BLOCK / 8).cast());
        let v = _mm256_shuffle_epi8(v, by_byte);
        // Code `2t + h` of each word in byte `4t + i` of `codes[h]`.
        let codes = [
            _mm256_and_si256(v, nibbles),
            _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibbles),
        ];
        let mut sums = [_mm256_setzero_ps(); 2];
        for (h, &codes) in codes.iter().enumerate() {
            let levels = nf4_levels_avx2(codes, &planes);
            for (t, &level) in levels.iter().enumerate() {
                let x = _mm256_loadu_ps(x.add(8 * (2 * t + h)));
                let sum = &mut sums[t % 2];
                *sum = _mm256_fmadd_ps(level, x, *sum);
            }
        }
        scaled = _mm256_fmadd_ps(_mm256_set1_ps(s), _mm256_add_ps(sums[0], sums[1]), scaled);
    }
    sum_of_partials_avx2([scaled])
}

/// The [`NF4_LEVELS`] of the 32 codes of `codes` (one a byte), in four
/// vectors: vector `t` holds the levels of bytes `4t..4t + 4` of each
/// half. A lookup in `planes[b]` ([`NF4_LEVEL_BYTES`]) gives byte `b` of
/// every code's level; interleaving bytes 0 and 1, and 2 and 3, into
/// pairs, then the pairs into words, puts the levels together.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn nf4_levels_avx2(
    codes: std::arch::x86_64::__m256i,
    planes: &[std::arch::x86_64::__m256i; 4],
) -> [std::arch::x86_64::__m256; 4] {
    use std::arch::x86_64::*;
    let b0 = _mm256_shuffle_epi8(planes[0], codes);
    let b1 = _mm256_shuffle_epi8(planes[1], codes);
    let b2 = _mm256_shuffle_epi8(planes[2], codes);
    let b3 = _mm256_shuffle_epi8(planes[3], codes);
    let (low01, low23) = (_mm256_unpacklo_epi8(b0, b1), _mm256_unpacklo_epi8(b2, b3));
    let (high01, high23) = (_mm256_unpackhi_epi8(b0, b1), _mm256_unpackhi_epi8(b2, b3));
    [
        _mm256_castsi256_ps(_mm256_unpacklo_epi16(low01, low23)),
        _mm256_castsi256_ps(_mm256_unpackhi_epi16(low01, low23)),
        _mm256_castsi256_ps(_mm256_unpacklo_epi16(high01, high23)),
        _mm256_castsi256_ps(_mm256_unpackhi_epi16(high01, high23)),
    ]
}

/// [`fused_dot`] of 4-bit affine codes with AVX2, in groups of 4 words
/// (`GW` = 4, groups of 32) or of a multiple of 8 words (`GW` = 8): eight
/// words at a time, each step the next code of all of them, converted and
/// multiplied into one of two partial sums of its group (code `j` into sum
/// `j mod 2`); each group's sum is scaled once, and the biases' share is
/// [`bias_share`]'s. Lane `l` of step `j` of the `c`-th eight words reads
/// position `j·group_words + 8c + l` of the group's [`permute`]d `x`. In
/// groups of 4 words the group's words fill both halves, the high half's
/// shifted down by one code, so step `t` decodes codes `2t` (low half) and
/// `2t + 1` (high half) of each word: flat positions `8t..8t + 8` of the
/// group's [`permute`]d `x`.
///
/// The kernel is bound by the two ports that take conversions and FMAs
/// (on Intel cores also shifts), so codes move into place with byte
/// shuffles, which run on another port: the words' low and high nibbles
/// are masked once, and each step's code is one `vpshufb` of either.
/// That is 3.1 operations on those two ports per eight codes where
/// shifting each code down took 4: 1.34–1.44 against 1.55–1.73 ms for a
/// 4096×4096 weight at one thread on an Intel Xeon without the `avx512`
/// feature. Against two 8-entry lookups and a blend (the NF4 kernel of
/// then; `vpermps` has one port on Intel cores) the shifting kernel was 1.25
/// against 1.77 ms in another day's round. (Masking codes 0–6 in place,
/// `c·16^j`, and decoding them with `s·16^−j` spread from one vector
/// product by `vpermps` also saved the shifts but measured slower: 1.54
/// against 1.25 ms.) Decoding each code with its scale and bias took a
/// second FMA on those ports: 1.28–1.30 against 1.17–1.20 ms with the bias
/// taken out (eight alternating runs; the weights' bytes at 9.5–10 GB/s,
/// this machine's read rate that hour, take 1.05–1.1 ms). The group's
/// scaled sums go into one vector: two, picked by the group's parity, were
/// kept on the stack.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn affine4_avx2<const GW: usize>(w: &Weight, row: usize, x: &PermutedRow) -> f32 {
    use std::arch::x86_64::*;
    let group = w.format.group_size().unwrap_or(w.cols);
    let group_words = group / 8;
    let words = row_words(w, row);
    let xp = x.values.as_slice();
    let (scales, _) = row_scales(w, row);
    let layout = if GW == 4 {
        group_words == 4
    } else {
        group_words > 0 && group_words.is_multiple_of(8)
    };
    assert!(layout && xp.len() >= w.cols && words.len() * 8 == scales.len() * group);
    let nibbles = _mm256_set1_epi8(15);
    // `byte_of_word[b]` moves byte `b` of each word to its low byte and
    // clears the other three (an index with its top bit set writes zero).
    let byte_of_word = [0, 1, 2, 3].map(|b| {
        let index = |k: i32| (0x8080_8000_u32 as i32) | (4 * k + b);
        _mm256_setr_epi32(
            index(0),
            index(1),
            index(2),
            index(3),
            index(0),
            index(1),
            index(2),
            index(3),
        )
    });
    // Seen as constants, the shuffles of bytes 0 and 3 become shifts, which
    // take the busy ports again; hidden, they stay shuffles.
    let byte_of_word = std::hint::black_box(byte_of_word);
    let mut scaled = _mm256_setzero_ps();
    for (g, &s) in scales.iter().enumerate() {
        let mut sums = [_mm256_setzero_ps(); 2];
        let gwords = words.as_ptr().add(g * group_words);
        let x = xp.as_ptr().add(g * group);
        if GW == 4 {
            let four = _mm256_broadcastsi128_si256(_mm_loadu_si128(gwords.cast()));
            let halves = _mm256_srlv_epi32(four, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
            let halves = _mm256_and_si256(halves, nibbles);
            for t in 0..4 {
                let codes = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(halves, byte_of_word[t]));
                let sum = &mut sums[t % 2];
                *sum = _mm256_fmadd_ps(codes, _mm256_loadu_ps(x.add(8 * t)), *sum);
            }
        } else {
            for c in 0..group_words / 8 {
                let v = _mm256_loadu_si256(gwords.add(8 * c).cast());
                let low = _mm256_and_si256(v, nibbles);
                let high = _mm256_and_si256(_mm256_srli_epi32::<4>(v), nibbles);
                for j in 0..8 {
                    let source = if j % 2 == 0 { low } else { high };
                    let codes =
                        _mm256_cvtepi32_ps(_mm256_shuffle_epi8(source, byte_of_word[j / 2]));
                    let x = _mm256_loadu_ps(x.add(j * group_words + 8 * c));
                    let sum = &mut sums[j % 2];
                    *sum = _mm256_fmadd_ps(codes, x, *sum);
                }
            }
        }
        scaled = _mm256_fmadd_ps(_mm256_set1_ps(s), _mm256_add_ps(sums[0], sums[1]), scaled);
    }
    sum_of_partials_avx2([scaled]) + bias_share(w, row, x)
}

/// [`fused_dot`] of int8 codes, a whole number of [`INT8_STEP`]s a row
/// ([`widens_int8`]), with AVX2: each eight codes are one load widened
/// from bytes to sign-extended lanes (`vpmovsxbd`, on the shuffle port),
/// converted and multiplied into `x`, which stays in its own order, in
/// four partial sums; the row's scale multiplies their sum. Taking each
/// code from its word (two shifts for its sign) took up to two more
/// operations per eight codes on the two ports that convert and multiply:
/// 1.27–1.82 against 1.78–2.99 ms for a 4096×4096 weight at one thread
/// (six alternating runs on a loaded Intel Xeon, fastest of 400 calls),
/// its 16.8 MB then read at 12–13 GB/s.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn int8_avx2(w: &Weight, row: usize, x: &PermutedRow) -> f32 {
    use std::arch::x86_64::*;
    let words = row_words(w, row);
    let xp = x.values.as_slice();
    let (scales, _) = row_scales(w, row);
    assert!(
        widens_int8(w.format, w.cols, Isa::Avx2)
            && xp.len() == w.cols
            && words.len() * 4 == w.cols
            && scales.len() == 1
    );
    // Code `i` of the row is byte `i` of its words (little-endian).
    let codes = words.as_ptr().cast::<i8>();
    let mut sums = [_mm256_setzero_ps(); 4];
    for step in (0..w.cols).step_by(INT8_STEP) {
        for (u, sum) in sums.iter_mut().enumerate() {
            let at = step + 8 * u;
            let lanes = _mm256_cvtepi8_epi32(_mm_loadl_epi64(codes.add(at).cast()));
            let x = _mm256_loadu_ps(xp.as_ptr().add(at));
            *sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), x, *sum);
        }
    }
    scales[0] * sum_of_partials_avx2(sums)
}

/// [`fused_dot`] of 2-bit affine codes with AVX2, in groups of 4 words
/// (`GW` = 4) or of a multiple of 8 words (`GW` = 8): a group's four
/// decoded values, twice over, form a table of 8 entries, and a code,
/// shifted into the low bits of its lane, indexes it (`vpermps` reads
/// three bits, and the next code's low bit above picks the same entry),
/// so a vector of 8 products costs a shift, a permute and an FMA. In
/// groups of 4 words the group's words are broadcast to both halves, and
/// lane `l` of step `t` reads flat position `8t + l` of the group's
/// [`permute`]d `x` (word `l mod 4`); in larger groups step `j` of the
/// `c`-th eight words reads position `j·group_words + 8c + l`.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn affine2_avx2<const GW: usize>(w: &Weight, row: usize, xp: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let group = w.format.group_size().unwrap_or(w.cols);
    let group_words = group / 16;
    let words = row_words(w, row);
    let (scales, biases) = row_scales(w, row);
    let biases = biases.expect("the affine format has biases");
    let layout = if GW == 4 {
        group_words == 4
    } else {
        group_words > 0 && group_words.is_multiple_of(8)
    };
    assert!(layout && xp.len() >= w.cols && words.len() * 16 == scales.len() * group);
    let levels = _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 0.0, 1.0, 2.0, 3.0);
    let mut acc = [_mm256_setzero_ps(); 4];
    for (g, (&s, &b)) in scales.iter().zip(biases).enumerate() {
        // `s·q + b` as a product and a sum, as `Weight::decode_cols`
        // rounds it.
        let table = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(s), levels), _mm256_set1_ps(b));
        let gwords = words.as_ptr().add(g * group_words);
        let x = xp.as_ptr().add(g * group);
        if GW == 4 {
            let mut codes = _mm256_srlv_epi32(
                _mm256_broadcastsi128_si256(_mm_loadu_si128(gwords.cast())),
                _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2),
            );
            for t in 0..8 {
                if t > 0 {
                    codes = _mm256_srli_epi32::<4>(codes);
                }
                let decoded = _mm256_permutevar8x32_ps(table, codes);
                let a = &mut acc[t % 4];
                *a = _mm256_fmadd_ps(decoded, _mm256_loadu_ps(x.add(8 * t)), *a);
            }
        } else {
            for c in 0..group_words / 8 {
                let v = _mm256_loadu_si256(gwords.add(8 * c).cast());
                for j in 0..16 {
                    let codes = _mm256_srlv_epi32(v, _mm256_set1_epi32(2 * j as i32));
                    let decoded = _mm256_permutevar8x32_ps(table, codes);
                    let x = _mm256_loadu_ps(x.add(j * group_words + 8 * c));
                    let a = &mut acc[j % 4];
                    *a = _mm256_fmadd_ps(decoded, x, *a);
                }
            }
        }
    }
    sum_of_partials_avx2(acc)
}

/// [`fused_dot`] of 2-bit affine codes with AVX2 in groups of 32 (two
/// words), two groups at a time, one in each half of the vector: each
/// half's table is its group's four decoded values, and `vpermilps`
/// looks a code up in its own half's table, reading two index bits (the
/// codes above need no mask). A half holds its group's two words, then
/// the same two shifted down by one code, so step `t` decodes codes `2t`
/// and `2t + 1` of both words: flat positions `4t..4t + 4` of the
/// group's [`permute`]d `x`. An odd last group runs in one half alone.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn affine2_pairs_avx2(w: &Weight, row: usize, xp: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let words = row_words(w, row);
    let (scales, biases) = row_scales(w, row);
    let biases = biases.expect("the affine format has biases");
    assert!(
        w.format.group_size() == Some(32)
            && xp.len() >= w.cols
            && words.len() == 2 * scales.len()
            && scales.len() == biases.len()
    );
    let levels = _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 0.0, 1.0, 2.0, 3.0);
    let shifts = _mm256_setr_epi32(0, 0, 2, 2, 0, 0, 2, 2);
    let mut acc = [_mm256_setzero_ps(); 4];
    let pairs = scales.len() / 2;
    for p in 0..pairs {
        let g = 2 * p;
        let two = |v: &[f32]| _mm256_setr_m128(_mm_set1_ps(v[g]), _mm_set1_ps(v[g + 1]));
        // `s·q + b` as a product and a sum, as `Weight::decode_cols`
        // rounds it.
        let table = _mm256_add_ps(_mm256_mul_ps(two(scales), levels), two(biases));
        // Words [a0, a1, b0, b1] as [a0, a1, a0, a1 | b0, b1, b0, b1].
        let four = _mm_loadu_si128(words.as_ptr().add(2 * g).cast());
        let pairs_twice = _mm256_permute4x64_epi64::<0b01_01_00_00>(_mm256_castsi128_si256(four));
        let mut codes = _mm256_srlv_epi32(pairs_twice, shifts);
        let (first, second) = (xp.as_ptr().add(32 * g), xp.as_ptr().add(32 * (g + 1)));
        for t in 0..8 {
            if t > 0 {
                codes = _mm256_srli_epi32::<4>(codes);
            }
            let decoded = _mm256_permutevar_ps(table, codes);
            let x = _mm256_loadu2_m128(second.add(4 * t), first.add(4 * t));
            let a = &mut acc[t % 4];
            *a = _mm256_fmadd_ps(decoded, x, *a);
        }
    }
    let mut tail = _mm_setzero_ps();
    if scales.len() % 2 == 1 {
        let g = scales.len() - 1;
        let (s, b) = (_mm_set1_ps(scales[g]), _mm_set1_ps(biases[g]));
        let table = _mm_add_ps(_mm_mul_ps(s, _mm_setr_ps(0.0, 1.0, 2.0, 3.0)), b);
        let two_words = _mm_loadl_epi64(words.as_ptr().add(2 * g).cast());
        let mut codes = _mm_srlv_epi32(
            _mm_unpacklo_epi64(two_words, two_words),
            _mm256_castsi256_si128(shifts),
        );
        let x = xp.as_ptr().add(32 * g);
        for t in 0..8 {
            if t > 0 {
                codes = _mm_srli_epi32::<4>(codes);
            }
            tail = _mm_fmadd_ps(
                _mm_permutevar_ps(table, codes),
                _mm_loadu_ps(x.add(4 * t)),
                tail,
            );
        }
    }
    acc[3] = _mm256_add_ps(acc[3], _mm256_zextps128_ps256(tail));
    sum_of_partials_avx2(acc)
}

/// `$body` once for each `$j` in `0..32`, a literal in each copy: a loop
/// of 32 codes is too long for the compiler to unroll, and unrolled, each
/// code's shifts and partial sum are constants.
macro_rules! each_of_32 {
    ($j:ident => $body:block) => {
        each_of_32!(@ $j $body 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31)
    };
    (@ $j:ident $body:block $($n:literal)*) => {
        $({
            let $j: usize = $n;
            $body
        })*
    };
}

/// Where [`straddling_avx512`] finds word `o` of each lane's unit: word
/// `l·BITS + o` of the run, lane `l` holding unit `l` (`BITS` words of 32
/// codes each). Constants, so that no call builds them.
#[cfg(target_arch = "x86_64")]
struct UnitWords<const BITS: u32>;

#[cfg(target_arch = "x86_64")]
impl<const BITS: u32> UnitWords<BITS> {
    /// Lane `l` of vector `o` sits at `(l·BITS + o) mod 32` of the
    /// pair of loaded vectors `(l·BITS + o) / 32`.
    const PAIR_INDEX: [[i32; LANES]; 6] = {
        let mut index = [[0; LANES]; 6];
        let mut o = 0;
        while o < 6 {
            let mut l = 0;
            while l < LANES {
                index[o][l] = ((l * BITS as usize + o) % 32) as i32;
                l += 1;
            }
            o += 1;
        }
        index
    };

    /// The lanes of vector `o` that pair `p` of loaded vectors gives.
    const IN_PAIR: [[u16; 3]; 6] = {
        let mut lanes = [[0; 3]; 6];
        let mut o = 0;
        while o < 6 {
            let mut l = 0;
            while l < LANES {
                let pair = (l * BITS as usize + o) / 32;
                if pair < 3 {
                    lanes[o][pair] |= 1 << l;
                }
                l += 1;
            }
            o += 1;
        }
        lanes
    };
}

/// [`fused_dot`] of 3-, 5- or 6-bit affine codes with AVX-512, in groups
/// of one, two or four units (32, 64 or 128 codes): [`fused_row`]'s lanes
/// and shifts, in registers. A run's words load as `BITS` vectors and are
/// transposed by permutes (lane `l` of vector `o` then holds word `o` of
/// unit `l`), and its scales are spread over the lanes by one permute,
/// where the portable kernel fills each lane by a store and reads the
/// lanes back as a vector (a store-forwarding stall). 3- and 5-bit codes
/// become floats by a permute of the code values, which needs no mask and
/// leaves the conversion's port to the FMAs; 6-bit codes are masked and
/// converted. Either way the float is the code exactly, multiplied into
/// `x` by one FMA; each unit's sum is scaled once, and the biases' share
/// is [`bias_share`]'s, as in [`fused_row`]. Decoding each code with its
/// scale and bias took a second FMA: side by side, 3-bit ran about 1.3×
/// and 6-bit about 1.1× slower.
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn straddling_avx512<const BITS: u32>(w: &Weight, row: usize, x: &PermutedRow) -> f32 {
    let xp = x.values.as_slice();
    use std::arch::x86_64::*;
    let words_per_unit = BITS as usize;
    let group = w.format.group_size().unwrap_or(w.cols);
    let units_per_group = group / 32;
    let words = row_words(w, row);
    let (scales, _) = row_scales(w, row);
    assert!(
        matches!(BITS, 3 | 5 | 6)
            && matches!(group, 32 | 64 | 128)
            && xp.len() >= w.cols
            && words.len() * 32 == scales.len() * group * words_per_unit
    );
    let pairs = words_per_unit.div_ceil(2);
    let in_pair = UnitWords::<BITS>::IN_PAIR;
    let mut index = [_mm512_setzero_si512(); 6];
    for (o, lanes) in UnitWords::<BITS>::PAIR_INDEX.iter().enumerate() {
        index[o] = _mm512_loadu_si512(lanes.as_ptr().cast());
    }
    // Lane `l` of a run is unit `l`, of the run's group `l / units_per_group`.
    let group_of_lane: [i32; LANES] = std::array::from_fn(|l| (l / units_per_group) as i32);
    let group_of_lane = _mm512_loadu_si512(group_of_lane.as_ptr().cast());
    let run_groups = ((1u32 << (LANES / units_per_group)) - 1) as u16;
    let mask = _mm512_set1_epi32((1 << BITS) - 1);
    // 3- and 5-bit codes become floats by a lookup in the code values
    // (`vpermps` reads the low four bits of each lane, `vpermt2ps` five),
    // so the bits above need no mask and the conversion's port is free
    // for FMAs. A 3-bit table holds its eight values twice.
    let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let levels = if BITS == 3 {
        [_mm512_cvtepi32_ps(_mm512_and_si512(lanes, mask)); 2]
    } else {
        let upper = _mm512_add_epi32(lanes, _mm512_set1_epi32(16));
        [_mm512_cvtepi32_ps(lanes), _mm512_cvtepi32_ps(upper)]
    };
    let runs = words.len() / (LANES * words_per_unit);
    let mut scaled = _mm512_setzero_ps();
    for r in 0..runs {
        let run = words.as_ptr().add(r * LANES * words_per_unit);
        let mut loaded = [_mm512_setzero_si512(); 6];
        for (k, v) in loaded.iter_mut().enumerate().take(words_per_unit) {
            *v = _mm512_loadu_si512(run.add(LANES * k).cast());
        }
        let mut unit_words = [_mm512_setzero_si512(); 6];
        for o in 0..words_per_unit {
            let mut v = _mm512_permutex2var_epi32(loaded[0], index[o], loaded[1]);
            for p in 1..pairs {
                // An odd last vector pairs with itself.
                let second = loaded[(2 * p + 1).min(words_per_unit - 1)];
                let from_pair = _mm512_permutex2var_epi32(loaded[2 * p], index[o], second);
                v = _mm512_mask_blend_epi32(in_pair[o][p], v, from_pair);
            }
            unit_words[o] = v;
        }
        let first_group = (r * LANES) >> units_per_group.trailing_zeros();
        let run_scales = _mm512_maskz_loadu_ps(run_groups, scales.as_ptr().add(first_group));
        let s = _mm512_permutexvar_ps(group_of_lane, run_scales);
        let x = xp.as_ptr().add(r * LANES * 32);
        // As in `fused_row`: every code spelled out, with constant shifts,
        // code `j` into partial sum `j mod 4`, the unit's sum scaled once.
        let mut acc = [_mm512_setzero_ps(); 4];
        each_of_32!(j => {
            let bit = j * BITS as usize;
            let (o, shift) = (bit / 32, (bit % 32) as i32);
            let straddles = shift as u32 + BITS > 32;
            let mut code = _mm512_srlv_epi32(unit_words[o], _mm512_set1_epi32(shift));
            if straddles {
                let high = unit_words[if straddles { o + 1 } else { o }];
                code = _mm512_or_si512(code, _mm512_sllv_epi32(high, _mm512_set1_epi32(32 - shift)));
            }
            let code = match BITS {
                3 => _mm512_permutexvar_ps(code, levels[0]),
                5 => _mm512_permutex2var_ps(levels[0], code, levels[1]),
                _ => _mm512_cvtepi32_ps(_mm512_and_si512(code, mask)),
            };
            let a = &mut acc[j % 4];
            *a = _mm512_fmadd_ps(code, _mm512_loadu_ps(x.add(j * LANES)), *a);
        });
        let units = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        scaled = _mm512_fmadd_ps(s, units, scaled);
    }
    _mm512_reduce_add_ps(scaled)
        + straddling_tail::<BITS, 0, true>(w, row, xp, runs * LANES * 32)
        + bias_share(w, row, x)
}

/// [`straddling_avx512`] with AVX2: each run of [`LANES`] units in two
/// halves of eight. A half's words load as `BITS` vectors of eight and
/// are transposed by [`units_avx2`] (lane `l` of vector `o` then holds
/// word `o` of unit `l`). 3-bit codes become floats by a permute, as in
/// [`straddling_avx512`]; 5- and 6-bit codes take more index bits than
/// an eight-lane permute reads, and are masked and converted.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn straddling_avx2<const BITS: u32>(w: &Weight, row: usize, x: &PermutedRow) -> f32 {
    let xp = x.values.as_slice();
    use std::arch::x86_64::*;
    const HALF: usize = LANES / 2;
    let words_per_unit = BITS as usize;
    let group = w.format.group_size().unwrap_or(w.cols);
    let units_per_group = group / 32;
    let words = row_words(w, row);
    let (scales, _) = row_scales(w, row);
    assert!(
        matches!(BITS, 3 | 5 | 6)
            && matches!(group, 32 | 64 | 128)
            && xp.len() >= w.cols
            && words.len() * 32 == scales.len() * group * words_per_unit
    );
    let vector = |lanes: [i32; HALF]| _mm256_loadu_si256(lanes.as_ptr().cast());
    let group_of_lane = vector(std::array::from_fn(|l| (l / units_per_group) as i32));
    let half_groups = vector(std::array::from_fn(|l| {
        -i32::from(l < HALF / units_per_group)
    }));
    let mask = _mm256_set1_epi32((1 << BITS) - 1);
    // 3-bit codes become floats by a lookup in the code values: `vpermps`
    // reads the low three bits of each lane (the bits above need no mask)
    // and runs on a port that the conversion and FMAs do not take.
    let levels = _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0);
    let runs = words.len() / (LANES * words_per_unit);
    // Two partial sums per unit: when each code was decoded with its scale
    // and bias, four kept the compiler spilling codes to the stack (79
    // stack accesses in the 6-bit kernel against 25 with two); without
    // them in the loop, four measured no faster.
    let mut scaled = _mm256_setzero_ps();
    for r in 0..runs {
        for h in 0..2 {
            let first_unit = r * LANES + h * HALF;
            let first_word = words.as_ptr().add(first_unit * words_per_unit);
            let mut loaded = [_mm256_setzero_si256(); 6];
            for (k, v) in loaded.iter_mut().enumerate().take(words_per_unit) {
                *v = _mm256_loadu_si256(first_word.add(HALF * k).cast());
            }
            let unit_words = units_avx2::<BITS>(loaded);
            // A shift, not a division: a group is 1, 2 or 4 units.
            let first_group = first_unit >> units_per_group.trailing_zeros();
            let half_scales = _mm256_maskload_ps(scales.as_ptr().add(first_group), half_groups);
            let s = _mm256_permutevar8x32_ps(half_scales, group_of_lane);
            let x = xp.as_ptr().add(r * LANES * 32 + h * HALF);
            let mut acc = [_mm256_setzero_ps(); 2];
            each_of_32!(j => {
                let bit = j * BITS as usize;
                let (o, shift) = (bit / 32, (bit % 32) as i32);
                let straddles = shift as u32 + BITS > 32;
                let mut code = _mm256_srlv_epi32(unit_words[o], _mm256_set1_epi32(shift));
                if straddles {
                    let high = unit_words[if straddles { o + 1 } else { o }];
                    code = _mm256_or_si256(code, _mm256_sllv_epi32(high, _mm256_set1_epi32(32 - shift)));
                }
                let code = if BITS == 3 {
                    _mm256_permutevar8x32_ps(levels, code)
                } else {
                    _mm256_cvtepi32_ps(_mm256_and_si256(code, mask))
                };
                let a = &mut acc[j % 2];
                *a = _mm256_fmadd_ps(code, _mm256_loadu_ps(x.add(j * LANES)), *a);
            });
            scaled = _mm256_fmadd_ps(s, _mm256_add_ps(acc[0], acc[1]), scaled);
        }
    }
    sum_of_partials_avx2([scaled])
        + straddling_tail::<BITS, 0, true>(w, row, xp, runs * LANES * 32)
        + bias_share(w, row, x)
}

/// Eight units of `BITS` (3, 5 or 6) words each, loaded as `BITS` vectors
/// of eight words (`loaded[k]` lane `p` is word `8k + p`), transposed:
/// lane `l` of vector `o` holds word `o` of unit `l`, word `l·BITS + o`.
/// Every blend and shuffle takes a constant.
///
/// For 3 and 5 words, coprime to 8, the words of vector `o` sit at eight
/// distinct positions `(l·BITS + o) mod 8` of the loaded vectors: blends
/// gather them into one vector and one permute puts them in lane order
/// (`BITS` operations per vector). For 6 words, pairs of words (64 bits)
/// are gathered the same way, four units at a time, and the pairs' low and
/// high words are split by `shufps` and put in lane order by a permute (4
/// operations per vector). Before, each vector was a permute of every
/// loaded vector and a variable blend of each (11 operations for 6 words),
/// with masks the compiler kept on the stack.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn units_avx2<const BITS: u32>(
    loaded: [std::arch::x86_64::__m256i; 6],
) -> [std::arch::x86_64::__m256i; 6] {
    use std::arch::x86_64::*;
    /// The dword lanes that output `o` takes from `loaded[k]` when each of
    /// the eight lanes `l` wants word `stride·l + o` (`stride` odd).
    const fn words_from(stride: usize, o: usize, k: usize) -> i32 {
        let (mut lanes, mut l) = (0, 0);
        while l < 8 {
            let word = stride * l + o;
            if word / 8 == k {
                lanes |= 1 << (word % 8);
            }
            l += 1;
        }
        lanes
    }
    /// The dword lanes (pairs) that pair `o` of four units takes from
    /// vector `k` of their three: unit `u` wants pair `3u + o`.
    const fn pairs_from(o: usize, k: usize) -> i32 {
        let (mut lanes, mut u) = (0, 0);
        while u < 4 {
            let pair = 3 * u + o;
            if pair / 4 == k {
                lanes |= 0b11 << (2 * (pair % 4));
            }
            u += 1;
        }
        lanes
    }
    /// The lane of `shufps(a, b)` that holds unit `u`'s word of pair `o`,
    /// `a` holding units 0–3 and `b` units 4–7, each unit's pair at
    /// position `P = (3u + o) mod 4` of its vector: `shufps` puts pairs
    /// 0–1 of `a`, then of `b`, in the low half and pairs 2–3 in the high
    /// half, so the lane is `4·(P / 2) + 2·(u / 4) + P mod 2`.
    const fn shuffled_lane(o: usize, u: usize) -> i32 {
        let position = (3 * (u % 4) + o) % 4;
        (4 * (position / 2) + 2 * (u / 4) + position % 2) as i32
    }
    /// Eight lanes, aligned as a vector, so that they load as one.
    #[repr(C, align(32))]
    struct Lanes([i32; 8]);
    let mut units = [_mm256_setzero_si256(); 6];
    macro_rules! odd_stride {
        ($stride:literal, [$($o:literal)*], $rest:tt) => {{
            $(units[$o] = odd_stride!(@ $stride, $o, $rest);)*
        }};
        (@ $stride:literal, $o:literal, [$($k:literal)*]) => {{
            let mut v = loaded[0];
            $(v = _mm256_blend_epi32::<{ words_from($stride, $o, $k) }>(v, loaded[$k]);)*
            static POSITIONS: Lanes = {
                let (mut lanes, mut l) = ([0; 8], 0);
                while l < 8 {
                    lanes[l] = (($stride * l + $o) % 8) as i32;
                    l += 1;
                }
                Lanes(lanes)
            };
            // A volatile load at each use: held in registers, the five
            // 5-bit orders left too few for the rest, and the compiler
            // spilled 22 vectors of decoded codes to the stack (now 2).
            let positions = std::ptr::read_volatile((&raw const POSITIONS).cast::<__m256i>());
            _mm256_permutevar8x32_epi32(v, positions)
        }};
    }
    match BITS {
        3 => odd_stride!(3, [0 1 2], [1 2]),
        5 => odd_stride!(5, [0 1 2 3 4], [1 2 3 4]),
        _ => {
            // Pair `o` of units 0–3 (from vectors 0–2) and 4–7 (3–5), at
            // pair position `(3u + o) mod 4`.
            macro_rules! pairs {
                ($o:literal, $first:literal) => {{
                    let v = _mm256_blend_epi32::<{ pairs_from($o, 1) }>(
                        loaded[$first],
                        loaded[$first + 1],
                    );
                    _mm256_castsi256_ps(_mm256_blend_epi32::<{ pairs_from($o, 2) }>(
                        v,
                        loaded[$first + 2],
                    ))
                }};
            }
            macro_rules! split {
                ($($o:literal)*) => {$({
                    let (a, b) = (pairs!($o, 0), pairs!($o, 3));
                    let lane_of_unit: [i32; 8] = std::array::from_fn(|u| shuffled_lane($o, u));
                    let order = _mm256_loadu_si256(lane_of_unit.as_ptr().cast());
                    let low = _mm256_shuffle_ps::<0b10_00_10_00>(a, b);
                    let high = _mm256_shuffle_ps::<0b11_01_11_01>(a, b);
                    units[2 * $o] = _mm256_permutevar8x32_epi32(_mm256_castps_si256(low), order);
                    units[2 * $o + 1] = _mm256_permutevar8x32_epi32(_mm256_castps_si256(high), order);
                })*};
            }
            split!(0 1 2);
        }
    }
    units
}

/// [`aligned_row`]'s sum for codes that straddle words: runs of
/// [`LANES`] units, lane `l` unpacking unit `l` of the run with the same
/// shifts as every other lane, each unit's `Σ level·x` scaled once.
#[inline(always)]
fn fused_row<const BITS: u32, const KIND: u8, const FMA: bool>(
    w: &Weight,
    row: usize,
    xp: &[f32],
) -> f32 {
    let (words_per_unit, codes) = unit(BITS);
    let mask = ((1u64 << BITS) - 1) as u32;
    let words = row_words(w, row);
    let group = w.format.group_size().unwrap_or(w.cols);
    let (scales, _) = row_scales(w, row);
    let run_words = LANES * words_per_unit;
    let full_runs = words.len() / run_words;
    let mut scaled = [0.0f32; LANES];
    for (r, (run, x)) in words
        .chunks_exact(run_words)
        .zip(xp.chunks_exact(LANES * codes))
        .enumerate()
    {
        let mut scale = [0.0f32; LANES];
        let mut unit_words = [[0u32; LANES]; 6];
        for l in 0..LANES {
            scale[l] = scales[(r * LANES + l) * codes / group];
            for o in 0..words_per_unit {
                unit_words[o][l] = run[l * words_per_unit + o];
            }
        }
        // Every code of a unit spelled out (32 of them, unit(BITS)), so that
        // each takes constant shifts; code `j` goes into partial sum
        // `j mod 4`.
        debug_assert_eq!(codes, 32);
        let mut sums = [[0.0f32; LANES]; 4];
        each_of_32!(j => {
            let bit = j * BITS as usize;
            let (o, shift) = (bit / 32, (bit % 32) as u32);
            // A code that straddles two words takes its high bits from the
            // next word of its unit; elsewhere that part is masked off.
            let straddles = shift + BITS > 32;
            let high = &unit_words[if straddles { o + 1 } else { o }];
            let high_mask = if straddles { u32::MAX } else { 0 };
            let low = &unit_words[o];
            let mut code = [0u32; LANES];
            for l in 0..LANES {
                let joined = (low[l] >> shift) | (high[l].wrapping_shl(32 - shift) & high_mask);
                code[l] = joined & mask;
            }
            let xs: &[f32; LANES] = x[j * LANES..(j + 1) * LANES]
                .try_into()
                .expect("a run holds LANES values per code");
            let a = &mut sums[j % 4];
            for l in 0..LANES {
                a[l] = madd::<FMA>(level::<BITS, KIND>(code[l]), xs[l], a[l]);
            }
        });
        for l in 0..LANES {
            let lane = (sums[0][l] + sums[1][l]) + (sums[2][l] + sums[3][l]);
            scaled[l] = madd::<FMA>(scale[l], lane, scaled[l]);
        }
    }
    scaled.iter().sum::<f32>()
        + straddling_tail::<BITS, KIND, FMA>(w, row, xp, full_runs * LANES * codes)
}

/// `Σ s·level·x` over the codes from `first_col` on (the units after the
/// last full run of [`fused_row`]), one code at a time, in order; the
/// biases' share is [`bias_share`]'s.
fn straddling_tail<const BITS: u32, const KIND: u8, const FMA: bool>(
    w: &Weight,
    row: usize,
    xp: &[f32],
    first_col: usize,
) -> f32 {
    let mask = ((1u64 << BITS) - 1) as u32;
    let words = row_words(w, row);
    let group = w.format.group_size().unwrap_or(w.cols);
    let (scales, _) = row_scales(w, row);
    let mut tail = 0.0f32;
    for (c, &x) in xp.iter().enumerate().take(w.cols).skip(first_col) {
        let bit = c * BITS as usize;
        let (word, shift) = (bit / 32, bit % 32);
        let pair = u64::from(words[word]) | words.get(word + 1).map_or(0, |&v| u64::from(v) << 32);
        let v = scales[c / group] * level::<BITS, KIND>((pair >> shift) as u32 & mask);
        tail = madd::<FMA>(v, x, tail);
    }
    tail
}
