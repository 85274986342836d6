// moe_args.cuh -- the argument lists every grouped-expert kernel family takes (moe_dp4a.cu,
// moe_mmq.cu, which adds its split-K scratch after them), so ops/moe.py launches either with one list.
//   gate+up: Wg, Wu (the experts' rows), X in q8_1, the counting sort's order and tiles, G out
//   down:    Wd, the SwiGLU rows in q8_1, order, tiles, Y out (one row a pair)
#pragma once

#define MOE_GATE_UP_PARAMS const unsigned char *Wg, const unsigned char *Wu, const signed char *xq, const float *xd, \
        const int *xs, const int *order, const int *tiles, float *G, int k, int n_ff, int n_in, int max_tiles, int act
#define MOE_DOWN_PARAMS const unsigned char *Wd, const signed char *xq, const float *xd, const int *xs, \
        const int *order, const int *tiles, float *Y, int n_out, int n_in, int max_tiles
