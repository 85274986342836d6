// mmq_rows.cuh -- the row loop the mmq kernels share (matmul_mmq.cu, gate_up_mmq.cu, moe_mmq.cu and
// the narrow files): Y = X W^T on int8 tensor cores (mma.m16n8k32.s8) in blocks of 64 tokens and 64
// weight rows, or 16 (the narrow files), bit-identical to matmul_dp4a.cu / gate_up_dp4a.cu.
//   mmq_rows<QT, NMAT, Slots, ROWS>(...)   the block's tile; MqShape: its warps; MqSplit: split-K
//   MQ_ARGS / MQ_PASS / MQ_NAMES, GQ_*     the dense entries' parameter lists
// Algorithm, tiles, launch and bound: matmul_mmq.cu's header (the narrow blocks: matmul_mmq_narrow.cu's).
#pragma once
#include "dp4a.cuh"

#define MQ_ROWS 64    // weight rows a block, the wide shape (2 warp rows of 2 m16 tiles)
#define MQ_TOKENS 64  // tokens a block: each weight chunk is unpacked once per 64 tokens
#define MQ_XSTAGES 3  // activation ring: chunk k in use while k + 1 and k + 2 load (cp.async)
#define MQ_XROW 12    // ints a staged row (8 used): 48-byte rows
#define MQ_FOLD 4     // outputs a thread folds a round in the split-K epilogue (their loads issued together)
#define MQ_MAX_GROUPS (32 / DP_GROUP)  // member groups of a row at most (G <= 32)

// A block of ROWS weight rows (of each of NMAT matrices) x 64 tokens: its warps as WR (rows) x WT
// (tokens), each warp FM m16 tiles x FN n8 tiles of every matrix.
//   ROWS 64, NMAT 1: 4 warps 2 x 2, each 32 rows x 32 tokens   (matmul_mmq.cu)
//   ROWS 64, NMAT 2: 8 warps 2 x 4, each 32 rows x 16 tokens   (gate_up_mmq.cu, moe_mmq.cu)
//   ROWS 16:         4 warps 1 x 4, each 16 rows x 16 tokens   (the narrow files, both NMAT)
template <int NMAT, int ROWS>
struct MqShape {
    static_assert(ROWS == 64 || ROWS == 16, "a block is 64 or 16 weight rows (32 would fit the formulas: "
                                             "instantiate and test it before use)");
    static constexpr int FM = ROWS >= 32 ? 2 : 1;                  // m16 tiles a warp
    static constexpr int WR = ROWS / (16 * FM);                    // warps along the rows
    static constexpr int WARPS = ROWS == 64 && NMAT == 2 ? 8 : 4;  // the block's warps (threads / 32)
    static constexpr int WT = WARPS / WR;                          // warps along the tokens
    static constexpr int FN = MQ_TOKENS / (8 * WT);                // n8 tiles a warp
    static_assert(FN % 2 == 0, "B fragments load two n8 tiles at a time");
};

// ptxas's register budgets for the wide blocks (the entries' __launch_bounds__: GB_QUANT_ENTRIES_ATTRS):
// 4 warps (NMAT = 1) at most 168 registers, 3 blocks an SM -- but Q6_K, which spills at 168 under
// CUDA 13's ptxas: 2; 8 warps (NMAT = 2) at most 128, 2 blocks an SM -- but Q5_K and Q6_K, which
// spill at 128: 1. No entry spills (tests/test_nvrtc_compile.py). Unbounded, ptxas spends registers
// past those lines to hoist a tile's mmas (a block an SM fewer).
// MQ_MIN_BLOCKS_1: a probe may ask for more (-DMQ_MIN_BLOCKS_1=4 through SHARPINF_NVRTC_OPTIONS:
// <= 128 registers; --maxrregcount does not reach an entry with launch bounds).
#ifndef MQ_MIN_BLOCKS_1
#define MQ_MIN_BLOCKS_1 3
#endif
#define MQ_BOUNDS_1(QT) __launch_bounds__(128, (QT) == GB_Q6_K && MQ_MIN_BLOCKS_1 == 3 ? 2 : MQ_MIN_BLOCKS_1)
// MQ_GROUP_SHARED=1 (a probe, with MQ_MIN_BLOCKS_1=4; bench/gpu_slot.sh times it): the one-matrix
// wide blocks (matmul_mmq, moe_down_mmq) keep each output's group sum in shared memory (a column of 32
// floats a thread, its own: 16 KB a block), not in registers -- a load and a store more an output at
// each member's end, for 4 blocks an SM at 128 registers.
#ifndef MQ_GROUP_SHARED
#define MQ_GROUP_SHARED 0
#endif
#define MQ_BOUNDS_2(QT) __launch_bounds__(256, (QT) == GB_Q6_K || (QT) == GB_Q5_K ? 1 : 2)

// A if C else B (NVRTC has no <type_traits>)
template <bool C, class A, class B> struct MqPick { typedef A type; };
template <class A, class B> struct MqPick<false, A, B> { typedef B type; };

// One weight row's chunk as dp4a unpacks it (DpChunk: 8 words of int8, then its scales), padded to
// 48 bytes: A-fragment rows for ldmatrix at a 12-word stride hit 8 distinct bank quads, and the
// scales for acc_idot sit beside them.
template <int QT> struct __align__(16) MqRow {
    DpChunk<QT> ch;
    // word by word: plain 32-bit shared stores (the emulator's initcheck sees each one)
    __device__ __forceinline__ void store(const DpChunk<QT>& c) {
        static_assert(sizeof(DpChunk<QT>) % 4 == 0, "a chunk is whole words");
        int* dst = reinterpret_cast<int*>(&ch);
        const int* src = reinterpret_cast<const int*>(&c);
#pragma unroll
        for (int i = 0; i < (int)(sizeof(DpChunk<QT>) / 4); ++i) dst[i] = src[i];
    }
};

// The activation tile of one chunk: 64 tokens' q8_1 blocks (values in 48-byte rows for ldmatrix,
// d and s). Tokens past the last are zeros.
struct MqXTile {
    int q[MQ_TOKENS][MQ_XROW];
    float d[MQ_TOKENS];
    int s[MQ_TOKENS];
};

// Which rows of X and Y a block's 64 token slots are. MqTokens: the dense layers' tile, tokens
// n0 .. n0 + 63 (both X's and Y's rows). MqPairs (moe_mmq.cu): one expert's tile of up to 64 (token,
// expert) pairs from moe_sort, pair p reading X row p / x_div and writing Y row p.
struct MqTokens {
    static constexpr bool FULL_COPY = true;  // mmq_rows's branch-free copy of the terms for full warp tiles
    int n0, count;  // first token; live slots (count <= MQ_TOKENS)
    __device__ __forceinline__ MqTokens(int n_tokens) : n0(blockIdx.y * MQ_TOKENS) {
        count = n_tokens - n0 < MQ_TOKENS ? n_tokens - n0 : MQ_TOKENS;
    }
    __device__ __forceinline__ long long x_row(int slot) const { return n0 + slot; }
    __device__ __forceinline__ long long y_row(int slot) const { return n0 + slot; }
};

// The chunk a block visits after chunk c, in the canonical order (dp4a.cuh): member gp = c mod G's
// chunks gp, gp + G, ... , then member gp + 1's; -1 after the block's last member (gp_end - 1).
__device__ __forceinline__ int mq_next(int c, int G, int gp_end, int n_chunks) {
    if (c + G < n_chunks) return c + G;
    const int gp = c & (G - 1);  // c % G: G is a power of two, c >= 0 (no integer division)
    return gp + 1 < gp_end ? gp + 1 : -1;
}

// Split-K (dp4a.cuh's two-level order): block z of a tile takes group z's members only and keeps
// two floats an output (member sum, group sum); with more than one group, each block writes its
// group sums to `partial` and takes a ticket, and the tile's last block folds the group sums in
// group order and runs the epilogue (which block is last changes nothing). partial: float
// [tiles][NMAT][groups][64 slots][ROWS]; tickets: int [tiles], zero before a launch and left zero
// (graphs replay it); tile = blockIdx.y * gridDim.x + blockIdx.x; x0: the launch's first row tile
// (a launcher walks a big grid in windows of its scratch's size). Every mmq kernel splits (dense and
// MoE): a block that walked every group would keep a third float an output (the total) -- 32
// registers more, a block an SM fewer.
struct MqSplit {
    float* partial;
    int* tickets;
    int x0;
};

// f(m, i, j, e) for every output a thread of mmq_rows holds (its registers' [NMAT][FM][FN][4])
template <int NMAT, int FM, int FN, class F>
__device__ __forceinline__ void mq_each_output(F f) {
#pragma unroll
    for (int m = 0; m < NMAT; ++m)
#pragma unroll
        for (int i = 0; i < FM; ++i)
#pragma unroll
            for (int j = 0; j < FN; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) f(m, i, j, e);
}

// Stage chunk c of the block's token slots into tile, all by cp.async, on threads X0 .. X0 + NX - 1
// (mmq_rows: the block's upper half, while the lower half unpacks the weight chunks, so neither
// waits at the barrier for the other's work): with NX = 64 a thread stages a slot's 32 value bytes,
// d and s; with NX = 128 two threads a slot, 16 bytes each, the even one d and s. Commits one group
// (empty when c < 0, and on the other threads), so every iteration commits one and
// cp_async_wait_group<1> always means "chunk k is in".
template <int X0, int NX, class Slots>
__device__ __forceinline__ void mq_stage_x(MqXTile& tile, const signed char* xq, const float* xd, const int* xs,
                                           const Slots& slots, int n_in, int c) {
    static_assert(NX == MQ_TOKENS || NX == 2 * MQ_TOKENS, "one or two stagers a slot");
    constexpr int PARTS = 2 * MQ_TOKENS / NX;  // 16-byte halves a stager: 2 (the slot's) or 1
    const int u = (int)threadIdx.x - X0, n_chunks = n_in / 32;
    if (c >= 0 && u >= 0 && u < NX) {
        const int tk = PARTS == 2 ? u : u >> 1, h0 = PARTS == 2 ? 0 : u & 1;
        const bool live = tk < slots.count;
        const long long xr = live ? slots.x_row(tk) : 0;
#pragma unroll
        for (int h = h0; h < h0 + PARTS; ++h) {
            int* dst = &tile.q[tk][4 * h];
            if (live) cp_async_16(dst, xq + xr * n_in + 32LL * c + 16 * h);
            else *reinterpret_cast<int4*>(dst) = make_int4(0, 0, 0, 0);
        }
        if (h0 == 0) {
            if (live) {
                cp_async_4(&tile.d[tk], xd + xr * n_chunks + c);
                cp_async_4(&tile.s[tk], xs + xr * n_chunks + c);
            } else {
                tile.d[tk] = 0.0f;
                tile.s[tk] = 0;
            }
        }
    }
    cp_async_commit();
}

// The dense entries' parameters (matmul_mmq.cu and matmul_mmq_narrow.cu: MQ_; gate_up_mmq.cu and
// gate_up_mmq_narrow.cu: GQ_), what they pass to mmq_rows, and their names for GB_QUANT_ENTRIES.
#define MQ_ARGS                                                                                                  \
    const unsigned char *W, const signed char *xq, const float *xd, const int *xs, const float *bias, float *Y, \
        int n_tokens, int n_out, int n_in, int has_bias, int accumulate, int y_stride, float *partial, int *tickets, \
        int x0
#define MQ_PASS W, W, xq, xd, xs, bias, Y, MqTokens(n_tokens), n_out, n_in, has_bias, accumulate, (long long)y_stride, \
                ACT_SILU, MqSplit{partial, tickets, x0}
#define MQ_NAMES W, xq, xd, xs, bias, Y, n_tokens, n_out, n_in, has_bias, accumulate, y_stride, partial, tickets, x0
#define GQ_ARGS                                                                                                 \
    const unsigned char *Wg, const unsigned char *Wu, const signed char *xq, const float *xd, const int *xs,    \
        float *out, int n_tokens, int n_ff, int n_in, int act, float *partial, int *tickets, int x0
// A dense FFN's act is SwiGLU or GeGLU (ops/matmul_dp4a.py refuses the rest): two values, so the clamped
// SwiGLU's code folds away (with it gate_up_mmq_q4_k spilled 4 bytes at its 128-register bound)
#define GQ_PASS Wg, Wu, xq, xd, xs, xd, out, MqTokens(n_tokens), n_ff, n_in, 0, 0, (long long)n_ff, \
                act == ACT_GELU_TANH ? ACT_GELU_TANH : ACT_SILU, MqSplit{partial, tickets, x0}
#define GQ_NAMES Wg, Wu, xq, xd, xs, out, n_tokens, n_ff, n_in, act, partial, tickets, x0

// NMAT = 1: Y = X W^T (+ bias) (+ Y when accumulate).  NMAT = 2: Y = act(X W^T, X W2^T) (+ the (gate, up)
// bias pairs: dp4a.cuh's dp_store).
// The block's warps and tiles: MqShape<NMAT, ROWS>. Slots: the X and Y rows of the block's 64 token
// slots (MqTokens for a dense layer, MqPairs for an expert's tile of pairs); blockIdx.x is the
// ROWS-row tile of W.
// grid.z: the groups of n_in's members (MqSplit above).
template <int QT, int NMAT, class Slots, int ROWS = MQ_ROWS>
__device__ __forceinline__ void mmq_rows(const unsigned char* __restrict__ W, const unsigned char* __restrict__ W2,
                                         const signed char* __restrict__ xq, const float* __restrict__ xd,
                                         const int* __restrict__ xs, const float* __restrict__ bias, float* Y,
                                         const Slots& slots, int n_out, int n_in, int has_bias, int accumulate,
                                         long long y_stride, int act, MqSplit split) {
    constexpr bool HALVES = QT == GB_Q6_K;  // Q6_K scales 16-value halves: their dots separately
    using Shape = MqShape<NMAT, ROWS>;
    constexpr int FM = Shape::FM, FN = Shape::FN;
    static_assert(sizeof(MqRow<QT>) == 4 * MQ_XROW, "a staged weight row is 48 bytes");
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int n_chunks = n_in / 32, G = dp_group_lanes(n_chunks), GS = dp_group_size(G), NG = G / GS;
    // the members this block visits: group blockIdx.z's
    const int gp_first = blockIdx.z * GS, gp_end = gp_first + GS;
    const int r0 = (blockIdx.x + split.x0) * ROWS;
    const int wr = 16 * FM * (warp % Shape::WR), wt = 8 * FN * (warp / Shape::WR);  // the warp's first row and token
    const long long row_bytes = gb_row_bytes<QT>(n_in);

    __shared__ __align__(16) MqXTile xring[MQ_XSTAGES];
    __shared__ __align__(16) MqRow<QT> wtile[2][NMAT][ROWS];  // double buffer: chunk k in use, k + 1 stored

    // the weight row this thread unpacks: row tid % ROWS of matrix tid / ROWS (threads 0 .. ROWS NMAT - 1,
    // in the block's lower half); the activations' stagers (mq_stage_x): threads X0 .. X0 + NX - 1, the
    // upper half -- but in matmul_mmq's Q6_K, where two stages a thread cost the one register too many
    // (a spill at its 168), every thread (the duties not split: 3 blocks an SM kept)
    constexpr int THREADS = 32 * Shape::WARPS;
    constexpr int X0 = HALVES && NMAT == 1 && ROWS == MQ_ROWS ? 0 : THREADS / 2;
    constexpr int NX = THREADS - X0 < 2 * MQ_TOKENS ? THREADS - X0 : 2 * MQ_TOKENS;
    static_assert(ROWS * NMAT <= THREADS / 2, "the weight stagers fit in the lower half");
    const bool stager = tid < ROWS * NMAT;
    const int sm = stager ? tid / ROWS : 0, sr = tid % ROWS;
    const unsigned char* srow = (sm == 0 ? W : W2) + (long long)(r0 + sr) * row_bytes;
    const bool srow_live = stager && r0 + sr < n_out;
    // a weight chunk arrives in two steps (dp4a.cuh's fetch/unpack): its loads are issued an
    // iteration ahead, into registers nothing reads until unpack after that iteration's mmas
    using Raw = typename DpChunk<QT>::Raw;
    auto fetch = [&](int c) {
        Raw r{};
        if (srow_live && c >= 0) r = DpChunk<QT>::fetch(srow, c);
        return r;
    };
    auto unpack = [&](const Raw& r, int c) {
        DpChunk<QT> ch{};
        if (srow_live) ch.unpack(r, c);
        return ch;
    };

    // output (m, i, j, e) of this thread (mq_each_output): C element e of its m16 tile i and n8 tile j
    // of matrix m, the block's row out_row(i, e) and token slot out_slot(j, e)
    auto out_row = [&](int i, int e) { return wr + 16 * i + g + 8 * (e >> 1); };
    auto out_slot = [&](int j, int e) { return wt + 8 * j + 2 * t + (e & 1); };

    // the canonical order: part (member gp's chunks), grp (the group's members) -- in registers, or with
    // MQ_GROUP_SHARED in a column of shared memory of the thread's own (one-matrix wide blocks)
    constexpr bool GRP_SHARED = MQ_GROUP_SHARED && NMAT == 1 && ROWS == MQ_ROWS;
    constexpr int NOUT = NMAT * FM * FN * 4;
    __shared__ float grp_s[GRP_SHARED ? NOUT : 1][GRP_SHARED ? THREADS : 1];
    float part[NMAT][FM][FN][4], grp_r[NMAT][FM][FN][4];
    auto grp = [&](int m, int i, int j, int e) -> float& {
        if constexpr (GRP_SHARED) return grp_s[((m * FM + i) * FN + j) * 4 + e][tid];
        else return grp_r[m][i][j][e];
    };
    mq_each_output<NMAT, FM, FN>([&](int m, int i, int j, int e) { part[m][i][j][e] = grp(m, i, j, e) = 0.0f; });

    // prologue: activations of the first two visits in flight, the first weight chunk stored, the
    // second's loads issued
    int cx = gp_first;  // the chunk whose activations load next
    mq_stage_x<X0, NX>(xring[0], xq, xd, xs, slots, n_in, cx);
    cx = mq_next(cx, G, gp_end, n_chunks);
    mq_stage_x<X0, NX>(xring[1], xq, xd, xs, slots, n_in, cx);
    cx = cx < 0 ? -1 : mq_next(cx, G, gp_end, n_chunks);
    Raw raw = fetch(gp_first);
    if (stager) wtile[0][sm][sr].store(unpack(raw, gp_first));
    raw = fetch(mq_next(gp_first, G, gp_end, n_chunks));  // in flight through the first iteration

    int c = gp_first;
    for (int k = 0; c >= 0; ++k) {
        const int cn = mq_next(c, G, gp_end, n_chunks);
        cp_async_wait_group<1>();  // chunk c's activations are in (k + 1's may still load)
        __syncthreads();           // ... for every thread; every warp is done with chunk k - 1's buffers
        mq_stage_x<X0, NX>(xring[(k + 2) % MQ_XSTAGES], xq, xd, xs, slots, n_in, cx);
        cx = cx < 0 ? -1 : mq_next(cx, G, gp_end, n_chunks);

        const MqXTile& xt = xring[k % MQ_XSTAGES];
        // B fragments, two n8 tiles a ldmatrix.x4: tokens g and 8 + g, words t and 4 + t
        unsigned b[FN][2];
#pragma unroll
        for (int j = 0; j < FN; j += 2) {
            unsigned r[4];
            ldmatrix_x4(r, &xt.q[wt + 8 * j + (lane & 7) + ((lane >> 4) & 1) * 8][((lane >> 3) & 1) * 4]);
            b[j][0] = r[0];
            b[j][1] = r[1];
            b[j + 1][0] = r[2];
            b[j + 1][1] = r[3];
        }
        // the C fragment's tokens 2t, 2t + 1 of each n8 tile: d, s (and Q6_K's first-half sum)
        DpXF xf[FN][2];
        int s0[FN][2];
#pragma unroll
        for (int j = 0; j < FN; ++j) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int tk = wt + 8 * j + 2 * t + h;
                xf[j][h] = dp_xf(xt.d[tk], xt.s[tk]);
                s0[j][h] = 0;
            }
            if (HALVES) {  // the sum of x's values 0..15: a tensor-core dot with a row of 16 ones (the
                           // same integer as dp4a's dp_dot8 with ones; 1 mma an n8 tile, not 8 LDS and dp4a)
                const unsigned ones[4] = {0x01010101u, 0x01010101u, 0u, 0u};
                const int zero[4] = {0, 0, 0, 0};
                int sum[4];
                mma_m16n8k32_s8_s32(sum, ones, b[j], zero);
                s0[j][0] = sum[0];  // C elements 0, 1: tokens 2t, 2t + 1
                s0[j][1] = sum[1];
            }
        }
        // the mmas and float terms of chunk k. Two copies: where every n8 tile of the warp holds live
        // tokens (every block of a big step but the last), all unconditionally; elsewhere the n8 tiles
        // wholly past the last token skip theirs (a 16-token step computes a quarter of the tile). The
        // per-tile test costs instructions an mma, which the full copy does without.
        auto terms = [&](const bool full) {
#pragma unroll
            for (int m = 0; m < NMAT; ++m)
#pragma unroll
                for (int i = 0; i < FM; ++i) {
                    const MqRow<QT>* rows = &wtile[k & 1][m][wr + 16 * i];
                    unsigned a[4];  // rows g, g + 8 x words t (a[0], a[1]) and 4 + t (a[2], a[3])
                    ldmatrix_x4(a, &rows[(lane & 7) + ((lane >> 3) & 1) * 8].ch.w[((lane >> 4) & 1) * 4]);
                    const unsigned alo[4] = {a[0], a[1], 0u, 0u};  // values 16..31 zeroed: the first half's dot
                    // rows g and g + 8's scales: with one matrix, copied once for the n8 tiles (through a
                    // reference their loads sink into each tile's skip test: 4x the LDS); with two, by
                    // reference (the copies' registers would cost a block of 8 warps an SM). Their words
                    // are never read (A came by ldmatrix).
                    typename MqPick<NMAT == 1, const DpChunk<QT>, const DpChunk<QT>&>::type p0 = rows[g].ch,
                                                                                            p1 = rows[g + 8].ch;
                    const int zero[4] = {0, 0, 0, 0};
#pragma unroll
                    for (int j = 0; j < FN; ++j) {
                        if (!full && wt + 8 * j >= slots.count) continue;  // padding: nothing to compute
                        int fl[4], lo[4] = {0, 0, 0, 0};
                        mma_m16n8k32_s8_s32(fl, a, b[j], zero);
                        if (HALVES) mma_m16n8k32_s8_s32(lo, alo, b[j], zero);
#pragma unroll
                        for (int e = 0; e < 4; ++e) {  // C element e: row g + 8 (e >> 1), token 2t + (e & 1)
                            const DpChunk<QT>& p = e >> 1 ? p1 : p0;
                            const int h = e & 1;
                            float& acc = part[m][i][j][e];
                            acc = HALVES ? p.acc_idot(acc, lo[e], fl[e] - lo[e], xf[j][h], s0[j][h])
                                         : p.acc_idot(acc, fl[e], 0, xf[j][h], 0);
                        }
                    }
                }
        };
        // inlined twice: the constant argument drops the tests from the first copy
        if (Slots::FULL_COPY && wt + 8 * FN <= slots.count) terms(true);
        else terms(false);
        if (c + G >= n_chunks) {  // member c mod G is complete: into its group's sum, in member order
            mq_each_output<NMAT, FM, FN>([&](int m, int i, int j, int e) {
                grp(m, i, j, e) = grp(m, i, j, e) + part[m][i][j][e];
                part[m][i][j][e] = 0.0f;
            });
        }
        if (cn >= 0) {  // the next chunk: unpacked now its loads are in, stored for after the next barrier
            if (stager) wtile[(k + 1) & 1][sm][sr].store(unpack(raw, cn));
            raw = fetch(mq_next(cn, G, gp_end, n_chunks));  // and the one after: in flight through the next iteration
        }
        c = cn;
    }

    if (NG > 1) {  // this group's sums to the scratch; the tile's last block folds them
        const int tile = blockIdx.y * gridDim.x + blockIdx.x;
        float* pt = split.partial + (long long)tile * NMAT * NG * MQ_TOKENS * ROWS;
        mq_each_output<NMAT, FM, FN>([&](int m, int i, int j, int e) {
            const int rl = out_row(i, e), slot = out_slot(j, e);
            if (r0 + rl < n_out && slot < slots.count)
                pt[((m * NG + (int)blockIdx.z) * MQ_TOKENS + slot) * ROWS + rl] = grp(m, i, j, e);
        });
        if (!sharpinf_last_arrival(split.tickets + tile, NG)) return;
        // MQ_FOLD outputs a thread a round: their group sums (L2 loads: other blocks wrote them), residuals
        // and biases all loaded before the first store -- a loop that stored each output before it loaded
        // the next one's would wait on L2 once an output (32 outputs a thread at 128 threads)
        for (int f0 = tid; f0 < ROWS * MQ_TOKENS; f0 += MQ_FOLD * blockDim.x) {  // f: (slot f / ROWS, row f % ROWS)
            float g[MQ_FOLD][NMAT][MQ_MAX_GROUPS];
            DpOld old[MQ_FOLD];
#pragma unroll
            for (int b = 0; b < MQ_FOLD; ++b) {
                const int f = f0 + b * blockDim.x, slot = f / ROWS, rl = f % ROWS, r = r0 + rl;
                const bool live = f < ROWS * MQ_TOKENS && r < n_out && slot < slots.count;
#pragma unroll
                for (int m = 0; m < NMAT; ++m)
#pragma unroll
                    for (int q = 0; q < MQ_MAX_GROUPS; ++q)
                        g[b][m][q] = live && q < NG ? __ldcg(pt + ((m * NG + q) * MQ_TOKENS + slot) * ROWS + rl) : 0.0f;
                old[b] = live ? dp_old<NMAT>(Y + slots.y_row(slot) * y_stride + r, bias, r, has_bias, accumulate)
                              : DpOld{0.0f, 0.0f};
            }
#pragma unroll
            for (int b = 0; b < MQ_FOLD; ++b) {
                const int f = f0 + b * blockDim.x, slot = f / ROWS, rl = f % ROWS, r = r0 + rl;
                if (f >= ROWS * MQ_TOKENS || r >= n_out || slot >= slots.count) continue;
                float v[NMAT];
#pragma unroll
                for (int m = 0; m < NMAT; ++m) {  // the group sums in group order (dp_fold's second level)
                    v[m] = 0.0f;
#pragma unroll
                    for (int q = 0; q < MQ_MAX_GROUPS; ++q)
                        if (q < NG) v[m] = v[m] + g[b][m][q];
                }
                dp_store_old<NMAT>(Y + slots.y_row(slot) * y_stride + r, v[0], v[NMAT - 1], old[b], has_bias, accumulate, act);
            }
        }
        if (tid == 0) split.tickets[tile] = 0;  // ready for the next launch (and the next graph replay)
        return;
    }

    // epilogue, one group: dp4a's own (dp_store, both matrices' sums at once) of its sum (0 + S_0 = S_0)
    mq_each_output<NMAT, FM, FN>([&](int m, int i, int j, int e) {
        const int r = r0 + out_row(i, e), slot = out_slot(j, e);
        if (m == 0 && r < n_out && slot < slots.count)
            dp_store<NMAT>(Y + slots.y_row(slot) * y_stride + r, grp(0, i, j, e), grp(NMAT - 1, i, j, e), bias, r,
                           has_bias, accumulate, act);
    });
}
