// layer_dp4a.cu -- everything a decode step does between two attentions, as one cooperative launch:
// ffn_dp4a.cu's megakernel pattern taken to the whole layer but its attention, so a decode layer is
// two launches (this one and the attention's) instead of nine.
//
//   layer_dp4a_<type>(post..., pre..., step...), and _g<GE>_<GF> (G compiled in, as ffn_dp4a.cu's)
//   post: the layer whose attention just ran -- Wo [n_embd rows of q_dim], aq/ad/as_ (the attention
//     output in q8_1), ffn_norm float [n_embd], Wg, Wu, Wd (ffn_dp4a.cu's)
//   pre: the next layer's attention input -- attn_norm float [n_embd], Wqkv [q_dim + 2 kv_dim rows of
//     n_embd] and bqkv (has_bias), qkv float [n_tokens, q_dim + 2 kv_dim] (Q, K, V, rotated in place),
//     positions, slots, q_norm, k_norm (has_qk_norm), k_cache, v_cache, freqs, mscale, temp_scale,
//     temp_floor (the queries' temperature, attn_temp.cuh): rope_kv.cu's
//   step: x (the residual stream), xq/xd/xs (the FFN norm's q8_1), pq/pd/ps (the attention norm's: a
//     buffer of its own -- dp4a_rows reads activations through const __restrict__ pointers, which the
//     compiler may turn into non-coherent loads, so no buffer it reads is rewritten later in the
//     launch), h/hq/hd/hs (the FFN's scratch), bar (common.cuh's grid barrier, zeroed once), the
//     shapes, kv_kind (0 f32, 1 f16, 2 bf16, 3 q8_0); has_post / has_pre say which halves run
//   post  1 x += aq Wo^T (matmul_dp4a's dp4a_rows<QT, 1>, accumulating) | 2 xq = q8_1(rmsnorm(x) *
//         ffn_norm) (q8_1_rows.cuh, a token a block) | 3 h = act(xq Wg^T) * (xq Wu^T) (dp4a_rows<QT, 2>)
//         | 4 hq = q8_1(h) (ffn_fused.cuh's ffn_quantize_h) | 5 x += hq Wd^T
//   pre   6 pq = q8_1(rmsnorm(x) * attn_norm) (as 2) | 7 qkv = pq Wqkv^T (+ bqkv) | 8 QK-norm, RoPE,
//         K and V into the cache (rope_kv_token.cuh, a token a block); a grid barrier between any two
//
// Launch: cooperative, block 128 (DP_WARPS warps), grid = min(the blocks resident at once, the
// largest phase's row blocks); steps of <= 8 tokens (one DP_TILE); the layer's five matrices of one
// quantized type (QKV as one matrix), no post-norms, no experts -- else the launcher declines and
// the step runs the separate launches; the pre half only with rope_kv=fused, whose QK-norm it is
// (rope_kv=simple's qk_norm.cu sums a head in another order). Between phases the barrier fences as
// cooperative groups' grid sync does (thread 0 fences around the arrival, __syncthreads spreads it
// to its block). __launch_bounds__(128, 8) (LK_MIN_BLOCKS, below).
// Batch invariance: every phase runs its separate kernel's own code -- dp4a_rows reduces each row in
// the one canonical order whatever the grid, a norm's sum of squares is rmsnorm.cu's in any block
// (rms_scale), a q8_1 block's and a token's RoPE arithmetic do not depend on who takes them -- so x,
// qkv and the cache get the bits of the dp4a path's launches, for any grid
// (tests/test_kernels_layer_link.py, and the engine's logits in tests/test_variants.py).
// Bound: the layer's weight bytes, as the separate kernels. What it saves: seven launches a layer and
// the idle ramps between them (on a 30-layer model ~200 of a decode step's ~275 launches); what it
// pays: seven grid barriers (an atomic and a spin each, ~1-2 us on a GPU), the norms on n_tokens
// blocks while the rest wait, and one grid for every phase.
#include "ffn_fused.cuh"  // dp4a.cuh, q8_1_rows.cuh, ffn_quantize_h
#include "rope_kv_token.cuh"

#define LK_ARGS                                                                                                  \
    const unsigned char *Wo, const signed char *aq, const float *ad, const int *as_, const float *ffn_norm,     \
        const unsigned char *Wg, const unsigned char *Wu, const unsigned char *Wd, const float *attn_norm,     \
        const unsigned char *Wqkv, const float *bqkv, float *qkv, const int *positions, const int *slots,      \
        const float *q_norm, const float *k_norm, void *k_cache, void *v_cache, float *x, signed char *xq,     \
        float *xd, int *xs, signed char *pq, float *pd, int *ps, float *h, signed char *hq, float *hd, int *hs, \
        unsigned *bar, int n_tokens,                                                                            \
        int n_embd, int n_ff, int n_heads, int n_kv_heads, int head_dim, const double *freqs, float mscale,        \
        float temp_scale, int temp_floor, float eps, int neox, int has_qk_norm, int has_bias, int act, int kv_kind, int has_post, int has_pre

// The phases in order; a barrier between each two. The three single-matrix products share one
// dp4a_rows site (one inlined copy of the row loop, not three: NVRTC and g++ build it once).
enum { LK_O, LK_FFN_NORM, LK_GATE_UP, LK_QUANT_H, LK_DOWN, LK_ATTN_NORM, LK_QKV, LK_ROPE };

// The cache's type is a launch argument: one out-of-line copy serves every weight type's entry
// (inlined, its four instantiations in each of eight entries doubled the file's compile time).
__device__ __noinline__ void lk_rope(int t, float* qkv, int qkv_w, const int* positions, const int* slots,
                                     const float* q_norm, const float* k_norm, void* k_cache, void* v_cache,
                                     int n_heads, int n_kv_heads, int head_dim, const double *freqs, float mscale,
                                     float temp_scale, int temp_floor, float eps, int neox, int has_qk_norm,
                                     int kv_kind) {
#define LK_ROPE_AS(T, Q8)                                                                                         \
    rope_kv_token<T, Q8>(t, qkv, qkv_w, positions, slots, q_norm, k_norm, k_cache, v_cache, n_heads, n_kv_heads, \
                         head_dim, freqs, mscale, temp_scale, temp_floor, eps, neox, has_qk_norm)
    switch (kv_kind) {  // uniform: a launch argument
        case 0: LK_ROPE_AS(float, false); break;
        case 1: LK_ROPE_AS(__half, false); break;
        case 2: LK_ROPE_AS(__nv_bfloat16, false); break;
        default: LK_ROPE_AS(float, true); break;
    }
#undef LK_ROPE_AS
}

// GE, GF: G of rows of n_embd (gate+up, QKV; the o-projection's rows of q_dim too) and of n_ff (down)
// where compiled in (the _g entries below; 0: from n_in at run time, dp4a_rows' GC)
template <int QT, int GE = 0, int GF = 0>
__device__ __forceinline__ void layer_link(LK_ARGS) {
    __shared__ float smem32[32];
    const int q_dim = n_heads * head_dim, qkv_w = q_dim + 2 * n_kv_heads * head_dim;
    const int first = has_post ? LK_O : LK_ATTN_NORM, last = has_pre ? LK_ROPE : LK_DOWN;  // launch arguments
    for (int ph = first; ph <= last; ++ph) {
        if (ph > first) sharpinf_grid_sync(bar);
        if (ph == LK_FFN_NORM || ph == LK_ATTN_NORM) {  // xq (pq) = q8_1(rmsnorm(x) * w), a token a block
            const bool ffn = ph == LK_FFN_NORM;
            const float* w = ffn ? ffn_norm : attn_norm;
            signed char* q = ffn ? xq : pq;
            float* d = ffn ? xd : pd;
            int* s = ffn ? xs : ps;
            for (int t = blockIdx.x; t < n_tokens; t += gridDim.x)
                rmsnorm_q8_1_row(x + (long long)t * n_embd, w, q + (long long)t * n_embd,
                                 d + (long long)t * (n_embd / 32), s + (long long)t * (n_embd / 32), n_embd, eps,
                                 smem32);
        } else if (ph == LK_GATE_UP) {  // h = act(xq Wg^T) * (xq Wu^T)
            dp4a_rows<QT, 2, GE, true>(Wg, Wu, xq, xd, xs, xd, h, n_tokens, n_ff, n_embd, 0, 0, (long long)n_ff, act);
        } else if (ph == LK_QUANT_H) {
            ffn_quantize_h(h, hq, hd, hs, n_tokens, n_ff);
        } else if (ph == LK_ROPE) {  // a token a block
            for (int t = blockIdx.x; t < n_tokens; t += gridDim.x)
                lk_rope(t, qkv, qkv_w, positions, slots, q_norm, k_norm, k_cache, v_cache, n_heads, n_kv_heads,
                        head_dim, freqs, mscale, temp_scale, temp_floor, eps, neox, has_qk_norm, kv_kind);
        } else {  // LK_O: x += aq Wo^T; LK_DOWN: x += hq Wd^T; LK_QKV: qkv = pq Wqkv^T (+ bqkv)
            const bool o = ph == LK_O, down = ph == LK_DOWN;
            const unsigned char* W = o ? Wo : down ? Wd : Wqkv;
            const signed char* q = o ? aq : down ? hq : pq;
            const float* d = o ? ad : down ? hd : pd;
            const int* s = o ? as_ : down ? hs : ps;
            const int n_out = o || down ? n_embd : qkv_w, n_in = o ? q_dim : down ? n_ff : n_embd;
#define LK_ROWS(GC)                                                                                            \
    dp4a_rows<QT, 1, GC, true>(W, W, q, d, s, ph == LK_QKV ? bqkv : d, o || down ? x : qkv, n_tokens, n_out, n_in, \
                         ph == LK_QKV && has_bias, o || down, (long long)n_out)
            if (GE == GF || !down) LK_ROWS(GE);  // one site where the two G agree (a constant condition)
            else LK_ROWS(GF);
#undef LK_ROWS
        }
    }
}

// LK_MIN_BLOCKS (a probe's constant, through SHARPINF_NVRTC_OPTIONS; 0: no bound): the blocks an SM ptxas
// is told to fit, __launch_bounds__(128, 8): 64 registers -- each phase alone is a 48-64 register kernel,
// unbound ptxas takes far more for no phase's need -- and the grid is one wave of what fits. At decode a
// lane has one weight chunk in flight, so the bytes in flight an SM -- what a matvec's bandwidth follows
// (Little's law) -- grow with the warps; bench/gpu_slot.sh times 8 against 0.
#ifndef LK_MIN_BLOCKS
#define LK_MIN_BLOCKS 8
#endif
#if LK_MIN_BLOCKS
#define LK_BOUNDS(QT) __launch_bounds__(128, LK_MIN_BLOCKS)
#else
#define LK_BOUNDS(QT)
#endif

#define LK_PASS                                                                                                     \
    Wo, aq, ad, as_, ffn_norm, Wg, Wu, Wd, attn_norm, Wqkv, bqkv, qkv, positions, slots, q_norm, k_norm, k_cache,   \
        v_cache, x, xq, xd, xs, pq, pd, ps, h, hq, hd, hs, bar, n_tokens, n_embd, n_ff, n_heads, n_kv_heads, head_dim, \
        freqs, mscale, temp_scale, temp_floor, eps, neox, has_qk_norm, has_bias, act, kv_kind, has_post, has_pre
// One entry per weight type, layer_dp4a_<type>, and layer_dp4a_<type>_g<GE>_<GF> (as ffn_dp4a.cu's): the
// row loops with their G compiled in, where rows of n_embd and n_ff have G 16 or 32 and the o-projection's
// (q_dim) has n_embd's (ops/layer_dp4a.py picks them). A shape outside returns at once, on every block.
GB_QUANT_ENTRIES_ATTRS(layer_dp4a, , LK_BOUNDS, (LK_ARGS), layer_link, LK_PASS)
#define LK_G(GE, GF)                                                                         \
    template <int QT> __device__ __forceinline__ void layer_link_g##GE##_##GF(LK_ARGS) {   \
        DP_ASSUME_G(n_embd, GE);                                                             \
        DP_ASSUME_G(n_ff, GF);                                                               \
        if (has_post) DP_ASSUME_G(n_heads * head_dim, GE);                                   \
        layer_link<QT, DP_GC(GE), DP_GC(GF)>(LK_PASS);                                       \
    }                                                                                        \
    GB_QUANT_ENTRIES_ATTRS(layer_dp4a, _g##GE##_##GF, LK_BOUNDS, (LK_ARGS), layer_link_g##GE##_##GF, LK_PASS)
LK_G(16, 32)
LK_G(32, 32)
