// cp_async.cuh -- asynchronous global -> shared copies (cp.async: 16 and 4 bytes, commit, wait all,
// wait for all but N groups). The emulator copies synchronously, which is a valid (fully waited)
// schedule.
#pragma once
#include "emu_shims.cuh"

// 16-byte global -> shared copy that bypasses L1 (cp.async.cg). Both addresses 16-byte
// aligned. Data is visible only after cp_async_wait_all() and a __syncthreads().
// The emulator copies synchronously, which is a valid (fully waited) schedule.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src) {
#ifndef SHARPINF_EMU
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem_src) : "memory");
#else
    SHARPINF_ASSERT_ALIGNED(smem_dst, 16);  // the GPU faults on a misaligned cp.async
    SHARPINF_ASSERT_ALIGNED(gmem_src, 16);
    __builtin_memcpy(smem_dst, gmem_src, 16);
#endif
}

// 4-byte global -> shared copy (cp.async.ca: the only size a lone float or int can use). Both
// addresses 4-byte aligned; visible as cp_async_16's.
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src) {
#ifndef SHARPINF_EMU
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem_src) : "memory");
#else
    SHARPINF_ASSERT_ALIGNED(smem_dst, 4);
    SHARPINF_ASSERT_ALIGNED(gmem_src, 4);
    __builtin_memcpy(smem_dst, gmem_src, 4);
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#ifndef SHARPINF_EMU
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void cp_async_wait_all() {
#ifndef SHARPINF_EMU
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// Wait until at most N of this thread's committed groups are still in flight (a multi-stage
// ring: the oldest stage is in, the N newer ones may still be loading).
template <int N> __device__ __forceinline__ void cp_async_wait_group() {
#ifndef SHARPINF_EMU
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
