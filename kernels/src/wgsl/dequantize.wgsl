// Dequantize: one invocation per element of the [rows, cols] weight.
//
// params: [elements, cols, group, groups per row]

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = flat_index(wid, nwg, lid, 256u);
    if (i >= params[0]) {
        return;
    }
    let cols = params[1];
    let g = (i / cols) * params[3] + (i % cols) / params[2];
    out[i] = bitcast<u32>(decode(code_at(i * BITS), load_scale(g), load_bias(g)));
}
