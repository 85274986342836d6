// rope.cu -- rotary position embedding, in place, on the heads of a packed token batch.
//   rope_norm(x, row_stride, positions, n_tokens, n_heads, head_dim, freqs, mscale, temp_scale, temp_floor)
//   rope_neox(...same...)
// x: float32, token t's head h element e at x[t*row_stride + h*head_dim + e] (call with
// x = qkv for Q and x = qkv + q_dim for K); positions: int32[n_tokens]; head_dim even;
// freqs: double[head_dim/2], the angle per position of each pair (model/rope_scaling.py: base,
// frequency factors, linear or YaRN scaling); mscale: the factor on cos and sin (rope_angle.cuh);
// temp_scale, temp_floor: the queries' attention temperature t (attn_temp.cuh) -- the Q call passes the
// model's (mistral3: temperature_scale, n_ctx_orig), the K call temp_scale 0 (t = 1).
// Pair i (0 <= i < head_dim/2) is rotated by angle = pos * freqs[i], c = cos * mscale, s = sin * mscale:
//   norm: elements (2i, 2i+1)      neox: elements (i, i + head_dim/2)
//   (a, b) -> ((a*c - b*s) * t, (a*s + b*c) * t)    (one float multiply; times 1.0f is exact)
// Accuracy: rope_angle.cuh (the angle reduced in double, sincosf on the reduced float angle), its
// double ops a (token, pair), shared by all n_heads heads.
// Launch: 1-D grid-stride over n_tokens * head_dim/2 (token, pair) items; any block size
// (128 suggested), grid = ceil(items / block) (may be capped: the loop covers the rest).
// Batch invariance: a (token, pair)'s rotation depends on its position and values only.
// Bound: memory -- each Q and K element read and written once; the angles cost a few double ops a
// (token, pair).
#include "common.cuh"
#include "attn_temp.cuh"
#include "rope_angle.cuh"

template <bool NEOX>
__device__ __forceinline__ void rope_impl(float* x, int row_stride, const int* positions, int n_tokens,
                                          int n_heads, int head_dim, const double* freqs, float mscale,
                                          float temp_scale, int temp_floor) {
    const int half = head_dim >> 1;
    const long long items = (long long)n_tokens * half;
    for (long long it = (long long)blockIdx.x * blockDim.x + threadIdx.x; it < items;
         it += (long long)gridDim.x * blockDim.x) {
        const int t = (int)(it / half), i = (int)(it % half);
        float s, c;
        rope_cos_sin(freqs, i, positions[t], mscale, &c, &s);
        const float temp = attn_temp(positions[t], temp_scale, temp_floor);
        float* row = x + (long long)t * row_stride;
        const int ia = NEOX ? i : 2 * i, ib = NEOX ? i + half : 2 * i + 1;
        for (int h = 0; h < n_heads; ++h) {
            float* hp = row + h * head_dim;
            const float a = hp[ia], b = hp[ib];
            hp[ia] = (a * c - b * s) * temp;
            hp[ib] = (a * s + b * c) * temp;
        }
    }
}

extern "C" __global__ void rope_norm(float* x, int row_stride, const int* positions, int n_tokens, int n_heads,
                                     int head_dim, const double* freqs, float mscale, float temp_scale, int temp_floor) {
    sharpinf_pdl_enter();
    rope_impl<false>(x, row_stride, positions, n_tokens, n_heads, head_dim, freqs, mscale, temp_scale, temp_floor);
}

extern "C" __global__ void rope_neox(float* x, int row_stride, const int* positions, int n_tokens, int n_heads,
                                     int head_dim, const double* freqs, float mscale, float temp_scale, int temp_floor) {
    sharpinf_pdl_enter();
    rope_impl<true>(x, row_stride, positions, n_tokens, n_heads, head_dim, freqs, mscale, temp_scale, temp_floor);
}
