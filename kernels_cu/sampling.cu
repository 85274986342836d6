// sampling.cu -- pick the next token of R requests on the device; only the ids come back.
//
// sample_rows(logits, vocab, params, top_k, seeds, steps, seen_bits, words, slots, clear,
//             add_off, add_ids, counts, cwords, count_n, slot_bias, bias_stride, mask_idx, masks,
//             out, scratch)
//   logits    f32 [R, vocab]     each request's last-token logits (row-major, rows contiguous)
//   params    f32 [R, 6]         temperature, top_p, min_p, repetition_penalty, presence_penalty,
//                                frequency_penalty
//   top_k     i32 [R]            0 (or >= vocab) = off
//   seeds     u64 [R]            per-request seed
//   steps     i32 [R]            tokens the request generated so far (the counter of the generator)
//   seen_bits u32 [*, words]     the repetition-penalty history, kept on the device across steps:
//                                bit id of slot s is set once id was fed or generated (words =
//                                ceil(vocab / 32)); a request owns one slot while it runs
//   slots     i32 [R]            the row's history slot; -1: the row has no history (no penalty,
//                                no bias)
//   clear     i32 [R]            1: the slot was just (re)assigned: zero its bits and counts first
//   add_off   i32 [R+1]          ids new to the row's history this step are
//   add_ids   i32 [*]              add_ids[add_off[r] .. add_off[r+1]) (out-of-range ids ignored)
//   counts    u32 [*, cwords]    per slot, how often each id was *generated* (presence/frequency):
//                                u16 saturating at 65535, two per word (id 2j low half, 2j+1 high),
//                                cwords = ceil(vocab / 2). The kernel adds the id it picks itself.
//   count_n   i32 [R]            the last count_n[r] ids of the row's add list are generated ids
//                                to count (a re-admitted request rebuilding its counts; else 0)
//   slot_bias i32 [*, stride]    per slot, its logit_bias: [n, ids[0..half), float bits of the
//                                biases [half..2*half)] with half = (stride - 1) / 2; ids distinct
//   mask_idx  i32 [R]            -1: no allowed-token mask; else the row of `masks` to apply
//   masks     u32 [*, words]     bit id set = id allowed (structured output)
//   out       i32 [R]            the chosen ids (-1: the row's mask allows no id); each also set in
//                                its row's history slot and counted there: the host never sends a
//                                generated id, so the next step may be scheduled before this one's
//                                ids are back
//   scratch   f32 [R, 2*vocab]   plane 0: penalised logits z; plane 1: weights w = exp((z-max)/T)
// seen_update(the same history and count arguments, vocab): only the history update, one block
//   per row (for the rare step whose new ids do not fit the step's buffers).
// Launch: grid = R (one block per row), block = a multiple of 32 up to 1024 (256 suggested).
//
// Semantics (the NumPy twin is sharpinf.ops.sampling.sample_reference):
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
//     preserving uint32 key; -0 == +0). The kept set is the intersection of three prefixes of
//     that ranking: top-k (the first k), top-p (a token stays iff the mass ranked strictly
//     before it is < top_p * sum(w): the smallest prefix reaching top_p, the crossing token
//     stays), min-p (w_i >= min_p, i.e. p_i >= min_p * p_max; all ties alike).
//  4. One uniform u in [0,1) per (seed, step) from a counter-based 64-bit hash (no state, so
//     the same seed and step give the same u whatever else is in the batch). The chosen token
//     is the first kept token in ascending id order whose running kept mass exceeds
//     u * (total kept mass). If rounding leaves nothing above it, the last kept token of
//     positive weight is chosen. A row whose weights sum to 0 or NaN falls back to greedy.
//  5. The chosen id's count in the row's slot goes up by one (saturating), so the host never
//     sends generated ids for the counts.
//
// Cost: a row without a slot or mask reads neither; a row with a slot reads its bias list (n
// entries) and, with presence/frequency on, its counts (vocab * 2 bytes); a masked row reads
// words * 4 bytes of mask.
//
// No sort: the top-k and top-p cuts are found by a 16-ary search on the 32-bit key, four bits
// per pass (the largest key t with count(key >= t) >= k, resp. mass(key >= t) >= top_p * sum):
// 8 passes, each a coalesced sweep of the row (O(vocab / threads) per thread) with 15 block-wide
// counting / summing reductions. Ties at the cut are kept by lowest id, ranked with a block-wide
// exclusive scan. Per row: ~4 sweeps without top-k/top-p, +9 for each.
//
// Determinism: row sweeps visit ids tid, tid + threads, ... (coalesced); the final selection
// walks one contiguous chunk of ids per thread in id order; partial sums are combined by fixed
// trees (xor butterflies) or by one thread in thread order. No
// atomics in the choice (only in the history and count updates, which commute), nothing depends
// on thread timing or on other rows. The result is bit-identical for a
// given block size; across backends only expf and the compilers' float contraction can differ
// (choices differ only where the running mass lands within rounding of u * total).
#include "common.cuh"

#define SAMPLE_MAX_THREADS 1024
#define SAMPLE_N_PARAMS 6
#define SAMPLE_COUNT_MAX 0xffffu

// --- counter-based uniform ---------------------------------------------------------------
// SplitMix64's finaliser; two rounds mix the seed, then the step.
__device__ __forceinline__ unsigned long long sample_mix64(unsigned long long z) {
    z ^= z >> 30;
    z *= 0xbf58476d1ce4e5b9ull;
    z ^= z >> 27;
    z *= 0x94d049bb133111ebull;
    z ^= z >> 31;
    return z;
}

// u = top 24 bits of mix64(mix64(seed ^ A) + step * B + C) / 2^24: exactly representable.
__device__ __forceinline__ float sample_uniform(unsigned long long seed, int step) {
    unsigned long long h = sample_mix64(seed ^ 0x9e3779b97f4a7c15ull);
    h = sample_mix64(h + (unsigned long long)(unsigned)step * 0xd1b54a32d192ed03ull + 0x632be59bd9b4e019ull);
    return (float)(h >> 40) * (1.0f / 16777216.0f);
}

// Order-preserving key: a < b (as floats) <=> key(a) < key(b); -0 maps to +0.
__device__ __forceinline__ unsigned sample_key(float z) {
    unsigned b = __float_as_uint(z);
    if (b == 0x80000000u) b = 0u;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// --- block reductions on ints (exact) ----------------------------------------------------
// op: 0 sum, 1 min, 2 max. Every thread calls and gets the result; smem32 holds 32 ints.
__device__ __forceinline__ int sample_int_op(int a, int b, int op) {
    return op == 0 ? a + b : (op == 1 ? (a < b ? a : b) : (a > b ? a : b));
}

__device__ __forceinline__ int sample_block_int(int v, int op, int identity, int* smem32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int off = 16; off > 0; off >>= 1) v = sample_int_op(v, __shfl_xor_sync(SHARPINF_FULL_MASK, v, off), op);
    __syncthreads();
    if (lane == 0) smem32[warp] = v;
    __syncthreads();
    v = lane < nwarps ? smem32[lane] : identity;
    for (int off = 16; off > 0; off >>= 1) v = sample_int_op(v, __shfl_xor_sync(SHARPINF_FULL_MASK, v, off), op);
    return v;
}

// --- 16-ary threshold search -------------------------------------------------------------
// The value one id adds to a count (int) or to a mass (float: its weight).
template <typename T> __device__ __forceinline__ T sample_val(const float* w, int i);
template <> __device__ __forceinline__ int sample_val<int>(const float*, int) { return 1; }
template <> __device__ __forceinline__ float sample_val<float>(const float* w, int i) { return w[i]; }

// Block-wide sums of v[1..15] (v[0] unused); every thread gets all 15. Same tree as
// block_reduce_sum: xor butterfly within the warp, then over the warp partials (zero-padded).
template <typename T>
__device__ __forceinline__ void sample_block_sum15(T (&v)[16], T* smem /* 32 * 16 */) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int d = 1; d < 16; ++d)
        for (int off = 16; off > 0; off >>= 1) v[d] += __shfl_xor_sync(SHARPINF_FULL_MASK, v[d], off);
    __syncthreads();
    if (lane == 0) {
#pragma unroll
        for (int d = 1; d < 16; ++d) smem[warp * 16 + d] = v[d];
    }
    __syncthreads();
#pragma unroll
    for (int d = 1; d < 16; ++d) {
        T x = lane < nwarps ? smem[lane * 16 + d] : T(0);
        for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(SHARPINF_FULL_MASK, x, off);
        v[d] = x;
    }
}

// The largest key t with A(t) >= need, where A(t) = the sum of sample_val over the ids whose
// key is >= t (A is non-increasing in t; A(0) >= need is assumed). Four bits per pass: a pass
// evaluates the 15 candidates t | d << shift at once, 8 passes in all. Each thread visits the
// ids tid, tid + nt, ... in order, so every mass is a fixed, reproducible float sum.
template <typename T>
__device__ __forceinline__ unsigned sample_search(const float* z, const float* w, int vocab, T need, T* smem) {
    const int tid = threadIdx.x, nt = blockDim.x;
    unsigned t = 0u;
    for (int shift = 28; shift >= 0; shift -= 4) {
        T acc[16];
#pragma unroll
        for (int d = 0; d < 16; ++d) acc[d] = T(0);
        for (int i = tid; i < vocab; i += nt) {
            const unsigned k = sample_key(z[i]);
            if (k < t) continue;  // below every candidate
            unsigned lvl = (k - t) >> shift;  // k >= t | d << shift  <=>  lvl >= d
            if (lvl > 15u) lvl = 15u;
            const T v = sample_val<T>(w, i);
#pragma unroll
            for (int d = 1; d < 16; ++d) acc[d] += (unsigned)d <= lvl ? v : T(0);
        }
        sample_block_sum15<T>(acc, smem);
        unsigned best = 0u;
#pragma unroll
        for (int d = 1; d < 16; ++d)
            if (acc[d] >= need) best = (unsigned)d;
        t |= best << shift;
    }
    return t;
}

// Greedy comparator, a total order: NaN first, then larger value, then lower index.
__device__ __forceinline__ bool sample_better(float va, int ia, float vb, int ib) {
    const bool na = va != va, nb = vb != vb;
    if (na != nb) return na;
    if (!na && va != vb) return va > vb;
    return ia < ib;
}

__device__ __forceinline__ int sample_block_argmax(float bv, int bi, float* sval, int* sidx) {
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(SHARPINF_FULL_MASK, bv, off);
        const int oi = __shfl_xor_sync(SHARPINF_FULL_MASK, bi, off);
        if (sample_better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) { sval[warp] = bv; sidx[warp] = bi; }
    __syncthreads();
    bv = lane < nwarps ? sval[lane] : -CUDART_INF_F;
    bi = lane < nwarps ? sidx[lane] : 0x7fffffff;
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(SHARPINF_FULL_MASK, bv, off);
        const int oi = __shfl_xor_sync(SHARPINF_FULL_MASK, bi, off);
        if (sample_better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    return bi;
}

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

#define SEEN_ARGS unsigned *seen_bits, int words, const int *slots, const int *clear, const int *add_off, \
    const int *add_ids, unsigned *counts, int cwords, const int *count_n

extern "C" __global__ void seen_update(SEEN_ARGS, int vocab) {
    seen_update_row(seen_bits, words, vocab, slots, clear, add_off, add_ids, counts, cwords, count_n, blockIdx.x);
}

extern "C" __global__ void __launch_bounds__(SAMPLE_MAX_THREADS) sample_rows(const float* logits, int vocab, const float* params, const int* top_k,
                                       const unsigned long long* seeds, const int* steps, SEEN_ARGS,
                                       const int* slot_bias, int bias_stride, const int* mask_idx,
                                       const unsigned* masks, int* out, float* scratch) {
    __shared__ float redf[32];
    __shared__ int redi[32];
    __shared__ float scan_f[SAMPLE_MAX_THREADS + 1];
    __shared__ int scan_i[SAMPLE_MAX_THREADS + 1];
    __shared__ float red16f[32 * 16];
    __shared__ int red16i[32 * 16];

    const int row = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
    if (vocab <= 0) {
        if (tid == 0) out[row] = -1;
        return;
    }
    const float* x = logits + (long long)row * vocab;
    float* z = scratch + (long long)row * 2 * vocab;
    float* w = z + vocab;
    const float* pr = params + row * SAMPLE_N_PARAMS;
    const float temperature = pr[0], top_p = pr[1], min_p = pr[2];
    const int slot = slots[row];
    const int k = top_k[row];
    // This thread's contiguous chunk [lo, hi) of ids.
    const int chunk = (vocab + nt - 1) / nt;
    const int lo = min(vocab, tid * chunk), hi = min(vocab, lo + chunk);

    // 0. This step's new ids into the row's history.
    seen_update_row(seen_bits, words, vocab, slots, clear, add_off, add_ids, counts, cwords, count_n, row);

    // 1a. z = the logits, -inf where the mask disallows; a mask that allows nothing: -1.
    if (mask_idx[row] >= 0) {
        const unsigned* mask = sample_mask(masks, mask_idx, words, row);
        int allowed = 0;
        for (int wd = tid; wd < words; wd += nt) {
            const int tail = vocab - wd * 32;  // ids of this word below vocab
            allowed += __popc(mask[wd] & (tail >= 32 ? 0xffffffffu : (1u << tail) - 1u));
        }
        if (sample_block_int(allowed, 0, 0, redi) == 0) {
            if (tid == 0) out[row] = -1;
            return;
        }
        for (int i = tid; i < vocab; i += nt) z[i] = (mask[i >> 5] >> (i & 31)) & 1u ? x[i] : -CUDART_INF_F;
    } else {
        for (int i = tid; i < vocab; i += nt) z[i] = x[i];
    }
    __syncthreads();
    if (slot >= 0) {
        // 1b. logit_bias (ids distinct: one thread per entry).
        const int* sb = slot_bias + (long long)slot * bias_stride;
        const int half = (bias_stride - 1) / 2, n_bias = min(sb[0], half);
        for (int j = tid; j < n_bias; j += nt) {
            const int id = sb[1 + j];
            if (id >= 0 && id < vocab) z[id] = z[id] + __int_as_float(sb[1 + half + j]);
        }
        __syncthreads();
        // 1c. repetition penalty on every id whose history bit is set.
        const float penalty = pr[3];
        if (penalty != 1.0f) {
            const unsigned* bits = seen_bits + (long long)slot * words;
            for (int wd = tid; wd < words; wd += nt) {
                unsigned b = bits[wd];
                while (b) {
                    const int id = wd * 32 + __ffs(b) - 1;
                    b &= b - 1u;
                    if (id < vocab) {
                        const float v = z[id];
                        z[id] = v > 0.0f ? v / penalty : v * penalty;
                    }
                }
            }
            __syncthreads();
        }
        // 1d. presence / frequency over the generated counts.
        const float presence = pr[4], frequency = pr[5];
        if (presence != 0.0f || frequency != 0.0f) {
            const unsigned* cnt = counts + (long long)slot * cwords;
            for (int i = tid; i < vocab; i += nt) {
                const unsigned c = count_of(cnt, i);
                if (c) z[i] = __fsub_rn(__fsub_rn(z[i], __fmul_rn((float)c, frequency)), presence);
            }
            __syncthreads();
        }
    }

    // 2. Greedy answer (also the fallback) and the row maximum.
    float bv = -CUDART_INF_F, zmax = -CUDART_INF_F;
    int bi = 0x7fffffff;
    const unsigned* mask = sample_mask(masks, mask_idx, words, row);  // (re-derived: fewer live registers)
    for (int i = tid; i < vocab; i += nt) {
        const float v = z[i];
        if (mask && !((mask[i >> 5] >> (i & 31)) & 1u)) continue;  // never chosen, even at -inf
        if (sample_better(v, i, bv, bi)) { bv = v; bi = i; }
        zmax = fmaxf(zmax, v);
    }
    const int greedy = sample_block_argmax(bv, bi, redf, redi);
    if (temperature == 0.0f) {
        if (tid == 0) sample_emit(out, row, greedy, seen_bits, words, counts, cwords, slots[row], vocab);
        return;
    }
    zmax = block_reduce_max(zmax, redf);

    // 3. Weights and their total. Every sum over the row below runs over the same coalesced
    //    strided set per thread, in the same order, then the fixed butterfly tree; so a mass
    //    over a key range is bit-identical whichever pass computes it.
    float s = 0.0f;
    for (int i = tid; i < vocab; i += nt) {
        const float wi = expf((z[i] - zmax) / temperature);
        w[i] = wi;
        s += wi;
    }
    const float total_w = block_reduce_sum(s, redf);
    if (!(total_w > 0.0f) || zmax == -CUDART_INF_F) {  // all -inf, or NaN somewhere
        if (tid == 0) sample_emit(out, row, greedy, seen_bits, words, counts, cwords, slots[row], vocab);
        return;
    }

    // 4. The cut: keep key > cut_key, and the first cut_n ties (key == cut_key) by lowest id.
    unsigned cut_key = 0u;
    int cut_n = 0x7fffffff;
    if (k > 0 && k < vocab) {
        // largest t with count(key >= t) >= k: the k-th largest key
        const unsigned t = sample_search<int>(z, w, vocab, k, red16i);
        int g = 0;
        for (int i = tid; i < vocab; i += nt) g += sample_key(z[i]) > t ? 1 : 0;
        cut_key = t;
        cut_n = k - sample_block_int(g, 0, 0, redi);  // >= 1
    }
    if (top_p < 1.0f) {
        const float target_p = top_p * total_w;
        // largest t with mass(key >= t) >= top_p * total: the token ranked at the crossing
        const unsigned t = sample_search<float>(z, w, vocab, target_p, red16f);
        // mass strictly above t, the number of ties at t and their (common) weight
        float above = 0.0f, wt = 0.0f;
        int ties = 0;
        for (int i = tid; i < vocab; i += nt) {
            const unsigned ki = sample_key(z[i]);
            if (ki > t) above += w[i];
            if (ki == t) { ++ties; wt = w[i]; }
        }
        above = block_reduce_sum(above, redf);
        wt = block_reduce_max(wt, redf);
        ties = sample_block_int(ties, 0, 0, redi);
        // tie r (0-based, by id) stays iff above + r * wt < target_p
        const float q = (target_p - above) / wt;
        int n = q < (float)ties ? (int)ceilf(q) : ties;  // NaN/inf q: keep all ties
        if (n < 1) n = 1;
        if (t > cut_key) { cut_key = t; cut_n = n; }
        else if (t == cut_key && n < cut_n) cut_n = n;
    }

    // From here on each thread walks its contiguous chunk [lo, hi) of ids, which holds
    // weights other threads wrote.
    __syncthreads();

    // Rank of this chunk's first tie among all ties at the cut (exclusive scan in thread order).
    int rank = 0;
    if (cut_n != 0x7fffffff) {
        int c = 0;
        for (int i = lo; i < hi; ++i) c += sample_key(z[i]) == cut_key ? 1 : 0;
        scan_i[tid] = c;
        __syncthreads();
        if (tid == 0) {
            int e = 0;
            for (int j = 0; j < nt; ++j) { const int v = scan_i[j]; scan_i[j] = e; e += v; }
        }
        __syncthreads();
        rank = scan_i[tid];
    }

    // 5. Kept mass per chunk; exclusive prefix over threads by one thread, in thread order.
    const int rank0 = rank;
    float kept = 0.0f;
    for (int i = lo; i < hi; ++i) {
        const unsigned ki = sample_key(z[i]);
        bool keep = ki > cut_key || (ki == cut_key && rank++ < cut_n);
        if (min_p > 0.0f && !(w[i] >= min_p)) keep = false;
        if (keep) kept += w[i];
    }
    scan_f[tid] = kept;
    __syncthreads();
    if (tid == 0) {
        float e = 0.0f;
        for (int j = 0; j < nt; ++j) { const float v = scan_f[j]; scan_f[j] = e; e += v; }
        scan_f[nt] = e;
    }
    __syncthreads();
    const float total = scan_f[nt];
    const float target = sample_uniform(seeds[row], steps[row]) * total;
    // The owner: the first thread whose end-of-chunk running mass exceeds the target; if
    // rounding leaves none, the last thread with positive kept mass.
    int owner = sample_block_int(scan_f[tid + 1] > target ? tid : nt, 1, nt, redi);
    if (owner == nt) owner = sample_block_int(kept > 0.0f ? tid : -1, 2, -1, redi);
    if (tid == owner) {
        float c = scan_f[tid];
        int pick = -1, last = -1;
        rank = rank0;
        for (int i = lo; i < hi; ++i) {
            const unsigned ki = sample_key(z[i]);
            bool keep = ki > cut_key || (ki == cut_key && rank++ < cut_n);
            if (min_p > 0.0f && !(w[i] >= min_p)) keep = false;
            if (!keep || !(w[i] > 0.0f)) continue;
            last = i;
            c += w[i];
            if (c > target) { pick = i; break; }
        }
        sample_emit(out, row, pick >= 0 ? pick : last, seen_bits, words, counts, cwords, slots[row], vocab);
    }
    if (owner < 0 && tid == 0) sample_emit(out, row, greedy, seen_bits, words, counts, cwords, slots[row], vocab);  // unreachable for finite weights
}
