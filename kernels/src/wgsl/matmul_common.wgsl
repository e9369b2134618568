// Batched matrix product geometry shared by the matmul kernels.
//
// params: [m, n, k, batches, batch rank, batch shape, a batch strides,
//          b batch strides] (strides in elements; 0 on broadcast dims).
// The generated part above defines `T`, `zero()`, `load_a(i)`, `load_b(i)`,
// `store_value(v)`, and `a_at(r, c)`, `b_at(r, c)`: where element (r, c) of
// a's [m, k] and b's [k, n] matrix lies, from the matrix's first element
// (either operand may be stored transposed).

// Element offsets of batch `b`'s matrices in a and b.
fn batch_offsets(b: u32) -> vec2<u32> {
    let rank = params[4];
    var rem = b;
    var offsets = vec2<u32>(0u, 0u);
    for (var d = rank; d > 0u; d--) {
        let size = params[4u + d];
        let c = rem % size;
        rem /= size;
        offsets += c * vec2<u32>(params[4u + rank + d], params[4u + 2u * rank + d]);
    }
    return offsets;
}
