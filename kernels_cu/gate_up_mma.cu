// gate_up_mma.cu -- as matmul_mma.cu for the FFN's gate and up pair: out = act(X Wg^T) * (X Wu^T) on
// int8 tensor cores, bit-identical to gate_up_dp4a.cu (the algorithm and order: matmul_mma.cu's header).
//
//   gate_up_mma_<type>(Wg, Wu, Xq, Xd, Xs, out, n_tokens, n_ff, n_in, act)   arguments as gate_up_dp4a.cu
// Launch: as matmul_mma.cu (block 128, grid (ceil(n_ff / 64), ceil(n_tokens / 16))).
// Batch invariance: gate and up each sum in the canonical order (n_in only), as gate_up_dp4a.cu.
// Bound: as matmul_mma.cu, two matrices per tile; the activation fragment is loaded once for both.
#include "mma_rows.cuh"

#define GM_ARGS                                                                                                 \
    const unsigned char *Wg, const unsigned char *Wu, const signed char *xq, const float *xd, const int *xs,    \
        float *out, int n_tokens, int n_ff, int n_in, int act
#define GM_PASS Wg, Wu, xq, xd, xs, xd, out, n_tokens, n_ff, n_in, 0, 0, (long long)n_ff, act

// One entry per quantized type, gate_up_mma_<type>, each compiled only when wanted (GB_QUANT_ENTRIES,
// ggml_blocks.cuh).
template <int QT> __device__ __forceinline__ void mma_gate_up(GM_ARGS) { mma_rows<QT, 2>(GM_PASS); }
GB_QUANT_ENTRIES(gate_up_mma, , (GM_ARGS), mma_gate_up, Wg, Wu, xq, xd, xs, out, n_tokens, n_ff, n_in, act)
