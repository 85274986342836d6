// moe_router.cuh -- one router logit, as every route kernel computes it (moe_route.cu, moe_route_split.cu):
// a warp's dot of a token's row with expert e's router row, lane l adding the products of values l,
// l + 32, ... in that order (fma), the 32 lane sums meeting in the xor butterfly, then + bias[e] where
// the router has one (gpt-oss). The arithmetic depends on n_in only, so two kernels -- and two equal
// router rows -- give the same bits. And the top-k softmax's weights, which both kernels share.
#pragma once
#include "ggml_blocks.cuh"  // gb_fma (and common.cuh)

#define MOE_MAX_EXPERTS 512
#define MOE_WARPS 4
#define MOE_WEIGHT_SUM_FLOOR 6.103515625e-5f
// gating: how the k are chosen and weighted (ops/moe.py's GATING, route_reference's `gating`)
#define MOE_GATING_SOFTMAX 0       // qwen3moe: a softmax over every expert, its top k, renormalised
#define MOE_GATING_TOPK_SOFTMAX 1  // gpt-oss: the top k of the logits, a softmax over those k

// LOAD(i): value i of the token's row as a float. Every lane of the warp calls; every lane gets the logit.
template <typename Load>
__device__ __forceinline__ float moe_router_logit(Load load, const float* __restrict__ w, int n_in) {
    const int lane = threadIdx.x & 31;
    float acc = 0.0f;
    for (int i = lane; i < n_in; i += 32) acc = gb_fma(w[i], load(i), acc);
    return warp_reduce_sum(acc);
}

struct RowF32 {
    const float* x;
    __device__ __forceinline__ float operator()(int i) const { return x[i]; }
};
struct RowQ8 {
    const signed char* q;
    const float* d;
    __device__ __forceinline__ float operator()(int i) const { return (float)q[i] * d[i >> 5]; }
};

// MOE_GATING_TOPK_SOFTMAX's weights, in place, from the k chosen logits in rank order: e_r = e^(l_r - l_0)
// (l_0 the largest), their sum in rank order, e_r / sum (route_reference's); any_nan (a NaN among the
// token's logits): every weight NaN, never a silent choice. One thread.
__device__ __forceinline__ void moe_topk_softmax_weights(float* w, int k, bool any_nan) {
    const float top = w[0];
    float sum = 0.0f;
    for (int r = 0; r < k; ++r) {
        w[r] = expf(w[r] - top);
        sum += w[r];
    }
    for (int r = 0; r < k; ++r) w[r] = any_nan ? CUDART_NAN_F : w[r] / sum;
}
