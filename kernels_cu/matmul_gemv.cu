// matmul_gemv.cu -- as matmul_dp4a.cu for decode: Y = X W^T for steps of 1..8 tokens, with more
// weight bytes in flight per lane, streamed.
//
//   matmul_gemv_<type>_t<NT>(W, Xq, Xd, Xs, bias, Y, n_tokens, n_out, n_in, has_bias, accumulate, y_stride)
//   matmul_gemv_<type>_t<NT>_g16 / _g32: G compiled in (as matmul_dp4a.cu's)
//     the arguments of matmul_dp4a_<type>; NT = 1, 2, 4 or 8 (the launcher picks the smallest NT >= n_tokens)
//
// Why: bandwidth needs bytes in flight -- by Little's law ~2-3 MB over the device (~20-30 KB an SM) --
// and a dp4a lane has one chunk (18 bytes of Q4_K) in flight at a time: its row loop loads a chunk
// and dots it before the next load issues, so a row of n_in = 4096 (4 chunks a lane) is 4 round
// trips to HBM, 12 for the 8B down projection. Against matmul_dp4a.cu (the row loop: gemv_rows.cuh):
//   * the token count is a template parameter NT, so a 1-token step holds 1 accumulator, not 8;
//   * a lane fetches its chunks in batches of U (gemv_rows.cuh's GvUnroll: 4 Q4_K chunks at NT <= 2,
//     2 at NT = 4, 1 at NT = 8; Q5_K and Q6_K half as many; halved for the gate+up pair), each batch's
//     loads issued one batch ahead, across the loop's back edge -- while a batch is dotted, the next
//     is in flight;
//   * a warp walks its rows as one stream of batches, the next row's first batch fetched before the
//     current row's member sums meet, and the grid is one wave (the blocks the device holds at once,
//     ops/matmul_gemv.py): a warp's loads are in flight from its first row to its last;
//   * one token tile only (grid.y = 1): the launcher sends steps of more than 8 tokens to dp4a;
//   * the 2-byte aligned types (Q4_0, Q5_0, Q8_0, Q6_K) load the G chunks a row's lanes take together
//     as one run of consecutive words, handed to their lanes through shared memory (gemv_rows.cuh's
//     GV_COALESCE).
// Launch: block 128 threads (4 warps), grid = (min(ceil(n_out / (4 * 32 / G)), the blocks resident at
// once), 1); static shared memory 4 warps x NT x 33 floats, each warp's padded to 16 bytes (NT = 1: 576
// bytes), and for the coalesced types each warp's runs, U x 32 lanes x GvRun::WORDS words (Q8_0 at NT =
// 1: 18 KB a block).
// Batch invariance: every output bit equals dp4a's, at every N -- the row grouping G (from n_in), each
// member's chunks g, g + G, g + 2G, ... added in that order, the member-order combine in shared
// memory, the per-chunk float terms (dp4a.cuh's DpChunk), the epilogue. Fetching ahead changes when a
// chunk is read, not the order its term is added.
// Bound: memory -- every weight byte once per step; the target is the device's read bandwidth
// (>= 70% of the measured copy bandwidth on the 8B shapes). In flight an SM at NT = 1, Q4_K: 16 warps
// x 32 lanes x 4 chunks x 18 bytes = 37 KB (dp4a: ~40 warps x 32 x 18 = 23 KB, one round trip a
// chunk). GV_U=2 (a probe) trades half the batch for 72 registers (28 warps an SM).
#include "gemv_rows.cuh"

#define GV_ARGS                                                                                                  \
    const unsigned char *W, const signed char *xq, const float *xd, const int *xs, const float *bias, float *Y, \
        int n_tokens, int n_out, int n_in, int has_bias, int accumulate, int y_stride
#define GV_PASS W, W, xq, xd, xs, bias, Y, GvTokens{n_tokens}, n_out, n_in, has_bias, accumulate, (long long)y_stride

// One entry per weight type and token count, matmul_gemv_<type>_t<NT>, and ..._t<NT>_g16 / _g32 where G is
// 16 or 32 (a compile-time G: dp4a.cuh) (GB_ENTRIES, ggml_blocks.cuh).
#define GV_MATMUL_G(NT, G)                                                                                      \
    template <int QT> __device__ __forceinline__ void gemv_matmul_t##NT##_g##G(GV_ARGS) {                       \
        dp_prefetch_then_wait<QT, 1, G>(W, W, n_out, n_in);                                                     \
        DP_ASSUME_G(n_in, G);                                                                                   \
        gemv_rows<QT, 1, NT, DP_GC(G)>(GV_PASS);                                                                 \
    }                                                                                                           \
    GB_QUANT_ENTRIES(matmul_gemv, _t##NT##_g##G, (GV_ARGS), gemv_matmul_t##NT##_g##G, W, xq, xd, xs, bias, Y, n_tokens, \
               n_out, n_in, has_bias, accumulate, y_stride)
#define GV_MATMUL(NT)                                                                                           \
    template <int QT> __device__ __forceinline__ void gemv_matmul_t##NT(GV_ARGS) {                              \
        dp_prefetch_then_wait<QT, 1, 0>(W, W, n_out, n_in);                                                     \
        gemv_rows<QT, 1, NT>(GV_PASS);                                                                          \
    }                                                                                                           \
    GB_ENTRIES(matmul_gemv, _t##NT, (GV_ARGS), gemv_matmul_t##NT, W, xq, xd, xs, bias, Y, n_tokens, n_out, n_in,     \
               has_bias, accumulate, y_stride)                                                                  \
    GV_MATMUL_G(NT, 16)                                                                                         \
    GV_MATMUL_G(NT, 32)
// Programmatic dependent launch (common.cuh): trigger at the top, wait after the prefetch of the first
// rows (as matmul_dp4a.cu)
#undef SHARPINF_PDL_AT_ENTRY
#define SHARPINF_PDL_AT_ENTRY sharpinf_pdl_trigger
GV_MATMUL(1)
GV_MATMUL(2)
GV_MATMUL(4)
GV_MATMUL(8)
