// The meaning of every elementwise op on the GPU: one function per op and
// operand kind, named `<op>_<kind>` after the core's op names (`exp_f32`,
// `maximum_i32`, `less_bool`, `cast_f32_to_u8`). The kernel generator calls
// these by name, and an op with no function here for a kind has no kernel
// for it. They mirror the reference evaluation in `kiln::ops`: integers
// wrap, integer division by zero gives 0, maximum and minimum propagate NaN,
// float-to-integer casts truncate and saturate, NaN casting to 0.
//
// Every function works on lanes: the kernel defines vf32, vi32, vu32 and
// vbool as scalars, or as vec4 where each invocation computes four
// elements. So bodies use only component-wise operations (select, not if;
// `|` and `&`, not `||` and `&&`), and constants are splatted (`vf32(0.0)`).
// f16 and bf16 compute with the f32 functions and u8 with the u32 ones; the
// generator rounds them after every op. The one exception is integer to
// f16/bf16 (`cast_i32_to_bf16`, ...), which must round once from the exact
// integer rather than through f32.
//
// Float math is the CPU's (`kiln::ops::math`), not WGSL's builtins, whose
// accuracy the spec leaves loose (sin and cos only on [−π, π], exp2 and
// log2 of special values undefined, `/` to 2.5 ulp): the same algorithms,
// range reduction and special-value handling, each within the CPU
// function's documented bound of the exact result (exp, log, sin, cos and
// pow 1 ulp, tanh and erf 2, sigmoid 3; sqrt correctly rounded, rsqrt
// 1 ulp), and NaN, ±inf and ±0 results bit for bit. The conformance suite
// (`tests/tests/wgpu_math.rs`) checks them against the CPU.
//
// Special values use bit tests (is_nan_f32, is_inf_f32) and explicit
// selects rather than trusting builtins or arithmetic on them. WGSL lets
// an implementation flush subnormal f32 and f16 inputs, intermediates and
// results to zero, so a backend may give zero where the reference (which
// keeps subnormals) gives a value below 2^-126 (2^-14 for f16 data); the
// functions are written so that a flushed input gives the flushed input's
// result (log of a subnormal is then −inf, pow(1e-40, −1) inf), never a
// third value. lavapipe keeps subnormals; the conformance suite's
// subnormal rule (`kiln_tests::conformance::may_flush`) allows the flush
// and no more.

fn is_nan_f32(x: vf32) -> vbool {
    // A bit test, immune to compilers that assume NaN never occurs.
    return (bitcast<vu32>(x) & vu32(0x7fffffffu)) > vu32(0x7f800000u);
}

fn is_inf_f32(x: vf32) -> vbool {
    return (bitcast<vu32>(x) & vu32(0x7fffffffu)) == vu32(0x7f800000u);
}

fn nan_f32() -> vf32 {
    return vf32(quiet_nan());
}

fn bool_to_u32(x: vbool) -> vu32 {
    return select(vu32(0u), vu32(1u), x);
}

// ---- exact f32 building blocks ----
// The transcendental functions below are Kiln's CPU functions
// (`kiln::ops::math`) ported op for op; where the CPU computes in f64,
// they carry the extra digits as unevaluated sums hi + lo of two f32
// (double-f32), built only from the error-free transformations here.
// These hold whether or not a compiler contracts a·b + c into an FMA:
// every product they form is exact (`two_prod` splits by masking bits,
// not by Veltkamp's multiply). Compilers that simplify float algebra as
// if it were exact (Mesa rewrites (a + b) − a to b, which zeroes every
// error term) are kept off them by `opaque`.

// x itself, through a select no compiler can resolve (only the NaN with
// all bits set takes the other side, and −x of it is a NaN too), so that
// (a + b) − a is not simplified to b, nor a product fused into a later
// sum, where the rounding error is what is being computed.
fn opaque(x: vf32) -> vf32 {
    return select(x, -x, bitcast<vu32>(x) == vu32(0xffffffffu));
}

struct Df32 {
    hi: vf32,
    lo: vf32,
}

// 2^k for integer k in [-126, 127], from its bits: exact where `ldexp`
// is indeterminate outside the normal range.
fn pow2_f32(k: vi32) -> vf32 {
    return bitcast<vf32>(vu32(k + vi32(127)) << vu32(23u));
}

// |magnitude| with the sign bit of `sign_of`.
fn copysign_f32(magnitude: vf32, sign_of: vf32) -> vf32 {
    let bits = (bitcast<vu32>(magnitude) & vu32(0x7fffffffu)) | (bitcast<vu32>(sign_of) & vu32(0x80000000u));
    return bitcast<vf32>(bits);
}

// a + b as hi + lo exactly (Knuth's two-sum).
fn two_sum(a: vf32, b: vf32) -> Df32 {
    let s = opaque(a + b);
    let bb = opaque(s - a);
    return Df32(s, (a - (s - bb)) + (b - bb));
}

// a + b as hi + lo exactly, for |a| >= |b| or a = 0.
fn fast_two_sum(a: vf32, b: vf32) -> Df32 {
    let s = opaque(a + b);
    return Df32(s, b - (s - a));
}

// a·b as hi + lo exactly (Dekker), barring overflow and underflow. Each
// factor splits into its top 12 significand bits (a mask) and the exact
// rest, so the four partial products are exact in f32.
fn two_prod(a: vf32, b: vf32) -> Df32 {
    let p = opaque(a * b);
    let a_hi = bitcast<vf32>(bitcast<vu32>(a) & vu32(0xfffff000u));
    let b_hi = bitcast<vf32>(bitcast<vu32>(b) & vu32(0xfffff000u));
    let a_lo = a - a_hi;
    let b_lo = b - b_hi;
    return Df32(p, (((a_hi * b_hi - p) + a_hi * b_lo) + a_lo * b_hi) + a_lo * b_lo);
}

fn df_add(a: Df32, b: Df32) -> Df32 {
    let s = two_sum(a.hi, b.hi);
    return fast_two_sum(s.hi, s.lo + (a.lo + b.lo));
}

fn df_mul(a: Df32, b: Df32) -> Df32 {
    let p = two_prod(a.hi, b.hi);
    return fast_two_sum(p.hi, p.lo + (a.hi * b.lo + a.lo * b.hi));
}

fn df_mul_f32(a: Df32, b: vf32) -> Df32 {
    let p = two_prod(a.hi, b);
    return fast_two_sum(p.hi, p.lo + a.lo * b);
}

// a / b as the CPU rounds it (within a hair of half an ulp): WGSL allows
// `/` 2.5 ulp, so the quotient is corrected once by its exact residual
// a − q·b. Where that residual is not finite (b infinite, a quotient
// overflowing to inf) the plain quotient is already exact, and where it is
// zero q is the exact quotient (whose zero keeps its sign: −0 + 0 is +0).
// The residual is exact only while two_prod's split halves and partial
// products stay above the subnormal range (|q|, |b| ≥ 2^-102 and
// |q·b| ≥ 2^-78); outside it the plain quotient stands. A divisor above
// 2^126 has a subnormal reciprocal, which a GPU computing a·(1/b) flushes
// (inf / 3e38 became NaN on NVIDIA), so both operands are scaled by 2^-4
// first: exact, except for a dividend so small that the quotient
// underflows anyway.
fn div_corrected(a: vf32, b: vf32) -> vf32 {
    let scale = select(vf32(1.0), vf32(0.0625), abs(b) > vf32(8.507059e37));
    let q = (a * scale) / (b * scale);
    let p = two_prod(q, b);
    let residual = (a - p.hi) - p.lo;
    let corrected = q + (residual * scale) / (b * scale);
    let exact_residual = (abs(p.hi) >= vf32(3.3087225e-24))
        & (min(abs(q), abs(b)) >= vf32(1.9721523e-31));
    let keep = is_nan_f32(corrected) | (residual == vf32(0.0)) | !exact_residual;
    return select(corrected, q, keep);
}

// div_corrected of the operands' significands (both brought into [1, 2)
// by their exponents, where the residual is always exact), scaled back by
// the exponents' difference: exact while the quotient is normal, however
// small or large the operands (div_corrected alone leaves a quotient near
// 2^-100, or one by a divisor near 2^-126, uncorrected, and NVIDIA's plain
// quotient there was 1 ulp off). Zeros, infinities, NaN, subnormal
// operands and subnormal quotients take div_corrected (scaling back would
// round a subnormal quotient twice). ldexp goes in two halves: WGSL leaves
// an exponent above 128 undefined.
fn div_rounded(a: vf32, b: vf32) -> vf32 {
    let plain = div_corrected(a, b);
    let a_bits = bitcast<vu32>(a);
    let b_bits = bitcast<vu32>(b);
    let a_exponent = (a_bits >> vu32(23u)) & vu32(0xffu);
    let b_exponent = (b_bits >> vu32(23u)) & vu32(0xffu);
    let normal_operands = (a_exponent >= vu32(1u)) & (a_exponent <= vu32(254u))
        & (b_exponent >= vu32(1u)) & (b_exponent <= vu32(254u));
    let a_significand = bitcast<vf32>((a_bits & vu32(0x807fffffu)) | vu32(0x3f800000u));
    let b_significand = bitcast<vf32>((b_bits & vu32(0x807fffffu)) | vu32(0x3f800000u));
    let shift = bitcast<vi32>(a_exponent) - bitcast<vi32>(b_exponent);
    let half = shift / vi32(2);
    let scaled = ldexp(ldexp(div_corrected(a_significand, b_significand), half), shift - half);
    let normal = abs(scaled) >= vf32(1.1754944e-38);
    return select(plain, scaled, normal_operands & normal);
}

// ---- unary ----

fn neg_f32(x: vf32) -> vf32 { return -x; }
fn abs_f32(x: vf32) -> vf32 { return abs(x); }
// +0 for every negative number and −0, as maximum(x, +0); NaN stays NaN.
// A bit test on the sign: a compiler that assumes NaN never occurs turns
// `select(x, 0, x <= 0)` into max(x, 0), which drops NaN (NVIDIA does).
fn relu_f32(x: vf32) -> vf32 {
    let negative = (bitcast<vu32>(x) >> vu32(31u)) == vu32(1u);
    return select(x, vf32(0.0), negative & !is_nan_f32(x));
}

// x − a·b exactly (for a·b near x), whose sign tells whether a·b
// exceeds x.
fn residual_f32(x: vf32, a: vf32, b: vf32) -> vf32 {
    let p = two_prod(a, b);
    return (x - p.hi) - p.lo;
}

// The correctly rounded square root, as the CPU's `f32::sqrt`: WGSL's
// builtin may be off by a few ulp, so it is corrected by Newton's step
// on the exact residual x − s², then rounded by Tuckerman's test (s is
// the nearest f32 to √x iff s·s⁻ < x <= s·s⁺ for its neighbours s⁻, s⁺).
// x is scaled by 2^±48 first where s² would leave the normal range, or
// the residual's low partial products (about x·2^-46) would fall below
// 2^-126, where a GPU that flushes subnormals drops them.
// sqrt(±0) = ±0, sqrt(inf) = inf, NaN below 0.
fn sqrt_f32(x: vf32) -> vf32 {
    let tiny = x < vf32(1.3234889800848443e-23); // 2^-76
    let huge = x > vf32(1.2676506e30); // 2^100
    let scaled = x * select(select(vf32(1.0), vf32(3.5527137e-15), huge), vf32(281474976710656.0), tiny);
    let s0 = sqrt(scaled);
    let s = s0 + residual_f32(scaled, s0, s0) / (s0 + s0);
    let below = bitcast<vf32>(bitcast<vu32>(s) - vu32(1u));
    let above = bitcast<vf32>(bitcast<vu32>(s) + vu32(1u));
    let down = select(s, below, residual_f32(scaled, s, below) <= vf32(0.0));
    let rounded = select(down, above, residual_f32(scaled, s, above) > vf32(0.0));
    let root = rounded * select(select(vf32(1.0), vf32(16777216.0), huge), vf32(5.9604645e-8), tiny);
    // ±0 from the sign bit alone: where a GPU flushes a subnormal x, `x ==
    // 0` holds but x itself is no zero, and sqrt(flushed −x) is −0.
    let zero = bitcast<vf32>(bitcast<vu32>(x) & vu32(0x80000000u));
    let special = select(select(root, x, x == vf32(pos_inf())), zero, x == vf32(0.0));
    return select(special, nan_f32(), (x < vf32(0.0)) | is_nan_f32(x));
}

// 1/sqrt(x) rounded twice, as the CPU's `1.0 / x.sqrt()`.
fn rsqrt_f32(x: vf32) -> vf32 { return div_rounded(vf32(1.0), sqrt_f32(x)); }

// e^x within 1 ulp, as `kiln::ops::math::exp_f32`: x = n·ln2 + r with
// |r| <= ln2/2, e^r by a degree-6 polynomial, then scaling by 2^n in two
// normal steps so results in the denormal range round once. `round` is
// WGSL's ties-to-even rounding, which the CPU gets from adding 1.5·2^23.
fn exp_f32(x: vf32) -> vf32 {
    let clamped = clamp(x, vf32(-104.0), vf32(89.0));
    let n = round(clamped * 1.4426950408889634);
    // n·0.6933594 (few mantissa bits) is exact, with or without an FMA.
    let r = (clamped - n * 0.6933594) - n * -2.1219444e-4;
    let p = ((((1.9875691e-4 * r + 1.3981999e-3) * r + 8.333452e-3) * r + 4.1665796e-2) * r
        + 1.6666665e-1) * r + 0.5;
    let e = p * (r * r) + r + 1.0;
    let k = vi32(n);
    let half = k >> vu32(1u);
    let scaled = e * pow2_f32(half) * pow2_f32(k - half);
    return select(scaled, x, is_nan_f32(x));
}

// ln x within 1 ulp, as `kiln::ops::math::log_f32`: x = 2^e·m with m in
// [√½, √2), ln x = e·ln2 + ln(1 + f), f = m − 1, by Cephes' polynomial.
// Subnormal x is scaled by 2^23 first; where a GPU flushes it, the scaled
// value is zero and the result is −inf, log of the flushed input. −inf at
// ±0, NaN below 0 and for NaN, inf at inf.
fn log_f32(x: vf32) -> vf32 {
    let tiny = x < vf32(1.1754944e-38);
    let scaled = select(x, x * 8388608.0, tiny);
    // Moving the bits by 1 − √½ puts the binade boundary at √½, so the
    // exponent field is e and the rest rebuilds m in [√½, √2).
    let moved = bitcast<vi32>(scaled) + vi32(0x3f800000 - 0x3f3504f3);
    let e = vf32((moved >> vu32(23u)) - vi32(127) - select(vi32(0), vi32(23), tiny));
    let m = bitcast<vf32>((moved & vi32(0x007fffff)) + vi32(0x3f3504f3));
    let f = m - 1.0;
    let z = f * f;
    let p = ((((((((7.0376836e-2 * f - 1.151461e-1) * f + 1.1676999e-1) * f - 1.2420141e-1) * f
        + 1.4249323e-1) * f - 1.6668058e-1) * f + 2.0000714e-1) * f - 2.4999994e-1) * f
        + 3.333333e-1) * f * z;
    let y = p + -2.1219444e-4 * e - 0.5 * z;
    // 0.6933594·e is exact, with or without an FMA.
    let ln = f + y + 0.6933594 * e;
    let ln_inf = select(ln, x, x == vf32(pos_inf()));
    let ln_nan = select(ln_inf, nan_f32(), (x < vf32(0.0)) | is_nan_f32(x));
    return select(ln_nan, vf32(-pos_inf()), scaled == vf32(0.0));
}

// tanh within 2 ulp, as `kiln::ops::math::tanh_f32`: x + x·x²·P(x²) below
// |x| = 1, 1 − 2/(e^2|x| + 1) from there (|x| capped at 10, where it has
// rounded to 1 long before, so e^2|x| stays finite). Odd, ±1 at ±inf.
fn tanh_f32(x: vf32) -> vf32 {
    let z = x * x;
    let p = (((((((1.4283035e-4 * z - 9.236334e-4) * z + 3.2069902e-3) * z - 8.697979e-3) * z
        + 2.1829598e-2) * z - 5.3963423e-2) * z + 1.333331e-1) * z - 3.3333334e-1);
    let small = copysign_f32(x + x * (z * p), x);
    let a = min(abs(x), vf32(10.0));
    let large = copysign_f32(1.0 - div_rounded(vf32(2.0), exp_f32(a + a) + 1.0), x);
    return select(large, small, (abs(x) < vf32(1.0)) | is_nan_f32(x));
}

// 1/(1 + e^-x) within 3 ulp, as `kiln::ops::math::sigmoid_f32`: with
// e = e^−|x|, 1/(1 + e) for x >= 0 and e/(1 + e) below.
fn sigmoid_f32(x: vf32) -> vf32 {
    let e = exp_f32(-abs(x));
    return div_rounded(select(e, vf32(1.0), x >= vf32(0.0)), 1.0 + e);
}

// erf within 2 ulp, as `kiln::ops::math::erf_f32`: x + x·P(x²) below
// |x| = 1 (so erf(−0) = −0), 1 − e^(−x²)·Q(1/x) from there, 1 from 3.92
// on. Odd, ±1 at ±inf.
fn erf_f32(x: vf32) -> vf32 {
    let z = x * x;
    let p = (((((7.854026e-5 * z - 8.010248e-4) * z + 5.1883345e-3) * z - 2.6853816e-2) * z
        + 1.1283585e-1) * z - 3.7612626e-1) * z + 1.2837917e-1;
    let small = x + x * p;
    let a = min(abs(x), vf32(3.92));
    // 1/a over [1/3.92, 1] mapped to [−1, 1].
    let u = div_rounded(div_rounded(vf32(1.0), a) - 0.627551, vf32(0.372449));
    let q = (((((((-3.840626e-6 * u - 1.903238e-5) * u + 1.208113e-4) * u - 3.3727178e-4) * u
        + 4.343073e-4) * u + 2.2748556e-3) * u - 2.3867172e-2) * u + 1.4205382e-1) * u
        + 3.0692707e-1;
    let large = copysign_f32(1.0 - exp_f32(-(a * a)) * q, x);
    return select(large, small, (abs(x) < vf32(1.0)) | is_nan_f32(x));
}

// ---- sin and cos ----
// As `kiln::ops::math::sin_f32` (f64 evaluation, libm's exact reduction
// beyond 2^20), within 1 ulp: x = j·π/2 + r, |r| <= π/4, with r as a
// double-f32 from an exact (Payne–Hanek) reduction at every magnitude,
// and sin r or cos r by Taylor polynomials whose leading terms are summed
// exactly.

// Word i of 2/π's bits after two zero words (so a window of them may
// start before the binary point), by selects, since the index differs
// between lanes.
fn two_over_pi_word(i: vu32) -> vu32 {
    let w2 = select(vu32(0u), vu32(0xa2f9836eu), i == vu32(2u));
    let w3 = select(w2, vu32(0x4e441529u), i == vu32(3u));
    let w4 = select(w3, vu32(0xfc2757d1u), i == vu32(4u));
    let w5 = select(w4, vu32(0xf534ddc0u), i == vu32(5u));
    let w6 = select(w5, vu32(0xdb629599u), i == vu32(6u));
    let w7 = select(w6, vu32(0x3c439041u), i == vu32(7u));
    return select(w7, vu32(0xfe5163abu), i == vu32(8u));
}

// The 32 bits of 2/π's table from bit `o` (0..31) of word `i` on.
fn two_over_pi_bits(i: vu32, o: vu32) -> vu32 {
    // Shifting by 32 is a shift by 0 in WGSL, so the second word moves in
    // two steps.
    return (two_over_pi_word(i) << o) | ((two_over_pi_word(i + 1u) >> vu32(1u)) >> (vu32(31u) - o));
}

// a·b as a 64-bit product (hi, lo) from 16-bit halves.
struct Wide {
    hi: vu32,
    lo: vu32,
}

fn mul_wide(a: vu32, b: vu32) -> Wide {
    let a_lo = a & vu32(0xffffu);
    let a_hi = a >> vu32(16u);
    let b_lo = b & vu32(0xffffu);
    let b_hi = b >> vu32(16u);
    let ll = a_lo * b_lo;
    let lh = a_lo * b_hi;
    let hl = a_hi * b_lo;
    let mid = (ll >> vu32(16u)) + (lh & vu32(0xffffu)) + (hl & vu32(0xffffu));
    let lo = (mid << vu32(16u)) | (ll & vu32(0xffffu));
    let hi = a_hi * b_hi + (lh >> vu32(16u)) + (hl >> vu32(16u)) + (mid >> vu32(16u));
    return Wide(hi, lo);
}

struct Reduced {
    r: Df32,
    quadrant: vu32,
}

// |x| = j·π/2 + r for finite |x| >= 2^-38: x's 24-bit significand M
// (x = M·2^E) times a 96-bit window of 2/π's bits from bit E − 1, where
// earlier bits only add multiples of 4 to x·2/π. The product's top two
// bits are j mod 4, the next 64 the fraction, rounded to the nearest
// quadrant; 96 bits leave an error below 2^-70 in x·2/π.
fn reduce_pio2(ax: vf32) -> Reduced {
    let bits = bitcast<vu32>(ax);
    let significand = (bits & vu32(0x007fffffu)) | vu32(0x00800000u);
    // Bit E + 62 of the table is 2/π's bit E − 1.
    let start = (bits >> vu32(23u)) - vu32(150u - 62u);
    let word = start >> vu32(5u);
    let offset = start & vu32(31u);
    let w0 = two_over_pi_bits(word, offset);
    let w1 = two_over_pi_bits(word + 1u, offset);
    let w2 = two_over_pi_bits(word + 2u, offset);
    // M·(w0:w1:w2) mod 2^96; M·w0 counts only in its low word.
    let p2 = mul_wide(significand, w2);
    let p1 = mul_wide(significand, w1);
    let r1 = p1.lo + p2.hi;
    let r2 = significand * w0 + p1.hi + select(vu32(0u), vu32(1u), r1 < p1.lo);
    let r0 = p2.lo;
    // The fraction's 64 bits, two's-complement negated when it is >= ½ so
    // that it rounds to the next quadrant.
    let f_hi = (r2 << vu32(2u)) | (r1 >> vu32(30u));
    let f_lo = (r1 << vu32(2u)) | (r0 >> vu32(30u));
    let up = f_hi >= vu32(0x80000000u);
    let n_lo = ~f_lo + vu32(1u);
    let n_hi = ~f_hi + select(vu32(0u), vu32(1u), n_lo == vu32(0u));
    let g_hi = select(f_hi, n_hi, up);
    let g_lo = select(f_lo, n_lo, up);
    // Normalized so the leading one is bit 63, in two 24-bit f32 parts.
    let empty = g_hi == vu32(0u);
    let h = select(g_hi, g_lo, empty);
    let l = select(g_lo, vu32(0u), empty);
    let lz = countLeadingZeros(h);
    let n_h = (h << lz) | ((l >> vu32(1u)) >> (vu32(31u) - lz));
    let n_l = l << lz;
    let scale = vi32(lz) + select(vi32(0), vi32(32), empty);
    let hi = vf32(n_h >> vu32(8u)) * pow2_f32(vi32(-24) - scale);
    let lo = vf32(((n_h & vu32(0xffu)) << vu32(16u)) | (n_l >> vu32(16u))) * pow2_f32(vi32(-48) - scale);
    let fraction = fast_two_sum(hi, lo);
    let r = df_mul(fraction, Df32(vf32(1.5707964), vf32(-4.371139e-8)));
    let signed = Df32(select(r.hi, -r.hi, up), select(r.lo, -r.lo, up));
    return Reduced(signed, (r2 >> vu32(30u)) + select(vu32(0u), vu32(1u), up));
}

// sin x (quadrant_shift 0) or cos x (1, as sin(x + π/2)).
fn sin_cos_f32(x: vf32, quadrant_shift: u32) -> vf32 {
    let ax = abs(x);
    let small = ax < vf32(0.7853981);
    let reduced = reduce_pio2(ax);
    let rh_abs = select(reduced.r.hi, ax, small);
    let rl_abs = select(reduced.r.lo, vf32(0.0), small);
    let j_abs = select(reduced.quadrant, vu32(0u), small);
    // sin(−x) = −sin x: x = −(j·π/2 + r) = (−j)·π/2 + (−r).
    let negative = x < vf32(0.0);
    let rh = select(rh_abs, -rh_abs, negative);
    let rl = select(rl_abs, -rl_abs, negative);
    let j = select(j_abs, vu32(0u) - j_abs, negative) + quadrant_shift;
    let z = rh * rh;
    // sin r = r + r³·S(r²) + rl·cos r, Taylor to r^11.
    let s = ((((-2.5052108e-8 * z + 2.7557319e-6) * z - 1.9841270e-4) * z + 8.3333333e-3) * z
        - 1.6666667e-1);
    let sin_r = rh + ((rl - rl * (0.5 * z)) + rh * (z * s));
    // cos r = 1 − r²/2 + r⁴·C(r²) − r·rl, Taylor to r^12, with 1 − rh²/2
    // exact as a double-f32.
    let c = ((((2.0876757e-9 * z - 2.7557319e-7) * z + 2.4801587e-5) * z - 1.3888889e-3) * z
        + 4.1666667e-2);
    let square = two_prod(rh, rh);
    let one_minus = two_sum(vf32(1.0), -0.5 * square.hi);
    let cos_r = one_minus.hi + (((one_minus.lo - 0.5 * square.lo) - rh * rl) + z * z * c);
    let v = select(sin_r, cos_r, (j & vu32(1u)) == vu32(1u));
    let signed = select(v, -v, (j & vu32(2u)) == vu32(2u));
    let finite = select(signed, nan_f32(), is_inf_f32(x) | is_nan_f32(x));
    // sin(±0) = ±0, which r + (+0) would lose.
    return select(finite, x, (x == vf32(0.0)) & vbool(quadrant_shift == 0u));
}

fn sin_f32(x: vf32) -> vf32 { return sin_cos_f32(x, 0u); }
fn cos_f32(x: vf32) -> vf32 { return sin_cos_f32(x, 1u); }

fn neg_i32(x: vi32) -> vi32 { return -x; }
fn abs_i32(x: vi32) -> vi32 { return abs(x); }
fn relu_i32(x: vi32) -> vi32 { return max(x, vi32(0)); }
fn abs_u32(x: vu32) -> vu32 { return x; }
fn relu_u32(x: vu32) -> vu32 { return x; }

// ---- binary arithmetic ----

fn add_f32(a: vf32, b: vf32) -> vf32 { return a + b; }
fn sub_f32(a: vf32, b: vf32) -> vf32 { return a - b; }
fn mul_f32(a: vf32, b: vf32) -> vf32 { return a * b; }
// Rounded as the CPU's division, not to WGSL's 2.5 ulp (see div_rounded).
fn div_f32(a: vf32, b: vf32) -> vf32 { return div_rounded(a, b); }
// IEEE 754-2019 maximum and minimum, as the reference's: NaN propagates and
// +0 > -0 whatever the operand order (equal operands differ at most in the
// sign of zero, which the AND or OR of their bits settles).
fn maximum_f32(a: vf32, b: vf32) -> vf32 {
    let tied = bitcast<vf32>(bitcast<vu32>(a) & bitcast<vu32>(b));
    return select(select(b, a, (a > b) | is_nan_f32(a)), tied, a == b);
}
fn minimum_f32(a: vf32, b: vf32) -> vf32 {
    let tied = bitcast<vf32>(bitcast<vu32>(a) | bitcast<vu32>(b));
    return select(select(b, a, (a < b) | is_nan_f32(a)), tied, a == b);
}

// ln m as a double-f32 for m in [√½, √2), within about 2^-37 relative:
// 2·atanh(s) with s = (m − 1)/(m + 1) = f/(2 + f), summed as
// 2s + s³·(2/3 + s²·R(s²)) with s, s³ and 2/3 carried as double-f32 and
// s²·R(s²), below 2^-6 of the bracket, in f32.
fn log_df(m: vf32) -> Df32 {
    let f = m - 1.0;
    let d = two_sum(vf32(2.0), f);
    // The quotient corrected by its exact residual, whatever `/` rounds.
    let s_hi = f / d.hi;
    let p = two_prod(s_hi, d.hi);
    let s = fast_two_sum(s_hi, (((f - p.hi) - p.lo) - s_hi * d.lo) / d.hi);
    let u = s.hi * s.hi;
    // Σ 2u^k/(2k + 5) for k <= 5: the next term is below 2^-44 of ln m.
    let series = ((((0.13333334 * u + 0.15384616) * u + 0.18181819) * u + 0.22222222) * u
        + 0.2857143) * u + 0.4;
    let bracket_sum = two_sum(vf32(0.6666667), u * series);
    let bracket = fast_two_sum(bracket_sum.hi, bracket_sum.lo - 1.9868215e-8);
    let square = two_prod(s.hi, s.hi);
    let s2 = fast_two_sum(square.hi, square.lo + 2.0 * s.hi * s.lo);
    let odd = df_mul(df_mul(s2, s), bracket);
    return df_add(Df32(2.0 * s.hi, 2.0 * s.lo), odd);
}

// |x|^y for finite nonzero x and finite y, as the CPU's `e^(y·ln|x|)` in
// f64 rounded once, within 1 ulp: t = y·log2|x| as a double-f32 (about
// 2^-36 relative, so below 2^-28 absolute where the result is finite and
// nonzero), t = n + r with |r| <= ½, 2^r = e^a with a = r·ln2 summed with
// its leading terms exact, then scaled by 2^n in two normal steps.
fn pow_magnitude(ax: vf32, y: vf32) -> vf32 {
    let tiny = ax < vf32(1.1754944e-38);
    let scaled = select(ax, ax * 8388608.0, tiny);
    let moved = bitcast<vi32>(scaled) + vi32(0x3f800000 - 0x3f3504f3);
    let e = vf32((moved >> vu32(23u)) - vi32(127) - select(vi32(0), vi32(23), tiny));
    let m = bitcast<vf32>((moved & vi32(0x007fffff)) + vi32(0x3f3504f3));
    let log2_m = df_mul(log_df(m), Df32(vf32(1.442695), vf32(1.925963e-8)));
    let t = df_mul_f32(df_add(Df32(e, vf32(0.0)), log2_m), y);
    let n = round(t.hi);
    // t.hi − n is exact.
    let r = two_sum(t.hi - n, t.lo);
    let a = df_mul(r, Df32(vf32(0.6931472), vf32(-1.9046543e-9)));
    // e^a = 1 + a + a²/2 + a³·P(a), P Taylor to a^9 (|a| <= 0.35: the
    // rest is below 2^-32), the first three terms summed exactly.
    let square = two_prod(a.hi, a.hi);
    let one_plus = two_sum(vf32(1.0), a.hi);
    let head = two_sum(one_plus.hi, 0.5 * square.hi);
    let p = (((((2.7557319e-6 * a.hi + 2.4801588e-5) * a.hi + 1.984127e-4) * a.hi + 1.3888889e-3)
        * a.hi + 8.333334e-3) * a.hi + 4.1666668e-2) * a.hi + 1.6666667e-1;
    let tail = (((one_plus.lo + head.lo) + (a.lo + 0.5 * square.lo)) + a.hi * a.lo)
        + a.hi * square.hi * p;
    let k = vi32(n);
    let half = k >> vu32(1u);
    let magnitude = (head.hi + tail) * pow2_f32(half) * pow2_f32(k - half);
    // Beyond, the result is 0 or inf (and t, the double-f32, may have
    // overflowed): 2^-151 rounds to 0, 2^128.5 to inf.
    let rough = y * (e + log2_m.hi);
    let saturated = select(vf32(0.0), vf32(pos_inf()), rough > vf32(0.0));
    return select(magnitude, saturated, (rough < vf32(-151.0)) | (rough > vf32(128.5)));
}

// x^y with the special cases of C99 / IEEE 754 `pow` (F.9.4.4), which the
// reference's `powf` follows: exp2(y·log2|x|) alone gets them wrong (0^-1
// is 0 and 1^NaN is NaN on lavapipe), and WGSL leaves exp2 and log2 of
// zeros and infinities loose. Later selects take precedence:
//   x < 0, y finite:    ±|x|^y by the parity of an integral y, else NaN
//   x = ±0 or ±inf:     0 or inf by the signs of y and of log|x|, the sign
//                       of x kept for odd integral y
//   y = ±inf:           1 for |x| = 1, else 0 or inf by the signs
//   NaN x or y:         NaN, except 1^y = 1 and x^0 = 1
fn pow_f32(x: vf32, y: vf32) -> vf32 {
    let ax = abs(x);
    let magnitude = pow_magnitude(ax, y);
    let y_infinite = is_inf_f32(y);
    // Every f32 from 2^24 on is an even integer, and fract(y · 0.5) says so.
    let integral = (fract(y) == vf32(0.0)) & !y_infinite;
    let odd = integral & (fract(y * 0.5) != vf32(0.0));
    let negative_base = select(nan_f32(), select(magnitude, -magnitude, odd), integral);
    let finite_base = select(magnitude, negative_base, x < vf32(0.0));
    // 0^y is inf for y < 0 and inf^y is inf for y > 0.
    let zero = ax == vf32(0.0);
    let unsigned_edge = select(vf32(0.0), vf32(pos_inf()), zero == (y < vf32(0.0)));
    let sign = bitcast<vu32>(x) & select(vu32(0u), vu32(0x80000000u), odd);
    let edge = bitcast<vf32>(bitcast<vu32>(unsigned_edge) | sign);
    let any_base = select(finite_base, edge, zero | is_inf_f32(x));
    let infinite_exponent = select(
        select(vf32(0.0), vf32(pos_inf()), (ax < vf32(1.0)) == (y < vf32(0.0))),
        vf32(1.0),
        ax == vf32(1.0));
    let any_exponent = select(any_base, infinite_exponent, y_infinite);
    let defined = select(any_exponent, nan_f32(), is_nan_f32(x) | is_nan_f32(y));
    return select(defined, vf32(1.0), (x == vf32(1.0)) | (y == vf32(0.0)));
}

fn add_i32(a: vi32, b: vi32) -> vi32 { return a + b; }
fn sub_i32(a: vi32, b: vi32) -> vi32 { return a - b; }
fn mul_i32(a: vi32, b: vi32) -> vi32 { return a * b; }
fn div_i32(a: vi32, b: vi32) -> vi32 { return select(a / b, vi32(0), b == vi32(0)); }
fn maximum_i32(a: vi32, b: vi32) -> vi32 { return max(a, b); }
fn minimum_i32(a: vi32, b: vi32) -> vi32 { return min(a, b); }

fn add_u32(a: vu32, b: vu32) -> vu32 { return a + b; }
fn sub_u32(a: vu32, b: vu32) -> vu32 { return a - b; }
fn mul_u32(a: vu32, b: vu32) -> vu32 { return a * b; }
fn div_u32(a: vu32, b: vu32) -> vu32 { return select(a / b, vu32(0u), b == vu32(0u)); }
fn maximum_u32(a: vu32, b: vu32) -> vu32 { return max(a, b); }
fn minimum_u32(a: vu32, b: vu32) -> vu32 { return min(a, b); }

fn maximum_bool(a: vbool, b: vbool) -> vbool { return a | b; }
fn minimum_bool(a: vbool, b: vbool) -> vbool { return a & b; }

// ---- comparisons ----
// `!(a == b)` rather than `a != b`, so that NaN compares unequal whatever
// the compiler assumes about NaN.

fn equal_f32(a: vf32, b: vf32) -> vbool { return a == b; }
fn not_equal_f32(a: vf32, b: vf32) -> vbool { return !(a == b); }
fn less_f32(a: vf32, b: vf32) -> vbool { return a < b; }
fn less_equal_f32(a: vf32, b: vf32) -> vbool { return a <= b; }
fn greater_f32(a: vf32, b: vf32) -> vbool { return a > b; }
fn greater_equal_f32(a: vf32, b: vf32) -> vbool { return a >= b; }

fn equal_i32(a: vi32, b: vi32) -> vbool { return a == b; }
fn not_equal_i32(a: vi32, b: vi32) -> vbool { return a != b; }
fn less_i32(a: vi32, b: vi32) -> vbool { return a < b; }
fn less_equal_i32(a: vi32, b: vi32) -> vbool { return a <= b; }
fn greater_i32(a: vi32, b: vi32) -> vbool { return a > b; }
fn greater_equal_i32(a: vi32, b: vi32) -> vbool { return a >= b; }

fn equal_u32(a: vu32, b: vu32) -> vbool { return a == b; }
fn not_equal_u32(a: vu32, b: vu32) -> vbool { return a != b; }
fn less_u32(a: vu32, b: vu32) -> vbool { return a < b; }
fn less_equal_u32(a: vu32, b: vu32) -> vbool { return a <= b; }
fn greater_u32(a: vu32, b: vu32) -> vbool { return a > b; }
fn greater_equal_u32(a: vu32, b: vu32) -> vbool { return a >= b; }

// bool has no ordering in WGSL: false < true as 0 < 1.
fn equal_bool(a: vbool, b: vbool) -> vbool { return a == b; }
fn not_equal_bool(a: vbool, b: vbool) -> vbool { return a != b; }
fn less_bool(a: vbool, b: vbool) -> vbool { return bool_to_u32(a) < bool_to_u32(b); }
fn less_equal_bool(a: vbool, b: vbool) -> vbool { return bool_to_u32(a) <= bool_to_u32(b); }
fn greater_bool(a: vbool, b: vbool) -> vbool { return bool_to_u32(a) > bool_to_u32(b); }
fn greater_equal_bool(a: vbool, b: vbool) -> vbool { return bool_to_u32(a) >= bool_to_u32(b); }

// ---- where ----

fn where_f32(c: vbool, t: vf32, f: vf32) -> vf32 { return select(f, t, c); }
fn where_i32(c: vbool, t: vi32, f: vi32) -> vi32 { return select(f, t, c); }
fn where_u32(c: vbool, t: vu32, f: vu32) -> vu32 { return select(f, t, c); }
fn where_bool(c: vbool, t: vbool, f: vbool) -> vbool { return select(f, t, c); }

// ---- casts ----
// Rust `as` semantics. 2147483520 and 4294967040 are the largest f32 below
// 2^31 and 2^32, so the clamped value always converts exactly.

fn cast_i32_to_f32(x: vi32) -> vf32 { return vf32(x); }
fn cast_u32_to_f32(x: vu32) -> vf32 { return vf32(x); }
fn cast_bool_to_f32(x: vbool) -> vf32 { return select(vf32(0.0), vf32(1.0), x); }

fn cast_f32_to_i32(x: vf32) -> vi32 {
    let clamped = vi32(clamp(x, vf32(-2147483648.0), vf32(2147483520.0)));
    let saturated = select(clamped, vi32(2147483647), x >= vf32(2147483648.0));
    return select(saturated, vi32(0), is_nan_f32(x));
}
fn cast_u32_to_i32(x: vu32) -> vi32 { return vi32(min(x, vu32(2147483647u))); }
fn cast_bool_to_i32(x: vbool) -> vi32 { return select(vi32(0), vi32(1), x); }

fn cast_f32_to_u32(x: vf32) -> vu32 {
    let clamped = vu32(clamp(x, vf32(0.0), vf32(4294967040.0)));
    let saturated = select(clamped, vu32(4294967295u), x >= vf32(4294967296.0));
    return select(saturated, vu32(0u), is_nan_f32(x));
}
fn cast_i32_to_u32(x: vi32) -> vu32 { return vu32(max(x, vi32(0))); }
fn cast_bool_to_u32(x: vbool) -> vu32 { return bool_to_u32(x); }

fn cast_f32_to_u8(x: vf32) -> vu32 { return min(cast_f32_to_u32(x), vu32(255u)); }
fn cast_i32_to_u8(x: vi32) -> vu32 { return vu32(clamp(x, vi32(0), vi32(255))); }
fn cast_u32_to_u8(x: vu32) -> vu32 { return min(x, vu32(255u)); }
fn cast_bool_to_u8(x: vbool) -> vu32 { return bool_to_u32(x); }

fn cast_f32_to_bool(x: vf32) -> vbool { return !(x == vf32(0.0)); }

// Integer → f16/bf16, rounded once from the exact integer: through f32, an
// integer above 2^24 would round twice (2^24 + 2^16 + 1 rounds to 2^24 in
// f32, a tie that bf16 rounds down, though the integer is above the bf16
// midpoint and rounds up to 2^24 + 2^17). `magnitude` is rounded to nearest
// even at `digits` significant bits, which f32 then holds exactly; the
// generator's rounding to the 16-bit type after the call only overflows
// f16 to infinity.
fn round_to_digits(magnitude: vu32, digits: u32) -> vf32 {
    let width = vu32(32u) - countLeadingZeros(magnitude);
    let shift = max(width, vu32(digits)) - vu32(digits);
    let kept = magnitude >> shift;
    let rest = magnitude - (kept << shift);
    let half = (vu32(1u) << shift) >> vu32(1u);
    let up = (shift > vu32(0u)) & ((rest > half) | ((rest == half) & ((kept & vu32(1u)) == vu32(1u))));
    return ldexp(vf32(kept + bool_to_u32(up)), vi32(shift));
}

// abs(i32 min) is i32 min, whose bits are its magnitude 2^31 as a u32.
fn signed_to_digits(x: vi32, digits: u32) -> vf32 {
    let magnitude = round_to_digits(bitcast<vu32>(abs(x)), digits);
    return select(magnitude, -magnitude, x < vi32(0));
}

fn cast_i32_to_f16(x: vi32) -> vf32 { return signed_to_digits(x, 11u); }
fn cast_i32_to_bf16(x: vi32) -> vf32 { return signed_to_digits(x, 8u); }
fn cast_u32_to_f16(x: vu32) -> vf32 { return round_to_digits(x, 11u); }
fn cast_u32_to_bf16(x: vu32) -> vf32 { return round_to_digits(x, 8u); }
fn cast_i32_to_bool(x: vi32) -> vbool { return x != vi32(0); }
fn cast_u32_to_bool(x: vu32) -> vbool { return x != vu32(0u); }
