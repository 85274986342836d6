// moe_route_split.cu -- as moe_route.cu, for the GPU: a token's router spread over blocks and its
// selection done by a whole block. The same ids and weights as moe_route.cu, bit for bit.
//
//   moe_route_split_f32(X, Wr, br, logits, tickets, ids, wts, n_expert, k, n_in, has_bias, gating)
//   moe_route_split_q8(xq, xd, Wr, br, logits, tickets, ids, wts, n_expert, k, n_in, has_bias, gating)
//     logits   float [T, n_expert]: scratch (each logit written once, read by the token's last block)
//     tickets  int [T]: zero before the first launch; the kernel leaves them zero (graphs replay it)
//     the rest as moe_route.cu's
//
// Why: moe_route.cu gives a token one block, whose 4 warps walk the experts a quarter each -- for
// Qwen3-30B-A3B's router (128 experts x 2048 F32: 1 MiB a layer) 32 dots a warp, each 4 rounds of 16
// loads a lane, ~128 round trips to memory in a row, by one SM -- and then thread 0 alone takes the
// softmax and k passes over the experts (~10k dependent steps): at decode the whole step's latency,
// 48 times a token. Here:
//   1. a warp an expert, moe_router.cuh's dot (+ bias: the same logit bits); lane 0 writes it to logits;
//   2. the token's last block to finish (common.cuh's sharpinf_last_arrival) reads the n_expert
//      logits back and selects, a thread an expert (n_expert / 128 each):
//        max      a block reduction of fmaxf from NaN (its identity: fmaxf ignores a NaN, as the
//                 serial fold from p[0] does; only a maximum of +-0 can come out with the other sign,
//                 and l - (+0) == l - (-0) for every l but a zero, whose exp is 1 either way);
//        p_e      expf(l_e - max), a thread each; their sum by thread 0 in expert order (moe_route's);
//                 p_e / sum, a thread each;
//        top k    by rank: a valid p (>= 0: not NaN) ranks after every valid p that is larger or equal
//                 with a lower id -- moe_route's pass r takes the expert of rank r (strict >, lower id
//                 first); passes past the V valid experts take expert r with weight p_r, or -1 where
//                 pass r' < r already took it (moe_route's marker), as moe_route's fallback does;
//        weights  the k picks summed in rank order by thread 0, floored, divided (moe_route's).
//      gating 1: no softmax first -- the logits (valid: not NaN) rank, moe_router.cuh's weights.
// Launch: grid = (T, ceil(n_expert / 4)), block = 128; ~4.1 KB static shared memory (p, the picks).
// Batch invariance: a token's logits, ranks and weights are moe_route.cu's arithmetic on its own row
// (which block arrives last changes nothing), so a token routes alike alone or in any batch.
// Bound: latency -- a warp's dot (4 rounds of loads at n_in 2048), the fences and ticket, the
// selection's few block barriers; the router's bytes spread over T x n_expert / 4 blocks.
#include "moe_router.cuh"

template <typename Load>
__device__ __forceinline__ void moe_route_split_row(Load load, const float* __restrict__ Wr,
                                                    const float* __restrict__ br, float* logits, int* tickets,
                                                    int* __restrict__ ids, float* __restrict__ wts, int n_expert,
                                                    int k, int n_in, int has_bias, int gating) {
    __shared__ float p[MOE_MAX_EXPERTS];
    __shared__ float pick_w[MOE_MAX_EXPERTS];
    __shared__ float red_f[MOE_WARPS];
    __shared__ int red_i[MOE_WARPS];
    __shared__ float sum_s, total_s;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const long long t = blockIdx.x;
    float* row_logits = logits + t * n_expert;
    // 1. this block's experts, a warp each
    const int e = blockIdx.y * MOE_WARPS + warp;
    if (e < n_expert) {
        const float l = moe_router_logit(load, Wr + (long long)e * n_in, n_in);
        if (lane == 0) row_logits[e] = has_bias ? l + br[e] : l;
    }
    if (!sharpinf_last_arrival(tickets + t, gridDim.y)) return;

    // 2. the last block: the selection
    float mx = CUDART_NAN_F;  // fmaxf's identity
    for (int j = tid; j < n_expert; j += blockDim.x) {
        p[j] = __ldcg(row_logits + j);  // L2: other blocks wrote them
        mx = fmaxf(mx, p[j]);
    }
    const bool topk = gating == MOE_GATING_TOPK_SOFTMAX;  // block-uniform
    if (topk) {
        __syncthreads();  // the logits themselves rank
    } else {
        for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(SHARPINF_FULL_MASK, mx, off));
        if (lane == 0) red_f[warp] = mx;
        __syncthreads();
        mx = red_f[0];
        for (int w = 1; w < MOE_WARPS; ++w) mx = fmaxf(mx, red_f[w]);
        for (int j = tid; j < n_expert; j += blockDim.x) p[j] = expf(p[j] - mx);
        __syncthreads();
        if (tid == 0) {
            float sum = 0.0f;
            for (int j = 0; j < n_expert; ++j) sum += p[j];
            sum_s = sum;
        }
        __syncthreads();
        const float sum = sum_s;
        for (int j = tid; j < n_expert; j += blockDim.x) p[j] = p[j] / sum;
        __syncthreads();
    }
    // ranks: the picks of the valid experts, and how many are valid (a probability >= 0; a logit not NaN)
    auto usable = [topk](float x) { return topk ? x == x : x >= 0.0f; };
    int valid = 0;
    for (int j = tid; j < n_expert; j += blockDim.x) {
        const float pj = p[j];
        if (!usable(pj)) continue;
        ++valid;
        int rank = 0;
        for (int o = 0; o < n_expert; ++o) {
            const float po = p[o];
            rank += usable(po) && (po > pj || (po == pj && o < j)) ? 1 : 0;
        }
        if (rank < k) {
            ids[t * k + rank] = j;
            pick_w[rank] = pj;
        }
    }
    for (int off = 16; off > 0; off >>= 1) valid += __shfl_xor_sync(SHARPINF_FULL_MASK, valid, off);
    if (lane == 0) red_i[warp] = valid;
    __syncthreads();
    valid = 0;
    for (int w = 0; w < MOE_WARPS; ++w) valid += red_i[w];
    // passes past the valid experts: expert r, its weight p_r -- or -1 if a pass took it (it is valid)
    for (int r = valid + tid; r < k; r += blockDim.x) {
        ids[t * k + r] = r;
        pick_w[r] = p[r] >= 0.0f ? -1.0f : p[r];
    }
    __syncthreads();
    if (tid == 0) {
        if (topk) {
            moe_topk_softmax_weights(pick_w, k, valid < n_expert);  // fewer valid: a NaN logit
        } else {
            float total = 0.0f;
            for (int r = 0; r < k; ++r) total += pick_w[r];
            total_s = fmaxf(total, MOE_WEIGHT_SUM_FLOOR);
        }
        tickets[t] = 0;  // every block of the token has arrived: ready for the next launch
    }
    __syncthreads();
    for (int r = tid; r < k; r += blockDim.x) wts[t * k + r] = topk ? pick_w[r] : pick_w[r] / total_s;
}

extern "C" __global__ void moe_route_split_f32(const float* X, const float* Wr, const float* br, float* logits,
                                               int* tickets, int* ids, float* wts, int n_expert, int k, int n_in,
                                               int has_bias, int gating) {
    sharpinf_pdl_enter();
    moe_route_split_row(RowF32{X + (long long)blockIdx.x * n_in}, Wr, br, logits, tickets, ids, wts, n_expert, k, n_in,
                        has_bias, gating);
}
extern "C" __global__ void moe_route_split_q8(const signed char* xq, const float* xd, const float* Wr, const float* br,
                                              float* logits, int* tickets, int* ids, float* wts, int n_expert, int k,
                                              int n_in, int has_bias, int gating) {
    sharpinf_pdl_enter();
    moe_route_split_row(RowQ8{xq + (long long)blockIdx.x * n_in, xd + (long long)blockIdx.x * (n_in / 32)}, Wr, br,
                        logits, tickets, ids, wts, n_expert, k, n_in, has_bias, gating);
}
