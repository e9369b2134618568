// The code starting at bit `bit` of the packed codes.
fn code_at(bit: u32) -> u32 {
    let word = bit >> 5u;
    let shift = bit & 31u;
    var v = in_1[word] >> shift;
    if (shift + BITS > 32u) {
        v |= in_1[word + 1u] << (32u - shift);
    }
    return v & MASK;
}
