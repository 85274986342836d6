// rope_angle.cuh -- the one RoPE angle every rotation reads (rope.cu, rope_kv_token.cuh's fused
// paths, layer_dp4a.cu's link): pair i of a token at position pos turns by pos * freqs[i].
//   freqs  double [head_dim / 2]: the model's angle per position of each pair, with its frequency
//          factors and linear or YaRN scaling folded in (model/rope_scaling.py builds it once)
//   mscale float: the factor on cos and sin (YaRN's and rope.scaling.attn_factor; 1 for most models)
// Accuracy: the angle is formed and reduced to [-pi, pi] in double, then sincosf runs on the reduced
// float angle, so cos and sin are within ~1 float ulp of the float64 reference at any position
// (a float angle would be ~pos * 2e-7 rad off: 1.6e-3 rad at position 8000).
// Batch invariance: a function of (pos, i) and the table only; every path calls it, so all rotate
// by the same bits.
#pragma once

__device__ __forceinline__ void rope_cos_sin(const double* freqs, int i, int pos, float mscale, float* c, float* s) {
    const double two_pi = 6.283185307179586476925286766559;
    const double ang = (double)pos * freqs[i];
    const double red = ang - two_pi * rint(ang / two_pi);  // |red| <= pi
    sincosf((float)red, s, c);
    *c *= mscale;  // times 1.0f is exact: an unscaled model's bits are the plain rotation's
    *s *= mscale;
}
