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

// x rounded to f16 (to nearest, ties to even), as an f32. Integer
// arithmetic on the bits: a compiler may fold unpack2x16float of
// pack2x16float back into x (NVIDIA's does), and pack2x16float leaves
// values beyond the f16 range undefined. From 65520, the midpoint above
// the largest f16, the result is infinity; below 2^-14 the f16 quantum is
// 2^-24; NaN stays NaN, with the payload an f16 keeps.
fn round_f16(x: f32) -> f32 {
    let u = bitcast<u32>(x);
    let magnitude = u & 0x7fffffffu;
    let sign = u & 0x80000000u;
    if (magnitude > 0x7f800000u) {
        return bitcast<f32>((u & 0xffffe000u) | 0x00400000u);
    }
    if (magnitude >= 0x477ff000u) {
        return bitcast<f32>(sign | 0x7f800000u);
    }
    let exponent = i32(magnitude >> 23u) - 127;
    if (exponent < -25) {
        return bitcast<f32>(sign);
    }
    // Bits of the 24-bit significand below the f16 quantum: 13 for a
    // normal f16, up to 24 where only the rounding decides.
    let dropped = u32(13 + clamp(-14 - exponent, 0, 11));
    let significand = (magnitude & 0x007fffffu) | 0x00800000u;
    let half = 1u << (dropped - 1u);
    let rest = significand & ((half << 1u) - 1u);
    var kept = significand >> dropped;
    if (rest > half || (rest == half && (kept & 1u) == 1u)) {
        kept += 1u;
    }
    let rounded = ldexp(f32(kept), exponent - 23 + i32(dropped));
    return bitcast<f32>(bitcast<u32>(rounded) | sign);
}

// Element `i` of a word array holding two 16-bit values per word.
fn half_bits(word: u32, i: u32) -> u32 {
    return (word >> ((i & 1u) * 16u)) & 0xffffu;
}

// The flat invocation index of a dispatch that may be split over x, y and z
// because one dimension holds at most 65,535 workgroups.
fn flat_index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32, size: u32) -> u32 {
    return ((wid.z * nwg.y + wid.y) * nwg.x + wid.x) * size + lid;
}

fn flat_workgroup(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return (wid.z * nwg.y + wid.y) * nwg.x + wid.x;
}
