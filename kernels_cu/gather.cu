// gather.cu -- copy selected rows of a matrix: out[r] = x[rows[r]].
//   gather_rows_f32(x, rows, out, n_rows, n_cols): x is float[*, n_cols] row-major,
//   rows is int32[n_rows], out is float[n_rows, n_cols].
// Used to pick the rows that need logits before the final norm and the LM head, so a
// mid-prompt chunk never pays for the vocabulary projection.
// Launch: grid = n_rows (one block per output row), block = a multiple of 32 (256: a 4096-wide row in
// one batch a thread).
// Batch invariance: a copy -- every output row is its source row's bits, whatever else is gathered.
// Bound: latency (a row is a few KB): a thread loads GR_BATCH values before it stores the first. A
// loop that stored each value as it arrived could not issue the next load before the store (they
// may alias, for all the compiler knows): 32 round trips in a row for a 4096-wide row at 128 threads.
#include "common.cuh"

#define GR_BATCH 16

extern "C" __global__ void gather_rows_f32(const float* x, const int* rows, float* out, int n_rows, int n_cols) {
    sharpinf_pdl_enter();
    const int r = blockIdx.x;
    if (r >= n_rows) return;
    const float* src = x + (long long)rows[r] * n_cols;
    float* dst = out + (long long)r * n_cols;
    const int nt = blockDim.x;
    for (int i0 = threadIdx.x; i0 < n_cols; i0 += GR_BATCH * nt) {
        float v[GR_BATCH];
#pragma unroll
        for (int u = 0; u < GR_BATCH; ++u) v[u] = i0 + u * nt < n_cols ? src[i0 + u * nt] : 0.0f;
#pragma unroll
        for (int u = 0; u < GR_BATCH; ++u)
            if (i0 + u * nt < n_cols) dst[i0 + u * nt] = v[u];
    }
}
