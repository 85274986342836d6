// gate_up_dp4a.cu -- the FFN's first half in one kernel: out = act(X Wg^T) * (X Wu^T), X in q8_1.
//
//   gate_up_dp4a_<type>(Wg, Wu, Xq, Xd, Xs, out, n_tokens, n_ff, n_in, act)
//   gate_up_dp4a_<type>_g16 / _g32: G compiled in (as matmul_dp4a.cu's)
//     Wg, Wu  the gate and up projections, raw GGUF rows of one type (as matmul.cu)
//     X       the normed activations in q8_1 (rmsnorm_q8_1.cu); out float [n_tokens, n_ff]
//     act     ACT_SILU (SwiGLU) or ACT_GELU_TANH (GeGLU, gemma3): common.cuh's gated_act
//
// As the simple path (matmul.cu twice, then elementwise.cu's silu_gate) in one launch instead of
// three: each lane unpacks the gate and the up chunk of the same row, dots both with the token's
// activation block (dp4a.cuh), and the epilogue writes act(g) * u with common.cuh's gated_act, as
// elementwise.cu's silu_gate / gelu_gate do.
// Launch: as matmul_dp4a.cu (block 128, grid (ceil(n_ff / rows per block) capped, ceil(n_tokens / 8))).
// Batch invariance: gate and up each reduce in matmul_dp4a.cu's canonical order (n_in only), so out
// equals silu_gate (gelu_gate)(matmul_dp4a(Wg), matmul_dp4a(Wu)) bit for bit, whatever the batch.
// Bound: memory -- both matrices streamed once per 8-token tile; the activation block is loaded
// once for the two dots.
#include "dp4a.cuh"

#define GU_ARGS                                                                                                 \
    const unsigned char *Wg, const unsigned char *Wu, const signed char *xq, const float *xd, const int *xs,    \
        float *out, int n_tokens, int n_ff, int n_in, int act
#define GU_PASS Wg, Wu, xq, xd, xs, xd, out, n_tokens, n_ff, n_in, 0, 0, (long long)n_ff, act

// One entry per weight type, gate_up_dp4a_<type>, and gate_up_dp4a_<type>_g16 / _g32 (as matmul_dp4a.cu's),
// each compiled only when wanted (GB_ENTRIES, ggml_blocks.cuh).
// trigger at the top, wait after the prefetch of the first rows (as matmul_dp4a.cu)
#undef SHARPINF_PDL_AT_ENTRY
#define SHARPINF_PDL_AT_ENTRY sharpinf_pdl_trigger
template <int QT> __device__ __forceinline__ void dp4a_gate_up(GU_ARGS) {
    dp_prefetch_then_wait<QT, 2, 0>(Wg, Wu, n_ff, n_in);
    dp4a_rows<QT, 2>(GU_PASS);
}
#define DP_GATE_UP_G(G)                                                                                   \
    template <int QT> __device__ __forceinline__ void dp4a_gate_up_g##G(GU_ARGS) {                        \
        dp_prefetch_then_wait<QT, 2, G>(Wg, Wu, n_ff, n_in);                                              \
        DP_ASSUME_G(n_in, G);                                                                             \
        dp4a_rows<QT, 2, DP_GC(G)>(GU_PASS);                                                              \
    }                                                                                                     \
    GB_QUANT_ENTRIES(gate_up_dp4a, _g##G, (GU_ARGS), dp4a_gate_up_g##G, Wg, Wu, xq, xd, xs, out, n_tokens, n_ff, n_in, act)
GB_ALL_ENTRIES(gate_up_dp4a, , (GU_ARGS), dp4a_gate_up, Wg, Wu, xq, xd, xs, out, n_tokens, n_ff, n_in, act)
DP_GATE_UP_G(16)
DP_GATE_UP_G(32)
