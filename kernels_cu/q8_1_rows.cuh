// q8_1_rows.cuh -- a row's 32-value blocks quantized to q8_1 by the block's warps (common.cuh's
// q8_1_block each), and a row's RMS norm into q8_1: rmsnorm_q8_1.cu's kernels, ffn_dp4a.cu's
// middle phase and layer_dp4a.cu's norms.
#pragma once
#include "common.cuh"

// Quantize 32-value blocks b0, b0 + step, ... < b_end of a row; value(i) gives the float to store
// at i. A warp takes blocks warp, warp + warps, ...; RQ_UNROLL of them at once, so their loads and
// shuffle chains overlap (a block's arithmetic is the same whichever warp or pass takes it).
#define RQ_UNROLL 4
template <typename Value>
__device__ __forceinline__ void q8_1_row(Value value, signed char* q, float* d, int* s, int b_begin, int b_end) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int b0 = b_begin + warp; b0 < b_end; b0 += warps * RQ_UNROLL) {
        float v[RQ_UNROLL];
#pragma unroll
        for (int u = 0; u < RQ_UNROLL; ++u) {
            const int b = b0 + u * warps;
            v[u] = b < b_end ? value(b * 32 + lane) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < RQ_UNROLL; ++u) {
            const int b = b0 + u * warps;
            if (b >= b_end) break;  // uniform per warp
            q8_1_block(v[u], q + b * 32, d + b, s + b);
        }
    }
}

// rmsnorm.cu's scale rsqrt(mean(x^2) + eps) of a row, in its order -- sum_threads serial sums (128
// for n <= 256, else 256: basic.rmsnorm's block), xor-butterflies within warps, the warp sums added
// by one more butterfly in warp order -- by a block of any multiple of 32 threads: a block of 128
// takes rmsnorm's threads v and v + 128 in two rounds, a larger one leaves its extra warps out. So
// a norm's bits never depend on the block that takes it. smem32: 32 floats, free again on return.
// A thread's serial sum loads RS_UNROLL of its values before it adds the first (the same adds in
// the same order): a loop that added each value as it arrived would wait on memory once a value --
// 16 round trips in a row at n = 4096, not one.
#define RS_UNROLL 16
// ST: rmsnorm's summing threads (128 for n <= 256, else 256), a compile-time constant so that a
// thread's 16 loads are one address plus constant offsets: with the stride a run-time value, each
// load takes its own address arithmetic, and ptxas interleaves the first adds with the last loads
// (several waits on memory, not 1).
template <int ST>
__device__ __forceinline__ float rms_scale_st(const float* x, int n, float eps, float* smem32) {
    const int lane = threadIdx.x & 31;
    for (int v0 = 0; v0 < ST; v0 += blockDim.x) {  // uniform across the block
        const int v = v0 + threadIdx.x;            // rmsnorm's thread v
        float ss = 0.0f;
        if (v < ST)
            for (int i0 = v; i0 < n; i0 += RS_UNROLL * ST) {
                const float* p = x + i0;
                float xv[RS_UNROLL];
#pragma unroll
                for (int u = 0; u < RS_UNROLL; ++u) xv[u] = i0 + u * ST < n ? p[u * ST] : 0.0f;
#pragma unroll
                for (int u = 0; u < RS_UNROLL; ++u)
                    if (i0 + u * ST < n) ss += xv[u] * xv[u];
            }
        ss = warp_reduce_sum(ss);
        if (lane == 0 && v < ST) smem32[v >> 5] = ss;
    }
    __syncthreads();
    const float total = warp_reduce_sum(lane < ST / 32 ? smem32[lane] : 0.0f);
    __syncthreads();
    return rsqrtf(total / (float)n + eps);
}
__device__ __forceinline__ float rms_scale(const float* x, int n, float eps, float* smem32) {
    return n <= 256 ? rms_scale_st<128>(x, n, eps, smem32) : rms_scale_st<256>(x, n, eps, smem32);
}

// q8_1(rmsnorm(x) * w) of one row of n (a multiple of 32), by the whole block.
__device__ __forceinline__ void rmsnorm_q8_1_row(const float* x, const float* w, signed char* q, float* d, int* s,
                                                 int n, float eps, float* smem32) {
    const float scale = rms_scale(x, n, eps, smem32);
    q8_1_row([&](int i) { return x[i] * scale * w[i]; }, q, d, s, 0, n / 32);
}
