// attn_temp.cuh -- the queries' attention temperature every rotation path applies after RoPE (rope.cu on
// the Q heads, rope_kv_token.cuh's fused paths, layer_dp4a.cu's link): mistral3's (llama.cpp's llama-4
// temperature scaling), 1 + scale * ln(floor(pos / n_ctx_orig) + 1), multiplying Q only, never K.
//   scale float: the file's attention.temperature_scale (0: none -- the factor is 1.0f and the query times
//                1.0f its own bits, so every other model's rotation is unchanged)
//   floor int:   the original context n_ctx_orig (> 0 where scale is not 0)
// Formed as llama.cpp's llm_graph_input_attn_temp and ModelConfig.attn_temp form it: the quotient in
// float (float / float, floorf), the log and the rest in double, each product and sum rounded apart (no
// fused multiply-add), the result rounded to float once -- the reference's factor bit for bit
// (tests/test_kernels_rope.py).
// Batch invariance: a function of the token's position and two launch arguments.
#pragma once

__device__ __forceinline__ float attn_temp(int pos, float scale, int floor_) {
    if (scale == 0.0f) return 1.0f;  // also keeps pos / 0 away from a model without one
    const float q = floorf((float)pos / (float)floor_);
#ifdef SHARPINF_EMU
    return (float)(log((double)q + 1.0) * (double)scale + 1.0);  // g++ -std=c++17 fuses no multiply-add
#else
    return (float)__dadd_rn(__dmul_rn(log((double)q + 1.0), (double)scale), 1.0);  // NVRTC would fuse a DFMA
#endif
}
