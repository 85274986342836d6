// matmul_mmq.cu -- variant of matmul_mma.cu for steps of many tokens: Y = X W^T on int8 tensor
// cores in 64-row x 64-token blocks, bit-identical to matmul_dp4a.cu at every N.
//
//   matmul_mmq_<type>(W, Xq, Xd, Xs, bias, Y, n_tokens, n_out, n_in, has_bias, accumulate, y_stride)
//     arguments as matmul_dp4a.cu; <type>: the quantized GGUF types (q8_0 q4_0 q4_1 q5_0 q5_1 q4_k
//     q5_k q6_k; float weights stay on dp4a)
//
// What it changes against matmul_mma.cu (16 tokens a block, each lane unpacking its own rows' chunks
// from global memory for every 16 tokens): a block takes 64 tokens, and each weight chunk is read
// from memory and unpacked once for all of them -- by one thread a row, into shared memory, where
// the 4 warps read it as A fragments (ldmatrix) and its scales for the float terms. Weight bytes
// per token fall 4x against mma, 8x against dp4a's 8-token tiles.
// Algorithm: per 32-value chunk, one mma.m16n8k32.s8 gives the exact int32 dots of 16 rows x 8
// tokens (Q6_K: a second with values 16..31 zeroed, the first half's dot); each dot goes through
// dp4a's float operations (DpChunk::from_idot) and is added in the canonical order (dp4a.cuh):
// chunks are visited member by member (gp = 0, 1, ..., G - 1; chunks gp, gp + G, ...), each output
// keeps two floats -- its member sum and the total -- so 32 outputs a thread fit in registers.
// Tiles: block 64 rows x 64 tokens, 4 warps as 2 (rows) x 2 (tokens); a warp 32 rows x 32 tokens =
// 2 m16 x 4 n8 tiles, 8 mmas a chunk (16 for Q6_K).
// Staging (shared memory, 17 KB static): the activations of a chunk (64 tokens x 32 int8 in 48-byte
// rows, d and s) by cp.async in a 3-stage ring -- chunks k + 1 and k + 2 load while k's mmas run;
// the weights of chunk k + 1 are loaded into registers during k's mmas and stored unpacked (8 words
// of int8 and the scales, 48 bytes a row) into the other half of a double buffer. The weights go
// through registers because they must be unpacked anyway (nibbles, high bits, K-quant scales).
// Fragments (PTX ISA tables, tests/ptx_layouts.py): A by ldmatrix.x4 from the staged rows (matrices
// rows 0-7 / 8-15 x words 0-3 / 4-7), B by ldmatrix.x4 from the staged tokens, as matmul_mma.cu.
// Launch: block 128, grid (ceil(n_out / 64), ceil(n_tokens / 64)).
// Bound (H100 SXM, estimated: no GPU in the session that wrote it). Per (row, token, chunk) the
// int8 work is 1/4096 of an m16n8k32 (990 dense TOPS: no limit here); the float epilogue -- the
// price of bit-identity with decode -- is ~5 FP32 operations and 2 int->float conversions (16 a
// clock an SM): ~13 lane-cycles, so ~2.6 T chunk-terms/s over 132 SMs. Qwen3-8B (8e9 weights, Q4_K):
// N = 64 -> 1.6e10 terms, ~6 ms (weights once per 64 tokens: 4.7 GB at 3.35 TB/s, 1.4 ms, hidden);
// N = 512 -> ~49 ms, ~170 TFLOP/s equivalent against dp4a's ~15. So: epilogue-bound from N = 64 on.
// Next, once measured: take the int->float conversion of s_x out of the per-row term (stage it);
// check (ncu: long-scoreboard stalls) that the next chunk's weight loads stay in flight across the
// mmas -- their unpack follows them in the source, and if ptxas keeps it there, split DpChunk::load
// into a raw fetch and an unpack done after the mmas.
// measured: not yet (no GPU).
#include "mmq_rows.cuh"

#define MQ_ARGS                                                                                                  \
    const unsigned char *W, const signed char *xq, const float *xd, const int *xs, const float *bias, float *Y, \
        int n_tokens, int n_out, int n_in, int has_bias, int accumulate, int y_stride
#define MQ_PASS W, W, xq, xd, xs, bias, Y, n_tokens, n_out, n_in, has_bias, accumulate, (long long)y_stride

// One entry per quantized type, matmul_mmq_<type>, each compiled only when wanted (GB_QUANT_ENTRIES,
// ggml_blocks.cuh).
template <int QT> __device__ __forceinline__ void mmq_matmul(MQ_ARGS) { mmq_rows<QT, 1>(MQ_PASS); }
GB_QUANT_ENTRIES(matmul_mmq, , (MQ_ARGS), mmq_matmul, W, xq, xd, xs, bias, Y, n_tokens, n_out, n_in, has_bias, accumulate, y_stride)
