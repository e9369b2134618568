// `take` along one axis, as the element function of an index-to-element
// kernel: the input is viewed as [outer, n, inner] and the indices as a
// flat list; negative i32 indices count from the end. An index still out
// of range is reported through the status word and is read clamped. The
// generated part above defines `load_0(i)` (the data), `load_index(j)` (as
// i32) and `report_bad_input`.
//
// params: [count, inner, index count, n]

fn element(i: u32) -> T {
    let inner = params[1];
    let count = params[2];
    let n = params[3];
    let r = i % inner;
    let j = (i / inner) % count;
    let o = i / (inner * count);
    var p = load_index(j);
    if (p < 0) {
        p += i32(n);
    }
    if (p < 0 || p >= i32(n)) {
        report_bad_input(j);
    }
    let position = u32(clamp(p, 0, i32(n) - 1));
    return load_0((o * n + position) * inner + r);
}
