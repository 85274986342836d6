// rope_kv_token.cuh -- one token's QK-norm, RoPE and KV append by a whole block, whatever its size:
// rope_kv.cu (a block a token) and layer_dp4a.cu's last phase (tokens strided over a cooperative
// grid) run this one function, so the two give the same bits. The algorithm: rope_kv.cu's header.
#pragma once
#include "common.cuh"
#include "attn_temp.cuh"
#include "rope_angle.cuh"

#define RK_MAX_HALF 128  // head_dim <= 256
// Latency, not work, is what a token costs (a few KB): every loop below loads all a thread's values
// of a pass (RK_BATCH of them) before it stores the first. A loop that stored each value as it
// arrived could not issue the next load before the store (the two may alias, for all the compiler
// knows): a round trip an element.
#define RK_BATCH 4
#define RK_PER_LANE (2 * RK_MAX_HALF / 32)  // a head's values a lane holds in the norm

template <typename T> struct RkStore {
    __device__ __forceinline__ static void row(const float* k, const float* v, T* kd, T* vd, int n, int tid, int nt) {
        for (int i0 = tid; i0 < n; i0 += RK_BATCH * nt) {
            float kv[RK_BATCH], vv[RK_BATCH];
#pragma unroll
            for (int u = 0; u < RK_BATCH; ++u) {
                const int i = i0 + u * nt;
                kv[u] = i < n ? k[i] : 0.0f;
                vv[u] = i < n ? v[i] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < RK_BATCH; ++u) {
                const int i = i0 + u * nt;
                if (i >= n) break;
                kd[i] = from_float<T>(kv[u]);
                vd[i] = from_float<T>(vv[u]);
            }
        }
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

// Token t of the step, by the whole block (every thread calls it with the same t).
template <typename T, bool Q8>
__device__ __forceinline__ void rope_kv_token(int t, float* qkv, int qkv_stride, const int* positions,
                                              const int* slot_mapping, const float* q_norm, const float* k_norm,
                                              void* k_cache, void* v_cache, int n_heads, int n_kv_heads, int head_dim,
                                              const double* freqs, float mscale, float temp_scale, int temp_floor,
                                              float eps, int neox, int has_norm) {
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
    float* row = qkv + (long long)t * qkv_stride;
    const int heads = n_heads + n_kv_heads;  // Q heads then K heads, contiguous in the row
    const int pos = positions[t];            // loaded now: in flight during the norm
    const long long slot = slot_mapping[t];
    if (has_norm) {
        for (int h = warp; h < heads; h += nt >> 5) {
            float* v = row + h * head_dim;
            const float* w = h < n_heads ? q_norm : k_norm;
            float x[RK_PER_LANE], g[RK_PER_LANE];  // the lane's values i = lane, lane + 32, ... and their weights
#pragma unroll
            for (int k = 0; k < RK_PER_LANE; ++k) {
                const int i = lane + 32 * k;
                x[k] = i < head_dim ? v[i] : 0.0f;
                g[k] = i < head_dim ? w[i] : 0.0f;
            }
            float ss = 0.0f;
#pragma unroll
            for (int k = 0; k < RK_PER_LANE; ++k)
                if (lane + 32 * k < head_dim) ss += x[k] * x[k];
            ss = warp_reduce_sum(ss);
            const float scale = rsqrtf(ss / (float)head_dim + eps);
#pragma unroll
            for (int k = 0; k < RK_PER_LANE; ++k)
                if (lane + 32 * k < head_dim) v[lane + 32 * k] = x[k] * scale * g[k];
        }
        __syncthreads();
    }
    // 2a. the angles of the token's position, once per rotation pair, into shared memory
    __shared__ float sin_s[RK_MAX_HALF], cos_s[RK_MAX_HALF];
    const int half = head_dim >> 1;
    for (int i = tid; i < half; i += nt) rope_cos_sin(freqs, i, pos, mscale, &cos_s[i], &sin_s[i]);
    __syncthreads();
    // 2b. a thread per (head, pair): every rotation of the token at once, RK_BATCH pairs a thread loaded
    //     before the first is rotated; a Q head's rotation times the queries' temperature (K's times 1)
    const float q_temp = attn_temp(pos, temp_scale, temp_floor);
    const int pairs = heads * half;
    for (int p0 = tid; p0 < pairs; p0 += RK_BATCH * nt) {
        float a[RK_BATCH], b[RK_BATCH];
#pragma unroll
        for (int u = 0; u < RK_BATCH; ++u) {
            const int p = p0 + u * nt, h = p / half, i = p % half;
            const float* hp = row + h * head_dim;
            a[u] = p < pairs ? hp[neox ? i : 2 * i] : 0.0f;
            b[u] = p < pairs ? hp[neox ? i + half : 2 * i + 1] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < RK_BATCH; ++u) {
            const int p = p0 + u * nt, h = p / half, i = p % half;
            if (p >= pairs) break;
            const float s = sin_s[i], c = cos_s[i], t = h < n_heads ? q_temp : 1.0f;
            float* hp = row + h * head_dim;
            hp[neox ? i : 2 * i] = (a[u] * c - b[u] * s) * t;
            hp[neox ? i + half : 2 * i + 1] = (a[u] * s + b[u] * c) * t;
        }
    }
    __syncthreads();
    if (slot < 0) return;  // uniform per block (the caller's next __syncthreads is past it)
    const int kv_dim = n_kv_heads * head_dim;
    const float* k = row + n_heads * head_dim;
    const float* v = k + kv_dim;
    if constexpr (Q8) {
        const long long bytes = (long long)kv_dim / 32 * 34;
        rk_q8_0_row(k, static_cast<unsigned char*>(k_cache) + slot * bytes, kv_dim, tid, nt);
        rk_q8_0_row(v, static_cast<unsigned char*>(v_cache) + slot * bytes, kv_dim, tid, nt);
    } else {
        RkStore<T>::row(k, v, static_cast<T*>(k_cache) + slot * kv_dim, static_cast<T*>(v_cache) + slot * kv_dim, kv_dim,
                        tid, nt);
    }
}
