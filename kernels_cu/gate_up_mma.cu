// gate_up_mma.cu -- variant of gate_up_dp4a.cu for prefill: out = act(X Wg^T) * (X Wu^T) on int8
// tensor cores, bit-identical to gate_up_dp4a.cu (the algorithm and order: matmul_mma.cu's header).
//
//   gate_up_mma_<type>(Wg, Wu, Xq, Xd, Xs, out, n_tokens, n_ff, n_in, act)   arguments as gate_up_dp4a.cu
// Launch: as matmul_mma.cu (block 128, grid (ceil(n_ff / 64), ceil(n_tokens / 16))).
// Bound: as matmul_mma.cu, two matrices per tile; the activation fragment is loaded once for both.
#include "mma_rows.cuh"

#define GM_ARGS                                                                                                 \
    const unsigned char *Wg, const unsigned char *Wu, const signed char *xq, const float *xd, const int *xs,    \
        float *out, int n_tokens, int n_ff, int n_in, int act
#define GM_PASS Wg, Wu, xq, xd, xs, xd, out, n_tokens, n_ff, n_in, 0, 0, (long long)n_ff, act

// One entry per type, each compiled only when wanted (SHARPINF_WANT, common.cuh).
#if SHARPINF_WANT(gate_up_mma_q8_0)
extern "C" __global__ void gate_up_mma_q8_0(GM_ARGS) { mma_rows<GB_Q8_0, 2>(GM_PASS); }
#endif
#if SHARPINF_WANT(gate_up_mma_q4_0)
extern "C" __global__ void gate_up_mma_q4_0(GM_ARGS) { mma_rows<GB_Q4_0, 2>(GM_PASS); }
#endif
#if SHARPINF_WANT(gate_up_mma_q4_1)
extern "C" __global__ void gate_up_mma_q4_1(GM_ARGS) { mma_rows<GB_Q4_1, 2>(GM_PASS); }
#endif
#if SHARPINF_WANT(gate_up_mma_q5_0)
extern "C" __global__ void gate_up_mma_q5_0(GM_ARGS) { mma_rows<GB_Q5_0, 2>(GM_PASS); }
#endif
#if SHARPINF_WANT(gate_up_mma_q5_1)
extern "C" __global__ void gate_up_mma_q5_1(GM_ARGS) { mma_rows<GB_Q5_1, 2>(GM_PASS); }
#endif
#if SHARPINF_WANT(gate_up_mma_q4_k)
extern "C" __global__ void gate_up_mma_q4_k(GM_ARGS) { mma_rows<GB_Q4_K, 2>(GM_PASS); }
#endif
#if SHARPINF_WANT(gate_up_mma_q5_k)
extern "C" __global__ void gate_up_mma_q5_k(GM_ARGS) { mma_rows<GB_Q5_K, 2>(GM_PASS); }
#endif
#if SHARPINF_WANT(gate_up_mma_q6_k)
extern "C" __global__ void gate_up_mma_q6_k(GM_ARGS) { mma_rows<GB_Q6_K, 2>(GM_PASS); }
#endif
