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

    /// Steps of each chain a timed call runs: 25 million cycles, about 9 ms
    /// on a 2.75 GHz core, whatever the width.
    const STEPS: usize = 1 << 22;

    /// Rounds in which every width is timed in turn. The fastest call of each
    /// width over all rounds is its figure: the rate at the highest clock the
    /// core ran at (a shared host's cores change clock from second to
    /// second), so that a ceiling is not read low, and the widths' calls are
    /// spread over the same stretch of time.
    const ROUNDS: usize = 5;

    /// Timed calls of each width a round.
    const CALLS: usize = 3;

    /// A width's figure, the lanes of its vectors and its chains.
    type Probe = (&'static str, usize, unsafe fn() -> f32);

    /// The FMA figures `names` ask for that this CPU and build can take, as
    /// `(name, GFLOP/s)`.
    pub(crate) fn peaks(names: &[String]) -> Vec<(&'static str, f64)> {
        let mut probes: Vec<Probe> = Vec::new();
        if std::arch::is_x86_feature_detected!("fma") {
            probes.push(("cpu_fma_peak_128_gflops", 4, chains_128));
            probes.push(("cpu_fma_peak_256_gflops", 8, chains_256));
        }
        #[cfg(feature = "avx512")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            probes.push(("cpu_fma_peak_512_gflops", 16, chains_512));
        }
        probes.retain(|(name, ..)| super::super::matmul::wanted(name, names));
        let mut fastest = vec![f64::INFINITY; probes.len()];
        for _ in 0..ROUNDS {
            for ((_, _, chains), best) in probes.iter().zip(&mut fastest) {
                let micros = kiln_tests::bench::fastest_cpu_micros(CALLS, || {
                    // SAFETY: a probe is listed only where the CPU has the
                    // features its chains enable (checked above).
                    std::hint::black_box(unsafe { chains() });
                });
                *best = best.min(micros);
            }
        }
        probes
            .iter()
            .zip(fastest)
            .map(|((name, lanes, _), micros)| {
                let flops = 2 * lanes * CHAINS * STEPS;
                (*name, flops as f64 / (micros * 1e-6) / 1e9)
            })
            .collect()
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
