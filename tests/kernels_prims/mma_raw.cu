// mma_raw.cu (test-only) -- the tensor-core primitives on raw per-lane registers: lane l reads its
// A, B and C registers from row l of the inputs and writes its D registers to row l of the output,
// so the test alone decides which matrix element sits in which register (from the PTX ISA's
// tables, tests/ptx_layouts.py) and nothing here knows a layout.
//   mma_f16_raw(a unsigned[32][4], b unsigned[32][2], c float[32][4], d float[32][4])
//   mma_s8_raw (a unsigned[32][4], b unsigned[32][2], c int[32][4],   d int[32][4])
//   ldmatrix_raw(src unsigned short[64][8] in shared memory, rows int[32], out unsigned[32][4]):
//     lane l passes the address of src row rows[l]
// Launch: grid 1, block 32.
#include "common.cuh"

extern "C" __global__ void mma_f16_raw(const unsigned* A, const unsigned* B, const float* C, float* D) {
    const int l = threadIdx.x & 31;
    const unsigned a[4] = {A[l * 4], A[l * 4 + 1], A[l * 4 + 2], A[l * 4 + 3]};
    const unsigned b[2] = {B[l * 2], B[l * 2 + 1]};
    const float c[4] = {C[l * 4], C[l * 4 + 1], C[l * 4 + 2], C[l * 4 + 3]};
    float d[4];
    mma_m16n8k16_f16_f32(d, a, b, c);
    for (int i = 0; i < 4; ++i) D[l * 4 + i] = d[i];
}

extern "C" __global__ void mma_s8_raw(const unsigned* A, const unsigned* B, const int* C, int* D) {
    const int l = threadIdx.x & 31;
    const unsigned a[4] = {A[l * 4], A[l * 4 + 1], A[l * 4 + 2], A[l * 4 + 3]};
    const unsigned b[2] = {B[l * 2], B[l * 2 + 1]};
    const int c[4] = {C[l * 4], C[l * 4 + 1], C[l * 4 + 2], C[l * 4 + 3]};
    int d[4];
    mma_m16n8k32_s8_s32(d, a, b, c);
    for (int i = 0; i < 4; ++i) D[l * 4 + i] = d[i];
}

extern "C" __global__ void ldmatrix_raw(const unsigned short* src, const int* rows, unsigned* out) {
    __shared__ __align__(16) unsigned short s[64 * 8];
    const int l = threadIdx.x & 31;
    for (int i = l; i < 64 * 8; i += 32) s[i] = src[i];
    __syncwarp();
    unsigned r[4];
    ldmatrix_x4(r, s + rows[l] * 8);
    for (int i = 0; i < 4; ++i) out[l * 4 + i] = r[i];
}
