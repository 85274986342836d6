// gemv_rows.cuh -- the row loop of the decode matvecs (matmul_gemv.cu, gate_up_gemv.cu; moe_gemv.cu over
// one expert's rows, its tile of pairs the Slots): dp4a.cuh's dp4a_rows with the token count a template
// parameter (NT = 1, 2, 4 or 8), several weight chunks in flight per lane, and a warp's rows walked as
// one stream.
//   gemv_rows<QT, NMAT, NT, GC, Slots>(...)   GvUnroll: the batch; GvRun / GV_COALESCE: coalesced runs
// Why, launch, invariance and bound: matmul_gemv.cu's header.
#pragma once
#include "dp4a.cuh"

#define GV_WARPS 4  // warps per block, as dp4a

// Coalesced runs (GV_COALESCE). In the canonical order a row's G lanes take chunks cf .. cf + G - 1
// together (cf a multiple of G): G B contiguous bytes for the types whose chunk is one block of B
// bytes (Q4_0 18, Q4_1 20, Q5_0 22, Q5_1 24, Q8_0 34), G / 8 whole super-blocks for the K-quants (G
// >= 8 there) -- a run. Loaded lane by lane, each lane its own chunk, a warp's load instruction spans
// 32 blocks -- 18 to 34 32-byte sectors for 128 bytes used -- and the L1 serves a block's 5-10 loads in
// as many passes over the same lines: by estimate ~100 L1 wavefronts for the 1,088 bytes of a Q8_0
// run, which DRAM delivers in ~71 SM cycles (an H200: ~15 bytes a cycle an SM), so the L1, not DRAM,
// would bind Q8_0's matvec. A Q6_K lane loads ~76 bytes (20 loads: its low and high bits' 32-byte
// spans, which 2 and 4 chunks share, a scale, d) for its chunk's 26. Coalesced, the G lanes load the
// run as consecutive words (lane g: words g, g + G, ...: a 128-byte line an instruction), store them
// to the warp's part of shared memory, and each lane takes its own chunk from there through the same
// DpChunk::fetch -- the same bytes, so the same bits.
// What it costs and fixes: a shared store and load a word, the words' predicates, more registers; for
// it, a run's words are unconditional loads (a lane past the run's end loads its last word again), so
// all of the next batch's are in flight across the loop's back edge (a per-lane DpSpanA2 fetch ends in
// a 16-bit load behind a branch, which ptxas does not keep in flight), and Q6_K has 7 words a lane a
// chunk in flight, not ~20, so it takes the full batch of 4 chunks (GvUnroll).
//   GV_COALESCE=1 (the default): the 2-byte aligned types, Q4_0, Q5_0, Q8_0 and Q6_K
//   GV_COALESCE=2: all the quantized types (Q4_1, Q5_1, Q4_K, Q5_K too; Q4_K's lanes read 16-byte pieces
//     already); 0: none. Probes through SHARPINF_NVRTC_OPTIONS (bench/gpu_slot.sh times them).
// The float types keep per-lane loads (loaded where they are dotted).
#ifndef GV_COALESCE
#define GV_COALESCE 1
#endif
template <int QT> struct GvRun {
    static constexpr int B = GbInfo<QT>::bytes;  // a block's bytes
    static constexpr bool QUANT = GbInfo<QT>::elems >= 32;
    static constexpr int CPB = QUANT ? GbInfo<QT>::elems / 32 : 1;  // chunks a block: 1, or 8 (K-quant super-blocks)
    static constexpr bool WHOLE = B % 4 == 0;  // Q4_1, Q5_1, Q4_K, Q5_K: every run starts on a word
    static constexpr bool on = QUANT && (GV_COALESCE >= 2 || (GV_COALESCE == 1 && !WHOLE));
    // a lane's words of a run: G B / (4 CPB) over G lanes where every run starts on a word; else
    // ceil((2 + G B / CPB) / 4) -- 2: a run may start 2 bytes past a word (a row of an odd number of
    // 18, 22 or 34-byte blocks; every other run of Q6_K at G = 8) -- at most ceil((2 + B) / (4 CPB))
    // a lane (G >= CPB: a run is whole blocks)
    static constexpr int WORDS = ((WHOLE ? 0 : 2) + B + 4 * CPB - 1) / (4 * CPB);
    unsigned w[WORDS];
    unsigned tail;  // the 2 bytes a run may end with past its last whole word (not the whole-word types)
};

// The run of row rowp from chunk cf (a multiple of G, so of CPB: a run is whole blocks): its first
// word's address (the word holding the run's first byte), mis (0 or 2: the run's first byte past
// that word's start), nfull (the words wholly inside the run) and tail (the run ends 2 bytes into
// word nfull).
struct GvSpan {
    const unsigned char* base;
    int mis, nfull;
    bool tail;
};
template <int QT> __device__ __forceinline__ GvSpan gv_span(const unsigned char* rowp, int cf, int G, int n_chunks) {
    using R = GvRun<QT>;
    const int count = n_chunks - cf < G ? n_chunks - cf : G;
    const unsigned char* s = rowp + (long long)R::B * (cf / R::CPB);
    const int mis = R::WHOLE ? 0 : (int)(reinterpret_cast<unsigned long long>(s) & 2u);  // s: 2-byte aligned
    const int nbytes = mis + count / R::CPB * R::B;
    return GvSpan{s - mis, mis, nbytes >> 2, !R::WHOLE && (nbytes & 2)};
}

// Issues lane g's loads of the run of chunks cf .. (row rowp): words g, g + G, ... of the run, each
// lane's words past the run's last whole word loading that one again (so no load waits behind a
// branch), and the tail, if any, as 16 bits by the lane it falls to (a run may end the tensor).
template <int QT>
__device__ __forceinline__ void gv_fetch_run(GvRun<QT>& run, const unsigned char* rowp, int cf, int g, int G,
                                             int n_chunks) {
    const GvSpan sp = gv_span<QT>(rowp, cf, G, n_chunks);
#pragma unroll
    for (int j = 0; j < GvRun<QT>::WORDS; ++j) run.w[j] = dp_word_at(sp.base, min(g + j * G, sp.nfull - 1));
    if (!GvRun<QT>::WHOLE) run.tail = sp.tail && g == (sp.nfull & (G - 1)) ? dp_u16_a2(sp.base + 4 * sp.nfull) : 0u;
}

// The run's words into the warp's stage (dst: the run's first word there), each word once.
template <int QT>
__device__ __forceinline__ void gv_stage_run(unsigned* dst, const GvRun<QT>& run, const GvSpan& sp, int g, int G) {
#pragma unroll
    for (int j = 0; j < GvRun<QT>::WORDS; ++j)
        if (g + j * G < sp.nfull) dst[g + j * G] = run.w[j];
    if (!GvRun<QT>::WHOLE && sp.tail && g == (sp.nfull & (G - 1))) dst[sp.nfull] = run.tail;
}

// Weight chunks a lane fetches together (a batch), per (type, NT, NMAT): the registers they take are
// what the few accumulators of a small NT leave free -- 4 Q4_K chunks a lane (12 words each while in
// flight) at NT = 1 take 128 registers; the K-quants with high bits (Q5_K, Q6_K: 20-22 words a chunk)
// half as many. NT = 8 keeps dp4a's one chunk; so do the float types, whose chunk is 32 floats.
// GV_U (a probe, through SHARPINF_NVRTC_OPTIONS): the batch at NT <= 2 for the other types.
#ifndef GV_U
#define GV_U 4
#endif
template <int QT, int NT, int NMAT> struct GvUnroll {
    static constexpr bool floats = QT == GB_F32 || QT == GB_F16 || QT == GB_BF16;
    // at NT <= 2; a coalesced Q6_K or Q5_K run is 7 or 6 words a lane in flight, not ~20: the full batch
    // at NT = 1 (at NT = 2 its registers would cost blocks an SM)
    static constexpr bool wide = (QT == GB_Q5_K || QT == GB_Q6_K) && !(GvRun<QT>::on && NT == 1);
    static constexpr int small = wide ? (GV_U + 1) / 2 : GV_U;
    static constexpr int per_matrix = floats ? 1 : (NT <= 2 ? small : (NT == 4 ? (small + 1) / 2 : 1));
    static constexpr int value = NMAT == 1 || per_matrix == 1 ? per_matrix : per_matrix / 2;
};

// Issues the loads of chunks c0, c0 + G, ..., c0 + (U-1) G below n_chunks of row `row` of W (and W2)
// -- none for a row past n_out.
template <int QT, int U, int NMAT>
__device__ __forceinline__ void gv_fetch(typename DpChunk<QT>::Raw (&raw)[U][NMAT], const unsigned char* W,
                                         const unsigned char* W2, long long row_bytes, int row, int n_out, int c0,
                                         int G, int n_chunks) {
    if (row >= n_out) return;
#pragma unroll
    for (int k = 0; k < U; ++k)
        if (c0 + k * G < n_chunks)
#pragma unroll
            for (int m = 0; m < NMAT; ++m) raw[k][m] = DpChunk<QT>::fetch((m ? W2 : W) + row * row_bytes, c0 + k * G);
}

// Which rows of X and Y a step's token slots are (as mmq_rows.cuh's MqTokens / MqPairs). GvTokens: a
// dense layer's step, slot t both rows t; moe_gemv.cu's GvPairs: one expert's tile of (token, expert)
// pairs.
struct GvTokens {
    int count;  // live slots (the step's tokens)
    __device__ __forceinline__ long long x_row(int t) const { return t; }
    __device__ __forceinline__ long long y_row(int t) const { return t; }
};

// Chunk c's terms for each of the nt token slots (and matrix) added to its member sums.
template <int NMAT, int NT, class Chunk, class Slots>
__device__ __forceinline__ void gv_dot_chunk(const Chunk (&ch)[NMAT], float (&acc)[NMAT][NT], const signed char* xq,
                                             const float* xd, const int* xs, const Slots& slots, int c, int n_in,
                                             int nt) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        if (t < nt) {
            DpX x;
            dp_load_x(xq, xd, xs, slots.x_row(t), c, n_in, x);
#pragma unroll
            for (int m = 0; m < NMAT; ++m) acc[m][t] = ch[m].acc_dot(acc[m][t], x);
        }
    }
}

// NMAT = 1: Y = X W^T (+ bias) (+ Y when accumulate); NMAT = 2: Y = act(X W^T, X W2^T) (+ the (gate, up)
// bias pairs: dp4a.cuh's dp_store).
// slots.count <= NT token slots (X row slots.x_row(t), Y row slots.y_row(t)), all in one tile.
// GC: G when known at compile time (the _g16 and _g32 entries: dp4a.cuh's DP_GC), 0: from n_in
//
// A warp walks its rows (base, base + rows_per_pass, ...) as one stream of batches: a row's chunks in
// batches of U -- c0, c0 + G, ..., c0 + (U-1) G, dotted and added in that order, the canonical order
// whatever U is -- the same number of batches for every lane of the warp, and each batch's loads
// issued one batch ahead: while a batch is dotted (and a row's member sums meet), the next batch's
// loads -- the next row's first, at a row's end -- are in flight. (Fetched and dotted in one
// iteration, ptxas sinks each chunk's loads to just before its own dots, after the previous chunk's:
// one memory round a chunk, U = 4 no better than 1. It cannot move them across the loop's back edge.)
template <int QT, int NMAT, int NT, int GC = 0, class Slots = GvTokens>
__device__ __forceinline__ void gemv_rows(const unsigned char* __restrict__ W, const unsigned char* __restrict__ W2,
                                          const signed char* __restrict__ xq, const float* __restrict__ xd,
                                          const int* __restrict__ xs, const float* __restrict__ bias, float* Y,
                                          const Slots& slots, int n_out, int n_in, int has_bias, int accumulate,
                                          long long y_stride, int act = ACT_SILU) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_chunks = n_in / 32;
    const int G = GC ? GC : dp_group_lanes(n_chunks), g = lane % G, sub = lane / G, rows_per_warp = 32 / G;
    const int nt = slots.count < NT ? slots.count : NT;
    const long long row_bytes = gb_row_bytes<QT>(n_in);
    const int rows_per_pass = gridDim.x * GV_WARPS * rows_per_warp;
    constexpr int U = GvUnroll<QT, NT, NMAT>::value;
    const int batches = (n_chunks + U * G - 1) / (U * G);  // a row's, for every lane
    __shared__ DpCombine<NMAT, NT> comb[GV_WARPS];
    DpCombine<NMAT, NT>& cw = comb[warp];
    float acc[NMAT][NT];
#pragma unroll
    for (int m = 0; m < NMAT; ++m)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[m][t] = 0.0f;
    // Float weights are loaded where they are dotted: a chunk is 32 floats, and one in flight beside
    // the one being dotted would take every register.
    constexpr bool ahead = !GvUnroll<QT, NT, NMAT>::floats;
    typename DpChunk<QT>::Raw raw[U][NMAT];
    // coalesced runs: a batch's U runs of G chunks (each matrix), in flight as words, then through the
    // warp's own part of stage (a run of the warp's row `sub` at sub G WORDS)
    constexpr bool co = GvRun<QT>::on;
    constexpr int SW = 32 * GvRun<QT>::WORDS;  // a warp's words a (run, matrix)
    GvRun<QT> runs[co ? U : 1][NMAT];
    __shared__ __align__(16) unsigned stage[co ? GV_WARPS : 1][co ? U : 1][NMAT][co ? SW : 1];  // 16: Q4_K's loads
    auto slot = [&](int k, int m) { return &stage[warp][k][m][sub * G * GvRun<QT>::WORDS]; };  // this row's run k
    auto fetch = [&](int row, int bb) {  // batch bb of row `row`: its loads issued
        if constexpr (co) {  // a row past n_out loads the last row again, a run past the row's end its
                             // first (nothing reads them): no load waits behind a branch
            const long long rc = row < n_out ? row : n_out - 1;
#pragma unroll
            for (int m = 0; m < NMAT; ++m)
#pragma unroll
                for (int k = 0; k < U; ++k) {
                    const int cf = (bb * U + k) * G < n_chunks ? (bb * U + k) * G : 0;
                    gv_fetch_run<QT>(runs[k][m], (m ? W2 : W) + rc * row_bytes, cf, g, G, n_chunks);
                }
        } else if constexpr (ahead) {
            gv_fetch<QT, U, NMAT>(raw, W, W2, row_bytes, row, n_out, g + bb * U * G, G, n_chunks);
        }
    };
    int base = (blockIdx.x * GV_WARPS + warp) * rows_per_warp, b = 0;  // the batch at hand: row base + sub, batch b
    fetch(base + sub, 0);
    while (base < n_out) {
        const int cf0 = b * U * G, c0 = cf0 + g;  // the batch's first chunk; this lane's (run k: + k G)
        const bool live = base + sub < n_out;
        const unsigned char* rp[NMAT];  // the row
#pragma unroll
        for (int m = 0; m < NMAT; ++m) rp[m] = (m ? W2 : W) + (long long)(base + sub) * row_bytes;
        if constexpr (co) {  // the runs' words into stage, then each lane's own block out of it
            __syncwarp();    // every lane is done reading the previous batch's
#pragma unroll
            for (int k = 0; k < U; ++k)
                if (live && cf0 + k * G < n_chunks)
#pragma unroll
                    for (int m = 0; m < NMAT; ++m)
                        gv_stage_run<QT>(slot(k, m), runs[k][m], gv_span<QT>(rp[m], cf0 + k * G, G, n_chunks), g, G);
            __syncwarp();
        }
        DpChunk<QT> ch[U][NMAT];
#pragma unroll
        for (int k = 0; k < U; ++k)
            if (live && c0 + k * G < n_chunks)
#pragma unroll
                for (int m = 0; m < NMAT; ++m) {
                    if constexpr (co) {
                        // the run's chunk g (a block's chunk c mod CPB is g's: the run is whole blocks),
                        // its bytes mis past the staged words' start as past the loaded words'
                        const int mis = gv_span<QT>(rp[m], cf0 + k * G, G, n_chunks).mis;
                        const unsigned char* run = reinterpret_cast<const unsigned char*>(slot(k, m));
                        ch[k][m].unpack(DpChunk<QT>::fetch(run + mis, g), GC ? g & 7 : c0 + k * G);
                    } else if constexpr (ahead) {
                        ch[k][m].unpack(raw[k][m], GC ? g & 7 : c0 + k * G);
                    } else {
                        ch[k][m].load(rp[m], c0 + k * G);
                    }
                }
        // the next batch: this row's, or the next row's first
        const bool row_ends = b + 1 == batches;
        const int next_base = row_ends ? base + rows_per_pass : base, next_b = row_ends ? 0 : b + 1;
        fetch(next_base + sub, next_b);
#pragma unroll
        for (int k = 0; k < U; ++k)
            if (live && c0 + k * G < n_chunks) gv_dot_chunk<NMAT, NT>(ch[k], acc, xq, xd, xs, slots, c0 + k * G, n_in, nt);
        if (row_ends) {  // warp-uniform: the G member sums of each (row, token) meet in one lane (as dp4a)
            auto store = [&](int t, int r, const float(&v)[NMAT]) {
                dp_store<NMAT>(Y + slots.y_row(t) * y_stride + r, v[0], v[NMAT - 1], bias, r, has_bias, accumulate, act);
            };
            dp_combine<NMAT, GC != 0>(cw, acc, G, rows_per_warp, nt, base, n_out, store);  // LANES: dp4a.cuh
#pragma unroll
            for (int m = 0; m < NMAT; ++m)
#pragma unroll
                for (int t = 0; t < NT; ++t) acc[m][t] = 0.0f;
        }
        base = next_base;
        b = next_b;
    }
}
