// ffn_dp4a.cu -- a dense FFN's three decode launches as one: the megakernel pattern (phases of a
// layer in one persistent, cooperative kernel, separated by grid-wide barriers) on the FFN.
//
//   ffn_dp4a_<type>(Wg, Wu, Wd, xq, xd, xs, h, hq, hd, hs, x, bar, n_tokens, n_ff, n_embd, act)
//   ffn_dp4a_<type>_g<GE>_<GF>: both phases' G compiled in (GE 16 or 32, GF 32: ops/matmul_dp4a.py's FUSED_G)
//     Wg, Wu, Wd  gate, up [n_ff rows of n_embd] and down [n_embd rows of n_ff]: raw GGUF rows, one type
//     xq, xd, xs  the FFN norm's output in q8_1 (rmsnorm_q8_1.cu)
//     h           float [n_tokens, n_ff] scratch: act(gate) * up
//     hq, hd, hs  q8_1 [n_tokens, n_ff] scratch: h quantized
//     x           float [n_tokens, n_embd], the residual stream: x += down(h)
//     bar         u32 [2], zeroed once: common.cuh's grid barrier
//   phase 1  h = act(X Wg^T) * (X Wu^T)     gate_up_dp4a.cu's dp4a_rows<QT, 2>
//   --- grid barrier
//   phase 2  hq, hd, hs = q8_1(h)           rmsnorm_q8_1.cu's quantize_q8_1 (q8_1_rows.cuh)
//   --- grid barrier
//   phase 3  x += hq Wd^T                   matmul_dp4a.cu's dp4a_rows<QT, 1>, accumulating
//
// Launch: cooperative (Backend.prepare(..., cooperative=True)), block 128 (DP_WARPS warps), grid =
// min(the blocks resident at once, phase 1's row blocks); steps of <= 8 tokens (one DP_TILE: the
// grid has one row of blocks); the three matrices of one weight type (else the launcher falls back
// to the three launches). Phases 2 and 3 read what other blocks wrote in this launch: the barrier
// fences, and none of it was read earlier in the launch (no stale line in any SM's L1).
// Batch invariance: each phase runs its separate kernel's code -- dp4a_rows spreads rows over the grid
// by stride and reduces each row in the same fixed order whatever the grid, and a q8_1 block's
// arithmetic does not depend on which warp takes it -- so x's bits equal gate_up_dp4a +
// quantize_q8_1 + matmul_dp4a's, for any grid (tests/test_kernels_ffn_fused.py).
// Bound: the three matrices' bytes, as the three kernels. What it saves: two launches and the
// idle ramps between kernels (a few us a layer in a graph); what it pays: two grid barriers
// (an atomic and a spin each, ~1-2 us on a GPU) and phase 1's grid for the whole FFN.
#include "ffn_fused.cuh"

// FFN_MIN_BLOCKS (0: no bound; a probe, through SHARPINF_NVRTC_OPTIONS): the blocks an SM ptxas is told to
// fit (__launch_bounds__(128, N)); the grid is one wave of what fits. Held to 8 (64 registers), more
// warps for more instructions a chunk; bench/gpu_slot.sh times 8 against 0.
#ifndef FFN_MIN_BLOCKS
#define FFN_MIN_BLOCKS 0
#endif
#if FFN_MIN_BLOCKS
#define FFN_BOUNDS(QT) __launch_bounds__(128, FFN_MIN_BLOCKS)
#else
#define FFN_BOUNDS(QT)
#endif

#define FFN_PASS Wg, Wu, Wd, xq, xd, xs, h, hq, hd, hs, x, bar, n_tokens, n_ff, n_embd, act
// One entry per weight type, ffn_dp4a_<type>, and ffn_dp4a_<type>_g<GE>_<GF> with both phases' G compiled
// in (GE of rows of n_embd: 16 in 512..1023, 32 from 1024; GF of n_ff's, 32), as the separate launches'
// _g16 / _g32 entries (dp4a.cuh) -- the same bits; the pairs ops/matmul_dp4a.py's FUSED_G lists. The
// early return of a shape outside the entry's ranges is uniform over the grid: no block is left at a
// barrier.
GB_QUANT_ENTRIES_ATTRS(ffn_dp4a, , FFN_BOUNDS, (FFN_ARGS), ffn_fused, FFN_PASS)
#define FFN_G(GE, GF)                                                                       \
    template <int QT> __device__ __forceinline__ void ffn_fused_g##GE##_##GF(FFN_ARGS) { \
        DP_ASSUME_G(n_embd, GE);                                                            \
        DP_ASSUME_G(n_ff, GF);                                                              \
        ffn_fused<QT, DP_GC(GE), DP_GC(GF)>(FFN_PASS);                                      \
    }                                                                                       \
    GB_QUANT_ENTRIES_ATTRS(ffn_dp4a, _g##GE##_##GF, FFN_BOUNDS, (FFN_ARGS), ffn_fused_g##GE##_##GF, FFN_PASS)
FFN_G(16, 32)
FFN_G(32, 32)
