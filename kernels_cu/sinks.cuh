// sinks.cuh -- gpt-oss's attention sinks: head h's logit z = sinks[h] joins a query's softmax maximum
// and sum, but is no key and has no value: m' = max(m, z), l' = l + exp(z - m') (llama.cpp's
// soft_max_ext and flash_attn_ext sinks). Every attention kernel applies it once a (token, head), at
// its final merge, so the keys' states stay as they are. No sinks (has_sinks = 0): z = -inf, which
// leaves both bit-unchanged (fmaxf(m, -inf) = m; exp(-inf) = +0 and l + 0 = l, l > 0).
#pragma once

__device__ __forceinline__ float sharpinf_sink(const float* sinks, int has_sinks, int h) {
    return has_sinks ? sinks[h] : -CUDART_INF_F;
}
// the sum l of the keys' weights at the maximum m (m >= z) with the sink's weight added last
__device__ __forceinline__ float sharpinf_sink_sum(float l, float z, float m) { return __fadd_rn(l, expf(z - m)); }
