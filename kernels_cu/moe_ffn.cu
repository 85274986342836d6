// moe_ffn.cu -- the MoE experts, readable baseline: one warp per (token, slot) pair and output row.
// A pair p = t * k + r is token t's r-th choice, expert ids[p] (moe_route.cu).
//   moe_gate_up_<type>(Wg, Wu, X, ids, G, n_pairs, k, n_ff, n_in, act)
//     G[p][j] = act(X[p / k] . Wg[e][j]) * (X[p / k] . Wu[e][j]),  e = ids[p]
//   moe_down_<type>(Wd, G, ids, Y, n_pairs, n_out, n_in)
//     Y[p][j] = G[p] . Wd[e][j]
//   moe_combine(Y, wts, x, n_tokens, k, n)
//     x[t][j] += ((0 + w_0 Y[t k][j]) + w_1 Y[t k + 1][j]) + ...   (fma each, rank order)
//   W*: the stacked experts as GGUF stores them, raw rows of one type: expert e's row j is row
//   e * n_out + j (<type>: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k); X, G, Y float rows.
//   n_in a multiple of 32 (256 for the K-quants).
// Launch: gate_up / down: block 128 (4 warps, a row each), grid (ceil(n_out / 4), n_pairs);
//   combine: 1-D, any grid and block (grid-stride).
//
// Order (batch invariance): lane l decodes the row's 32-value chunks l, l + 32, ... and adds their
// products to one accumulator in value order (fma); the lanes meet in the xor butterfly. A pair's
// output depends on n_in, its expert and its input row only -- never on which other pairs run, so a
// token gives the same bits alone or in any batch, and its k results are added in rank order, not in
// the order they were computed. Each expert's weights are read once per pair that chose it: the
// grouped variant (moe_dp4a.cu) reads them once per step.
// Bound: memory, k experts' three matrices per token.
#include "ggml_blocks.cuh"

#define MOE_WARPS 4

// One row's dot with one float input row: lane partials in value order, then the butterfly.
template <int QT>
__device__ __forceinline__ float moe_row_dot(const unsigned char* __restrict__ wrow, const float* __restrict__ x,
                                             int n_in) {
    const int lane = threadIdx.x & 31;
    float acc = 0.0f;
    for (int c = lane; c < n_in / GB_CHUNK; c += 32) {
        float w[32];
        gb_decode_chunk<QT>(wrow, c, w);
        const float* xc = x + (long long)c * GB_CHUNK;
#pragma unroll
        for (int e = 0; e < 32; ++e) acc = gb_fma(w[e], xc[e], acc);
    }
    return warp_reduce_sum(acc);
}

// NMAT = 2: Y = act(X Wg^T) * (X Wu^T) (W2 = Wu), X row p / x_div; NMAT = 1: Y = X W^T.
template <int QT, int NMAT>
__device__ __forceinline__ void moe_pair_rows(const unsigned char* __restrict__ W, const unsigned char* __restrict__ W2,
                                              const float* __restrict__ X, const int* __restrict__ ids,
                                              float* __restrict__ Y, int n_pairs, int x_div, int n_out, int n_in,
                                              int act) {
    const int p = blockIdx.y, row = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    if (p >= n_pairs || row >= n_out) return;  // warp-uniform
    const long long row_bytes = gb_row_bytes<QT>(n_in);
    const long long at = ((long long)ids[p] * n_out + row) * row_bytes;
    const float* x = X + (long long)(p / x_div) * n_in;
    const float v = moe_row_dot<QT>(W + at, x, n_in);
    float out = v;
    if (NMAT == 2) out = gated_act(act, v, moe_row_dot<QT>(W2 + at, x, n_in));
    if ((threadIdx.x & 31) == 0) Y[(long long)p * n_out + row] = out;
}

#define MG_PARAMS const unsigned char *Wg, const unsigned char *Wu, const float *X, const int *ids, float *G, \
        int n_pairs, int k, int n_ff, int n_in, int act
#define MD_PARAMS const unsigned char *Wd, const float *G, const int *ids, float *Y, int n_pairs, int n_out, int n_in
template <int QT> __device__ __forceinline__ void moe_gate_up_t(MG_PARAMS) {
    moe_pair_rows<QT, 2>(Wg, Wu, X, ids, G, n_pairs, k, n_ff, n_in, act);
}
template <int QT> __device__ __forceinline__ void moe_down_t(MD_PARAMS) {
    moe_pair_rows<QT, 1>(Wd, Wd, G, ids, Y, n_pairs, 1, n_out, n_in, ACT_SILU);
}
GB_ALL_ENTRIES(moe_gate_up, , (MG_PARAMS), moe_gate_up_t, Wg, Wu, X, ids, G, n_pairs, k, n_ff, n_in, act)
GB_ALL_ENTRIES(moe_down, , (MD_PARAMS), moe_down_t, Wd, G, ids, Y, n_pairs, n_out, n_in)

// x += the k pair outputs of each token, weighted, in rank order (shared by every MoE variant).
extern "C" __global__ void moe_combine(const float* Y, const float* wts, float* x, int n_tokens, int k, int n) {
    sharpinf_pdl_enter();
    const long long total = (long long)n_tokens * n, stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const long long t = i / n, j = i % n;
        float acc = 0.0f;
        for (int r = 0; r < k; ++r) acc = gb_fma(wts[t * k + r], Y[(t * k + r) * n + j], acc);
        x[i] = x[i] + acc;
    }
}
