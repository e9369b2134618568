// Geometry shared by reductions and argmax: one workgroup per output
// element, reading the group of input elements that reduce into it.
//
// params: [outputs, group, kept rank, reduced rank, kept shape,
//          kept strides, reduced shape, reduced strides] (strides of the
//          contiguous input, in elements).

// Input offset of output element `o`'s first reduced element: `o`
// unraveled over the kept axes.
fn kept_offset(o: u32) -> u32 {
    let kept = params[2];
    var idx = 0u;
    var rem = o;
    for (var d = kept; d > 0u; d--) {
        let size = params[3u + d];
        idx += (rem % size) * params[3u + kept + d];
        rem /= size;
    }
    return idx;
}
