/* cuda_emu.h: what a CUDA C kernel source sees when g++ builds it for the CPU
   emulator (force-included: -include cuda_emu.h -DSHARPINF_EMU).

   CUDA qualifiers become no-ops, __shared__ becomes thread_local (a block's
   fibers share one OS thread; blocks on other workers get their own copy),
   and every synchronising intrinsic passes __FILE__/__LINE__ to the scheduler
   so deadlocks and strict-mode errors can name the source line. The real
   cuda_fp16.h / cuda_bf16.h supply half types and conversions; device-only
   math gets float-based stand-ins in cuda_emu_math.h. */
#pragma once
#ifndef SHARPINF_EMU
#define SHARPINF_EMU 1
#endif

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <cmath>
// CUDA's own headers first, so our macros below cannot disturb them.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "emu_rt.h"

// ---- qualifiers -------------------------------------------------------------
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __noinline__
#undef __align__
#ifdef SHARPINF_EMU_SCAN  // build.py's scan for entry points: `extern "C" __global__` stays visible
#define __global__ __sharpinf_global__
#else
#define __global__
#endif
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __constant__
#define __managed__
// Block-scope thread_local is implicitly static: one copy per OS thread,
// i.e. per block in flight. `extern __shared__` (dynamic) is rewritten by the
// build step into a pointer to the per-launch buffer (see emu/build.py).
#define __shared__ thread_local
// The build adds SHARPINF_EMU_SMEM(name) after each static __shared__ declaration (source.py). In
// a build for the shared-memory checks the first thread of a block to pass it poisons the array and
// shadows it (emu_racecheck.cpp); elsewhere it is nothing (a static array keeps the last block's
// values, as a GPU's shared memory may: initcheck is what names a kernel that reads them).
#ifdef SHARPINF_EMU_RACECHECK
#include <type_traits>
#define SHARPINF_EMU_SMEM(x)                                                                      \
    ::sharpinf_emu::smem_static((void*)&(x), sizeof(x), sizeof(::std::remove_all_extents_t<decltype(x)>), #x, \
                                __FILE__, __LINE__)
#else
#define SHARPINF_EMU_SMEM(x) ((void)0)
#endif

// ---- built-in variables -------------------------------------------------------
#define threadIdx (::sharpinf_emu::tls.threadIdx)
#define blockIdx (::sharpinf_emu::tls.blockIdx)
#define blockDim (::sharpinf_emu::tls.blockDim)
#define gridDim (::sharpinf_emu::tls.gridDim)
static constexpr int warpSize = 32;

namespace sharpinf_emu {
// `extern __shared__ T name[]` becomes a pointer to the launch's buffer (build.py); under the
// shared-memory checks each use also names the array for reports.
inline unsigned char* dyn_smem(const char* name = nullptr) {
#ifdef SHARPINF_EMU_RACECHECK
    if (name) smem_dyn_name(name);
#else
    (void)name;
#endif
    return tls.dyn_smem;
}

template <class T>
inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "warp shuffle of a type wider than 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof(T));
    return u;
}
template <class T>
inline T from_bits(uint64_t u) {
    T v;
    memcpy(&v, &u, sizeof(T));
    return v;
}
template <class T>
inline T shfl(const char* f, int l, int op, unsigned mask, T v, int arg, int width) {
    return from_bits<T>(warp_op(f, l, op, mask, to_bits(v), arg, width));
}
}  // namespace sharpinf_emu

// ---- synchronisation ------------------------------------------------------------
#define __syncthreads() ((void)::sharpinf_emu::sync_block(__FILE__, __LINE__, 0))
#define __syncthreads_count(p) (::sharpinf_emu::sync_block(__FILE__, __LINE__, (p)))
#define __syncthreads_or(p) (::sharpinf_emu::sync_block(__FILE__, __LINE__, (p)) != 0)
#define __syncthreads_and(p) (::sharpinf_emu::sync_block(__FILE__, __LINE__, !(p)) == 0)
#define __syncwarp(...) ((void)::sharpinf_emu::warp_op(__FILE__, __LINE__, ::sharpinf_emu::W_SYNC, \
                          ::sharpinf_emu::syncwarp_mask(__VA_ARGS__), 0, 0, 32))
namespace sharpinf_emu {
inline unsigned syncwarp_mask(unsigned m = 0xffffffffu) { return m; }
}
#define __shfl_sync(mask, v, src, ...) \
    ::sharpinf_emu::shfl(__FILE__, __LINE__, ::sharpinf_emu::W_IDX, (mask), (v), (src), ::sharpinf_emu::width_arg(__VA_ARGS__))
#define __shfl_up_sync(mask, v, d, ...) \
    ::sharpinf_emu::shfl(__FILE__, __LINE__, ::sharpinf_emu::W_UP, (mask), (v), (int)(d), ::sharpinf_emu::width_arg(__VA_ARGS__))
#define __shfl_down_sync(mask, v, d, ...) \
    ::sharpinf_emu::shfl(__FILE__, __LINE__, ::sharpinf_emu::W_DOWN, (mask), (v), (int)(d), ::sharpinf_emu::width_arg(__VA_ARGS__))
#define __shfl_xor_sync(mask, v, lm, ...) \
    ::sharpinf_emu::shfl(__FILE__, __LINE__, ::sharpinf_emu::W_XOR, (mask), (v), (int)(lm), ::sharpinf_emu::width_arg(__VA_ARGS__))
#define __ballot_sync(mask, p) \
    ((unsigned)::sharpinf_emu::warp_op(__FILE__, __LINE__, ::sharpinf_emu::W_BALLOT, (mask), (p) != 0, 0, 32))
#define __all_sync(mask, p) \
    ((int)::sharpinf_emu::warp_op(__FILE__, __LINE__, ::sharpinf_emu::W_ALL, (mask), (p) != 0, 0, 32))
#define __any_sync(mask, p) \
    ((int)::sharpinf_emu::warp_op(__FILE__, __LINE__, ::sharpinf_emu::W_ANY, (mask), (p) != 0, 0, 32))
#define __activemask() (::sharpinf_emu::active_mask())
// Every lane's `bytes` bytes (1..SHARE_STRIDE = 32) in one exchange: the warp's 32 x SHARE_STRIDE
// bytes, lane j's at [SHARE_STRIDE * j], readable until this lane's next warp operation (emu_rt.h, W_SHARE). All 32 lanes
// take part, as in the full-mask shuffles it stands for.
#define sharpinf_emu_warp_share(mine, bytes)                                                         \
    ((const unsigned char*)(uintptr_t)::sharpinf_emu::warp_op(__FILE__, __LINE__, ::sharpinf_emu::W_SHARE, \
                                                              0xffffffffu, (uint64_t)(uintptr_t)(mine), (bytes), 32))
// The grid barrier of common.cuh's sharpinf_grid_sync: the scheduler's own (emu_sched.cpp), so
// a cooperative launch's blocks take turns between barriers and a missing block is a deadlock.
#define SHARPINF_EMU_GRID_SYNC() ::sharpinf_emu::grid_sync(__FILE__, __LINE__)
#define __trap() ::sharpinf_emu::trap(__FILE__, __LINE__)
namespace sharpinf_emu {
inline int width_arg(int w = 32) { return w; }
}
// A failed device assert ends the launch with a BackendError naming the
// expression and line, instead of abort()ing the Python process.
#undef assert
#ifdef NDEBUG
#define assert(e) ((void)0)
#else
#define assert(e) ((e) ? (void)0 : ::sharpinf_emu::assert_fail(#e, __FILE__, __LINE__))
#endif

// Memory fences order nothing extra on one OS thread; across pool workers
// they become real fences.
#ifdef SHARPINF_EMU_RACECHECK
#define SHARPINF_EMU_FENCE inline __attribute__((no_sanitize_thread))  // a real fence, not an access
#else
#define SHARPINF_EMU_FENCE inline
#endif
SHARPINF_EMU_FENCE void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
SHARPINF_EMU_FENCE void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
SHARPINF_EMU_FENCE void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

#include "cuda_emu_atomic.h"
#include "cuda_emu_math.h"

#ifdef SHARPINF_EMU_RACECHECK
// The shared-memory checks (emu_racecheck.cpp) see a store through g++'s ThreadSanitizer
// instrumentation, which skips the store of a call that writes its result straight into memory
// (`smem[i] = __float2half_rn(x)` when the callee is not inlined). Passing such results through
// an inlined identity makes the store an ordinary, instrumented one; the values are unchanged.
namespace sharpinf_emu {
template <class T>
__attribute__((always_inline)) inline T rc_value(T v) { return v; }
// sincosf writes through its pointers inside the C library: write them here instead.
__attribute__((always_inline)) inline void rc_sincosf(float x, float* s, float* c) {
    float a, b;
    ::sincosf(x, &a, &b);
    *s = a;
    *c = b;
}
}  // namespace sharpinf_emu
#define SHARPINF_EMU_RC_VALUE(f) (::sharpinf_emu::rc_value(f))
// g++ instruments a memcpy it turns into one access of 1, 2, 4, 8 or 16 bytes, and none longer:
// a 32-byte copy into shared memory was invisible (a later read reported as uninitialised, a
// race through it missed). Every kernel-side copy reports both ranges itself (the hooks are g++
// runtime's, declared under -fsanitize=thread only: build.py's entry-point scan preprocesses without it).
#ifdef __SANITIZE_THREAD__
extern "C" void __tsan_read_range(void*, long);  // the builtins' own signatures (emu_racecheck.cpp)
extern "C" void __tsan_write_range(void*, long);
namespace sharpinf_emu {
__attribute__((always_inline)) inline void* rc_memcpy(void* d, const void* s, size_t n) {
    __tsan_read_range(const_cast<void*>(s), (long)n);
    __tsan_write_range(d, (long)n);
    return __builtin_memcpy(d, s, n);
}
}  // namespace sharpinf_emu
#define __builtin_memcpy(d, s, n) ::sharpinf_emu::rc_memcpy((d), (s), (n))
#define memcpy(d, s, n) ::sharpinf_emu::rc_memcpy((d), (s), (n))
#endif
#define __float2half(...) SHARPINF_EMU_RC_VALUE(__float2half(__VA_ARGS__))
#define __float2half_rn(...) SHARPINF_EMU_RC_VALUE(__float2half_rn(__VA_ARGS__))
#define __float2bfloat16(...) SHARPINF_EMU_RC_VALUE(__float2bfloat16(__VA_ARGS__))
#define __float2bfloat16_rn(...) SHARPINF_EMU_RC_VALUE(__float2bfloat16_rn(__VA_ARGS__))
#define __floats2half2_rn(...) SHARPINF_EMU_RC_VALUE(__floats2half2_rn(__VA_ARGS__))
#define __floats2bfloat162_rn(...) SHARPINF_EMU_RC_VALUE(__floats2bfloat162_rn(__VA_ARGS__))
#define __float22half2_rn(...) SHARPINF_EMU_RC_VALUE(__float22half2_rn(__VA_ARGS__))
#define __halves2half2(...) SHARPINF_EMU_RC_VALUE(__halves2half2(__VA_ARGS__))
#define expf(...) SHARPINF_EMU_RC_VALUE(::expf(__VA_ARGS__))
#define exp2f(...) SHARPINF_EMU_RC_VALUE(::exp2f(__VA_ARGS__))
#define logf(...) SHARPINF_EMU_RC_VALUE(::logf(__VA_ARGS__))
#define log2f(...) SHARPINF_EMU_RC_VALUE(::log2f(__VA_ARGS__))
#define sqrtf(...) SHARPINF_EMU_RC_VALUE(::sqrtf(__VA_ARGS__))
#define tanhf(...) SHARPINF_EMU_RC_VALUE(::tanhf(__VA_ARGS__))
#define sinf(...) SHARPINF_EMU_RC_VALUE(::sinf(__VA_ARGS__))
#define cosf(...) SHARPINF_EMU_RC_VALUE(::cosf(__VA_ARGS__))
#define powf(...) SHARPINF_EMU_RC_VALUE(::powf(__VA_ARGS__))
#define roundf(...) SHARPINF_EMU_RC_VALUE(::roundf(__VA_ARGS__))
#define ceilf(...) SHARPINF_EMU_RC_VALUE(::ceilf(__VA_ARGS__))
#define floorf(...) SHARPINF_EMU_RC_VALUE(::floorf(__VA_ARGS__))
#define sincosf(x, s, c) ::sharpinf_emu::rc_sincosf((x), (s), (c))
#endif

