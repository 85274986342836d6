// attention_split.cu -- as attention.cu, split-KV (flash-decoding): a query's keys in fixed
// partitions, SPLITS blocks a (token, KV head group), merged in a fixed order.
//
//   attention_split_<kv>_d<HD>(qkv, qkv_stride, k_cache, v_cache, block_tables, max_blocks_per_seq,
//       cu_seqlens, positions, out, out_q, out_d, out_s, partial, tickets, t0, n_tokens, n_seqs, n_heads,
//       n_kv_heads, block_size, scale, softcap, sinks, has_sinks, sliding_window, quantize)
//   attention_split_walk_<kv>_d<HD>(the same; partial, tickets unused): the same outputs, bit for bit,
//       from one block a (token, head group) -- the walk, below.
//   Inputs as attention.cu. out: float [n_tokens, n_heads * HD]; with quantize != 0 also in q8_1 (out_q
//   int8, out_d float, out_s int per 32 values: quant_act.py's rule), the dp4a o-projection's input.
//   partial: float scratch [n_tokens, n_heads, SPLITS, HD + 2]; tickets: int [n_tokens, n_kv_heads *
//   groups], zero before the first launch and left zero (graphs replay it). A launch runs the tokens
//   t0 .. t0 + gridDim.x - 1 and indexes partial and tickets from t0 (a long step, in windows).
//
// Design: partitions of PART = 64 keys at fixed absolute positions; split s of SPLITS = 16 takes
// partitions s, s + 16, ...; the block of (token, group) that finishes last (an atomic ticket) merges
// the splits in split order. A block serves up to GROUP = 4 query heads of a KV head (GQA): each K/V
// row is loaded once for them all. Latency first: the queries load before the position is known; a
// partition's cache rows are looked up once, by 64 threads, into shared memory; K and V rows are read
// 8 elements a load, FETCH = 4 loads (2 of f32; kv_rows.cuh) issued before the first is unpacked;
// scores: two threads a key, each half of head_dim, one shuffle; P V: a thread per (8-element column
// group, key slice), the slices summed in slice order. The merge loads every head's split maxima and
// sums in one round, the output values' split values in another, and makes the q8_1 copy from the
// values its warps hold. A context of <= 64 keys is one split, which writes the output itself (the
// merge's bits). A sliding window skips the partitions wholly before a query's first visible key and
// masks the keys below it without reading them (their blocks may be freed); a split left with no
// partition merges in with weight 0.
// The walk: pass 1 (two splits or more): each head's largest score over every partition (the same
// scores, so the merge's maximum: fmaxf is exact in any order); pass 2: split s = 0, 1, ...: its state,
// f = exp(m_s - mx), total += l_s f, o += o_s f -- the merge's sums, term by term in split order --
// then o * (1 / total). A sink (gpt-oss, sinks.cuh) enters these sums only (the merge's, the walk's, one
// split's), once a (token, head): in the maximum over the splits and last in total (one split: factor
// exp(m - max(m, z))). The merge's and the walk's sums are explicit fmas (__fmaf_rn): NVRTC contracts
// a * b + c by default and g++ -O1 does not. ops/attention.py's split_shape picks the shape a step takes.
// Launch: grid = (window tokens, n_kv_heads * ceil(g / 4), SPLITS) (the walk: gridDim.z = 1), block
// 128, __launch_bounds__(128, 4); ~8.5 KB static shared memory at head_dim 128 (the walk 0.5 KB more).
// Batch invariance: a query's arithmetic depends only on its position and its own keys -- partitions,
// splits, the threads of a key, the walk order, the slice sum and the merge order are fixed by
// absolute key positions and head_dim: bit-identical alone, packed, chunked, in other blocks, under
// graphs, in either shape (tests/test_kernels_attention.py compares the two).
// Bound: at decode, latency -- the split block's chain: position and queries, block table, K (2
// rounds), V (2 rounds), the arrival's fences and atomic, the merge (2 rounds); the walk's: ~2 rounds
// a partition in pass 1, ~4 in pass 2 (a 64-sequence decode at 513 keys: 512 blocks of 9 partitions,
// one wave, ~30-45 us a layer, estimated). At long context, memory: each K/V byte of a query's
// context read once per (token, block of heads).
#include "common.cuh"
#include "kv_rows.cuh"
#include "sinks.cuh"

#define AS_PART 64      // keys per partition
#define AS_SPLITS 16    // blocks per (token, KV head group)
#define AS_GROUP 4      // query heads per block (larger GQA groups take several blocks)
#define AS_THREADS 128  // 4 warps

// A block's shape at head_dim HD and KV reader KV.
template <int HD, typename KV> struct AsShape {
    static constexpr int COLS = HD / AS_VEC;                   // 8-element column groups of a row
    static constexpr int SLICES = AS_THREADS / COLS;           // key slices in P V
    static constexpr int HALF_CHUNKS = HD / 2 / AS_VEC;        // loads per thread per key in the scores
    static constexpr int KEYS_PER_SLICE = AS_PART / SLICES;    // keys a P V thread walks in a partition
    // row pieces fetched before the first is used (kv_rows.cuh's FETCH): one round trip for them all
    static constexpr int K_FETCH = HALF_CHUNKS < KV::FETCH ? HALF_CHUNKS : KV::FETCH;
    static constexpr int V_FETCH = KEYS_PER_SLICE < KV::FETCH ? KEYS_PER_SLICE : KV::FETCH;
    static_assert(HD % 16 == 0 && SLICES >= 1, "head_dim must be a multiple of 16, at most 1024");
    static_assert(AS_PART % SLICES == 0 && HALF_CHUNKS % K_FETCH == 0 && KEYS_PER_SLICE % V_FETCH == 0, "batches");
};

// The shared memory of a block, either launch shape.
#define AS_SHARED(HD, SH)                                                                                  \
    __shared__ __align__(16) float q_s[AS_GROUP][HD];                                                      \
    __shared__ float p_s[AS_GROUP][AS_PART];  /* scores, then weights, of one partition */                \
    __shared__ long long row_s[AS_PART];      /* cache row (slot * n_kv_heads + kv head) of each key */  \
    __shared__ float red_s[SH::SLICES * HD];  /* the slices' P V sums of one head */                      \
    __shared__ float m_s[AS_GROUP], l_s[AS_GROUP], f_s[AS_GROUP]

// 0. + 1. of a partition: its cache rows, one key per thread (keys below the window are never looked
// up or read: their blocks may have been freed), then its scores into p_s (scaled; -inf below the
// window): threads 2k and 2k + 1 take key k, each half of head_dim, one shuffle adds them; a thread's
// loads of its half row all issued (K_FETCH at a time) before it uses the first. p_s is ready after
// the caller's __syncthreads.
template <int HD, typename KV>
SHARPINF_SHARED_FN void as_scores(KV kc, const AsQuery& qi, int j0, int nk, int lo, int g, int block_size,
                                          int n_kv_heads, int kvh, float scale, float softcap, const float (*q_s)[HD],
                                          long long* row_s, float (*p_s)[AS_PART]) {
    using SH = AsShape<HD, KV>;
    const int tid = threadIdx.x;
    if (tid < nk && j0 + tid >= lo) row_s[tid] = qi.slot(j0 + tid, block_size) * n_kv_heads + kvh;
    __syncthreads();
    const int kk = tid >> 1, e_half = (tid & 1) * (HD / 2);
    float s[AS_GROUP];
#pragma unroll
    for (int h = 0; h < AS_GROUP; ++h) s[h] = 0.0f;
    if (kk < nk && j0 + kk >= lo) {
        const long long r = row_s[kk];
#pragma unroll
        for (int c0 = 0; c0 < SH::HALF_CHUNKS; c0 += SH::K_FETCH) {
            typename KV::Raw raw[SH::K_FETCH];
#pragma unroll
            for (int c = 0; c < SH::K_FETCH; ++c) raw[c] = kc.fetch(r, e_half + (c0 + c) * AS_VEC);
#pragma unroll
            for (int c = 0; c < SH::K_FETCH; ++c) {
                const int e0 = e_half + (c0 + c) * AS_VEC;
                float kv[AS_VEC];
                kc.unpack(raw[c], kv);
#pragma unroll
                for (int h = 0; h < AS_GROUP; ++h)
                    if (h < g)
#pragma unroll
                        for (int i = 0; i < AS_VEC; ++i) s[h] = fmaf(q_s[h][e0 + i], kv[i], s[h]);
            }
        }
    }
#pragma unroll
    for (int h = 0; h < AS_GROUP; ++h) s[h] += __shfl_xor_sync(SHARPINF_FULL_MASK, s[h], 1);
    if ((tid & 1) == 0 && kk < nk)
#pragma unroll
        for (int h = 0; h < AS_GROUP; ++h)
            if (h < g) p_s[h][kk] = j0 + kk >= lo ? sharpinf_softcap(s[h] * scale, softcap) : -CUDART_INF_F;
}

// One split's state of the block's g heads: m_s, l_s (shared) and this thread's P V share acc, over
// partitions split, split + SPLITS, ... from the first at or after the window's. Both launch shapes
// run this, so a query's split states have the same bits in either.
template <int HD, typename KV>
SHARPINF_SHARED_FN void as_split_state(int split, KV kc, KV vc, const AsQuery& qi, int lo, int g, int block_size,
                                               int n_kv_heads, int kvh, float scale, float softcap, const float (*q_s)[HD],
                                               long long* row_s, float (*p_s)[AS_PART], float* m_s, float* l_s,
                                               float* f_s, float (&acc)[AS_GROUP][AS_VEC]) {
    using SH = AsShape<HD, KV>;
    constexpr int SLICES = SH::SLICES, V_FETCH = SH::V_FETCH;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = AS_THREADS / 32;
    if (tid < AS_GROUP) {
        m_s[tid] = -CUDART_INF_F;
        l_s[tid] = 0.0f;
    }
    const int slice = tid / SH::COLS, e_pv = (tid % SH::COLS) * AS_VEC;  // this thread's P V share
#pragma unroll
    for (int h = 0; h < AS_GROUP; ++h)
#pragma unroll
        for (int i = 0; i < AS_VEC; ++i) acc[h][i] = 0.0f;
    const int part_lo = lo / AS_PART;  // the first visible key's partition
    const int part0 = part_lo <= split ? split : split + (part_lo - split + AS_SPLITS - 1) / AS_SPLITS * AS_SPLITS;
    for (int part = part0; part * AS_PART <= qi.pos; part += AS_SPLITS) {
        const int j0 = part * AS_PART, nk = min(AS_PART, qi.pos + 1 - j0);
        as_scores<HD>(kc, qi, j0, nk, lo, g, block_size, n_kv_heads, kvh, scale, softcap, q_s, row_s, p_s);
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
            __syncwarp();  // every lane has read m_s[h] above before lane 0 replaces it (shuffles order no memory)
            if (lane == 0) {
                const float f = expf(m_s[h] - m_new);  // 0 on the first partition (m = -inf)
                f_s[h] = f;
                l_s[h] = l_s[h] * f + lp;
                m_s[h] = m_new;
            }
        }
        __syncthreads();
        // 3. acc = acc * f + sum over this slice's keys of p_j v_j, keys slice, slice + SLICES, ... in
        //    order; their V rows fetched (V_FETCH at a time) before the first is used
#pragma unroll
        for (int h = 0; h < AS_GROUP; ++h)  // unrolled: acc stays in registers
            if (h < g)
#pragma unroll
                for (int i = 0; i < AS_VEC; ++i) acc[h][i] *= f_s[h];
#pragma unroll
        for (int k0 = 0; k0 < SH::KEYS_PER_SLICE; k0 += V_FETCH) {
            typename KV::Raw raw[V_FETCH];
#pragma unroll
            for (int k = 0; k < V_FETCH; ++k) {
                const int jj = slice + (k0 + k) * SLICES;
                if (jj < nk && j0 + jj >= lo) raw[k] = vc.fetch(row_s[jj], e_pv);
            }
#pragma unroll
            for (int k = 0; k < V_FETCH; ++k) {
                const int jj = slice + (k0 + k) * SLICES;
                if (jj >= nk || j0 + jj < lo) continue;  // below the window: weight 0, skipping it leaves acc as it was
                float v[AS_VEC];
                vc.unpack(raw[k], v);
#pragma unroll
                for (int h = 0; h < AS_GROUP; ++h)
                    if (h < g)
#pragma unroll
                        for (int i = 0; i < AS_VEC; ++i) acc[h][i] = fmaf(p_s[h][jj], v[i], acc[h][i]);
            }
        }
        __syncthreads();  // row_s and p_s are rewritten by the next partition
    }
}

// Value c of token t's output row and of its q8_1 copy: the calling warp holds the 32-value block of c.
SHARPINF_SHARED_FN void as_emit(float* out, signed char* out_q, float* out_d, int* out_s, int t, int n, int c,
                                        float o, int quantize) {
    out[(long long)t * n + c] = o;
    if (quantize) {
        const int b = c / 32;
        q8_1_block(o, out_q + (long long)t * n + b * 32, out_d + (long long)t * (n / 32) + b,
                   out_s + (long long)t * (n / 32) + b);
    }
}

// Both launch shapes' parameters (the entries' AS_ARGS with the caches as KV readers).
#define AS_IMPL_PARAMS                                                                                       \
    const float *qkv, int qkv_stride, KV kc, KV vc, const int *block_tables, int max_blocks_per_seq,        \
        const int *cu_seqlens, const int *positions, float *out, signed char *out_q, float *out_d, int *out_s, \
        float *partial, int *tickets, int t0, int n_tokens, int n_seqs, int n_heads, int n_kv_heads,         \
        int block_size, float scale, float softcap, const float *sinks, int has_sinks, int sliding_window, int quantize

// The block's query heads: g <= GROUP heads of KV head kvh from h0 (blockIdx.y: a KV head's groups of
// GROUP heads in turn -- larger GQA groups take several blocks).
struct AsHeads {
    int kvh, h0, g;
    __device__ __forceinline__ AsHeads(int n_heads, int n_kv_heads) {
        const int group = n_heads / n_kv_heads, groups = (group + AS_GROUP - 1) / AS_GROUP;
        kvh = blockIdx.y / groups;
        h0 = kvh * group + (blockIdx.y % groups) * AS_GROUP;
        g = min(AS_GROUP, kvh * group + group - h0);
    }
};

// The block's query: its heads' rows of Q into q_s (loaded before the position is known: a split past
// the context drops them unused), the token's sequence and position, its splits and first visible key.
struct AsTokenQuery {
    AsQuery qi;
    int nsplits, lo;  // splits holding a partition; the first key a sliding window leaves visible
};
template <int HD>
__device__ __forceinline__ AsTokenQuery as_query(const float* qkv, int qkv_stride, int t, int h0, int g, const int* cu_seqlens,
                                                 int n_seqs, const int* positions, const int* block_tables,
                                                 int max_blocks_per_seq, int sliding_window, float (*q_s)[HD]) {
    for (int i = threadIdx.x; i < g * HD; i += AS_THREADS) q_s[i / HD][i % HD] = qkv[(long long)t * qkv_stride + (h0 + i / HD) * HD + i % HD];
    const AsQuery qi(t, cu_seqlens, n_seqs, positions, block_tables, max_blocks_per_seq);
    return {qi, min(AS_SPLITS, qi.pos / AS_PART + 1), sliding_window > 0 ? max(0, qi.pos - sliding_window + 1) : 0};
}

// Value e of one head's P V output: the slices' sums in red_s added in slice order (from +0).
template <int HD, int SLICES>
__device__ __forceinline__ float as_slice_sum(const float* red_s, int e) {
    float o = 0.0f;
    for (int sl = 0; sl < SLICES; ++sl) o += red_s[sl * HD + e];
    return o;
}

// The split launch: one block a (token, KV head group, split); each writes its split's states, and
// the last block of (token, group) to finish merges them.
template <int HD, typename KV>
__device__ __forceinline__ void attention_split_impl(AS_IMPL_PARAMS) {
    using SH = AsShape<HD, KV>;
    constexpr int SLICES = SH::SLICES;
    AS_SHARED(HD, SH);
    __shared__ float mm_s[AS_GROUP][AS_SPLITS], ml_s[AS_GROUP][AS_SPLITS], sc_s[AS_GROUP][AS_SPLITS], inv_s[AS_GROUP];  // the merge
    const int tid = threadIdx.x;
    const int tl = blockIdx.x, t = t0 + tl, split = blockIdx.z;  // tl: the token in the window
    const AsHeads H(n_heads, n_kv_heads);
    const int kvh = H.kvh, h0 = H.h0, g = H.g;
    if (t >= n_tokens) return;
    const AsTokenQuery Q = as_query<HD>(qkv, qkv_stride, t, h0, g, cu_seqlens, n_seqs, positions, block_tables,
                                        max_blocks_per_seq, sliding_window, q_s);
    const AsQuery& qi = Q.qi;
    const int nsplits = Q.nsplits, lo = Q.lo;
    if (split >= nsplits) return;  // uniform per block
    float acc[AS_GROUP][AS_VEC];
    as_split_state<HD>(split, kc, vc, qi, lo, g, block_size, n_kv_heads, kvh, scale, softcap, q_s, row_s, p_s, m_s, l_s, f_s, acc);
    const int slice = tid / SH::COLS, e_pv = (tid % SH::COLS) * AS_VEC;

    const int n = n_heads * HD;
    // One split (a context of <= 64 keys): its state is the output, the merge's over one split (its
    // maximum max(m, z), factor f = exp(m - that), sum 0 + l f + the sink's) -- with no partial, ticket
    // or merge. Without a sink that is acc / l: f = exp(0) = 1 and 0 + acc = acc (the slice sum starts at
    // +0, so acc is never -0).
    const bool alone = nsplits == 1;
    if (alone && tid < g) {
        const float z = sharpinf_sink(sinks, has_sinks, h0 + tid), mx = fmaxf(m_s[tid], z), f = expf(m_s[tid] - mx);
        sc_s[tid][0] = f;
        inv_s[tid] = 1.0f / sharpinf_sink_sum(__fmaf_rn(l_s[tid], f, 0.0f), z, mx);
    }  // read after the first head's barrier below
    // this split's state -> partial[t][h][split][0..HD+1]: acc (the slices summed in order), then m, l
#pragma unroll
    for (int h = 0; h < AS_GROUP; ++h) {
        if (h >= g) continue;  // uniform per block
#pragma unroll
        for (int i = 0; i < AS_VEC; ++i) red_s[slice * HD + e_pv + i] = acc[h][i];
        __syncthreads();
        float* ps = partial + (((long long)tl * n_heads + h0 + h) * AS_SPLITS + split) * (HD + 2);
        for (int e = tid; e < HD; e += AS_THREADS) {
            const float o = as_slice_sum<HD, SLICES>(red_s, e);
            if (alone) as_emit(out, out_q, out_d, out_s, t, n, (h0 + h) * HD + e, __fmaf_rn(o, sc_s[h][0], 0.0f) * inv_s[h],
                               quantize);  // e over whole warps (HD % 32 == 0 to quantize)
            else ps[e] = o;
        }
        if (tid == 0 && !alone) {
            ps[HD] = m_s[h];
            ps[HD + 1] = l_s[h];
        }
        __syncthreads();
    }
    if (alone) return;
    int* ticket = tickets + (long long)tl * gridDim.y + blockIdx.y;
    if (!sharpinf_last_arrival(ticket, nsplits)) return;

    // the last block merges the splits 0..nsplits-1 in order (L2 loads: other blocks wrote them), every
    // head at once -- a round of loads for the (head, split) maxima and sums, one for the outputs --
    // not a round trip per head and per sum. attention_split_walk_impl below makes the same sums in
    // the same order.
    const float* pb = partial + ((long long)tl * n_heads + h0) * AS_SPLITS * (HD + 2);  // head h0 + h: h * AS_SPLITS rows on
    for (int i = tid; i < g * AS_SPLITS; i += AS_THREADS) {
        const int h = i / AS_SPLITS, s = i % AS_SPLITS;
        if (s >= nsplits) continue;
        mm_s[h][s] = __ldcg(pb + (h * AS_SPLITS + s) * (HD + 2) + HD);
        ml_s[h][s] = __ldcg(pb + (h * AS_SPLITS + s) * (HD + 2) + HD + 1);
    }
    __syncthreads();
    if (tid < g) {  // a thread a head: the maximum (the sink's logit z in it), the rescaled sum, each split's factor
        const int h = tid;
        const float z = sharpinf_sink(sinks, has_sinks, h0 + h);
        float mx = z;
        for (int s = 0; s < nsplits; ++s) mx = fmaxf(mx, mm_s[h][s]);
        float total = 0.0f;
        for (int s = 0; s < nsplits; ++s) total = __fmaf_rn(ml_s[h][s], expf(mm_s[h][s] - mx), total);
        for (int s = 0; s < nsplits; ++s) sc_s[h][s] = expf(mm_s[h][s] - mx);
        inv_s[h] = 1.0f / sharpinf_sink_sum(total, z, mx);
    }
    __syncthreads();
    // Thread i takes value i of the block's g heads (g * HD, a multiple of 32): a warp holds one whole
    // 32-value block of the output row, which it quantizes to q8_1 as it stands (no reload)
    // Every split's value of a thread's next output is loaded before it adds this one's and stores it
    // (as_emit): a load the compiler cannot prove apart from an earlier store waits for it, so loaded
    // after the store each output would cost a round trip of its own (g * HD / 128 of them a thread).
    auto load_splits = [&](int i, float (&x)[AS_SPLITS]) {
        const float* ph = pb + (i / HD) * AS_SPLITS * (HD + 2) + i % HD;
#pragma unroll
        for (int s = 0; s < AS_SPLITS; ++s)
            if (s < nsplits) x[s] = __ldcg(ph + s * (HD + 2));
    };
    float x[AS_SPLITS], next[AS_SPLITS];
    if (tid < g * HD) load_splits(tid, x);
    for (int i = tid; i < g * HD; i += AS_THREADS) {  // uniform per warp
        const int h = i / HD, e = i % HD;
        if (i + AS_THREADS < g * HD) load_splits(i + AS_THREADS, next);
        float o = 0.0f;
#pragma unroll
        for (int s = 0; s < AS_SPLITS; ++s)
            if (s < nsplits) o = __fmaf_rn(x[s], sc_s[h][s], o);
        as_emit(out, out_q, out_d, out_s, t, n, (h0 + h) * HD + e, o * inv_s[h], quantize);
#pragma unroll
        for (int s = 0; s < AS_SPLITS; ++s) x[s] = next[s];
    }
    if (tid == 0) *ticket = 0;  // ready for the next step (and the next graph replay)
}

// The walk launch: one block a (token, KV head group) computes its splits in turn and merges them as
// it goes -- no partial states, tickets or second block's merge. A split's factor is exp(m_s - max over
// the splits), so with two splits or more a first pass over the partitions takes each head's largest
// score (the same scores, so the same maximum: fmaxf is exact in any order); then for s = 0, 1, ...:
// as_split_state, its slices summed in order, total += l_s f_s and o += o_s f_s -- the merge's sums,
// term by term in split order -- and the output o * (1 / total), as the merge and the one-split path
// write it.
template <int HD, typename KV>
__device__ __forceinline__ void attention_split_walk_impl(AS_IMPL_PARAMS) {
    using SH = AsShape<HD, KV>;
    constexpr int SLICES = SH::SLICES, PER = (HD + AS_THREADS - 1) / AS_THREADS;  // output values a thread
    AS_SHARED(HD, SH);
    __shared__ float mx_s[AS_GROUP], tot_s[AS_GROUP], fac_s[AS_GROUP];  // the merge's maximum, sum and this split's factor
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = AS_THREADS / 32;
    const int t = t0 + blockIdx.x;
    const AsHeads H(n_heads, n_kv_heads);
    const int kvh = H.kvh, h0 = H.h0, g = H.g;
    if (t >= n_tokens) return;
    const AsTokenQuery Q = as_query<HD>(qkv, qkv_stride, t, h0, g, cu_seqlens, n_seqs, positions, block_tables,
                                        max_blocks_per_seq, sliding_window, q_s);
    const AsQuery& qi = Q.qi;
    const int nsplits = Q.nsplits, lo = Q.lo;
    if (tid < AS_GROUP) {
        mx_s[tid] = -CUDART_INF_F;
        tot_s[tid] = 0.0f;
    }
    // pass 1 (two splits or more): each head's largest visible score
    if (nsplits > 1)
        for (int part = lo / AS_PART; part * AS_PART <= qi.pos; ++part) {
            const int j0 = part * AS_PART, nk = min(AS_PART, qi.pos + 1 - j0);
            as_scores<HD>(kc, qi, j0, nk, lo, g, block_size, n_kv_heads, kvh, scale, softcap, q_s, row_s, p_s);
            __syncthreads();
            for (int h = warp; h < g; h += warps) {
                float mp = -CUDART_INF_F;
                for (int jj = lane; jj < nk; jj += 32) mp = fmaxf(mp, p_s[h][jj]);
                mp = warp_reduce_max(mp);
                if (lane == 0) mx_s[h] = fmaxf(mx_s[h], mp);
            }
            __syncthreads();  // row_s and p_s are rewritten by the next partition
        }
    // pass 2: the splits in order, each folded into the merge's sums as soon as it is done
    const int slice = tid / SH::COLS, e_pv = (tid % SH::COLS) * AS_VEC;
    float o[AS_GROUP][PER];
#pragma unroll
    for (int h = 0; h < AS_GROUP; ++h)
#pragma unroll
        for (int k = 0; k < PER; ++k) o[h][k] = 0.0f;
    for (int split = 0; split < nsplits; ++split) {
        float acc[AS_GROUP][AS_VEC];
        as_split_state<HD>(split, kc, vc, qi, lo, g, block_size, n_kv_heads, kvh, scale, softcap, q_s, row_s, p_s, m_s, l_s, f_s,
                           acc);
        __syncthreads();  // m_s and l_s are final (a split with no partition to read has no barrier of its own)
        if (tid < g) {  // one split: its own maximum (exp(0) = 1: the one-split path's output); the sink's z in it
            const float mx = fmaxf(nsplits > 1 ? mx_s[tid] : m_s[tid], sharpinf_sink(sinks, has_sinks, h0 + tid));
            mx_s[tid] = mx;  // the sink's weight is taken at it, last in total
            const float sc = expf(m_s[tid] - mx);
            tot_s[tid] = __fmaf_rn(l_s[tid], sc, tot_s[tid]);
            fac_s[tid] = sc;
        }
#pragma unroll
        for (int h = 0; h < AS_GROUP; ++h) {
            if (h >= g) continue;  // uniform per block
#pragma unroll
            for (int i = 0; i < AS_VEC; ++i) red_s[slice * HD + e_pv + i] = acc[h][i];
            __syncthreads();
#pragma unroll
            for (int k = 0; k < PER; ++k) {
                const int e = tid + k * AS_THREADS;
                if (e >= HD) break;
                const float os = as_slice_sum<HD, SLICES>(red_s, e);
                o[h][k] = __fmaf_rn(os, fac_s[h], o[h][k]);
            }
            __syncthreads();  // red_s is rewritten by the next head, m_s and l_s by the next split
        }
    }
    const int n = n_heads * HD;
#pragma unroll
    for (int h = 0; h < AS_GROUP; ++h) {
        if (h >= g) continue;
        const float inv = 1.0f / sharpinf_sink_sum(tot_s[h], sharpinf_sink(sinks, has_sinks, h0 + h), mx_s[h]);
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            const int e = tid + k * AS_THREADS;
            if (e >= HD) break;  // e over whole warps (HD % 32 == 0 to quantize)
            as_emit(out, out_q, out_d, out_s, t, n, (h0 + h) * HD + e, o[h][k] * inv, quantize);
        }
    }
}

#define AS_ARGS                                                                                                \
    const float *qkv, int qkv_stride, const void *k_cache, const void *v_cache, const int *block_tables,      \
        int max_blocks_per_seq, const int *cu_seqlens, const int *positions, float *out, signed char *out_q,   \
        float *out_d, int *out_s, float *partial, int *tickets, int t0, int n_tokens, int n_seqs, int n_heads,         \
        int n_kv_heads, int block_size, float scale, float softcap, const float *sinks, int has_sinks,          \
        int sliding_window, int quantize
#define AS_PASS(KC, VC)                                                                                        \
    qkv, qkv_stride, KC, VC, block_tables, max_blocks_per_seq, cu_seqlens, positions, out, out_q, out_d, out_s, \
        partial, tickets, t0, n_tokens, n_seqs, n_heads, n_kv_heads, block_size, scale, softcap, sinks, has_sinks,    \
        sliding_window, quantize

#define AS_CALL qkv, qkv_stride, k_cache, v_cache, block_tables, max_blocks_per_seq, cu_seqlens, positions, out, \
        out_q, out_d, out_s, partial, tickets, t0, n_tokens, n_seqs, n_heads, n_kv_heads, block_size, scale, softcap, sinks, \
        has_sinks, sliding_window, quantize
// The caches read as their dtype says, then the split launch's kernel or (WALK) the walk's.
template <int HD, bool WALK, typename KV>
__device__ __forceinline__ void as_shape(const KV kc, const KV vc, AS_ARGS) {
    if constexpr (WALK) attention_split_walk_impl<HD>(AS_PASS(kc, vc));
    else attention_split_impl<HD>(AS_PASS(kc, vc));
}
template <int HD, typename T, bool WALK = false>
__device__ __forceinline__ void as_typed(AS_ARGS) {
    const AsKv<T, HD> kc{static_cast<const T*>(k_cache)}, vc{static_cast<const T*>(v_cache)};
    as_shape<HD, WALK>(kc, vc, AS_CALL);
}
template <int HD, bool WALK = false>
__device__ __forceinline__ void as_q8(AS_ARGS) {
    const AsKvQ8<HD> kc{static_cast<const unsigned char*>(k_cache)}, vc{static_cast<const unsigned char*>(v_cache)};
    as_shape<HD, WALK>(kc, vc, AS_CALL);
}
// One entry per (KV dtype, head_dim), attention_split_<kv>_d<HD>, each compiled only when wanted
// (SHARPINF_KV_HD_ENTRIES, common.cuh); ptxas held to 4 blocks an SM (128 registers: unbounded, the
// merge's prefetch of a thread's next output takes one too many).
#define AS_BOUNDS(hd) __launch_bounds__(AS_THREADS, 4)
SHARPINF_KV_HD_ENTRIES(attention_split, AS_BOUNDS, (AS_ARGS), as_typed, as_q8, AS_CALL)

template <int HD, typename T> __device__ __forceinline__ void asw_typed(AS_ARGS) { as_typed<HD, T, true>(AS_CALL); }
template <int HD> __device__ __forceinline__ void asw_q8(AS_ARGS) { as_q8<HD, true>(AS_CALL); }
// The walk's entries, attention_split_walk_<kv>_d<HD> (the same arguments; partial and tickets unused).
SHARPINF_KV_HD_ENTRIES(attention_split_walk, AS_BOUNDS, (AS_ARGS), asw_typed, asw_q8, AS_CALL)
