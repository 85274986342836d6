// reduce.cuh -- warp and block reductions in a fixed order (so their bits never depend on timing):
// warp_reduce_sum / warp_reduce_max (xor butterfly, every lane gets the result), warp_sum_int,
// block_reduce_sum / block_reduce_max, and block_exclusive_sum (a block-wide scan of integers).
// On the emulator the warp reductions run emu_shims.cuh's butterfly, the same rounds.
#pragma once
#include "emu_shims.cuh"

// xor butterfly: every lane ends with the full result.
__device__ __forceinline__ float warp_reduce_sum(float v) {
#ifndef SHARPINF_EMU
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(SHARPINF_FULL_MASK, v, off);
    return v;
#else
    return sharpinf_emu_butterfly<SHARPINF_EMU_ADD>(v);
#endif
}

__device__ __forceinline__ float warp_reduce_max(float v) {
#ifndef SHARPINF_EMU
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(SHARPINF_FULL_MASK, v, off));
    return v;
#else
    return sharpinf_emu_butterfly<SHARPINF_EMU_MAX>(v);
#endif
}

__device__ __forceinline__ int warp_sum_int(int v) {
#ifndef SHARPINF_EMU
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(SHARPINF_FULL_MASK, v, off);
    return v;
#else
    return sharpinf_emu_butterfly<SHARPINF_EMU_ADD>(v);
#endif
}

// Block-wide reductions for 1-D blocks whose blockDim.x is a multiple of 32 (<= 1024).
// smem32 must hold 32 floats. Every thread must call; every thread gets the result.
// The leading __syncthreads lets the same smem32 be reused by back-to-back calls.
__device__ __forceinline__ float block_reduce_sum(float v, float* smem32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_reduce_sum(v);
    __syncthreads();
    if (lane == 0) smem32[warp] = v;
    __syncthreads();
    // Each warp reduces the per-warp partials itself: the result is broadcast without
    // another round trip through shared memory.
    return warp_reduce_sum(lane < nwarps ? smem32[lane] : 0.0f);
}

__device__ __forceinline__ float block_reduce_max(float v, float* smem32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_reduce_max(v);
    __syncthreads();
    if (lane == 0) smem32[warp] = v;
    __syncthreads();
    return warp_reduce_max(lane < nwarps ? smem32[lane] : -CUDART_INF_F);
}

// Exclusive prefix sum over a 1-D block's threads in thread order, and the block's total (integers:
// exact). Every thread must call; smem32 holds 32 values, and back-to-back calls may share it (the
// leading __syncthreads). sampling_radix.cu's pick, moe_dp4a.cu's sort.
template <typename T>
__device__ __forceinline__ T block_exclusive_sum(T v, T* smem32, T* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    T inc = v;
    for (int d = 1; d < 32; d <<= 1) {
        const T o = __shfl_up_sync(SHARPINF_FULL_MASK, inc, d);
        if (lane >= d) inc += o;
    }
    __syncthreads();
    if (lane == 31) smem32[warp] = inc;
    __syncthreads();
    T before = T(0), all = T(0);
    for (int j = 0; j < nwarps; ++j) {
        if (j < warp) before += smem32[j];
        all += smem32[j];
    }
    *total = all;
    return before + inc - v;
}
