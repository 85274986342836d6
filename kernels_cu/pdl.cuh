// pdl.cuh -- programmatic dependent launch (sm_90 and later): sharpinf_pdl_trigger, sharpinf_pdl_wait,
// sharpinf_pdl_enter (both, at an entry's top: entry.cuh's SHARPINF_PDL_AT_ENTRY), and
// sharpinf_prefetch_l2 (the weights a matvec asks of L2 before its wait).
#pragma once
#include "types.cuh"

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
// SHARPINF_PDL_AT_ENTRY (entry.cuh) to trigger only, and calls sharpinf_pdl_wait() itself. Launched
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
// would only add requests, and the default build is left as it is.
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
