// moe_router.cuh -- one router logit, as every route kernel computes it (moe_route.cu, moe_route_split.cu):
// a warp's dot of a token's row with expert e's router row, lane l adding the products of values l,
// l + 32, ... in that order (fma), the 32 lane sums meeting in the xor butterfly. The arithmetic
// depends on n_in only, so two kernels -- and two equal router rows -- give the same bits.
#pragma once
#include "ggml_blocks.cuh"  // gb_fma (and common.cuh)

#define MOE_MAX_EXPERTS 512
#define MOE_WARPS 4
#define MOE_WEIGHT_SUM_FLOOR 6.103515625e-5f

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
