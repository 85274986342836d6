// ldmatrix.cu (test-only) -- raw ldmatrix_x4 fragments.
//   ldmatrix_rows(src, rowsel, out): src unsigned short[32][16] (32 rows of 16 b16);
//   rowsel int[32]: lane l passes the address of row rowsel[l], half (l & 1) (elements
//   8*(l&1) .. +7, 16-byte aligned); out unsigned[32][4]: lane l's r[0..3].
// Launch: grid 1, block 32.
#include "common.cuh"

extern "C" __global__ void ldmatrix_rows(const unsigned short* src, const int* rowsel, unsigned* out) {
    __shared__ __align__(16) unsigned short s[32 * 16];
    const int lane = threadIdx.x & 31;
    for (int i = lane; i < 32 * 16; i += 32) s[i] = src[i];
    __syncwarp();
    unsigned r[4];
    ldmatrix_x4(r, s + rowsel[lane] * 16 + 8 * (lane & 1));
    for (int i = 0; i < 4; ++i) out[lane * 4 + i] = r[i];
}
