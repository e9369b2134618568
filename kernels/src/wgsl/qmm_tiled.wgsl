// Quantized matmul (`x @ wᵀ` or `x @ w`, quantized_matmul or gather_qmm)
// for x of several rows, tiled as matmul_tiled.wgsl is: a workgroup of 8×8
// invocations computes a 64×32 block of one output matrix, each invocation
// an 8×4 sub-block in eight vec4 registers. Per step of BK along k it
// stages a 64×BK slice of x and decodes a BK×32 slice of the logical [k, n]
// weight into workgroup memory, so each packed code
// and its scale is read and decoded once per workgroup and then reused by
// its 64 rows of x; the one-block-per-invocation kernel (qmm.wgsl) decoded
// every code once per four rows. Each output sums its products in k order,
// as qmm.wgsl does. The generated part above defines `matrices(batch)` (the
// x and w matrix of an output batch entry), the loads, `decode` and
// `stage_weights(w_mat, k0, col0, flat_id, live)`, which fills `tile_w`
// (qmm_tile_codes.wgsl code by code, qmm_tile_words.wgsl word by word).
//
// params: [batches, m, n, k, group, groups per row, ...matrices' own]

const TILE_M: u32 = 64u;
const TILE_N: u32 = 32u;
const BK: u32 = 32u;
// vec4s in a row of the x tile and of the w tile.
const X_ROW: u32 = BK / 4u;
const W_ROW: u32 = TILE_N / 4u;

var<workgroup> tile_x: array<vec4<f32>, TILE_M * X_ROW>;
var<workgroup> tile_w: array<vec4<f32>, BK * W_ROW>;

@compute @workgroup_size(8, 8)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    let m = params[1];
    let n = params[2];
    let k = params[3];
    let blocks_n = (n + TILE_N - 1u) / TILE_N;
    let blocks_m = (m + TILE_M - 1u) / TILE_M;
    let flat = flat_workgroup(wid, nwg);
    let batch = flat / (blocks_m * blocks_n);
    let block = flat % (blocks_m * blocks_n);
    let row0 = (block / blocks_n) * TILE_M;
    let col0 = (block % blocks_n) * TILE_N;
    let live = batch < params[0];
    var mats = vec2<u32>(0u, 0u);
    if (live) {
        mats = matrices(batch);
    }
    let x_base = mats.x * m * k;
    let flat_id = lid.y * 8u + lid.x;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    var acc4 = vec4<f32>(0.0);
    var acc5 = vec4<f32>(0.0);
    var acc6 = vec4<f32>(0.0);
    var acc7 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < k; k0 += BK) {
        // 512 vec4s of x, eight per invocation, then the decoded weights.
        for (var e = flat_id; e < TILE_M * X_ROW; e += 64u) {
            let row = row0 + e / X_ROW;
            let kk = k0 + (e % X_ROW) * 4u;
            var vx = vec4<f32>(0.0);
            if (live && row < m) {
                for (var j = 0u; j < 4u; j++) {
                    if (kk + j < k) {
                        vx[j] = load_x(x_base + row * k + kk + j);
                    }
                }
            }
            tile_x[e] = vx;
        }
        stage_weights(mats.y, k0, col0, flat_id, live);
        workgroupBarrier();
        let x_at = lid.y * 8u * X_ROW;
        for (var q = 0u; q < X_ROW; q++) {
            let a0 = tile_x[x_at + q];
            let a1 = tile_x[x_at + X_ROW + q];
            let a2 = tile_x[x_at + 2u * X_ROW + q];
            let a3 = tile_x[x_at + 3u * X_ROW + q];
            let a4 = tile_x[x_at + 4u * X_ROW + q];
            let a5 = tile_x[x_at + 5u * X_ROW + q];
            let a6 = tile_x[x_at + 6u * X_ROW + q];
            let a7 = tile_x[x_at + 7u * X_ROW + q];
            let b0 = tile_w[(q * 4u) * W_ROW + lid.x];
            let b1 = tile_w[(q * 4u + 1u) * W_ROW + lid.x];
            let b2 = tile_w[(q * 4u + 2u) * W_ROW + lid.x];
            let b3 = tile_w[(q * 4u + 3u) * W_ROW + lid.x];
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
    var rows = array<vec4<f32>, 8>(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7);
    for (var r = 0u; r < 8u; r++) {
        let row = row0 + lid.y * 8u + r;
        let col = col0 + lid.x * 4u;
        if (row < m) {
            let base = (batch * m + row) * n + col;
            for (var c = 0u; c < min(4u, n - min(n, col)); c++) {
                out[base + c] = bitcast<u32>(rows[r][c]);
            }
        }
    }
}
