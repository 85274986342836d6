// reduce.cu (test-only) -- warp and block reductions, checking every thread's copy.
//   warp_reduce(x, sum, max): x float[nwarps*32]; sum, max float[nwarps*32]: each lane
//     writes the result it received. Launch: any grid, block multiple of 32.
//   warp_sum_ints(x, out): the same for warp_sum_int.
//   block_reduce(x, sum, max, n): x float[rows][n]; sum, max float[rows][blockDim]: each
//     thread writes what it received. Two back-to-back calls share one smem32 (reuse check).
//     Launch: grid = rows, block multiple of 32 up to 1024.
#include "common.cuh"

extern "C" __global__ void warp_reduce(const float* x, float* sum, float* mx) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const float v = x[i];
    sum[i] = warp_reduce_sum(v);
    mx[i] = warp_reduce_max(v);
}

extern "C" __global__ void block_reduce(const float* x, float* sum, float* mx, int n) {
    __shared__ float smem32[32];
    const long long row = blockIdx.x;
    float s = 0.0f, m = -CUDART_INF_F;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        s += x[row * n + i];
        m = fmaxf(m, x[row * n + i]);
    }
    s = block_reduce_sum(s, smem32);
    m = block_reduce_max(m, smem32);
    sum[row * blockDim.x + threadIdx.x] = s;
    mx[row * blockDim.x + threadIdx.x] = m;
}

// warp_sum_ints(x, out): x int[nwarps*32]; out int[nwarps*32], each lane's warp_sum_int.
extern "C" __global__ void warp_sum_ints(const int* x, int* out) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = warp_sum_int(x[i]);
}
