// barriers.cuh -- the cross-block synchronisation kernels use: the grid-wide barrier of a cooperative
// launch (sharpinf_grid_sync) and the last-of-n-blocks ticket of the split kernels' merges
// (sharpinf_last_arrival).
#pragma once
#include "types.cuh"

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
