// Quantized matmul and gather_qmm: one invocation per output column and
// block of ROWS rows of one output matrix, decoding each weight once for
// the block and reading the packed codes directly (the dequantized matrix
// never exists). The generated part above defines ROWS (4, or 1 for
// fewer rows), the block's types V (ROWS f32s) and VU (ROWS u32s),
// `block_rows(row0, m)` (the block's rows, those past m read as row m − 1),
// `lane(v, j)`, `matrices(batch)` (the x and w matrix of an output batch
// entry), `product(...)` (the sum over k for the block), the loads and
// `decode`.
//
// params: [invocations, m, n, k, group, groups per row, ...matrices' own]

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let o = flat_index(wid, nwg, lid, 64u);
    if (o >= params[0]) {
        return;
    }
    let m = params[1];
    let n = params[2];
    let k = params[3];
    let blocks = (m + ROWS - 1u) / ROWS;
    let col = o % n;
    let block = (o / n) % blocks;
    let batch = o / (n * blocks);
    let mats = matrices(batch);
    let row0 = block * ROWS;
    // Rows past m are computed from row m - 1 and not written.
    let acc = product(mats.x * m * k + block_rows(row0, m) * k, mats.y, col);
    for (var j = 0u; j < ROWS; j++) {
        if (row0 + j < m) {
            out[(batch * m + row0 + j) * n + col] = bitcast<u32>(lane(acc, j));
        }
    }
}
