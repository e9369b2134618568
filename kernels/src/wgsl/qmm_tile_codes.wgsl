// `stage_weights` of qmm_tiled.wgsl for any code width: the BK×32 tile of
// wᵀ, four columns (rows of w) at one k per item, each code read with
// `code_at` (a 3-, 5- or 6-bit code may straddle two words).

// Element `kk` of row `row` of w matrix `w_mat` (its rows are the output's
// columns), decoded; 0 past the matrix.
fn weight(w_mat: u32, row: u32, kk: u32) -> f32 {
    let n = params[2];
    let k = params[3];
    if (row >= n || kk >= k) {
        return 0.0;
    }
    let w_row = w_mat * n + row;
    let g = w_row * params[5] + kk / params[4];
    return decode(code_at((w_row * k + kk) * BITS), load_scale(g), load_bias(g));
}

fn stage_weights(w_mat: u32, k0: u32, col0: u32, flat_id: u32, live: bool) {
    for (var e = flat_id; e < BK * W_ROW; e += 64u) {
        let kk = k0 + e / W_ROW;
        let col = col0 + (e % W_ROW) * 4u;
        var vw = vec4<f32>(0.0);
        if (live) {
            vw = vec4<f32>(
                weight(w_mat, col, kk),
                weight(w_mat, col + 1u, kk),
                weight(w_mat, col + 2u, kk),
                weight(w_mat, col + 3u, kk),
            );
        }
        tile_w[e] = vw;
    }
}
