// sampling_rule.cuh -- the sampling rule (the NumPy twin: sharpinf.ops.sampling_reference.sample_reference),
// and the pieces of it every sampling kernel shares (sampling.cu, sampling_radix.cu), so that each
// path picks the same token for the same row: the counter-based uniform, the order-preserving key,
// the 40-bit fixed-point weights, the top-p and final-pick targets, the penalties of rule 1, and the
// history/count updates.
//  0. The row's history gets this step's new ids (so only new ids cross to the device).
//     At the end the chosen id joins it too, and is counted (sample_emit).
//  1. z from the raw logits x, in vLLM's order:
//     a. allowed-token mask: a disallowed id's z is -inf (whatever x is, NaN included) and it is
//        never chosen, greedy or not. A mask that allows no id in [0, vocab): out = -1.
//     b. logit_bias: z[id] += bias (float32 add).
//     c. repetition penalty (llama.cpp/CTRL) on every seen id: v / penalty if v > 0, else
//        v * penalty (each id once: a bit per id).
//     d. presence/frequency (OpenAI): with c = the id's generated count, if c > 0:
//        z = (z - c * frequency) - presence (each op rounded to float32, no contraction).
//  2. temperature == 0: greedy argmax of z, ties to the lowest id (NaN wins, as in np.argmax).
//  3. Otherwise w_i = expf((z_i - max z) / T) (unnormalised probabilities, max weight 1) and the
//     tokens are ranked by z descending, ties by lowest id (z compared through an order-
//     preserving uint32 key; -0 == +0). Every mass below is a sum of the weights in 40-bit fixed
//     point, q_i = floor(w_i * 2^40) (u64; exact in any order, so every path and every grid sums
//     the same integers; a weight below 2^-40 of the largest counts as 0 and is never chosen).
//     Q = the sum of all q. The kept set is the intersection of three prefixes of the ranking:
//     top-k (the first k), top-p (a token stays iff the mass ranked strictly before it is < P,
//     P = max(1, trunc(top_p * Q)) in double: the smallest prefix reaching it, the crossing token
//     stays), min-p (w_i >= min_p, i.e. p_i >= min_p * p_max; all ties alike).
//  4. One 24-bit uniform u24 per (seed, step) from a counter-based 64-bit hash (no state, so the
//     same seed and step give the same u whatever else is in the batch). With K = the kept mass,
//     target = floor(u24 * K / 2^24) (exact) and the chosen token is the first kept token in
//     ascending id order whose running kept mass exceeds target (target < K: one always does).
//     A row with a NaN, or without a finite maximum (all -inf, or +inf), falls back to greedy.
//  5. The chosen id's count in the row's slot goes up by one (saturating), so the host never
//     sends generated ids for the counts.
// Masses are integers on purpose: a u64 sum is exact in any order, so a one-block kernel, a kernel
// that splits the row over many blocks and the NumPy twin agree without sharing a reduction tree.
// Across backends only expf can differ (a choice differs only where a cut lands within an ulp of a
// weight).
#pragma once
#include "common.cuh"

#define SAMPLE_N_PARAMS 6
#define SAMPLE_COUNT_MAX 0xffffu
#define SAMPLE_Q_SCALE 1099511627776.0f  // 2^40: a weight in [0, 1] as a 40-bit fixed-point integer

typedef unsigned long long sample_u64;

// --- counter-based uniform ---------------------------------------------------------------
// SplitMix64's finaliser; two rounds mix the seed, then the step.
__device__ __forceinline__ sample_u64 sample_mix64(sample_u64 z) {
    z ^= z >> 30;
    z *= 0xbf58476d1ce4e5b9ull;
    z ^= z >> 27;
    z *= 0x94d049bb133111ebull;
    z ^= z >> 31;
    return z;
}

// u24 = the top 24 bits of mix64(mix64(seed ^ A) + step * B + C): the uniform u = u24 / 2^24.
__device__ __forceinline__ unsigned sample_u24(sample_u64 seed, int step) {
    sample_u64 h = sample_mix64(seed ^ 0x9e3779b97f4a7c15ull);
    h = sample_mix64(h + (sample_u64)(unsigned)step * 0xd1b54a32d192ed03ull + 0x632be59bd9b4e019ull);
    return (unsigned)(h >> 40);
}

// Order-preserving key: a < b (as floats) <=> key(a) < key(b); -0 maps to +0.
__device__ __forceinline__ unsigned sample_key(float z) {
    unsigned b = __float_as_uint(z);
    if (b == 0x80000000u) b = 0u;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// --- weights and targets -----------------------------------------------------------------
// A weight w in [0, 1] (never NaN: the callers fall back to greedy first) in fixed point:
// floor(w * 2^40). The product is exact (a power of two), the conversion truncates.
__device__ __forceinline__ sample_u64 sample_q(float w) {
    return (sample_u64)(w * SAMPLE_Q_SCALE);
}

// The weight of an id: expf((z - zmax) / T) -- one expression for every pass and path.
__device__ __forceinline__ float sample_weight(float z, float zmax, float temperature) {
    return expf((z - zmax) / temperature);
}

// top-p's threshold on the mass ranked before a token: max(1, trunc(top_p * Q)) in double.
__device__ __forceinline__ sample_u64 sample_top_p_target(float top_p, sample_u64 total) {
    const sample_u64 p = (sample_u64)((double)total * (double)top_p);
    return p > 0ull ? p : 1ull;
}

// floor(u24 * K / 2^24), exactly, without a 128-bit product; < K whenever K > 0.
__device__ __forceinline__ sample_u64 sample_pick_target(unsigned u24, sample_u64 kept) {
    return (kept >> 24) * u24 + (((kept & 0xffffffull) * u24) >> 24);
}

// Of `ties` ids at the top-p cut (each of weight wt, with `above` ranked before them), how many
// stay: tie r stays iff above + r * wt < target, at least one (above < target by the search).
__device__ __forceinline__ int sample_top_p_ties(sample_u64 target, sample_u64 above, sample_u64 wt, int ties) {
    if (wt == 0ull) return ties;
    const sample_u64 n = (target - above + wt - 1ull) / wt;
    return n < (sample_u64)ties ? (n < 1ull ? 1 : (int)n) : ties;
}

// --- generated counts (u16 pairs) -------------------------------------------------------
// One more occurrence of id in a slot's u16 counts (saturating). A CAS on the word that holds
// the pair: a rebuild adds many ids at once and there are no 16-bit atomics.
__device__ __forceinline__ void count_add(unsigned* counts, int id) {
    unsigned* wd = counts + (id >> 1);
    const int shift = (id & 1) * 16;
    unsigned old = *wd, assumed;
    do {
        if (((old >> shift) & SAMPLE_COUNT_MAX) == SAMPLE_COUNT_MAX) return;
        assumed = old;
        old = atomicCAS(wd, assumed, assumed + (1u << shift));
    } while (old != assumed);
}

__device__ __forceinline__ unsigned count_of(const unsigned* counts, int id) {
    return (counts[id >> 1] >> ((id & 1) * 16)) & SAMPLE_COUNT_MAX;
}

#define SEEN_ARGS unsigned *seen_bits, int words, const int *slots, const int *clear, const int *add_off, \
    const int *add_ids, unsigned *counts, int cwords, const int *count_n

// Step 0: bring row `row`'s history slot up to date (every thread of the block calls it).
__device__ __forceinline__ void seen_update_row(unsigned* seen_bits, int words, int vocab, const int* slots,
                                                const int* clear, const int* add_off, const int* add_ids,
                                                unsigned* counts, int cwords, const int* count_n, int row) {
    const int slot = slots[row], tid = threadIdx.x, nt = blockDim.x;
    if (slot < 0) return;  // uniform over the block
    unsigned* bits = seen_bits + (long long)slot * words;
    unsigned* cnt = counts + (long long)slot * cwords;
    if (clear[row]) {
        for (int i = tid; i < words; i += nt) bits[i] = 0u;
        for (int i = tid; i < cwords; i += nt) cnt[i] = 0u;
        __syncthreads();
    }
    const int end = add_off[row + 1], counted = end - count_n[row];
    for (int j = add_off[row] + tid; j < end; j += nt) {
        const int id = add_ids[j];
        if (id >= 0 && id < vocab) {
            atomicOr(&bits[id >> 5], 1u << (id & 31));
            if (j >= counted) count_add(cnt, id);
        }
    }
    __syncthreads();
}

// The row's answer (one thread calls it): out[row], its bit in the row's history slot and its count.
__device__ __forceinline__ void sample_emit(int* out, int row, int id, unsigned* seen_bits, int words,
                                            unsigned* counts, int cwords, int slot, int vocab) {
    out[row] = id;
    if (slot < 0 || id < 0 || id >= vocab) return;
    atomicOr(&seen_bits[(long long)slot * words + (id >> 5)], 1u << (id & 31));
    count_add(counts + (long long)slot * cwords, id);
}

// Row `row`'s allowed-token mask, or nullptr when it has none.
__device__ __forceinline__ const unsigned* sample_mask(const unsigned* masks, const int* mask_idx, int words, int row) {
    return mask_idx[row] >= 0 ? masks + (long long)mask_idx[row] * words : nullptr;
}

// How many ids of [lo, hi) the mask allows (lo a multiple of 32), summed over the block's threads
// (each thread's share; the caller reduces).
__device__ __forceinline__ int sample_allowed_part(const unsigned* mask, int lo, int hi) {
    int allowed = 0;
    for (int wd = lo / 32 + threadIdx.x; wd * 32 < hi; wd += blockDim.x) {
        const int tail = hi - wd * 32;  // ids of this word below hi
        allowed += __popc(mask[wd] & (tail >= 32 ? 0xffffffffu : (1u << tail) - 1u));
    }
    return allowed;
}

// --- rule 1: z from the raw logits, for the ids [lo, hi) (lo a multiple of 32) ----------
// a. mask (-inf where disallowed), b. logit_bias, c. repetition penalty, d. presence/frequency,
// each an elementwise float op in this order, so the bits of z[i] do not depend on the range a
// block covers. Every thread of the block calls it; z[lo, hi) is written and visible to the
// whole block on return.
__device__ __forceinline__ void sample_penalise(const float* x, float* z, int lo, int hi, const unsigned* mask,
                                                int slot, const int* slot_bias, int bias_stride, const float* pr,
                                                const unsigned* seen_bits, int words, const unsigned* counts,
                                                int cwords) {
    const int tid = threadIdx.x, nt = blockDim.x;
    // the copy loads SP_BATCH of a thread's ids before it stores the first (a loop that stored each
    // value as it arrived could not load the next before the store: a round trip an id)
    constexpr int SP_BATCH = 4;
    for (int i0 = lo + tid; i0 < hi; i0 += SP_BATCH * nt) {
        float v[SP_BATCH];
#pragma unroll
        for (int u = 0; u < SP_BATCH; ++u) {
            const int i = i0 + u * nt;
            v[u] = i < hi ? (!mask || (mask[i >> 5] >> (i & 31)) & 1u ? x[i] : -CUDART_INF_F) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < SP_BATCH; ++u)
            if (i0 + u * nt < hi) z[i0 + u * nt] = v[u];
    }
    __syncthreads();
    if (slot < 0) return;  // uniform over the block
    // b. logit_bias (ids distinct: one thread per entry)
    const int* sb = slot_bias + (long long)slot * bias_stride;
    const int half = (bias_stride - 1) / 2, n_bias = min(sb[0], half);
    for (int j = tid; j < n_bias; j += nt) {
        const int id = sb[1 + j];
        if (id >= lo && id < hi) z[id] = z[id] + __int_as_float(sb[1 + half + j]);
    }
    __syncthreads();
    // c. repetition penalty on every id whose history bit is set
    const float penalty = pr[3];
    if (penalty != 1.0f) {
        const unsigned* bits = seen_bits + (long long)slot * words;
        for (int wd = lo / 32 + tid; wd * 32 < hi; wd += nt) {
            unsigned b = bits[wd];
            while (b) {
                const int id = wd * 32 + __ffs(b) - 1;
                b &= b - 1u;
                if (id < hi) {
                    const float v = z[id];
                    z[id] = v > 0.0f ? v / penalty : v * penalty;
                }
            }
        }
        __syncthreads();
    }
    // d. presence / frequency over the generated counts
    const float presence = pr[4], frequency = pr[5];
    if (presence != 0.0f || frequency != 0.0f) {
        const unsigned* cnt = counts + (long long)slot * cwords;
        for (int i0 = lo + tid; i0 < hi; i0 += SP_BATCH * nt) {  // loads first, as the copy above
            unsigned c[SP_BATCH];
            float v[SP_BATCH];
#pragma unroll
            for (int u = 0; u < SP_BATCH; ++u) {
                const int i = i0 + u * nt;
                c[u] = i < hi ? count_of(cnt, i) : 0u;
                v[u] = i < hi ? z[i] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < SP_BATCH; ++u)
                if (c[u]) z[i0 + u * nt] = __fsub_rn(__fsub_rn(v[u], __fmul_rn((float)c[u], frequency)), presence);
        }
        __syncthreads();
    }
}

// Greedy comparator, a total order: NaN first, then larger value, then lower index.
__device__ __forceinline__ bool sample_better(float va, int ia, float vb, int ib) {
    const bool na = va != va, nb = vb != vb;
    if (na != nb) return na;
    if (!na && va != vb) return va > vb;
    return ia < ib;
}

// A row that samples (temperature > 0) falls back to greedy when its greedy value (the maximum;
// NaN if any) is NaN or infinite: no finite maximum, no weights.
__device__ __forceinline__ bool sample_weights_ok(float zmax) {
    return zmax == zmax && zmax != CUDART_INF_F && zmax != -CUDART_INF_F;
}
