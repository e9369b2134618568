//! f32 matrix products on packed, register-blocked microkernels (the
//! [`gemm`] crate: AVX2/AVX-512/NEON/simd128, picked at run time), split
//! across [`crate::exec::cpu_threads`] threads by output columns.
//!
//! Every operand is a strided view, so a transposed operand is read in
//! place. Numerics: each output is a sum of `k` products accumulated in f32
//! in an order the microkernel's blocking chooses, with or without FMA, so
//! it may differ from the i-k-j loop in the last bits; the error is within
//! the classical bound `|c − ĉ| ≤ γ_k · Σ_p |a_ip|·|b_pj|`,
//! `γ_k = k·u / (1 − k·u)`, `u = 2⁻²⁴` ([`super::matmul::error_bound`]).

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

/// Runs each product of `jobs`, writing job `i`'s result to
/// `out[i·m·n .. (i+1)·m·n]` (all jobs share `m` and `n`). The jobs, or
/// the columns of each, are split across the CPU executor's threads.
///
/// # Panics
///
/// When a view does not cover its matrix or `out` is not `jobs.len()·m·n`
/// long: the callers derive both from checked shapes.
pub(crate) fn run(jobs: &[Product<'_>], out: &mut [f32]) {
    let Some(first) = jobs.first() else { return };
    let (m, n) = (first.m, first.n);
    let size = m * n;
    assert_eq!(out.len(), jobs.len() * size, "product output length");
    for job in jobs {
        assert!(
            job.m == m && job.n == n && job.fits(),
            "product operands cover their matrices"
        );
    }
    if size == 0 {
        return;
    }
    let work = jobs.iter().map(|j| j.m * j.k * j.n).sum::<usize>();
    let threads = thread_count(work);
    let out = Out(out.as_mut_ptr());
    if threads == 1 {
        for (i, job) in jobs.iter().enumerate() {
            // SAFETY: the views cover their matrices (checked above) and
            // matrix `i` of `out` is in bounds; nothing else writes it.
            unsafe { gemm_into(job, out.at(i * size), n, 0..n) };
        }
        return;
    }
    // Whole matrices per thread when there are enough, else column bands.
    let bands = threads.div_ceil(jobs.len());
    let band = n.div_ceil(bands).next_multiple_of(COLUMN_ALIGN).min(n);
    let tasks: Vec<(usize, std::ops::Range<usize>)> = (0..jobs.len())
        .flat_map(|i| (0..n).step_by(band).map(move |c| (i, c..(c + band).min(n))))
        .collect();
    let per_thread = tasks.len().div_ceil(threads);
    let out = &out;
    spawn_scoped(tasks.chunks(per_thread), |chunk| {
        for (i, cols) in chunk {
            // SAFETY: as above; the tasks write disjoint column bands of
            // disjoint matrices, so no two threads write one element.
            unsafe { gemm_into(&jobs[*i], out.at(i * size), n, cols.clone()) };
        }
    });
}

/// One product on the calling thread into the row-major `m`×`n` `out`.
///
/// # Panics
///
/// As [`run`].
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

/// Runs `f` on each item, one scoped thread each (the last on this one);
/// wasm32 runs them all in turn on this thread.
pub(crate) fn spawn_scoped<I: Send>(items: impl Iterator<Item = I>, f: impl Fn(I) + Sync) {
    #[cfg(not(target_arch = "wasm32"))]
    {
        let f = &f;
        std::thread::scope(|scope| {
            let mut items = items.peekable();
            while let Some(item) = items.next() {
                if items.peek().is_none() {
                    f(item);
                } else {
                    scope.spawn(move || f(item));
                }
            }
        });
    }
    #[cfg(target_arch = "wasm32")]
    items.for_each(f);
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
/// stride `ldc`).
///
/// # Safety
///
/// The views cover the job's matrices, `c` points to an `m`×`ldc` matrix
/// with `cols.end ≤ ldc`, and no other thread touches those columns.
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
    let stride = |s: usize| s as isize;
    // SAFETY: `gemm` reads `a` over m×k and `b` over k×width through the
    // given strides, which the views cover (checked in `run`), and writes
    // the m×width block of `c` at column `cols.start` (contract).
    unsafe {
        gemm::gemm(
            m,
            width,
            k,
            c.add(cols.start),
            1,
            stride(ldc),
            job.accumulate,
            job.a.data.as_ptr(),
            stride(job.a.col_stride),
            stride(job.a.row_stride),
            job.b.data.as_ptr().add(cols.start * job.b.col_stride),
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
