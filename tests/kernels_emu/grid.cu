// Grid-barrier kernels for tests/test_emu_grid_sync.py (cooperative launches).
#include "common.cuh"

// A ring of blocks passes values round by round: in round r each block publishes its value
// (one per thread) in buf[r & 1], and after the grid barrier takes its right neighbour's.
// After `rounds` rounds block b holds block (b + rounds) % grid's start value. Each block keeps
// its value in static shared memory across the barrier, so blocks sharing one copy would show.
// barrier = 0 drops the barrier (the planted bug: a read of a slot not yet written).
extern "C" __global__ void grid_ring(int* buf, int* out, unsigned* bar, int rounds, int barrier) {
    __shared__ int mine[64];
    const int nb = gridDim.x, b = blockIdx.x, t = threadIdx.x, n = blockDim.x;
    mine[t] = b * 1000 + t;
    for (int r = 0; r < rounds; ++r) {
        int* slot = buf + (r & 1) * nb * n;
        slot[b * n + t] = mine[t];
        if (barrier) sharpinf_grid_sync(bar);
        mine[t] = slot[((b + 1) % nb) * n + t];
    }
    out[b * n + t] = mine[t];
}

// Planted deadlock: block `skip` returns before the barrier the others wait at.
extern "C" __global__ void grid_skip(int* out, unsigned* bar, int skip) {
    if ((int)blockIdx.x == skip) return;
    sharpinf_grid_sync(bar);  // MARK:grid_skip
    out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

// Planted bug: thread 0 waits at __syncthreads while the block's other threads wait at the
// grid barrier (on a GPU they would pair with the barrier's own __syncthreads).
extern "C" __global__ void grid_mixed(unsigned* bar) {
    if (threadIdx.x == 0) {
        __syncthreads();
    } else {
        sharpinf_grid_sync(bar);
    }
}

// Planted fault: block `bad` traps between two barriers while the others wait at the second.
extern "C" __global__ void grid_trap(unsigned* bar, int bad) {
    sharpinf_grid_sync(bar);
    if ((int)blockIdx.x == bad && threadIdx.x == 3) __trap();  // MARK:grid_trap
    sharpinf_grid_sync(bar);
}

// Planted race for racecheck in a cooperative launch: after the grid barrier (a block barrier
// too) block 1 rewrites its shared slots while its threads read their neighbours'.
extern "C" __global__ void grid_race(int* out, unsigned* bar) {
    __shared__ int s[64];
    const int t = threadIdx.x;
    s[t] = t;
    sharpinf_grid_sync(bar);
    if (blockIdx.x == 1) s[t] = 7;  // MARK:grid_race_write
    out[blockIdx.x * 64 + t] = s[(t + 1) % 64];  // MARK:grid_race_read
}
