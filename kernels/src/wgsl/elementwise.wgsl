// Main of every kernel computing each output element from its index alone
// (elementwise ops, fused groups, layout copies, concat, gather), for
// dtypes stored one element per word. The generated part above defines
// `element(i)` and `store_value(v)`, of one element, or of four as vec4
// lanes where the output is an array of vec4 words; params[0] is the
// number of elements (or of groups of four).

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
    out[i] = store_value(element(i));
}
