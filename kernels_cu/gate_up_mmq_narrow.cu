// gate_up_mmq_narrow.cu -- as gate_up_mmq.cu, in blocks of 16 rows of both matrices x 64 tokens, for
// grids that cannot fill the GPU: out = act(X Wg^T) * (X Wu^T), bit-identical to gate_up_dp4a.cu (the
// algorithm and why: matmul_mmq_narrow.cu's header).
//
//   gate_up_mmq_narrow_<type>(Wg, Wu, Xq, Xd, Xs, out, n_tokens, n_ff, n_in, act, partial, tickets, x0)
//     arguments as gate_up_mmq.cu
// Tiles: 4 warps along the tokens, each 16 rows x 16 tokens of both matrices (4 mmas a chunk); 32
// threads unpack the block's 16 + 16 rows.
// Launch: block 128, grid (row tiles of the window, ceil(n_tokens / 64), groups) (matmul_mmq.cu's
// split-K), 14 KB static shared memory.
// Batch invariance: as gate_up_mmq.cu (the canonical order, from n_in only).
// Bound: matmul_mmq_narrow.cu's; the Qwen3-8B shape's 12288-row pair gives 768 blocks at 64 tokens
// (gate_up_mmq: 192).
#include "mmq_rows.cuh"


template <int QT> __device__ __forceinline__ void mmq_narrow_gate_up(GQ_ARGS) {
    mmq_rows<QT, 2, MqTokens, 16>(GQ_PASS);
}
GB_QUANT_ENTRIES(gate_up_mmq_narrow, , (GQ_ARGS), mmq_narrow_gate_up, GQ_NAMES)
