// Tiled matmul: a workgroup computes a 32×32 block of one output matrix,
// each invocation a 2×2 sub-block, staging 32×16 slices of a and b in
// workgroup memory. Workgroups are numbered flat over (batch, block row,
// block column).

const TILE: u32 = 32u;
const DEPTH: u32 = 16u;

var<workgroup> tile_a: array<array<T, DEPTH>, TILE>;
var<workgroup> tile_b: array<array<T, TILE>, DEPTH>;

@compute @workgroup_size(16, 16)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    let m = params[0];
    let n = params[1];
    let k = params[2];
    let blocks_n = (n + TILE - 1u) / TILE;
    let blocks_m = (m + TILE - 1u) / TILE;
    let flat = flat_workgroup(wid, nwg);
    let batch = flat / (blocks_m * blocks_n);
    let block = flat % (blocks_m * blocks_n);
    let row0 = (block / blocks_n) * TILE;
    let col0 = (block % blocks_n) * TILE;
    let live = batch < params[3];
    let offsets = batch_offsets(batch);
    let flat_id = lid.y * 16u + lid.x;
    var acc = array<T, 4>(zero(), zero(), zero(), zero());
    for (var k0 = 0u; k0 < k; k0 += DEPTH) {
        // 512 elements of each tile, two per invocation.
        for (var e = flat_id; e < TILE * DEPTH; e += 256u) {
            let ar = e / DEPTH;
            let ac = e % DEPTH;
            var va = zero();
            if (live && row0 + ar < m && k0 + ac < k) {
                va = load_a(offsets.x + (row0 + ar) * k + k0 + ac);
            }
            tile_a[ar][ac] = va;
            let br = e / TILE;
            let bc = e % TILE;
            var vb = zero();
            if (live && k0 + br < k && col0 + bc < n) {
                vb = load_b(offsets.y + (k0 + br) * n + col0 + bc);
            }
            tile_b[br][bc] = vb;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < DEPTH; kk++) {
            let a0 = tile_a[lid.y * 2u][kk];
            let a1 = tile_a[lid.y * 2u + 1u][kk];
            let b0 = tile_b[kk][lid.x * 2u];
            let b1 = tile_b[kk][lid.x * 2u + 1u];
            acc[0] += a0 * b0;
            acc[1] += a0 * b1;
            acc[2] += a1 * b0;
            acc[3] += a1 * b1;
        }
        workgroupBarrier();
    }
    if (!live) {
        return;
    }
    for (var q = 0u; q < 4u; q++) {
        let row = row0 + lid.y * 2u + q / 2u;
        let col = col0 + lid.x * 2u + q % 2u;
        if (row < m && col < n) {
            out[(batch * m + row) * n + col] = store_value(acc[q]);
        }
    }
}
