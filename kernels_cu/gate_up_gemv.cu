// gate_up_gemv.cu -- as gate_up_dp4a.cu with matmul_gemv.cu's row stream, for decode: out = act(X Wg^T)
// * (X Wu^T) for steps of 1..8 tokens, the gate and up chunks of a batch in flight per lane.
//
//   gate_up_gemv_<type>_t<NT>(Wg, Wu, Xq, Xd, Xs, out, n_tokens, n_ff, n_in, act)
//   gate_up_gemv_<type>_t<NT>_g16 / _g32: G compiled in
//     the arguments of gate_up_dp4a_<type>; NT = 1, 2, 4 or 8 (the launcher picks the smallest NT >= n_tokens)
//
// The algorithm and the bound are matmul_gemv.cu's (its header says what changes against dp4a and
// what does not); the pair loads U / 2 chunks of each matrix ahead (U of matmul_gemv).
// Launch: as matmul_gemv.cu (block 128, grid (min(ceil(n_ff / rows per block), the blocks resident at
// once), 1): one wave, each warp streaming its rows).
// Batch invariance: gate and up each reduce in the canonical order (n_in only), so out equals
// gate_up_dp4a's bits at every N.
// Bound: memory, as matmul_gemv.cu -- both matrices' bytes once a step.
#include "gemv_rows.cuh"

#define GVU_ARGS                                                                                                \
    const unsigned char *Wg, const unsigned char *Wu, const signed char *xq, const float *xd, const int *xs,    \
        float *out, int n_tokens, int n_ff, int n_in, int act
#define GVU_PASS Wg, Wu, xq, xd, xs, xd, out, GvTokens{n_tokens}, n_ff, n_in, 0, 0, (long long)n_ff, act

// gate_up_gemv_<type>_t<NT>, and ..._t<NT>_g16 / _g32 where G is 16 or 32 (a compile-time G: dp4a.cuh)
#define GV_GATE_UP_G(NT, G)                                                                                 \
    template <int QT> __device__ __forceinline__ void gemv_gate_up_t##NT##_g##G(GVU_ARGS) {                 \
        dp_prefetch_then_wait<QT, 2, G>(Wg, Wu, n_ff, n_in);                                                \
        DP_ASSUME_G(n_in, G);                                                                               \
        gemv_rows<QT, 2, NT, DP_GC(G)>(GVU_PASS);                                                            \
    }                                                                                                       \
    GB_QUANT_ENTRIES(gate_up_gemv, _t##NT##_g##G, (GVU_ARGS), gemv_gate_up_t##NT##_g##G, Wg, Wu, xq, xd, xs, out,   \
               n_tokens, n_ff, n_in, act)
#define GV_GATE_UP(NT)                                                                                      \
    template <int QT> __device__ __forceinline__ void gemv_gate_up_t##NT(GVU_ARGS) {                        \
        dp_prefetch_then_wait<QT, 2, 0>(Wg, Wu, n_ff, n_in);                                                \
        gemv_rows<QT, 2, NT>(GVU_PASS);                                                                     \
    }                                                                                                       \
    GB_ENTRIES(gate_up_gemv, _t##NT, (GVU_ARGS), gemv_gate_up_t##NT, Wg, Wu, xq, xd, xs, out, n_tokens, n_ff, n_in, act) \
    GV_GATE_UP_G(NT, 16)                                                                                    \
    GV_GATE_UP_G(NT, 32)
// Programmatic dependent launch (common.cuh): trigger at the top, wait after the prefetch of the first
// rows (as matmul_dp4a.cu)
#undef SHARPINF_PDL_AT_ENTRY
#define SHARPINF_PDL_AT_ENTRY sharpinf_pdl_trigger
GV_GATE_UP(1)
GV_GATE_UP(2)
GV_GATE_UP(4)
GV_GATE_UP(8)
