// rope_kv.cu -- variant of rope.cu + qk_norm.cu + kv_cache.cu: per token, in one launch,
//   (qwen3) RMSNorm of each Q and K head, RoPE of the Q and K heads, K and V into the paged cache.
//
//   rope_kv_<kv>(qkv, qkv_stride, positions, slot_mapping, q_norm, k_norm, k_cache, v_cache,
//                n_tokens, n_heads, n_kv_heads, head_dim, freqs, mscale, temp_scale, temp_floor, eps, neox,
//                has_norm)
//     qkv     float [n_tokens, qkv_stride]: Q at column 0, K at n_heads * head_dim, V after K;
//             Q and K are rotated in place (attention reads Q from here)
//     q_norm, k_norm  float [head_dim] (read only when has_norm)
//     freqs, mscale   the model's RoPE table and cos/sin factor (rope_angle.cuh)
//     temp_scale, temp_floor  the queries' attention temperature (attn_temp.cuh): Q's rotation times it,
//             K's not (temp_scale 0: none)
//     caches  as kv_cache.cu (<kv>: f32 f16 bf16 q8_0); a negative slot writes nothing
//
// What it changes against the simple path (qk_norm.cu x 2, rope.cu x 2, kv_cache.cu: up to five
// launches) -- one launch, one block per token, three phases split by __syncthreads:
//   1. (has_norm) a warp per head: sum of squares over its lanes, xor-butterfly total, scale;
//   2. the angles, a thread per rotation pair, formed and reduced in double, then sincosf --
//      rope.cu's arithmetic exactly, kept in shared memory; then a thread per (head, pair)
//      rotates (a Q head's times the temperature), so the rotation equals rope.cu's bits and every
//      rotation of a token runs at once;
//   3. K and V of the token into its slot (q8_0: a warp per 32-value block, kv_cache.cu's rule).
// Batch invariance: each token's arithmetic depends on that token only.
// Launch: grid = n_tokens, block = (n_heads + n_kv_heads) * head_dim / 2 threads rounded up to a
// warp, 128 to 1024 (results do not depend on it: every thread's work is one head's or one pair's).
// Bound: latency -- a few KB per token; the point is two to four fewer launches per layer.
#include "rope_kv_token.cuh"

template <typename T, bool Q8>
__device__ __forceinline__ void rope_kv_impl(float* qkv, int qkv_stride, const int* positions, const int* slot_mapping,
                                             const float* q_norm, const float* k_norm, void* k_cache, void* v_cache,
                                             int n_tokens, int n_heads, int n_kv_heads, int head_dim, const double* freqs,
                                             float mscale, float temp_scale, int temp_floor, float eps, int neox,
                                             int has_norm) {
    if ((int)blockIdx.x >= n_tokens) return;  // uniform per block
    rope_kv_token<T, Q8>(blockIdx.x, qkv, qkv_stride, positions, slot_mapping, q_norm, k_norm, k_cache, v_cache,
                         n_heads, n_kv_heads, head_dim, freqs, mscale, temp_scale, temp_floor, eps, neox, has_norm);
}

#define RK_ARGS                                                                                                  \
    float *qkv, int qkv_stride, const int *positions, const int *slot_mapping, const float *q_norm,             \
        const float *k_norm, void *k_cache, void *v_cache, int n_tokens, int n_heads, int n_kv_heads, int head_dim, \
        const double *freqs, float mscale, float temp_scale, int temp_floor, float eps, int neox, int has_norm
#define RK_PASS qkv, qkv_stride, positions, slot_mapping, q_norm, k_norm, k_cache, v_cache, n_tokens, n_heads, \
        n_kv_heads, head_dim, freqs, mscale, temp_scale, temp_floor, eps, neox, has_norm

extern "C" __global__ void rope_kv_f32(RK_ARGS) { sharpinf_pdl_enter(); rope_kv_impl<float, false>(RK_PASS); }
extern "C" __global__ void rope_kv_f16(RK_ARGS) { sharpinf_pdl_enter(); rope_kv_impl<__half, false>(RK_PASS); }
extern "C" __global__ void rope_kv_bf16(RK_ARGS) { sharpinf_pdl_enter(); rope_kv_impl<__nv_bfloat16, false>(RK_PASS); }
extern "C" __global__ void rope_kv_q8_0(RK_ARGS) { sharpinf_pdl_enter(); rope_kv_impl<float, true>(RK_PASS); }
