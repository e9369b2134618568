// Main of the index-to-element kernels for f16 and bf16 outputs, stored two
// per word: each invocation computes both halves of one word, so no two
// invocations write the same word. The generated part above defines
// `element(i)` and `store_pair(low, high)`; params[0] is the element count.

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let word = flat_index(wid, nwg, lid, 256u);
    let i = word * 2u;
    let n = params[0];
    if (i >= n) {
        return;
    }
    var high = 0.0;
    if (i + 1u < n) {
        high = element(i + 1u);
    }
    out[word] = store_pair(element(i), high);
}
