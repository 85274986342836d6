// kv_rows.cuh -- reading the paged KV cache, shared by the attention variants.
//
//   AsQuery        a query token's position and its sequence's block-table row (binary search in cu_seqlens)
//   AsKv<T, HD>    rows of f32 / f16 / bf16 cache, 8 elements (16-byte loads) at a time, as float
//   AsKvQ8<HD>     rows of q8_0 cache (34-byte blocks of a half scale and 32 int8), 8 elements at a time
//   kv_stage8      8 elements of a row into shared memory as f16 (the tensor-core kernels' operand):
//                  an f16 cache by cp.async (no conversion), the others converted on the way
#pragma once
#include "common.cuh"

#define AS_VEC 8  // K/V elements per load
// Row pieces of AS_VEC elements a thread fetches before it unpacks the first (attention_split.cu), per
// cache type (each reader's FETCH): 64 bytes of loads in flight -- four 16-byte pieces, two of f32 --
// keep every attention_split entry within 128 registers on sm_90 (4 blocks an SM); more pieces do not.

struct AsQuery {
    int pos;
    const int* table;
    __device__ __forceinline__ AsQuery(int t, const int* cu_seqlens, int n_seqs, const int* positions,
                                       const int* block_tables, int max_blocks_per_seq) {
        int lo = 0, hi = n_seqs - 1;  // the sequence of token t: largest s with cu_seqlens[s] <= t
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (cu_seqlens[mid] <= t) lo = mid; else hi = mid - 1;
        }
        pos = positions[t];
        table = block_tables + (long long)lo * max_blocks_per_seq;
    }
    __device__ __forceinline__ long long slot(int j, int block_size) const {
        return (long long)table[j / block_size] * block_size + j % block_size;
    }
};

// ---- 8 consecutive elements [e0, e0 + 8) of a K/V row (e0 a multiple of 8), per cache type ----
// 16 bytes at a 16-byte aligned address (the emulator checks the alignment the GPU needs).
__device__ __forceinline__ void as_load16(const void* p, void* dst) {
#ifdef SHARPINF_EMU
    SHARPINF_ASSERT_ALIGNED(p, 16);
    __builtin_memcpy(dst, p, 16);
#else
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(p);
#endif
}
// Each reader loads in two halves, as dp4a.cuh's weight chunks: fetch(r, e0) issues the loads into a
// Raw (the bytes as the load instructions return them), unpack(raw, v) turns them into floats; load8
// is the two back to back. A kernel that fetches several rows before unpacking any has all their
// loads in flight at once (attention_split.cu), not one round trip after another.
template <typename T, int HD> struct AsKv {  // f32, f16, bf16 rows of HD elements
    static constexpr int PER = 16 / sizeof(T);  // elements per 16-byte load
    static constexpr int FETCH = sizeof(T) == 4 ? 2 : 4;
    struct __align__(16) Raw {  // 16-byte loads land in it
        T h[AS_VEC];
    };
    const T* base;
    __device__ __forceinline__ Raw fetch(long long r, int e0) const {
        Raw raw;
#pragma unroll
        for (int c = 0; c < AS_VEC / PER; ++c) as_load16(base + r * HD + e0 + c * PER, raw.h + c * PER);
        return raw;
    }
    __device__ __forceinline__ void unpack(const Raw& raw, float (&v)[AS_VEC]) const {
#pragma unroll
        for (int i = 0; i < AS_VEC; ++i) v[i] = to_float(raw.h[i]);
    }
    __device__ __forceinline__ void load8(long long r, int e0, float (&v)[AS_VEC]) const { unpack(fetch(r, e0), v); }
};
template <int HD> struct AsKvQ8 {  // q8_0 rows: HD / 32 blocks of (half d, 32 int8), 34 bytes each
    static constexpr int FETCH = 4;  // 10 bytes a piece, in 5 loads
    struct Raw {
        __half d;
        unsigned short w[AS_VEC / 2];  // values 2i and 2i + 1 (2-byte aligned: 34-byte blocks)
    };
    const unsigned char* base;
    __device__ __forceinline__ Raw fetch(long long r, int e0) const {
        const unsigned char* blk = base + r * (HD / 32 * 34) + (e0 / 32) * 34;
        const unsigned short* q = reinterpret_cast<const unsigned short*>(blk + 2 + e0 % 32);
#ifdef SHARPINF_EMU
        SHARPINF_ASSERT_ALIGNED(q, 2);
#endif
        Raw raw;
        raw.d = *reinterpret_cast<const __half*>(blk);
#pragma unroll
        for (int i = 0; i < AS_VEC / 2; ++i) raw.w[i] = q[i];
        return raw;
    }
    __device__ __forceinline__ void unpack(const Raw& raw, float (&v)[AS_VEC]) const {
        const float d = to_float(raw.d);
#pragma unroll
        for (int i = 0; i < AS_VEC / 2; ++i) {
            v[2 * i] = d * (float)(signed char)(raw.w[i] & 0xffu);
            v[2 * i + 1] = d * (float)(signed char)(raw.w[i] >> 8);
        }
    }
    __device__ __forceinline__ void load8(long long r, int e0, float (&v)[AS_VEC]) const { unpack(fetch(r, e0), v); }
};

// ---- 8 elements [e0, e0 + 8) of row r as f16 into shared memory (dst 16-byte aligned) ---------
__device__ __forceinline__ unsigned kv_pack_half2(float lo, float hi) {
    return (unsigned)__half_as_ushort(__float2half_rn(lo)) | ((unsigned)__half_as_ushort(__float2half_rn(hi)) << 16);
}
__device__ __forceinline__ void kv_store8(const float (&v)[AS_VEC], __half* dst) {
    uint4 w;
    w.x = kv_pack_half2(v[0], v[1]);
    w.y = kv_pack_half2(v[2], v[3]);
    w.z = kv_pack_half2(v[4], v[5]);
    w.w = kv_pack_half2(v[6], v[7]);
#ifdef SHARPINF_EMU
    SHARPINF_ASSERT_ALIGNED(dst, 16);
#endif
    *reinterpret_cast<uint4*>(dst) = w;
}
template <typename T, int HD>  // f32 and bf16 rows: converted (f32 rounds to f16; bf16 is exact above 2^-14)
__device__ __forceinline__ void kv_stage8(const AsKv<T, HD>& kv, long long r, int e0, __half* dst) {
    float v[AS_VEC];
    kv.load8(r, e0, v);
    kv_store8(v, dst);
}
template <int HD>  // f16 rows: copied as they are, asynchronously (visible after cp_async_wait_all + a barrier)
__device__ __forceinline__ void kv_stage8(const AsKv<__half, HD>& kv, long long r, int e0, __half* dst) {
    cp_async_16(dst, kv.base + r * HD + e0);
}
template <int HD>  // q8_0 rows: d * q in float, rounded once to f16
__device__ __forceinline__ void kv_stage8(const AsKvQ8<HD>& kv, long long r, int e0, __half* dst) {
    float v[AS_VEC];
    kv.load8(r, e0, v);
    kv_store8(v, dst);
}
