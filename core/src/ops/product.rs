//! f32 matrix products on packed, register-blocked microkernels, split
//! across [`crate::exec::cpu_threads`] threads by output columns: natively
//! the `gemm` crate's (AVX2/AVX-512/NEON, picked at run time), on wasm32
//! Kiln's own simd128 kernel (`product/packed.rs`), a quarter faster in a
//! browser than the crate's, or, where the host handed it over
//! (`ops::relaxed::use_relaxed_kernels`), the relaxed-SIMD kernel module's
//! block product (fused multiply-adds) on the same packing.
//!
//! Every operand is a strided view, so a transposed operand is read in
//! place. Natively, a product whose `b` is transposed and whose `a` has
//! few rows (the backward pass's `g · wᵀ`) is written column by column
//! into a scratch and transposed into place in AVX2 registers, where
//! writing its rows would have the crate pack `b` through its transpose
//! an element at a time ([`writes_column_major`]).
//!
//! Numerics: each output is a sum of `k` products accumulated in f32
//! in an order the microkernel's blocking chooses, with or without FMA, so
//! it may differ from the i-k-j loop in the last bits; the error is within
//! the classical bound `|c − ĉ| ≤ γ_k · Σ_p |a_ip|·|b_pj|`,
//! `γ_k = k·u / (1 − k·u)`, `u = 2⁻²⁴` ([`super::matmul::error_bound`]).
//!
//! A single row of output (GEMV, `m = 1`) skips the packing: the packed
//! path costs microseconds per call that a `[1, 256]·[256, 256]` step of a
//! recurrent network cannot afford. With `b`'s rows contiguous each output
//! sums its products in `k` order with no FMA, the bits of the plain
//! i-k-j loop on every instruction set; with `b` transposed (its columns
//! contiguous) in sixteen interleaved partial sums.

use super::math::simd_dispatch;
use crate::threads::for_each_task;

#[cfg(any(target_arch = "wasm32", test))]
mod packed;

/// True where the GEMM packs both operands into its own layout whatever
/// their strides (Kiln's own kernels, on wasm32), so that a transposed
/// operand costs it no more than any other: natively the `gemm` crate
/// reads some layouts in place and packs others an element at a time.
pub(crate) const PACKS_EVERY_LAYOUT: bool = cfg!(target_arch = "wasm32");

/// A read-only matrix view: element `(i, j)` is `data[i·row_stride +
/// j·col_stride]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct View<'a> {
    pub data: &'a [f32],
    pub row_stride: usize,
    pub col_stride: usize,
}

impl<'a> View<'a> {
    /// The row-major `[rows, cols]` matrix starting at `data[0]`.
    pub fn row_major(data: &'a [f32], cols: usize) -> View<'a> {
        View {
            data,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The transpose of `self`, read in place.
    pub fn transposed(self) -> View<'a> {
        View {
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    /// True when every element of a `rows`×`cols` view lies in `data`.
    fn covers(&self, rows: usize, cols: usize) -> bool {
        rows == 0
            || cols == 0
            || (rows - 1) * self.row_stride + (cols - 1) * self.col_stride < self.data.len()
    }
}

/// One product `c = a·b` (`accumulate`: `c += a·b`) of an `m`×`k` view
/// and a `k`×`n` view into the row-major `m`×`n` matrix `c`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Product<'a> {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub a: View<'a>,
    pub b: View<'a>,
    pub accumulate: bool,
}

/// The multiply-adds under which a product runs on one thread: below it,
/// spawning costs more than the split saves.
const PARALLEL_MIN_WORK: usize = 1 << 21;

/// Output columns of one thread's share are a multiple of this (the
/// microkernels' register tile width).
const COLUMN_ALIGN: usize = 16;

/// The fewest output columns of a one-row product's band: 4 KiB of each
/// row of b.
const GEMV_MIN_BAND: usize = 1024;

/// Tasks a split product makes per thread (see [`run`]).
const TASKS_PER_THREAD: usize = 4;

/// Runs each product of `jobs` (all share `m` and `n`, none accumulates)
/// into a new buffer: job `i`'s result is `[i·m·n .. (i+1)·m·n]`. The
/// jobs, or the columns of each, are split across the CPU executor's
/// threads. The buffer is not zeroed first: the microkernels write every
/// element without reading it, which saves a pass over the output (3% of
/// a training step's time at width 256).
///
/// # Panics
///
/// When a view does not cover its matrix, the jobs differ in `m` or `n`,
/// or one accumulates: the callers derive all three from checked shapes.
pub(crate) fn run(jobs: &[Product<'_>]) -> Vec<f32> {
    let Some(first) = jobs.first() else {
        return Vec::new();
    };
    let (m, n) = (first.m, first.n);
    let size = m * n;
    for job in jobs {
        assert!(
            job.m == m && job.n == n && job.fits() && !job.accumulate,
            "products of one shape that cover their matrices, into a new buffer"
        );
    }
    let len = jobs.len() * size;
    let mut out = crate::pool::take_f32(len);
    if len > 0 {
        // SAFETY: the views cover their matrices and every job is m×n
        // (checked above); the buffer has room for `len` elements, which
        // `write_products` writes in full, never reading one before
        // writing it, before the length covers them.
        unsafe {
            write_products(jobs, (m, n), Out(out.as_mut_ptr()));
            out.set_len(len);
        }
    }
    out
}

/// [`run`]'s products, each `m`×`n`, into `out`.
///
/// # Safety
///
/// The views cover their matrices, every job is `m`×`n` with `m·n > 0`,
/// and `out` has room for `jobs.len()·m·n` elements that nothing else
/// touches during the call.
unsafe fn write_products(jobs: &[Product<'_>], (m, n): (usize, usize), out: Out) {
    let size = m * n;
    let work = jobs.iter().map(|j| j.m * j.k * j.n).sum::<usize>();
    let threads = thread_count(work);
    if threads == 1 {
        for (i, job) in jobs.iter().enumerate() {
            // SAFETY: the views cover their matrices and matrix `i` of
            // `out` is in bounds (contract); nothing else writes it.
            unsafe { gemm_into(job, out.at(i * size), n, 0..n) };
        }
        return;
    }
    // Column bands of every matrix, several per thread, claimed one at a
    // time: a thread that starts late (its core busy) takes fewer, so the
    // call never waits for a whole fixed share of a delayed thread. The
    // bands depend only on the shapes and the thread count.
    let bands = (threads * TASKS_PER_THREAD).div_ceil(jobs.len());
    // A one-row product streams b's rows: a band narrower than a page of
    // each row makes the prefetchers restart at every row.
    let least = if m == 1 { GEMV_MIN_BAND } else { COLUMN_ALIGN };
    let band = n
        .div_ceil(bands)
        .next_multiple_of(COLUMN_ALIGN)
        .max(least)
        .min(n);
    let per_matrix = n.div_ceil(band);
    let out = &out;
    for_each_task(jobs.len() * per_matrix, |t| {
        let (i, start) = (t / per_matrix, (t % per_matrix) * band);
        // SAFETY: as above; the tasks write disjoint column bands of
        // disjoint matrices, so no two threads write one element.
        unsafe { gemm_into(&jobs[i], out.at(i * size), n, start..(start + band).min(n)) };
    });
}

/// One product on the calling thread into the row-major `m`×`n` `out`
/// (added to it when the job accumulates).
///
/// # Panics
///
/// When a view does not cover its matrix or `out` is not `m·n` long.
pub(crate) fn run_on_this_thread(job: &Product<'_>, out: &mut [f32]) {
    assert!(
        job.fits() && out.len() == job.m * job.n,
        "product operands cover their matrices"
    );
    // SAFETY: the views cover their matrices and `out` is the m×n result,
    // all checked just above; `out` is borrowed mutably, so only this
    // call writes it.
    unsafe { gemm_into(job, out.as_mut_ptr(), job.n, 0..job.n) };
}

impl Product<'_> {
    /// True when both views cover their matrices.
    fn fits(&self) -> bool {
        self.a.covers(self.m, self.k) && self.b.covers(self.k, self.n)
    }
}

/// Threads worth using for `work` multiply-adds.
fn thread_count(work: usize) -> usize {
    if work < PARALLEL_MIN_WORK {
        1
    } else {
        crate::exec::cpu_threads()
    }
}

/// The output buffer shared by the threads of one [`run`]; each writes
/// only its own elements.
#[derive(Clone, Copy)]
struct Out(*mut f32);

// SAFETY: threads write disjoint elements through it (see `run`), and the
// buffer outlives the scope the threads run in.
unsafe impl Send for Out {}
// SAFETY: as above.
unsafe impl Sync for Out {}

impl Out {
    /// The pointer `offset` elements in.
    ///
    /// # Safety
    ///
    /// `offset` is within the buffer.
    unsafe fn at(self, offset: usize) -> *mut f32 {
        // SAFETY: the caller keeps `offset` in bounds.
        unsafe { self.0.add(offset) }
    }
}

/// The columns `cols` of `job` into the row-major matrix at `c` (row
/// stride `ldc`), or added to them when the job accumulates. A job that
/// does not accumulate writes every element before it reads any.
///
/// # Safety
///
/// The views cover the job's matrices, `c` points to an `m`×`ldc` matrix
/// with `cols.end ≤ ldc` (its elements initialized where the job
/// accumulates), and no other thread touches those columns.
unsafe fn gemm_into(job: &Product<'_>, c: *mut f32, ldc: usize, cols: std::ops::Range<usize>) {
    let (m, k, width) = (job.m, job.k, cols.len());
    if m == 0 || width == 0 {
        return;
    }
    if k == 0 {
        if !job.accumulate {
            for i in 0..m {
                // SAFETY: row `i`, columns `cols` are inside `c` (contract).
                unsafe { std::ptr::write_bytes(c.add(i * ldc + cols.start), 0, width) };
            }
        }
        return;
    }
    if m == 1 {
        // SAFETY: row 0, columns `cols` of `c` are in bounds and this
        // thread's alone (contract); zeroed through the pointer, they are
        // initialized before a slice borrows them.
        let out = unsafe {
            if !job.accumulate {
                std::ptr::write_bytes(c.add(cols.start), 0, width);
            }
            std::slice::from_raw_parts_mut(c.add(cols.start), width)
        };
        if gemv(job, cols.start, out) {
            return;
        }
    }
    #[cfg(target_arch = "wasm32")]
    // SAFETY: the views cover the job's matrices (checked in `run`), so
    // `b` from column `cols.start` covers k×width; the m×width block of `c`
    // at column `cols.start` is in bounds and this thread's (contract).
    unsafe {
        let a = packed::Strided {
            ptr: job.a.data.as_ptr(),
            row_stride: job.a.row_stride,
            col_stride: job.a.col_stride,
        };
        let b = packed::Strided {
            ptr: job.b.data.as_ptr().add(cols.start * job.b.col_stride),
            row_stride: job.b.row_stride,
            col_stride: job.b.col_stride,
        };
        let product = packed::Product::current();
        packed::gemm(
            product,
            (m, k, width),
            a,
            b,
            c.add(cols.start),
            ldc,
            job.accumulate,
        );
    }
    #[cfg(target_arch = "x86_64")]
    if writes_column_major(job, width) {
        let mut scratch = Vec::<f32>::with_capacity(m * width);
        // SAFETY: the views cover the job's matrices (checked in `run`);
        // the scratch has room for the m×width column-major block, which
        // the product writes in full without reading it (it does not
        // accumulate) before the transpose reads it; the CPU has AVX2
        // (`writes_column_major`); and the m×width block of `c` at column
        // `cols.start` is in bounds and this thread's (contract).
        unsafe {
            gemm_strided(job, scratch.as_mut_ptr(), (1, m), cols.start, width);
            transpose_into_rows(scratch.as_ptr(), m, width, c.add(cols.start), ldc);
        }
        return;
    }
    #[cfg(not(target_arch = "wasm32"))]
    // SAFETY: the views cover the job's matrices (checked in `run`), and
    // the m×width block of `c` at column `cols.start` is in bounds,
    // initialized where the job accumulates, and this thread's (contract).
    unsafe {
        gemm_strided(job, c.add(cols.start), (ldc, 1), cols.start, width)
    };
}

/// `job`'s product over `b`'s columns `first..first + width` into the
/// m×width matrix at `dst` (element `(i, j)` at `dst[i·row_stride +
/// j·col_stride]`), or added to it when the job accumulates, by the `gemm`
/// crate on the calling thread.
///
/// # Safety
///
/// The views cover the job's matrices, `first + width ≤ n`, and `dst`
/// reaches m×width elements through its strides, initialized where the
/// job accumulates, that nothing else touches.
#[cfg(not(target_arch = "wasm32"))]
unsafe fn gemm_strided(
    job: &Product<'_>,
    dst: *mut f32,
    (row_stride, col_stride): (usize, usize),
    first: usize,
    width: usize,
) {
    let stride = |s: usize| s as isize;
    // SAFETY: `gemm` reads `a` over m×k and `b` over k×width through the
    // given strides, which the views cover, and writes (reads, where the
    // job accumulates) the m×width elements at `dst` (contract).
    unsafe {
        gemm::gemm(
            job.m,
            width,
            job.k,
            dst,
            stride(col_stride),
            stride(row_stride),
            job.accumulate,
            job.a.data.as_ptr(),
            stride(job.a.col_stride),
            stride(job.a.row_stride),
            job.b.data.as_ptr().add(first * job.b.col_stride),
            stride(job.b.col_stride),
            stride(job.b.row_stride),
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Whether [`gemm_into`] has the `gemm` crate write the `width` columns
/// of `job`'s product column by column into a scratch, then moves them
/// into place: where `b` is a transposed view (its columns contiguous),
/// on a CPU with AVX2, when that moves fewer elements. Writing a
/// row-major output, the crate packs `b` through its transpose, one
/// element at a time from rows a stride apart: k·width such moves.
/// Writing a column-major one it packs `a` so instead (m·k), and the
/// scratch's transpose is m·width more. Timed on an Intel Xeon at one
/// thread, `g · wᵀ` at 64×256·256×256 (the backward pass of a layer of
/// width 256) took 59.5 µs written so, against 77.0 (55.8 for `x · w`),
/// and at 32×1024·1024×1024 460 against 1,531; where m·(k + width)
/// exceeds k·width (256×256·256×256, 64×64·64×1024, 512×2048·2048×512)
/// it was 3–7% slower, and below 16,384 elements of `b` (16×64·64×64)
/// the scratch's cost showed.
#[cfg(target_arch = "x86_64")]
fn writes_column_major(job: &Product<'_>, width: usize) -> bool {
    let (m, k) = (job.m, job.k);
    !job.accumulate
        && job.b.row_stride == 1
        && job.b.col_stride != 1
        && m * (k + width) <= k * width
        && k * width >= 1 << 14
        && std::arch::is_x86_feature_detected!("avx2")
}

/// The row-major `[rows, cols]` matrix `src` written transposed into
/// `dst` (`[cols, rows]`): in AVX2 registers eight by eight where the CPU
/// has AVX2.
///
/// # Panics
///
/// When `src` or `dst` is shorter than `rows·cols`.
pub(crate) fn transpose(src: &[f32], (rows, cols): (usize, usize), dst: &mut [f32]) {
    assert!(
        src.len() >= rows * cols && dst.len() >= rows * cols,
        "a transpose covers both matrices"
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2; `src`, read as the column-major
        // cols×rows matrix, holds rows·cols elements, and `dst` has cols
        // rows of `rows` elements (both checked above), borrowed mutably.
        unsafe { transpose_into_rows(src.as_ptr(), cols, rows, dst.as_mut_ptr(), rows) };
        return;
    }
    transpose_in_order(src, (rows, cols), dst);
}

/// [`transpose`] one element at a time, for CPUs without AVX2.
fn transpose_in_order(src: &[f32], (rows, cols): (usize, usize), dst: &mut [f32]) {
    for (r, row) in src.chunks_exact(cols.max(1)).take(rows).enumerate() {
        for (c, &value) in row.iter().enumerate() {
            dst[c * rows + r] = value;
        }
    }
}

/// The column-major m×width matrix at `t` written row by row to the
/// matrix at `c` (row stride `ldc`), in 8×8 tiles transposed in AVX2
/// registers.
///
/// # Safety
///
/// The CPU has AVX2, `t` holds m·width initialized elements, and `c`
/// points to m rows of at least `width` elements, `ldc` apart, that
/// nothing else touches.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose_into_rows(t: *const f32, m: usize, width: usize, c: *mut f32, ldc: usize) {
    let (tiled_rows, tiled_cols) = (m / 8 * 8, width / 8 * 8);
    for i in (0..tiled_rows).step_by(8) {
        for j in (0..tiled_cols).step_by(8) {
            // SAFETY: the tile's elements are inside both matrices.
            unsafe { transpose_tile(t.add(j * m + i), m, c.add(i * ldc + j), ldc) };
        }
    }
    for i in 0..m {
        let first = if i < tiled_rows { tiled_cols } else { 0 };
        for j in first..width {
            // SAFETY: `(i, j)` is inside both matrices.
            unsafe { *c.add(i * ldc + j) = *t.add(j * m + i) };
        }
    }
}

/// The 8×8 tile of rows `ld` apart at `src`, transposed, to the rows
/// `ldo` apart at `dst`: unpacks pair the rows' elements, shuffles make
/// quarters of columns, and 128-bit permutes join the halves.
///
/// # Safety
///
/// The CPU has AVX2 and both tiles are in bounds; `dst`'s is nobody
/// else's.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn transpose_tile(src: *const f32, ld: usize, dst: *mut f32, ldo: usize) {
    use std::arch::x86_64::*;
    // SAFETY: eight rows of eight elements from `src`, and to `dst`, in
    // bounds (contract).
    unsafe {
        let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(src.add(i * ld)));
        let pairs = [
            _mm256_unpacklo_ps(r[0], r[1]),
            _mm256_unpackhi_ps(r[0], r[1]),
            _mm256_unpacklo_ps(r[2], r[3]),
            _mm256_unpackhi_ps(r[2], r[3]),
            _mm256_unpacklo_ps(r[4], r[5]),
            _mm256_unpackhi_ps(r[4], r[5]),
            _mm256_unpacklo_ps(r[6], r[7]),
            _mm256_unpackhi_ps(r[6], r[7]),
        ];
        // Quarter `q` of rows 0–3 (`quarters[q]`) and of rows 4–7
        // (`quarters[q + 4]`): columns `q` and `q + 4` in the two halves.
        let quarters = [
            _mm256_shuffle_ps::<0x44>(pairs[0], pairs[2]),
            _mm256_shuffle_ps::<0xEE>(pairs[0], pairs[2]),
            _mm256_shuffle_ps::<0x44>(pairs[1], pairs[3]),
            _mm256_shuffle_ps::<0xEE>(pairs[1], pairs[3]),
            _mm256_shuffle_ps::<0x44>(pairs[4], pairs[6]),
            _mm256_shuffle_ps::<0xEE>(pairs[4], pairs[6]),
            _mm256_shuffle_ps::<0x44>(pairs[5], pairs[7]),
            _mm256_shuffle_ps::<0xEE>(pairs[5], pairs[7]),
        ];
        for q in 0..4 {
            let (top, bottom) = (quarters[q], quarters[q + 4]);
            _mm256_storeu_ps(
                dst.add(q * ldo),
                _mm256_permute2f128_ps::<0x20>(top, bottom),
            );
            _mm256_storeu_ps(
                dst.add((q + 4) * ldo),
                _mm256_permute2f128_ps::<0x31>(top, bottom),
            );
        }
    }
}

/// Adds columns `first..first + out.len()` of the one-row product `job`
/// to `out` when `b` has contiguous rows or contiguous columns (`a` any
/// strides); false, leaving `out` untouched, for other layouts.
fn gemv(job: &Product<'_>, first: usize, out: &mut [f32]) -> bool {
    let (a, b, k) = (job.a, job.b, job.k);
    if b.col_stride == 1 {
        let rows = &b.data[first..];
        gemv_rows(a.data, a.col_stride, rows, b.row_stride, k, out);
        true
    } else if b.row_stride == 1 && a.col_stride == 1 {
        let a = &a.data[..k];
        for (t, o) in out.iter_mut().enumerate() {
            let start = (first + t) * b.col_stride;
            *o += dot(a, &b.data[start..start + k]);
        }
        true
    } else {
        false
    }
}

/// Rows of `b` a [`gemv_rows`] step adds at once: fewer passes over the
/// output, the same additions in the same order.
const GEMV_ROWS: usize = 4;

simd_dispatch! {
    /// `out[j] += Σ_p a[p·a_stride]·b[p·row_stride + j]` for `p` in `0..k`,
    /// in `k` order, streaming each row of `b` once.
    fn gemv_rows(a: &[f32], a_stride: usize, b: &[f32], row_stride: usize, k: usize, out: &mut [f32]) {
        gemv_rows_portable(a, a_stride, b, row_stride, k, out)
    }
}

#[inline(always)]
fn gemv_rows_portable(
    a: &[f32],
    a_stride: usize,
    b: &[f32],
    row_stride: usize,
    k: usize,
    out: &mut [f32],
) {
    let width = out.len();
    let row = |p: usize| &b[p * row_stride..p * row_stride + width];
    let whole = k - k % GEMV_ROWS;
    for p in (0..whole).step_by(GEMV_ROWS) {
        let s = [0, 1, 2, 3].map(|r| a[(p + r) * a_stride]);
        let (b0, b1, b2, b3) = (row(p), row(p + 1), row(p + 2), row(p + 3));
        let rows = b0.iter().zip(b1).zip(b2).zip(b3);
        for (o, (((v0, v1), v2), v3)) in out.iter_mut().zip(rows) {
            // Left to right: the additions of four single-row steps.
            *o = *o + s[0] * v0 + s[1] * v1 + s[2] * v2 + s[3] * v3;
        }
    }
    for p in whole..k {
        let s = a[p * a_stride];
        for (o, v) in out.iter_mut().zip(row(p)) {
            *o += s * v;
        }
    }
}

/// Partial sums of [`dot`].
const DOT_LANES: usize = 16;

/// `Σ a[p]·b[p]` in [`DOT_LANES`] interleaved partial sums, added in a
/// fixed order. The one-row product's dot streams `b` from memory, and
/// there the baseline build's 128-bit loads are faster than wider ones:
/// on the EPYC hosts a whole GPT-2 decode's products read 16.5 GB/s with
/// 512-bit loads, 18 with 256-bit and 20 with 128-bit, the plain read
/// loop's 21 (`cpu_read_bandwidth_gbs`). So this is not dispatched to a
/// wider instruction set; the bits are the same on every one.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_portable(a, b)
}

#[inline(always)]
fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    lane_dot::<DOT_LANES>(a, b)
}

/// `Σ a[p]·b[p]` in `LANES` interleaved partial sums, added in order, then
/// the tail's products: the same bits for the same `LANES` on every
/// instruction set.
#[inline(always)]
pub(super) fn lane_dot<const LANES: usize>(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let (whole_a, whole_b) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = whole_a
        .remainder()
        .iter()
        .zip(whole_b.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in whole_a.zip(whole_b) {
        for l in 0..LANES {
            lanes[l] += x[l] * y[l];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::strided::proptest_config;
    use proptest::prelude::*;

    #[test]
    fn a_transpose_moves_each_element_to_its_mirror_in_registers_and_in_order() {
        // Whole 8×8 tiles, their ragged edges, and shapes below one tile.
        for (rows, cols) in [(0, 5), (1, 1), (3, 5), (8, 8), (13, 21), (64, 256), (9, 8)] {
            let src = values(rows * cols, 3);
            let mirror = |dst: &[f32]| {
                (0..rows).all(|r| (0..cols).all(|c| dst[c * rows + r] == src[r * cols + c]))
            };
            let mut dst = vec![f32::NAN; rows * cols];
            transpose(&src, (rows, cols), &mut dst);
            assert!(mirror(&dst), "{rows}×{cols}");
            let mut dst = vec![f32::NAN; rows * cols];
            transpose_in_order(&src, (rows, cols), &mut dst);
            assert!(mirror(&dst), "{rows}×{cols} in order");
        }
    }

    /// Values in [-1, 1) from `seed`, with many bits set.
    pub(super) fn values(len: usize, seed: u64) -> Vec<f32> {
        (0..len as u64)
            .map(|i| {
                let x = (i ^ seed)
                    .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    .rotate_left(29);
                (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// Each value's bits, so that NaNs compare equal.
    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    proptest! {
        #![proptest_config(proptest_config())]
        #[test]
        fn one_row_products_with_contiguous_b_rows_have_the_bits_of_the_ikj_loop(
            k in 0usize..70,
            n in 1usize..70,
            a_stride in 1usize..4,
            accumulate in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let a = values(k * a_stride, seed);
            let b = values(k * n, seed ^ 0x5555);
            let start = values(n, seed ^ 0xaaaa);
            let mut want = if accumulate { start.clone() } else { vec![0.0; n] };
            for p in 0..k {
                for (j, w) in want.iter_mut().enumerate() {
                    *w += a[p * a_stride] * b[p * n + j];
                }
            }
            let job = Product {
                m: 1,
                k,
                n,
                a: View { data: &a, row_stride: k * a_stride, col_stride: a_stride },
                b: View::row_major(&b, n),
                accumulate,
            };
            let mut got = start;
            run_on_this_thread(&job, &mut got);
            prop_assert_eq!(bits(&got), bits(&want));
        }

        /// Products with `b` transposed and few rows of `a` are written
        /// column by column into a scratch and transposed into place
        /// ([`writes_column_major`]): every element of the band, full 8×8
        /// tiles and the edges after them, lands where it belongs, within
        /// the per-k bound of the f64 product.
        #[cfg(target_arch = "x86_64")]
        #[test]
        fn products_written_column_major_land_in_place_within_the_per_k_bound(
            m in 2usize..40,
            k in 128usize..300,
            n in 150usize..220,
            first in 0usize..20,
            a_transposed in any::<bool>(),
            seed in any::<u64>(),
        ) {
            prop_assume!(std::arch::is_x86_feature_detected!("avx2"));
            let a = values(m * k, seed);
            let b = values(n * k, seed ^ 0x5555);
            let a_view = match a_transposed {
                false => View::row_major(&a, k),
                true => View::row_major(&a, m).transposed(),
            };
            let job = Product { m, k, n, a: a_view, b: View::row_major(&b, k).transposed(), accumulate: false };
            prop_assert!(writes_column_major(&job, n - first));
            let mut c = vec![f32::NAN; m * n];
            // SAFETY: the views cover the job's matrices and `c` is m×n.
            unsafe { gemm_into(&job, c.as_mut_ptr(), n, first..n) };
            for i in 0..m {
                for j in 0..n {
                    let got = c[i * n + j];
                    if j < first {
                        prop_assert!(got.is_nan(), "({}, {}) outside the band was written", i, j);
                        continue;
                    }
                    let products = (0..k).map(|p| {
                        let a = if a_transposed { a[p * m + i] } else { a[i * k + p] };
                        a as f64 * b[j * k + p] as f64
                    });
                    let (exact, magnitude) = products.fold((0.0, 0.0), |(s, t), v| (s + v, t + v.abs()));
                    let bound = super::super::matmul::error_bound(k, magnitude);
                    prop_assert!(
                        (got as f64 - exact).abs() <= bound,
                        "({}, {}): {} against {} (bound {})", i, j, got, exact, bound
                    );
                }
            }
        }

        /// [`run`] hands the microkernels an uninitialized buffer: a
        /// product that does not accumulate must write every element
        /// without reading it, so one written over NaNs equals one written
        /// over zeros, bit for bit, on every path (one row, one column,
        /// tiny depth, small and packed blocks, transposed operands).
        #[test]
        fn products_that_do_not_accumulate_never_read_their_output(
            m in 0usize..40,
            k in 0usize..40,
            n in 1usize..40,
            transposed in any::<(bool, bool)>(),
            a_step in 1usize..3,
            seed in any::<u64>(),
        ) {
            let a = values(m * k * a_step, seed);
            let b = values(k * n, seed ^ 0x5555);
            let a_view = match transposed.0 {
                false => View { data: &a, row_stride: k * a_step, col_stride: a_step },
                true => View { data: &a, row_stride: a_step, col_stride: m * a_step },
            };
            let b_view = match transposed.1 {
                false => View::row_major(&b, n),
                true => View::row_major(&b, k).transposed(),
            };
            let job = Product { m, k, n, a: a_view, b: b_view, accumulate: false };
            let mut over_nans = vec![f32::NAN; m * n];
            run_on_this_thread(&job, &mut over_nans);
            let mut over_zeros = vec![0.0; m * n];
            run_on_this_thread(&job, &mut over_zeros);
            prop_assert_eq!(bits(&over_nans), bits(&over_zeros));
            prop_assert_eq!(bits(&run(&[job])), bits(&over_zeros));
        }
    }

    #[test]
    fn one_row_products_split_across_threads_equal_the_unsplit_product() {
        // Large enough to split; b both row-major and transposed.
        let (k, n) = (1024, 2048 + 5);
        let a = values(k, 1);
        let b = values(k * n, 2);
        let b_t: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        for b_view in [
            View::row_major(&b, n),
            View::row_major(&b_t, k).transposed(),
        ] {
            let job = Product {
                m: 1,
                k,
                n,
                a: View::row_major(&a, k),
                b: b_view,
                accumulate: false,
            };
            let split = run(&[job]);
            let mut whole = vec![0.0; n];
            run_on_this_thread(&job, &mut whole);
            assert_eq!(split, whole);
            for (j, got) in whole.iter().enumerate() {
                let exact: f64 = (0..k)
                    .map(|p| f64::from(a[p]) * f64::from(b[p * n + j]))
                    .sum();
                let abs: f64 = (0..k).map(|p| f64::from(a[p] * b[p * n + j]).abs()).sum();
                let bound = super::super::matmul::error_bound(k, abs);
                assert!(
                    (f64::from(*got) - exact).abs() <= bound,
                    "column {j}: {got} vs {exact}"
                );
            }
        }
    }
}
