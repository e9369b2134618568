// `stage_weights` of qmm_tiled.wgsl for any code width and either layout
// of w: the BK×32 tile of the logical [k, n] weight, four output columns
// at one k per item. The generated part above defines `weight(w_mat, col,
// kk)`: element (kk, col) of w matrix `w_mat` decoded, 0 past the matrix
// (each code read with `code_at`: a 3-, 5- or 6-bit code may straddle two
// words).

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
