// moe_route.cu -- the MoE router of one token per block: logits = h W_inp^T (+ b), softmax over every
// expert, the top k, their weights renormalised (llama.cpp's build_moe_ffn for qwen3moe); or (gating 1,
// gpt-oss) the top k logits, a softmax over those k.
//   moe_route_f32(X, Wr, br, ids, wts, n_expert, k, n_in, has_bias, gating)      X float [T, n_in]
//   moe_route_q8(xq, xd, Wr, br, ids, wts, n_expert, k, n_in, has_bias, gating)  X in q8_1: xq[i] * xd[i / 32]
//     Wr   float [n_expert, n_in] (the router, F32 on the device whatever the file's type); br float
//          [n_expert], the logits' bias (read with has_bias)
//     ids  int32 [T, k]: the chosen experts, best first; wts float [T, k]: their weights
//     gating  MOE_GATING_SOFTMAX (0) or MOE_GATING_TOPK_SOFTMAX (1): moe_router.cuh
//   n_in a multiple of 32; n_expert <= MOE_MAX_EXPERTS (512), k <= n_expert.
// Launch: grid = T (one block a token), block = 128 (4 warps).
//
// Batch invariance (and exact ties): warp w takes experts w, w + 4, ...; lane l adds the products of
// values l, l + 32, ... in that order (fma), and the 32 lane sums meet in the xor butterfly. The
// arithmetic of a logit depends on n_in only -- never on the expert's index, the token's place or
// the batch -- so two equal router rows give bit-equal logits. Then thread 0, in expert order: the
// max, p_e = e^(l_e - max), their sum, p_e / sum; k passes each taking the largest p not yet taken,
// a strict > so the lower id wins a tie; the k weights summed in rank order, floored at 2^-14
// (llama.cpp's clamp), and divided by it (gating 1: k passes over the logits, a taken one NaN, then
// moe_router.cuh's weights). One thread's serial top-k is the readable form: 128
// experts x 8 picks is ~1k comparisons, next to 2 x 128 x 2048 products.
// Bound: the router matrix read once per token (F32: 1 MiB a layer for Qwen3-30B-A3B) -- by one block,
// so at decode the latency of its warps' serial dots (moe_route_split.cu spreads them).
#include "moe_router.cuh"  // the logit's arithmetic (moe_router_logit), RowF32, RowQ8

// Gating 1 on one token's logits l (thread 0): pass r takes the largest logit not yet taken (strict >:
// the lower id wins a tie; a NaN, and a taken expert marked NaN, never wins; none left: expert r).
__device__ __forceinline__ void moe_topk_serial(float* l, int* ids, float* wts, int n_expert, int k) {
    bool any_nan = false;
    for (int e = 0; e < n_expert; ++e) any_nan = any_nan || l[e] != l[e];
    for (int r = 0; r < k; ++r) {
        int top = -1;
        for (int e = 0; e < n_expert; ++e)
            if (l[e] == l[e] && (top < 0 || l[top] < l[e])) top = e;
        if (top < 0) top = r;  // only with a NaN logit: its weights come out NaN
        ids[r] = top;
        wts[r] = l[top];
        l[top] = CUDART_NAN_F;
    }
    moe_topk_softmax_weights(wts, k, any_nan);
}

// One token's routing from its row of X. LOAD(i) gives value i of the row as a float.
template <typename Load>
__device__ __forceinline__ void moe_route_row(Load load, const float* __restrict__ Wr, const float* __restrict__ br,
                                              int* __restrict__ ids, float* __restrict__ wts, int n_expert, int k,
                                              int n_in, int has_bias, int gating) {
    __shared__ float p[MOE_MAX_EXPERTS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int e = warp; e < n_expert; e += MOE_WARPS) {
        const float acc = moe_router_logit(load, Wr + (long long)e * n_in, n_in);
        if (lane == 0) p[e] = has_bias ? acc + br[e] : acc;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    const long long t = blockIdx.x;
    if (gating == MOE_GATING_TOPK_SOFTMAX) return moe_topk_serial(p, ids + t * k, wts + t * k, n_expert, k);
    float mx = p[0];
    for (int e = 1; e < n_expert; ++e) mx = fmaxf(mx, p[e]);
    float sum = 0.0f;
    for (int e = 0; e < n_expert; ++e) {
        p[e] = expf(p[e] - mx);
        sum += p[e];
    }
    for (int e = 0; e < n_expert; ++e) p[e] = p[e] / sum;
    float total = 0.0f;
    for (int r = 0; r < k; ++r) {
        int best = -1;
        for (int e = 0; e < n_expert; ++e)  // taken experts hold -1; a NaN never wins but the first stands
            if (p[e] >= 0.0f && (best < 0 || p[e] > p[best])) best = e;
        if (best < 0) best = r;  // every p NaN: some expert, and the NaN weights below say so
        ids[t * k + r] = best;
        wts[t * k + r] = p[best];
        total += p[best];
        p[best] = -1.0f;
    }
    total = fmaxf(total, MOE_WEIGHT_SUM_FLOOR);
    for (int r = 0; r < k; ++r) wts[t * k + r] = wts[t * k + r] / total;
}

extern "C" __global__ void moe_route_f32(const float* X, const float* Wr, const float* br, int* ids, float* wts,
                                         int n_expert, int k, int n_in, int has_bias, int gating) {
    sharpinf_pdl_enter();
    moe_route_row(RowF32{X + (long long)blockIdx.x * n_in}, Wr, br, ids, wts, n_expert, k, n_in, has_bias, gating);
}
extern "C" __global__ void moe_route_q8(const signed char* xq, const float* xd, const float* Wr, const float* br,
                                        int* ids, float* wts, int n_expert, int k, int n_in, int has_bias, int gating) {
    sharpinf_pdl_enter();
    moe_route_row(RowQ8{xq + (long long)blockIdx.x * n_in, xd + (long long)blockIdx.x * (n_in / 32)}, Wr, br, ids, wts,
                  n_expert, k, n_in, has_bias, gating);
}
