// matmul_mmq.cu -- as matmul_mma.cu, 64 tokens a block: Y = X W^T on int8 tensor cores in 64-row x
// 64-token blocks, bit-identical to matmul_dp4a.cu at every N.
//
//   matmul_mmq_<type>(W, Xq, Xd, Xs, bias, Y, n_tokens, n_out, n_in, has_bias, accumulate, y_stride,
//       partial, tickets, x0)
//     arguments as matmul_dp4a.cu, then the split-K scratch (mmq_rows.cuh's MqSplit: the group
//     sums, the tiles' tickets, the launch's first row tile); <type>: the quantized GGUF types (q8_0
//     q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k; float weights stay on dp4a)
//
// Design: each weight chunk is read and unpacked once for the block's 64 tokens -- one thread a row,
// into shared memory, where the warps read it as A fragments (ldmatrix) beside its scales: a token's
// weight bytes are 1/4 of matmul_mma.cu's, 1/8 of dp4a's. Per 32-value chunk one mma.m16n8k32.s8
// gives the exact int32 dots of 16 rows x 8 tokens (Q6_K: a second, values 16..31 zeroed, for the
// first half's dot); each dot goes through dp4a's float operations (DpChunk::acc_idot) in the
// canonical order (dp4a.cuh): members gp = 0, 1, ... (chunks gp, gp + G, ...), two floats an output
// (its member sum, its group's sum). The terms' integers become floats by dp_i2f (exact).
// Split-K: each group of 8 members of a row tile is a block of its own (grid.z = the groups: 1 below
// n_in = 512, 2 at 512-1023, 4 from 1024); with more than one, each block writes its group sums to
// the scratch (4 bytes an output and group), takes a ticket, and the tile's last block folds them in
// group order and runs the epilogue. A grid whose group sums exceed the scratch (64 MB) runs in
// windows of row tiles (x0).
// Tiles: block 64 rows x 64 tokens, 4 warps as 2 (rows) x 2 (tokens); a warp 32 rows x 32 tokens =
// 2 m16 x 4 n8 tiles, 8 mmas a chunk (16 for Q6_K); n8 tiles wholly past the last token skip theirs.
// Staging: a chunk's activations (64 tokens x 32 int8 in 48-byte rows, d and s) by cp.async in a
// 3-stage ring; weight chunk k + 1 fetched as raw words before iteration k's barrier, unpacked into
// the other half of a double buffer after k's mmas. The block's lower half unpacks, the upper half
// stages (Q6_K: every thread both). Fragments (PTX ISA tables, tests/ptx_layouts.py): A by
// ldmatrix.x4 from the staged rows (rows 0-7 / 8-15 x words 0-3 / 4-7), B from the staged tokens.
// Launch: block 128, grid (row tiles of the window, ceil(n_tokens / 64), groups); 17 KB static shared
// memory; __launch_bounds__(128, 3), 2 for Q6_K (mmq_rows.cuh's MQ_BOUNDS_1).
// Batch invariance: an output is its chunk terms summed in the canonical order, which depends on n_in
// only -- not on the block, the split, the tile slot or the other tokens of the step.
// Bound (H100 SXM, estimated): the float epilogue, the price of bit-identity with decode -- ~5 FP32
// operations and 2 int->float conversions per (row, token, chunk), ~13 lane-cycles: ~2.6 T chunk-terms/s
// over 132 SMs (the int8 work, 1/4096 of an m16n8k32 at 990 dense TOPS, is no limit). Qwen3-8B (8e9
// weights, Q4_K): N = 64 -> 1.6e10 terms, ~6 ms (weights once per 64 tokens: 4.7 GB at 3.35 TB/s,
// 1.4 ms, hidden); N = 512 -> ~49 ms.
#include "mmq_rows.cuh"


// One entry per quantized type, matmul_mmq_<type>, each compiled only when wanted (GB_QUANT_ENTRIES,
// ggml_blocks.cuh).
template <int QT> __device__ __forceinline__ void mmq_matmul(MQ_ARGS) { mmq_rows<QT, 1>(MQ_PASS); }
GB_QUANT_ENTRIES_ATTRS(matmul_mmq, , MQ_BOUNDS_1, (MQ_ARGS), mmq_matmul, MQ_NAMES)
