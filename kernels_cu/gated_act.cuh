// gated_act.cuh -- the FFN's gated activations of a gate value g and an up value u: ACT_SILU (SwiGLU,
// act(g) * u), ACT_GELU_TANH (GeGLU, act(g) * u) or ACT_SWIGLU_OAI (gpt-oss's clamped SwiGLU).
#pragma once
#include "types.cuh"

// One definition for elementwise.cu and the fused gate+up epilogues (dp4a.cuh, moe_ffn.cu), so the
// simple and the fused paths give the same bits.
#define ACT_SILU 0        // SwiGLU (llama, qwen): silu(g) = g / (1 + e^-g)
#define ACT_GELU_TANH 1   // GeGLU (gemma3): ggml_gelu's tanh approximation
#define ACT_SWIGLU_OAI 2  // gpt-oss's ggml_swiglu_oai: x = min(g, 7), y = clamp(u, -7, 7), out =
                          // x / (1 + e^(1.702 * -x)) * (y + 1)
#define SWIGLU_OAI_ALPHA 1.702f  // sharpinf/model/gpt_oss_fields.py's constants
#define SWIGLU_OAI_LIMIT 7.0f

__device__ __forceinline__ float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * x * (1.0f + 0.044715f * x * x)));
}

// std::min / std::clamp's comparisons (llama.cpp's CPU op), not fminf's: a NaN passes through, never the limit
__device__ __forceinline__ float swiglu_oai(float g, float u) {
    const float x = SWIGLU_OAI_LIMIT < g ? SWIGLU_OAI_LIMIT : g;
    const float y = u < -SWIGLU_OAI_LIMIT ? -SWIGLU_OAI_LIMIT : (SWIGLU_OAI_LIMIT < u ? SWIGLU_OAI_LIMIT : u);
    return x / (1.0f + expf(SWIGLU_OAI_ALPHA * -x)) * (y + 1.0f);
}

__device__ __forceinline__ float gated_act(int act, float g, float u) {
    // silu: for very negative g, e^-g overflows to inf and the result is -0, not NaN.
    if (act == ACT_SWIGLU_OAI) return swiglu_oai(g, u);
    return act == ACT_GELU_TANH ? gelu_tanh(g) * u : g / (1.0f + expf(-g)) * u;
}
