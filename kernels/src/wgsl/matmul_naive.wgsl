// Naive matmul, one invocation per output element looping over the inner
// dimension straight from global memory: the baseline the tiled kernel is
// measured against.

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let m = params[0];
    let n = params[1];
    let k = params[2];
    let o = flat_index(wid, nwg, lid, 256u);
    if (o >= params[3] * m * n) {
        return;
    }
    let batch = o / (m * n);
    let row = (o / n) % m;
    let col = o % n;
    let offsets = batch_offsets(batch);
    var acc = zero();
    for (var kk = 0u; kk < k; kk++) {
        acc += load_a(offsets.x + a_at(row, kk)) * load_b(offsets.y + b_at(kk, col));
    }
    out[o] = store_value(acc);
}
