// Stable argsort along one axis: one invocation per element, which counts
// the elements of its row that sort before it (its place) and writes its
// own index there. Equal keys keep their order, NaN sorts above every
// number. The generated part above defines `T`, `DESCENDING`, `nan_of(v)`
// and `load_in(i)`.
//
// params: [elements, axis size, kept rank, 1, kept shape, kept strides,
//          axis size, axis stride]

const WG: u32 = 64u;

// True when (va, ia) sorts before (vb, ib).
fn before(va: T, ia: u32, vb: T, ib: u32) -> bool {
    let na = nan_of(va);
    let nb = nan_of(vb);
    var first = false;
    var tie = false;
    if (na || nb) {
        tie = na && nb;
        first = select(!na && nb, na && !nb, DESCENDING);
    } else {
        tie = va == vb;
        // Two statements: `select(va < vb, va > vb, ..)` would read as a
        // template list `va<vb, va>` in WGSL.
        if (DESCENDING) {
            first = va > vb;
        } else {
            first = va < vb;
        }
    }
    return first || (tie && ia < ib);
}

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let e = flat_workgroup(wid, nwg) * WG + lid;
    let elements = params[0];
    let n = params[1];
    if (e >= elements) {
        return;
    }
    let kept = params[2];
    let stride = params[5u + 2u * kept];
    let r = e % n;
    let base = kept_offset(e / n);
    let mine = load_in(base + r * stride);
    var place = 0u;
    for (var j = 0u; j < n; j++) {
        if (before(load_in(base + j * stride), j, mine, r)) {
            place += 1u;
        }
    }
    out[base + place * stride] = r;
}
