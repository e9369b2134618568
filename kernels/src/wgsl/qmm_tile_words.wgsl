// `stage_weights` of qmm_tiled.wgsl for codes that fill whole words (32 %
// BITS == 0, rows a whole number of words, groups of whole words): one item
// per packed word of the BK×32 tile, its scale and bias read once and its
// PER_WORD codes decoded into one column of `tile_w`.

const PER_WORD: u32 = 32u / BITS;

fn stage_weights(w_mat: u32, k0: u32, col0: u32, flat_id: u32, live: bool) {
    let n = params[2];
    let k = params[3];
    let words = BK / PER_WORD;
    for (var e = flat_id; e < TILE_N * words; e += 64u) {
        let c = e / words;
        let kk = (e % words) * PER_WORD;
        let row = col0 + c;
        let at = k0 + kk;
        var word = 0u;
        var scale = 0.0;
        var bias = 0.0;
        let valid = live && row < n && at < k;
        if (valid) {
            let w_row = w_mat * n + row;
            word = in_1[(w_row * k + at) / PER_WORD];
            let g = w_row * params[5] + at / params[4];
            scale = load_scale(g);
            bias = load_bias(g);
        }
        for (var j = 0u; j < PER_WORD; j++) {
            var v = 0.0;
            if (valid) {
                v = decode((word >> (j * BITS)) & MASK, scale, bias);
            }
            tile_w[(kk + j) * W_ROW + c / 4u][c % 4u] = v;
        }
    }
}
