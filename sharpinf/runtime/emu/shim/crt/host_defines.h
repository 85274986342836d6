/* Stand-in for CUDA's internal crt/host_defines.h, which the pip wheel
   nvidia-cuda-runtime-cu12 omits although its vector_types.h includes it.
   Only used when the CUDA include dir has no crt/ (it comes after it on -I). */
#pragma once
#define __host__
#define __device__
#define __global__
#define __forceinline__ inline __attribute__((always_inline))
#define __inline__ inline
#define __align__(n) __attribute__((aligned(n)))
#define __builtin_align__(n) __align__(n)
#define __device_builtin__
#define __cudart_builtin__
#define CUDARTAPI
#define __location__(a)
#define __no_return__ __attribute__((noreturn))
#define __specialization_static
#define __device_builtin_texture_type__
#define __device_builtin_surface_type__
#define CUDA_CB
