// qk_norm.cu -- per-head RMSNorm of Q or K inside the fused QKV buffer (qwen3), in place.
//   qk_norm_f32(qkv, w, n_tokens, n_heads, head_dim, row_stride, col, eps):
//   qkv is float[n_tokens, row_stride]; the heads to normalise start at column `col`
//   (0 for Q, q_dim for K), n_heads of head_dim contiguous floats each; w is float[head_dim].
//   Each head: v = v * rsqrt(mean(v^2) + eps) * w.
// Launch: grid = n_tokens * n_heads (one block per head row), block = 32..128 threads.
// Batch invariance: a head's sum of squares is reduced in a fixed tree for a given block size (the
// launcher's choice from head_dim only), so a head's bits do not depend on the other tokens.
// Bound: latency -- a head is head_dim floats; the grid is the parallelism.
#include "common.cuh"

extern "C" __global__ void qk_norm_f32(float* qkv, const float* w, int n_tokens, int n_heads, int head_dim,
                                       int row_stride, int col, float eps) {
    sharpinf_pdl_enter();
    __shared__ float smem32[32];
    const int row = blockIdx.x;  // (token, head)
    if (row >= n_tokens * n_heads) return;  // uniform per block: never splits a barrier
    float* v = qkv + (long long)(row / n_heads) * row_stride + col + (row % n_heads) * head_dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) ss += v[i] * v[i];
    ss = block_reduce_sum(ss, smem32);
    const float scale = rsqrtf(ss / (float)head_dim + eps);
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) v[i] = v[i] * scale * w[i];
}
