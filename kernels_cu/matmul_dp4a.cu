// matmul_dp4a.cu -- variant of matmul.cu: Y = X W^T with X in q8_1 and integer dot products.
//
//   matmul_dp4a_<type>(W, Xq, Xd, Xs, bias, Y, n_tokens, n_out, n_in, has_bias, accumulate, y_stride)
//     W      raw GGUF rows, as matmul.cu (<type>: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k)
//     Xq/Xd/Xs  the activations in q8_1 (sharpinf/ops/quant_act.py): int8 [n_tokens, n_in],
//            float scale and int sum [n_tokens, n_in / 32]
//     Y      float rows of y_stride floats: Y[t][r] = sum (+ bias[r]) (+ Y[t][r] when accumulate:
//            the residual add x += o W^T fused, in the order x + (...) as elementwise.cu's add)
//   n_in a multiple of 32 (256 for the K-quants).
//
// What it changes against matmul.cu (the readable baseline):
//   * activations are q8_1, quantized once per step (rmsnorm_q8_1.cu), not float: 4x fewer
//     activation bytes and integer arithmetic;
//   * each 32-value chunk of a weight row is unpacked into 8 words of 4 int8 and dotted with the
//     activation block by __dp4a (int32, exact): per type, sum_j w_j x_j becomes
//       legacy types   (d_w d_x) * idot  [- off * s_x]  [+ (m_w d_x) * s_x]
//       K-quants       (d sc d_x) * idot - (dmin m d_x) * s_x   (Q6_K: two 16-value halves)
//     so the only float operations per chunk are those few products and one add;
//   * weights read in 32-bit words (16-bit halves where GGUF blocks are only 2-byte aligned:
//     q8_0, q4_0, q5_0, q6_k), 128-bit loads for the K-quants' 16-aligned quants and for X;
//   * all lanes busy at every n_in: a row is split over G = min(32, 2^floor(log2(n_in/32)))
//     lanes, so a warp takes 32/G rows (n_in = 576: 16 lanes a row, 2 rows a warp);
//   * fused epilogue: bias and the residual add.
// Reduction order (batch invariance): lane g of a row group takes chunks g, g+G, ... in order
// and adds one float per chunk; the G lanes combine by an xor butterfly. Both depend on n_in
// only, so a token's output is bit-identical alone or in any tile, any grid.
// Launch: block 128 threads (4 warps); grid = (ceil(n_out / (4 * 32 / G)) capped, ceil(n_tokens / 8)).
// Bound: memory -- weights are read once per 8-token tile; at N = 1 the step streams every weight
// byte once, so the target is the device's read bandwidth.
#include "ggml_blocks.cuh"

#define DP_TILE 8   // tokens per tile (grid.y)
#define DP_WARPS 4  // warps per block

// --- loads ---------------------------------------------------------------------------------------
// A 32-bit word at a 2-byte aligned address (GGUF blocks of 18, 22, 34 and 210 bytes).
__device__ __forceinline__ int dp_word_a2(const unsigned char* p) {
#ifdef SHARPINF_EMU
    int v;
    __builtin_memcpy(&v, p, 4);
    return v;
#else
    const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
    return (int)((unsigned)h[0] | ((unsigned)h[1] << 16));
#endif
}

// A 32-bit word at a 4-byte aligned address.
__device__ __forceinline__ int dp_word_a4(const unsigned char* p) {
#ifdef SHARPINF_EMU
    return dp_word_a2(p);
#else
    return *reinterpret_cast<const int*>(p);
#endif
}

// 8 words (32 bytes) at a 16-byte aligned address: two 128-bit loads.
__device__ __forceinline__ void dp_words8_a16(const void* p, int (&w)[8]) {
#ifdef SHARPINF_EMU
    __builtin_memcpy(w, p, 32);
#else
    const int4 a = reinterpret_cast<const int4*>(p)[0], b = reinterpret_cast<const int4*>(p)[1];
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
    w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
#endif
}

// --- the activation block of one token ---------------------------------------------------------
struct DpX {
    int q[8];  // 32 int8, value j in byte j % 4 of word j / 4
    float d;   // scale
    int s;     // sum of the 32 q
};

__device__ __forceinline__ void dp_load_x(const signed char* xq, const float* xd, const int* xs, long long t, int c,
                                          int n_in, DpX& x) {
    dp_words8_a16(xq + t * n_in + 32LL * c, x.q);
    x.d = xd[t * (n_in / 32) + c];
    x.s = xs[t * (n_in / 32) + c];
}

__device__ __forceinline__ int dp_dot8(const int (&w)[8], const int (&x)[8], int from = 0, int to = 8) {
    int acc = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k)
        if (k >= from && k < to) acc = __dp4a(w[k], x[k], acc);
    return acc;
}

// bits 0..3 of b -> bit 4 of bytes 0..3 (the 5th bit of four 5-bit quants)
__device__ __forceinline__ int dp_spread4(unsigned b) {
    return (int)(((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25));
}

// --- one 32-value chunk of a weight row, per type: load once, dot with each token's block ------
template <int QT> struct DpChunk;

// Float weights: the activation values are d * q; a float dot in value order.
template <int QT> struct DpFloatChunk {
    float w[32];
    __device__ __forceinline__ void load(const unsigned char* row, int c) { gb_decode_chunk<QT>(row, c, w); }
    __device__ __forceinline__ float dot(const DpX& x) const {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < 32; ++j) acc = gb_fma(w[j], (float)(signed char)(x.q[j >> 2] >> (8 * (j & 3))), acc);
        return acc * x.d;
    }
};
template <> struct DpChunk<GB_F32> : DpFloatChunk<GB_F32> {};
template <> struct DpChunk<GB_F16> : DpFloatChunk<GB_F16> {};
template <> struct DpChunk<GB_BF16> : DpFloatChunk<GB_BF16> {};

// Q8_0 (34 bytes): [d][32 x int8]                                   (d d_x) * idot
template <> struct DpChunk<GB_Q8_0> {
    int w[8];
    float d;
    __device__ __forceinline__ void load(const unsigned char* row, int c) {
        const unsigned char* b = row + 34LL * c;
        d = gb_f16_at(b);
#pragma unroll
        for (int k = 0; k < 8; ++k) w[k] = dp_word_a2(b + 2 + 4 * k);
    }
    __device__ __forceinline__ float dot(const DpX& x) const { return (d * x.d) * (float)dp_dot8(w, x.q); }
};

// Q4_0 (18 bytes): [d][16 bytes: value j low nibble of byte j, value j+16 high]   (d d_x) (idot - 8 s_x)
template <> struct DpChunk<GB_Q4_0> {
    int w[8];
    float d;
    __device__ __forceinline__ void load(const unsigned char* row, int c) {
        const unsigned char* b = row + 18LL * c;
        d = gb_f16_at(b);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int raw = dp_word_a2(b + 2 + 4 * k);
            w[k] = raw & 0x0F0F0F0F;
            w[k + 4] = (raw >> 4) & 0x0F0F0F0F;
        }
    }
    __device__ __forceinline__ float dot(const DpX& x) const { return (d * x.d) * (float)(dp_dot8(w, x.q) - 8 * x.s); }
};

// Q4_1 (20 bytes): [d][m][16 bytes]                        (d d_x) idot + (m d_x) s_x
template <> struct DpChunk<GB_Q4_1> {
    int w[8];
    float d, m;
    __device__ __forceinline__ void load(const unsigned char* row, int c) {
        const unsigned char* b = row + 20LL * c;
        d = gb_f16_at(b);
        m = gb_f16_at(b + 2);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int raw = dp_word_a4(b + 4 + 4 * k);
            w[k] = raw & 0x0F0F0F0F;
            w[k + 4] = (raw >> 4) & 0x0F0F0F0F;
        }
    }
    __device__ __forceinline__ float dot(const DpX& x) const {
        return gb_fma(d * x.d, (float)dp_dot8(w, x.q), (m * x.d) * (float)x.s);
    }
};

// Q5_0 (22 bytes): [d][qh: bit j = 5th bit of value j][16 bytes]   (d d_x) (idot - 16 s_x)
template <> struct DpChunk<GB_Q5_0> {
    int w[8];
    float d;
    __device__ __forceinline__ void load(const unsigned char* row, int c) {
        const unsigned char* b = row + 22LL * c;
        d = gb_f16_at(b);
        const unsigned qh = (unsigned)dp_word_a2(b + 2);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int raw = dp_word_a2(b + 6 + 4 * k);
            w[k] = (raw & 0x0F0F0F0F) | dp_spread4(qh >> (4 * k));
            w[k + 4] = ((raw >> 4) & 0x0F0F0F0F) | dp_spread4(qh >> (16 + 4 * k));
        }
    }
    __device__ __forceinline__ float dot(const DpX& x) const { return (d * x.d) * (float)(dp_dot8(w, x.q) - 16 * x.s); }
};

// Q5_1 (24 bytes): [d][m][qh][16 bytes]                     (d d_x) idot + (m d_x) s_x
template <> struct DpChunk<GB_Q5_1> {
    int w[8];
    float d, m;
    __device__ __forceinline__ void load(const unsigned char* row, int c) {
        const unsigned char* b = row + 24LL * c;
        d = gb_f16_at(b);
        m = gb_f16_at(b + 2);
        const unsigned qh = (unsigned)dp_word_a4(b + 4);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int raw = dp_word_a4(b + 8 + 4 * k);
            w[k] = (raw & 0x0F0F0F0F) | dp_spread4(qh >> (4 * k));
            w[k + 4] = ((raw >> 4) & 0x0F0F0F0F) | dp_spread4(qh >> (16 + 4 * k));
        }
    }
    __device__ __forceinline__ float dot(const DpX& x) const {
        return gb_fma(d * x.d, (float)dp_dot8(w, x.q), (m * x.d) * (float)x.s);
    }
};

// Q4_K (144 bytes) sub-block s: w = (d sc) q - (dmin m)    (d sc d_x) idot - (dmin m d_x) s_x
template <> struct DpChunk<GB_Q4_K> {
    int w[8];
    float dl, ml;
    __device__ __forceinline__ void load(const unsigned char* row, int c) {
        const unsigned char* b = row + 144LL * (c >> 3);
        const int s = c & 7;
        int sc, m;
        gb_k_scale_min(b + 4, s, sc, m);
        dl = gb_f16_at(b) * (float)sc;
        ml = gb_f16_at(b + 2) * (float)m;
        dp_words8_a16(b + 16 + 32 * (s >> 1), w);
        const int shift = 4 * (s & 1);
#pragma unroll
        for (int k = 0; k < 8; ++k) w[k] = (w[k] >> shift) & 0x0F0F0F0F;
    }
    __device__ __forceinline__ float dot(const DpX& x) const {
        return gb_fma(dl * x.d, (float)dp_dot8(w, x.q), -((ml * x.d) * (float)x.s));
    }
};

// Q5_K (176 bytes): as Q4_K, 5th bit s of qh[l]
template <> struct DpChunk<GB_Q5_K> {
    int w[8];
    float dl, ml;
    __device__ __forceinline__ void load(const unsigned char* row, int c) {
        const unsigned char* b = row + 176LL * (c >> 3);
        const int s = c & 7;
        int sc, m;
        gb_k_scale_min(b + 4, s, sc, m);
        dl = gb_f16_at(b) * (float)sc;
        ml = gb_f16_at(b + 2) * (float)m;
        int hi[8];
        dp_words8_a16(b + 16, hi);
        dp_words8_a16(b + 48 + 32 * (s >> 1), w);
        const int shift = 4 * (s & 1);
#pragma unroll
        for (int k = 0; k < 8; ++k) w[k] = ((w[k] >> shift) & 0x0F0F0F0F) | (((hi[k] >> s) & 0x01010101) << 4);
    }
    __device__ __forceinline__ float dot(const DpX& x) const {
        return gb_fma(dl * x.d, (float)dp_dot8(w, x.q), -((ml * x.d) * (float)x.s));
    }
};

// Q6_K (210 bytes), chunk s = 4h + k: q6 = low nibble (ql) | 2 high bits (qh), value q6 - 32,
// scales[2s] for values l < 16 and scales[2s+1] for l >= 16:
//   (d d_x) (sc0 (idot0 - 32 s0) + sc1 (idot1 - 32 s1)),  s0/s1 the halves' sums of x
template <> struct DpChunk<GB_Q6_K> {
    int w[8];
    float d;
    int sc0, sc1;
    __device__ __forceinline__ void load(const unsigned char* row, int c) {
        const unsigned char* b = row + 210LL * (c >> 3);
        const int s = c & 7, h = s >> 2, k = s & 3;
        d = gb_f16_at(b + 208);
        sc0 = (signed char)b[192 + 2 * s];
        sc1 = (signed char)b[192 + 2 * s + 1];
        const unsigned char* ql = b + 64 * h + 32 * (k & 1);
        const unsigned char* qh = b + 128 + 32 * h;
        const int lshift = 4 * (k >> 1), hshift = 2 * k;
#pragma unroll
        for (int i = 0; i < 8; ++i)
            w[i] = ((dp_word_a2(ql + 4 * i) >> lshift) & 0x0F0F0F0F) | (((dp_word_a2(qh + 4 * i) >> hshift) & 0x03030303) << 4);
    }
    __device__ __forceinline__ float dot(const DpX& x) const {
        const int ones[8] = {0x01010101, 0x01010101, 0x01010101, 0x01010101, 0, 0, 0, 0};
        const int s0 = dp_dot8(ones, x.q), s1 = x.s - s0;
        const int i0 = dp_dot8(w, x.q, 0, 4) - 32 * s0, i1 = dp_dot8(w, x.q, 4, 8) - 32 * s1;
        return (d * x.d) * (float)(sc0 * i0 + sc1 * i1);
    }
};

// --- the kernel ------------------------------------------------------------------------------------
__device__ __forceinline__ int dp_group_lanes(int n_chunks) {
    int g = 1;
    while (g < 32 && 2 * g <= n_chunks) g *= 2;
    return g;
}

template <int QT>
__device__ __forceinline__ void matmul_dp4a_rows(const unsigned char* __restrict__ W, const signed char* __restrict__ xq,
                                                 const float* __restrict__ xd, const int* __restrict__ xs,
                                                 const float* __restrict__ bias, float* Y, int n_tokens, int n_out,
                                                 int n_in, int has_bias, int accumulate, long long y_stride) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_chunks = n_in / 32;
    const int G = dp_group_lanes(n_chunks), g = lane % G, rows_per_warp = 32 / G;
    const int t0 = blockIdx.y * DP_TILE;
    const int nt = n_tokens - t0 < DP_TILE ? n_tokens - t0 : DP_TILE;
    const long long row_bytes = gb_row_bytes<QT>(n_in);
    const int rows_per_pass = gridDim.x * DP_WARPS * rows_per_warp;
    // Every lane runs every pass (the butterfly needs the whole warp); rows past n_out are skipped.
    for (int base = (blockIdx.x * DP_WARPS + warp) * rows_per_warp; base < n_out; base += rows_per_pass) {
        const int row = base + lane / G;
        const bool live = row < n_out;
        float acc[DP_TILE];
#pragma unroll
        for (int t = 0; t < DP_TILE; ++t) acc[t] = 0.0f;
        if (live) {
            const unsigned char* wrow = W + (long long)row * row_bytes;
            for (int c = g; c < n_chunks; c += G) {
                DpChunk<QT> ch;
                ch.load(wrow, c);
#pragma unroll
                for (int t = 0; t < DP_TILE; ++t) {
                    if (t < nt) {
                        DpX x;
                        dp_load_x(xq, xd, xs, t0 + t, c, n_in, x);
                        acc[t] = acc[t] + ch.dot(x);
                    }
                }
            }
        }
        // the G lanes of a row combine: xor butterfly, the same for every row and token
#pragma unroll
        for (int t = 0; t < DP_TILE; ++t)
            for (int off = G / 2; off > 0; off >>= 1) acc[t] = acc[t] + __shfl_xor_sync(SHARPINF_FULL_MASK, acc[t], off);
        if (live) {
            for (int t = g; t < nt; t += G) {
                float v = acc[0];
#pragma unroll
                for (int u = 1; u < DP_TILE; ++u)
                    if (u == t) v = acc[u];
                if (has_bias) v = v + bias[row];
                float* y = Y + (long long)(t0 + t) * y_stride + row;
                *y = accumulate ? *y + v : v;
            }
        }
    }
}

#define DP_ARGS                                                                                                  \
    const unsigned char *W, const signed char *xq, const float *xd, const int *xs, const float *bias, float *Y, \
        int n_tokens, int n_out, int n_in, int has_bias, int accumulate, int y_stride
#define DP_PASS W, xq, xd, xs, bias, Y, n_tokens, n_out, n_in, has_bias, accumulate, (long long)y_stride

// The entry points, one per type (written out: the emulator reads these signatures), each compiled
// only when wanted (SHARPINF_WANT, common.cuh).
#if SHARPINF_WANT(matmul_dp4a_f32)
extern "C" __global__ void matmul_dp4a_f32(DP_ARGS) { matmul_dp4a_rows<GB_F32>(DP_PASS); }
#endif
#if SHARPINF_WANT(matmul_dp4a_f16)
extern "C" __global__ void matmul_dp4a_f16(DP_ARGS) { matmul_dp4a_rows<GB_F16>(DP_PASS); }
#endif
#if SHARPINF_WANT(matmul_dp4a_bf16)
extern "C" __global__ void matmul_dp4a_bf16(DP_ARGS) { matmul_dp4a_rows<GB_BF16>(DP_PASS); }
#endif
#if SHARPINF_WANT(matmul_dp4a_q8_0)
extern "C" __global__ void matmul_dp4a_q8_0(DP_ARGS) { matmul_dp4a_rows<GB_Q8_0>(DP_PASS); }
#endif
#if SHARPINF_WANT(matmul_dp4a_q4_0)
extern "C" __global__ void matmul_dp4a_q4_0(DP_ARGS) { matmul_dp4a_rows<GB_Q4_0>(DP_PASS); }
#endif
#if SHARPINF_WANT(matmul_dp4a_q4_1)
extern "C" __global__ void matmul_dp4a_q4_1(DP_ARGS) { matmul_dp4a_rows<GB_Q4_1>(DP_PASS); }
#endif
#if SHARPINF_WANT(matmul_dp4a_q5_0)
extern "C" __global__ void matmul_dp4a_q5_0(DP_ARGS) { matmul_dp4a_rows<GB_Q5_0>(DP_PASS); }
#endif
#if SHARPINF_WANT(matmul_dp4a_q5_1)
extern "C" __global__ void matmul_dp4a_q5_1(DP_ARGS) { matmul_dp4a_rows<GB_Q5_1>(DP_PASS); }
#endif
#if SHARPINF_WANT(matmul_dp4a_q4_k)
extern "C" __global__ void matmul_dp4a_q4_k(DP_ARGS) { matmul_dp4a_rows<GB_Q4_K>(DP_PASS); }
#endif
#if SHARPINF_WANT(matmul_dp4a_q5_k)
extern "C" __global__ void matmul_dp4a_q5_k(DP_ARGS) { matmul_dp4a_rows<GB_Q5_K>(DP_PASS); }
#endif
#if SHARPINF_WANT(matmul_dp4a_q6_k)
extern "C" __global__ void matmul_dp4a_q6_k(DP_ARGS) { matmul_dp4a_rows<GB_Q6_K>(DP_PASS); }
#endif
