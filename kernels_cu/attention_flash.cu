// attention_flash.cu -- as attention.cu on tensor cores: varlen paged attention in flash-attention 2's
// per-warp register tiles, inside attention_split.cu's fixed split-KV frame.
//
//   attention_flash_<kv>_d<HD>(qkv, qkv_stride, k_cache, v_cache, block_tables, max_blocks_per_seq,
//       cu_seqlens, positions, out, out_q, out_d, out_s, partial, tickets, t0, n_window, n_seqs, n_heads,
//       n_kv_heads, block_size, scale, sinks, has_sinks, sliding_window, quantize)
//   Inputs and outputs as attention_split.cu (the same scratch: partial float [window, n_heads, SPLITS,
//   HD + 2], tickets int, zero between launches). A launch serves the window of tokens
//   t0 .. t0 + n_window - 1. Launched with gridDim.z = 1 (HD <= 128), the same kernel walks: the same
//   outputs, bit for bit, from one block a (tile, KV head), partial and tickets unused -- see below.
//
// Rows. One block serves one KV head and ROWS query rows, a row being a (token, query head) pair of
// that KV head's GQA group, token-major: the block's tokens are a tile of ROWS / g consecutive tokens
// of ONE sequence (g = n_heads / n_kv_heads), so every K/V tile it stages in shared memory is read
// by ROWS rows. Tiles never straddle sequences: af_find_tile (the one place tiles are derived from
// cu_seqlens) cuts each sequence's tokens in the window into tiles, numbered in sequence order.
// Algorithm, per block (KV head, tile, split): keys in partitions of KT at fixed absolute positions
// (KT = 64; 32 at head_dim 256); split s of SPLITS = 16 takes partitions s, s + 16, ...; per
// partition, one tile through shared memory, f16: the K tile [KT][HD] (cp.async for an f16 cache;
// the others converted on the way); S = Q K^T by mma.m16n8k16 f16 -> f32, each warp its own 16 rows
// (Q via ldmatrix.x4); the online softmax in f32 in the accumulator fragments (a row's max and sum over
// a quad of lanes); the V tile [HD][KT] stored transposed in the same buffer; O += P V, P re-used from
// the S fragments as the A operand (rounded to f16). The last block of (tile, KV head) to finish
// merges each row's splits in split order, as attention_split.cu does, with the q8_1 copy.
// The walk (gridDim.z = 1): pass 1 (two splits or more) K tiles and S = Q K^T only, for each row's
// largest visible score; pass 2: split s = 0, 1, ...: af_split_state, then f = exp(m_s - mx), total +=
// l_s f, o += acc_s f -- the merge's sums in split order (explicit fmas, as attention_split.cu's) --
// and o * (1 / total): twice the scores' mma work (1.5x all the mma), no scratch, tickets or merge.
// A sink (gpt-oss, sinks.cuh) enters the merge's and the walk's sums only, once a row: in the maximum, last in total.
// Rounding: Q, K, V and P are f16 operands (products exact, sums in f32): an f32 cache loses its
// low bits and values beyond 65504 (do not use f32 KV above that); see oracles/tolerances.py.
// Launch: grid = (tiles in the window (bound), n_kv_heads, SPLITS or 1: ops/attention.py's flash_shape),
// block = 32 * WARPS threads (4 warps, ROWS = 64; 2 at head_dim 256, where the walk is compiled out),
// static shared memory <= 38 KB; one block of THREADS an SM is what the tiles are sized for.
// Batch invariance: masking is by absolute position -- key j is visible to row r iff j <= pos(r) (and
// j > pos(r) - W with a sliding window W > 0), the block's partitions starting at the one holding its
// lowest visible key -- and a partition a row cannot see leaves its state bit-unchanged (max
// unchanged, factor 1, weights 0): a row's arithmetic depends only on its position, its Q and its
// keys, not on the other rows of its warp or block, the tile cut, the window, the step, where its KV
// lives, or the launch shape -- so one kernel serves decode and prefill, every cross-path result exact.
// Bound: prefill -- tensor-core math plus one K/V tile read per (tile, partition) (ROWS rows share
// it); decode -- like attention_split.cu, latency of a few dependent loads per partition (the walk:
// ~4-5 us a partition over both passes, estimated; the 8B shape's 512-token prefill in ~40 us a layer).
#include "common.cuh"
#include "kv_rows.cuh"
#include "sinks.cuh"

#define AF_SPLITS 16  // blocks per (tile, KV head): partitions s, s + 16, ...

template <int HD> struct AfShape {
    static constexpr int WARPS = HD <= 128 ? 4 : 2;  // 16 query rows a warp
    static constexpr int ROWS = 16 * WARPS;
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int KT = HD <= 128 ? 64 : 32;  // keys per partition (a K or V tile)
    static constexpr int QS = HD + 8;               // smem row stride of Q and K (halves): no bank conflicts
    static constexpr int VS = KT + 8;               // smem row stride of the transposed V tile
    static constexpr int KV_HALVES = KT * QS > HD * VS ? KT * QS : HD * VS;
};

// The window's tile b: tokens [begin, end) of sequence seq (seq = -1 past the last tile).
// Each thread counts the tiles of a contiguous run of sequences, a block-wide scan turns the counts
// into first-tile numbers, and the thread whose run holds b writes the tile to tile_s.
template <int THREADS>
__device__ __forceinline__ void af_find_tile(int b, const int* cu_seqlens, int n_seqs, int t0, int n_window,
                                             int tpb, int* scan_s, int* tile_s) {
    const int tid = threadIdx.x, per = (n_seqs + THREADS - 1) / THREADS;
    const int s0 = min(n_seqs, tid * per), s1 = min(n_seqs, s0 + per);
    int count = 0;
    for (int s = s0; s < s1; ++s) {
        const int len = min(cu_seqlens[s + 1], t0 + n_window) - max(cu_seqlens[s], t0);
        count += len > 0 ? (len + tpb - 1) / tpb : 0;
    }
    if (tid == 0) tile_s[0] = -1;
    scan_s[tid] = count;
    __syncthreads();
    for (int off = 1; off < THREADS; off <<= 1) {  // inclusive scan (Hillis-Steele)
        const int v = tid >= off ? scan_s[tid - off] : 0;
        __syncthreads();
        scan_s[tid] += v;
        __syncthreads();
    }
    int at = scan_s[tid] - count;
    if (b >= at && b < at + count) {
        for (int s = s0; s < s1; ++s) {
            const int lo = max(cu_seqlens[s], t0), hi = min(cu_seqlens[s + 1], t0 + n_window);
            const int tiles = hi > lo ? (hi - lo + tpb - 1) / tpb : 0;
            if (b < at + tiles) {
                tile_s[0] = s;
                tile_s[1] = lo + (b - at) * tpb;
                tile_s[2] = min(hi, tile_s[1] + tpb);
                break;
            }
            at += tiles;
        }
    }
    __syncthreads();
}

__device__ __forceinline__ unsigned af_load2(const __half* p) { return *reinterpret_cast<const unsigned*>(p); }

// The shared memory of a block, either launch shape.
#define AF_SHARED(S)                                                                                 \
    __shared__ __align__(16) __half q_s[S::ROWS * S::QS];                                            \
    __shared__ __align__(16) __half kv_s[S::KV_HALVES]; /* the K tile, then the transposed V tile */ \
    __shared__ long long row_s[S::KT]; /* cache row (slot * n_kv_heads + kv head) of each key */     \
    __shared__ int pos_s[S::ROWS];     /* each row's position, -1 for no row */                      \
    __shared__ int scan_s[S::THREADS], tile_s[3]

// What a block knows of its tile: tokens [begin, begin + rows / g) of sequence seq (seq < 0: no tile).
struct AfTile {
    int seq, begin, rows;
    int maxpos, wmax;       // the block's and this warp's largest position
    int block_lo, warp_lo;  // the lowest key the block and this warp may see
    int nsplits;            // splits holding a partition some row sees
};

// The block's tile and its rows' positions (pos_s), the bounds above.
template <int HD>
__device__ __forceinline__ AfTile af_tile(const int* cu_seqlens, const int* positions, int t0, int n_window, int n_seqs,
                                          int g, int W, int* pos_s, int* scan_s, int* tile_s) {
    using S = AfShape<HD>;
    constexpr int ROWS = S::ROWS, KT = S::KT;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    AfTile T;
    af_find_tile<S::THREADS>(blockIdx.x, cu_seqlens, n_seqs, t0, n_window, ROWS / g, scan_s, tile_s);
    T.seq = tile_s[0];
    if (T.seq < 0) return T;  // past the window's last tile (whose tile_s[1..2] nobody wrote)
    T.begin = tile_s[1];
    T.rows = (tile_s[2] - tile_s[1]) * g;
    for (int r = tid; r < ROWS; r += S::THREADS) pos_s[r] = r < T.rows ? positions[T.begin + r / g] : -1;
    __syncthreads();
    int maxpos = -1, wmax = -1;
    constexpr int NO_ROW = 0x7fffffff;
    int minpos = NO_ROW, wmin = NO_ROW;  // the smallest positions (rows of the tile only)
    for (int r = lane; r < ROWS; r += 32) {
        maxpos = max(maxpos, pos_s[r]);
        if (r / 16 == warp) wmax = max(wmax, pos_s[r]);
        if (r < T.rows) {
            minpos = min(minpos, pos_s[r]);
            if (r / 16 == warp) wmin = min(wmin, pos_s[r]);
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        maxpos = max(maxpos, __shfl_xor_sync(SHARPINF_FULL_MASK, maxpos, off));
        wmax = max(wmax, __shfl_xor_sync(SHARPINF_FULL_MASK, wmax, off));
        minpos = min(minpos, __shfl_xor_sync(SHARPINF_FULL_MASK, minpos, off));
        wmin = min(wmin, __shfl_xor_sync(SHARPINF_FULL_MASK, wmin, off));
    }
    // the lowest visible key of the block and of this warp (lo(p) = max(0, p - W + 1) grows with p)
    T.maxpos = maxpos;
    T.wmax = wmax;
    T.block_lo = W > 0 ? max(0, minpos - W + 1) : 0;
    T.warp_lo = W > 0 && wmin != NO_ROW ? max(0, wmin - W + 1) : 0;
    T.nsplits = min(AF_SPLITS, maxpos / KT + 1);
    return T;
}

// Q rows -> f16 in shared memory (rows past the tile: zeros); a thread's pairs loaded QB at a time
// before the first is stored (stored one by one, a full tile's 32 pairs a thread would take ~32
// round trips in a row)
template <int HD>
__device__ __forceinline__ void af_stage_q(const float* qkv, int qkv_stride, const AfTile& T, int g, int kvh, __half* q_s) {
    using S = AfShape<HD>;
    constexpr int ROWS = S::ROWS, THREADS = S::THREADS, QS = S::QS;
    constexpr int QPAIRS = ROWS * HD / 2 / THREADS, QB = QPAIRS < 8 ? QPAIRS : 8;
    static_assert(ROWS * HD / 2 % THREADS == 0 && QPAIRS % QB == 0, "Q pairs a thread");
    const int tid = threadIdx.x;
#pragma unroll
    for (int k0 = 0; k0 < QPAIRS; k0 += QB) {
        float a[QB], b[QB];
#pragma unroll
        for (int k = 0; k < QB; ++k) {
            const int i = tid + (k0 + k) * THREADS, r = i / (HD / 2), e = 2 * (i % (HD / 2));
            a[k] = b[k] = 0.0f;
            if (r < T.rows) {
                const float* q = qkv + (long long)(T.begin + r / g) * qkv_stride + (kvh * g + r % g) * HD + e;
                a[k] = q[0];
                b[k] = q[1];
            }
        }
#pragma unroll
        for (int k = 0; k < QB; ++k) {
            const int i = tid + (k0 + k) * THREADS, r = i / (HD / 2), e = 2 * (i % (HD / 2));
            *reinterpret_cast<unsigned*>(q_s + r * QS + e) = kv_pack_half2(a[k], b[k]);
        }
    }
}

// Partition j0 / KT's cache rows (row_s) and K tile [KT][HD] (kv_s), ready to read: nk keys from j0,
// the first jv of them below the block's lowest visible key -- neither looked up nor read (their
// blocks may have been freed): zeros stand in, as for the keys past nk (masked, but garbage could be NaN)
template <int HD, typename KV>
__device__ __forceinline__ void af_stage_k(KV kc, const int* table, int j0, int nk, int jv, int block_size,
                                           int n_kv_heads, int kvh, long long* row_s, __half* kv_s) {
    using S = AfShape<HD>;
    constexpr int KT = S::KT, QS = S::QS;
    const int tid = threadIdx.x;
    if (tid < KT) row_s[tid] = tid < nk && tid >= jv ? ((long long)table[(j0 + tid) / block_size] * block_size + (j0 + tid) % block_size) * n_kv_heads + kvh : 0;
    __syncthreads();
    for (int c = tid; c < KT * HD / 8; c += S::THREADS) {
        const int j = c / (HD / 8), e0 = (c % (HD / 8)) * 8;
        if (j < nk && j >= jv) kv_stage8(kc, row_s[j], e0, kv_s + j * QS + e0);
        else *reinterpret_cast<uint4*>(kv_s + j * QS + e0) = make_uint4(0u, 0u, 0u, 0u);
    }
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
}

// S = Q K^T of this warp's 16 rows and the staged tile's keys, scaled and masked by absolute
// position (a key row h of the fragment cannot see: -inf): rows ra (i = 0, 1) and ra + 8 (i = 2, 3)
template <int HD>
__device__ __forceinline__ void af_scores(const __half* q_s, const __half* kv_s, int j0, const int (&pos_r)[2], int W,
                                          float scale, float (&s)[AfShape<HD>::KT / 8][4]) {
    using S = AfShape<HD>;
    constexpr int NT = S::KT / 8, KS = HD / 16, QS = S::QS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, quad = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[n][i] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
        unsigned a[4];
        ldmatrix_x4(a, q_s + (16 * warp + (lane & 15)) * QS + ks * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const __half* kr = kv_s + (n * 8 + quad) * QS + ks * 16 + 2 * t4;
            const unsigned b[2] = {af_load2(kr), af_load2(kr + 8)};
            mma_m16n8k16_f16_f32(s[n], a, b, s[n]);
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int j = j0 + n * 8 + 2 * t4 + c;
                const bool seen = j <= pos_r[h] && (W <= 0 || j > pos_r[h] - W);
                s[n][2 * h + c] = seen ? s[n][2 * h + c] * scale : -CUDART_INF_F;
            }
}

// One split's state of this thread's two rows -- max m, sum l and the unnormalised output acc
// (fragment layout) over partitions split, split + SPLITS, ... from the first holding a key the
// block sees. Both launch shapes run this, so a row's split states have the same bits in either.
template <int HD, typename KV>
__device__ __forceinline__ void af_split_state(int split, const AfTile& T, KV kc, KV vc, const int* table, int block_size,
                                               int n_kv_heads, int kvh, float scale, int W, const __half* q_s,
                                               __half* kv_s, long long* row_s, const int (&pos_r)[2], float (&m)[2],
                                               float (&l)[2], float (&acc)[HD / 8][4]) {
    using S = AfShape<HD>;
    constexpr int KT = S::KT, VS = S::VS, NT = KT / 8, DT = HD / 8, PK = KT / 16;
    const int tid = threadIdx.x, lane = tid & 31, quad = lane >> 2, t4 = lane & 3;
    m[0] = m[1] = -CUDART_INF_F;
    l[0] = l[1] = 0.0f;
#pragma unroll
    for (int d = 0; d < DT; ++d)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[d][i] = 0.0f;
    const int part_lo = T.block_lo / KT;
    const int part0 = part_lo <= split ? split : split + (part_lo - split + AF_SPLITS - 1) / AF_SPLITS * AF_SPLITS;
    for (int part = part0; part * KT <= T.maxpos; part += AF_SPLITS) {
        const int j0 = part * KT, nk = min(KT, T.maxpos + 1 - j0);
        // uniform per warp: some row of the warp may see a key here (only saves work: a row that sees
        // none of the partition's keys is left bit-unchanged either way)
        const bool active = T.wmax >= j0 && T.warp_lo < j0 + KT;
        const int jv = max(0, T.block_lo - j0);  // the partition's first key the block may read
        af_stage_k<HD>(kc, table, j0, nk, jv, block_size, n_kv_heads, kvh, row_s, kv_s);
        unsigned pa[PK][4];  // P as the A operand of P V: k-step kk holds key tiles 2kk and 2kk + 1
        float f[2] = {1.0f, 1.0f};
        if (active) {
            float s[NT][4];
            af_scores<HD>(q_s, kv_s, j0, pos_r, W, scale, s);
            // online softmax per row (rows ra: i = 0, 1; ra + 8: i = 2, 3)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float mx = -CUDART_INF_F;
#pragma unroll
                for (int n = 0; n < NT; ++n)
#pragma unroll
                    for (int c = 0; c < 2; ++c) mx = fmaxf(mx, s[n][2 * h + c]);
                mx = fmaxf(mx, __shfl_xor_sync(SHARPINF_FULL_MASK, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(SHARPINF_FULL_MASK, mx, 2));
                const float m_new = fmaxf(m[h], mx);
                // a row that has seen no key yet keeps m = -inf: factor 1 and weights 0 (not NaN)
                f[h] = m_new == -CUDART_INF_F ? 1.0f : expf(m[h] - m_new);
                float sum = 0.0f;
#pragma unroll
                for (int n = 0; n < NT; ++n)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const float v = s[n][2 * h + c];
                        const float p = v == -CUDART_INF_F ? 0.0f : expf(v - m_new);
                        s[n][2 * h + c] = p;
                        sum += p;
                    }
                sum += __shfl_xor_sync(SHARPINF_FULL_MASK, sum, 1);
                sum += __shfl_xor_sync(SHARPINF_FULL_MASK, sum, 2);
                l[h] = l[h] * f[h] + sum;
                m[h] = m_new;
            }
#pragma unroll
            for (int kk = 0; kk < PK; ++kk) {
                pa[kk][0] = kv_pack_half2(s[2 * kk][0], s[2 * kk][1]);
                pa[kk][1] = kv_pack_half2(s[2 * kk][2], s[2 * kk][3]);
                pa[kk][2] = kv_pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                pa[kk][3] = kv_pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            }
        }
        __syncthreads();  // every warp is done with the K tile
        // V tile, transposed: kv_s[e * VS + j] = V[j][e]
        for (int c = tid; c < KT * HD / 8; c += S::THREADS) {
            const int j = c / (HD / 8), e0 = (c % (HD / 8)) * 8;
            float v[AS_VEC];
            if (j < nk && j >= jv) vc.load8(row_s[j], e0, v);
            else
#pragma unroll
                for (int i = 0; i < AS_VEC; ++i) v[i] = 0.0f;
#pragma unroll
            for (int i = 0; i < AS_VEC; ++i) kv_s[(e0 + i) * VS + j] = __float2half_rn(v[i]);
        }
        __syncthreads();
        if (active) {
#pragma unroll
            for (int d = 0; d < DT; ++d) {
                acc[d][0] *= f[0];
                acc[d][1] *= f[0];
                acc[d][2] *= f[1];
                acc[d][3] *= f[1];
#pragma unroll
                for (int kk = 0; kk < PK; ++kk) {
                    const __half* vr = kv_s + (d * 8 + quad) * VS + kk * 16 + 2 * t4;
                    const unsigned b[2] = {af_load2(vr), af_load2(vr + 8)};
                    mma_m16n8k16_f16_f32(acc[d], pa[kk], b, acc[d]);
                }
            }
        }
        __syncthreads();  // row_s and kv_s are rewritten by the next partition
    }
}

// One block a (tile, KV head, split) -- the split launch, gridDim.z = SPLITS: each block writes its
// split's states and the last of (tile, KV head) to finish merges them -- or one block a (tile, KV
// head) -- the walk, gridDim.z = 1: the block computes every split of its rows in turn and merges them
// as it goes, with no scratch, tickets or second block's merge. The merge needs each row's largest
// score first (a split's factor is exp(m_s - max over splits)), so with two splits or more the walk
// begins with a pass over the partitions for it: the same scores, so the same maximum (fmaxf is
// exact in any order). Then for s = 0, 1, ...: af_split_state, total += l_s f_s and o += acc_s f_s --
// the merge's sums, term by term in split order -- and the output o * (1 / total), as the merge
// writes it. One kernel for both shapes: af_split_state is compiled once, and the registers are the
// walk's either way (2 blocks an SM, as a split-only kernel's).
template <int HD, typename KV>
__device__ __forceinline__ void attention_flash_impl(
    const float* qkv, int qkv_stride, KV kc, KV vc, const int* block_tables, int max_blocks_per_seq,
    const int* cu_seqlens, const int* positions, float* out, signed char* out_q, float* out_d, int* out_s,
    float* partial, int* tickets, int t0, int n_window, int n_seqs, int n_heads, int n_kv_heads, int block_size,
    float scale, const float* sinks, int has_sinks, int sliding_window, int quantize) {
    using S = AfShape<HD>;
    constexpr int WARPS = S::WARPS, KT = S::KT, NT = KT / 8, DT = HD / 8;
    static_assert(HD % 16 == 0 && HD <= 256, "head_dim: a multiple of 16, at most 256");
    AF_SHARED(S);
    __shared__ float sc_s[WARPS][AF_SPLITS], ls_s[WARPS][AF_SPLITS];  // the merge's per-split factors and sums, a row per warp
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, kvh = blockIdx.y;
    const int g = n_heads / n_kv_heads;  // the launcher guarantees g <= ROWS
    // uniform; at head_dim 256 the walk is compiled out (its two rows' output sums beside a split's
    // state would take 256 registers a thread): the launcher never walks it
    const bool walk = HD <= 128 && gridDim.z == 1;

    const AfTile T = af_tile<HD>(cu_seqlens, positions, t0, n_window, n_seqs, g, sliding_window, pos_s, scan_s, tile_s);
    if (T.seq < 0) return;  // uniform
    const int split0 = walk ? 0 : blockIdx.z, split1 = walk ? T.nsplits : split0 + 1;
    if (split0 >= T.nsplits) return;  // uniform per block
    const int begin = T.begin, rows = T.rows;
    const int* table = block_tables + (long long)T.seq * max_blocks_per_seq;
    af_stage_q<HD>(qkv, qkv_stride, T, g, kvh, q_s);
    // this thread's rows of the accumulator fragments: ra = 16 * warp + lane / 4 and ra + 8
    const int quad = lane >> 2, t4 = lane & 3, ra = 16 * warp + quad;
    const int pos_r[2] = {pos_s[ra], pos_s[ra + 8]};

    // the walk's pass 1 (two splits or more): each row's largest visible score over every partition
    // the block sees
    float mx[2] = {-CUDART_INF_F, -CUDART_INF_F};
    for (int part = T.block_lo / KT; walk && T.nsplits > 1 && part * KT <= T.maxpos; ++part) {
        const int j0 = part * KT, nk = min(KT, T.maxpos + 1 - j0), jv = max(0, T.block_lo - j0);
        af_stage_k<HD>(kc, table, j0, nk, jv, block_size, n_kv_heads, kvh, row_s, kv_s);
        if (T.wmax >= j0 && T.warp_lo < j0 + KT) {
            float s[NT][4];
            af_scores<HD>(q_s, kv_s, j0, pos_r, sliding_window, scale, s);
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int n = 0; n < NT; ++n) mx[h] = fmaxf(mx[h], fmaxf(s[n][2 * h], s[n][2 * h + 1]));
        }
        __syncthreads();  // row_s and kv_s are rewritten by the next partition
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // then the row's sink in the walk's maximum (none: -inf, the same)
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(SHARPINF_FULL_MASK, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(SHARPINF_FULL_MASK, mx[h], 2));
        mx[h] = fmaxf(mx[h], sharpinf_sink(sinks, has_sinks, kvh * g + (ra + 8 * h) % g));
    }

    // the split launch's one split, or the walk's every split folded into the merge's sums as it ends
    float total[2] = {0.0f, 0.0f}, o[DT][4];
#pragma unroll
    for (int d = 0; d < DT; ++d)
#pragma unroll
        for (int i = 0; i < 4; ++i) o[d][i] = 0.0f;
    for (int split = split0; split < split1; ++split) {
        float m[2], l[2], acc[DT][4];
        af_split_state<HD>(split, T, kc, vc, table, block_size, n_kv_heads, kvh, scale, sliding_window, q_s, kv_s,
                           row_s, pos_r, m, l, acc);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = ra + 8 * h;
            // the rows that see a key in this split: the merge reads s < min(SPLITS, pos / KT + 1)
            if (r >= rows || pos_r[h] < split * KT) continue;
            if (walk) {  // one split: its own maximum and the sink's (the merge's over one split)
                mx[h] = T.nsplits > 1 ? mx[h] : fmaxf(m[h], mx[h]);  // one split: mx held the sink's z alone
                const float sc = expf(m[h] - mx[h]);
                total[h] = __fmaf_rn(l[h], sc, total[h]);
#pragma unroll
                for (int d = 0; d < DT; ++d) {
                    o[d][2 * h] = __fmaf_rn(acc[d][2 * h], sc, o[d][2 * h]);
                    o[d][2 * h + 1] = __fmaf_rn(acc[d][2 * h + 1], sc, o[d][2 * h + 1]);
                }
                continue;
            }
            // this split's state -> partial[token - t0][head][split]
            float* ps = partial + (((long long)(begin + r / g - t0) * n_heads + kvh * g + r % g) * AF_SPLITS + split) * (HD + 2);
#pragma unroll
            for (int d = 0; d < DT; ++d) {
                ps[d * 8 + 2 * t4] = acc[d][2 * h];
                ps[d * 8 + 2 * t4 + 1] = acc[d][2 * h + 1];
            }
            if (t4 == 0) {
                ps[HD] = m[h];
                ps[HD + 1] = l[h];
            }
        }
    }
    const int n = n_heads * HD;
    if (walk) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = ra + 8 * h;
            if (r >= rows) continue;
            const float inv = 1.0f / sharpinf_sink_sum(total[h], sharpinf_sink(sinks, has_sinks, kvh * g + r % g), mx[h]);
            float* orow = out + (long long)(begin + r / g) * n + (kvh * g + r % g) * HD;
#pragma unroll
            for (int d = 0; d < DT; ++d) {
                orow[d * 8 + 2 * t4] = o[d][2 * h] * inv;
                orow[d * 8 + 2 * t4 + 1] = o[d][2 * h + 1] * inv;
            }
        }
        if constexpr (HD % 32 == 0) {
            if (quantize) {  // the q8_1 copy of the warp's own rows, 32 values a pass, as the merge makes it
                __syncwarp();
                const int r1 = min(rows, 16 * warp + 16);
                for (int r = 16 * warp; r < r1; ++r) {
                    const int t = begin + r / g, h = kvh * g + r % g;
#pragma unroll
                    for (int e0 = 0; e0 < HD; e0 += 32) {
                        const float v = __ldcg(out + (long long)t * n + h * HD + e0 + lane);
                        const int b = (h * HD + e0) / 32;
                        q8_1_block(v, out_q + (long long)t * n + b * 32, out_d + (long long)t * (n / 32) + b,
                                   out_s + (long long)t * (n / 32) + b);
                    }
                }
            }
        }
        return;
    }
    int* ticket = tickets + (long long)blockIdx.x * n_kv_heads + kvh;
    if (!sharpinf_last_arrival(ticket, T.nsplits)) return;

    // the last block merges each row's splits 0..nsplits(row)-1 in order: a warp per row. A row's split
    // maxima and sums come in one round (a lane a split; the maximum by a butterfly of fmaxf, exact in
    // any order: only a maximum of +-0 can differ in sign, and m - (+0) == m - (-0) but for m = 0,
    // whose exp is 1 either way), each 32 output values' splits in one more; the warp then holds a
    // whole q8_1 block of the token's row, quantized as it stands. The walk above makes the same sums
    // in the same order.
    for (int r = warp; r < rows; r += WARPS) {
        const int t = begin + r / g, h = kvh * g + r % g, ns = min(AF_SPLITS, pos_s[r] / KT + 1);
        const float* ph = partial + ((long long)(t - t0) * n_heads + h) * AF_SPLITS * (HD + 2);
        const float m_l = lane < ns ? __ldcg(ph + lane * (HD + 2) + HD) : -CUDART_INF_F;
        const float l_l = lane < ns ? __ldcg(ph + lane * (HD + 2) + HD + 1) : 0.0f;
        const float z = sharpinf_sink(sinks, has_sinks, h);  // the row's sink: in the maximum, last in tot
        float mxl = m_l;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) mxl = fmaxf(mxl, __shfl_xor_sync(SHARPINF_FULL_MASK, mxl, off));
        mxl = fmaxf(mxl, z);
        if (lane < ns) {
            sc_s[warp][lane] = expf(m_l - mxl);  // split s's factor
            ls_s[warp][lane] = l_l;
        }
        __syncwarp();
        float tot = 0.0f;
        for (int s = 0; s < ns; ++s) tot = __fmaf_rn(ls_s[warp][s], sc_s[warp][s], tot);
        const float inv = 1.0f / sharpinf_sink_sum(tot, z, mxl);
#pragma unroll
        for (int e0 = 0; e0 < HD; e0 += 32) {  // value e0 + lane: a 32-value block of the row a pass
            const int e = e0 + lane;
            if (e >= HD) break;  // head_dim 16 (no q8_1 copy then)
            float x[AF_SPLITS];  // every split's value loaded before the first is added
#pragma unroll
            for (int s = 0; s < AF_SPLITS; ++s)
                if (s < ns) x[s] = __ldcg(ph + s * (HD + 2) + e);
            float v = 0.0f;
#pragma unroll
            for (int s = 0; s < AF_SPLITS; ++s)
                if (s < ns) v = __fmaf_rn(x[s], sc_s[warp][s], v);
            v = v * inv;
            out[(long long)t * n + h * HD + e] = v;
            if (quantize) {
                const int b = (h * HD + e0) / 32;  // the 32-value block within the token's row
                q8_1_block(v, out_q + (long long)t * n + b * 32, out_d + (long long)t * (n / 32) + b,
                           out_s + (long long)t * (n / 32) + b);
            }
        }
        __syncwarp();  // sc_s and ls_s are rewritten for the warp's next row
    }
    if (tid == 0) *ticket = 0;  // ready for the next launch (and the next graph replay)
}

#define AF_ARGS                                                                                                \
    const float *qkv, int qkv_stride, const void *k_cache, const void *v_cache, const int *block_tables,      \
        int max_blocks_per_seq, const int *cu_seqlens, const int *positions, float *out, signed char *out_q,   \
        float *out_d, int *out_s, float *partial, int *tickets, int t0, int n_window, int n_seqs, int n_heads, \
        int n_kv_heads, int block_size, float scale, const float *sinks, int has_sinks, int sliding_window,   \
        int quantize
#define AF_PASS(KC, VC)                                                                                        \
    qkv, qkv_stride, KC, VC, block_tables, max_blocks_per_seq, cu_seqlens, positions, out, out_q, out_d, out_s, \
        partial, tickets, t0, n_window, n_seqs, n_heads, n_kv_heads, block_size, scale, sinks, has_sinks,       \
        sliding_window, quantize
#define AF_CALL qkv, qkv_stride, k_cache, v_cache, block_tables, max_blocks_per_seq, cu_seqlens, positions, out, \
        out_q, out_d, out_s, partial, tickets, t0, n_window, n_seqs, n_heads, n_kv_heads, block_size, scale, sinks, \
        has_sinks, sliding_window, quantize

template <int HD, typename T>
__device__ __forceinline__ void af_typed(AF_ARGS) {
    const AsKv<T, HD> kc{static_cast<const T*>(k_cache)}, vc{static_cast<const T*>(v_cache)};
    attention_flash_impl<HD>(AF_PASS(kc, vc));
}
template <int HD>
__device__ __forceinline__ void af_q8(AF_ARGS) {
    const AsKvQ8<HD> kc{static_cast<const unsigned char*>(k_cache)}, vc{static_cast<const unsigned char*>(v_cache)};
    attention_flash_impl<HD>(AF_PASS(kc, vc));
}

// One entry per (KV dtype, head_dim), attention_flash_<kv>_d<HD>, each compiled only when wanted
// (SHARPINF_KV_HD_ENTRIES, common.cuh); one block of THREADS per SM is what the tiles are sized for.
#define AF_BOUNDS(hd) __launch_bounds__(AfShape<hd>::THREADS, 1)
SHARPINF_KV_HD_ENTRIES(attention_flash, AF_BOUNDS, (AF_ARGS), af_typed, af_q8, AF_CALL)

