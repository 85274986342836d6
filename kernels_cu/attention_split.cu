// attention_split.cu -- variant of attention.cu: split-KV (flash-decoding) varlen paged attention.
//
//   attention_split_<kv>_d<HD>(qkv, qkv_stride, k_cache, v_cache, block_tables, max_blocks_per_seq,
//       cu_seqlens, positions, out, out_q, out_d, out_s, partial, tickets, t0, n_tokens, n_seqs, n_heads,
//       n_kv_heads, block_size, scale, quantize)
//   Inputs as attention.cu. out: float [n_tokens, n_heads * HD]; with quantize != 0 the rows are
//   also written in q8_1 (out_q int8, out_d float, out_s int per 32 values: quant_act.py's rule),
//   the input of the dp4a o-projection. partial: float scratch [n_tokens, n_heads, SPLITS, HD + 2];
//   tickets: int [n_tokens, n_kv_heads * groups], zero before the first launch (the kernel leaves
//   them zero again, so graphs replay it). A launch runs the tokens t0 .. t0 + gridDim.x - 1 (< n_tokens)
//   and indexes partial and tickets from t0: the launcher walks a long step in windows of the
//   scratch's size (a query's arithmetic does not depend on its window).
//
// What it changes against attention.cu (one warp per (token, head), each lane a strided set of
// keys, no split):
//   * the keys of a query are cut into partitions of PART = 64 at fixed absolute positions;
//     SPLITS = 16 blocks per (token, KV head) each take partitions s, s + 16, ... so a decode at
//     any context runs on 16 x n_kv_heads blocks, and merge in a fixed order (the block that
//     finishes last, found by an atomic ticket, merges: which block that is changes nothing);
//   * one block serves the g query heads of a KV head (GQA): each K row is loaded once for all g;
//     scores: a warp per key (lanes over head_dim, xor-butterfly sum); P V: a thread per output
//     element walking the partition's keys in order (coalesced V loads);
//   * the output may be quantized to q8_1 in the merge (the dp4a path needs no extra launch).
// Arithmetic of a query depends only on its position and its own keys: partitions, splits, the
// warp of a key, the walk order and the merge order are all fixed by absolute key positions and
// shapes, so results are bit-identical alone, packed, chunked, in other blocks, under graphs.
// Launch: grid = (window tokens, n_kv_heads * ceil(g / 8), SPLITS), block = 128 threads.
// Bound: memory -- each K/V byte of a query's context is read once per (token, KV head); decode
// at long context reads the KV at the device's bandwidth once enough blocks run (16 per KV head).
#include "common.cuh"

#define AS_PART 64      // keys per partition
#define AS_SPLITS 16    // blocks per (token, KV head group)
#define AS_GROUP 8      // query heads per block (larger GQA groups take several blocks)
#define AS_THREADS 128  // 4 warps

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

// ---- one element of a K/V row per cache type --------------------------------------------------
template <typename T, int HD> struct AsKv {
    const T* base;
    __device__ __forceinline__ float at(long long r, int e) const { return to_float(base[r * HD + e]); }
};
template <int HD> struct AsKvQ8 {
    const unsigned char* base;
    __device__ __forceinline__ float at(long long r, int e) const {
        const unsigned char* blk = base + r * (HD / 32 * 34) + (e / 32) * 34;
        return to_float(*reinterpret_cast<const __half*>(blk)) * (float)(signed char)blk[2 + e % 32];
    }
};

template <int HD, typename KV>
__device__ __forceinline__ void attention_split_impl(
    const float* qkv, int qkv_stride, KV kc, KV vc, const int* block_tables, int max_blocks_per_seq,
    const int* cu_seqlens, const int* positions, float* out, signed char* out_q, float* out_d, int* out_s,
    float* partial, int* tickets, int t0, int n_tokens, int n_seqs, int n_heads, int n_kv_heads, int block_size, float scale,
    int quantize) {
    constexpr int EPT = (HD + AS_THREADS - 1) / AS_THREADS;  // output elements per thread
    __shared__ float q_s[AS_GROUP][HD];
    __shared__ float p_s[AS_GROUP][AS_PART];  // scores, then weights, of one partition
    __shared__ float m_s[AS_GROUP], l_s[AS_GROUP], f_s[AS_GROUP];
    __shared__ int last_s;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = AS_THREADS / 32;
    const int tl = blockIdx.x, t = t0 + tl, split = blockIdx.z;  // tl: the token in the window
    const int group = n_heads / n_kv_heads, groups = (group + AS_GROUP - 1) / AS_GROUP;
    const int kvh = blockIdx.y / groups, h0 = kvh * group + (blockIdx.y % groups) * AS_GROUP;
    const int g = min(AS_GROUP, kvh * group + group - h0);  // query heads of this block
    if (t >= n_tokens) return;
    const AsQuery qi(t, cu_seqlens, n_seqs, positions, block_tables, max_blocks_per_seq);
    const int nsplits = min(AS_SPLITS, qi.pos / AS_PART + 1);  // splits holding a partition
    if (split >= nsplits) return;  // uniform per block

    for (int i = tid; i < g * HD; i += AS_THREADS) q_s[i / HD][i % HD] = qkv[(long long)t * qkv_stride + (h0 + i / HD) * HD + i % HD];
    if (tid < AS_GROUP) {
        m_s[tid] = -CUDART_INF_F;
        l_s[tid] = 0.0f;
    }
    float acc[AS_GROUP][EPT];
#pragma unroll
    for (int h = 0; h < AS_GROUP; ++h)
#pragma unroll
        for (int k = 0; k < EPT; ++k) acc[h][k] = 0.0f;
    __syncthreads();

    for (int part = split; part * AS_PART <= qi.pos; part += AS_SPLITS) {
        const int j0 = part * AS_PART, nk = min(AS_PART, qi.pos + 1 - j0);
        // 1. scores: warp w takes keys j0 + w, j0 + w + 4, ...; lanes over head_dim
        for (int jj = warp; jj < nk; jj += warps) {
            const long long r = qi.slot(j0 + jj, block_size) * n_kv_heads + kvh;
            float kv[(HD + 31) / 32];
#pragma unroll
            for (int k = 0; k < (HD + 31) / 32; ++k) kv[k] = lane + 32 * k < HD ? kc.at(r, lane + 32 * k) : 0.0f;
            for (int h = 0; h < g; ++h) {
                float sdot = 0.0f;
#pragma unroll
                for (int k = 0; k < (HD + 31) / 32; ++k)
                    if (lane + 32 * k < HD) sdot += q_s[h][lane + 32 * k] * kv[k];
                sdot = warp_reduce_sum(sdot);
                if (lane == 0) p_s[h][jj] = sdot * scale;
            }
        }
        __syncthreads();
        // 2. per head: the new running max, the rescale factor, the weights and their sum
        for (int h = warp; h < g; h += warps) {
            float mp = -CUDART_INF_F;
            for (int jj = lane; jj < nk; jj += 32) mp = fmaxf(mp, p_s[h][jj]);
            const float m_new = fmaxf(m_s[h], warp_reduce_max(mp));
            float lp = 0.0f;
            for (int jj = lane; jj < nk; jj += 32) {
                const float p = expf(p_s[h][jj] - m_new);
                p_s[h][jj] = p;
                lp += p;
            }
            lp = warp_reduce_sum(lp);
            if (lane == 0) {
                const float f = expf(m_s[h] - m_new);  // 0 on the first partition (m = -inf)
                f_s[h] = f;
                l_s[h] = l_s[h] * f + lp;
                m_s[h] = m_new;
            }
        }
        __syncthreads();
        // 3. acc = acc * f + sum_j p_j v_j: a thread per output element, keys in order
#pragma unroll
        for (int k = 0; k < EPT; ++k) {
            const int e = tid + AS_THREADS * k;
            if (e >= HD) continue;
#pragma unroll
            for (int h = 0; h < AS_GROUP; ++h)  // unrolled: acc stays in registers
                if (h < g) acc[h][k] *= f_s[h];
            for (int jj = 0; jj < nk; ++jj) {
                const long long r = qi.slot(j0 + jj, block_size) * n_kv_heads + kvh;
                const float v = vc.at(r, e);
#pragma unroll
                for (int h = 0; h < AS_GROUP; ++h)
                    if (h < g) acc[h][k] = fmaf(p_s[h][jj], v, acc[h][k]);
            }
        }
        __syncthreads();
    }

    // this split's state -> partial[t][h][split][0..HD+1]: acc, then m, l
#pragma unroll
    for (int h = 0; h < AS_GROUP; ++h) {
        if (h >= g) continue;
        float* ps = partial + (((long long)tl * n_heads + h0 + h) * AS_SPLITS + split) * (HD + 2);
#pragma unroll
        for (int k = 0; k < EPT; ++k)
            if (tid + AS_THREADS * k < HD) ps[tid + AS_THREADS * k] = acc[h][k];
        if (tid == 0) {
            ps[HD] = m_s[h];
            ps[HD + 1] = l_s[h];
        }
    }
    __threadfence();  // the partial is visible before the ticket says so
    __syncthreads();
    int* ticket = tickets + (long long)tl * gridDim.y + blockIdx.y;
    if (tid == 0) last_s = atomicAdd(ticket, 1) == nsplits - 1;
    __syncthreads();
    if (!last_s) return;
    __threadfence();

    // the last block merges the splits 0..nsplits-1 in order, per head
    float* o_row = out + (long long)t * n_heads * HD;
    for (int h = 0; h < g; ++h) {
        const volatile float* ph = partial + ((long long)tl * n_heads + h0 + h) * AS_SPLITS * (HD + 2);
        float mx = -CUDART_INF_F;
        for (int s = 0; s < nsplits; ++s) mx = fmaxf(mx, ph[s * (HD + 2) + HD]);
        float total = 0.0f;
        for (int s = 0; s < nsplits; ++s) total += ph[s * (HD + 2) + HD + 1] * expf(ph[s * (HD + 2) + HD] - mx);
        const float inv = 1.0f / total;
#pragma unroll
        for (int k = 0; k < EPT; ++k) {
            const int e = tid + AS_THREADS * k;
            if (e >= HD) continue;
            float o = 0.0f;
            for (int s = 0; s < nsplits; ++s) o += ph[s * (HD + 2) + e] * expf(ph[s * (HD + 2) + HD] - mx);
            o_row[(h0 + h) * HD + e] = o * inv;
        }
    }
    if (tid == 0) *ticket = 0;  // ready for the next step (and the next graph replay)
    if (!quantize) return;
    __syncthreads();  // this block's output row is written: quantize its 32-value blocks
    const int n = n_heads * HD, first = h0 * HD / 32, blocks = g * HD / 32;
    for (int b = first + warp; b < first + blocks; b += warps) {
        const float v = o_row[b * 32 + lane];
        const float amax = warp_reduce_max(fabsf(v));
        const float dq = amax / 127.0f;
        const float iq = dq != 0.0f ? 1.0f / dq : 0.0f;
        const int qv = (int)roundf(v * iq);
        out_q[(long long)t * n + b * 32 + lane] = (signed char)qv;
        int sum = qv;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(SHARPINF_FULL_MASK, sum, off);
        if (lane == 0) {
            out_d[(long long)t * (n / 32) + b] = dq;
            out_s[(long long)t * (n / 32) + b] = sum;
        }
    }
}

#define AS_ARGS                                                                                                \
    const float *qkv, int qkv_stride, const void *k_cache, const void *v_cache, const int *block_tables,      \
        int max_blocks_per_seq, const int *cu_seqlens, const int *positions, float *out, signed char *out_q,   \
        float *out_d, int *out_s, float *partial, int *tickets, int t0, int n_tokens, int n_seqs, int n_heads,         \
        int n_kv_heads, int block_size, float scale, int quantize
#define AS_PASS(KC, VC)                                                                                        \
    qkv, qkv_stride, KC, VC, block_tables, max_blocks_per_seq, cu_seqlens, positions, out, out_q, out_d, out_s, \
        partial, tickets, t0, n_tokens, n_seqs, n_heads, n_kv_heads, block_size, scale, quantize

template <int HD, typename T>
__device__ __forceinline__ void as_typed(AS_ARGS) {
    const AsKv<T, HD> kc{static_cast<const T*>(k_cache)}, vc{static_cast<const T*>(v_cache)};
    attention_split_impl<HD>(AS_PASS(kc, vc));
}
template <int HD>
__device__ __forceinline__ void as_q8(AS_ARGS) {
    const AsKvQ8<HD> kc{static_cast<const unsigned char*>(k_cache)}, vc{static_cast<const unsigned char*>(v_cache)};
    attention_split_impl<HD>(AS_PASS(kc, vc));
}
#define AS_CALL qkv, qkv_stride, k_cache, v_cache, block_tables, max_blocks_per_seq, cu_seqlens, positions, out, \
        out_q, out_d, out_s, partial, tickets, t0, n_tokens, n_seqs, n_heads, n_kv_heads, block_size, scale, quantize

// One entry per (KV dtype, head_dim), each compiled only when wanted (SHARPINF_WANT, common.cuh).
#if SHARPINF_WANT(attention_split_f32_d16)
extern "C" __global__ void attention_split_f32_d16(AS_ARGS) { as_typed<16, float>(AS_CALL); }
#endif
#if SHARPINF_WANT(attention_split_f32_d32)
extern "C" __global__ void attention_split_f32_d32(AS_ARGS) { as_typed<32, float>(AS_CALL); }
#endif
#if SHARPINF_WANT(attention_split_f32_d64)
extern "C" __global__ void attention_split_f32_d64(AS_ARGS) { as_typed<64, float>(AS_CALL); }
#endif
#if SHARPINF_WANT(attention_split_f32_d128)
extern "C" __global__ void attention_split_f32_d128(AS_ARGS) { as_typed<128, float>(AS_CALL); }
#endif
#if SHARPINF_WANT(attention_split_f32_d256)
extern "C" __global__ void attention_split_f32_d256(AS_ARGS) { as_typed<256, float>(AS_CALL); }
#endif
#if SHARPINF_WANT(attention_split_f16_d16)
extern "C" __global__ void attention_split_f16_d16(AS_ARGS) { as_typed<16, __half>(AS_CALL); }
#endif
#if SHARPINF_WANT(attention_split_f16_d32)
extern "C" __global__ void attention_split_f16_d32(AS_ARGS) { as_typed<32, __half>(AS_CALL); }
#endif
#if SHARPINF_WANT(attention_split_f16_d64)
extern "C" __global__ void attention_split_f16_d64(AS_ARGS) { as_typed<64, __half>(AS_CALL); }
#endif
#if SHARPINF_WANT(attention_split_f16_d128)
extern "C" __global__ void attention_split_f16_d128(AS_ARGS) { as_typed<128, __half>(AS_CALL); }
#endif
#if SHARPINF_WANT(attention_split_f16_d256)
extern "C" __global__ void attention_split_f16_d256(AS_ARGS) { as_typed<256, __half>(AS_CALL); }
#endif
#if SHARPINF_WANT(attention_split_bf16_d16)
extern "C" __global__ void attention_split_bf16_d16(AS_ARGS) { as_typed<16, __nv_bfloat16>(AS_CALL); }
#endif
#if SHARPINF_WANT(attention_split_bf16_d32)
extern "C" __global__ void attention_split_bf16_d32(AS_ARGS) { as_typed<32, __nv_bfloat16>(AS_CALL); }
#endif
#if SHARPINF_WANT(attention_split_bf16_d64)
extern "C" __global__ void attention_split_bf16_d64(AS_ARGS) { as_typed<64, __nv_bfloat16>(AS_CALL); }
#endif
#if SHARPINF_WANT(attention_split_bf16_d128)
extern "C" __global__ void attention_split_bf16_d128(AS_ARGS) { as_typed<128, __nv_bfloat16>(AS_CALL); }
#endif
#if SHARPINF_WANT(attention_split_bf16_d256)
extern "C" __global__ void attention_split_bf16_d256(AS_ARGS) { as_typed<256, __nv_bfloat16>(AS_CALL); }
#endif
#if SHARPINF_WANT(attention_split_q8_0_d32)
extern "C" __global__ void attention_split_q8_0_d32(AS_ARGS) { as_q8<32>(AS_CALL); }
#endif
#if SHARPINF_WANT(attention_split_q8_0_d64)
extern "C" __global__ void attention_split_q8_0_d64(AS_ARGS) { as_q8<64>(AS_CALL); }
#endif
#if SHARPINF_WANT(attention_split_q8_0_d128)
extern "C" __global__ void attention_split_q8_0_d128(AS_ARGS) { as_q8<128>(AS_CALL); }
#endif
#if SHARPINF_WANT(attention_split_q8_0_d256)
extern "C" __global__ void attention_split_q8_0_d256(AS_ARGS) { as_q8<256>(AS_CALL); }
#endif
