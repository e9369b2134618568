// The index check of `take` and `scatter_add` alone, for a result with no
// elements, whose kernel never runs: the reference still rejects an index
// out of range, so every backend must. One invocation per index; negative
// i32 indices count from the end, and an index still out of range is reported
// (`report_bad_input`). The output words are scratch. The
// generated part above defines `load_index(j)` (as i32) and `report_bad_input`.
//
// params: [index count, n]

fn element(i: u32) -> T {
    let n = params[1];
    var p = load_index(i);
    if (p < 0) {
        p += i32(n);
    }
    if (p < 0 || p >= i32(n)) {
        report_bad_input(i);
    }
    return 0u;
}
