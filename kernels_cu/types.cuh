// types.cuh -- what every kernel header stands on: the fp16 / bf16 types (CUDA's headers under
// NVRTC; cuda_emu.h provides them on the emulator), __forceinline__ for g++, the CUDART_* constants
// (NVRTC has no <cmath> macros: never INFINITY / NAN), the full warp mask, and to_float / from_float.
#pragma once

#ifndef SHARPINF_EMU
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

#ifndef __forceinline__
#define __forceinline__ inline __attribute__((always_inline))
#endif

// --- constants ----------------------------------------------------------------
#ifndef CUDART_INF_F
#ifdef SHARPINF_EMU
#define CUDART_INF_F (__builtin_huge_valf())
#define CUDART_NAN_F (__builtin_nanf(""))
#else
#define CUDART_INF_F (__int_as_float(0x7f800000))
#define CUDART_NAN_F (__int_as_float(0x7fffffff))
#endif
#endif

#define SHARPINF_FULL_MASK 0xffffffffu

// --- fp16 / bf16 conversions ----------------------------------------------------
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}
