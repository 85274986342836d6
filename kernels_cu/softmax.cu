// softmax.cu -- numerically stable softmax of each row: y = exp(x - max) / sum(exp(x - max)).
//   softmax_f32(x, y, n): x, y are float [rows, n] row-major, n (int32) any length >= 1.
//   y may alias x. A row whose maximum is -inf (fully masked) gives all zeros, not NaN;
//   a NaN anywhere in a row makes the row NaN.
// Launch: grid = rows (one block per row), block = a multiple of 32 up to 1024 (256 suggested).
#include "common.cuh"

extern "C" __global__ void softmax_f32(const float* x, float* y, int n) {
    __shared__ float smem32[32];
    const long long row = blockIdx.x;
    x += row * n;
    y += row * n;
    float m = -CUDART_INF_F, has_nan = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = x[i];
        m = fmaxf(m, v);
        has_nan += (v != v) ? 1.0f : 0.0f;  // fmaxf drops NaN: count it so it is not hidden
    }
    m = block_reduce_max(m, smem32);
    has_nan = block_reduce_sum(has_nan, smem32);
    if (has_nan > 0.0f) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = CUDART_NAN_F;
        return;
    }
    if (m == -CUDART_INF_F) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = 0.0f;
        return;
    }
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += expf(x[i] - m);
    s = block_reduce_sum(s, smem32);
    const float inv = 1.0f / s;  // s >= 1: the max element contributes exp(0)
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = expf(x[i] - m) * inv;
}
