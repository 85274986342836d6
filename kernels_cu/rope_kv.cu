// rope_kv.cu -- variant of rope.cu + qk_norm.cu + kv_cache.cu: per token, in one launch,
//   (qwen3) RMSNorm of each Q and K head, RoPE of the Q and K heads, K and V into the paged cache.
//
//   rope_kv_<kv>(qkv, qkv_stride, positions, slot_mapping, q_norm, k_norm, k_cache, v_cache,
//                n_tokens, n_heads, n_kv_heads, head_dim, theta, freq_scale, eps, neox, has_norm)
//     qkv     float [n_tokens, qkv_stride]: Q at column 0, K at n_heads * head_dim, V after K;
//             Q and K are rotated in place (attention reads Q from here)
//     q_norm, k_norm  float [head_dim] (read only when has_norm)
//     caches  as kv_cache.cu (<kv>: f32 f16 bf16 q8_0); a negative slot writes nothing
//
// What it changes against the simple path (qk_norm.cu x 2, rope.cu x 2, kv_cache.cu: up to five
// launches) -- one launch, one block per token, three phases split by __syncthreads:
//   1. (has_norm) a warp per head: sum of squares over its lanes, xor-butterfly total, scale;
//   2. the angles, a thread per rotation pair, formed and reduced in double, then sincosf --
//      rope.cu's arithmetic exactly, kept in shared memory; then a thread per (head, pair)
//      rotates, so the rotation equals rope.cu's bits and every rotation of a token runs at once;
//   3. K and V of the token into its slot (q8_0: a warp per 32-value block, kv_cache.cu's rule).
// Each token's arithmetic depends on that token only.
// Launch: grid = n_tokens, block = (n_heads + n_kv_heads) * head_dim / 2 threads rounded up to a
// warp, 128 to 1024 (results do not depend on it: every thread's work is one head's or one pair's).
// Bound: latency -- a few KB per token; the point is two to four fewer launches per layer.
#include "common.cuh"

#define RK_MAX_HALF 128  // head_dim <= 256

template <typename T> struct RkStore {
    __device__ __forceinline__ static void row(const float* src, T* dst, int n, int tid, int nt) {
        for (int i = tid; i < n; i += nt) dst[i] = from_float<T>(src[i]);
    }
};

// q8_0 rows: a warp per 32-value block (kv_cache.cu's q8_0_block rule)
__device__ __forceinline__ void rk_q8_0_row(const float* src, unsigned char* dst, int n, int tid, int nt) {
    const int lane = tid & 31;
    for (int b = tid >> 5; b < n / 32; b += nt >> 5) {
        const float v = src[b * 32 + lane];
        const float amax = warp_reduce_max(fabsf(v));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        unsigned char* blk = dst + b * 34;
        blk[2 + lane] = (unsigned char)(signed char)(int)roundf(v * id);
        if (lane == 0) *reinterpret_cast<__half*>(blk) = __float2half_rn(d);
    }
}

template <typename T, bool Q8>
__device__ __forceinline__ void rope_kv_impl(float* qkv, int qkv_stride, const int* positions, const int* slot_mapping,
                                             const float* q_norm, const float* k_norm, void* k_cache, void* v_cache,
                                             int n_tokens, int n_heads, int n_kv_heads, int head_dim, float theta,
                                             float freq_scale, float eps, int neox, int has_norm) {
    const int t = blockIdx.x, tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
    if (t >= n_tokens) return;  // uniform per block
    float* row = qkv + (long long)t * qkv_stride;
    const int heads = n_heads + n_kv_heads;  // Q heads then K heads, contiguous in the row
    if (has_norm) {
        for (int h = warp; h < heads; h += nt >> 5) {
            float* v = row + h * head_dim;
            const float* w = h < n_heads ? q_norm : k_norm;
            float ss = 0.0f;
            for (int i = lane; i < head_dim; i += 32) ss += v[i] * v[i];
            ss = warp_reduce_sum(ss);
            const float scale = rsqrtf(ss / (float)head_dim + eps);
            for (int i = lane; i < head_dim; i += 32) v[i] = v[i] * scale * w[i];
        }
        __syncthreads();
    }
    // 2a. the angles of the token's position, once per rotation pair, into shared memory
    __shared__ float sin_s[RK_MAX_HALF], cos_s[RK_MAX_HALF];
    const int half = head_dim >> 1;
    const double log_theta = log((double)theta);
    const double two_pi = 6.283185307179586476925286766559;
    for (int i = tid; i < half; i += nt) {
        const double inv_freq = exp(-(double)(2 * i) / (double)head_dim * log_theta);
        const double ang = (double)positions[t] * (double)freq_scale * inv_freq;
        const double red = ang - two_pi * rint(ang / two_pi);
        sincosf((float)red, &sin_s[i], &cos_s[i]);
    }
    __syncthreads();
    // 2b. a thread per (head, pair): every rotation of the token at once
    for (int p = tid; p < heads * half; p += nt) {
        const int h = p / half, i = p % half;
        const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
        const float s = sin_s[i], c = cos_s[i];
        float* hp = row + h * head_dim;
        const float a = hp[ia], b = hp[ib];
        hp[ia] = a * c - b * s;
        hp[ib] = a * s + b * c;
    }
    __syncthreads();
    const long long slot = slot_mapping[t];
    if (slot < 0) return;  // uniform per block
    const int kv_dim = n_kv_heads * head_dim;
    const float* k = row + n_heads * head_dim;
    const float* v = k + kv_dim;
    if constexpr (Q8) {
        const long long bytes = (long long)kv_dim / 32 * 34;
        rk_q8_0_row(k, static_cast<unsigned char*>(k_cache) + slot * bytes, kv_dim, tid, nt);
        rk_q8_0_row(v, static_cast<unsigned char*>(v_cache) + slot * bytes, kv_dim, tid, nt);
    } else {
        RkStore<T>::row(k, static_cast<T*>(k_cache) + slot * kv_dim, kv_dim, tid, nt);
        RkStore<T>::row(v, static_cast<T*>(v_cache) + slot * kv_dim, kv_dim, tid, nt);
    }
}

#define RK_ARGS                                                                                                  \
    float *qkv, int qkv_stride, const int *positions, const int *slot_mapping, const float *q_norm,             \
        const float *k_norm, void *k_cache, void *v_cache, int n_tokens, int n_heads, int n_kv_heads, int head_dim, \
        float theta, float freq_scale, float eps, int neox, int has_norm
#define RK_PASS qkv, qkv_stride, positions, slot_mapping, q_norm, k_norm, k_cache, v_cache, n_tokens, n_heads, \
        n_kv_heads, head_dim, theta, freq_scale, eps, neox, has_norm

extern "C" __global__ void rope_kv_f32(RK_ARGS) { rope_kv_impl<float, false>(RK_PASS); }
extern "C" __global__ void rope_kv_f16(RK_ARGS) { rope_kv_impl<__half, false>(RK_PASS); }
extern "C" __global__ void rope_kv_bf16(RK_ARGS) { rope_kv_impl<__nv_bfloat16, false>(RK_PASS); }
extern "C" __global__ void rope_kv_q8_0(RK_ARGS) { rope_kv_impl<float, true>(RK_PASS); }
