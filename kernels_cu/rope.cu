// rope.cu -- rotary position embedding, in place, on the heads of a packed token batch.
//   rope_norm(x, row_stride, positions, n_tokens, n_heads, head_dim, theta, freq_scale)
//   rope_neox(...same...)
// x: float32, token t's head h element e at x[t*row_stride + h*head_dim + e] (call with
// x = qkv for Q and x = qkv + q_dim for K); positions: int32[n_tokens]; head_dim even.
// Pair i (0 <= i < head_dim/2) is rotated by angle = pos * freq_scale * theta^(-2i/head_dim)
// (freq_scale: linear RoPE scaling, 1 / rope.scaling.factor; 1 for most models):
//   norm: elements (2i, 2i+1)      neox: elements (i, i + head_dim/2)
//   (a, b) -> (a*cos - b*sin, a*sin + b*cos)
// Accuracy: the angle is formed and reduced to [-pi, pi] in double (a few double ops per
// (token, pair), shared by all n_heads heads), then sincosf runs on the reduced float
// angle. cos/sin are thus within ~1 float ulp of the float64 reference at any position,
// instead of the ~pos * 2e-7 rad a float angle carries (1.6e-3 rad at pos 8000).
// Launch: 1-D grid-stride over n_tokens * head_dim/2 (token, pair) items; any block size
// (128 suggested), grid = ceil(items / block) (may be capped: the loop covers the rest).
// Batch invariance: a (token, pair)'s rotation depends on its position and values only.
// Bound: memory -- each Q and K element read and written once; the angles cost a few double ops a
// (token, pair).
#include "common.cuh"

template <bool NEOX>
__device__ __forceinline__ void rope_impl(float* x, int row_stride, const int* positions, int n_tokens,
                                          int n_heads, int head_dim, float theta, float freq_scale) {
    const int half = head_dim >> 1;
    const long long items = (long long)n_tokens * half;
    // log(theta) in double once per thread; inv_freq_i = exp(-(2i/d) * log(theta))
    const double log_theta = log((double)theta);
    const double two_pi = 6.283185307179586476925286766559;
    for (long long it = (long long)blockIdx.x * blockDim.x + threadIdx.x; it < items;
         it += (long long)gridDim.x * blockDim.x) {
        const int t = (int)(it / half), i = (int)(it % half);
        const double inv_freq = exp(-(double)(2 * i) / (double)head_dim * log_theta);
        const double ang = (double)positions[t] * (double)freq_scale * inv_freq;  // pos * 1 is exact
        const double red = ang - two_pi * rint(ang / two_pi);  // |red| <= pi
        float s, c;
        sincosf((float)red, &s, &c);
        float* row = x + (long long)t * row_stride;
        const int ia = NEOX ? i : 2 * i, ib = NEOX ? i + half : 2 * i + 1;
        for (int h = 0; h < n_heads; ++h) {
            float* hp = row + h * head_dim;
            const float a = hp[ia], b = hp[ib];
            hp[ia] = a * c - b * s;
            hp[ib] = a * s + b * c;
        }
    }
}

extern "C" __global__ void rope_norm(float* x, int row_stride, const int* positions, int n_tokens, int n_heads,
                                     int head_dim, float theta, float freq_scale) {
    sharpinf_pdl_enter();
    rope_impl<false>(x, row_stride, positions, n_tokens, n_heads, head_dim, theta, freq_scale);
}

extern "C" __global__ void rope_neox(float* x, int row_stride, const int* positions, int n_tokens, int n_heads,
                                     int head_dim, float theta, float freq_scale) {
    sharpinf_pdl_enter();
    rope_impl<true>(x, row_stride, positions, n_tokens, n_heads, head_dim, theta, freq_scale);
}
