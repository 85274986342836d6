// q8_1_rows.cuh -- a row's 32-value blocks quantized to q8_1 by the block's warps (common.cuh's
// q8_1_block each): rmsnorm_q8_1.cu's norm and quantize_q8_1, and ffn_dp4a.cu's middle phase.
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
