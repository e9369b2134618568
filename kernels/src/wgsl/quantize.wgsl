// Quantize: one invocation per output element of the computed part: a word
// of packed codes (PART 0), or the scale (1) or bias (2) of a group. A
// group's scale and bias are recomputed by every invocation that needs
// them, exactly as the reference computes them.
//
// params: [outputs, cols, group]

// (scale, bias) of the group starting at element `start`, each rounded to
// the dtype as stored.
fn group_params(start: u32) -> vec2<f32> {
    let size = params[2];
    var lo = load_w(start);
    var hi = lo;
    var absmax = 0.0;
    for (var j = 0u; j < size; j++) {
        let v = load_w(start + j);
        lo = min(lo, v);
        hi = max(hi, v);
        absmax = max(absmax, abs(v));
    }
    return vec2<f32>(round_t(scale_of(lo, hi, absmax)), round_t(bias_of(lo)));
}

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
    let size = params[2];
    if (PART != 0u) {
        let sb = group_params(o * size);
        out[o] = bitcast<u32>(select(sb.y, sb.x, PART == 1u));
        return;
    }
    // The codes overlapping bits o·32 .. o·32 + 32 of the stream (rows
    // hold whole words, so the stream runs on across rows).
    let first = (o * 32u) / BITS;
    let last = (o * 32u + 31u) / BITS;
    var word = 0u;
    var group = 0xffffffffu;
    var sb = vec2<f32>(0.0, 0.0);
    for (var c = first; c <= last; c++) {
        if (c / size != group) {
            group = c / size;
            sb = group_params(group * size);
        }
        let code = encode(load_w(c), sb.x, sb.y);
        let at = i32(c * BITS) - i32(o * 32u);
        if (at >= 0) {
            word |= code << u32(at);
        } else {
            word |= code >> u32(-at);
        }
    }
    out[o] = word;
}
