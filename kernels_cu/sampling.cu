// sampling.cu -- pick the next token of R requests on the device, a block a row; only the ids come
// back. The rule (history, penalties, greedy, top-k / top-p / min-p, the draw): sampling_rule.cuh.
//
// sample_rows(logits, vocab, params, top_k, seeds, steps, seen_bits, words, slots, clear, add_off,
//             add_ids, counts, cwords, count_n, slot_bias, bias_stride, mask_idx, masks, out, scratch)
//   logits f32 [R, vocab]: each request's last-token logits, rows contiguous; params f32 [R, 6]:
//   temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty; top_k i32 [R]
//   (0 or >= vocab: off); seeds u64 [R], a request's seed; steps i32 [R]: tokens the request
//   generated so far (the counter of the generator)
//   seen_bits u32 [*, words]  the repetition-penalty history, kept on the device across steps: bit id
//     of slot s is set once id was fed or generated (words = ceil(vocab / 32)); a request owns one slot
//     while it runs. slots i32 [R]: the row's slot, -1: no history (no penalty, no bias); clear i32 [R]:
//     1 = the slot was just (re)assigned: zero its bits and counts first
//   add_off i32 [R+1], add_ids i32 [*]: ids new to the row's history this step are
//     add_ids[add_off[r] .. add_off[r+1]) (out-of-range ids ignored)
//   counts u32 [*, cwords]  per slot, how often each id was *generated* (presence/frequency): u16
//     saturating at 65535, two per word (id 2j low half, 2j+1 high), cwords = ceil(vocab / 2); the
//     kernel adds the id it picks itself. count_n i32 [R]: the last count_n[r] ids of the row's add
//     list are generated ids to count (a re-admitted request rebuilding its counts; else 0)
//   slot_bias i32 [*, stride]  per slot, its logit_bias: [n, ids[0..half), float bits of the biases
//     [half..2*half)] with half = (stride - 1) / 2; ids distinct
//   mask_idx i32 [R]: -1, no allowed-token mask; else the row of masks u32 [*, words] (bit id set =
//     id allowed: structured output) to apply
//   out i32 [R]  the chosen ids (-1: the row's mask allows no id); each also set in its row's history
//     slot and counted there, so the next step may be scheduled before this one's ids are back
//   scratch f32 [R, 2*vocab]  plane 0: penalised logits z; plane 1: weights w = exp((z-max)/T)
// seen_update(the same history and count arguments, vocab): only the history update, a block a row
//   (for the rare step whose new ids do not fit the step's buffers).
//
// No sort: the top-k and top-p cuts are found by a 16-ary search on the 32-bit key, four bits a pass
// (the largest key t with count(key >= t) >= k, resp. mass(key >= t) >= P): 8 passes, each a
// coalesced sweep of the row (O(vocab / threads) per thread) with 15 block-wide counting / summing
// reductions. Ties at the cut are kept by lowest id, ranked with a block-wide exclusive scan.
// Launch: grid = R (one block per row), block = a multiple of 32 up to 1024 (256 suggested).
// Batch invariance: every mass is an integer (rule 3), so the sums are exact whatever their order;
// the float work is elementwise (z, w), one expression on every path. No atomics in the choice (only
// in the history and count updates, which commute); nothing depends on thread timing, the block size
// or other rows. sampling_radix.cu is the same rule over many blocks a row: the same tokens.
// Bound: one SM's sweeps of the row (~4 without top-k/top-p, +9 for each); a row with a slot also
// reads its bias list (n entries) and, with presence/frequency on, its counts (vocab * 2 bytes); a
// masked row words * 4 bytes of mask; a row without a slot or mask reads neither.
#include "sampling_rule.cuh"

#define SAMPLE_MAX_THREADS 1024

// --- block reductions on integers (exact) -----------------------------------------------
// op: 0 sum, 1 min, 2 max. Every thread calls and gets the result; smem32 holds 32 values.
template <typename T>
__device__ __forceinline__ T sample_int_op(T a, T b, int op) {
    return op == 0 ? a + b : (op == 1 ? (a < b ? a : b) : (a > b ? a : b));
}

template <typename T>
__device__ __forceinline__ T sample_block_op(T v, int op, T identity, T* smem32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int off = 16; off > 0; off >>= 1) v = sample_int_op(v, __shfl_xor_sync(SHARPINF_FULL_MASK, v, off), op);
    __syncthreads();
    if (lane == 0) smem32[warp] = v;
    __syncthreads();
    v = lane < nwarps ? smem32[lane] : identity;
    for (int off = 16; off > 0; off >>= 1) v = sample_int_op(v, __shfl_xor_sync(SHARPINF_FULL_MASK, v, off), op);
    return v;
}

__device__ __forceinline__ int sample_block_int(int v, int op, int identity, int* smem32) {
    return sample_block_op<int>(v, op, identity, smem32);
}

// --- 16-ary threshold search -------------------------------------------------------------
// The value one id adds to a count (int) or to a mass (float: its weight).
template <typename T> __device__ __forceinline__ T sample_val(const float* w, int i);
template <> __device__ __forceinline__ int sample_val<int>(const float*, int) { return 1; }
template <> __device__ __forceinline__ sample_u64 sample_val<sample_u64>(const float* w, int i) { return sample_q(w[i]); }

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

extern "C" __global__ void seen_update(SEEN_ARGS, int vocab) {
    sharpinf_pdl_enter();
    seen_update_row(seen_bits, words, vocab, slots, clear, add_off, add_ids, counts, cwords, count_n, blockIdx.x);
}

extern "C" __global__ void __launch_bounds__(SAMPLE_MAX_THREADS) sample_rows(const float* logits, int vocab, const float* params, const int* top_k,
                                       const unsigned long long* seeds, const int* steps, SEEN_ARGS,
                                       const int* slot_bias, int bias_stride, const int* mask_idx,
                                       const unsigned* masks, int* out, float* scratch) {
    sharpinf_pdl_enter();
    __shared__ float redf[32];
    __shared__ int redi[32];
    __shared__ sample_u64 scan_q[SAMPLE_MAX_THREADS + 1];
    __shared__ sample_u64 red64[32];
    __shared__ int scan_i[SAMPLE_MAX_THREADS + 1];
    __shared__ sample_u64 red16q[32 * 16];
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

    // 1. z = the penalised logits; a mask that allows nothing: -1.
    const unsigned* mask = sample_mask(masks, mask_idx, words, row);
    if (mask && sample_block_int(sample_allowed_part(mask, 0, vocab), 0, 0, redi) == 0) {
        if (tid == 0) out[row] = -1;
        return;
    }
    sample_penalise(x, z, 0, vocab, mask, slot, slot_bias, bias_stride, pr, seen_bits, words, counts, cwords);

    // 2. Greedy answer (also the fallback); its value is the row maximum (NaN if any).
    float bv = -CUDART_INF_F;
    int bi = 0x7fffffff;
    for (int i = tid; i < vocab; i += nt) {
        const float v = z[i];
        if (mask && !((mask[i >> 5] >> (i & 31)) & 1u)) continue;  // never chosen, even at -inf
        if (sample_better(v, i, bv, bi)) { bv = v; bi = i; }
    }
    const int greedy = sample_block_argmax(bv, bi, redf, redi);
    const float zmax = z[greedy];
    if (temperature == 0.0f || !sample_weights_ok(zmax)) {
        if (tid == 0) sample_emit(out, row, greedy, seen_bits, words, counts, cwords, slot, vocab);
        return;
    }

    // 3. Weights and their fixed-point total Q (exact: the order of the sum does not matter).
    sample_u64 s = 0ull;
    for (int i = tid; i < vocab; i += nt) {
        const float wi = sample_weight(z[i], zmax, temperature);
        w[i] = wi;
        s += sample_q(wi);
    }
    const sample_u64 total_q = sample_block_op<sample_u64>(s, 0, 0ull, red64);

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
        const sample_u64 target_p = sample_top_p_target(top_p, total_q);
        // largest t with mass(key >= t) >= P: the token ranked at the crossing
        const unsigned t = sample_search<sample_u64>(z, w, vocab, target_p, red16q);
        // mass strictly above t, the number of ties at t and their (common) weight
        sample_u64 above = 0ull, wt = 0ull;
        int ties = 0;
        for (int i = tid; i < vocab; i += nt) {
            const unsigned ki = sample_key(z[i]);
            if (ki > t) above += sample_q(w[i]);
            if (ki == t) { ++ties; wt = sample_q(w[i]); }
        }
        above = sample_block_op<sample_u64>(above, 0, 0ull, red64);
        wt = sample_block_op<sample_u64>(wt, 2, 0ull, red64);
        ties = sample_block_int(ties, 0, 0, redi);
        const int n = sample_top_p_ties(target_p, above, wt, ties);
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
    sample_u64 kept = 0ull;
    for (int i = lo; i < hi; ++i) {
        const unsigned ki = sample_key(z[i]);
        bool keep = ki > cut_key || (ki == cut_key && rank++ < cut_n);
        if (min_p > 0.0f && !(w[i] >= min_p)) keep = false;
        if (keep) kept += sample_q(w[i]);
    }
    scan_q[tid] = kept;
    __syncthreads();
    if (tid == 0) {
        sample_u64 e = 0ull;
        for (int j = 0; j < nt; ++j) { const sample_u64 v = scan_q[j]; scan_q[j] = e; e += v; }
        scan_q[nt] = e;
    }
    __syncthreads();
    const sample_u64 total = scan_q[nt];
    if (total == 0ull) {  // nothing kept (min_p > 1): greedy
        if (tid == 0) sample_emit(out, row, greedy, seen_bits, words, counts, cwords, slot, vocab);
        return;
    }
    const sample_u64 target = sample_pick_target(sample_u24(seeds[row], steps[row]), total);
    // The owner: the one thread whose chunk holds the crossing (target < total: there is one).
    if (scan_q[tid] <= target && target < scan_q[tid + 1]) {
        sample_u64 c = scan_q[tid];
        rank = rank0;
        for (int i = lo; i < hi; ++i) {
            const unsigned ki = sample_key(z[i]);
            bool keep = ki > cut_key || (ki == cut_key && rank++ < cut_n);
            if (min_p > 0.0f && !(w[i] >= min_p)) keep = false;
            if (!keep) continue;
            c += sample_q(w[i]);
            if (c > target) {
                sample_emit(out, row, i, seen_bits, words, counts, cwords, slot, vocab);
                break;
            }
        }
    }
}
