// gemv_rows.cuh -- the row loop of the decode matvecs (matmul_gemv.cu, gate_up_gemv.cu): dp4a.cuh's
// dp4a_rows with the token count a template parameter (NT = 1, 2, 4 or 8) and several weight chunks
// in flight per lane. See matmul_gemv.cu's header for why and for what stays the same.
#pragma once
#include "dp4a.cuh"

#define GV_WARPS 4  // warps per block, as dp4a

// Weight chunks a lane loads before it dots them, per (type, NT, NMAT): the registers they take are
// what the few accumulators of a small NT leave free (NT = 8 keeps dp4a's one chunk; so do the float
// types, whose chunk is 32 floats).
template <int QT, int NT, int NMAT> struct GvUnroll {
    static constexpr bool floats = QT == GB_F32 || QT == GB_F16 || QT == GB_BF16;
    static constexpr int per_matrix = floats ? 1 : (NT <= 2 ? 4 : (NT == 4 ? 2 : 1));
    static constexpr int value = NMAT == 1 || per_matrix == 1 ? per_matrix : per_matrix / 2;
};

// NMAT = 1: Y = X W^T (+ bias) (+ Y when accumulate); NMAT = 2: Y = act(X W^T) * (X W2^T).
// n_tokens <= NT tokens, all in one tile (grid.y = 1).
// GC: G when known at compile time (the _g16 and _g32 entries: dp4a.cuh's DP_GC), 0: from n_in
template <int QT, int NMAT, int NT, int GC = 0>
__device__ __forceinline__ void gemv_rows(const unsigned char* __restrict__ W, const unsigned char* __restrict__ W2,
                                          const signed char* __restrict__ xq, const float* __restrict__ xd,
                                          const int* __restrict__ xs, const float* __restrict__ bias, float* Y,
                                          int n_tokens, int n_out, int n_in, int has_bias, int accumulate,
                                          long long y_stride, int act = ACT_SILU) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_chunks = n_in / 32;
    const int G = GC ? GC : dp_group_lanes(n_chunks), g = lane % G, rows_per_warp = 32 / G;
    const int nt = n_tokens < NT ? n_tokens : NT;
    const long long row_bytes = gb_row_bytes<QT>(n_in);
    const int rows_per_pass = gridDim.x * GV_WARPS * rows_per_warp;
    constexpr int U = GvUnroll<QT, NT, NMAT>::value;
    __shared__ DpCombine<NMAT, NT> comb[GV_WARPS];
    DpCombine<NMAT, NT>& cw = comb[warp];
    for (int base = (blockIdx.x * GV_WARPS + warp) * rows_per_warp; base < n_out; base += rows_per_pass) {
        const int row = base + lane / G;
        float acc[NMAT][NT];
#pragma unroll
        for (int m = 0; m < NMAT; ++m)
#pragma unroll
            for (int t = 0; t < NT; ++t) acc[m][t] = 0.0f;
        if (row < n_out) {
            const unsigned char* wrow[2] = {W + (long long)row * row_bytes, NMAT > 1 ? W2 + (long long)row * row_bytes : W};
            // U chunks c0, c0 + G, ..., c0 + (U-1) G: all their loads issued, then dotted and added
            // in that order -- the canonical order, whatever U is.
            for (int c0 = g; c0 < n_chunks; c0 += U * G) {
                DpChunk<QT> ch[U][NMAT];
#pragma unroll
                for (int k = 0; k < U; ++k)
                    if (c0 + k * G < n_chunks)
#pragma unroll
                        for (int m = 0; m < NMAT; ++m) dp_load_at(ch[k][m], wrow[m], c0 + k * G, GC ? g & 7 : c0 + k * G);
#pragma unroll
                for (int k = 0; k < U; ++k) {
                    const int c = c0 + k * G;
                    if (c >= n_chunks) break;
#pragma unroll
                    for (int t = 0; t < NT; ++t) {
                        if (t < nt) {
                            DpX x;
                            dp_load_x(xq, xd, xs, t, c, n_in, x);
#pragma unroll
                            for (int m = 0; m < NMAT; ++m) acc[m][t] = ch[k][m].acc_dot(acc[m][t], x);
                        }
                    }
                }
            }
        }
        // the G member sums of each (row, token) meet in one lane, folded in the canonical order (as dp4a)
        dp_combine<NMAT>(cw, acc, G, rows_per_warp, nt, base, n_out, [&](int t, int r, const float(&v)[NMAT]) {
            dp_store<NMAT>(Y + (long long)t * y_stride + r, v[0], v[NMAT - 1], bias, r, has_bias, accumulate, act);
        });
    }
}
