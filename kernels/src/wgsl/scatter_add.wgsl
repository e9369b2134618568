// `scatter_add` along one axis, the transpose of `take`. The output is
// viewed as [outer, n, inner], the updates as [outer, index count, inner]
// and the indices as a flat list. One workgroup owns ROWS consecutive
// output rows of one `o`: its invocations scan the indices together, CHUNK
// at a time, marking those that name one of its rows in a bit mask per
// row, and then each invocation adds the marked update rows, in index
// order, into the columns it owns (lid, lid + 64, ...), accumulating in
// the output words. Work is rows × indices / (64 · ROWS) for the scan plus
// the updates themselves, instead of outputs × indices; and as WGSL has no
// float atomics, owning columns keeps the sums free of races and in the
// reference's order. Negative i32 indices count from the end; an index
// still out of range is reported (`report_bad_input`) and adds nowhere.
// The generated part above defines `load_0(i)` (the updates, as T),
// `load_index(j)` (as i32), `load_out(i)` and `store_value(v)` (an output
// word as T and back: f16 and bf16 results sum in f32 words, packed
// afterwards), `report_bad_input` and `ROWS` (the output rows per
// workgroup, from `scatter.rs`).
//
// params: [workgroups (outer · ⌈n / ROWS⌉), inner, index count, n]

const WG: u32 = 64u;
// Indices scanned between two barriers (lavapipe pays for every barrier),
// CHUNK / 32 mask words per row.
const CHUNK: u32 = 512u;
const WORDS: u32 = CHUNK / 32u;

// Two sets of masks (and of `touched`) used alternately: chunk c fills
// hits[c % 2] while the other is cleared, so a chunk needs two barriers,
// not three (workgroup memory starts zeroed).
var<workgroup> hits: array<array<array<atomic<u32>, WORDS>, ROWS>, 2>;
// Bit rr set when row rr has a hit in the chunk: most rows have none, and
// one load skips all their mask words (atomic loads are what cost on
// lavapipe: reading every mask word made the kernel 6× slower).
var<workgroup> touched: array<atomic<u32>, 2>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let flat = flat_workgroup(wid, nwg);
    if (flat >= params[0]) {
        return;
    }
    let inner = params[1];
    let count = params[2];
    let n = params[3];
    let blocks = (n + ROWS - 1u) / ROWS;
    let o = flat / blocks;
    let row0 = (flat % blocks) * ROWS;
    let rows = min(ROWS, n - row0);
    let first = (o * n + row0) * inner;
    for (var r = lid; r < rows * inner; r += WG) {
        out[first + r] = store_value(T());
    }
    var buffer = 0u;
    for (var c0 = 0u; c0 < count; c0 += CHUNK) {
        for (var t = lid; t < CHUNK; t += WG) {
            let j = c0 + t;
            if (j < count) {
                var p = load_index(j);
                if (p < 0) {
                    p += i32(n);
                }
                if (p < 0 || p >= i32(n)) {
                    report_bad_input(j);
                } else if (u32(p) >= row0 && u32(p) < row0 + rows) {
                    let rr = u32(p) - row0;
                    atomicOr(&hits[buffer][rr][t / 32u], 1u << (t % 32u));
                    atomicOr(&touched[buffer], 1u << rr);
                }
            }
        }
        workgroupBarrier();
        var hit_rows = atomicLoad(&touched[buffer]);
        while (hit_rows != 0u) {
            let rr = firstTrailingBit(hit_rows);
            hit_rows &= hit_rows - 1u;
            let at = first + rr * inner;
            for (var w = 0u; w < WORDS; w++) {
                var bits = atomicLoad(&hits[buffer][rr][w]);
                while (bits != 0u) {
                    let j = c0 + w * 32u + firstTrailingBit(bits);
                    bits &= bits - 1u;
                    let update = (o * count + j) * inner;
                    for (var r = lid; r < inner; r += WG) {
                        out[at + r] = store_value(load_out(at + r) + load_0(update + r));
                    }
                }
            }
        }
        for (var i = lid; i < ROWS * WORDS; i += WG) {
            atomicStore(&hits[1u - buffer][i / WORDS][i % WORDS], 0u);
        }
        if (lid == 0u) {
            atomicStore(&touched[1u - buffer], 0u);
        }
        workgroupBarrier();
        buffer = 1u - buffer;
    }
}
