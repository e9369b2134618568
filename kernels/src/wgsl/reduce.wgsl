// Reduction: one workgroup per output element. Each invocation folds a
// strided share of the reduced elements, then the workgroup combines the
// partial results by a tree in shared memory. The generated part above
// defines `T`, `identity()`, `combine(a, b)`, `load_in(i)` and
// `store_value(v)`.
//
// params: [outputs, group, kept rank, reduced rank,
//          kept shape, kept strides, reduced shape, reduced strides]

const WG: u32 = 64u;

var<workgroup> partial: array<T, WG>;

// Offset of reduced element `r` from its output element's first (see
// `kept_offset`): `r` unraveled over the reduced axes.
fn reduced_offset(r: u32) -> u32 {
    let kept = params[2];
    let reduced = params[3];
    let base = 4u + 2u * kept;
    var idx = 0u;
    var rem = r;
    for (var d = reduced; d > 0u; d--) {
        let size = params[base + d - 1u];
        idx += (rem % size) * params[base + reduced + d - 1u];
        rem /= size;
    }
    return idx;
}

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let o = flat_workgroup(wid, nwg);
    let outputs = params[0];
    let group = params[1];
    var acc = identity();
    if (o < outputs) {
        let first = kept_offset(o);
        for (var r = lid; r < group; r += WG) {
            acc = combine(acc, load_in(first + reduced_offset(r)));
        }
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            partial[lid] = combine(partial[lid], partial[lid + s]);
        }
        workgroupBarrier();
    }
    if (lid == 0u && o < outputs) {
        out[o] = store_value(partial[0]);
    }
}
