// Helpers shared by every Kiln kernel. Every buffer is an array of 32-bit
// words: f32/i32/u32 one element per word, bool and u8 one element per word
// (0/1 and 0..255), f16 and bf16 two elements per word (low half first).

// Special float values built at run time: a constant expression that
// evaluates to a non-finite value is a shader-creation error in WGSL.
var<private> INF_BITS: u32 = 0x7f800000u;
var<private> NAN_BITS: u32 = 0x7fc00000u;

fn pos_inf() -> f32 {
    return bitcast<f32>(INF_BITS);
}

fn quiet_nan() -> f32 {
    return bitcast<f32>(NAN_BITS);
}

// Bit test, immune to compilers that assume NaN never occurs.
fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// f32 → bf16 bits, rounding to nearest even and keeping NaN quiet.
fn bf16_bits(x: f32) -> u32 {
    let u = bitcast<u32>(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (u >> 16u) | 0x40u;
    }
    return (u + 0x7fffu + ((u >> 16u) & 1u)) >> 16u;
}

fn bf16_to_f32(bits: u32) -> f32 {
    return bitcast<f32>((bits & 0xffffu) << 16u);
}

fn round_bf16(x: f32) -> f32 {
    return bf16_to_f32(bf16_bits(x));
}

fn round_f16(x: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}

// Element `i` of a word array holding two 16-bit values per word.
fn half_bits(word: u32, i: u32) -> u32 {
    return (word >> ((i & 1u) * 16u)) & 0xffffu;
}

// IEEE maximum/minimum that propagate NaN from either operand.
fn nan_max(a: f32, b: f32) -> f32 {
    return select(b, a, a >= b || is_nan(a));
}

fn nan_min(a: f32, b: f32) -> f32 {
    return select(b, a, a <= b || is_nan(a));
}

// x^y for any sign of x: integral exponents of negative bases keep the sign
// of the result; other negative bases give NaN.
fn kiln_pow(x: f32, y: f32) -> f32 {
    if (y == 0.0) {
        return 1.0;
    }
    if (is_nan(x) || is_nan(y)) {
        return quiet_nan();
    }
    let magnitude = exp2(y * log2(abs(x)));
    if (x >= 0.0) {
        return magnitude;
    }
    if (fract(y) != 0.0) {
        return quiet_nan();
    }
    return select(magnitude, -magnitude, fract(y * 0.5) != 0.0);
}

// tanh that saturates instead of overflowing to inf/inf.
fn kiln_tanh(x: f32) -> f32 {
    return select(tanh(x), sign(x), abs(x) > 15.0);
}

// The error function, |error| < 1.2e-7 (complementary error function by a
// Chebyshev fit, as in Numerical Recipes).
fn kiln_erf(x: f32) -> f32 {
    let z = abs(x);
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418
        + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587
        + t * (-0.82215223 + t * 0.17087277))))))));
    let erfc = t * exp(poly);
    return select(erfc - 1.0, 1.0 - erfc, x >= 0.0);
}

fn kiln_sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

// Float → integer conversions with Rust `as` semantics: truncate toward
// zero, saturate, NaN → 0.
fn f32_to_i32(x: f32) -> i32 {
    if (is_nan(x)) {
        return 0;
    }
    if (x >= 2147483648.0) {
        return 2147483647;
    }
    if (x <= -2147483648.0) {
        return -2147483647 - 1;
    }
    return i32(x);
}

fn f32_to_u32(x: f32) -> u32 {
    if (is_nan(x) || x <= 0.0) {
        return 0u;
    }
    if (x >= 4294967296.0) {
        return 4294967295u;
    }
    return u32(x);
}

fn f32_to_u8(x: f32) -> u32 {
    return min(f32_to_u32(x), 255u);
}

// The flat invocation index of a dispatch that may be split over x, y and z
// because one dimension holds at most 65,535 workgroups.
fn flat_index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32, size: u32) -> u32 {
    return ((wid.z * nwg.y + wid.y) * nwg.x + wid.x) * size + lid;
}

fn flat_workgroup(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return (wid.z * nwg.y + wid.y) * nwg.x + wid.x;
}
