// matmul_mma.cu -- as matmul_dp4a.cu on int8 tensor cores, for prefill: Y = X W^T, bit-identical to
// matmul_dp4a.cu at every N.
//
//   matmul_mma_<type>(W, Xq, Xd, Xs, bias, Y, n_tokens, n_out, n_in, has_bias, accumulate, y_stride)
//     arguments as matmul_dp4a.cu; <type>: the quantized GGUF types (q8_0 q4_0 q4_1 q5_0 q5_1 q4_k
//     q5_k q6_k; float weights have no int8 form: they stay on dp4a)
//
// Algorithm: every 32-value chunk of a weight row is a q8_1-sized integer block, exactly like the
// activation's q8_1 block, so one mma.m16n8k32.s8 gives the exact int32 dots of 16 rows x 8 tokens
// for that chunk (Q6_K: a second mma with values 16..31 zeroed gives the first half's dot). Each
// dot then goes through the same float operations as dp4a's (DpChunk::acc_idot, dp4a.cuh), and the
// per-chunk terms are added in the canonical order (dp4a.cuh): the lane-group member gp sums chunks
// gp, gp + G, ... , the member sums are added by groups of 8 in member order and the group sums in
// group order -- the block visits gp = 0, 1, ... and keeps three floats per output (part, group,
// total; 24 an output row pair of a lane).
// Why int8 mma, not f16: activations are already q8_1 (rmsnorm_q8_1.cu) and the weights' quants are
// small integers, so the dot is exact and the only float work is dp4a's own; an f16 path would
// dequantize both and round differently from decode.
// Tiles: a warp owns 16 rows (one m16) x 16 tokens (two n8); a block 4 warps = 64 rows x 16 tokens.
// Staging: the 4 warps walk the chunks in the same order, so the block's activation tile of a chunk
// (16 tokens x 32 int8, their d and s; 48-byte rows) is staged once in shared memory, by cp.async,
// double-buffered -- chunk k + 1 loads while chunk k's mmas and float terms run -- and read as both
// n8 tiles' B fragments by one ldmatrix.x4. Weights are read straight from global memory into A
// fragments (each chunk's words by the 4 lanes of a quad, used for 16 tokens in registers).
// Fragments (PTX ISA tables, tests/ptx_layouts.py): lane (g, t) loads rows g and g + 8's chunk,
// takes its words t and 4 + t for A; B is token g's activation words t and 4 + t.
// Launch: grid = (ceil(n_out / 64), ceil(n_tokens / 16)), block = 128, 1.8 KB static shared memory.
// Batch invariance: the canonical order depends on n_in only, so an output equals matmul_dp4a's bit
// for bit for any N: prefill on tensor cores, decode on dp4a, one answer (the oracles' exactness
// holds across the two).
// Bound: at prefill sizes, the float epilogue per (row, token, chunk) -- the same count as dp4a's,
// the price of bit-identity with decode -- then the weight reads (each weight byte is read from L2
// once per 16 tokens). matmul_mmq.cu takes 64 tokens a block (each weight chunk unpacked once per
// 64 tokens; a group of members a block, so two floats an output).
#include "mma_rows.cuh"

#define MM_ARGS                                                                                                  \
    const unsigned char *W, const signed char *xq, const float *xd, const int *xs, const float *bias, float *Y, \
        int n_tokens, int n_out, int n_in, int has_bias, int accumulate, int y_stride
#define MM_PASS W, W, xq, xd, xs, bias, Y, n_tokens, n_out, n_in, has_bias, accumulate, (long long)y_stride

// One entry per quantized type, matmul_mma_<type>, each compiled only when wanted (GB_QUANT_ENTRIES,
// ggml_blocks.cuh).
template <int QT> __device__ __forceinline__ void mma_matmul(MM_ARGS) { mma_rows<QT, 1>(MM_PASS); }
GB_QUANT_ENTRIES(matmul_mma, , (MM_ARGS), mma_matmul, W, xq, xd, xs, bias, Y, n_tokens, n_out, n_in, has_bias, accumulate, y_stride)
