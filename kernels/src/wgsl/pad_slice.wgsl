// `pad_slice`, the transpose of a strided slice, as the element function of
// an index-to-element kernel: output element `i` is the operand element
// whose slice position lands on it, or zero where none does. Per axis the
// output coordinate `c` is taken when `c = start + q * step` with
// `q < taken`; the operand (contiguous, of the slice's shape) is read at
// `Σ q * stride`. An axis taking fewer than two elements has step 1, so a
// huge step never reaches the kernel. The generated part above defines
// `load_0(i)` (the operand).
//
// params: [count, rank, then per axis: size, start, step, taken, stride]

fn element(i: u32) -> T {
    let rank = params[1];
    var rem = i;
    var src = 0u;
    for (var e = 0u; e < rank; e++) {
        let at = 2u + 5u * (rank - 1u - e);
        let c = rem % params[at];
        rem /= params[at];
        let start = params[at + 1u];
        let step = params[at + 2u];
        if (c < start) {
            return T();
        }
        let q = (c - start) / step;
        if ((c - start) % step != 0u || q >= params[at + 3u]) {
            return T();
        }
        src += q * params[at + 4u];
    }
    return load_0(src);
}
