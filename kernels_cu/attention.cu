// attention.cu -- varlen paged causal attention over a packed batch (prefill chunks and
// decodes alike), reading keys and values through each sequence's block table.
//
//   attention_<kv>_d<HD>(qkv, qkv_stride, k_cache, v_cache, block_tables, max_blocks_per_seq,
//                        cu_seqlens, positions, out, n_tokens, n_seqs, n_heads, n_kv_heads,
//                        head_dim, block_size, scale, softcap, sinks, has_sinks, sliding_window)
//   (HD = head_dim: 16, 32, 64, 128 or 256)
// <kv> in f16, bf16, f32, q8_0 (the cache layouts of kv_cache.cu); q8_0 needs head_dim 32 and up.
//
// Inputs:
//   qkv: float32 rows of stride qkv_stride; Q of token t, head h at qkv[t*qkv_stride + h*head_dim].
//   k_cache, v_cache: one layer's paged cache (see kv_cache.cu); this step's K/V already written.
//   block_tables: int32 [n_seqs, max_blocks_per_seq]; position j of sequence s lives in slot
//     block_tables[s*max_blocks_per_seq + j/block_size]*block_size + j%block_size.
//   cu_seqlens: int32 [n_seqs+1]; sequence s owns tokens cu_seqlens[s] .. cu_seqlens[s+1]-1.
//   positions: int32 [n_tokens], the absolute position of each query token.
//   out: float32 [n_tokens, n_heads*head_dim].
// Query token t (sequence s, position p), head h reads KV head h / (n_heads/n_kv_heads) at
// positions lo..p of sequence s only: out = softmax(cap(scale * q.K^T)) V, in float (cap: softcap.cuh's,
// softcap > 0 -- gemma2 -- else none). lo = 0, or with a
// sliding window (sliding_window = W > 0: gemma3's local layers) lo = max(0, p - W + 1) -- W keys,
// its own included, llama.cpp's is_masked_swa edge. sinks: float32 [n_heads] (has_sinks != 0: gpt-oss),
// head h's logit joins the softmax's max and sum, no key, no value -- sinks.cuh, at the lanes' merge.
//
// Design: one warp per (token, head). Lane l takes keys j = l, l+32, ... <= p and keeps its
// own online-softmax state (max m, sum l) and a head_dim accumulator in registers; no
// communication inside the key loop. At the end the 32 states are merged: warp max of m,
// rescale, warp sum of l, and the accumulators are summed by a recursive-halving
// reduce-scatter (head_dim*31/32 shuffles in all, instead of 5*head_dim), after which each
// lane owns head_dim/32 output elements (lane pairs share one for head_dim 16).
// Batch invariance: every operation and its order depends only on (q, p, the sequence's
// keys/values), never on what else is in the batch or on which physical blocks hold the keys:
// results are bit-identical under packing and placement.
// Bound: memory -- each (token, query head) reads its context's K/V rows once, so a KV row is read
// n_heads / n_kv_heads times per token. head_dim 256 keeps a 256-float accumulator per lane:
// readable, and it spills on a GPU (the split and flash variants are the fast ones there).
// Launch: block = (32*WARPS) threads with WARPS = 4 (1..ATTN_MAX_WARPS works), grid =
// (n_tokens, ceil(n_heads / WARPS)); warp w of block (t, y) takes head y*WARPS + w.
// Shared memory: static q staging only (ATTN_MAX_WARPS * head_dim floats); ATTN_MAX_WARPS = 8.
#include "common.cuh"
#include "sinks.cuh"

#define ATTN_MAX_WARPS 8

// ---- which sequence and keys a query token sees (the only place packing is looked at) ----
struct QueryInfo {
    int seq;        // sequence index
    int pos;        // absolute position; keys 0..pos are visible
    const int* table;  // this sequence's block table row

    __device__ __forceinline__ QueryInfo(int t, const int* cu_seqlens, int n_seqs, const int* positions,
                                         const int* block_tables, int max_blocks_per_seq) {
        // largest s with cu_seqlens[s] <= t (binary search; empty sequences are skipped naturally)
        int lo = 0, hi = n_seqs - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (cu_seqlens[mid] <= t) lo = mid; else hi = mid - 1;
        }
        seq = lo;
        pos = positions[t];
        table = block_tables + (long long)seq * max_blocks_per_seq;
    }
    // physical slot of this sequence's position j (0 <= j <= pos)
    __device__ __forceinline__ long long slot(int j, int block_size) const {
        return (long long)table[j / block_size] * block_size + j % block_size;
    }
};

// ---- KV row access per cache type: dot(q, K row) and acc += p * V row, head_dim = HD ----
template <typename T, int HD>
struct KvTyped {
    const T* base;
    __device__ __forceinline__ const T* row(long long r) const { return base + r * HD; }
    __device__ __forceinline__ float dot(const float* q, long long r) const {
        const T* k = row(r);
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < HD; ++e) s += q[e] * to_float(k[e]);
        return s;
    }
    __device__ __forceinline__ void axpy(float (&acc)[HD], float p, long long r) const {
        const T* v = row(r);
#pragma unroll
        for (int e = 0; e < HD; ++e) acc[e] += p * to_float(v[e]);
    }
};

template <int HD>
struct KvQ8 {
    const unsigned char* base;
    static_assert(HD % 32 == 0, "q8_0 needs head_dim a multiple of 32");
    static constexpr int NB = HD / 32;
    __device__ __forceinline__ const unsigned char* row(long long r) const { return base + r * (NB * 34); }
    __device__ __forceinline__ float dot(const float* q, long long r) const {
        const unsigned char* k = row(r);
        float s = 0.0f;
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            const unsigned char* blk = k + b * 34;
            const float d = to_float(*reinterpret_cast<const __half*>(blk));
#pragma unroll
            for (int e = 0; e < 32; ++e) s += q[b * 32 + e] * (d * (float)(signed char)blk[2 + e]);
        }
        return s;
    }
    __device__ __forceinline__ void axpy(float (&acc)[HD], float p, long long r) const {
        const unsigned char* v = row(r);
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            const unsigned char* blk = v + b * 34;
            const float d = to_float(*reinterpret_cast<const __half*>(blk));
#pragma unroll
            for (int e = 0; e < 32; ++e) acc[b * 32 + e] += p * (d * (float)(signed char)blk[2 + e]);
        }
    }
};

// ---- merge: acc summed over the 32 lanes, scattered so each lane keeps a slice ----
// After stage `off`, a lane keeps the half of its current slice selected by (lane & off);
// N is the live slice length. Returns (through base) the first element index of the slice.
template <int N, int OFF>
struct ReduceScatter {
    template <int HD>
    __device__ __forceinline__ static void run(float (&a)[HD], int lane, int& base) {
        if constexpr (N >= 2) {
            constexpr int H = N / 2;
            const bool upper = (lane & OFF) != 0;
#pragma unroll
            for (int i = 0; i < H; ++i) {
                const float send = upper ? a[i] : a[i + H];
                const float keep = upper ? a[i + H] : a[i];
                a[i] = keep + __shfl_xor_sync(SHARPINF_FULL_MASK, send, OFF);
            }
            if (upper) base += H;
            if constexpr (OFF > 1) ReduceScatter<H, OFF / 2>::run(a, lane, base);
        } else {
            a[0] += __shfl_xor_sync(SHARPINF_FULL_MASK, a[0], OFF);
            if constexpr (OFF > 1) ReduceScatter<1, OFF / 2>::run(a, lane, base);
        }
    }
};

template <int HD, typename KV>
__device__ __forceinline__ void attention_impl(const float* qkv, int qkv_stride, KV kc, KV vc,
                                               const int* block_tables, int max_blocks_per_seq,
                                               const int* cu_seqlens, const int* positions, float* out,
                                               int n_tokens, int n_seqs, int n_heads, int n_kv_heads,
                                               int block_size, float scale, float softcap, const float* sinks,
                                               int has_sinks, int sliding_window) {
    __shared__ float q_s[ATTN_MAX_WARPS][HD];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int t = blockIdx.x;
    const int h = blockIdx.y * (blockDim.x >> 5) + warp;
    if (t >= n_tokens || h >= n_heads || warp >= ATTN_MAX_WARPS) return;  // warp-uniform
    const QueryInfo qi(t, cu_seqlens, n_seqs, positions, block_tables, max_blocks_per_seq);
    const int kvh = h / (n_heads / n_kv_heads);

    const float* q = qkv + (long long)t * qkv_stride + h * HD;
    for (int e = lane; e < HD; e += 32) q_s[warp][e] = q[e];
    __syncwarp();

    float m = -CUDART_INF_F, l = 0.0f, acc[HD];
#pragma unroll
    for (int e = 0; e < HD; ++e) acc[e] = 0.0f;

    const int lo = sliding_window > 0 ? max(0, qi.pos - sliding_window + 1) : 0;  // first visible key
    for (int j = lo + lane; j <= qi.pos; j += 32) {
        const long long r = qi.slot(j, block_size) * n_kv_heads + kvh;
        const float s = sharpinf_softcap(kc.dot(q_s[warp], r) * scale, softcap);
        float p;
        if (s > m) {  // new running max: rescale what this lane has so far
            const float f = expf(m - s);
            l *= f;
#pragma unroll
            for (int e = 0; e < HD; ++e) acc[e] *= f;
            m = s;
            p = 1.0f;
        } else {
            p = expf(s - m);
        }
        l += p;
        vc.axpy(acc, p, r);
    }

    // merge the 32 lane states (every query has key pos itself, so the max is finite), the sink's
    // logit z in the max and the sum (none: -inf, the same bits)
    const float z = sharpinf_sink(sinks, has_sinks, h);
    const float mx = fmaxf(warp_reduce_max(m), z);
    const float f = expf(m - mx);  // 0 for a lane that saw no key (m = -inf)
    const float total = sharpinf_sink_sum(warp_reduce_sum(l * f), z, mx);
#pragma unroll
    for (int e = 0; e < HD; ++e) acc[e] *= f;
    int base = 0;
    ReduceScatter<HD, 16>::run(acc, lane, base);
    constexpr int KEEP = HD >= 32 ? HD / 32 : 1;
    const float inv = 1.0f / total;
    float* o = out + (long long)t * n_heads * HD + h * HD + base;
    if (HD >= 32 || (lane & (32 / HD - 1)) == 0) {
#pragma unroll
        for (int i = 0; i < KEEP; ++i) o[i] = acc[i] * inv;
    }
}

#define ATTN_ARGS                                                                                        \
    const float *qkv, int qkv_stride, const void *k_cache, const void *v_cache, const int *block_tables,  \
        int max_blocks_per_seq, const int *cu_seqlens, const int *positions, float *out, int n_tokens,     \
        int n_seqs, int n_heads, int n_kv_heads, int head_dim, int block_size, float scale, float softcap,     \
        const float *sinks, int has_sinks, int sliding_window
#define ATTN_PASS(KC, VC)                                                                                   \
    qkv, qkv_stride, KC, VC, block_tables, max_blocks_per_seq, cu_seqlens, positions, out, n_tokens, n_seqs, \
        n_heads, n_kv_heads, block_size, scale, softcap, sinks, has_sinks, sliding_window

template <int HD, typename T>
__device__ __forceinline__ void attention_typed(ATTN_ARGS) {
    const KvTyped<T, HD> kc{static_cast<const T*>(k_cache)}, vc{static_cast<const T*>(v_cache)};
    attention_impl<HD>(ATTN_PASS(kc, vc));
}

template <int HD>
__device__ __forceinline__ void attention_q8(ATTN_ARGS) {
    const KvQ8<HD> kc{static_cast<const unsigned char*>(k_cache)}, vc{static_cast<const unsigned char*>(v_cache)};
    attention_impl<HD>(ATTN_PASS(kc, vc));
}

#define ATTN_PASS_ALL                                                                                        \
    qkv, qkv_stride, k_cache, v_cache, block_tables, max_blocks_per_seq, cu_seqlens, positions, out, n_tokens, \
        n_seqs, n_heads, n_kv_heads, head_dim, block_size, scale, softcap, sinks, has_sinks, sliding_window

// One entry per (KV dtype, head_dim), attention_<kv>_d<HD> (registers sized for HD), each compiled
// only when wanted (SHARPINF_KV_HD_ENTRIES, common.cuh).
SHARPINF_KV_HD_ENTRIES(attention, SHARPINF_NO_ATTRS, (ATTN_ARGS), attention_typed, attention_q8, ATTN_PASS_ALL)
