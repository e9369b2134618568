// `scatter_add` along one axis, the transpose of `take`, as the element
// function of an index-to-element kernel. The output is viewed as
// [outer, n, inner], the updates as [outer, index count, inner] and the
// indices as a flat list. WGSL has no float atomics, so each invocation
// owns one output element and adds, in index order, every update row whose
// index names its row: no two invocations write one element, and the sum
// is the reference's, in the reference's order. Negative i32 indices count
// from the end; an index still out of range is reported
// (`report_bad_input`) and adds nowhere. The generated part above defines `load_0(i)`
// (the updates), `load_index(j)` (as i32), `round_sum(v)` (rounding a sum
// to the output dtype) and `report_bad_input`.
//
// params: [count, inner, index count, n]

fn element(i: u32) -> T {
    let inner = params[1];
    let count = params[2];
    let n = params[3];
    let r = i % inner;
    let row = (i / inner) % n;
    let o = i / (inner * n);
    var sum = T();
    for (var j = 0u; j < count; j++) {
        var p = load_index(j);
        if (p < 0) {
            p += i32(n);
        }
        if (p < 0 || p >= i32(n)) {
            report_bad_input(j);
        } else if (u32(p) == row) {
            sum += load_0((o * count + j) * inner + r);
        }
    }
    return round_sum(sum);
}
