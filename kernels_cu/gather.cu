// gather.cu -- copy selected rows of a matrix: out[r] = x[rows[r]].
//   gather_rows_f32(x, rows, out, n_rows, n_cols): x is float[*, n_cols] row-major,
//   rows is int32[n_rows], out is float[n_rows, n_cols].
// Used to pick the rows that need logits before the final norm and the LM head, so a
// mid-prompt chunk never pays for the vocabulary projection.
// Launch: grid = n_rows (one block per output row), block = a multiple of 32 (128 suggested).
#include "common.cuh"

extern "C" __global__ void gather_rows_f32(const float* x, const int* rows, float* out, int n_rows, int n_cols) {
    const int r = blockIdx.x;
    if (r >= n_rows) return;
    const float* src = x + (long long)rows[r] * n_cols;
    float* dst = out + (long long)r * n_cols;
    for (int i = threadIdx.x; i < n_cols; i += blockDim.x) dst[i] = src[i];
}
