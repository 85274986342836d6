// kv_cache.cu -- write this step's K and V rows into the paged KV cache of one layer.
//   kv_append_<t>(qkv, qkv_stride, k_col, v_col, slot_mapping, k_cache, v_cache,
//                 n_tokens, n_kv_heads, head_dim)
// qkv: float32 rows of stride qkv_stride; token t's K head h element e is
//   qkv[t*qkv_stride + k_col + h*head_dim + e] (V likewise at v_col).
// slot_mapping: int32[n_tokens], the physical cache slot of each token; a negative slot
//   (padding) writes nothing.
// Cache layouts (one array each for K and V, num_blocks*block_size slots):
//   f16 / bf16 / f32: element (slot, h, e) at [(slot*n_kv_heads + h)*head_dim + e];
//   q8_0: bytes; (slot, h) holds head_dim/32 blocks of {fp16 d; int8 q[32]} = 34 bytes at
//     byte ((slot*n_kv_heads + h)*(head_dim/32) + b)*34. Quantized as GGML's Q8_0:
//     d = amax/127, q = roundf(x * (d ? 1/d : 0)) (half away from zero), d stored as fp16.
// Launch: 1-D grid-stride; any block size that is a multiple of 32 (128 suggested).
//   f16/bf16/f32: one thread per (token, head, element): grid = ceil(n_tokens*n_kv_heads*head_dim / block);
//   q8_0: one warp per (token, head, 32-block): grid = ceil(n_tokens*n_kv_heads*(head_dim/32)*32 / block).
// Batch invariance: a slot's bytes depend on its token's K/V row only (a q8_0 block's scale on its 32
// values alone), never on the other tokens or the grid.
// Bound: memory -- the step's K/V rows read once, written once in the cache's type.
#include "common.cuh"

template <typename T>
__device__ __forceinline__ void kv_append_typed(const float* qkv, int qkv_stride, int k_col, int v_col,
                                                const int* slot_mapping, T* k_cache, T* v_cache, int n_tokens,
                                                int n_kv_heads, int head_dim) {
    const int row = n_kv_heads * head_dim;
    const long long items = (long long)n_tokens * row;
    for (long long it = (long long)blockIdx.x * blockDim.x + threadIdx.x; it < items;
         it += (long long)gridDim.x * blockDim.x) {
        const int t = (int)(it / row), c = (int)(it % row);
        const long long slot = slot_mapping[t];
        if (slot < 0) continue;
        const float* src = qkv + (long long)t * qkv_stride;
        k_cache[slot * row + c] = from_float<T>(src[k_col + c]);
        v_cache[slot * row + c] = from_float<T>(src[v_col + c]);
    }
}

// One warp quantizes one 32-element block; lane j owns element j.
__device__ __forceinline__ void q8_0_block(float v, unsigned char* dst, int lane) {
    const float amax = warp_reduce_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const float q = roundf(v * id);
    dst[2 + lane] = (unsigned char)(signed char)(int)q;
    if (lane == 0) *reinterpret_cast<__half*>(dst) = __float2half_rn(d);
}

extern "C" __global__ void kv_append_q8_0(const float* qkv, int qkv_stride, int k_col, int v_col,
                                          const int* slot_mapping, unsigned char* k_cache, unsigned char* v_cache,
                                          int n_tokens, int n_kv_heads, int head_dim) {
    sharpinf_pdl_enter();
    const int lane = threadIdx.x & 31;
    const int nb = head_dim / 32;                       // blocks per (slot, head)
    const int row_blocks = n_kv_heads * nb;             // blocks per slot
    const long long units = (long long)n_tokens * row_blocks;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    // the unit index is warp-uniform, so every lane of a warp runs the same iterations
    for (long long u = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); u < units; u += warps) {
        const int t = (int)(u / row_blocks), rb = (int)(u % row_blocks);
        const long long slot = slot_mapping[t];
        if (slot < 0) continue;
        const float* src = qkv + (long long)t * qkv_stride + rb * 32 + lane;
        const long long off = (slot * row_blocks + rb) * 34;
        q8_0_block(src[k_col], k_cache + off, lane);
        q8_0_block(src[v_col], v_cache + off, lane);
    }
}

extern "C" __global__ void kv_append_f32(const float* qkv, int qkv_stride, int k_col, int v_col,
                                         const int* slot_mapping, float* k_cache, float* v_cache, int n_tokens,
                                         int n_kv_heads, int head_dim) {
    sharpinf_pdl_enter();
    kv_append_typed<float>(qkv, qkv_stride, k_col, v_col, slot_mapping, k_cache, v_cache, n_tokens, n_kv_heads,
                           head_dim);
}
extern "C" __global__ void kv_append_f16(const float* qkv, int qkv_stride, int k_col, int v_col,
                                         const int* slot_mapping, __half* k_cache, __half* v_cache, int n_tokens,
                                         int n_kv_heads, int head_dim) {
    sharpinf_pdl_enter();
    kv_append_typed<__half>(qkv, qkv_stride, k_col, v_col, slot_mapping, k_cache, v_cache, n_tokens, n_kv_heads,
                            head_dim);
}
extern "C" __global__ void kv_append_bf16(const float* qkv, int qkv_stride, int k_col, int v_col,
                                          const int* slot_mapping, __nv_bfloat16* k_cache, __nv_bfloat16* v_cache,
                                          int n_tokens, int n_kv_heads, int head_dim) {
    sharpinf_pdl_enter();
    kv_append_typed<__nv_bfloat16>(qkv, qkv_stride, k_col, v_col, slot_mapping, k_cache, v_cache, n_tokens,
                                   n_kv_heads, head_dim);
}
