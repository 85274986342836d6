// matmul_gemv.cu -- variant of matmul_dp4a.cu for decode: Y = X W^T for steps of 1..8 tokens,
// with more weight bytes in flight per lane.
//
//   matmul_gemv_<type>_t<NT>(W, Xq, Xd, Xs, bias, Y, n_tokens, n_out, n_in, has_bias, accumulate, y_stride)
//     the arguments of matmul_dp4a_<type>; NT = 1, 2, 4 or 8 (the launcher picks the smallest NT >= n_tokens)
//
// Why: at N = 1 the dp4a kernel reaches 26-46% of an H100's copy bandwidth on the Qwen3-8B shapes.
// Its token tile is fixed at 8, so every lane holds 8 accumulators per matrix (and the unrolled
// token loop's registers) whether the step has 1 token or 8; that is why loading several weight
// chunks ahead (DP_UNROLL = 4) cost occupancy there and measured slower. Bandwidth needs bytes in
// flight: by Little's law ~2-3 MB over an H100 (~15-20 KB per SM), and one 16-34 byte chunk per
// lane of ~16 resident warps is about half that.
// What changes against matmul_dp4a.cu:
//   * the token count is a template parameter NT, so a 1-token step holds 1 accumulator, not 8;
//   * a lane issues the loads of U weight chunks before dotting any (U = 4 for NT <= 2, 2 for
//     NT = 4, 1 for NT = 8; halved for the gate+up pair): 4x the bytes in flight at decode;
//   * one token tile only (grid.y = 1): the launcher sends steps of more than 8 tokens to dp4a.
// What stays the same (so every output bit equals dp4a's, at every N): the row grouping G (from
// n_in), each member's chunks g, g + G, g + 2G, ... added in that order, the member-order combine
// in shared memory, the per-chunk float terms (dp4a.cuh's DpChunk), the epilogue. Loading ahead
// changes when a chunk is read, not the order its term is added.
// Launch: block 128 threads (4 warps), grid = (ceil(n_out / (4 * 32 / G)) capped, 1); static shared
// memory 4 warps x NT x 33 floats (NT = 1: 528 bytes).
// Bound: memory -- every weight byte once per step; the target is the device's read bandwidth
// (>= 70% of the measured copy bandwidth on the 8B shapes). First thing to check on a GPU: registers
// and occupancy per NT (ptxas report), then achieved DRAM throughput per type in the kernels suite.
#include "gemv_rows.cuh"

#define GV_ARGS                                                                                                  \
    const unsigned char *W, const signed char *xq, const float *xd, const int *xs, const float *bias, float *Y, \
        int n_tokens, int n_out, int n_in, int has_bias, int accumulate, int y_stride
#define GV_PASS W, W, xq, xd, xs, bias, Y, n_tokens, n_out, n_in, has_bias, accumulate, (long long)y_stride

// One entry per weight type and token count, matmul_gemv_<type>_t<NT>, and ..._t<NT>_g16 / _g32 where G is
// 16 or 32 (a compile-time G: dp4a.cuh) (GB_ENTRIES, ggml_blocks.cuh).
#define GV_MATMUL_G(NT, G)                                                                                      \
    template <int QT> __device__ __forceinline__ void gemv_matmul_t##NT##_g##G(GV_ARGS) {                       \
        DP_ASSUME_G(n_in, G);                                                                                   \
        gemv_rows<QT, 1, NT, DP_GC(G)>(GV_PASS);                                                                 \
    }                                                                                                           \
    GB_PACKED_ENTRIES(matmul_gemv, _t##NT##_g##G, (GV_ARGS), gemv_matmul_t##NT##_g##G, W, xq, xd, xs, bias, Y, n_tokens, \
               n_out, n_in, has_bias, accumulate, y_stride)
#define GV_MATMUL(NT)                                                                                           \
    template <int QT> __device__ __forceinline__ void gemv_matmul_t##NT(GV_ARGS) { gemv_rows<QT, 1, NT>(GV_PASS); } \
    GB_ENTRIES(matmul_gemv, _t##NT, (GV_ARGS), gemv_matmul_t##NT, W, xq, xd, xs, bias, Y, n_tokens, n_out, n_in,     \
               has_bias, accumulate, y_stride)                                                                  \
    GV_MATMUL_G(NT, 16)                                                                                         \
    GV_MATMUL_G(NT, 32)
GV_MATMUL(1)
GV_MATMUL(2)
GV_MATMUL(4)
GV_MATMUL(8)
