// ffn_fused.cuh -- a dense FFN's three dp4a launches as three phases of one cooperative kernel
// (gate+up+act, q8_1, down + residual; two grid barriers): ffn_dp4a.cu's kernel and the middle of
// layer_dp4a.cu's. Phases, bit-identity and launch: ffn_dp4a.cu's header.
#pragma once
#include "dp4a.cuh"
#include "q8_1_rows.cuh"

#define FFN_ARGS                                                                                                \
    const unsigned char *Wg, const unsigned char *Wu, const unsigned char *Wd, const signed char *xq,          \
        const float *xd, const int *xs, float *h, signed char *hq, float *hd, int *hs, float *x, unsigned *bar, \
        int n_tokens, int n_ff, int n_embd, int act
#define FFN_QCHUNK 64  // q8_1 blocks a phase-2 task quantizes (quantize_q8_1's RQ_CHUNK)

// phase 2: h to q8_1, tasks of (token, FFN_QCHUNK blocks) strided over the grid
__device__ __forceinline__ void ffn_quantize_h(const float* h, signed char* hq, float* hd, int* hs, int n_tokens,
                                               int n_ff) {
    const int nb = n_ff / 32, chunks = (nb + FFN_QCHUNK - 1) / FFN_QCHUNK;
    for (int task = blockIdx.x; task < n_tokens * chunks; task += gridDim.x) {
        const long long t = task / chunks;
        const int b_begin = (task % chunks) * FFN_QCHUNK, b_end = min(nb, b_begin + FFN_QCHUNK);
        const float* row = h + t * n_ff;
        q8_1_row([&](int i) { return row[i]; }, hq + t * n_ff, hd + t * nb, hs + t * nb, b_begin, b_end);
    }
}

// GE, GF: G of rows of n_embd (phase 1) and of n_ff (phase 3) where compiled in (ffn_dp4a.cu's _g entries;
// 0: from n_in at run time, dp4a_rows' GC)
template <int QT, int GE = 0, int GF = 0>
__device__ __forceinline__ void ffn_fused(FFN_ARGS) {
    // phase 1: gate, up and the activation, rows of n_ff
    dp4a_rows<QT, 2, GE, true>(Wg, Wu, xq, xd, xs, xd, h, n_tokens, n_ff, n_embd, 0, 0, (long long)n_ff, act);
    sharpinf_grid_sync(bar);
    ffn_quantize_h(h, hq, hd, hs, n_tokens, n_ff);  // phase 2
    sharpinf_grid_sync(bar);
    // phase 3: down, added into the residual stream
    dp4a_rows<QT, 1, GF, true>(Wd, Wd, hq, hd, hs, hd, x, n_tokens, n_embd, n_ff, 0, 1, (long long)n_embd, act);
}
