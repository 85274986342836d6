// matmul_dp4a.cu -- as matmul.cu with X in q8_1 and integer dot products: Y = X W^T.
//
//   matmul_dp4a_<type>(W, Xq, Xd, Xs, bias, Y, n_tokens, n_out, n_in, has_bias, accumulate, y_stride)
//   matmul_dp4a_<type>_g16 / _g32: the same with G (below) compiled in, for n_in 512..1023 / >= 1024
//     W      raw GGUF rows, as matmul.cu (<type>: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k;
//            the _g entries: the quantized types)
//     Xq/Xd/Xs  the activations in q8_1 (sharpinf/ops/quant_act.py): int8 [n_tokens, n_in],
//            float scale and int sum [n_tokens, n_in / 32]
//     Y      float rows of y_stride floats: Y[t][r] = sum (+ bias[r]) (+ Y[t][r] when accumulate:
//            the residual add x += o W^T fused, in the order x + (...) as elementwise.cu's add)
//   n_in a multiple of 32 (256 for the K-quants).
//
// Design (the unpackers and the row loop: dp4a.cuh, which gate_up_dp4a.cu shares):
//   * activations are q8_1, quantized once per step (rmsnorm_q8_1.cu): 4x fewer activation bytes;
//   * each 32-value chunk of a weight row is unpacked into 8 words of 4 int8 and dotted with the
//     activation block by __dp4a (int32, exact): per type, sum_j w_j x_j becomes
//       legacy types   (d_w d_x) * idot  [- off * s_x]  [+ (m_w d_x) * s_x]
//       K-quants       (d sc d_x) * idot - (dmin m d_x) * s_x   (Q6_K: two 16-value halves)
//     so the only float operations per chunk are those few products and one add;
//   * weights read in 32-bit words (the 2-byte aligned blocks -- q8_0, q4_0, q5_0, q6_k -- as the
//     aligned words covering the span, funnel-shifted apart: dp4a.cuh's DpSpanA2; a q8_0 chunk is
//     10 loads, a q6_k chunk 20), 128-bit loads for the K-quants' 16-aligned header and quants (a
//     q4_k chunk: 3 loads), 64-bit ones for q5_1 (24-byte blocks) and 128-bit ones for X;
//   * all lanes busy at every n_in: a row is split over G = min(32, 2^floor(log2(n_in/32))) lanes,
//     so a warp takes 32/G rows (n_in = 576: 16 lanes a row, 2 rows a warp); the _g entries fold a
//     chunk's place in its super-block and its offsets into constants.
// Launch: block 128 threads (4 warps), 4.2 KB static shared memory (8.4 KB for the gate/up pair:
// the member sums of a pass); grid = (ceil(n_out / (4 * 32 / G)) capped, ceil(n_tokens / 8)).
// Batch invariance, the canonical order every q8_1 matmul kernel follows: lane g of a row group takes
// chunks g, g+G, ... in order and adds one float per chunk (its member sum); the G member sums meet
// in shared memory, folded by groups of 8 members, each summed in member order, then the group sums
// in group order (dp4a.cuh's dp_fold). Both depend on n_in only, so a token's output is
// bit-identical alone or in any tile, any grid -- and a tensor-core kernel owning many outputs
// follows the same order (a member sum and its group's sum, split-K: mmq_rows.cuh).
// Bound: memory -- weights are read once per 8-token tile; at N = 1 the step streams every weight
// byte once: the device's read bandwidth. The instructions are close behind: streaming 4 TB/s over
// 132 SMs at 1.98 GHz is 0.85 Q4_K chunks a clock an SM, so a chunk's instructions (fetch, unpack,
// x load, 8 dp4a, the float terms) take most of an SM's issue (hence the _g entries).
#include "dp4a.cuh"

#define DP_ARGS                                                                                                  \
    const unsigned char *W, const signed char *xq, const float *xd, const int *xs, const float *bias, float *Y, \
        int n_tokens, int n_out, int n_in, int has_bias, int accumulate, int y_stride
#define DP_PASS W, W, xq, xd, xs, bias, Y, n_tokens, n_out, n_in, has_bias, accumulate, (long long)y_stride

// One entry per weight type, matmul_dp4a_<type>, and matmul_dp4a_<type>_g16 / _g32 where G is 16 or 32
// (a compile-time G: dp4a.cuh), each compiled only when wanted (GB_ENTRIES, ggml_blocks.cuh).
// Programmatic dependent launch (common.cuh): the entries trigger at their top and wait in their body,
// after asking L2 for their first rows (dp4a.cuh's dp_prefetch_then_wait)
#undef SHARPINF_PDL_AT_ENTRY
#define SHARPINF_PDL_AT_ENTRY sharpinf_pdl_trigger
template <int QT> __device__ __forceinline__ void dp4a_matmul(DP_ARGS) {
    dp_prefetch_then_wait<QT, 1, 0>(W, W, n_out, n_in);
    dp4a_rows<QT, 1>(DP_PASS);
}
#define DP_MATMUL_G(G)                                                                                     \
    template <int QT> __device__ __forceinline__ void dp4a_matmul_g##G(DP_ARGS) {                          \
        dp_prefetch_then_wait<QT, 1, G>(W, W, n_out, n_in);                                                \
        DP_ASSUME_G(n_in, G);                                                                              \
        dp4a_rows<QT, 1, DP_GC(G)>(DP_PASS);                                                               \
    }                                                                                                      \
    GB_QUANT_ENTRIES(matmul_dp4a, _g##G, (DP_ARGS), dp4a_matmul_g##G, W, xq, xd, xs, bias, Y, n_tokens, n_out, n_in, \
               has_bias, accumulate, y_stride)
GB_ALL_ENTRIES(matmul_dp4a, , (DP_ARGS), dp4a_matmul, W, xq, xd, xs, bias, Y, n_tokens, n_out, n_in, has_bias, accumulate, y_stride)
DP_MATMUL_G(16)
DP_MATMUL_G(32)
