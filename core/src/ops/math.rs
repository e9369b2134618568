//! Kiln's f32 transcendental functions on the CPU: one definition of each,
//! written so loops over it vectorize.
//!
//! Every function here is plain IEEE arithmetic (no fused multiply-add, no
//! platform libm; arguments of `sin`/`cos` beyond 2^20 go through the pure
//! Rust `libm` crate, the same code on every target), and Rust never
//! contracts `a * b + c` into an FMA, so the SSE2 baseline, the AVX2 and
//! AVX-512 copies of the loops (`simd_dispatch!`) and the wasm32
//! `simd128` build compute the same bits by construction. Branches are
//! selects between values both sides compute, which LLVM turns into vector
//! blends; the slice loops of `tanh`, `erf`, `sin` and `cos` also test each
//! chunk of 16 elements and skip a branch no element of it selects
//! (`map_chunked_into`), which changes no result.
//!
//! Maximum errors in units in the last place of the f32 result, against
//! f64 references: the bound each function is documented and tested with
//! (a dense sweep of every binade, in the unit tests), and the worst error
//! over every f32 input (`exhaustive_sweep_of_unary_functions`, run with
//! `--ignored`; about 40 minutes in release mode):
//!
//! | function | bound | worst over all f32 | notes |
//! |---|---|---|---|
//! | [`exp_f32`] | 1 ulp | 0.991 | 0 below −104, `inf` from 89 on |
//! | [`log_f32`] | 1 ulp | 0.830 | `-inf` at ±0, NaN below 0 |
//! | [`tanh_f32`] | 2 ulp | 1.324 | ±1 from ±9.1 on |
//! | [`sigmoid_f32`] | 3 ulp | 2.402 | tiny results reach the denormals |
//! | [`erf_f32`] | 2 ulp | 1.376 | ±1 from ±3.92 on |
//! | [`sin_f32`], [`cos_f32`] | 1 ulp | 0.501 | f64 evaluation rounded once |
//! | [`pow_f32`] | 1 ulp | (grid) | f64 evaluation rounded once; C99 special cases |
//!
//! `sqrt` is IEEE's correctly rounded square root (`f32::sqrt`, one
//! instruction on every target), and `rsqrt` its reciprocal (≤ 1 ulp).

/// Defines `fn $name(args)` whose body, a loop over f32 elements built
/// from `#[inline(always)]` functions, is compiled three times on x86_64:
/// for AVX-512 (with the `avx512` feature), for AVX2 and for the SSE2
/// baseline, the widest the CPU has running (checked per call; the check
/// is a cached load). Elsewhere
/// (wasm32 with `simd128`, aarch64 with NEON) the one baseline copy runs.
/// None of the copies contracts into FMA, so all give the same bits.
macro_rules! simd_dispatch {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn avx512($($arg: $ty),*) $body
                #[target_feature(enable = "avx2")]
                fn avx2($($arg: $ty),*) $body
                if cfg!(feature = "avx512") && std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU supports AVX-512F, checked just above.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU supports AVX2, checked just above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $body
        }
    };
}
pub(crate) use simd_dispatch;

/// `c[0] + x·(c[1] + x·(… + x·c[n]))`: Horner's rule, lowest degree
/// first. Inlined over a constant array it unrolls into straight-line
/// multiplies and adds, the same operations in the same order as the
/// nested expression.
#[inline(always)]
fn poly32<const N: usize>(x: f32, c: [f32; N]) -> f32 {
    let (last, rest) = c.split_last().expect("a polynomial has a coefficient");
    rest.iter().rev().fold(*last, |acc, &k| acc * x + k)
}

/// [`poly32`] in f64.
#[inline(always)]
fn poly64<const N: usize>(x: f64, c: [f64; N]) -> f64 {
    let (last, rest) = c.split_last().expect("a polynomial has a coefficient");
    rest.iter().rev().fold(*last, |acc, &k| acc * x + k)
}

/// `if take_a { a } else { b }` with both computed and the choice made on
/// the bits, so LLVM keeps one straight-line (vectorizable) body instead
/// of sinking each side into a branch of its own when a side is large.
#[inline(always)]
fn select(take_a: bool, a: f32, b: f32) -> f32 {
    let mask = 0u32.wrapping_sub(u32::from(take_a));
    f32::from_bits((a.to_bits() & mask) | (b.to_bits() & !mask))
}

/// [`select`] on f64.
#[inline(always)]
fn select64(take_a: bool, a: f64, b: f64) -> f64 {
    let mask = 0u64.wrapping_sub(u64::from(take_a));
    f64::from_bits((a.to_bits() & mask) | (b.to_bits() & !mask))
}

/// Elements per chunk of the chunked loops: a whole number of SIMD
/// vectors on every target (4 SSE2 or `simd128` vectors, 2 AVX2 ones).
pub(crate) const LANES: usize = 16;

/// `e^x` in f32, within 1 ulp of the exact value (results below f32's
/// normal range are rounded once, to the denormal grid), with
/// `exp(0) == 1`, overflow to `inf`, underflow to `0` and NaN kept. Kiln's
/// one definition of `exp` (and of the exponential inside `sigmoid`,
/// `tanh` and `erf`) on the CPU.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    // Cephes-style: x = n·ln2 + r with |r| <= ln2/2, e^r by a degree-6
    // polynomial, then scaling by 2^n.
    const LN2_HI: f32 = 0.693_359_4; // few mantissa bits: n·LN2_HI is exact
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and removing 1.5·2^23 rounds to the nearest integer (ties to
    // even) with plain arithmetic, which vectorizes on every target.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-104.0, 89.0); // keeps NaN; outside, e^x is 0 or inf
    let biased = x * std::f32::consts::LOG2_E + ROUND;
    let n = biased - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = poly32(
        r,
        [
            0.5,
            1.666_666_5e-1,
            4.166_579_6e-2,
            8.333_452e-3,
            1.398_199_9e-3,
            1.987_569_1e-4,
        ],
    );
    let e = p * (r * r) + r + 1.0;
    // n as an integer, read off the low mantissa bits of `biased` (exact for
    // |n| < 2^22; a NaN input gives garbage here, but `e` is NaN anyway).
    let n = (biased.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    // 2^n as two normal powers of two, so results in the denormal range are
    // rounded once, by the second multiplication.
    let half = n >> 1;
    let scale = |k: i32| f32::from_bits((k.wrapping_add(127) as u32) << 23);
    e * scale(half) * scale(n - half)
}

/// The natural logarithm in f32, within 1 ulp: `-inf` at ±0, NaN below 0
/// and for NaN, `inf` at `inf`; subnormal inputs are exact powers of two
/// times a normal number, scaled up first.
#[inline(always)]
pub fn log_f32(x: f32) -> f32 {
    // x = 2^e·m with m in [√½, √2), ln x = e·ln2 + ln(1 + f), f = m − 1,
    // ln(1 + f) = f − f²/2 + f³·P(f) (Cephes' polynomial).
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const SQRT_HALF_BITS: i32 = 0x3f35_04f3;
    let tiny = x < f32::MIN_POSITIVE;
    let scaled = if tiny { x * 8_388_608.0 } else { x }; // 2^23
                                                         // Moving the bits by 1 − √½ puts the binade boundary at √½, so the
                                                         // exponent field is e and the rest rebuilds m in [√½, √2).
    let moved = (scaled.to_bits() as i32).wrapping_add(0x3f80_0000 - SQRT_HALF_BITS);
    let e = (moved >> 23) - 127 - if tiny { 23 } else { 0 };
    let m = f32::from_bits(((moved & 0x007f_ffff) + SQRT_HALF_BITS) as u32);
    let f = m - 1.0;
    let z = f * f;
    let p = poly32(
        f,
        [
            3.333_333e-1,
            -2.499_999_4e-1,
            2.000_071_4e-1,
            -1.666_805_8e-1,
            1.424_932_3e-1,
            -1.242_014_1e-1,
            1.167_699_9e-1,
            -1.151_461e-1,
            7.037_683_6e-2,
        ],
    ) * f
        * z;
    let e = e as f32;
    let y = p + LN2_LO * e - 0.5 * z;
    let ln = f + y + LN2_HI * e;
    // The special inputs, last to first so the earlier ones win.
    let ln = select(x == f32::INFINITY, x, ln);
    let ln = select((x < 0.0) | x.is_nan(), f32::NAN, ln);
    select(x == 0.0, f32::NEG_INFINITY, ln)
}

/// `tanh` on |x| < 1: x + x·x²·P(x²), P fitted (weighted least squares to
/// the relative error, 5.3e-9) for this module.
#[inline(always)]
fn tanh_small(x: f32) -> f32 {
    let z = x * x;
    let p = poly32(
        z,
        [
            -3.333_333_4e-1,
            1.333_331e-1,
            -5.396_342_3e-2,
            2.182_959_8e-2,
            -8.697_979e-3,
            3.206_990_2e-3,
            -9.236_334e-4,
            1.428_303_5e-4,
        ],
    );
    // x + (−0 or +0) loses the sign of −0; tanh keeps the sign of x.
    (x + x * (z * p)).copysign(x)
}

/// `tanh` on |x| >= 1: the exact identity 1 − 2/(e^2|x| + 1), where the
/// subtraction loses nothing; from 9.1 on it rounds to ±1.
#[inline(always)]
fn tanh_large(x: f32) -> f32 {
    let a = x.abs();
    (1.0 - 2.0 / (exp_f32(a + a) + 1.0)).copysign(x)
}

/// The hyperbolic tangent in f32, within 2 ulp, odd (`tanh(-0) == -0`),
/// ±1 at ±inf, NaN kept.
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    // NaN takes the small branch and stays NaN.
    select(tanh_takes_small(x), tanh_small(x), tanh_large(x))
}

/// Whether `tanh_f32(x)` is the polynomial of |x| < 1.
#[inline(always)]
pub(crate) fn tanh_takes_small(x: f32) -> bool {
    x.abs() < 1.0 || x.is_nan()
}

/// The polynomial of `tanh`, for chunks where every element takes it.
#[inline(always)]
pub(crate) fn tanh_small_f32(x: f32) -> f32 {
    tanh_small(x)
}

/// `1 / (1 + e^-x)` in f32, within 3 ulp, 0 and 1 at −inf and inf.
#[inline(always)]
pub fn sigmoid_f32(x: f32) -> f32 {
    // With e = e^−|x| <= 1: 1/(1 + e) for x >= 0 and e/(1 + e) below, so
    // e never overflows and tiny results keep their digits (down to the
    // denormals) instead of becoming 1/inf.
    let e = exp_f32(-x.abs());
    let numerator = if x >= 0.0 { 1.0 } else { e };
    numerator / (1.0 + e)
}

/// `erf` on |x| < 1: x·P(x²), P fitted (weighted least squares to the
/// relative error, 1.2e-9) for this module.
#[inline(always)]
fn erf_small(x: f32) -> f32 {
    let z = x * x;
    let p = poly32(
        z,
        [
            1.283_791_7e-1,
            -3.761_262_6e-1,
            1.128_358_5e-1,
            -2.685_381_6e-2,
            5.188_334_5e-3,
            -8.010_248e-4,
            7.854_026e-5,
        ],
    );
    // x + x·(P − 1): the rounding error of the polynomial is scaled by
    // its small size, not by erf's.
    x + x * p
}

/// `erf` on |x| >= 1: 1 − e^(−x²)·Q(x) with Q(x) = erfc(x)·e^(x²) fitted in
/// 1/x over [1, 3.92] (relative error 5.9e-8); from 3.92 on erf rounds to 1.
#[inline(always)]
fn erf_large(x: f32) -> f32 {
    // 1/x over [1/3.92, 1] mapped to [−1, 1], which keeps the fit's
    // coefficients small and Horner's rounding low.
    const MID: f32 = 0.627_551;
    const HALF_WIDTH: f32 = 0.372_449;
    let a = x.abs().min(3.92);
    let u = (1.0 / a - MID) / HALF_WIDTH;
    let q = poly32(
        u,
        [
            3.069_270_7e-1,
            1.420_538_2e-1,
            -2.386_717_2e-2,
            2.274_855_6e-3,
            4.343_073e-4,
            -3.372_717_8e-4,
            1.208_113e-4,
            -1.903_238e-5,
            -3.840_626e-6,
        ],
    );
    (1.0 - exp_f32(-(a * a)) * q).copysign(x)
}

/// The error function in f32, within 2 ulp, odd, ±1 at ±inf, NaN kept.
#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    // NaN takes the small branch and stays NaN.
    select(erf_takes_small(x), erf_small(x), erf_large(x))
}

/// Below this magnitude `sin` and `cos` reduce their argument with a
/// two-part f64 π/2, which is exact enough: the quotient fits 20 bits, so
/// its product with the 33-bit leading part is exact.
const TRIG_REDUCED_LIMIT: f32 = 1_048_576.0;

/// `sin(x)` (`quadrant_shift` 0) or `cos(x)` (1, as `sin(x + π/2)`) for
/// |x| <= [`TRIG_REDUCED_LIMIT`], evaluated in f64 and rounded once.
#[inline(always)]
fn sin_cos_reduced(x: f32, quadrant_shift: i64) -> f32 {
    const PIO2_HI: f64 = 1.570_796_326_734_125_6; // 33 significant bits
    const PIO2_LO: f64 = 6.077_100_506_506_192e-11;
    const ROUND: f64 = 6_755_399_441_055_744.0; // 1.5·2^52
    let x = f64::from(x);
    let biased = x * std::f64::consts::FRAC_2_PI + ROUND;
    let j = biased - ROUND;
    let r = x - j * PIO2_HI - j * PIO2_LO;
    let z = r * r;
    // Taylor series to r^11 and r^12 on |r| <= π/4: truncation below 1e-11,
    // far under an f32 ulp.
    // r·(1 + z·P) rather than r + r·z·P keeps the sign of r = −0; the
    // extra f64 rounding is far below the final f32 one.
    let sin = r * poly64(
        z,
        [
            1.0,
            -1.0 / 6.0,
            1.0 / 120.0,
            -1.0 / 5040.0,
            1.0 / 362_880.0,
            -1.0 / 39_916_800.0,
        ],
    );
    let cos = poly64(
        z,
        [
            1.0,
            -0.5,
            1.0 / 24.0,
            -1.0 / 720.0,
            1.0 / 40_320.0,
            -1.0 / 3_628_800.0,
            1.0 / 479_001_600.0,
        ],
    );
    // The quadrant j mod 4, read off the low mantissa bits of `biased`.
    let quadrant = (biased.to_bits() as i64).wrapping_add(quadrant_shift);
    let v = if quadrant & 1 == 0 { sin } else { cos };
    let v = if quadrant & 2 == 0 { v } else { -v };
    v as f32
}

/// Sine in f32, within 1 ulp (f64 evaluation rounded once); NaN at ±inf.
/// Beyond ±2^20 the argument goes through `libm::sinf`'s exact reduction.
#[inline(always)]
pub fn sin_f32(x: f32) -> f32 {
    if x.abs() <= TRIG_REDUCED_LIMIT {
        sin_cos_reduced(x, 0)
    } else {
        libm::sinf(x)
    }
}

/// Cosine in f32, within 1 ulp (f64 evaluation rounded once); NaN at ±inf.
/// Beyond ±2^20 the argument goes through `libm::cosf`'s exact reduction.
#[inline(always)]
pub fn cos_f32(x: f32) -> f32 {
    if x.abs() <= TRIG_REDUCED_LIMIT {
        sin_cos_reduced(x, 1)
    } else {
        libm::cosf(x)
    }
}

/// `ln|x|` of a finite nonzero f64 `x` within about 1e-15 relative, by
/// `2·atanh((m−1)/(m+1))` on m in [√½, √2).
#[inline(always)]
fn log_abs_f64(x: f64) -> f64 {
    const LN2: f64 = std::f64::consts::LN_2;
    const SQRT_HALF_HIGH_BITS: i64 = 0x3fe6_a09e_0000_0000;
    let moved = ((x.to_bits() & !(1 << 63)) as i64)
        .wrapping_add(0x3ff0_0000_0000_0000 - SQRT_HALF_HIGH_BITS);
    let e = (moved >> 52) - 1023;
    let m = f64::from_bits(((moved & 0x000f_ffff_ffff_ffff) + SQRT_HALF_HIGH_BITS) as u64);
    let s = (m - 1.0) / (m + 1.0);
    let z = s * s;
    // atanh(s)/s = Σ z^k/(2k+1); |s| < 0.172, so terms past z^8 are below 1e-16.
    let series = poly64(
        z,
        [
            1.0,
            1.0 / 3.0,
            1.0 / 5.0,
            1.0 / 7.0,
            1.0 / 9.0,
            1.0 / 11.0,
            1.0 / 13.0,
            1.0 / 15.0,
            1.0 / 17.0,
        ],
    );
    e as f64 * LN2 + 2.0 * s * series
}

/// `e^t` in f64 within about 1e-15 relative for t in [−120, 100] (outside,
/// clamped: the f32 result is 0 or inf there anyway).
#[inline(always)]
fn exp_f64(t: f64) -> f64 {
    const LN2_HI: f64 = 0.693_147_180_369_123_8; // 32 significant bits
    const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
    const ROUND: f64 = 6_755_399_441_055_744.0; // 1.5·2^52
    let t = t.clamp(-120.0, 100.0);
    let biased = t * std::f64::consts::LOG2_E + ROUND;
    let n = biased - ROUND;
    let r = t - n * LN2_HI - n * LN2_LO;
    // Taylor to r^11 on |r| <= ln2/2: truncation below 1e-14.
    let p = poly64(
        r,
        [
            1.0,
            1.0,
            1.0 / 2.0,
            1.0 / 6.0,
            1.0 / 24.0,
            1.0 / 120.0,
            1.0 / 720.0,
            1.0 / 5040.0,
            1.0 / 40_320.0,
            1.0 / 362_880.0,
            1.0 / 3_628_800.0,
            1.0 / 39_916_800.0,
        ],
    );
    let k = (biased.to_bits() as i64).wrapping_sub(ROUND.to_bits() as i64);
    p * f64::from_bits((k.wrapping_add(1023) as u64) << 52)
}

/// `x^y` in f32 within 1 ulp (`e^(y·ln|x|)` in f64, rounded once), with
/// C99's special cases (F.9.4.4): `pow(x, ±0) == 1` and `pow(1, y) == 1`
/// even for NaN, `pow(−1, ±inf) == 1`, a negative base with a non-integer
/// finite exponent gives NaN, and an odd integer exponent keeps the sign of
/// a negative (or −0, −inf) base.
#[inline(always)]
pub fn pow_f32(x: f32, y: f32) -> f32 {
    // Integer-ness and parity of y without a libm call: from 2^23 on every
    // f32 is an integer, and from 2^24 on an even one.
    const TWO_23: f32 = 8_388_608.0;
    let ay = y.abs();
    let is_integer = (ay >= TWO_23) | ((ay + TWO_23) - TWO_23 == ay);
    let is_odd = is_integer & (ay < 2.0 * TWO_23) & ((ay as i32) & 1 == 1);
    let ax = x.abs();
    // ln|x| is ±inf at 0 and inf, and NaN for NaN: f64 arithmetic carries
    // these through y·ln|x| below, so the limits come out of exp.
    let ln = log_abs_f64(f64::from(ax));
    let ln = select64(ax == f32::INFINITY, f64::INFINITY, ln);
    let ln = select64(ax.is_nan(), f64::NAN, ln);
    let ln = select64(ax == 0.0, f64::NEG_INFINITY, ln);
    let t = f64::from(y) * ln;
    // exp_f64 clamps its argument; ±inf and NaN are placed explicitly.
    let magnitude = exp_f64(t) as f32;
    let magnitude = select(t.is_nan(), f32::NAN, magnitude);
    let magnitude = select(t == f64::NEG_INFINITY, 0.0, magnitude);
    let magnitude = select(t == f64::INFINITY, f32::INFINITY, magnitude);
    let signed = select(is_odd & x.is_sign_negative(), -magnitude, magnitude);
    let one = (y == 0.0) | (x == 1.0) | ((x == -1.0) & (ay == f32::INFINITY));
    let negative_base_fraction = (x < 0.0) & x.is_finite() & y.is_finite() & !is_integer;
    select(one, 1.0, select(negative_base_fraction, f32::NAN, signed))
}

/// Maps `f` over `src` into `dst` (equal lengths): an indexed loop over
/// slices cut to one length, the form LLVM vectorizes.
#[inline(always)]
pub(crate) fn map_into(src: &[f32], dst: &mut [f32], f: impl Fn(f32) -> f32) {
    let src = &src[..dst.len()];
    for i in 0..dst.len() {
        dst[i] = f(src[i]);
    }
}

/// Maps `full` over `src` into `dst` chunk by chunk, taking `fast` for a
/// chunk where every element passes `takes_fast`. `fast` must equal `full`
/// on such elements, so the result is `full`'s, element by element; the
/// test only skips work (the far branch of `erf`, the exact reduction of
/// huge `sin` arguments) that no element of the chunk selects.
#[inline(always)]
pub(crate) fn map_chunked_into(
    src: &[f32],
    dst: &mut [f32],
    takes_fast: impl Fn(f32) -> bool,
    fast: impl Fn(f32) -> f32,
    full: impl Fn(f32) -> f32,
) {
    let src = &src[..dst.len()];
    let mut dst_chunks = dst.chunks_exact_mut(LANES);
    let mut src_chunks = src.chunks_exact(LANES);
    for (d, s) in (&mut dst_chunks).zip(&mut src_chunks) {
        // A fold, not `all`, so the test vectorizes instead of exiting early.
        if s.iter().fold(true, |all, &x| all & takes_fast(x)) {
            for i in 0..LANES {
                d[i] = fast(s[i]);
            }
        } else {
            for i in 0..LANES {
                d[i] = full(s[i]);
            }
        }
    }
    for (d, &s) in dst_chunks
        .into_remainder()
        .iter_mut()
        .zip(src_chunks.remainder())
    {
        *d = full(s);
    }
}

/// [`map_chunked_into`] with `v` as both source and destination.
#[inline(always)]
pub(crate) fn map_chunked_in_place(
    v: &mut [f32],
    takes_fast: impl Fn(f32) -> bool,
    fast: impl Fn(f32) -> f32,
    full: impl Fn(f32) -> f32,
) {
    let mut chunks = v.chunks_exact_mut(LANES);
    for d in &mut chunks {
        let mut s = [0f32; LANES];
        s.copy_from_slice(d);
        if s.iter().fold(true, |all, &x| all & takes_fast(x)) {
            for i in 0..LANES {
                d[i] = fast(s[i]);
            }
        } else {
            for i in 0..LANES {
                d[i] = full(s[i]);
            }
        }
    }
    for d in chunks.into_remainder() {
        *d = full(*d);
    }
}

/// Whether `erf_f32(x)` is `erf_small(x)`.
#[inline(always)]
pub(crate) fn erf_takes_small(x: f32) -> bool {
    x.abs() < 1.0 || x.is_nan()
}

/// `erf_small`, for chunks where every element takes it.
#[inline(always)]
pub(crate) fn erf_small_f32(x: f32) -> f32 {
    erf_small(x)
}

/// Whether `sin_f32`/`cos_f32` of `x` is the f64-reduced evaluation.
#[inline(always)]
pub(crate) fn trig_takes_reduced(x: f32) -> bool {
    x.abs() <= TRIG_REDUCED_LIMIT
}

/// The reduced sine, for chunks where every element takes it.
#[inline(always)]
pub(crate) fn sin_reduced_f32(x: f32) -> f32 {
    sin_cos_reduced(x, 0)
}

/// The reduced cosine, for chunks where every element takes it.
#[inline(always)]
pub(crate) fn cos_reduced_f32(x: f32) -> f32 {
    sin_cos_reduced(x, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error of `got` in units in the last place of the f32 nearest
    /// `exact`; in the denormal range the unit is the smallest denormal.
    /// Matching NaNs and matching infinities are 0; a NaN or infinity
    /// against anything else is infinite.
    fn ulps(got: f32, exact: f64) -> f64 {
        if got.is_nan() || exact.is_nan() {
            return if got.is_nan() && exact.is_nan() {
                0.0
            } else {
                f64::INFINITY
            };
        }
        let nearest = exact as f32;
        if got.is_infinite() || nearest.is_infinite() {
            return if f64::from(got) == exact || got == nearest {
                0.0
            } else {
                f64::INFINITY
            };
        }
        let magnitude = nearest.abs();
        let unit = if magnitude < f32::MIN_POSITIVE {
            f64::from(f32::from_bits(1))
        } else {
            f64::from(f32::from_bits(magnitude.to_bits() + 1) - magnitude)
        };
        (f64::from(got) - exact).abs() / unit
    }

    /// Every f32 bit pattern in steps of `stride` (both signs, every
    /// binade, the special values among them), then a fine linear sweep of
    /// [−12, 12] where the functions change fastest.
    fn dense_sweep(stride: usize) -> impl Iterator<Item = f32> {
        let patterns = (0..=u32::MAX).step_by(stride).map(f32::from_bits);
        let linear = (-120_000..=120_000).map(|i| i as f32 * 1e-4);
        patterns.chain(linear)
    }

    /// The largest error of `f` against `reference` over `inputs`, and where.
    fn worst(
        inputs: impl Iterator<Item = f32>,
        f: impl Fn(f32) -> f32,
        reference: impl Fn(f64) -> f64,
    ) -> (f64, f32) {
        inputs.fold((0.0, 0.0), |(err, at), x| {
            let e = ulps(f(x), reference(f64::from(x)));
            if e > err {
                (e, x)
            } else {
                (err, at)
            }
        })
    }

    fn sigmoid_f64(x: f64) -> f64 {
        1.0 / (1.0 + (-x).exp())
    }

    type Elementwise = fn(f32) -> f32;
    type Reference = fn(f64) -> f64;
    type Test = fn(f32) -> bool;

    /// Each function with its reference and documented bound (module docs).
    const UNARY: [(&str, Elementwise, Reference, f64); 7] = [
        ("exp", exp_f32, f64::exp, 1.0),
        ("log", log_f32, f64::ln, 1.0),
        ("tanh", tanh_f32, f64::tanh, 2.0),
        ("sigmoid", sigmoid_f32, sigmoid_f64, 3.0),
        ("erf", erf_f32, libm::erf, 2.0),
        ("sin", sin_f32, f64::sin, 1.0),
        ("cos", cos_f32, f64::cos, 1.0),
    ];

    #[test]
    fn unary_functions_stay_within_their_documented_ulp_bounds_on_a_dense_sweep() {
        for (name, f, reference, bound) in UNARY {
            let (err, at) = worst(dense_sweep(4099), f, reference);
            assert!(err <= bound, "{name}: {err} ulp at {at:e} (bound {bound})");
        }
    }

    #[test]
    #[ignore = "every f32 input of every function: minutes in release mode"]
    fn exhaustive_sweep_of_unary_functions() {
        for (name, f, reference, bound) in UNARY {
            let (err, at) = worst((0..=u32::MAX).map(f32::from_bits), f, reference);
            eprintln!("{name}: worst {err} ulp at {at:e}");
            assert!(err <= bound, "{name}: {err} ulp at {at:e} (bound {bound})");
        }
    }

    #[test]
    fn special_values_follow_ieee_conventions() {
        let (inf, nan) = (f32::INFINITY, f32::NAN);
        let same = |a: f32, b: f32| (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits();
        type Cases = [(f32, f32); 7];
        let table: [(&str, Elementwise, Cases); 7] = [
            (
                "exp",
                exp_f32,
                [
                    (0.0, 1.0),
                    (-0.0, 1.0),
                    (inf, inf),
                    (-inf, 0.0),
                    (nan, nan),
                    (f32::MAX, inf),
                    (1e-45, 1.0),
                ],
            ),
            (
                "log",
                log_f32,
                [
                    (0.0, -inf),
                    (-0.0, -inf),
                    (inf, inf),
                    (-inf, nan),
                    (nan, nan),
                    (-1.0, nan),
                    (1.0, 0.0),
                ],
            ),
            (
                "tanh",
                tanh_f32,
                [
                    (0.0, 0.0),
                    (-0.0, -0.0),
                    (inf, 1.0),
                    (-inf, -1.0),
                    (nan, nan),
                    (f32::MAX, 1.0),
                    (1e-45, 1e-45),
                ],
            ),
            (
                "sigmoid",
                sigmoid_f32,
                [
                    (0.0, 0.5),
                    (-0.0, 0.5),
                    (inf, 1.0),
                    (-inf, 0.0),
                    (nan, nan),
                    (f32::MAX, 1.0),
                    (-f32::MAX, 0.0),
                ],
            ),
            (
                "erf",
                erf_f32,
                [
                    (0.0, 0.0),
                    (-0.0, -0.0),
                    (inf, 1.0),
                    (-inf, -1.0),
                    (nan, nan),
                    (f32::MAX, 1.0),
                    (-1e-45, -1e-45),
                ],
            ),
            (
                "sin",
                sin_f32,
                [
                    (0.0, 0.0),
                    (-0.0, -0.0),
                    (inf, nan),
                    (-inf, nan),
                    (nan, nan),
                    (1e-45, 1e-45),
                    (-1e-40, -1e-40),
                ],
            ),
            (
                "cos",
                cos_f32,
                [
                    (0.0, 1.0),
                    (-0.0, 1.0),
                    (inf, nan),
                    (-inf, nan),
                    (nan, nan),
                    (1e-45, 1.0),
                    (-1e-40, 1.0),
                ],
            ),
        ];
        for (name, f, cases) in table {
            for (x, want) in cases {
                assert!(
                    same(f(x), want),
                    "{name}({x:e}) = {:e}, want {want:e}",
                    f(x)
                );
            }
        }
        assert_eq!(exp_f32(1.0), std::f32::consts::E);
        assert_eq!(exp_f32(89.0), f32::INFINITY);
        assert!(exp_f32(88.72).is_finite());
        assert_eq!(exp_f32(-110.0), 0.0);
        // Subnormal inputs of log are scaled into the normal range first.
        assert!(ulps(log_f32(1e-45), f64::from(1e-45f32).ln()) <= 1.0);
        assert!(ulps(log_f32(f32::MAX), f64::from(f32::MAX).ln()) <= 1.0);
        // Results in the denormal range are rounded once.
        assert!(ulps(exp_f32(-100.0), (-100f64).exp()) <= 1.0);
        // Huge arguments of sin and cos take the exact reduction.
        for x in [f32::MAX, 1e30, -3.0e7, 1_048_577.0] {
            assert!(ulps(sin_f32(x), f64::from(x).sin()) <= 1.0, "sin({x:e})");
            assert!(ulps(cos_f32(x), f64::from(x).cos()) <= 1.0, "cos({x:e})");
        }
    }

    #[test]
    fn pow_stays_within_one_ulp_on_a_grid_of_bases_and_exponents() {
        let bases = dense_sweep(1 << 22).filter(|x| *x > 0.0).step_by(97);
        let mut worst_err = (0.0, 0.0, 0.0);
        for x in bases {
            for y in (-400..=400)
                .map(|i| i as f32 * 0.37)
                .chain([0.5, -0.5, 2.0, 3.0, -1.0, 1e-3, 7e5])
            {
                let err = ulps(pow_f32(x, y), f64::from(x).powf(f64::from(y)));
                if err > worst_err.0 {
                    worst_err = (err, x, y);
                }
            }
        }
        let (err, x, y) = worst_err;
        assert!(err <= 1.0, "pow({x:e}, {y:e}) off by {err} ulp");
        // Negative bases with integer exponents.
        for (x, y) in [(-2.0f32, 3.0f32), (-1.5, -7.0), (-3.0, 20.0), (-0.75, 31.0)] {
            let err = ulps(pow_f32(x, y), f64::from(x).powf(f64::from(y)));
            assert!(err <= 1.0, "pow({x}, {y}) off by {err} ulp");
        }
    }

    #[test]
    fn pow_follows_c99_special_cases() {
        let (inf, nan) = (f32::INFINITY, f32::NAN);
        let table = [
            (0.0, -1.0, inf),
            (-0.0, -3.0, -inf),
            (-0.0, -2.0, inf),
            (-0.0, 3.0, -0.0),
            (0.0, 2.5, 0.0),
            (1.0, nan, 1.0),
            (nan, 0.0, 1.0),
            (nan, -0.0, 1.0),
            (nan, 2.0, nan),
            (2.0, nan, nan),
            (-1.0, -inf, 1.0),
            (-1.0, inf, 1.0),
            (-2.0, 3.0, -8.0),
            (-2.0, 0.5, nan),
            (-inf, -3.0, -0.0),
            (-inf, -2.0, 0.0),
            (-inf, 3.0, -inf),
            (-inf, 0.5, inf),
            (inf, -0.5, 0.0),
            (inf, 2.0, inf),
            (0.5, -inf, inf),
            (0.5, inf, 0.0),
            (2.0, -inf, 0.0),
            (2.0, inf, inf),
            (-2.0, 16_777_217.0, inf),
            (1e-45, 0.5, 3.743_392e-23),
        ];
        for (x, y, want) in table {
            let got = pow_f32(x, y);
            let same = (want.is_nan() && got.is_nan()) || want.to_bits() == got.to_bits();
            assert!(same, "pow({x}, {y}) = {got}, want {want}");
        }
    }

    #[test]
    fn chunked_maps_equal_the_element_function_bitwise() {
        // Chunks that take the fast branch, chunks that do not, and a
        // remainder shorter than a chunk.
        let mut src: Vec<f32> = (0..5 * LANES + 7)
            .map(|i| (i as f32 * 0.173).sin() * 0.9)
            .collect();
        src[LANES + 3] = 2.5;
        src[3 * LANES] = 3.0e7;
        src[4 * LANES + 1] = f32::NAN;
        let cases: [(Test, Elementwise, Elementwise); 4] = [
            (tanh_takes_small, tanh_small_f32, tanh_f32),
            (erf_takes_small, erf_small_f32, erf_f32),
            (trig_takes_reduced, sin_reduced_f32, sin_f32),
            (trig_takes_reduced, cos_reduced_f32, cos_f32),
        ];
        for (takes_fast, fast, full) in cases {
            let want: Vec<u32> = src.iter().map(|&x| full(x).to_bits()).collect();
            let mut out = vec![0f32; src.len()];
            map_chunked_into(&src, &mut out, takes_fast, fast, full);
            assert_eq!(out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
            let mut in_place = src.clone();
            map_chunked_in_place(&mut in_place, takes_fast, fast, full);
            assert_eq!(
                in_place.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want
            );
        }
    }
}
