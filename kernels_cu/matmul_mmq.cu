// matmul_mmq.cu -- variant of matmul_mma.cu for steps of many tokens: Y = X W^T on int8 tensor
// cores in 64-row x 64-token blocks, bit-identical to matmul_dp4a.cu at every N.
//
//   matmul_mmq_<type>(W, Xq, Xd, Xs, bias, Y, n_tokens, n_out, n_in, has_bias, accumulate, y_stride,
//       partial, tickets, x0)
//     arguments as matmul_dp4a.cu, then the split-K scratch (mmq_rows.cuh's MqSplit: the group
//     sums, the tiles' tickets, the launch's first row tile); <type>: the quantized GGUF types (q8_0
//     q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k; float weights stay on dp4a)
//
// What it changes against matmul_mma.cu (16 tokens a block, each lane unpacking its own rows' chunks
// from global memory for every 16 tokens): a block takes 64 tokens, and each weight chunk is read
// from memory and unpacked once for all of them -- by one thread a row, into shared memory, where
// the 4 warps read it as A fragments (ldmatrix) and its scales for the float terms. Weight bytes
// per token fall 4x against mma, 8x against dp4a's 8-token tiles.
// Algorithm: per 32-value chunk, one mma.m16n8k32.s8 gives the exact int32 dots of 16 rows x 8
// tokens (Q6_K: a second with values 16..31 zeroed, the first half's dot); each dot goes through
// dp4a's float operations (DpChunk::acc_idot: one or two fmas into the sum) in the canonical order (dp4a.cuh):
// chunks are visited member by member (gp = 0, 1, ...; chunks gp, gp + G, ...), each output keeps
// two floats -- its member sum and its group's sum -- so 32 outputs a thread fit in registers.
// Split-K: the members come in groups of 8 (the canonical order's two levels), and each group of a
// tile is a block of its own (grid.z = the groups: 1 below n_in = 512, 2 at 512-1023, 4 from 1024):
// with one group the block's sums are the outputs; with more, each block writes its group sums to a
// scratch (4 bytes an output and group), takes a ticket, and the tile's last block folds them in
// group order and runs the epilogue (as attention_split.cu merges). A grid whose group sums exceed
// the scratch (64 MB) runs in windows of row tiles (x0). So a 64-token step of the 8B shape's qkv
// runs 384 blocks, not 96, each a quarter of the chunks.
// Tiles: block 64 rows x 64 tokens, 4 warps as 2 (rows) x 2 (tokens); a warp 32 rows x 32 tokens =
// 2 m16 x 4 n8 tiles, 8 mmas a chunk (16 for Q6_K).
// Staging (shared memory, 17 KB static): the activations of a chunk (64 tokens x 32 int8 in 48-byte
// rows, d and s) by cp.async in a 3-stage ring -- chunks k + 1 and k + 2 load while k's mmas run.
// The weights go through registers because they must be unpacked anyway (nibbles, high bits,
// K-quant scales): chunk k + 1's loads are issued (DpChunk::fetch, raw words, nothing computed on
// them) before iteration k's barrier, and unpacked into the other half of a double buffer (8 words
// of int8 and the scales, 48 bytes a row) after k's mmas -- a whole iteration of latency hidden.
// n8 tiles wholly past the last token skip their mmas and float terms (a 16-token step computes a
// quarter of the block's tile). The terms' integers become floats by dp_i2f (dp4a.cuh: an integer
// add and a float add, exact), not the conversion unit (Q6_K's scaled sum excepted): the PTX of
// matmul_mmq_q4_k went from 40 cvt.rn.f32.s32 an iteration to 4 (the unpack's scales).
// Fragments (PTX ISA tables, tests/ptx_layouts.py): A by ldmatrix.x4 from the staged rows (matrices
// rows 0-7 / 8-15 x words 0-3 / 4-7), B by ldmatrix.x4 from the staged tokens, as matmul_mma.cu.
// Launch: block 128, grid (row tiles of the window, ceil(n_tokens / 64), groups); 17 KB static shared.
// Bound (H100 SXM, estimated). Per (row, token, chunk) the int8 work is 1/4096 of an m16n8k32 (990
// dense TOPS: no limit here); the float epilogue -- the price of bit-identity with decode -- is ~5
// FP32 operations and 2 int->float conversions (16 a clock an SM): ~13 lane-cycles, so ~2.6 T
// chunk-terms/s over 132 SMs. Qwen3-8B (8e9 weights, Q4_K): N = 64 -> 1.6e10 terms, ~6 ms (weights
// once per 64 tokens: 4.7 GB at 3.35 TB/s, 1.4 ms, hidden); N = 512 -> ~49 ms.
// Measured (H200, 2026-11-26, before the fetch/unpack split and the padding skip; bench/results/gpu/
// nvidia-h200-20261126): Qwen3-8B shape Q4_K, qkv 6144 x 4096: 153 / 146 / 149 / 430 us at N = 16 /
// 32 / 64 / 512 (dp4a: 45 / 80 / 151 / 1,160); 146-163 registers, 3 blocks an SM. Flat from 16 to 64
// tokens: a 96-block grid holds ~1 warp a scheduler, so each chunk costs a global-load round trip
// (the unpack waited on its loads) plus the float terms of all 64 tokens (padding included):
// ~2,400 cycles. At 512 tokens, 9.4e11 chunk-terms/s, ~36% of the bound above.
// Next: time this version (bench/device_call.sh). Predicted: at 16-64 tokens, where the grid was
// 64-96 blocks for 132 SMs, 2-4x faster (4x the blocks, each with a quarter of the chunks; the
// scratch's traffic, 4 floats an output written and read, 6 MB each way for qkv at 64 tokens, in L2);
// at 512 tokens about the same (the grid was already full; the scratch's 100 MB of traffic for qkv
// ~25 us, ~6% of its time).
// What an iteration issues (bench/sass_mix.py, Q4_K, nvcc 13.0, sm_90; 2026-11-27): 524 warp
// instructions a chunk for a warp's 1024 terms (the integer divisions of mq_next's member step and
// the every-4th-chunk member fold left out), 0.51 a term: 8 IMMA, each with ~36 instructions of
// terms (4 i2f adds and subtracts, 12 FMUL, 4 FFMA, 4 part adds, the x scales' i2f again and the
// rows' scales reloaded per n8 tile) -- 55% -- and ~240 of staging, unpacking, barrier and loop
// (this count was before split-K and the fma form: see below).
// So issue alone bounds it at ~2.0e12 terms/s (132 SMs, 1.98 GHz); the ncu stage of
// bench/device_call.sh says how far stalls keep it from that. Tried without a GPU, same bits, not
// kept: (1) IMMA's accumulator started at dp_i2f's 0x4B400000, so the tensor core does the i2f's
// integer add -- ptxas writes D over C and rematerializes the constant, 4 MOVs for the 4 adds saved:
// nothing; (2) that with the n8 tiles outermost (each m16 tile's A fragments and rows' scales loaded
// once a chunk, x's s_x float once a tile) -- 611 instructions an iteration, 485 hot (-9.5%), but
// more registers: q4_k 144 -> 155 (3 blocks an SM still), gate_up_mmq q5_1 128 -> 155 (2 -> 1 block
// of 8 warps), mmq_narrow q4_k 80 -> 85 (6 -> 5 blocks) -- a trade only the GPU can judge. Beyond
// that the float terms' count is the canonical formula's (a change to every q8_1 kernel's bits), and
// the staging's share falls only with more terms an iteration (two chunks a barrier; wider warp
// tiles, which the two floats an output keep out of registers).
// The split version (same tool, same compiler): 607 an iteration, 559 without the member fold
// (48, every n_chunks / G-th), 0.55 a term -- mq_next's member step is a mask now (c & (G - 1), G a
// power of two: an integer division was 27 instructions on that path). Then the terms as explicit
// fmas into the sum (DpChunk::acc_idot: acc + (d sc d_x) idot, then - (dmin m)(d_x s_x), d_x s_x made
// once a token a chunk, dp4a.cuh's DpXF): 4 float instructions an output instead of 6, 28 an IMMA
// instead of 37 -- 553 an iteration; and the rows' scales read once for the 4 n8 tiles (mmq_rows.cuh:
// 30 -> 18 LDS) -- 525 an iteration, 476 hot, 0.46 a term: issue bound ~2.3e12 terms/s.
// Registers (nvcc 13.0 sm_90, ptxas): the split kernel keeps two floats an output as before --
// matmul_mmq_q4_k 146 -> 144, gate_up_mmq_q4_k 144 -> 126, mmq_narrow q4_k 80 -> 70 (the member
// range bounds the walk); moe_mmq.cu walked every group with a third float (moe_down_mmq_q4_k
// 148 -> 176) until it split too (2026-11-27: 137, NVRTC 12). The 2-byte aligned types' fetch as
// aligned words (dp4a.cuh's DpSpanA2; NVRTC 12 sm_90): matmul_mmq_q6_k 185 -> 165 registers (2 -> 3
// blocks an SM), mmq_narrow q6_k 120 -> 91; q8_0 131 -> 141 (3 blocks either way), 439 -> 410
// instructions an iteration (17 -> 10 loads a chunk).
// The terms in two copies (mmq_rows.cuh: full warp tiles without the per-n8-tile padding test, 3
// instructions an mma) and ptxas held to the occupancy it had (MQ_BOUNDS_1/_2: __launch_bounds__),
// 2026-11-28, NVRTC 12.9 sm_90, a full iteration with the member fold: matmul_mmq q4_k 519 -> 479,
// q6_k 764 -> 689, q8_0 410 -> 382, q4_1 472 -> 431; gate_up_mmq q4_k 546 -> 504; mmq_narrow q4_k
// 324 -> 306. Registers: matmul_mmq 138-165 -> 146-168 (3 blocks an SM, as before); gate_up_mmq
// 122-142 -> 128 (Q5_K 1 -> 2 blocks of 8 warps, the rest 2), Q6_K 159 -> 215 (1 block either way).
// Then the duties split (mmq_rows.cuh): the block's lower half unpacks the weight chunk, the upper
// half stages the activations (before, threads 0..127 staged and the unpackers among them unpacked
// too, while warps 2-3 of matmul_mmq, 4-7 of gate_up_mmq, waited at each barrier). Per warp a chunk, Q4_K, full tiles: 284
// instructions everyone issues (223 of them the terms), + 107 unpacking (warps 0-1) or + 53 staging
// (warps 2-3): the slowest warp 391, was 443 (483 before the two copies). And Q6_K's first-half sum
// of x by one mma an n8 tile with a row of ones (was 8 tokens x 4 LDS and a dp4a chain): matmul_mmq
// q6_k 689 -> 666 an iteration. matmul_mmq's Q6_K keeps both duties on threads 0..127: split, it
// spilled 4 bytes at 168 registers.
// Tried, not kept (same tool, same day): two chunks a barrier (each half of the block staging one
// chunk of a pair, its activations and its weights; 34 KB of shared memory, gate_up 46 KB): 399
// instructions a chunk on every warp (the pair loop's runtime chunk index and the walk's -1 guards
// ate what the halved barriers saved), and spills at the budgets (gate_up q4_k 16 bytes, q5_k 32,
// matmul q6_k 40); mmq_narrow q4_k 66 -> 93 registers. 64 x 128-token blocks (a warp 32 x 64): 243
// registers and spills for 0.35 instructions a term (now 0.38).
// The split-K fold (a tile's last block, 2026-11-28): MQ_FOLD = 4 outputs a thread a round, their group
// sums, residuals and biases all loaded before the first store -- it had stored each output before it
// loaded the next one's (the compiler may not move a load above a store to Y it cannot prove apart):
// matmul_mmq_q4_k's 32 outputs a thread waited on L2 ~20 times, now 8 (gate_up_mmq ~40, now 8;
// sass_mix --rounds, ptxas's scoreboards). mmq_narrow and moe_gate_up_mmq got launch bounds that hold
// the blocks an SM they had (unbounded, ptxas took 12-27 more registers for the batch).
// Probe (not the default until a GPU says so): the group sums in shared memory (mmq_rows.cuh's
// MQ_GROUP_SHARED), which lets 4 blocks an SM fit 128 registers without spills -- 16 warps, not 12,
// for about the same instructions a chunk at n_in 4096; bench/device_call.sh times it.
#include "mmq_rows.cuh"


// One entry per quantized type, matmul_mmq_<type>, each compiled only when wanted (GB_QUANT_ENTRIES,
// ggml_blocks.cuh).
template <int QT> __device__ __forceinline__ void mmq_matmul(MQ_ARGS) { mmq_rows<QT, 1>(MQ_PASS); }
GB_QUANT_ENTRIES_ATTRS(matmul_mmq, , MQ_BOUNDS_1, (MQ_ARGS), mmq_matmul, MQ_NAMES)
