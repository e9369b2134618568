// Matmul for few output elements and a long inner dimension (matrix ×
// vector, small m·n): one workgroup per output element splits the inner
// dimension over its invocations and sums the partial products by a tree.

const WG: u32 = 64u;

var<workgroup> partial: array<T, WG>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let m = params[0];
    let n = params[1];
    let k = params[2];
    let o = flat_workgroup(wid, nwg);
    let live = o < params[3] * m * n;
    let batch = o / (m * n);
    let row = (o / n) % m;
    let col = o % n;
    var acc = zero();
    if (live) {
        let offsets = batch_offsets(batch);
        for (var kk = lid; kk < k; kk += WG) {
            acc += load_a(offsets.x + a_at(row, kk)) * load_b(offsets.y + b_at(kk, col));
        }
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            partial[lid] += partial[lid + s];
        }
        workgroupBarrier();
    }
    if (lid == 0u && live) {
        out[o] = store_value(partial[0]);
    }
}
