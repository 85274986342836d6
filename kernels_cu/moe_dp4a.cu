// moe_dp4a.cu -- as moe_ffn.cu on q8_1 activations and __dp4a, grouped by expert: an expert's weights
// are read once per 8 of the (token, slot) pairs that chose it -- at decode, once per step however many
// tokens chose it.
//   moe_sort(ids, order, tiles, n_pairs, n_expert, max_tiles, tile)
//     a counting sort of the pairs by expert: order[] holds the pairs expert by expert; tiles
//     [3][max_tiles] = (expert, first index into order, count <= tile) for each group of up to
//     `tile` pairs of one expert (8 here, 64 for moe_mmq.cu), count 0 past the last. max_tiles =
//     ceil(n_pairs / tile) + min(n_expert, n_pairs) bounds them for any routing, so the launch
//     shapes below depend on n_pairs only.
//   moe_gate_up_dp4a_<type>(Wg, Wu, xq, xd, xs, order, tiles, G, k, n_ff, n_in, max_tiles, act, bias, has_bias)
//     G[p][j] = act(X[p / k] . Wg[e][j] (+ bg[e][j]), X[p / k] . Wu[e][j] (+ bu[e][j])) for the pairs p of each tile
//   moe_down_dp4a_<type>(Wd, xq, xd, xs, order, tiles, Y, n_out, n_in, max_tiles)
//     Y[p][j] = G[p] . Wd[e][j], G in q8_1 (rmsnorm_q8_1.cu's quantize_q8_1 over the pairs' rows)
//     the biases (gpt-oss) added to the float dots, before the activation: moe_args.cuh's layout
//   ..._g16 / _g32: G compiled in (as matmul_dp4a.cu's); then moe_ffn.cu's moe_combine adds the
//   pairs' outputs to x in rank order.
//   W*: the stacked experts as GGUF stores them (moe_ffn.cu); X in q8_1 as matmul_dp4a.cu reads it.
//
// Design: dp4a.cuh's per-type integer dots; a block takes one tile (one expert, up to 8 pairs) and 4
// warps of rows, loads each weight chunk once and dots it with every pair of the tile, as
// matmul_dp4a.cu does with its 8-token tiles.
// Launch: moe_sort: 1 block of 256 (2 experts a thread); the matmuls: block 128, grid
//   (ceil(n_out / (4 * 32 / G)) capped, max_tiles), the tiles past the last exit at once.
// Batch invariance: dp4a.cuh's canonical order (member g of a row's G lanes adds chunks g, g + G, ...;
// the G member sums folded by groups of 8: dp_fold), which depends on n_in only. Which pairs share a
// tile (the sort's order within a group comes from atomics) decides which block computes a pair,
// never its bits: a token's output is the same alone or in any batch.
// Bound: memory -- each chosen expert's matrices streamed once per 8 pairs. For many pairs,
// moe_mmq.cu: tiles of 64 pairs on int8 tensor cores, the same bits.
#include "dp4a.cuh"
#include "moe_args.cuh"

#define MOE_MAX_EXPERTS 512

extern "C" __global__ void moe_sort(const int* ids, int* order, int* tiles, int n_pairs, int n_expert, int max_tiles,
                                    int tile) {
    sharpinf_pdl_enter();
    __shared__ int count[MOE_MAX_EXPERTS], start[MOE_MAX_EXPERTS], red[32];
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) atomicAdd(&count[ids[p]], 1);
    __syncthreads();
    // Groups in expert order, cut into tiles of `tile` pairs: thread j takes experts 2j and 2j + 1 (a
    // block of 256 covers MOE_MAX_EXPERTS), whose first pair and first tile are block prefix sums of the
    // counts and of the tiles (thread 0 walking every expert in turn costs a few us at decode)
    const int e0 = 2 * threadIdx.x;
    const int c0 = e0 < n_expert ? count[e0] : 0, c1 = e0 + 1 < n_expert ? count[e0 + 1] : 0;
    const int t0 = (c0 + tile - 1) / tile, t1 = (c1 + tile - 1) / tile;
    int pairs_all, tiles_all;
    const int at = block_exclusive_sum<int>(c0 + c1, red, &pairs_all);
    int n = block_exclusive_sum<int>(t0 + t1, red, &tiles_all);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int e = e0 + h, ce = h ? c1 : c0, first = h ? at + c0 : at;
        if (e >= n_expert) break;
        start[e] = first;
        for (int c = 0; c < ce; c += tile, ++n) {
            tiles[n] = e;
            tiles[max_tiles + n] = first + c;
            tiles[2 * max_tiles + n] = ce - c < tile ? ce - c : tile;
        }
    }
    for (int i = tiles_all + threadIdx.x; i < max_tiles; i += blockDim.x) tiles[2 * max_tiles + i] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) order[atomicAdd(&start[ids[p]], 1)] = p;
}

// dp4a.cuh's dp4a_rows for one tile: rows of expert e's matrix, the tile's pairs as its tokens
// (input row p / x_div, output row p). GC: G when known at compile time (the _g16 and _g32 entries, as
// matmul_dp4a.cu's: offsets folded, a row's end folded on the lanes), 0: from n_in.
template <int QT, int NMAT, int GC = 0>
__device__ __forceinline__ void moe_dp4a_rows(const unsigned char* __restrict__ W, const unsigned char* __restrict__ W2,
                                              const signed char* __restrict__ xq, const float* __restrict__ xd,
                                              const int* __restrict__ xs, const int* __restrict__ order,
                                              const int* __restrict__ tiles, float* __restrict__ Y, int x_div,
                                              int n_out, int n_in, int max_tiles, int act, const float* bias,
                                              int has_bias) {
    const int tile = blockIdx.y, nt = tiles[2 * max_tiles + tile];
    if (nt == 0) return;  // block-uniform: past the last tile
    const int expert = tiles[tile], first = tiles[max_tiles + tile];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_chunks = n_in / 32;
    const int G = GC ? GC : dp_group_lanes(n_chunks), g = lane % G, rows_per_warp = 32 / G;
    const long long row_bytes = gb_row_bytes<QT>(n_in);
    const long long w_at = (long long)expert * n_out * row_bytes;
    const float* eb = bias + (long long)expert * n_out * NMAT;  // the expert's biases (read with has_bias)
    const int rows_per_pass = gridDim.x * DP_WARPS * rows_per_warp;
    // the tile's pairs and their X rows, divided here once (dividing in the chunk loop, ptxas redoes the
    // 8 divisions every chunk)
    int pair[DP_TILE], xrow[DP_TILE];
#pragma unroll
    for (int t = 0; t < DP_TILE; ++t) {
        pair[t] = t < nt ? order[first + t] : 0;
        xrow[t] = pair[t] / x_div;
    }
    __shared__ DpCombine<NMAT> comb[DP_WARPS];
    DpCombine<NMAT>& cw = comb[warp];
    for (int base = (blockIdx.x * DP_WARPS + warp) * rows_per_warp; base < n_out; base += rows_per_pass) {
        const int row = base + lane / G;
        float acc[NMAT][DP_TILE];
#pragma unroll
        for (int m = 0; m < NMAT; ++m)
#pragma unroll
            for (int t = 0; t < DP_TILE; ++t) acc[m][t] = 0.0f;
        if (row < n_out) {
            const unsigned char* wrow[2] = {W + w_at + (long long)row * row_bytes,
                                            (NMAT > 1 ? W2 : W) + w_at + (long long)row * row_bytes};
            for (int c = g; c < n_chunks; c += G) {
                DpChunk<QT> ch[NMAT];
#pragma unroll
                for (int m = 0; m < NMAT; ++m) dp_load_at(ch[m], wrow[m], c, GC ? g & 7 : c);
#pragma unroll
                for (int t = 0; t < DP_TILE; ++t) {
                    if (t < nt) {
                        DpX x;
                        dp_load_x(xq, xd, xs, xrow[t], c, n_in, x);
#pragma unroll
                        for (int m = 0; m < NMAT; ++m) acc[m][t] = ch[m].acc_dot(acc[m][t], x);
                    }
                }
            }
        }
        auto store = [&](int t, int r, const float(&v)[NMAT]) {
            dp_store<NMAT>(Y + (long long)pair[t] * n_out + r, v[0], v[NMAT - 1], eb, r, has_bias, 0, act);
        };
        dp_combine<NMAT, GC != 0>(cw, acc, G, rows_per_warp, nt, base, n_out, store);
    }
}

template <int QT> __device__ __forceinline__ void moe_gate_up_dp4a_t(MOE_GATE_UP_PARAMS) {
    moe_dp4a_rows<QT, 2>(Wg, Wu, xq, xd, xs, order, tiles, G, k, n_ff, n_in, max_tiles, act, bias, has_bias);
}
template <int QT> __device__ __forceinline__ void moe_down_dp4a_t(MOE_DOWN_PARAMS) {
    moe_dp4a_rows<QT, 1>(Wd, Wd, xq, xd, xs, order, tiles, Y, 1, n_out, n_in, max_tiles, ACT_SILU, Y, 0);
}
GB_ALL_ENTRIES(moe_gate_up_dp4a, , (MOE_GATE_UP_PARAMS), moe_gate_up_dp4a_t, MOE_GATE_UP_NAMES)
GB_ALL_ENTRIES(moe_down_dp4a, , (MOE_DOWN_PARAMS), moe_down_dp4a_t, Wd, xq, xd, xs, order, tiles, Y, n_out, n_in, max_tiles)
// ..._g16 / _g32: G compiled in (ops/moe.py picks them by entry_name, as the dense launchers). (GL, not G:
// moe_args.cuh's G is the gate+up output.)
#define MOE_DP4A_G(GL)                                                                                          \
    template <int QT> __device__ __forceinline__ void moe_gate_up_dp4a_g##GL(MOE_GATE_UP_PARAMS) {              \
        DP_ASSUME_G(n_in, GL);                                                                                  \
        moe_dp4a_rows<QT, 2, DP_GC(GL)>(Wg, Wu, xq, xd, xs, order, tiles, G, k, n_ff, n_in, max_tiles, act, bias, \
                                        has_bias);                                                              \
    }                                                                                                           \
    template <int QT> __device__ __forceinline__ void moe_down_dp4a_g##GL(MOE_DOWN_PARAMS) {                    \
        DP_ASSUME_G(n_in, GL);                                                                                  \
        moe_dp4a_rows<QT, 1, DP_GC(GL)>(Wd, Wd, xq, xd, xs, order, tiles, Y, 1, n_out, n_in, max_tiles, ACT_SILU, \
                                        Y, 0);                                                                  \
    }                                                                                                           \
    GB_QUANT_ENTRIES(moe_gate_up_dp4a, _g##GL, (MOE_GATE_UP_PARAMS), moe_gate_up_dp4a_g##GL, MOE_GATE_UP_NAMES)  \
    GB_QUANT_ENTRIES(moe_down_dp4a, _g##GL, (MOE_DOWN_PARAMS), moe_down_dp4a_g##GL, Wd, xq, xd, xs, order, tiles,  \
                     Y, n_out, n_in, max_tiles)
MOE_DP4A_G(16)
MOE_DP4A_G(32)
