// common.cuh -- the one header every kernels_cu/*.cu includes: the portable primitives, a header a
// topic.
//
// Two compilers see these headers:
//   * NVRTC (through CuPy on a GPU, or sharpinf.runtime.nvrtc_check without one);
//   * g++ with -DSHARPINF_EMU -include cuda_emu.h (the CPU emulator), which provides
//     threadIdx & co., __syncthreads, __shfl_*_sync, atomics and the fp16/bf16 types.
// Every hardware primitive has a PTX branch (#ifndef SHARPINF_EMU, inline asm) and an
// emulated branch that follows the PTX fragment layout exactly, so the fragment
// indexing a kernel relies on is exercised on the CPU too.
//
// Conventions: block sizes are multiples of 32; reductions use the full warp mask;
// NVRTC has no <cmath> macros, so use CUDART_* constants, never INFINITY/NAN.
#pragma once

#include "types.cuh"       // fp16 / bf16, __forceinline__, CUDART_* constants, to_float / from_float
#include "emu_shims.cuh"   // the emulator's checks and stand-ins (SHARPINF_EMU only)
#include "barriers.cuh"    // sharpinf_grid_sync, sharpinf_last_arrival
#include "pdl.cuh"         // programmatic dependent launch, sharpinf_prefetch_l2
#include "entry.cuh"       // SHARPINF_ENTRY*, SHARPINF_WANT, the entry families, SHARPINF_SHARED_FN
#include "reduce.cuh"      // warp and block reductions, block_exclusive_sum
#include "q8_1_block.cuh"  // one q8_1 block by one warp
#include "gated_act.cuh"   // the FFN's gated activations (ACT_SILU, ACT_GELU_TANH, ACT_SWIGLU_OAI)
#include "softcap.cuh"     // cap * tanh(x / cap): the logits' and gemma2's attention scores'
#include "mma_frag.cuh"    // tensor-core mma and ldmatrix, their fragment layouts
#include "cp_async.cuh"    // cp.async global -> shared copies
