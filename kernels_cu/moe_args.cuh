// moe_args.cuh -- the argument lists every grouped-expert kernel family takes (moe_dp4a.cu,
// moe_mmq.cu, which adds its split-K scratch after them), so ops/moe.py launches either with one list.
//   gate+up: Wg, Wu (the experts' rows), X in q8_1, the counting sort's order and tiles, G out, then
//            the biases (has_bias: gpt-oss) float [n_expert, n_ff, 2]: row j's gate bias, then its up's
//   down:    Wd, the SwiGLU rows in q8_1, order, tiles, Y out (one row a pair); its bias joins in
//            moe_ffn.cu's moe_combine (the same bits: Y + b rounds once either way)
//   has_bias 0: the bias pointer is never read (any array stands for it)
#pragma once

#define MOE_GATE_UP_PARAMS const unsigned char *Wg, const unsigned char *Wu, const signed char *xq, const float *xd, \
        const int *xs, const int *order, const int *tiles, float *G, int k, int n_ff, int n_in, int max_tiles, \
        int act, const float *bias, int has_bias
#define MOE_DOWN_PARAMS const unsigned char *Wd, const signed char *xq, const float *xd, const int *xs, \
        const int *order, const int *tiles, float *Y, int n_out, int n_in, int max_tiles
// the gate+up names, in order, for the entry macros
#define MOE_GATE_UP_NAMES Wg, Wu, xq, xd, xs, order, tiles, G, k, n_ff, n_in, max_tiles, act, bias, has_bias
