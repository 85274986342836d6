// gemv_rows.cuh -- the row loop of the decode matvecs (matmul_gemv.cu, gate_up_gemv.cu): dp4a.cuh's
// dp4a_rows with the token count a template parameter (NT = 1, 2, 4 or 8), several weight chunks in
// flight per lane, and a warp's rows walked as one stream. See matmul_gemv.cu's header for why and
// for what stays the same.
#pragma once
#include "dp4a.cuh"

#define GV_WARPS 4  // warps per block, as dp4a

// Weight chunks a lane fetches together (a batch), per (type, NT, NMAT): the registers they take are
// what the few accumulators of a small NT leave free -- 4 Q4_K chunks a lane (12 words each while in
// flight) at NT = 1 take 128 registers; the K-quants with high bits (Q5_K, Q6_K: 20-22 words a chunk)
// half as many. NT = 8 keeps dp4a's one chunk; so do the float types, whose chunk is 32 floats.
// GV_U (a probe, through SHARPINF_NVRTC_OPTIONS): the batch at NT <= 2 for the other types.
#ifndef GV_U
#define GV_U 4
#endif
template <int QT, int NT, int NMAT> struct GvUnroll {
    static constexpr bool floats = QT == GB_F32 || QT == GB_F16 || QT == GB_BF16;
    static constexpr int small = QT == GB_Q5_K || QT == GB_Q6_K ? (GV_U + 1) / 2 : GV_U;  // at NT <= 2
    static constexpr int per_matrix = floats ? 1 : (NT <= 2 ? small : (NT == 4 ? (small + 1) / 2 : 1));
    static constexpr int value = NMAT == 1 || per_matrix == 1 ? per_matrix : per_matrix / 2;
};

// Issues the loads of chunks c0, c0 + G, ..., c0 + (U-1) G below n_chunks of row `row` of W (and W2)
// -- none for a row past n_out.
template <int QT, int U, int NMAT>
__device__ __forceinline__ void gv_fetch(typename DpChunk<QT>::Raw (&raw)[U][NMAT], const unsigned char* W,
                                         const unsigned char* W2, long long row_bytes, int row, int n_out, int c0,
                                         int G, int n_chunks) {
    if (row >= n_out) return;
#pragma unroll
    for (int k = 0; k < U; ++k)
        if (c0 + k * G < n_chunks)
#pragma unroll
            for (int m = 0; m < NMAT; ++m) raw[k][m] = DpChunk<QT>::fetch((m ? W2 : W) + row * row_bytes, c0 + k * G);
}

// Chunk c's terms for each of the nt tokens (and matrix) added to its member sums.
template <int NMAT, int NT, class Chunk>
__device__ __forceinline__ void gv_dot_chunk(const Chunk (&ch)[NMAT], float (&acc)[NMAT][NT], const signed char* xq,
                                             const float* xd, const int* xs, int c, int n_in, int nt) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        if (t < nt) {
            DpX x;
            dp_load_x(xq, xd, xs, t, c, n_in, x);
#pragma unroll
            for (int m = 0; m < NMAT; ++m) acc[m][t] = ch[m].acc_dot(acc[m][t], x);
        }
    }
}

// NMAT = 1: Y = X W^T (+ bias) (+ Y when accumulate); NMAT = 2: Y = act(X W^T) * (X W2^T).
// n_tokens <= NT tokens, all in one tile (grid.y = 1).
// GC: G when known at compile time (the _g16 and _g32 entries: dp4a.cuh's DP_GC), 0: from n_in
//
// A warp walks its rows (base, base + rows_per_pass, ...) as one stream of batches: a row's chunks in
// batches of U -- c0, c0 + G, ..., c0 + (U-1) G, dotted and added in that order, the canonical order
// whatever U is -- the same number of batches for every lane of the warp, and each batch's loads
// issued one batch ahead: while a batch is dotted (and a row's member sums meet), the next batch's
// loads -- the next row's first, at a row's end -- are in flight. (Fetched and dotted in one
// iteration, ptxas sank each chunk's loads to just before its own dots, after the previous chunk's:
// one memory round a chunk, U = 4 no better than 1. It cannot move them across the loop's back edge.)
template <int QT, int NMAT, int NT, int GC = 0>
__device__ __forceinline__ void gemv_rows(const unsigned char* __restrict__ W, const unsigned char* __restrict__ W2,
                                          const signed char* __restrict__ xq, const float* __restrict__ xd,
                                          const int* __restrict__ xs, const float* __restrict__ bias, float* Y,
                                          int n_tokens, int n_out, int n_in, int has_bias, int accumulate,
                                          long long y_stride, int act = ACT_SILU) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_chunks = n_in / 32;
    const int G = GC ? GC : dp_group_lanes(n_chunks), g = lane % G, sub = lane / G, rows_per_warp = 32 / G;
    const int nt = n_tokens < NT ? n_tokens : NT;
    const long long row_bytes = gb_row_bytes<QT>(n_in);
    const int rows_per_pass = gridDim.x * GV_WARPS * rows_per_warp;
    constexpr int U = GvUnroll<QT, NT, NMAT>::value;
    const int batches = (n_chunks + U * G - 1) / (U * G);  // a row's, for every lane
    __shared__ DpCombine<NMAT, NT> comb[GV_WARPS];
    DpCombine<NMAT, NT>& cw = comb[warp];
    float acc[NMAT][NT];
#pragma unroll
    for (int m = 0; m < NMAT; ++m)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[m][t] = 0.0f;
    // Float weights are loaded where they are dotted: a chunk is 32 floats, and one in flight beside
    // the one being dotted took up to 255 registers.
    constexpr bool ahead = !GvUnroll<QT, NT, NMAT>::floats;
    typename DpChunk<QT>::Raw raw[U][NMAT];
    int base = (blockIdx.x * GV_WARPS + warp) * rows_per_warp, b = 0;  // the batch at hand: row base + sub, batch b
    if constexpr (ahead) gv_fetch<QT, U, NMAT>(raw, W, W2, row_bytes, base + sub, n_out, g, G, n_chunks);
    while (base < n_out) {
        const int c0 = g + b * U * G;
        const bool live = base + sub < n_out;
        DpChunk<QT> ch[U][NMAT];
#pragma unroll
        for (int k = 0; k < U; ++k)
            if (live && c0 + k * G < n_chunks)
#pragma unroll
                for (int m = 0; m < NMAT; ++m) {
                    if constexpr (ahead) ch[k][m].unpack(raw[k][m], GC ? g & 7 : c0 + k * G);
                    else ch[k][m].load((m ? W2 : W) + (base + sub) * row_bytes, c0 + k * G);
                }
        // the next batch: this row's, or the next row's first
        const bool row_ends = b + 1 == batches;
        const int next_base = row_ends ? base + rows_per_pass : base, next_b = row_ends ? 0 : b + 1;
        if constexpr (ahead) gv_fetch<QT, U, NMAT>(raw, W, W2, row_bytes, next_base + sub, n_out, g + next_b * U * G, G, n_chunks);
#pragma unroll
        for (int k = 0; k < U; ++k)
            if (live && c0 + k * G < n_chunks) gv_dot_chunk<NMAT, NT>(ch[k], acc, xq, xd, xs, c0 + k * G, n_in, nt);
        if (row_ends) {  // warp-uniform: the G member sums of each (row, token) meet in one lane (as dp4a)
            dp_combine<NMAT>(cw, acc, G, rows_per_warp, nt, base, n_out, [&](int t, int r, const float(&v)[NMAT]) {
                dp_store<NMAT>(Y + (long long)t * y_stride + r, v[0], v[NMAT - 1], bias, r, has_bias, accumulate, act);
            });
#pragma unroll
            for (int m = 0; m < NMAT; ++m)
#pragma unroll
                for (int t = 0; t < NT; ++t) acc[m][t] = 0.0f;
        }
        base = next_base;
        b = next_b;
    }
}
