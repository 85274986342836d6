// gate_up_mmq.cu -- as matmul_mmq.cu for the FFN's gate and up pair: out = act(X Wg^T) * (X Wu^T) on
// int8 tensor cores in 64-row x 64-token blocks, bit-identical to gate_up_dp4a.cu (the algorithm and
// the order: matmul_mmq.cu's header).
//
//   gate_up_mmq_<type>(Wg, Wu, Xq, Xd, Xs, out, n_tokens, n_ff, n_in, act, partial, tickets, x0)
//     arguments as gate_up_dp4a.cu, then matmul_mmq.cu's split-K scratch
// Tiles: 8 warps, 2 row halves x 4 token quarters, each 32 rows x 16 tokens of both matrices.
// Launch: block 256, grid (row tiles of the window, ceil(n_tokens / 64), groups): matmul_mmq.cu's
// split-K, both matrices' group sums in the scratch; 23 KB static shared memory;
// __launch_bounds__(256, 2) (1 for Q5_K and Q6_K: mmq_rows.cuh's MQ_BOUNDS_2).
// Batch invariance: gate and up each sum in the canonical order (n_in only), as gate_up_dp4a.cu.
// Bound: as matmul_mmq.cu's, two matrices a block; the activation tile is staged once for both.
#include "mmq_rows.cuh"


// One entry per quantized type, gate_up_mmq_<type>, each compiled only when wanted (GB_QUANT_ENTRIES,
// ggml_blocks.cuh).
template <int QT> __device__ __forceinline__ void mmq_gate_up(GQ_ARGS) { mmq_rows<QT, 2>(GQ_PASS); }
GB_QUANT_ENTRIES_ATTRS(gate_up_mmq, , MQ_BOUNDS_2, (GQ_ARGS), mmq_gate_up, GQ_NAMES)
