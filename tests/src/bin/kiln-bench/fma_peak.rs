//! `cpu_fma_peak_{128,256,512}_gflops`: the rate at which one core retires
//! f32 fused multiply-adds from registers, at each vector width the CPU and
//! this build run. No product can beat the figure of the width it computes
//! in, so the 128-bit one bounds every wasm32 product (simd128 and relaxed
//! SIMD are 128 bits wide): a native product's GFLOP/s over it is the least
//! ratio a browser's can reach against it on this core.
//!
//! x86-64 only; elsewhere the figures are omitted. The 512-bit figure needs
//! the `avx512` feature, as the products' AVX-512 kernels do.

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::peaks;

/// No figures where the probe has no kernels.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn peaks(_names: &[String]) -> Vec<(&'static str, f64)> {
    Vec::new()
}

/// The probe's kernels and timing.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Independent accumulators: enough to cover an FMA's latency on both of a
    /// core's FMA ports (four cycles × two ports on current x86 cores), and few
    /// enough, with the two operands, to stay in the 16 registers AVX2 has.
    const CHAINS: usize = 12;

    /// Steps of each chain a timed call runs: about 25 ms at 128 bits on a
    /// 4 GHz core.
    const STEPS: usize = 1 << 20;

    /// Timed calls; the median is the figure.
    const CALLS: usize = 11;

    /// The FMA figures `names` ask for that this CPU and build can take, as
    /// `(name, GFLOP/s)`.
    pub(crate) fn peaks(names: &[String]) -> Vec<(&'static str, f64)> {
        let mut figures = Vec::new();
        let mut take = |name: &'static str, lanes: usize, run: &dyn Fn() -> f32| {
            if super::super::matmul::wanted(name, names) {
                figures.push((name, gflops(lanes, run)));
            }
        };
        if std::arch::is_x86_feature_detected!("fma") {
            // SAFETY (both): the CPU has FMA and AVX, checked just above.
            take("cpu_fma_peak_128_gflops", 4, &|| unsafe { chains_128() });
            take("cpu_fma_peak_256_gflops", 8, &|| unsafe { chains_256() });
        }
        #[cfg(feature = "avx512")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F, checked just above.
            take("cpu_fma_peak_512_gflops", 16, &|| unsafe { chains_512() });
        }
        figures
    }

    /// GFLOP/s of `run`, which makes [`STEPS`] steps of [`CHAINS`] FMAs of
    /// `lanes` lanes (two flops a lane), in this thread's CPU time.
    fn gflops(lanes: usize, run: &dyn Fn() -> f32) -> f64 {
        let micros = kiln_tests::bench::median_cpu_micros(CALLS, || {
            std::hint::black_box(run());
        });
        (2 * lanes * CHAINS * STEPS) as f64 / (micros * 1e-6) / 1e9
    }

    /// Declares a function that runs [`CHAINS`] chains `acc = acc·x + y` for
    /// [`STEPS`] steps in one vector type and returns a lane of their sum.
    /// `x` and `y` come through `black_box` so no step can be folded away, and
    /// `acc` tends to `y / (1 − x)`, so no lane overflows or goes subnormal.
    macro_rules! fma_chains {
        ($name:ident, $features:literal, $set1:ident, $fmadd:ident, $add:ident, $lane0:ident) => {
            /// FMA chains at this width (see [`fma_chains`]).
            ///
            /// # Safety
            ///
            /// The CPU has the features the function enables.
            #[target_feature(enable = $features)]
            unsafe fn $name() -> f32 {
                let x = $set1(std::hint::black_box(0.999_9));
                let y = $set1(std::hint::black_box(1e-4));
                let mut acc = [$set1(0.0); CHAINS];
                for _ in 0..STEPS {
                    for a in &mut acc {
                        *a = $fmadd(*a, x, y);
                    }
                }
                $lane0(acc.into_iter().fold($set1(0.0), |s, a| $add(s, a)))
            }
        };
    }

    fma_chains!(
        chains_128,
        "fma,avx",
        _mm_set1_ps,
        _mm_fmadd_ps,
        _mm_add_ps,
        _mm_cvtss_f32
    );
    fma_chains!(
        chains_256,
        "fma,avx",
        _mm256_set1_ps,
        _mm256_fmadd_ps,
        _mm256_add_ps,
        _mm256_cvtss_f32
    );
    #[cfg(feature = "avx512")]
    fma_chains!(
        chains_512,
        "avx512f",
        _mm512_set1_ps,
        _mm512_fmadd_ps,
        _mm512_add_ps,
        _mm512_cvtss_f32
    );
}
