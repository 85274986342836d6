// moe_gemv.cu -- as moe_dp4a.cu with matmul_gemv.cu's row stream, for decode: the experts' matvecs of
// a step of 1..8 tokens -- the token count compiled in, several weight chunks in flight a lane.
//
//   moe_gate_up_gemv_<type>_t<NT>(Wg, Wu, xq, xd, xs, order, tiles, G, k, n_ff, n_in, max_tiles, act, bias, has_bias)
//   moe_down_gemv_<type>_t<NT>(Wd, xq, xd, xs, order, tiles, Y, n_out, n_in, max_tiles)
//     moe_dp4a.cu's arguments and results (moe_args.cuh), with moe_dp4a.cu's moe_sort run with tiles of
//     NT pairs (its `tile` argument): NT >= the step's tokens, and a token's k experts are k different
//     ones, so an expert's pairs are at most NT -- one tile an expert, its weights read once a step;
//     and ..._t<NT>_g16 / _g32 where G is 16 or 32 (a compile-time G, as matmul_gemv.cu). NT = 1, 2,
//     4 or 8: the launcher (ops/moe.py's moe_gemv) picks the smallest NT >= the step's tokens.
//
// Why: at decode each chosen expert is a small matvec (Qwen3-30B-A3B: gate+up 2 x 768 x 2048, down
// 2048 x 768, 8 experts a token), and moe_dp4a.cu's lanes hold one weight chunk in flight each (its
// dp4a row loop: a load, then its dots), with 8 accumulators a lane for a tile of 1 pair. Here a
// block runs gemv_rows.cuh on one expert's rows: U chunks a lane fetched a batch ahead, a warp's rows
// one stream, NT accumulators (matmul_gemv.cu's header says what that buys a dense matvec).
// Tiles: a block takes tile blockIdx.y (an expert's pairs: the slots of GvPairs below) and rows
// blockIdx.x, blockIdx.x + gridDim.x, ... of 4 warps each (32 / G rows a warp); tiles past the last
// exit at once.
// Launch: block 128, grid (row blocks, max_tiles): the row blocks one wave of the device spread over
// the experts a step can choose (ops/moe.py), so each warp streams several rows; shared memory as
// matmul_gemv.cu, and NT ints (the tile's pairs).
// Batch invariance: every bit equals moe_dp4a's, hence moe_mmq's -- dp4a.cuh's canonical order and
// float terms; which pairs share a tile (the sort's order within an expert comes from atomics)
// decides which lane computes a pair, never its bits.
// Bound: memory -- each chosen expert's rows read once a step (Qwen3-30B-A3B Q4_K: ~21 MB a layer's
// 8 experts at one token, ~5 us at 4 TB/s); the token's router, the sort and the combine are their own
// launches.
#include "gemv_rows.cuh"
#include "moe_args.cuh"

// One expert's tile of up to NT pairs: slot t reads X row xrow[t] (its token: pair / x_div) and writes
// Y row pairs[t] (the pair). xrow in registers (gemv_rows reads it for each chunk, at compile-time t);
// pairs in shared memory (read once a row, at the combine's run-time t).
template <int NT> struct GvPairs {
    int count;
    int xrow[NT];
    const int* pairs;
    __device__ __forceinline__ long long x_row(int t) const { return xrow[t]; }
    __device__ __forceinline__ long long y_row(int t) const { return pairs[t]; }
};

template <int QT, int NMAT, int NT, int GC>
__device__ __forceinline__ void moe_gemv_rows(const unsigned char* W, const unsigned char* W2, const signed char* xq,
                                              const float* xd, const int* xs, const int* order, const int* tiles,
                                              float* Y, int x_div, int n_out, int n_in, int max_tiles, int act,
                                              const float* bias, int has_bias) {
    __shared__ __align__(16) int pairs[NT];
    const int tile = blockIdx.y, count = tiles[2 * max_tiles + tile];
    if (count == 0) return;  // block-uniform: past the last tile
    const int first = tiles[max_tiles + tile];
    if ((int)threadIdx.x < NT) pairs[threadIdx.x] = (int)threadIdx.x < count ? order[first + threadIdx.x] : 0;
    __syncthreads();
    GvPairs<NT> slots;
    slots.count = count < NT ? count : NT;  // the sort's tiles hold at most NT (its `tile`)
    slots.pairs = pairs;
#pragma unroll
    for (int t = 0; t < NT; ++t) slots.xrow[t] = pairs[t] / x_div;
    const long long w_at = (long long)tiles[tile] * n_out * gb_row_bytes<QT>(n_in);  // the expert's rows
    const float* eb = bias + (long long)tiles[tile] * n_out * NMAT;                   // and biases (has_bias)
    gemv_rows<QT, NMAT, NT, GC>(W + w_at, W2 + w_at, xq, xd, xs, eb, Y, slots, n_out, n_in, has_bias, 0, (long long)n_out,
                                act);
}

// moe_gate_up_gemv_<type>_t<NT>, moe_down_gemv_<type>_t<NT> (G from n_in), and their _g16 / _g32
// entries (G compiled in: DP_ASSUME_G, DP_GC). (GL, not G: moe_args.cuh's G is the gate+up output.)
// Q8_0 and Q6_K at one token held to 4 blocks an SM (128 registers), what matmul_gemv's entries take
// unbounded (unbounded here ptxas takes more, a block an SM fewer). The others, and every entry of 2
// or more tokens, unbounded: a looser bound lets ptxas take more, a tighter one spills.
#define MOE_GEMV_BOUNDS_T1(QT) MOE_GEMV_BOUNDS_##QT
#define MOE_GEMV_BOUNDS_T2(QT)
#define MOE_GEMV_BOUNDS_T4(QT)
#define MOE_GEMV_BOUNDS_T8(QT)
#define MOE_GEMV_BOUNDS_GB_Q8_0 __launch_bounds__(128, 4)
#define MOE_GEMV_BOUNDS_GB_Q6_K __launch_bounds__(128, 4)
#define MOE_GEMV_BOUNDS_GB_F32
#define MOE_GEMV_BOUNDS_GB_F16
#define MOE_GEMV_BOUNDS_GB_BF16
#define MOE_GEMV_BOUNDS_GB_Q4_0
#define MOE_GEMV_BOUNDS_GB_Q4_1
#define MOE_GEMV_BOUNDS_GB_Q5_0
#define MOE_GEMV_BOUNDS_GB_Q5_1
#define MOE_GEMV_BOUNDS_GB_Q4_K
#define MOE_GEMV_BOUNDS_GB_Q5_K
#define MOE_GEMV_FNS(NT, SFX, ASSUME, GC)                                                                       \
    template <int QT> __device__ __forceinline__ void moe_gate_up_gemv_t##NT##SFX(MOE_GATE_UP_PARAMS) {         \
        ASSUME;                                                                                                 \
        moe_gemv_rows<QT, 2, NT, GC>(Wg, Wu, xq, xd, xs, order, tiles, G, k, n_ff, n_in, max_tiles, act, bias,  \
                                     has_bias);                                                                 \
    }                                                                                                           \
    template <int QT> __device__ __forceinline__ void moe_down_gemv_t##NT##SFX(MOE_DOWN_PARAMS) {               \
        ASSUME;                                                                                                 \
        moe_gemv_rows<QT, 1, NT, GC>(Wd, Wd, xq, xd, xs, order, tiles, Y, 1, n_out, n_in, max_tiles, ACT_SILU,  \
                                     Y, 0);                                                                     \
    }
#define MOE_GEMV_G(NT, GL)                                                                                        \
    MOE_GEMV_FNS(NT, _g##GL, DP_ASSUME_G(n_in, GL), DP_GC(GL))                                                    \
    GB_QUANT_ENTRIES_ATTRS(moe_gate_up_gemv, _t##NT##_g##GL, MOE_GEMV_BOUNDS_T##NT, (MOE_GATE_UP_PARAMS),              \
                            moe_gate_up_gemv_t##NT##_g##GL, MOE_GATE_UP_NAMES)                                    \
    GB_QUANT_ENTRIES_ATTRS(moe_down_gemv, _t##NT##_g##GL, MOE_GEMV_BOUNDS_T##NT, (MOE_DOWN_PARAMS),                    \
                            moe_down_gemv_t##NT##_g##GL, Wd, xq, xd, xs, order, tiles, Y, n_out, n_in, max_tiles)
#define MOE_GEMV(NT)                                                                                              \
    MOE_GEMV_FNS(NT, , (void)0, 0)                                                                                \
    GB_ENTRIES_ATTRS(moe_gate_up_gemv, _t##NT, MOE_GEMV_BOUNDS_T##NT, (MOE_GATE_UP_PARAMS), moe_gate_up_gemv_t##NT,      \
                     MOE_GATE_UP_NAMES)                                                                           \
    GB_ENTRIES_ATTRS(moe_down_gemv, _t##NT, MOE_GEMV_BOUNDS_T##NT, (MOE_DOWN_PARAMS), moe_down_gemv_t##NT, Wd, xq, xd,   \
                     xs, order, tiles, Y, n_out, n_in, max_tiles)                                                 \
    MOE_GEMV_G(NT, 16)                                                                                            \
    MOE_GEMV_G(NT, 32)
MOE_GEMV(1)
MOE_GEMV(2)
MOE_GEMV(4)
MOE_GEMV(8)
