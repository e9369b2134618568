// Tiled matmul: a workgroup of 8×8 invocations computes a 64×32 block of
// one output matrix, each invocation an 8×4 sub-block held in eight vec4
// registers. Per step it stages a 64×BK slice of a and a BK×32 slice of b
// in workgroup memory as vec4s (rows of a along k, rows of b along n), so
// the inner loop reads twelve vec4s for every 128 multiply-adds. Few
// invocations with much work each keep barriers rare: lavapipe switches
// every invocation group at a barrier, GPUs like the reuse (on lavapipe
// at 1024³, 8×4 blocks ran 1.3–2× faster than 4×4, and BK = 16 or 64
// slower than 32). Workgroups are numbered flat over (batch, block row,
// block column). Each output sums its products in k order, as the naive
// kernel does. The generated part above defines `load_a4(base, r, c,
// valid)` and `load_b4(...)`: elements (r, c..c+4) of the a or b matrix at
// element `base`, of which the first `valid` exist (one vec4 word read
// where the layout allows it; a transposed operand is read in place).

const TILE_M: u32 = 64u;
const TILE_N: u32 = 32u;
const BK: u32 = 32u;
// vec4s in a row of the a tile and of the b tile.
const A_ROW: u32 = BK / 4u;
const B_ROW: u32 = TILE_N / 4u;

var<workgroup> tile_a: array<vec4<T>, TILE_M * A_ROW>;
var<workgroup> tile_b: array<vec4<T>, BK * B_ROW>;

@compute @workgroup_size(8, 8)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    let m = params[0];
    let n = params[1];
    let k = params[2];
    let blocks_n = (n + TILE_N - 1u) / TILE_N;
    let blocks_m = (m + TILE_M - 1u) / TILE_M;
    let flat = flat_workgroup(wid, nwg);
    let batch = flat / (blocks_m * blocks_n);
    let block = flat % (blocks_m * blocks_n);
    let row0 = (block / blocks_n) * TILE_M;
    let col0 = (block % blocks_n) * TILE_N;
    let live = batch < params[3];
    let offsets = batch_offsets(batch);
    let flat_id = lid.y * 8u + lid.x;
    var acc0 = vec4<T>(zero());
    var acc1 = vec4<T>(zero());
    var acc2 = vec4<T>(zero());
    var acc3 = vec4<T>(zero());
    var acc4 = vec4<T>(zero());
    var acc5 = vec4<T>(zero());
    var acc6 = vec4<T>(zero());
    var acc7 = vec4<T>(zero());
    for (var k0 = 0u; k0 < k; k0 += BK) {
        // 512 vec4s of a and 256 of b, eight and four per invocation.
        for (var e = flat_id; e < TILE_M * A_ROW; e += 64u) {
            let row = row0 + e / A_ROW;
            let kk = k0 + (e % A_ROW) * 4u;
            var va = vec4<T>(zero());
            if (live && row < m && kk < k) {
                va = load_a4(offsets.x, row, kk, min(4u, k - kk));
            }
            tile_a[e] = va;
        }
        for (var e = flat_id; e < BK * B_ROW; e += 64u) {
            let kk = k0 + e / B_ROW;
            let col = col0 + (e % B_ROW) * 4u;
            var vb = vec4<T>(zero());
            if (live && kk < k && col < n) {
                vb = load_b4(offsets.y, kk, col, min(4u, n - col));
            }
            tile_b[e] = vb;
        }
        workgroupBarrier();
        let a_base = lid.y * 8u * A_ROW;
        for (var q = 0u; q < A_ROW; q++) {
            let a0 = tile_a[a_base + q];
            let a1 = tile_a[a_base + A_ROW + q];
            let a2 = tile_a[a_base + 2u * A_ROW + q];
            let a3 = tile_a[a_base + 3u * A_ROW + q];
            let a4 = tile_a[a_base + 4u * A_ROW + q];
            let a5 = tile_a[a_base + 5u * A_ROW + q];
            let a6 = tile_a[a_base + 6u * A_ROW + q];
            let a7 = tile_a[a_base + 7u * A_ROW + q];
            let b0 = tile_b[(q * 4u) * B_ROW + lid.x];
            let b1 = tile_b[(q * 4u + 1u) * B_ROW + lid.x];
            let b2 = tile_b[(q * 4u + 2u) * B_ROW + lid.x];
            let b3 = tile_b[(q * 4u + 3u) * B_ROW + lid.x];
            // One statement per k, so each output sums in k order.
            acc0 += a0.x * b0;
            acc0 += a0.y * b1;
            acc0 += a0.z * b2;
            acc0 += a0.w * b3;
            acc1 += a1.x * b0;
            acc1 += a1.y * b1;
            acc1 += a1.z * b2;
            acc1 += a1.w * b3;
            acc2 += a2.x * b0;
            acc2 += a2.y * b1;
            acc2 += a2.z * b2;
            acc2 += a2.w * b3;
            acc3 += a3.x * b0;
            acc3 += a3.y * b1;
            acc3 += a3.z * b2;
            acc3 += a3.w * b3;
            acc4 += a4.x * b0;
            acc4 += a4.y * b1;
            acc4 += a4.z * b2;
            acc4 += a4.w * b3;
            acc5 += a5.x * b0;
            acc5 += a5.y * b1;
            acc5 += a5.z * b2;
            acc5 += a5.w * b3;
            acc6 += a6.x * b0;
            acc6 += a6.y * b1;
            acc6 += a6.z * b2;
            acc6 += a6.w * b3;
            acc7 += a7.x * b0;
            acc7 += a7.y * b1;
            acc7 += a7.z * b2;
            acc7 += a7.w * b3;
        }
        workgroupBarrier();
    }
    if (!live) {
        return;
    }
    var rows = array<vec4<T>, 8>(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7);
    for (var r = 0u; r < 8u; r++) {
        let row = row0 + lid.y * 8u + r;
        let col = col0 + lid.x * 4u;
        if (row < m) {
            let base = (batch * m + row) * n + col;
            for (var c = 0u; c < min(4u, n - min(n, col)); c++) {
                out[base + c] = store_value(rows[r][c]);
            }
        }
    }
}
