// moe_mmq.cu -- as moe_dp4a.cu on int8 tensor cores for steps of many tokens: each expert's pairs in
// tiles of up to 64, matmul_mmq.cu's blocks (mmq_rows.cuh) over one expert's rows.
//
//   moe_gate_up_mmq_<type>(Wg, Wu, xq, xd, xs, order, tiles, G, k, n_ff, n_in, max_tiles, act, bias,
//       has_bias, partial, tickets, x0)
//   moe_down_mmq_<type>(Wd, xq, xd, xs, order, tiles, Y, n_out, n_in, max_tiles, partial, tickets, x0)
//     the arguments and results of moe_dp4a.cu's entries, for the quantized types, with moe_dp4a.cu's
//     moe_sort run with tiles of 64 pairs (its `tile` argument): tiles[3][max_tiles] = (expert, first
//     index into order, count <= 64), count 0 past the last; then matmul_mmq.cu's split-K scratch
//     (mmq_rows.cuh's MqSplit), a tile being (row tile, pair tile).
//
// Design: a block takes a tile of up to 64 pairs and 64 rows of the expert's matrix and runs
// mmq_rows.cuh on them -- each weight chunk unpacked once for all 64 pairs into shared memory, int8
// mma.m16n8k32 for the dots, dp4a's float terms in the canonical order (dp4a.cuh) -- so an expert's
// weights are read once per 64 of its pairs instead of once per 8. The tile's pair indices are staged
// in shared memory: MqPairs maps slot i to X row order[first + i] / x_div (its token) and Y row
// order[first + i] (its pair).
// Split-K as matmul_mmq.cu: a block for each group of 8 members, the group sums in the scratch, each
// tile's last block folds them. The scratch is sized by the bound on tiles (max_tiles, so by the
// token count: a graph recorded once serves every routing); a tile past the last exits before its
// ticket, so its blocks leave nothing behind. A window is at least one row tile over every pair
// tile, so the scratch can pass matmul_mmq.py's 64 MB: Qwen3-30B-A3B's gate+up at a capacity of
// 8,192 tokens, 144 MB in windows of one row tile (12 launches).
// Launch: gate_up block 256 (8 warps, both matrices), down block 128; grid (row tiles of the window,
//   max_tiles, groups); tiles past the last exit at once. gate_up: __launch_bounds__(256, 2) (1 for
//   Q5_K and Q6_K).
// Batch invariance: the bits are dp4a's -- which pairs share a tile, and which kernel computes a
//   pair, never change them, so a token's output is the same alone, in any batch, on either path.
// Bound: as matmul_mmq.cu's at the same tokens per tile; a prefill step's experts get
//   n_tokens * k / n_expert pairs each on average (Qwen3-30B-A3B, 512 tokens: 32), so most tiles
//   are partly filled -- the n8 tiles past a tile's last pair skip their work.
#include "mmq_rows.cuh"
#include "moe_args.cuh"

// One expert's tile of pairs (moe_sort's tile blockIdx.y), its pair indices in shared memory.
struct MqPairs {
    // no branch-free copy of mmq_rows's terms for full warp tiles: an expert's tiles are mostly partly
    // filled (32 pairs an expert on average at 512 tokens of Qwen3-30B-A3B), and the copy's registers
    // would cost a block of 8 warps an SM
    static constexpr bool FULL_COPY = false;
    int count;         // pairs in the tile (<= MQ_TOKENS)
    const int* pairs;  // shared [count]: the tile's pairs, in the sort's order
    const int* xrows;  // shared [count]: their X rows, pair p / x_div (k for gate/up: token p / k; 1 for down:
                       // the pair's own row), divided once a block, not once a chunk by every stager
    __device__ __forceinline__ long long x_row(int slot) const { return xrows[slot]; }
    __device__ __forceinline__ long long y_row(int slot) const { return pairs[slot]; }
};

template <int QT, int NMAT>
__device__ __forceinline__ void moe_mmq_rows(const unsigned char* W, const unsigned char* W2, const signed char* xq,
                                             const float* xd, const int* xs, const int* order, const int* tiles,
                                             float* Y, int x_div, int n_out, int n_in, int max_tiles, int act,
                                             const float* bias, int has_bias, MqSplit split) {
    __shared__ int pairs[MQ_TOKENS], xrows[MQ_TOKENS];
    const int tile = blockIdx.y, count = tiles[2 * max_tiles + tile];
    if (count == 0) return;  // block-uniform: past the last tile
    const int first = tiles[max_tiles + tile];
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
        pairs[i] = order[first + i];
        xrows[i] = pairs[i] / x_div;
    }
    __syncthreads();
    const long long w_at = (long long)tiles[tile] * n_out * gb_row_bytes<QT>(n_in);  // the expert's rows
    const float* eb = bias + (long long)tiles[tile] * n_out * NMAT;                   // and biases (has_bias)
    mmq_rows<QT, NMAT, MqPairs>(W + w_at, W2 + w_at, xq, xd, xs, eb, Y, MqPairs{count, pairs, xrows}, n_out, n_in,
                                has_bias, 0, (long long)n_out, act, split);
}

// moe_dp4a.cu's arguments, then the split-K scratch
#define MOE_SPLIT_PARAMS float *partial, int *tickets, int x0
template <int QT> __device__ __forceinline__ void moe_gate_up_mmq_t(MOE_GATE_UP_PARAMS, MOE_SPLIT_PARAMS) {
    moe_mmq_rows<QT, 2>(Wg, Wu, xq, xd, xs, order, tiles, G, k, n_ff, n_in, max_tiles, act, bias, has_bias,
                        MqSplit{partial, tickets, x0});
}
template <int QT> __device__ __forceinline__ void moe_down_mmq_t(MOE_DOWN_PARAMS, MOE_SPLIT_PARAMS) {
    moe_mmq_rows<QT, 1>(Wd, Wd, xq, xd, xs, order, tiles, Y, 1, n_out, n_in, max_tiles, ACT_SILU, Y, 0,
                        MqSplit{partial, tickets, x0});
}
// The gate+up entries (256 threads) held to 2 blocks an SM (1 for Q5_K and Q6_K): unbounded, ptxas
// spends registers on the split-K epilogue's batched loads (mmq_rows.cuh's MQ_FOLD), a block an SM fewer.
#define MOE_GATE_UP_BOUNDS(QT) __launch_bounds__(256, (QT) == GB_Q5_K || (QT) == GB_Q6_K ? 1 : 2)
GB_QUANT_ENTRIES_ATTRS(moe_gate_up_mmq, , MOE_GATE_UP_BOUNDS, (MOE_GATE_UP_PARAMS, MOE_SPLIT_PARAMS), moe_gate_up_mmq_t,
                       MOE_GATE_UP_NAMES, partial, tickets, x0)
GB_QUANT_ENTRIES(moe_down_mmq, , (MOE_DOWN_PARAMS, MOE_SPLIT_PARAMS), moe_down_mmq_t, Wd, xq, xd, xs, order, tiles, Y, n_out,
                 n_in, max_tiles, partial, tickets, x0)
