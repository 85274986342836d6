// softcap.cuh -- cap * tanh(x / cap): gemma's final-logit softcap (elementwise.cu's softcap_f32) and
// gemma2's attention-score softcap (attention.cu, attention_split.cu: before the mask; flash refuses
// it, ops/attention.py's FLASH_NO_SOFTCAP). cap <= 0: x unchanged.
#pragma once

__device__ __forceinline__ float sharpinf_softcap(float x, float cap) { return cap > 0.0f ? cap * tanhf(x / cap) : x; }
