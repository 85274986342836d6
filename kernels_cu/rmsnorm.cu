// rmsnorm.cu -- RMS normalisation of each row: y = x * rsqrt(mean(x^2) + eps) * w.
//   rmsnorm_f32(x, w, y, n, eps): x, y are float[rows, n] row-major; w is float[n];
//   n (int32) is any length >= 1, odd included; eps is float. y may alias x.
//   rmsnorm_add_f32(y, w, x, n, eps): x += rmsnorm(y) * w, row by row -- a sublayer's output through
//   its post-norm into the residual stream (gemma3's sandwich norms): rmsnorm_f32 then add_f32 in
//   one pass (the add may fuse with the last product). x must not alias y.
// Launch: grid = rows (one block per row), block = a multiple of 32 up to 1024 (256 suggested).
// Batch invariance: a row's sum of squares is reduced in a fixed order for a given block size (the
// launcher's choice depends on n only), so a row's bits do not depend on the other rows.
// Bound: memory -- a row read and written once (8n bytes; 12n for rmsnorm_add).
#include "common.cuh"

template <typename T, bool ADD = false>
__device__ __forceinline__ void rmsnorm_row(const T* x, const float* __restrict__ w, T* y, int n, float eps) {
    __shared__ float smem32[32];
    const long long row = blockIdx.x;
    x += row * n;
    y += row * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = to_float(x[i]);
        ss += v * v;
    }
    ss = block_reduce_sum(ss, smem32);
    // rsqrtf is ~1 ulp on the GPU; eps keeps an all-zero row finite.
    const float scale = rsqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = to_float(x[i]) * scale * w[i];
        y[i] = from_float<T>(ADD ? to_float(y[i]) + v : v);  // (may contract into one FMA)
    }
}

extern "C" __global__ void rmsnorm_f32(const float* x, const float* w, float* y, int n, float eps) {
    sharpinf_pdl_enter();
    rmsnorm_row<float>(x, w, y, n, eps);
}
extern "C" __global__ void rmsnorm_add_f32(const float* y, const float* w, float* x, int n, float eps) {
    sharpinf_pdl_enter();
    rmsnorm_row<float, true>(y, w, x, n, eps);
}
