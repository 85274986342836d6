// common.cuh -- the one header of portable primitives every kernels_cu/*.cu includes.
//
// Two compilers see this file:
//   * NVRTC (through CuPy on a GPU, or sharpinf.runtime.nvrtc_check without one);
//   * g++ with -DSHARPINF_EMU -include cuda_emu.h (the CPU emulator), which provides
//     threadIdx & co., __syncthreads, __shfl_*_sync, atomics and the fp16/bf16 types.
// Every hardware primitive has a PTX branch (#ifndef SHARPINF_EMU, inline asm) and an
// emulated branch that follows the PTX fragment layout exactly, so the fragment
// indexing a kernel relies on is exercised on the CPU too.
//
// Conventions: block sizes are multiples of 32; reductions use the full warp mask;
// NVRTC has no <cmath> macros, so use CUDART_* constants, never INFINITY/NAN.
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

// --- grid-wide barrier ----------------------------------------------------------------
// sharpinf_grid_sync(bar): no thread of any block passes until every thread of every block has
// reached it, and every global write before it is visible to every block after it. Only for a
// cooperative launch (Backend.prepare(..., cooperative=True)), whose grid is no larger than the
// blocks that can be resident at once (Backend.resident_blocks): a block waiting here spins
// until the others arrive, so a block that is not resident would hang the grid.
// On a GPU: a generation barrier over bar[0] (arrivals) and bar[1] (generation) in global
// memory, zeroed once before the first launch; each barrier leaves bar[0] back at 0, so the
// buffer serves every later launch and graph replay. Thread 0 of each block arrives for its
// block between two __syncthreads; the last arrival resets the count and bumps the generation
// the others spin on. On the emulator the scheduler's own grid barrier (emu_sched.cpp), a
// macro so that its reports name the caller's line.
#ifdef SHARPINF_EMU
#define sharpinf_grid_sync(bar) ((void)(bar), SHARPINF_EMU_GRID_SYNC())
#else
__device__ __forceinline__ void sharpinf_grid_sync(unsigned* bar) {
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
        volatile unsigned* gen = bar + 1;
        const unsigned seen = *gen;  // cannot move on before this block arrives
        const unsigned blocks = gridDim.x * gridDim.y * gridDim.z;
        __threadfence();  // this block's writes, then its arrival
        if (atomicAdd(bar, 1u) == blocks - 1) {
            atomicExch(bar, 0u);
            __threadfence();
            atomicAdd(bar + 1, 1u);  // release the others
        } else {
            while (*gen == seen) {
            }
        }
        __threadfence();  // the other blocks' writes, before this block reads them
    }
    __syncthreads();
}
#endif

// --- programmatic dependent launch (sm_90 and later) --------------------------------------------
// With SHARPINF_PDL=1 the GPU backend launches each kernel with the programmatic-stream-serialization
// attribute (cuLaunchKernelEx): the driver may start its blocks while the kernel before it in the
// stream is still running, once every block of that one has passed its trigger. What that buys is
// the gap between two kernels -- the launch, the last wave's tail, the first loads' latency -- which
// is most of a small kernel's time in decode (issue 20's launch floor).
// The contract every entry keeps (sharpinf/runtime/pdl_check.py proves it on the PTX of every entry,
// so a kernel that breaks it fails a test rather than racing on a GPU):
//   * sharpinf_pdl_wait() comes before the entry's first global load, store or atomic, and is not
//     under a condition: it returns once every kernel before this one has completed and its writes
//     are visible. Before it only index arithmetic (an if/else of it is fine, a loop is not) and L2
//     prefetches (sharpinf_prefetch_l2: the weights a matvec is about to stream), and no return:
//     the wait covers only the kernel just before, so the chain holds because that one waited for
//     its own -- a grid whose threads all left first could end while the kernel ahead still runs.
//   * sharpinf_pdl_trigger() lets the next kernel's blocks be placed. Every entry triggers at its
//     start: a block of the next kernel then sits at its wait on an SM the running kernel has left
//     free, and starts the moment the data is there.
// SHARPINF_ENTRY_ATTRS puts both at the top of every entry (sharpinf_pdl_enter); an entry written
// out by hand calls sharpinf_pdl_enter() first. A file that prefetches before its wait redefines
// SHARPINF_PDL_AT_ENTRY (below) to trigger only, and calls sharpinf_pdl_wait() itself. Launched
// without the attribute (the default, and every GPU before sm_90) both instructions do nothing; on
// the emulator, which runs one kernel at a time, they compile to nothing.
__device__ __forceinline__ void sharpinf_pdl_trigger() {
#if !defined(SHARPINF_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void sharpinf_pdl_wait() {
#if !defined(SHARPINF_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void sharpinf_pdl_enter() {
    sharpinf_pdl_trigger();
    sharpinf_pdl_wait();
}
// Ask L2 for bytes [p, p + n) of global memory, without waiting (a hint: nothing is read into
// registers, nothing faults). Only the 16-byte-aligned part of the range is asked for (the bulk
// prefetch's rule), so no byte outside it is touched; at most its first 1 GB (the size is 32 bits).
// One instruction for the whole range, predicated off when it is empty: no branch, so it may stand
// before an entry's wait. Compiled in only where the backend launches with PDL (it then compiles
// every file with -DSHARPINF_PDL_PREFETCH=1): without the overlap, a prefetch just before the loads
// would only add requests, and the default build stays what was measured.
#ifndef SHARPINF_PDL_PREFETCH
#define SHARPINF_PDL_PREFETCH 0
#endif
__device__ __forceinline__ void sharpinf_prefetch_l2(const void* p, long long n) {
#if SHARPINF_PDL_PREFETCH && !defined(SHARPINF_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // the global-space address (a generic pointer into global memory may differ from it)
    const long long a = (long long)__cvta_generic_to_global(p), lo = (a + 15) & ~15ll, hi = (a + (n > 0 ? n : 0)) & ~15ll;
    const long long span = hi > lo ? hi - lo : 0;
    const unsigned bytes = (unsigned)(span < (1ll << 30) ? span : (1ll << 30));
    asm volatile(
        "{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %1, 0;\n\t"
        "@p cp.async.bulk.prefetch.L2.global [%0], %1;\n\t}" ::"l"(lo),
        "r"(bytes)
        : "memory");
#else
    (void)p;
    (void)n;
#endif
}

// --- the last of n blocks ----------------------------------------------------------
// sharpinf_last_arrival(ticket, n): true in the block that arrives n-th at *ticket (the same answer
// for every thread of a block), with every arriving block's global writes from before its call
// visible to it -- the split kernels' merge by whichever block finishes last (attention_split.cu,
// attention_flash.cu, mmq_rows.cuh's split-K). The last block sets *ticket back to 0 once it has
// read what it merges, so the ticket serves the next launch and graph replay.
__device__ __forceinline__ bool sharpinf_last_arrival(int* ticket, int n) {
    __shared__ int last;
    __threadfence();  // this block's writes, then its arrival
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) last = atomicAdd(ticket, 1) == n - 1;
    __syncthreads();
    const bool mine = last != 0;
    if (mine) __threadfence();  // the other blocks' writes, before this block reads them
    return mine;
}

// --- functions several entry families share -----------------------------------------------------
// SHARPINF_SHARED_FN: a device function that more than one kernel of a file calls (attention_split.cu's
// split and walk entries): on the emulator one function a template instance, which g++ compiles once
// instead of into every caller (that module's build ~30% faster); on a GPU inlined, as __forceinline__.
// Inlining changes no result: the function's arithmetic is its own either way.
#ifdef SHARPINF_EMU
#define SHARPINF_SHARED_FN __device__ __noinline__
#else
#define SHARPINF_SHARED_FN __device__ __forceinline__
#endif

// --- entry-point selection ----------------------------------------------------------
// A backend may compile a file for only the entry points a model uses (the GPU backend
// does, at ForwardPass construction: compiling every weight type's matmul takes seconds).
// It then defines SHARPINF_SELECT, and SHARPINF_WANT_<p>=1 for each requested entry name and
// each of its '_'-prefixes: attention_f16_d64 -> attention_f16_d64, attention_f16, attention.
// A file wraps groups of entries in #if SHARPINF_WANT(group). Without SHARPINF_SELECT (the
// emulator, the NVRTC compile check) every entry point is compiled.
#ifdef SHARPINF_SELECT
#define SHARPINF_WANT(group) (SHARPINF_WANT_##group + 0)
#else
#define SHARPINF_WANT(group) 1
#endif

// --- entry-point families ------------------------------------------------------------
// SHARPINF_ENTRY(name, (params), body...) defines `extern "C" __global__ void name params { body; }`
// when name is wanted (as SHARPINF_WANT above; a macro cannot hold an #if, so the test is done
// by the preprocessor's pasting: SHARPINF_WANT_<name> defined as 1 selects the definition). The
// families below give one entry per KV dtype x head_dim or per weight type from one line; the
// emulator finds entries in the preprocessed source, so families need no list anywhere else.
#define SHARPINF_CAT(a, b) SHARPINF_CAT_(a, b)
#define SHARPINF_CAT_(a, b) a##b
#define SHARPINF_SECOND(a, b, ...) b
#define SHARPINF_SECOND_(...) SHARPINF_SECOND(__VA_ARGS__)
#define SHARPINF_IS_1 ~, 1
#define SHARPINF_IF_1(...) __VA_ARGS__
#define SHARPINF_IF_0(...)
#ifdef SHARPINF_SELECT
#define SHARPINF_WANTED(name) SHARPINF_SECOND_(SHARPINF_CAT(SHARPINF_IS_, SHARPINF_WANT_##name), 0, ~)
#else
#define SHARPINF_WANTED(name) 1
#endif
#define SHARPINF_ENTRY(name, params, ...) SHARPINF_ENTRY_ATTRS(name, , params, __VA_ARGS__)
// ... with attributes before the name (e.g. __launch_bounds__(128, 1))
#define SHARPINF_ENTRY_ATTRS(name, attrs, params, ...)                                        \
    SHARPINF_CAT(SHARPINF_IF_, SHARPINF_WANTED(name))(extern "C" __global__ void attrs name params { \
        SHARPINF_PDL_AT_ENTRY();                                                                   \
        __VA_ARGS__;                                                                               \
    })
// an entry's first statement (programmatic dependent launch, above): trigger and wait. A file whose
// entries wait in their body, after their prefetches, redefines it as sharpinf_pdl_trigger before
// them (the preprocessor expands it where an entry is written, with the definition in force there).
#define SHARPINF_PDL_AT_ENTRY sharpinf_pdl_enter

// name_<kv>_d<hd> for KV f32/f16/bf16 x head_dim 16..256 (TYPED<HD, T>(call...)) and q8_0 x 32..256
// (Q8<HD>(call...)): the attention kernels' 20 entries; ATTRS(hd) gives each entry's attributes
// (SHARPINF_NO_ATTRS: none).
#define SHARPINF_NO_ATTRS(hd)
#define SHARPINF_KV_HD_ENTRY(name, kv, hd, ATTRS, params, ...) \
    SHARPINF_ENTRY_ATTRS(name##_##kv##_d##hd, ATTRS(hd), params, __VA_ARGS__)
#define SHARPINF_HD_FAMILY(name, kv, T, ATTRS, params, TYPED, ...)                          \
    SHARPINF_KV_HD_ENTRY(name, kv, 16, ATTRS, params, TYPED<16, T>(__VA_ARGS__))            \
    SHARPINF_KV_HD_ENTRY(name, kv, 32, ATTRS, params, TYPED<32, T>(__VA_ARGS__))            \
    SHARPINF_KV_HD_ENTRY(name, kv, 64, ATTRS, params, TYPED<64, T>(__VA_ARGS__))            \
    SHARPINF_KV_HD_ENTRY(name, kv, 128, ATTRS, params, TYPED<128, T>(__VA_ARGS__))          \
    SHARPINF_KV_HD_ENTRY(name, kv, 256, ATTRS, params, TYPED<256, T>(__VA_ARGS__))
#define SHARPINF_KV_HD_ENTRIES(name, ATTRS, params, TYPED, Q8, ...)                          \
    SHARPINF_HD_FAMILY(name, f32, float, ATTRS, params, TYPED, __VA_ARGS__)                 \
    SHARPINF_HD_FAMILY(name, f16, __half, ATTRS, params, TYPED, __VA_ARGS__)                \
    SHARPINF_HD_FAMILY(name, bf16, __nv_bfloat16, ATTRS, params, TYPED, __VA_ARGS__)        \
    SHARPINF_KV_HD_ENTRY(name, q8_0, 32, ATTRS, params, Q8<32>(__VA_ARGS__))                \
    SHARPINF_KV_HD_ENTRY(name, q8_0, 64, ATTRS, params, Q8<64>(__VA_ARGS__))                \
    SHARPINF_KV_HD_ENTRY(name, q8_0, 128, ATTRS, params, Q8<128>(__VA_ARGS__))              \
    SHARPINF_KV_HD_ENTRY(name, q8_0, 256, ATTRS, params, Q8<256>(__VA_ARGS__))

// --- alignment of vector loads --------------------------------------------------------
// On the emulator every vector load checks the alignment the GPU's load instruction needs (a
// misaligned vector load faults on a GPU; a memcpy on the CPU would hide it), so the tests catch it.
#ifdef SHARPINF_EMU
#define SHARPINF_ASSERT_ALIGNED(p, n) \
    assert(((unsigned long long)(p) & ((n) - 1)) == 0 && "load not aligned as the GPU needs")
#endif

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

// --- warp and block reductions ----------------------------------------------------
#ifdef SHARPINF_EMU
// The emulator's exchange helpers below touch only the runtime's exchange buffer and their own
// locals, never shared memory: kept out of the checked builds' instrumentation, which would check
// each of their hundred-odd loads and stores (a call apiece: g++ does not inline a function with
// another sanitizer attribute into instrumented code). They take and return values, not arrays.
#ifdef SHARPINF_EMU_RACECHECK
#define SHARPINF_EMU_UNCHECKED inline __attribute__((noinline, no_sanitize_thread))
#else
#define SHARPINF_EMU_UNCHECKED inline __attribute__((always_inline))
#endif
// The emulator's xor butterfly: one exchange of the 32 values (a shuffle is a rendezvous of the
// warp's 32 fibers, and a butterfly takes five), then the rounds replayed -- lane j combines its own
// value first with lane j^off's, as `v = op(v, __shfl_xor_sync(v, off))` does on the GPU, so each
// lane's result has the bits the five shuffles give. This lane's result needs, at the round of
// `off`, only the `off` lanes that agree with it above bit log2(off) (16 + 8 + 4 + 2 + 1 steps);
// the partners they read were updated in the round before, and are not written in this one.
enum { SHARPINF_EMU_ADD, SHARPINF_EMU_MAX };
template <int OP, typename T>
SHARPINF_EMU_UNCHECKED T sharpinf_emu_butterfly(T v) {
    const unsigned char* all = sharpinf_emu_warp_share(&v, sizeof v);
    const int lane = threadIdx.x & 31;
    T x[32];
    for (int l = 0; l < 32; ++l) __builtin_memcpy(&x[l], all + ::sharpinf_emu::SHARE_STRIDE * l, sizeof(T));
    for (int off = 16; off > 0; off >>= 1)
        for (int j = lane & ~(off - 1), end = j + off; j < end; ++j) {
            if constexpr (OP == SHARPINF_EMU_ADD) x[j] = x[j] + x[j ^ off];
            else x[j] = fmaxf(x[j], x[j ^ off]);
        }
    return x[lane];
}
#endif

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

// --- the FFN's gated activations: out = act(gate) * up ----------------------------------
// One definition for elementwise.cu and the fused gate+up epilogues (dp4a.cuh), so the simple
// and the fused paths give the same bits.
#define ACT_SILU 0       // SwiGLU (llama, qwen): silu(g) = g / (1 + e^-g)
#define ACT_GELU_TANH 1  // GeGLU (gemma3): ggml_gelu's tanh approximation

__device__ __forceinline__ float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * x * (1.0f + 0.044715f * x * x)));
}

__device__ __forceinline__ float gated_act(int act, float g, float u) {
    // silu: for very negative g, e^-g overflows to inf and the result is -0, not NaN.
    return act == ACT_GELU_TANH ? gelu_tanh(g) * u : g / (1.0f + expf(-g)) * u;
}

// --- emulator-only helpers ---------------------------------------------------------
#ifdef SHARPINF_EMU
// Bit-exact IEEE binary16 -> float, independent of what the emulator's headers offer.
__device__ __forceinline__ float sharpinf_emu_half_bits(unsigned short h) {
    const unsigned sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    float v;
    if (exp == 0) v = (float)mant * 0x1p-24f;  // subnormal: exact (a normal float)
    else if (exp == 31) v = mant ? __builtin_nanf("") : __builtin_huge_valf();
    else {  // normal: the same value, rebiased (15 -> 127) and widened (10 -> 23 mantissa bits)
        const unsigned bits = ((exp + 112u) << 23) | (mant << 13);
        __builtin_memcpy(&v, &bits, 4);
    }
    return sign ? -v : v;
}
__device__ __forceinline__ float sharpinf_emu_lo(unsigned r) { return sharpinf_emu_half_bits((unsigned short)(r & 0xffffu)); }
__device__ __forceinline__ float sharpinf_emu_hi(unsigned r) { return sharpinf_emu_half_bits((unsigned short)(r >> 16)); }
#endif

// --- tensor-core MMA -----------------------------------------------------------------
#ifdef SHARPINF_EMU
// An emulated mma.m16n8k* (both shapes share the layout by lane): one exchange of every lane's six
// fragment registers, not 32 shuffles; then A rows g, g+8 (g = lane>>2) come from lanes
// (lane & ~3) + j -- ra[j] = that lane's a[0..3] -- and B columns 2t, 2t+1 from lanes (2t+cs)*4 + j
// -- rb[cs][j] = that lane's b[0..1] (j = 0..3). Fragments and accumulators pass by value: an array
// passed by reference would be addressable in the kernel, and every later read of it checked.
template <typename Acc> struct SharpinfEmuD4 { Acc v[4]; };
template <bool F16, typename Acc>
SHARPINF_EMU_UNCHECKED SharpinfEmuD4<Acc> sharpinf_emu_mma(unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                                          unsigned b0, unsigned b1, Acc c0, Acc c1, Acc c2, Acc c3) {
    const int lane = threadIdx.x & 31, t = lane & 3;
    const unsigned mine[6] = {a0, a1, a2, a3, b0, b1};
    const unsigned char* all = sharpinf_emu_warp_share(mine, sizeof mine);
    unsigned ra[4][4], rb[2][4][2];
    for (int j = 0; j < 4; ++j) __builtin_memcpy(ra[j], all + ::sharpinf_emu::SHARE_STRIDE * ((lane & ~3) + j), 16);
    for (int cs = 0; cs < 2; ++cs)
        for (int j = 0; j < 4; ++j) __builtin_memcpy(rb[cs][j], all + ::sharpinf_emu::SHARE_STRIDE * ((2 * t + cs) * 4 + j) + 16, 8);
    const Acc c[4] = {c0, c1, c2, c3};
    SharpinfEmuD4<Acc> d;
    for (int rs = 0; rs < 2; ++rs)        // row g + 8*rs
        for (int cs = 0; cs < 2; ++cs) {  // col 2t + cs
            Acc acc = c[rs * 2 + cs];
            if constexpr (F16) {
                for (int k = 0; k < 16; ++k) {  // k = 8*kb + 2*j + half: register kb of lane j
                    const int j = (k & 7) >> 1, kb = k >> 3;
                    const unsigned ar = ra[j][rs + 2 * kb], br = rb[cs][j][kb];
                    const float av = (k & 1) ? sharpinf_emu_hi(ar) : sharpinf_emu_lo(ar);
                    const float bv = (k & 1) ? sharpinf_emu_hi(br) : sharpinf_emu_lo(br);
                    acc += av * bv;
                }
            } else {
                for (int k = 0; k < 32; ++k) {  // k = 16*kh + 4*j + e: register kh of lane j, byte e
                    const int kh = k >> 4, j = (k >> 2) & 3, e = k & 3;
                    const signed char av = (signed char)(ra[j][rs + 2 * kh] >> (8 * e));
                    const signed char bv = (signed char)(rb[cs][j][kh] >> (8 * e));
                    acc += (int)av * (int)bv;
                }
            }
            d.v[rs * 2 + cs] = acc;
        }
    return d;
}
#endif

// D(16x8,f32) = A(16x16,f16,row) * B(16x8,f16,col) + C, one warp, all 32 lanes.
// Fragment layout (PTX ISA, mma.m16n8k16 .f16): g = lane>>2, t = lane%4; a register
// holds two halves, the lower-indexed element in the low 16 bits.
//   a[0] = A[g][2t..2t+1]    a[1] = A[g+8][2t..2t+1]
//   a[2] = A[g][2t+8..2t+9]  a[3] = A[g+8][2t+8..2t+9]
//   b[0] = B[2t..2t+1][g]    b[1] = B[2t+8..2t+9][g]
//   c/d[0..1] = C[g][2t..2t+1]   c/d[2..3] = C[g+8][2t..2t+1]
// d may alias c.
__device__ __forceinline__ void mma_m16n8k16_f16_f32(float (&d)[4], const unsigned (&a)[4],
                                                     const unsigned (&b)[2], const float (&c)[4]) {
#ifndef SHARPINF_EMU
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
          "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#else
    const SharpinfEmuD4<float> r = sharpinf_emu_mma<true>(a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], c[2], c[3]);
    for (int i = 0; i < 4; ++i) d[i] = r.v[i];
#endif
}

// D(16x8,s32) = A(16x32,s8,row) * B(32x8,s8,col) + C, one warp: the int8 tensor-core product,
// exact (int32 accumulation). Fragment layout (PTX ISA, mma.m16n8k32 .s8): g = lane>>2,
// t = lane%4; a register holds four int8, the lower-indexed element in the low byte.
//   a[0] = A[g][4t..4t+3]      a[1] = A[g+8][4t..4t+3]
//   a[2] = A[g][4t+16..4t+19]  a[3] = A[g+8][4t+16..4t+19]
//   b[0] = B[4t..4t+3][g]      b[1] = B[4t+16..4t+19][g]
//   c/d[0..1] = C[g][2t..2t+1]   c/d[2..3] = C[g+8][2t..2t+1]
// (tests/test_ptx_layouts.py checks this against the ISA's tables, written there as data.)
__device__ __forceinline__ void mma_m16n8k32_s8_s32(int (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                                    const int (&c)[4]) {
#ifndef SHARPINF_EMU
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
          "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
#else
    const SharpinfEmuD4<int> r = sharpinf_emu_mma<false>(a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], c[2], c[3]);
    for (int i = 0; i < 4; ++i) d[i] = r.v[i];
#endif
}

// --- ldmatrix ---------------------------------------------------------------------------
// ldmatrix.sync.aligned.m8n8.x4.shared.b16: four 8x8 b16 matrices from shared memory.
// Lane l supplies the address of row (l%8) of matrix (l/8) (16 contiguous bytes, 16-byte
// aligned). Result: r[i] of lane l = matrix i, row l>>2, elements 2*(l%4) and 2*(l%4)+1.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* smem_row) {
#ifndef SHARPINF_EMU
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
#else
    const int lane = threadIdx.x & 31;
    const unsigned char* all = sharpinf_emu_warp_share(&smem_row, sizeof smem_row);  // every lane's row address
    for (int i = 0; i < 4; ++i) {
        const int src = i * 8 + (lane >> 2);  // the lane that holds this row's address
        const unsigned char* row;
        __builtin_memcpy(&row, all + ::sharpinf_emu::SHARE_STRIDE * src, sizeof row);
        unsigned v;
        __builtin_memcpy(&v, row + 4 * (lane & 3), 4);
        r[i] = v;
    }
#endif
}

// --- cp.async -------------------------------------------------------------------------
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
