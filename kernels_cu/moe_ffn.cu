// moe_ffn.cu -- the MoE experts, readable baseline: one warp per (token, slot) pair and output row.
// A pair p = t * k + r is token t's r-th choice, expert ids[p] (moe_route.cu).
//   moe_gate_up_<type>(Wg, Wu, X, ids, G, n_pairs, k, n_ff, n_in, act, bias, has_bias)
//     G[p][j] = act(X[p / k] . Wg[e][j] (+ bg[e][j]), X[p / k] . Wu[e][j] (+ bu[e][j])),  e = ids[p]
//     the biases (has_bias: gpt-oss) on the float dots, before the activation, laid out as moe_args.cuh's
//   moe_down_<type>(Wd, G, ids, Y, n_pairs, n_out, n_in)
//     Y[p][j] = G[p] . Wd[e][j]
//   moe_combine(Y, wts, x, n_tokens, k, n, ids, bd, has_bias)
//     x[t][j] += ((0 + w_0 y_0) + w_1 y_1) + ...   (fma each, rank order), y_r = Y[t k + r][j] (+ bd[e][j],
//     e = ids[t k + r], with has_bias: each down's bias, rounded once as a down kernel's epilogue would)
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

// NMAT = 2: Y = act(X Wg^T, X Wu^T) (W2 = Wu), X row p / x_div; NMAT = 1: Y = X W^T; each + its bias
// (has_bias: bias[(e n_out + row) NMAT + m] for matrix m).
template <int QT, int NMAT>
__device__ __forceinline__ void moe_pair_rows(const unsigned char* __restrict__ W, const unsigned char* __restrict__ W2,
                                              const float* __restrict__ X, const int* __restrict__ ids,
                                              float* __restrict__ Y, int n_pairs, int x_div, int n_out, int n_in,
                                              int act, const float* __restrict__ bias, int has_bias) {
    const int p = blockIdx.y, row = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    if (p >= n_pairs || row >= n_out) return;  // warp-uniform
    const long long row_bytes = gb_row_bytes<QT>(n_in);
    const long long at = ((long long)ids[p] * n_out + row) * row_bytes;
    const float* x = X + (long long)(p / x_div) * n_in;
    float v = moe_row_dot<QT>(W + at, x, n_in), u = NMAT == 2 ? moe_row_dot<QT>(W2 + at, x, n_in) : 0.0f;
    if (has_bias) {  // never adds a zero where there is none: -0 stays -0, qwen3moe's bits
        const float* b = bias + ((long long)ids[p] * n_out + row) * NMAT;
        v = v + b[0];
        if (NMAT == 2) u = u + b[1];
    }
    float out = v;
    if (NMAT == 2) out = gated_act(act, v, u);
    if ((threadIdx.x & 31) == 0) Y[(long long)p * n_out + row] = out;
}

#define MG_PARAMS const unsigned char *Wg, const unsigned char *Wu, const float *X, const int *ids, float *G, \
        int n_pairs, int k, int n_ff, int n_in, int act, const float *bias, int has_bias
#define MD_PARAMS const unsigned char *Wd, const float *G, const int *ids, float *Y, int n_pairs, int n_out, int n_in
template <int QT> __device__ __forceinline__ void moe_gate_up_t(MG_PARAMS) {
    moe_pair_rows<QT, 2>(Wg, Wu, X, ids, G, n_pairs, k, n_ff, n_in, act, bias, has_bias);
}
template <int QT> __device__ __forceinline__ void moe_down_t(MD_PARAMS) {
    moe_pair_rows<QT, 1>(Wd, Wd, G, ids, Y, n_pairs, 1, n_out, n_in, ACT_SILU, Y, 0);
}
GB_ALL_ENTRIES(moe_gate_up, , (MG_PARAMS), moe_gate_up_t, Wg, Wu, X, ids, G, n_pairs, k, n_ff, n_in, act, bias, has_bias)
GB_ALL_ENTRIES(moe_down, , (MD_PARAMS), moe_down_t, Wd, G, ids, Y, n_pairs, n_out, n_in)

// x += the k pair outputs of each token (+ each one's down bias), weighted, in rank order (shared by every
// MoE variant: the down bias here, not in each down kernel's epilogue, whose registers it would take).
extern "C" __global__ void moe_combine(const float* Y, const float* wts, float* x, int n_tokens, int k, int n,
                                       const int* ids, const float* bd, int has_bias) {
    sharpinf_pdl_enter();
    const long long total = (long long)n_tokens * n, stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const long long t = i / n, j = i % n;
        float acc = 0.0f;
        for (int r = 0; r < k; ++r) {
            const long long p = t * k + r;
            const float y = has_bias ? Y[p * n + j] + bd[(long long)ids[p] * n + j] : Y[p * n + j];
            acc = gb_fma(wts[p], y, acc);
        }
        x[i] = x[i] + acc;
    }
}
