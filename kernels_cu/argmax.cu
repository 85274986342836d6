// argmax.cu -- index of the largest element of each row (greedy sampling over a vocabulary).
//   argmax_<t>(x, out, n): x is [rows, n] row-major of type <t> (f32 or f16); out is int32[rows].
//   Ties go to the LOWEST index. NaN follows NumPy: a NaN counts as larger than any number,
//   so a row containing NaN returns the index of its first NaN. n <= 0 writes -1.
// Launch: grid = rows (one block per row), block = a multiple of 32 up to 1024 (256 suggested).
#include "common.cuh"

// Is (va, ia) a better candidate than (vb, ib)? A total order, so the reduction order
// (threads, warps) cannot change the answer.
__device__ __forceinline__ bool argmax_better(float va, int ia, float vb, int ib) {
    const bool na = va != va, nb = vb != vb;
    if (na != nb) return na;
    if (!na && va != vb) return va > vb;
    return ia < ib;
}

template <typename T>
__device__ __forceinline__ void argmax_row(const T* x, int* out, int n) {
    __shared__ float sval[32];
    __shared__ int sidx[32];
    const long long row = blockIdx.x;
    x += row * n;
    // Start from (-inf, n): any real element, even -inf itself, beats it on the index.
    float bv = -CUDART_INF_F;
    int bi = n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = to_float(x[i]);
        if (argmax_better(v, i, bv, bi)) { bv = v; bi = i; }
    }
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(SHARPINF_FULL_MASK, bv, off);
        const int oi = __shfl_xor_sync(SHARPINF_FULL_MASK, bi, off);
        if (argmax_better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (lane == 0) { sval[warp] = bv; sidx[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        bv = lane < nwarps ? sval[lane] : -CUDART_INF_F;
        bi = lane < nwarps ? sidx[lane] : n;
        for (int off = 16; off > 0; off >>= 1) {
            const float ov = __shfl_xor_sync(SHARPINF_FULL_MASK, bv, off);
            const int oi = __shfl_xor_sync(SHARPINF_FULL_MASK, bi, off);
            if (argmax_better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
        }
        if (lane == 0) out[row] = n > 0 ? bi : -1;
    }
}

extern "C" __global__ void argmax_f32(const float* x, int* out, int n) { argmax_row<float>(x, out, n); }
extern "C" __global__ void argmax_f16(const __half* x, int* out, int n) { argmax_row<__half>(x, out, n); }
