// ffn_dp4a.cu -- a dense FFN's three decode launches as one: the megakernel pattern (phases of a
// layer in one persistent, cooperative kernel, separated by grid-wide barriers) on the FFN.
//
//   ffn_dp4a_<type>(Wg, Wu, Wd, xq, xd, xs, h, hq, hd, hs, x, bar, n_tokens, n_ff, n_embd, act)
//     Wg, Wu, Wd  gate, up [n_ff rows of n_embd] and down [n_embd rows of n_ff]: raw GGUF rows, one type
//     xq, xd, xs  the FFN norm's output in q8_1 (rmsnorm_q8_1.cu)
//     h           float [n_tokens, n_ff] scratch: act(gate) * up
//     hq, hd, hs  q8_1 [n_tokens, n_ff] scratch: h quantized
//     x           float [n_tokens, n_embd], the residual stream: x += down(h)
//     bar         u32 [2], zeroed once: common.cuh's grid barrier
//   phase 1  h = act(X Wg^T) * (X Wu^T)     gate_up_dp4a.cu's dp4a_rows<QT, 2>
//   --- grid barrier
//   phase 2  hq, hd, hs = q8_1(h)           rmsnorm_q8_1.cu's quantize_q8_1 (q8_1_rows.cuh)
//   --- grid barrier
//   phase 3  x += hq Wd^T                   matmul_dp4a.cu's dp4a_rows<QT, 1>, accumulating
//
// Each phase runs its separate kernel's code: dp4a_rows spreads rows over the grid by stride and
// reduces each row in the same fixed order whatever the grid, and a q8_1 block's arithmetic does
// not depend on which warp takes it -- so x's bits equal gate_up_dp4a + quantize_q8_1 +
// matmul_dp4a's, for any grid: bit-identical to the dp4a path (tests/test_kernels_ffn_fused.py).
//
// Launch: cooperative (Backend.prepare(..., cooperative=True)), block 128 (DP_WARPS warps), grid =
// min(the blocks resident at once, phase 1's row blocks); steps of <= 8 tokens (one DP_TILE: the
// grid has one row of blocks); the three matrices of one weight type (else the launcher falls back
// to the three launches). Phases 2 and 3 read what other blocks wrote in this launch: the barrier
// fences, and none of it was read earlier in the launch (no stale line in any SM's L1).
// Bound: the three matrices' bytes, as the three kernels. What it saves: two launches and the
// idle ramps between kernels (a few us a layer in a graph); what it pays: two grid barriers
// (an atomic and a spin each, ~1-2 us on a GPU) and phase 1's grid for the whole FFN.
#include "dp4a.cuh"
#include "q8_1_rows.cuh"

#define FFN_ARGS                                                                                                \
    const unsigned char *Wg, const unsigned char *Wu, const unsigned char *Wd, const signed char *xq,          \
        const float *xd, const int *xs, float *h, signed char *hq, float *hd, int *hs, float *x, unsigned *bar, \
        int n_tokens, int n_ff, int n_embd, int act
#define FFN_QCHUNK 64  // q8_1 blocks a phase-2 task quantizes (quantize_q8_1's RQ_CHUNK)

template <int QT>
__device__ __forceinline__ void ffn_fused(FFN_ARGS) {
    // phase 1: gate, up and the activation, rows of n_ff
    dp4a_rows<QT, 2>(Wg, Wu, xq, xd, xs, xd, h, n_tokens, n_ff, n_embd, 0, 0, (long long)n_ff, act);
    sharpinf_grid_sync(bar);
    // phase 2: h to q8_1, tasks of (token, FFN_QCHUNK blocks) over the grid
    const int nb = n_ff / 32, chunks = (nb + FFN_QCHUNK - 1) / FFN_QCHUNK;
    for (int task = blockIdx.x; task < n_tokens * chunks; task += gridDim.x) {
        const long long t = task / chunks;
        const int b_begin = (task % chunks) * FFN_QCHUNK, b_end = min(nb, b_begin + FFN_QCHUNK);
        const float* row = h + t * n_ff;
        q8_1_row([&](int i) { return row[i]; }, hq + t * n_ff, hd + t * nb, hs + t * nb, b_begin, b_end);
    }
    sharpinf_grid_sync(bar);
    // phase 3: down, added into the residual stream
    dp4a_rows<QT, 1>(Wd, Wd, hq, hd, hs, hd, x, n_tokens, n_embd, n_ff, 0, 1, (long long)n_embd, act);
}

GB_QUANT_ENTRIES(ffn_dp4a, , (FFN_ARGS), ffn_fused, Wg, Wu, Wd, xq, xd, xs, h, hq, hd, hs, x, bar, n_tokens, n_ff,
                 n_embd, act)
