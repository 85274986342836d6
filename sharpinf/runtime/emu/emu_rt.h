/* The emulator runtime's interface: what the inline CUDA stand-ins in
   cuda_emu.h and the entry-point glue in emu_entry.h call into emu_sched.cpp.
   The runtime is one shared library (libsharpinf-emu-rt-*.so) that every
   kernel module links against, so all modules share one TLS block and one
   pool of fiber stacks per OS thread. */
#pragma once
#include <stdint.h>
#include <stddef.h>
#include <vector_types.h>

#define SHARPINF_EMU_API __attribute__((visibility("default")))

namespace sharpinf_emu {

struct EThread;
struct Block;

// Per OS thread: the running CUDA thread's coordinates. Plain __thread POD,
// so a kernel's threadIdx.x is one TLS load (no C++ TLS wrapper call).
struct Tls {
    uint3 threadIdx, blockIdx, blockDim, gridDim;
    EThread* cur;
    Block* blk;
    unsigned char* dyn_smem;
};
extern __thread Tls tls SHARPINF_EMU_API;

// Warp operation kinds carried through the per-warp exchange.
enum WarpOp : int { W_SYNC, W_IDX, W_UP, W_DOWN, W_XOR, W_BALLOT, W_ALL, W_ANY, W_SHARE };
// W_SHARE: every lane posts up to SHARE_STRIDE bytes (val: their address, arg: how many) and gets
// back the warp's 32 x SHARE_STRIDE bytes, lane-major (res: their address, valid until the lane's
// next warp operation). One exchange where common.cuh's tensor-core and reduction stand-ins would
// otherwise take 5-32 shuffles, each a rendezvous of the warp's 32 fibers.
enum { SHARE_STRIDE = 32 };

SHARPINF_EMU_API int sync_block(const char* file, int line, int pred);  // returns count of pred
SHARPINF_EMU_API uint64_t warp_op(const char* file, int line, int op, unsigned mask,
                                     uint64_t val, int arg, int width);
SHARPINF_EMU_API unsigned active_mask();
SHARPINF_EMU_API void grid_sync(const char* file, int line);  // every thread of every block (cooperative launch)
SHARPINF_EMU_API void trap(const char* file, int line);
SHARPINF_EMU_API void assert_fail(const char* expr, const char* file, int line);

// Shared arrays (emu_racecheck.cpp): the statement the build adds after each static __shared__
// declaration registers the array (poisoned once per block; checked under racecheck/initcheck);
// a use of dynamic shared memory names its `extern __shared__` array for reports.
SHARPINF_EMU_API void smem_static(void* p, size_t bytes, size_t elem, const char* name, const char* file, int line);
SHARPINF_EMU_API void smem_dyn_name(const char* name);

// Launch plumbing used by emu_entry.h.
struct LaunchCfg {
    unsigned grid[3], block[3];
    size_t shared;
    int order;    // 0 forward, 1 reverse, 2 random
    int strict;
    int workers;
    uint64_t seed;
    const char* kernel;
    int memcheck;            // 0 off, 1 guard bytes, 2 strict: a fault ends the launch (memcheck.py)
    const uint64_t* guards;  // (address, length) pairs of guard bytes, checked after the grid
    int nguards;
    uint64_t* fault;         // strict: the fault record (see Fault in emu_sched.cpp), or null
    int check;               // shared memory checks, bit 0 racecheck, bit 1 initcheck (emu_racecheck.cpp)
    int coop;                // cooperative: every block resident at once, grid_sync allowed (emu_sched.cpp)
};
typedef void (*ThreadFn)(void* ctx);
// 0 on success; else bit 0: the launch failed and err says why (NUL-terminated, truncated
// to errlen); bit 1: a guard byte of cfg.guards was overwritten.
SHARPINF_EMU_API int run_grid(const LaunchCfg& cfg, ThreadFn fn, void* ctx, char* err, size_t errlen);

}  // namespace sharpinf_emu
