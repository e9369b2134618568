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
// Special values use bit tests (is_nan_f32, is_inf_f32) and explicit
// selects rather than trusting exp2, log2 or division on them, which WGSL
// leaves loose. Subnormals are the exception Kiln does not mend: WGSL lets
// an implementation flush subnormal f32 and f16 inputs, intermediates and
// results to zero, so a backend may give zero where the reference (which
// keeps subnormals) gives a value below 2^-126 (2^-14 for f16 data).
// lavapipe keeps them; the conformance suite's subnormal rule
// (`kiln_tests::conformance::may_flush`) allows the flush and no more.

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

// ---- unary ----

fn neg_f32(x: vf32) -> vf32 { return -x; }
fn abs_f32(x: vf32) -> vf32 { return abs(x); }
fn exp_f32(x: vf32) -> vf32 { return exp(x); }
fn log_f32(x: vf32) -> vf32 { return log(x); }
fn sin_f32(x: vf32) -> vf32 { return sin(x); }
fn cos_f32(x: vf32) -> vf32 { return cos(x); }
fn sqrt_f32(x: vf32) -> vf32 { return sqrt(x); }
fn rsqrt_f32(x: vf32) -> vf32 { return 1.0 / sqrt(x); }
fn sigmoid_f32(x: vf32) -> vf32 { return 1.0 / (1.0 + exp(-x)); }
// `<=` so that relu(-0) is +0, as maximum(x, +0).
fn relu_f32(x: vf32) -> vf32 { return select(x, vf32(0.0), x <= vf32(0.0)); }

// tanh that saturates instead of computing inf/inf.
fn tanh_f32(x: vf32) -> vf32 {
    return select(tanh(x), sign(x), abs(x) > vf32(15.0));
}

// The error function, |error| < 1.2e-7 (the complementary error function
// by a Chebyshev fit, as in Numerical Recipes).
fn erf_f32(x: vf32) -> vf32 {
    let z = abs(x);
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418
        + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587
        + t * (-0.82215223 + t * 0.17087277))))))));
    let erfc = t * exp(poly);
    return select(erfc - 1.0, 1.0 - erfc, x >= vf32(0.0));
}

fn neg_i32(x: vi32) -> vi32 { return -x; }
fn abs_i32(x: vi32) -> vi32 { return abs(x); }
fn relu_i32(x: vi32) -> vi32 { return max(x, vi32(0)); }
fn abs_u32(x: vu32) -> vu32 { return x; }
fn relu_u32(x: vu32) -> vu32 { return x; }

// ---- binary arithmetic ----

fn add_f32(a: vf32, b: vf32) -> vf32 { return a + b; }
fn sub_f32(a: vf32, b: vf32) -> vf32 { return a - b; }
fn mul_f32(a: vf32, b: vf32) -> vf32 { return a * b; }
fn div_f32(a: vf32, b: vf32) -> vf32 { return a / b; }
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
    let magnitude = exp2(y * log2(ax));
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
