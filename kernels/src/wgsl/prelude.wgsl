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

// x rounded to f16. pack2x16float leaves a value beyond the f16 range
// undefined, so such values are rounded here as IEEE 754 does: to the
// largest f16, 65504, below the midpoint 65520, to infinity from it on.
fn round_f16(x: f32) -> f32 {
    let beyond = abs(x) > 65504.0;
    let in_range = select(x, sign(x) * 65504.0, beyond);
    let rounded = unpack2x16float(pack2x16float(vec2<f32>(in_range, 0.0))).x;
    return select(rounded, sign(x) * pos_inf(), abs(x) >= 65520.0);
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
