// Tiled matmul: a workgroup of 8×8 invocations computes a 32×32 block of
// one output matrix, each invocation a 4×4 sub-block held in registers,
// staging 32×32 slices of a and b in workgroup memory. Few invocations
// with much work each keep barriers rare, which software rasterizers
// (lavapipe) need as much as GPUs like the data reuse. Workgroups are
// numbered flat over (batch, block row, block column).

const TILE: u32 = 32u;

var<workgroup> tile_a: array<array<T, TILE>, TILE>;
var<workgroup> tile_b: array<array<T, TILE>, TILE>;

@compute @workgroup_size(8, 8)
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
    let flat_id = lid.y * 8u + lid.x;
    var acc: array<array<T, 4>, 4>;
    for (var r = 0u; r < 4u; r++) {
        for (var c = 0u; c < 4u; c++) {
            acc[r][c] = zero();
        }
    }
    for (var k0 = 0u; k0 < k; k0 += TILE) {
        // 1024 elements of each tile, sixteen per invocation.
        for (var e = flat_id; e < TILE * TILE; e += 64u) {
            let tr = e / TILE;
            let tc = e % TILE;
            var va = zero();
            if (live && row0 + tr < m && k0 + tc < k) {
                va = load_a(offsets.x + (row0 + tr) * k + k0 + tc);
            }
            tile_a[tr][tc] = va;
            var vb = zero();
            if (live && k0 + tr < k && col0 + tc < n) {
                vb = load_b(offsets.y + (k0 + tr) * n + col0 + tc);
            }
            tile_b[tr][tc] = vb;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TILE; kk++) {
            let a = vec4<T>(
                tile_a[lid.y * 4u][kk],
                tile_a[lid.y * 4u + 1u][kk],
                tile_a[lid.y * 4u + 2u][kk],
                tile_a[lid.y * 4u + 3u][kk],
            );
            let b = vec4<T>(
                tile_b[kk][lid.x * 4u],
                tile_b[kk][lid.x * 4u + 1u],
                tile_b[kk][lid.x * 4u + 2u],
                tile_b[kk][lid.x * 4u + 3u],
            );
            for (var r = 0u; r < 4u; r++) {
                acc[r][0] += a[r] * b[0];
                acc[r][1] += a[r] * b[1];
                acc[r][2] += a[r] * b[2];
                acc[r][3] += a[r] * b[3];
            }
        }
        workgroupBarrier();
    }
    if (!live) {
        return;
    }
    for (var r = 0u; r < 4u; r++) {
        for (var c = 0u; c < 4u; c++) {
            let row = row0 + lid.y * 4u + r;
            let col = col0 + lid.x * 4u + c;
            if (row < m && col < n) {
                out[(batch * m + row) * n + col] = store_value(acc[r][c]);
            }
        }
    }
}
