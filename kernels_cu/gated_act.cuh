// gated_act.cuh -- the FFN's gated activations: out = act(gate) * up, ACT_SILU (SwiGLU) or
// ACT_GELU_TANH (GeGLU).
#pragma once
#include "types.cuh"

// One definition for elementwise.cu and the fused gate+up epilogues (dp4a.cuh), so the simple
// and the fused paths give the same bits.
#define ACT_SILU 0       // SwiGLU (llama, qwen): silu(g) = g / (1 + e^-g)
#define ACT_GELU_TANH 1  // GeGLU (gemma3): ggml_gelu's tanh approximation

__device__ __forceinline__ float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * x * (1.0f + 0.044715f * x * x)));
}

__device__ __forceinline__ float gated_act(int act, float g, float u) {
    // silu: for very negative g, e^-g overflows to inf and the result is -0, not NaN.
    return act == ACT_GELU_TANH ? gelu_tanh(g) * u : g / (1.0f + expf(-g)) * u;
}
