// matmul_mmq_narrow.cu -- as matmul_mmq.cu, in blocks of 16 weight rows x 64 tokens (4x the blocks),
// for grids that cannot fill the GPU; bit-identical to matmul_dp4a.cu (and so to matmul_mmq.cu) at
// every N.
//
//   matmul_mmq_narrow_<type>(W, Xq, Xd, Xs, bias, Y, n_tokens, n_out, n_in, has_bias, accumulate, y_stride,
//       partial, tickets, x0)
//     arguments as matmul_dp4a.cu, and mmq_rows.cuh's split-K scratch (MqSplit); <type>: the quantized
//     GGUF types (float weights stay on dp4a)
//
// Design: matmul_mmq.cu's algorithm unchanged (the canonical order of dp4a.cuh, two floats an output,
// split-K, the weight chunk fetched an iteration ahead and unpacked into shared memory, activations
// by cp.async in a 3-stage ring); only the block's shape differs (MqShape<1, 16>). mmq's 64-row blocks
// give a decode step of 64 sequences on the Qwen3-8B shape 64-96 blocks for 132 SMs: one warp a
// scheduler, every chunk's latency (barrier, cp.async wait, ldmatrix, mma, the float terms'
// dependent chain) exposed. 16-row blocks give 4x the blocks for it.
// Tiles: block 16 rows x 64 tokens, 4 warps along the tokens; a warp 16 rows x 16 tokens = 1 m16 x
// 2 n8 tiles, 2 mmas a chunk (4 for Q6_K), 8 float terms a lane (mmq: 32). 16 threads unpack the
// block's 16 rows.
// Launch: block 128, grid (row tiles of the window, ceil(n_tokens / 64), groups) -- matmul_mmq.cu's
// split-K, so 16x mmq's unsplit block count at n_in >= 1024; 12 KB static shared memory;
// __launch_bounds__(128, 7) (6 for Q5_K, 5 for Q6_K).
// Batch invariance: as matmul_mmq.cu -- the canonical order depends on n_in only, never on the block
// shape, the split or the other tokens.
// Trade: each chunk's activation tile (64 tokens x 36 bytes) is staged by 4x the blocks -- L2
// traffic of 36 x 64 / (16 x 18) = 8x the weight bytes for Q4_K (mmq: 2x), from L2 not HBM.
// Bound (H100/H200, estimated): qkv 6144 x 4096 at 64 tokens gives 384 blocks, ~3 an SM (12 warps);
// if a chunk still costs ~500 cycles of latency a block, 128 chunks take ~64k cycles, ~35 us (mmq:
// ~150), the activation traffic (113 MB of L2 reads) ~20 us beside it. From ~256 tokens on, the wide
// blocks' 4x fewer activation reads should win again (matmul_mmq.cu).
#include "mmq_rows.cuh"


// One entry per quantized type, matmul_mmq_narrow_<type>, each compiled only when wanted.
template <int QT> __device__ __forceinline__ void mmq_narrow_matmul(MQ_ARGS) { mmq_rows<QT, 1, MqTokens, 16>(MQ_PASS); }
// ptxas held to 7 blocks an SM (6 for Q5_K, 5 for Q6_K): without a bound it spends registers on the
// split-K epilogue's batched loads (its group sums, residuals and biases, MQ_FOLD outputs at a time),
// blocks an SM fewer
#define MQ_NARROW_BOUNDS(QT) __launch_bounds__(128, (QT) == GB_Q6_K ? 5 : (QT) == GB_Q5_K ? 6 : 7)
GB_QUANT_ENTRIES_ATTRS(matmul_mmq_narrow, , MQ_NARROW_BOUNDS, (MQ_ARGS), mmq_narrow_matmul, MQ_NAMES)
