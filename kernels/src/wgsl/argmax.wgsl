// Argmax along one axis: one workgroup per output element, a strided scan
// per invocation, then a tree over (value, index) pairs in shared memory.
// The first maximum wins ties and the first NaN beats every number. The
// generated part above defines `T`, `lowest()`, `nan_of(v)` and `load_in(i)`.
//
// params: [outputs, axis size, kept rank, 1, kept shape, kept strides,
//          axis size, axis stride]

const WG: u32 = 64u;
const NO_INDEX: u32 = 0xffffffffu;

var<workgroup> best_value: array<T, WG>;
var<workgroup> best_index: array<u32, WG>;

// True when candidate (va, ia) beats (vb, ib).
fn beats(va: T, ia: u32, vb: T, ib: u32) -> bool {
    if (ia == NO_INDEX) {
        return false;
    }
    if (ib == NO_INDEX) {
        return true;
    }
    let na = nan_of(va);
    let nb = nan_of(vb);
    if (na || nb) {
        return select(false, ia < ib, na && nb) || (na && !nb);
    }
    return va > vb || (va == vb && ia < ib);
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
    let kept = params[2];
    let stride = params[5u + 2u * kept];
    var value = lowest();
    var index = NO_INDEX;
    if (o < outputs) {
        let base = kept_offset(o);
        for (var r = lid; r < group; r += WG) {
            let v = load_in(base + r * stride);
            if (beats(v, r, value, index)) {
                value = v;
                index = r;
            }
        }
    }
    best_value[lid] = value;
    best_index[lid] = index;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s && beats(best_value[lid + s], best_index[lid + s], best_value[lid], best_index[lid])) {
            best_value[lid] = best_value[lid + s];
            best_index[lid] = best_index[lid + s];
        }
        workgroupBarrier();
    }
    if (lid == 0u && o < outputs) {
        out[o] = best_index[0];
    }
}
