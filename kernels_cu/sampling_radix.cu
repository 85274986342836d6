// sampling_radix.cu -- sampling.cu's rule (the same token for every row, bit for bit) with each
// row split over many blocks, for the GPU: one block a row reads 2 x vocab floats ~10 times from
// one SM; here every pass is spread over the SMs.
//
// Algorithm: the row is cut into fixed segments of SAMPLE_SEG ids (the grid's x); every
// reduction over the row is an integer one (fixed-point masses, counts, a packed argmax) done
// with atomics, which are exact in any order. The top-k and top-p cuts are two radix selects on the
// 32-bit key, 8 bits a pass (4 passes, both searches in the same sweeps): each pass builds a
// 256-bin histogram (counts; counts and masses) of the ids under the prefix chosen so far, in
// shared memory, then adds it to the row's global one; the next launch picks its bin by a
// block-wide suffix scan. The final pick finds the crossing segment from per-segment kept
// masses, then the crossing id inside it by a block scan in id order.
//
// Launches (the launcher issues them in order on one stream; a CUDA graph captures all 7):
//   sample_radix_init  grid (1, R)     history update (rule 0), zero the row's accumulators
//   sample_radix_z     grid (S, R)     rule 1 (z), the greedy argmax (atomicMax on a packed
//                                      key|~id), the mask's allowed count
//   sample_radix_w     grid (S, R)     w and the total Q; radix pass 0 (key bits 31..24)
//   sample_radix_pass  grid (S, R) x3  radix passes 1..3 (a row without top-k/top-p returns)
//   sample_radix_keep  grid (S, R)     per segment: kept mass of the ids above the cut, ties at it
//   sample_radix_pick  grid (1, R)     the choice (or greedy / -1), its history bit and count
// S = ceil(vocab / SAMPLE_SEG); block = SAMPLE_RADIX_THREADS.
//
// Arguments as sample_rows', plus acc u32 [R, acc_stride] (the row's accumulators, layout below;
// sharpinf.ops.sampling.radix_acc_words gives acc_stride). A row without top-k and top-p skips
// the histograms and returns from the three passes at once.
//
// Tiles: a (segment, row) block holds 4096 ids, 16 a thread; every pass is a sweep of the segment
// (z and w stay in L2: 1.2 MB a row at 152k), a thread's 16 values loaded before it uses the first
// (radix_fetch: one round trip to L2 a sweep).
// Batch invariance: every reduction is an exact integer one, so the result depends on no grid, block,
// timing or other row, and equals sampling.cu's.
// Bound: the launches' latency (a few us each in a graph) -- the work is ~40 MB/s of L2 traffic per
// row, nothing. Expected: ~15-25 us a row at 152k ids (against ~260 us for sampling.cu's one block on
// an H100); 256-thread blocks, a grid of 38 blocks a row at 152k.
#include "sampling_rule.cuh"

#define SAMPLE_SEG 4096
#define SAMPLE_RADIX_THREADS 256
#define SAMPLE_BINS 256

// acc layout (u32 words; u64 items at even offsets)
#define ACC_GREEDY 0  // u64: max over allowed ids of (key' << 32 | ~id), key' = 0xffffffff for NaN
#define ACC_Q 2       // u64: the total fixed-point mass Q
#define ACC_ALLOWED 4  // u32: ids the mask allows
#define ACC_HIST 8     // 4 passes x [count_k u32[256], count_p u32[256], mass_p u64[256]]
#define ACC_PASS_WORDS (4 * SAMPLE_BINS)
#define ACC_SEG (ACC_HIST + 4 * ACC_PASS_WORDS)  // per segment: kept mass u64[S], then ties u32[S]

#define RADIX_ARGS const float *logits, int vocab, const float *params, const int *top_k, \
    const unsigned long long *seeds, const int *steps, SEEN_ARGS, const int *slot_bias, int bias_stride, \
    const int *mask_idx, const unsigned *masks, int *out, float *scratch, unsigned *acc, int acc_stride

struct RadixHist {
    unsigned* count_k;
    unsigned* count_p;
    sample_u64* mass_p;
};

__device__ __forceinline__ RadixHist radix_hist(unsigned* row_acc, int pass) {
    unsigned* h = row_acc + ACC_HIST + pass * ACC_PASS_WORDS;
    return RadixHist{h, h + SAMPLE_BINS, reinterpret_cast<sample_u64*>(h + 2 * SAMPLE_BINS)};
}

// The row's state after sample_radix_z: what every later launch of the row checks first.
struct RadixRow {
    int row, vocab, lo, hi, seg, nseg;
    const float* pr;
    float temperature, top_p, min_p;
    int k;
    bool topk_on, topp_on;
    float* z;
    float* w;
    unsigned* acc;
    const unsigned* mask;
};

__device__ __forceinline__ RadixRow radix_row(int vocab, const float* params, const int* top_k, float* scratch,
                                              unsigned* acc, int acc_stride, const int* mask_idx,
                                              const unsigned* masks, int words) {
    RadixRow r;
    r.row = blockIdx.y;
    r.vocab = vocab;
    r.seg = blockIdx.x;
    r.nseg = (vocab + SAMPLE_SEG - 1) / SAMPLE_SEG;
    r.lo = min(vocab, r.seg * SAMPLE_SEG);
    r.hi = min(vocab, r.lo + SAMPLE_SEG);
    r.pr = params + r.row * SAMPLE_N_PARAMS;
    r.temperature = r.pr[0];
    r.top_p = r.pr[1];
    r.min_p = r.pr[2];
    r.k = top_k[r.row];
    r.topk_on = r.k > 0 && r.k < vocab;
    r.topp_on = r.top_p < 1.0f;
    r.z = scratch + (long long)r.row * 2 * vocab;
    r.w = r.z + vocab;
    r.acc = acc + (long long)r.row * acc_stride;
    r.mask = sample_mask(masks, mask_idx, words, r.row);
    return r;
}

__device__ __forceinline__ sample_u64 radix_load_u64(const unsigned* acc, int off) {
    return *reinterpret_cast<const sample_u64*>(acc + off);
}

__device__ __forceinline__ int radix_greedy(const RadixRow& r) {
    return (int)(0xffffffffu - (unsigned)(radix_load_u64(r.acc, ACC_GREEDY) & 0xffffffffull));
}

// Whether the row samples from weights: not masked empty, temperature > 0, a finite maximum.
__device__ __forceinline__ bool radix_samples(const RadixRow& r) {
    if (r.mask && r.acc[ACC_ALLOWED] == 0u) return false;
    if (r.temperature == 0.0f) return false;
    return sample_weights_ok(r.z[radix_greedy(r)]);
}

// --- a thread's ids of the segment -------------------------------------------------------
// Thread t takes the ids lo + t + 256 k (k < RADIX_PER) below hi. A sweep loads all of a thread's
// values before it uses the first -- one round trip to L2, not 16: a loop that stored or counted
// (an atomic) each value as it arrived would wait on its load once an id -- and then visits them
// in k order. The results are the same: every per-id step is independent and
// every reduction an exact integer one.
#define RADIX_PER (SAMPLE_SEG / SAMPLE_RADIX_THREADS)  // 16
__device__ __forceinline__ int radix_id(const RadixRow& r, int k) { return r.lo + (int)threadIdx.x + k * SAMPLE_RADIX_THREADS; }
__device__ __forceinline__ void radix_fetch(const float* v, const RadixRow& r, float (&out)[RADIX_PER]) {
#pragma unroll
    for (int k = 0; k < RADIX_PER; ++k) {
        const int i = radix_id(r, k);
        out[k] = i < r.hi ? v[i] : 0.0f;
    }
}

// --- block-wide helpers (256 threads) ----------------------------------------------------
template <typename T>
__device__ __forceinline__ T radix_block_sum(T v, T* smem32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(SHARPINF_FULL_MASK, v, off);
    __syncthreads();
    if (lane == 0) smem32[warp] = v;
    __syncthreads();
    v = lane < nwarps ? smem32[lane] : T(0);
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(SHARPINF_FULL_MASK, v, off);
    return v;
}


// One radix step: of the 256 bins h (ids under the prefix so far, bin = the next 8 key bits; thread t
// holds h_t), the largest b with sum(h[b..255]) >= need; need becomes need - sum(h[b+1..255]).
// Every thread calls; every thread gets (b, need). sfx: 257 values of shared memory.
template <typename T>
__device__ __forceinline__ unsigned radix_select(T h_t, T* need, T* sfx, int* smem32i) {
    const int t = threadIdx.x;
    sfx[t] = h_t;
    if (t == 0) sfx[SAMPLE_BINS] = T(0);
    __syncthreads();
    for (int d = 1; d < SAMPLE_BINS; d <<= 1) {  // inclusive suffix sums, Hillis-Steele
        const T v = t + d < SAMPLE_BINS ? sfx[t + d] : T(0);
        __syncthreads();
        sfx[t] += v;
        __syncthreads();
    }
    // S(b) is non-increasing in b: the bins with S(b) >= need are 0..b*
    const int n = radix_block_sum<int>(sfx[t] >= *need ? 1 : 0, smem32i);
    const unsigned b = (unsigned)(n - 1);
    const T above = sfx[b + 1];
    __syncthreads();
    *need -= above;
    return b;
}

// The two searches' state after `passes` passes: prefix keys (passes * 8 bits) and what each
// still needs. With passes = 4: the full cut keys.
struct RadixCut {
    unsigned key_k, key_p;
    int need_k;
    sample_u64 need_p, target_p;
};

struct RadixSmem {
    sample_u64 hist_m[SAMPLE_BINS];  // a block's histogram of one pass
    unsigned hist_k[SAMPLE_BINS], hist_p[SAMPLE_BINS];
    sample_u64 sfx_q[SAMPLE_BINS + 1];
    int sfx_i[SAMPLE_BINS + 1];
    int red_i[32];
    sample_u64 red_q[32];
};

__device__ __forceinline__ RadixCut radix_cut(const RadixRow& r, int passes, RadixSmem& sm) {
    // every pass's bin t of both histograms, loaded before the first select (one round trip to L2,
    // not one a pass: a select's barriers would otherwise sit between them)
    const int t = threadIdx.x;
    int ck[4];
    sample_u64 mp[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        const RadixHist h = radix_hist(r.acc, p);
        ck[p] = p < passes && r.topk_on ? (int)h.count_k[t] : 0;
        mp[p] = p < passes && r.topp_on ? h.mass_p[t] : 0ull;
    }
    RadixCut c;
    c.key_k = c.key_p = 0u;
    c.need_k = r.k;
    c.target_p = sample_top_p_target(r.top_p, radix_load_u64(r.acc, ACC_Q));
    c.need_p = c.target_p;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        if (p >= passes) break;
        if (r.topk_on) {
            const unsigned b = radix_select<int>(ck[p], &c.need_k, sm.sfx_i, sm.red_i);
            c.key_k = (c.key_k << 8) | b;
        }
        if (r.topp_on) {
            const unsigned b = radix_select<sample_u64>(mp[p], &c.need_p, sm.sfx_q, sm.red_i);
            c.key_p = (c.key_p << 8) | b;
        }
    }
    return c;
}

// The kept set's cut (rule 3): keep key > cut_key and the first cut_n ties at cut_key.
__device__ __forceinline__ void radix_final_cut(const RadixRow& r, RadixSmem& sm, unsigned* cut_key, int* cut_n) {
    *cut_key = 0u;
    *cut_n = 0x7fffffff;
    if (!r.topk_on && !r.topp_on) return;
    const RadixCut c = radix_cut(r, 4, sm);
    if (r.topk_on) { *cut_key = c.key_k; *cut_n = c.need_k; }  // need_k = k - count(key > t) >= 1
    if (r.topp_on) {
        const RadixHist h = radix_hist(r.acc, 3);
        const unsigned b = c.key_p & 255u;
        const int ties = (int)h.count_p[b];
        const sample_u64 wt = h.mass_p[b] / (sample_u64)ties;  // ties share z, so w and q
        const sample_u64 above = c.target_p - c.need_p;      // the mass ranked strictly above
        const int n = sample_top_p_ties(c.target_p, above, wt, ties);
        if (c.key_p > *cut_key) { *cut_key = c.key_p; *cut_n = n; }
        else if (c.key_p == *cut_key && n < *cut_n) *cut_n = n;
    }
}

// Radix pass `pass` over the segment: histograms of the ids under the prefixes chosen so far.
// zv, wv: the thread's z and (with top-p) w, radix_fetch's.
__device__ __forceinline__ void radix_histogram(const RadixRow& r, int pass, const RadixCut& c, RadixSmem& sm,
                                                const float (&zv)[RADIX_PER], const float (&wv)[RADIX_PER]) {
    unsigned *hk = sm.hist_k, *hp = sm.hist_p;
    sample_u64* hm = sm.hist_m;
    const int t = threadIdx.x;
    hk[t] = hp[t] = 0u;
    hm[t] = 0ull;
    __syncthreads();
    const int shift = 24 - 8 * pass;  // the bits this pass decides
#pragma unroll
    for (int k = 0; k < RADIX_PER; ++k) {
        if (radix_id(r, k) >= r.hi) break;
        const unsigned key = sample_key(zv[k]);
        const unsigned bin = (key >> shift) & 255u;
        if (r.topk_on && (pass == 0 || (key >> (shift + 8)) == c.key_k)) atomicAdd(&hk[bin], 1u);
        if (r.topp_on && (pass == 0 || (key >> (shift + 8)) == c.key_p)) {
            atomicAdd(&hp[bin], 1u);
            atomicAdd(&hm[bin], sample_q(wv[k]));
        }
    }
    __syncthreads();
    const RadixHist g = radix_hist(r.acc, pass);
    if (hk[t]) atomicAdd(&g.count_k[t], hk[t]);
    if (hp[t]) atomicAdd(&g.count_p[t], hp[t]);
    if (hm[t]) atomicAdd(&g.mass_p[t], hm[t]);
}

// --- the launches ------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(SAMPLE_RADIX_THREADS) sample_radix_init(RADIX_ARGS) {
    sharpinf_pdl_enter();
    const int row = blockIdx.y;
    seen_update_row(seen_bits, words, vocab, slots, clear, add_off, add_ids, counts, cwords, count_n, row);
    unsigned* a = acc + (long long)row * acc_stride;
    for (int i = threadIdx.x; i < ACC_SEG; i += blockDim.x) a[i] = 0u;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_RADIX_THREADS) sample_radix_z(RADIX_ARGS) {
    sharpinf_pdl_enter();
    __shared__ sample_u64 red_q[32];
    __shared__ int red_i[32];
    const RadixRow r = radix_row(vocab, params, top_k, scratch, acc, acc_stride, mask_idx, masks, words);
    const float* x = logits + (long long)r.row * vocab;
    sample_penalise(x, r.z, r.lo, r.hi, r.mask, slots[r.row], slot_bias, bias_stride, r.pr, seen_bits, words,
                    counts, cwords);
    // the greedy candidate: NaN first, then the larger value, then the lower id
    sample_u64 best = 0ull;
    float zv[RADIX_PER];
    radix_fetch(r.z, r, zv);  // sample_penalise's, after its barrier
#pragma unroll
    for (int k = 0; k < RADIX_PER; ++k) {
        const int i = radix_id(r, k);
        if (i >= r.hi) break;
        if (r.mask && !((r.mask[i >> 5] >> (i & 31)) & 1u)) continue;
        const float v = zv[k];
        const unsigned key = v != v ? 0xffffffffu : sample_key(v);
        const sample_u64 packed = ((sample_u64)key << 32) | (sample_u64)(0xffffffffu - (unsigned)i);
        best = packed > best ? packed : best;
    }
    // max through the sum helper's tree: a block max of u64
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int off = 16; off > 0; off >>= 1) {
        const sample_u64 o = __shfl_xor_sync(SHARPINF_FULL_MASK, best, off);
        best = o > best ? o : best;
    }
    if (lane == 0) red_q[warp] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int j = 1; j < nwarps; ++j) best = red_q[j] > best ? red_q[j] : best;
        if (best) atomicMax(reinterpret_cast<sample_u64*>(r.acc + ACC_GREEDY), best);
    }
    if (r.mask) {
        const int allowed = radix_block_sum<int>(sample_allowed_part(r.mask, r.lo, r.hi), red_i);
        if (threadIdx.x == 0 && allowed) atomicAdd(&r.acc[ACC_ALLOWED], (unsigned)allowed);
    }
}

extern "C" __global__ void __launch_bounds__(SAMPLE_RADIX_THREADS) sample_radix_w(RADIX_ARGS) {
    sharpinf_pdl_enter();
    __shared__ RadixSmem sm;
    const RadixRow r = radix_row(vocab, params, top_k, scratch, acc, acc_stride, mask_idx, masks, words);
    if (!radix_samples(r)) return;  // uniform over the block
    const float zmax = r.z[radix_greedy(r)];
    sample_u64 s = 0ull;
    float zv[RADIX_PER], wv[RADIX_PER];
    radix_fetch(r.z, r, zv);
#pragma unroll
    for (int k = 0; k < RADIX_PER; ++k) {
        const int i = radix_id(r, k);
        wv[k] = 0.0f;
        if (i >= r.hi) continue;
        wv[k] = sample_weight(zv[k], zmax, r.temperature);
        r.w[i] = wv[k];
        s += sample_q(wv[k]);
    }
    s = radix_block_sum<sample_u64>(s, sm.red_q);
    if (threadIdx.x == 0) atomicAdd(reinterpret_cast<sample_u64*>(r.acc + ACC_Q), s);
    if (r.topk_on || r.topp_on) {
        __syncthreads();  // radix_block_sum's shared memory, before the histogram's
        RadixCut none;
        none.key_k = none.key_p = 0u;
        radix_histogram(r, 0, none, sm, zv, wv);  // the values this thread holds
    }
}

extern "C" __global__ void __launch_bounds__(SAMPLE_RADIX_THREADS) sample_radix_pass(RADIX_ARGS, int pass) {
    sharpinf_pdl_enter();
    __shared__ RadixSmem sm;
    const RadixRow r = radix_row(vocab, params, top_k, scratch, acc, acc_stride, mask_idx, masks, words);
    if (!(r.topk_on || r.topp_on) || !radix_samples(r)) return;
    float zv[RADIX_PER], wv[RADIX_PER];
    radix_fetch(r.z, r, zv);  // in flight while radix_cut scans the histograms
    if (r.topp_on) radix_fetch(r.w, r, wv);
    const RadixCut c = radix_cut(r, pass, sm);
    radix_histogram(r, pass, c, sm, zv, wv);
}

// The kept mass of the segment's ids above the cut (min-p applied) and its ties at the cut.
extern "C" __global__ void __launch_bounds__(SAMPLE_RADIX_THREADS) sample_radix_keep(RADIX_ARGS) {
    sharpinf_pdl_enter();
    __shared__ RadixSmem sm;
    const RadixRow r = radix_row(vocab, params, top_k, scratch, acc, acc_stride, mask_idx, masks, words);
    if (!radix_samples(r)) return;
    float zv[RADIX_PER], wv[RADIX_PER];
    radix_fetch(r.z, r, zv);  // in flight while radix_final_cut scans the histograms
    radix_fetch(r.w, r, wv);
    unsigned cut_key;
    int cut_n;
    radix_final_cut(r, sm, &cut_key, &cut_n);
    sample_u64 kept = 0ull;
    int ties = 0;
#pragma unroll
    for (int k = 0; k < RADIX_PER; ++k) {
        if (radix_id(r, k) >= r.hi) break;
        const unsigned key = sample_key(zv[k]);
        if (key == cut_key && cut_n != 0x7fffffff) ++ties;
        else if (key > cut_key && !(r.min_p > 0.0f && !(wv[k] >= r.min_p))) kept += sample_q(wv[k]);
    }
    kept = radix_block_sum<sample_u64>(kept, sm.red_q);
    ties = radix_block_sum<int>(ties, sm.red_i);
    if (threadIdx.x == 0) {
        reinterpret_cast<sample_u64*>(r.acc + ACC_SEG)[r.seg] = kept;
        r.acc[ACC_SEG + 2 * r.nseg + r.seg] = (unsigned)ties;
    }
}

// The inverse of sample_key (for a key of a finite or infinite value).
__device__ __forceinline__ float sample_unkey(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

extern "C" __global__ void __launch_bounds__(SAMPLE_RADIX_THREADS) sample_radix_pick(RADIX_ARGS) {
    sharpinf_pdl_enter();
    __shared__ RadixSmem sm;
    __shared__ sample_u64 seg_q[64];
    __shared__ sample_u64 pick_before;  // kept mass before the crossing segment
    __shared__ int pick_seg, pick_ties_before;
    const RadixRow r = radix_row(vocab, params, top_k, scratch, acc, acc_stride, mask_idx, masks, words);
    const int t = threadIdx.x, slot = slots[r.row];
    if (vocab <= 0 || (r.mask && r.acc[ACC_ALLOWED] == 0u)) {
        if (t == 0) out[r.row] = -1;
        return;
    }
    const int greedy = radix_greedy(r);
    if (!radix_samples(r)) {
        if (t == 0) sample_emit(out, r.row, greedy, seen_bits, words, counts, cwords, slot, vocab);
        return;
    }
    unsigned cut_key;
    int cut_n;
    radix_final_cut(r, sm, &cut_key, &cut_n);
    // a tie's fixed-point weight (all ties share z), 0 if min-p drops them
    sample_u64 tq = 0ull;
    if (cut_n != 0x7fffffff) {
        const float wt = sample_weight(sample_unkey(cut_key), r.z[greedy], r.temperature);
        tq = (r.min_p > 0.0f && !(wt >= r.min_p)) ? 0ull : sample_q(wt);
    }
    // Segments in id order, 64 at a time: kept mass = above-cut mass + the ties that rank < cut_n.
    const sample_u64* seg_kept = reinterpret_cast<const sample_u64*>(r.acc + ACC_SEG);
    const unsigned* seg_ties = r.acc + ACC_SEG + 2 * r.nseg;
    sample_u64 running = 0ull;
    int ties_run = 0;
    // pass 1: the total K (ties kept: min(cut_n, all ties))
    int all_ties = 0;
    sample_u64 above_all = 0ull;
    for (int s = t; s < r.nseg; s += blockDim.x) {
        above_all += seg_kept[s];
        all_ties += (int)seg_ties[s];
    }
    above_all = radix_block_sum<sample_u64>(above_all, sm.red_q);
    all_ties = radix_block_sum<int>(all_ties, sm.red_i);
    const sample_u64 K = above_all + (sample_u64)min(all_ties, cut_n) * tq;
    if (K == 0ull) {  // nothing kept (min_p > 1): greedy
        if (t == 0) sample_emit(out, r.row, greedy, seen_bits, words, counts, cwords, slot, vocab);
        return;
    }
    const sample_u64 target = sample_pick_target(sample_u24(seeds[r.row], steps[r.row]), K);
    // pass 2: the crossing segment (thread 0 walks the segments' sums, loaded by the block)
    if (t == 0) pick_seg = -1;
    for (int base = 0; base < r.nseg; base += 64) {
        const int n = min(64, r.nseg - base);
        __syncthreads();
        if (t < n) seg_q[t] = seg_kept[base + t];
        __syncthreads();
        if (t == 0 && pick_seg < 0) {
            for (int j = 0; j < n; ++j) {
                const int st = (int)seg_ties[base + j];
                const int kt = max(0, min(st, cut_n - ties_run));
                const sample_u64 m = seg_q[j] + (sample_u64)kt * tq;
                if (running + m > target) {
                    pick_seg = base + j;
                    pick_before = running;
                    pick_ties_before = ties_run;
                    break;
                }
                running += m;
                ties_run += st;
            }
        }
    }
    __syncthreads();
    // pass 3: the crossing id inside that segment, in id order (16 contiguous ids a thread)
    const int lo = pick_seg * SAMPLE_SEG, hi = min(vocab, lo + SAMPLE_SEG);
    const int a = min(hi, lo + t * RADIX_PER), b = min(hi, a + RADIX_PER);
    float zp[RADIX_PER], wp[RADIX_PER];  // the thread's ids a .. b - 1, loaded once for the three walks
#pragma unroll
    for (int k = 0; k < RADIX_PER; ++k) {
        zp[k] = a + k < b ? r.z[a + k] : 0.0f;
        wp[k] = a + k < b ? r.w[a + k] : 0.0f;
    }
    int my_ties = 0;
#pragma unroll
    for (int k = 0; k < RADIX_PER; ++k)
        if (a + k < b) my_ties += sample_key(zp[k]) == cut_key && cut_n != 0x7fffffff ? 1 : 0;
    int ties_all;
    int rank = pick_ties_before + block_exclusive_sum<int>(my_ties, sm.red_i, &ties_all);
    const int rank0 = rank;
    sample_u64 mine = 0ull;
#pragma unroll
    for (int k = 0; k < RADIX_PER; ++k) {
        if (a + k >= b) break;
        const unsigned key = sample_key(zp[k]);
        bool keep = key > cut_key || (key == cut_key && rank++ < cut_n);
        if (r.min_p > 0.0f && !(wp[k] >= r.min_p)) keep = false;
        if (keep) mine += sample_q(wp[k]);
    }
    sample_u64 seg_total;
    const sample_u64 before = pick_before + block_exclusive_sum<sample_u64>(mine, sm.red_q, &seg_total);
    if (before <= target && target < before + mine) {
        sample_u64 c = before;
        rank = rank0;
        for (int k = 0; k < RADIX_PER; ++k) {
            if (a + k >= b) break;
            const unsigned key = sample_key(zp[k]);
            bool keep = key > cut_key || (key == cut_key && rank++ < cut_n);
            if (r.min_p > 0.0f && !(wp[k] >= r.min_p)) keep = false;
            if (!keep) continue;
            c += sample_q(wp[k]);
            if (c > target) {
                sample_emit(out, r.row, a + k, seen_bits, words, counts, cwords, slot, vocab);
                break;
            }
        }
    }
}
