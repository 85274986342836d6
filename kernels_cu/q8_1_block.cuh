// q8_1_block.cuh -- the q8_1 rule on one 32-value block by one warp (sharpinf/ops/quant_act.py's):
// every q8_1 writer calls q8_1_block, so the activations of every path have the same bits.
#pragma once
#include "reduce.cuh"

// One q8_1 block by one warp: lane l holds value l of the 32; writes q[l], and lane 0 *d (the scale
// amax / 127) and *s (the sum of the 32 int8). quant_act.py's rule; every q8_1 writer calls this.
__device__ __forceinline__ void q8_1_block(float v, signed char* q, float* d, int* s) {
    const int lane = threadIdx.x & 31;
    const float amax = warp_reduce_max(fabsf(v));
    const float scale = amax / 127.0f;
    const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    const int qv = (int)roundf(v * inv);
    q[lane] = (signed char)qv;
    const int sum = warp_sum_int(qv);
    if (lane == 0) {
        *d = scale;
        *s = sum;
    }
}
