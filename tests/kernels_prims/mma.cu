// mma.cu (test-only) -- one warp multiplies 16x16 by 16x8 with mma_m16n8k16_f16_f32.
//   mma_direct(A, Bt, C, D): A __half[16][16] row-major, Bt __half[8][16] (B transposed,
//     i.e. B column-major), C, D float[16][8]. D = A @ B + C. Fragments loaded from
//     global memory per the documented layout.
//   mma_ldmatrix(A, Bt, C, D): same, but A goes through shared memory and ldmatrix_x4.
// Launch: grid 1, block 32.
#include "common.cuh"

__device__ __forceinline__ unsigned load2(const __half* p) { return *reinterpret_cast<const unsigned*>(p); }

__device__ __forceinline__ void load_b_c(const __half* Bt, const float* C, unsigned (&b)[2], float (&c)[4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    b[0] = load2(Bt + g * 16 + 2 * t);
    b[1] = load2(Bt + g * 16 + 2 * t + 8);
    c[0] = C[g * 8 + 2 * t];
    c[1] = C[g * 8 + 2 * t + 1];
    c[2] = C[(g + 8) * 8 + 2 * t];
    c[3] = C[(g + 8) * 8 + 2 * t + 1];
}

__device__ __forceinline__ void store_d(float* D, const float (&d)[4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    D[g * 8 + 2 * t] = d[0];
    D[g * 8 + 2 * t + 1] = d[1];
    D[(g + 8) * 8 + 2 * t] = d[2];
    D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

extern "C" __global__ void mma_direct(const __half* A, const __half* Bt, const float* C, float* D) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    unsigned a[4], b[2];
    float c[4], d[4];
    a[0] = load2(A + g * 16 + 2 * t);
    a[1] = load2(A + (g + 8) * 16 + 2 * t);
    a[2] = load2(A + g * 16 + 2 * t + 8);
    a[3] = load2(A + (g + 8) * 16 + 2 * t + 8);
    load_b_c(Bt, C, b, c);
    mma_m16n8k16_f16_f32(d, a, b, c);
    store_d(D, d);
}

extern "C" __global__ void mma_ldmatrix(const __half* A, const __half* Bt, const float* C, float* D) {
    __shared__ __align__(16) __half sA[16 * 16];
    const int lane = threadIdx.x & 31;
    for (int i = lane; i < 256; i += 32) sA[i] = A[i];
    __syncwarp();
    // Matrices 0..3 = A[0:8,0:8], A[8:16,0:8], A[0:8,8:16], A[8:16,8:16]: exactly a[0..3].
    const int row = (lane & 7) + 8 * ((lane >> 3) & 1), col = 8 * (lane >> 4);
    unsigned a[4], b[2];
    float c[4], d[4];
    ldmatrix_x4(a, sA + row * 16 + col);
    load_b_c(Bt, C, b, c);
    mma_m16n8k16_f16_f32(d, a, b, c);
    store_d(D, d);
}
