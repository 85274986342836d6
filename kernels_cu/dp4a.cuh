// dp4a.cuh -- what every q8_1 matmul kernel shares (the dp4a, gemv, mma and mmq families, the fused
// and MoE kernels):
//   DpX / DpXF / dp_load_x    a token's q8_1 activation block and its factors
//   DpChunk<QT>               per GGML type, a 32-value weight chunk as 8 words of 4 int8 for __dp4a
//                             (fetch / unpack / load) and its float terms (acc_idot, acc_dot)
//   dp_store, dp_old          the epilogue (bias, residual add, or the gated activation)
//   dp_fold, dp_combine       the canonical order of a row's member sums (DP_GROUP)
//   dp4a_rows<QT, NMAT, GC>   the dp4a row loop (matmul_dp4a.cu, gate_up_dp4a.cu, the fused kernels)
// Algorithm, launch and bound: matmul_dp4a.cu's header. The canonical order: below, at dp_fold.
#pragma once
#include "ggml_blocks.cuh"

#define DP_TILE 8   // tokens per tile (grid.y)
#define DP_WARPS 4  // warps per block
#ifndef DP_UNROLL      // weight chunks a lane loads before it dots them (half for the gate/up pair);
#define DP_UNROLL 1    // results do not depend on it; more costs registers, so fewer warps resident
#endif

// --- loads (SHARPINF_ASSERT_ALIGNED: common.cuh) ----------------------------------------------
// A 32-bit word at a 2-byte aligned address (GGUF blocks of 18, 22, 34 and 210 bytes).
__device__ __forceinline__ int dp_word_a2(const unsigned char* p) {
#ifdef SHARPINF_EMU
    SHARPINF_ASSERT_ALIGNED(p, 2);
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
    SHARPINF_ASSERT_ALIGNED(p, 4);
    return dp_word_a2(p);
#else
    return *reinterpret_cast<const int*>(p);
#endif
}

// Word i of the words from a 4-byte aligned address (an index, not a byte offset: one 64-bit multiply-add
// an address, where base + 4 i takes a shift, a sign extension and two adds -- gemv_rows.cuh's runs).
__device__ __forceinline__ unsigned dp_word_at(const unsigned char* base, int i) {
#ifdef SHARPINF_EMU
    return (unsigned)dp_word_a4(base + 4LL * i);
#else
    return reinterpret_cast<const unsigned*>(base)[i];
#endif
}

// A 16-bit unit at a 2-byte aligned address, as the load returns it (a chunk's Raw fetch: nothing
// uses it until unpack, so the load stays in flight meanwhile).
__device__ __forceinline__ unsigned dp_u16_a2(const unsigned char* p) {
#ifdef SHARPINF_EMU
    SHARPINF_ASSERT_ALIGNED(p, 2);
    unsigned short v;
    __builtin_memcpy(&v, p, 2);
    return v;
#else
    return *reinterpret_cast<const unsigned short*>(p);
#endif
}

// NB bytes (NB even) at a 2-byte aligned address p, fetched as whole aligned words: a[i] is the word
// at (p & ~3) + 4i, the last one read only as far as the span goes (a 16-bit load where the span
// ends 2 bytes into it). at(o) funnel-shifts the 4 bytes at p + o out of two neighbours. So a span
// of a GGUF block of 18, 22, 34 or 210 bytes takes NB / 4 + 1 loads, not NB / 2 -- and as many
// registers while the loads are in flight (a Raw). A span 2 bytes past a word boundary starts its
// first load 2 bytes before p: inside the same tensor (its start is 4-byte aligned).
template <int NB> struct DpSpanA2 {
    static_assert(NB % 2 == 0 && NB >= 4, "a span of whole 16-bit units");
    static constexpr int W = NB / 4;  // whole words from the aligned base, then the tail
    unsigned a[W + 1];
    unsigned mis;  // 0 or 2: p's distance past a word boundary, in bytes
    __device__ __forceinline__ void fetch(const unsigned char* p) {
        mis = (unsigned)reinterpret_cast<unsigned long long>(p) & 2u;
        const unsigned char* base = p - mis;
#pragma unroll
        for (int i = 0; i < W; ++i) a[i] = (unsigned)dp_word_a4(base + 4 * i);
        // the span ends at base + mis + NB: 2 bytes into a[W], 4, or not at all
        if (NB % 4 == 0) a[W] = mis ? dp_u16_a2(base + 4 * W) : 0u;
        else a[W] = mis ? (unsigned)dp_word_a4(base + 4 * W) : dp_u16_a2(base + 4 * W);
    }
    // the 4 bytes at p + o (o even, o + 4 <= NB + 2; past NB the high bytes are zeros)
    __device__ __forceinline__ unsigned at(int o) const {
        const int i = o / 4;  // compile-time after unrolling: a[i] and a[i + 1] hold them
        return __funnelshift_rc(a[i], a[i + 1], 8 * (mis + (o & 2)));
    }
};

// NB bytes (NB % 4 == 1: MXFP4's 17-byte blocks, at any byte offset) at p, fetched as whole aligned
// words: a[i] the word at (p & ~3) + 4i, the last one read only as far as the span goes (its last
// mis + 1 bytes: never a byte past p + NB, so a tensor's last block reads nothing beyond it). at(o)
// funnel-shifts the 4 bytes at p + o (o % 4 <= 1) out of two neighbours. The first load starts up to
// 3 bytes before p: inside the same tensor (its start is 4-byte aligned).
template <int NB> struct DpSpanA1 {
    static_assert(NB % 4 == 1, "a span whose tail is 1 to 4 bytes past the aligned words");
    static constexpr int W = NB / 4;
    unsigned a[W + 1];
    unsigned mis;  // 0..3: p's distance past a word boundary, in bytes
    __device__ __forceinline__ void fetch(const unsigned char* p) {
        mis = (unsigned)reinterpret_cast<unsigned long long>(p) & 3u;
        const unsigned char* base = p - mis;
#pragma unroll
        for (int i = 0; i < W; ++i) a[i] = (unsigned)dp_word_a4(base + 4 * i);
        const unsigned char* t = base + 4 * W;  // the span's last mis + 1 bytes
        const unsigned lo = mis ? dp_u16_a2(t) : (unsigned)t[0];
        a[W] = mis == 3 ? (unsigned)dp_word_a4(t) : mis == 2 ? lo | ((unsigned)t[2] << 16) : lo;
    }
    __device__ __forceinline__ unsigned at(int o) const {
        const int i = o / 4;  // compile-time after unrolling; mis + o % 4 <= 4 bytes into a[i]
        return __funnelshift_rc(a[i], a[i + 1], 8 * (mis + (o & 3)));
    }
};

// N words (N = 2 or 4) at a 4N-byte aligned address: one 64- or 128-bit load.
template <int N> __device__ __forceinline__ void dp_words_vec(const void* p, unsigned* w) {
    static_assert(N == 2 || N == 4, "one 64- or 128-bit load");
#ifdef SHARPINF_EMU
    SHARPINF_ASSERT_ALIGNED(p, 4 * N);
    __builtin_memcpy(w, p, 4 * N);
#else
    if constexpr (N == 2) {
        const uint2 a = *reinterpret_cast<const uint2*>(p);
        w[0] = a.x; w[1] = a.y;
    } else {
        const uint4 a = *reinterpret_cast<const uint4*>(p);
        w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
    }
#endif
}

// 8 words (32 bytes) at a 16-byte aligned address: two 128-bit loads.
__device__ __forceinline__ void dp_words8_a16(const void* p, int (&w)[8]) {
    dp_words_vec<4>(p, reinterpret_cast<unsigned*>(w));
    dp_words_vec<4>(static_cast<const unsigned char*>(p) + 16, reinterpret_cast<unsigned*>(w) + 4);
}

// (float)v, exactly, for |v| < 2^22, without the int -> float conversion unit (16 results a clock an
// SM on sm_80/sm_90, against 64 integer and 128 float adds): the float 1.5 * 2^23 has a mantissa
// unit of 1, so its bits plus v are 1.5 * 2^23 + v, and subtracting 1.5 * 2^23 leaves v exactly.
// The chunk terms' integers are far inside that range (|idot| <= 32 * 128 * 127 = 520,192, with
// an offset of at most 16 * 32 * 127; |s_x| <= 32 * 127) -- Q6_K's scaled sum is not, and keeps the
// conversion. The same bits as (float)v, so dp4a and the tensor-core kernels agree either way.
// DP_I2F_CVT=1 (a probe, through SHARPINF_NVRTC_OPTIONS): the conversion unit instead -- one I2F, not an
// integer and a float add, for the price of its 16-a-clock pipe (llama.cpp's mmq converts so). Exact
// either way, so the same bits.
#ifndef DP_I2F_CVT
#define DP_I2F_CVT 0
#endif
__device__ __forceinline__ float dp_i2f(int v) {
    return DP_I2F_CVT ? (float)v : __int_as_float(0x4B400000 + v) - 12582912.0f;
}

// --- the activation block of one token ---------------------------------------------------------
struct DpX {
    int q[8];  // 32 int8, value j in byte j % 4 of word j / 4
    float d;   // scale
    int s;     // sum of the 32 q
};

// The activation block's factors as the terms use them: d_x, s_x and d_x s_x (the offset types'
// minimum term: the same for every weight row, so a kernel with many rows makes it once a token).
struct DpXF {
    float d;
    int s;
    float ds;
};
__device__ __forceinline__ DpXF dp_xf(float d, int s) { return DpXF{d, s, d * dp_i2f(s)}; }

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
// Each quantized chunk holds 8 words of 4 int8 (w[k]: values 4k..4k+3) and says how an exact integer
// dot is added to an output's sum: acc_idot(acc, idot, 0, ...) -- or, for Q6_K, (dot of values
// 0..15, dot of 16..31, ..., sum of x's first 16). acc_dot() feeds it dp4a's dot; matmul_mma.cu and
// mmq feed it the tensor cores' -- the same integers into the same float operations, so the kernels
// agree bit for bit. The float operations are explicit fmas, one or two an output (the offset type's
// minimum term its own fma, its x-side factor d_x s_x the same for every row: a compiler computes
// it once a token), so no compiler's contraction choice can tell two kernels apart.
// A quantized chunk loads in two halves: fetch(row, c) issues the loads into a Raw (the block's
// bytes as the load instructions return them, nothing computed on them), unpack(raw, c) turns them
// into the words and scales. load() is the two back to back; matmul_mmq.cu fetches the next chunk
// before its tensor-core work and unpacks it after, so the loads are in flight meanwhile.
template <int QT> struct DpChunk;

// Float weights: the activation values are d * q; a float dot in value order.
template <int QT> struct DpFloatChunk {
    float w[32];
    struct Raw {};  // nothing fetched ahead: a float chunk is loaded where it is dotted (gemv_rows.cuh)
    __device__ __forceinline__ void load(const unsigned char* row, int c) { gb_decode_chunk<QT>(row, c, w); }
    __device__ __forceinline__ float acc_dot(float sum, const DpX& x) const {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < 32; ++j) acc = gb_fma(w[j], (float)(signed char)(x.q[j >> 2] >> (8 * (j & 3))), acc);
        return sum + acc * x.d;
    }
};
template <> struct DpChunk<GB_F32> : DpFloatChunk<GB_F32> {};
template <> struct DpChunk<GB_F16> : DpFloatChunk<GB_F16> {};
template <> struct DpChunk<GB_BF16> : DpFloatChunk<GB_BF16> {};

// Q8_0 (34 bytes): [d][32 x int8]                                   (d d_x) * idot
template <> struct DpChunk<GB_Q8_0> {
    int w[8];
    float d;
    struct Raw {
        DpSpanA2<34> b;  // the block
    };
    __device__ __forceinline__ static Raw fetch(const unsigned char* row, int c) {
        Raw r;
        r.b.fetch(row + 34LL * c);
        return r;
    }
    __device__ __forceinline__ void unpack(const Raw& r, int) {
        d = gb_half_bits(r.b.at(0) & 0xFFFFu);
#pragma unroll
        for (int k = 0; k < 8; ++k) w[k] = (int)r.b.at(2 + 4 * k);
    }
    __device__ __forceinline__ void load(const unsigned char* row, int c) { unpack(fetch(row, c), c); }
    __device__ __forceinline__ float acc_idot(float acc, int idot, int, const DpXF& x, int) const {
        return gb_fma(d * x.d, dp_i2f(idot), acc);
    }
    __device__ __forceinline__ float acc_dot(float acc, const DpX& x) const {
        return acc_idot(acc, dp_dot8(w, x.q), 0, dp_xf(x.d, x.s), 0);
    }
};

// Q4_0 (18 bytes): [d][16 bytes: value j low nibble of byte j, value j+16 high]   (d d_x) (idot - 8 s_x)
template <> struct DpChunk<GB_Q4_0> {
    int w[8];
    float d;
    struct Raw {
        DpSpanA2<18> b;
    };
    __device__ __forceinline__ static Raw fetch(const unsigned char* row, int c) {
        Raw r;
        r.b.fetch(row + 18LL * c);
        return r;
    }
    __device__ __forceinline__ void unpack(const Raw& r, int) {
        d = gb_half_bits(r.b.at(0) & 0xFFFFu);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int raw = (int)r.b.at(2 + 4 * k);
            w[k] = raw & 0x0F0F0F0F;
            w[k + 4] = (raw >> 4) & 0x0F0F0F0F;
        }
    }
    __device__ __forceinline__ void load(const unsigned char* row, int c) { unpack(fetch(row, c), c); }
    __device__ __forceinline__ float acc_idot(float acc, int idot, int, const DpXF& x, int) const {
        return gb_fma(d * x.d, dp_i2f(idot - 8 * x.s), acc);
    }
    __device__ __forceinline__ float acc_dot(float acc, const DpX& x) const {
        return acc_idot(acc, dp_dot8(w, x.q), 0, dp_xf(x.d, x.s), 0);
    }
};

// Q4_1 (20 bytes): [d][m][16 bytes]           acc + (d d_x) idot, then + m (d_x s_x): two fmas
template <> struct DpChunk<GB_Q4_1> {
    int w[8];
    float d, m;
    struct Raw {
        unsigned u[5];  // the block's words: d | m << 16, then the quants
    };
    __device__ __forceinline__ static Raw fetch(const unsigned char* row, int c) {
        const unsigned char* b = row + 20LL * c;
        Raw r;
#pragma unroll
        for (int i = 0; i < 5; ++i) r.u[i] = (unsigned)dp_word_a4(b + 4 * i);
        return r;
    }
    __device__ __forceinline__ void unpack(const Raw& r, int) {
        d = gb_half_bits(r.u[0] & 0xFFFFu);
        m = gb_half_bits(r.u[0] >> 16);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int raw = (int)r.u[1 + k];
            w[k] = raw & 0x0F0F0F0F;
            w[k + 4] = (raw >> 4) & 0x0F0F0F0F;
        }
    }
    __device__ __forceinline__ void load(const unsigned char* row, int c) { unpack(fetch(row, c), c); }
    __device__ __forceinline__ float acc_idot(float acc, int idot, int, const DpXF& x, int) const {
        return gb_fma(m, x.ds, gb_fma(d * x.d, dp_i2f(idot), acc));
    }
    __device__ __forceinline__ float acc_dot(float acc, const DpX& x) const {
        return acc_idot(acc, dp_dot8(w, x.q), 0, dp_xf(x.d, x.s), 0);
    }
};

// Q5_0 (22 bytes): [d][qh: bit j = 5th bit of value j][16 bytes]   (d d_x) (idot - 16 s_x)
template <> struct DpChunk<GB_Q5_0> {
    int w[8];
    float d;
    struct Raw {
        DpSpanA2<22> b;  // d, qh, the 16 bytes of nibbles
    };
    __device__ __forceinline__ static Raw fetch(const unsigned char* row, int c) {
        Raw r;
        r.b.fetch(row + 22LL * c);
        return r;
    }
    __device__ __forceinline__ void unpack(const Raw& r, int) {
        d = gb_half_bits(r.b.at(0) & 0xFFFFu);
        const unsigned qh = r.b.at(2);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int raw = (int)r.b.at(6 + 4 * k);
            w[k] = (raw & 0x0F0F0F0F) | dp_spread4(qh >> (4 * k));
            w[k + 4] = ((raw >> 4) & 0x0F0F0F0F) | dp_spread4(qh >> (16 + 4 * k));
        }
    }
    __device__ __forceinline__ void load(const unsigned char* row, int c) { unpack(fetch(row, c), c); }
    __device__ __forceinline__ float acc_idot(float acc, int idot, int, const DpXF& x, int) const {
        return gb_fma(d * x.d, dp_i2f(idot - 16 * x.s), acc);
    }
    __device__ __forceinline__ float acc_dot(float acc, const DpX& x) const {
        return acc_idot(acc, dp_dot8(w, x.q), 0, dp_xf(x.d, x.s), 0);
    }
};

// Q5_1 (24 bytes): [d][m][qh][16 bytes]       acc + (d d_x) idot, then + m (d_x s_x): two fmas
template <> struct DpChunk<GB_Q5_1> {
    int w[8];
    float d, m;
    struct Raw {
        unsigned u[6];  // d | m << 16, qh, the quants
    };
    __device__ __forceinline__ static Raw fetch(const unsigned char* row, int c) {
        const unsigned char* b = row + 24LL * c;  // 8-byte aligned: 24-byte blocks keep a row's alignment
        Raw r;
#pragma unroll
        for (int i = 0; i < 3; ++i) dp_words_vec<2>(b + 8 * i, r.u + 2 * i);
        return r;
    }
    __device__ __forceinline__ void unpack(const Raw& r, int) {
        d = gb_half_bits(r.u[0] & 0xFFFFu);
        m = gb_half_bits(r.u[0] >> 16);
        const unsigned qh = r.u[1];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int raw = (int)r.u[2 + k];
            w[k] = (raw & 0x0F0F0F0F) | dp_spread4(qh >> (4 * k));
            w[k + 4] = ((raw >> 4) & 0x0F0F0F0F) | dp_spread4(qh >> (16 + 4 * k));
        }
    }
    __device__ __forceinline__ void load(const unsigned char* row, int c) { unpack(fetch(row, c), c); }
    __device__ __forceinline__ float acc_idot(float acc, int idot, int, const DpXF& x, int) const {
        return gb_fma(m, x.ds, gb_fma(d * x.d, dp_i2f(idot), acc));
    }
    __device__ __forceinline__ float acc_dot(float acc, const DpX& x) const {
        return acc_idot(acc, dp_dot8(w, x.q), 0, dp_xf(x.d, x.s), 0);
    }
};

// The K-quants' header as fetched (one 128-bit load: Q4_K and Q5_K blocks, 144 and 176 bytes, keep
// a row's 16-byte alignment): d | dmin << 16, then the 12 scale bytes in 3 words.
struct DpKHead {
    unsigned dm, k[3];
    __device__ __forceinline__ void fetch(const unsigned char* b) {
        unsigned w[4];
        dp_words_vec<4>(b, w);
        dm = w[0];
#pragma unroll
        for (int i = 0; i < 3; ++i) k[i] = w[1 + i];
    }
    // scale byte i (0..11), selected without indexing a register array at run time
    __device__ __forceinline__ int byte(int i) const {
        const unsigned word = i < 4 ? k[0] : i < 8 ? k[1] : k[2];
        return (int)((word >> (8 * (i & 3))) & 0xFFu);
    }
    // (d sc, dmin m) of sub-block s: gb_k_scale_min's integers, gb_decode_q4_k's products
    __device__ __forceinline__ void scales(int s, float& dl, float& ml) const {
        int sc, m;
        if (s < 4) {
            sc = byte(s) & 63;
            m = byte(s + 4) & 63;
        } else {
            sc = (byte(s + 4) & 15) | ((byte(s - 4) >> 6) << 4);
            m = (byte(s + 4) >> 4) | ((byte(s) >> 6) << 4);
        }
        dl = gb_half_bits(dm & 0xFFFFu) * (float)sc;
        ml = gb_half_bits(dm >> 16) * (float)m;
    }
};

// Q4_K (144 bytes) sub-block s: w = (d sc) q - (dmin m)   acc + (d sc d_x) idot, then - (dmin m) (d_x s_x)
template <> struct DpChunk<GB_Q4_K> {
    int w[8];
    float dl, ml;
    struct Raw {
        DpKHead head;
        int q[8];  // the 32 bytes holding sub-block s's nibbles (and its neighbour's)
    };
    __device__ __forceinline__ static Raw fetch(const unsigned char* row, int c) {
        const unsigned char* b = row + 144LL * (c >> 3);
        Raw r;
        r.head.fetch(b);
        dp_words8_a16(b + 16 + 32 * ((c & 7) >> 1), r.q);
        return r;
    }
    __device__ __forceinline__ void unpack(const Raw& r, int c) {
        const int s = c & 7;
        r.head.scales(s, dl, ml);
        const int shift = 4 * (s & 1);
#pragma unroll
        for (int k = 0; k < 8; ++k) w[k] = (r.q[k] >> shift) & 0x0F0F0F0F;
    }
    __device__ __forceinline__ void load(const unsigned char* row, int c) { unpack(fetch(row, c), c); }
    __device__ __forceinline__ float acc_idot(float acc, int idot, int, const DpXF& x, int) const {
        return gb_fma(-ml, x.ds, gb_fma(dl * x.d, dp_i2f(idot), acc));
    }
    __device__ __forceinline__ float acc_dot(float acc, const DpX& x) const {
        return acc_idot(acc, dp_dot8(w, x.q), 0, dp_xf(x.d, x.s), 0);
    }
};

// Q5_K (176 bytes): as Q4_K, 5th bit s of qh[l]
template <> struct DpChunk<GB_Q5_K> {
    int w[8];
    float dl, ml;
    struct Raw {
        DpKHead head;
        int hi[8], q[8];  // qh (all 32 bytes), the 32 bytes of sub-block s's nibbles
    };
    __device__ __forceinline__ static Raw fetch(const unsigned char* row, int c) {
        const unsigned char* b = row + 176LL * (c >> 3);
        Raw r;
        r.head.fetch(b);
        dp_words8_a16(b + 16, r.hi);
        dp_words8_a16(b + 48 + 32 * ((c & 7) >> 1), r.q);
        return r;
    }
    __device__ __forceinline__ void unpack(const Raw& r, int c) {
        const int s = c & 7;
        r.head.scales(s, dl, ml);
        const int shift = 4 * (s & 1);
#pragma unroll
        for (int k = 0; k < 8; ++k) w[k] = ((r.q[k] >> shift) & 0x0F0F0F0F) | (((r.hi[k] >> s) & 0x01010101) << 4);
    }
    __device__ __forceinline__ void load(const unsigned char* row, int c) { unpack(fetch(row, c), c); }
    __device__ __forceinline__ float acc_idot(float acc, int idot, int, const DpXF& x, int) const {
        return gb_fma(-ml, x.ds, gb_fma(dl * x.d, dp_i2f(idot), acc));
    }
    __device__ __forceinline__ float acc_dot(float acc, const DpX& x) const {
        return acc_idot(acc, dp_dot8(w, x.q), 0, dp_xf(x.d, x.s), 0);
    }
};

// The dot of a chunk whose scales cover 16-value halves (Q6_K, Q3_K, Q2_K): the int8 dots of values
// 0..15 and 16..31 and the sum of x's first 16 values, into the chunk's acc_idot.
template <class Chunk>
__device__ __forceinline__ float dp_halves_dot(const Chunk& ch, float acc, const DpX& x) {
    const int ones[8] = {0x01010101, 0x01010101, 0x01010101, 0x01010101, 0, 0, 0, 0};
    return ch.acc_idot(acc, dp_dot8(ch.w, x.q, 0, 4), dp_dot8(ch.w, x.q, 4, 8), dp_xf(x.d, x.s), dp_dot8(ones, x.q));
}

// Q6_K (210 bytes), chunk s = 4h + k: q6 = low nibble (ql) | 2 high bits (qh), value q6 - 32,
// scales[2s] for values l < 16 and scales[2s+1] for l >= 16:
//   (d d_x) (sc0 (idot0 - 32 s0) + sc1 (idot1 - 32 s1)),  s0/s1 the halves' sums of x
template <> struct DpChunk<GB_Q6_K> {
    int w[8];
    float d;
    int sc0, sc1;
    struct Raw {
        DpSpanA2<32> ql, qh;  // the low nibbles' and the high bits' 32 bytes (a block is 2-byte aligned)
        unsigned sc, d;       // 16-bit units: scales 2s, 2s + 1; d
    };
    __device__ __forceinline__ static Raw fetch(const unsigned char* row, int c) {
        const unsigned char* b = row + 210LL * (c >> 3);
        const int s = c & 7, h = s >> 2, k = s & 3;
        Raw r;
        r.ql.fetch(b + 64 * h + 32 * (k & 1));
        r.qh.fetch(b + 128 + 32 * h);
        r.sc = dp_u16_a2(b + 192 + 2 * s);
        r.d = dp_u16_a2(b + 208);
        return r;
    }
    __device__ __forceinline__ void unpack(const Raw& r, int c) {
        const int k = c & 3;  // (c & 7) & 3
        d = gb_half_bits(r.d);
        sc0 = (signed char)(r.sc & 0xFFu);
        sc1 = (signed char)(r.sc >> 8);
        const int lshift = 4 * (k >> 1), hshift = 2 * k;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int lw = (int)r.ql.at(4 * i), hw = (int)r.qh.at(4 * i);
            w[i] = ((lw >> lshift) & 0x0F0F0F0F) | (((hw >> hshift) & 0x03030303) << 4);
        }
    }
    __device__ __forceinline__ void load(const unsigned char* row, int c) { unpack(fetch(row, c), c); }
    __device__ __forceinline__ float acc_dot(float acc, const DpX& x) const { return dp_halves_dot(*this, acc, x); }
    // idot_lo / idot_hi: the raw int8 dots of values 0..15 and 16..31; s0: the sum of x's first 16
    __device__ __forceinline__ float acc_idot(float acc, int idot_lo, int idot_hi, const DpXF& x, int s0) const {
        const int s1 = x.s - s0;
        const int i0 = idot_lo - 32 * s0, i1 = idot_hi - 32 * s1;
        return gb_fma(d * x.d, (float)(sc0 * i0 + sc1 * i1), acc);
    }
};

// --- the types only the baselines compile (GB_ALL_ENTRIES) ------------------------------------------
// Q2_K (84 bytes), chunk s = 4h + j: q = bits 2j, 2j+1 of qs[32h + l] (0..3), scale byte 2s for values
// l < 16 and 2s + 1 after (low nibble sc, high m):
//   (d d_x) (sc0 idot0 + sc1 idot1), then - (dmin d_x) (m0 s0 + m1 s1),  s0/s1 the halves' sums of x
template <> struct DpChunk<GB_Q2_K> {
    int w[8];
    float d, dmin;
    int sc0, sc1, m0, m1;
    struct Raw {
        int q[8];     // the 32 bytes of qs holding chunk s's pairs (and three neighbours')
        unsigned sc;  // scale bytes 2s, 2s + 1
        unsigned dm;  // d | dmin << 16
    };
    __device__ __forceinline__ static Raw fetch(const unsigned char* row, int c) {
        const unsigned char* b = row + 84LL * (c >> 3);  // 84-byte blocks keep a row's 4-byte alignment
        const int s = c & 7;
        Raw r;
#pragma unroll
        for (int k = 0; k < 8; ++k) r.q[k] = dp_word_a4(b + 16 + 32 * (s >> 2) + 4 * k);
        r.sc = dp_u16_a2(b + 2 * s);
        r.dm = (unsigned)dp_word_a4(b + 80);
        return r;
    }
    __device__ __forceinline__ void unpack(const Raw& r, int c) {
        const int shift = 2 * (c & 3);  // (c & 7) & 3
        d = gb_half_bits(r.dm & 0xFFFFu);
        dmin = gb_half_bits(r.dm >> 16);
        sc0 = (int)(r.sc & 15u), m0 = (int)((r.sc >> 4) & 15u);
        sc1 = (int)((r.sc >> 8) & 15u), m1 = (int)(r.sc >> 12);
#pragma unroll
        for (int k = 0; k < 8; ++k) w[k] = (r.q[k] >> shift) & 0x03030303;
    }
    __device__ __forceinline__ void load(const unsigned char* row, int c) { unpack(fetch(row, c), c); }
    __device__ __forceinline__ float acc_dot(float acc, const DpX& x) const { return dp_halves_dot(*this, acc, x); }
    // idot_lo / idot_hi: the int8 dots of values 0..15 and 16..31; s0: the sum of x's first 16
    __device__ __forceinline__ float acc_idot(float acc, int idot_lo, int idot_hi, const DpXF& x, int s0) const {
        const int s1 = x.s - s0;
        return gb_fma(-dmin * x.d, dp_i2f(m0 * s0 + m1 * s1), gb_fma(d * x.d, dp_i2f(sc0 * idot_lo + sc1 * idot_hi), acc));
    }
};

// Q3_K (110 bytes, 2-byte aligned), chunk s = 4h + j: q3 = Q2_K's pair | bit s of hmask[l] << 2 (0..7),
// value q3 - 4; 6-bit scales 2s (l < 16) and 2s + 1 less 32 (gb_q3_k_scale's bits):
//   (d d_x) (sc0 (idot0 - 4 s0) + sc1 (idot1 - 4 s1))
template <> struct DpChunk<GB_Q3_K> {
    int w[8];
    float d;
    int sc0, sc1;
    struct Raw {
        DpSpanA2<32> qs, hm;  // chunk s's 32 bytes of qs, the 32 bytes of hmask
        unsigned lo, hi, d;   // 16-bit units: scale bytes 2s % 8 and 8 + 2s % 4 (and the next); d
    };
    __device__ __forceinline__ static Raw fetch(const unsigned char* row, int c) {
        const unsigned char* b = row + 110LL * (c >> 3);
        const int s = c & 7;
        Raw r;
        r.qs.fetch(b + 32 + 32 * (s >> 2));
        r.hm.fetch(b);
        r.lo = dp_u16_a2(b + 96 + ((2 * s) & 7));
        r.hi = dp_u16_a2(b + 104 + ((2 * s) & 3));
        r.d = dp_u16_a2(b + 108);
        return r;
    }
    __device__ __forceinline__ void unpack(const Raw& r, int c) {
        const int s = c & 7, shift = 2 * (s & 3);
        d = gb_half_bits(r.d);
        const unsigned lo = r.lo >> (4 * (s >> 2)), hi = r.hi >> (2 * (s >> 1));
        sc0 = (int)((lo & 15u) | ((hi & 3u) << 4)) - 32;
        sc1 = (int)(((lo >> 8) & 15u) | (((hi >> 8) & 3u) << 4)) - 32;
#pragma unroll
        for (int k = 0; k < 8; ++k)
            w[k] = (((int)r.qs.at(4 * k) >> shift) & 0x03030303) | ((((int)r.hm.at(4 * k) >> s) & 0x01010101) << 2);
    }
    __device__ __forceinline__ void load(const unsigned char* row, int c) { unpack(fetch(row, c), c); }
    __device__ __forceinline__ float acc_dot(float acc, const DpX& x) const { return dp_halves_dot(*this, acc, x); }
    __device__ __forceinline__ float acc_idot(float acc, int idot_lo, int idot_hi, const DpXF& x, int s0) const {
        const int s1 = x.s - s0;
        return gb_fma(d * x.d, dp_i2f(sc0 * (idot_lo - 4 * s0) + sc1 * (idot_hi - 4 * s1)), acc);
    }
};

// Four nibbles (each byte's low 4 bits) -> their entries of a 16-level table as 4 int8 (gb_level16)
__device__ __forceinline__ int dp_level_word(unsigned n, unsigned long long lo, unsigned long long hi) {
    unsigned r = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) r |= ((unsigned)gb_level16(lo, hi, (int)(n >> (8 * b)) & 15) & 0xFFu) << (8 * b);
    return (int)r;
}
__device__ __forceinline__ int dp_iq4_word(unsigned n) { return dp_level_word(n, GB_IQ4_LO, GB_IQ4_HI); }

// IQ4_NL (18 bytes): Q4_0's block and fetch, each nibble the index of a level         (d d_x) idot
template <> struct DpChunk<GB_IQ4_NL> : DpChunk<GB_Q4_0> {
    __device__ __forceinline__ void unpack(const Raw& r, int c) {
        DpChunk<GB_Q4_0>::unpack(r, c);
#pragma unroll
        for (int k = 0; k < 8; ++k) w[k] = dp_iq4_word((unsigned)w[k]);
    }
    __device__ __forceinline__ void load(const unsigned char* row, int c) { unpack(fetch(row, c), c); }
    __device__ __forceinline__ float acc_idot(float acc, int idot, int, const DpXF& x, int) const {
        return gb_fma(d * x.d, dp_i2f(idot), acc);
    }
    __device__ __forceinline__ float acc_dot(float acc, const DpX& x) const {
        return acc_idot(acc, dp_dot8(w, x.q), 0, dp_xf(x.d, x.s), 0);
    }
};

// IQ4_XS (136 bytes, 8-byte aligned), sub-block s: IQ4_NL's levels from qs[16s..16s+15], scale
// d (ls - 32) (gb_decode_iq4_xs's ls)                                          (dl d_x) idot
template <> struct DpChunk<GB_IQ4_XS> {
    int w[8];
    float dl;
    struct Raw {
        unsigned head[2];  // d | scales_h << 16, scales_l
        unsigned q[4];     // the 16 bytes of sub-block s's nibbles
    };
    __device__ __forceinline__ static Raw fetch(const unsigned char* row, int c) {
        const unsigned char* b = row + 136LL * (c >> 3);
        Raw r;
        dp_words_vec<2>(b, r.head);
        dp_words_vec<2>(b + 8 + 16 * (c & 7), r.q);
        dp_words_vec<2>(b + 16 + 16 * (c & 7), r.q + 2);
        return r;
    }
    __device__ __forceinline__ void unpack(const Raw& r, int c) {
        const int s = c & 7;
        const int ls = (int)((r.head[1] >> (4 * s)) & 15u) | (int)(((r.head[0] >> (16 + 2 * s)) & 3u) << 4);
        dl = gb_half_bits(r.head[0] & 0xFFFFu) * (float)(ls - 32);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            w[k] = dp_iq4_word(r.q[k] & 0x0F0F0F0Fu);
            w[k + 4] = dp_iq4_word((r.q[k] >> 4) & 0x0F0F0F0Fu);
        }
    }
    __device__ __forceinline__ void load(const unsigned char* row, int c) { unpack(fetch(row, c), c); }
    __device__ __forceinline__ float acc_idot(float acc, int idot, int, const DpXF& x, int) const {
        return gb_fma(dl * x.d, dp_i2f(idot), acc);
    }
    __device__ __forceinline__ float acc_dot(float acc, const DpX& x) const {
        return acc_idot(acc, dp_dot8(w, x.q), 0, dp_xf(x.d, x.s), 0);
    }
};

// MXFP4 (17 bytes, at any byte offset): [e][16 bytes: Q4_0's nibbles, each the index of a level]
//   (d d_x) idot, d = gb_e8m0_half(e), as IQ4_NL's with d a power of two: d d_x is exact unless it
//   leaves float's range. Past e = 252 (bytes no quantizer of finite weights writes) the reference's
//   weights overflow to inf from 2^128 while d d_x idot need not: there the two part.
template <> struct DpChunk<GB_MXFP4> {
    int w[8];
    float d;
    struct Raw {
        DpSpanA1<17> b;
    };
    __device__ __forceinline__ static Raw fetch(const unsigned char* row, int c) {
        Raw r;
        r.b.fetch(row + 17LL * c);
        return r;
    }
    __device__ __forceinline__ void unpack(const Raw& r, int) {
        d = gb_e8m0_half(r.b.at(0) & 0xFFu);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const unsigned raw = r.b.at(1 + 4 * k);
            w[k] = dp_level_word(raw & 0x0F0F0F0Fu, GB_MXFP4_LO, GB_MXFP4_HI);
            w[k + 4] = dp_level_word((raw >> 4) & 0x0F0F0F0Fu, GB_MXFP4_LO, GB_MXFP4_HI);
        }
    }
    __device__ __forceinline__ void load(const unsigned char* row, int c) { unpack(fetch(row, c), c); }
    __device__ __forceinline__ float acc_idot(float acc, int idot, int, const DpXF& x, int) const {
        return gb_fma(d * x.d, dp_i2f(idot), acc);
    }
    __device__ __forceinline__ float acc_dot(float acc, const DpX& x) const {
        return acc_idot(acc, dp_dot8(w, x.q), 0, dp_xf(x.d, x.s), 0);
    }
};

// --- the epilogue (matmul_mma.cu's too: the same operations, the same bits) ----------------------------
// NMAT = 1: *y = v (+ bias[row]) (+ *y when accumulate, in the order x + (...) as elementwise.cu's add).
// NMAT = 2: *y = act(v, up) (act: gated_act.cuh's, as elementwise.cu's silu_gate / gelu_gate), with
// has_bias (gpt-oss's experts) act(v + bias[2 row], up + bias[2 row + 1]): a row's gate and up biases
// side by side.
template <int NMAT>
__device__ __forceinline__ void dp_store(float* y, float v, float up, const float* bias, int row, int has_bias,
                                         int accumulate, int act) {
    if (NMAT == 2) {
        *y = has_bias ? gated_act(act, v + bias[2 * row], up + bias[2 * row + 1]) : gated_act(act, v, up);
    } else {
        const float r = has_bias ? v + bias[row] : v;
        *y = accumulate ? *y + r : r;
    }
}

// The same epilogue in two halves, for a thread that stores many outputs: dp_old loads what an
// output's store reads (the residual it adds to, its bias or biases) -- all of them issued before the
// first store, since a load the compiler cannot prove apart from an earlier store to Y waits for it --
// and dp_store_old stores with them: dp_store's operations, its bits. (dp_store stays as it is:
// written as the two back to back, it compiles matmul_mma to more instructions.)
struct DpOld {
    float y, b;  // the residual and the bias; NMAT = 2 (no residual): the gate's bias and the up's
};
template <int NMAT>
__device__ __forceinline__ DpOld dp_old(const float* y, const float* bias, int row, int has_bias, int accumulate) {
    if (NMAT == 2) return has_bias ? DpOld{bias[2 * row], bias[2 * row + 1]} : DpOld{0.0f, 0.0f};
    return DpOld{accumulate ? *y : 0.0f, has_bias ? bias[row] : 0.0f};
}
template <int NMAT>
__device__ __forceinline__ void dp_store_old(float* y, float v, float up, DpOld old, int has_bias, int accumulate,
                                             int act) {
    if (NMAT == 2) {
        *y = has_bias ? gated_act(act, v + old.y, up + old.b) : gated_act(act, v, up);
    } else {
        const float r = has_bias ? v + old.b : v;
        *y = accumulate ? old.y + r : r;
    }
}

// --- the row loop -------------------------------------------------------------------------------------
__device__ __forceinline__ int dp_group_lanes(int n_chunks) {
    int g = 1;
    while (g < 32 && 2 * g <= n_chunks) g *= 2;
    return g;
}

// Programmatic dependent launch (common.cuh): the weight rows of this block's first pass, asked of
// L2 before the entry's wait. A matvec's inputs are a few KB of activations; its weights are
// megabytes no kernel writes. So a block that starts early -- while the kernel before it drains its
// last wave, or while attention or a norm holds a few SMs -- has its HBM reads under way when the
// wait returns. Thread 0 asks for W's rows, thread 32 for W2's, in the first token tile's blocks.
// No loop (G by __clz, not dp_group_lanes' loop): before the wait pdl_check.py allows a branch only
// forward, to a label before the wait (NVVM makes one if/else of G's ternary). Nothing without
// -DSHARPINF_PDL_PREFETCH=1.
template <int QT, int NMAT, int GC>
__device__ __forceinline__ void dp_prefetch_rows(const unsigned char* W, const unsigned char* W2, int n_out, int n_in) {
    const int n_chunks = n_in / 32;
    const int G = GC ? GC : (n_chunks >= 32 ? 32 : 1 << (31 - __clz(n_chunks > 0 ? n_chunks : 1)));
    const int rows = (int)(blockDim.x >> 5) * (32 / G), r0 = blockIdx.x * rows;
    const int nr = n_out - r0 < rows ? n_out - r0 : rows;  // <= 0 past the last row: nothing asked
    const long long row_bytes = gb_row_bytes<QT>(n_in), bytes = blockIdx.y == 0 ? nr * row_bytes : 0;
    sharpinf_prefetch_l2(W + r0 * row_bytes, threadIdx.x == 0 ? bytes : 0);
    if (NMAT > 1) sharpinf_prefetch_l2(W2 + r0 * row_bytes, threadIdx.x == 32 ? bytes : 0);
}
// a matvec entry's start (its file redefines SHARPINF_PDL_AT_ENTRY to trigger only): the rows asked
// for, then the wait for the kernels before it
template <int QT, int NMAT, int GC>
__device__ __forceinline__ void dp_prefetch_then_wait(const unsigned char* W, const unsigned char* W2, int n_out,
                                                      int n_in) {
    dp_prefetch_rows<QT, NMAT, GC>(W, W2, n_out, n_in);
    sharpinf_pdl_wait();
}

// The canonical order (every q8_1 matmul kernel follows it, for every N): member g of a row's G
// lanes (G from n_in only) adds the float terms of chunks g, g + G, g + 2G, ... to 0 in that order;
// the members form groups of GS = min(G, DP_GROUP) in member order, each group adds its members'
// sums to 0 in member order, and the groups' sums are added to 0 in group order:
//   S_q = ((0 + s_{q GS}) + s_{q GS + 1}) + ... + s_{q GS + GS - 1},   y = ((0 + S_0) + S_1) + ... .
// (With one group, y = 0 + S_0 = S_0 bit for bit: G <= 8, i.e. n_in < 512, sums as a single level.)
// Two levels so a tensor-core kernel can give each group its own block (split-K): a block keeps a
// member sum and a group sum per output, the groups meet in a scratch, folded in group order by the
// block that finishes last (mmq_rows.cuh); one that walks every group keeps a third float (the total:
// mma_rows.cuh).
#define DP_GROUP 8  // members a group
__device__ __forceinline__ int dp_group_size(int G) { return G < DP_GROUP ? G : DP_GROUP; }

// y of the G member sums s(0) .. s(G - 1) in the canonical order above
template <class MemberSum>
__device__ __forceinline__ float dp_fold(int G, MemberSum s) {
    const int GS = dp_group_size(G);
    float y = 0.0f;
    for (int q = 0; q < G; q += GS) {
        float grp = 0.0f;
        for (int j = q; j < q + GS; ++j) grp = grp + s(j);
        y = y + grp;
    }
    return y;
}
// a warp's member sums, [matrix][token][lane] (+1 pad: the folding lanes hit distinct banks); 16-byte aligned,
// so a folding lane reads the G sums of a 16-byte aligned (matrix, token) row 4 at a time -- s[0][0]'s, and
// every 4th row's (a 132-byte pitch)
template <int NMAT, int NT = DP_TILE>
struct __align__(16) DpCombine {
    float s[NMAT][NT][33];
};

// The end of a row loop's pass (dp4a_rows, gemv_rows, moe_dp4a.cu): the G member sums of each (row,
// token) of the warp meet in cw and are folded in the canonical order (dp_fold), and one lane a (row,
// token) stores them: store(t, row, v), v a sum for each matrix, for the rows base .. base +
// rows_per_warp - 1 below n_out and the nt live tokens. (The member loops stay in each kernel: in a
// shared helper, ptxas lays them out with more instructions.)
// LANES (the row loops whose G is compiled in: GC != 0): the fold spread over lanes. Folded by the
// storing lane alone, a (row, token)'s G member sums are added while the warp's other lanes wait: at one
// token and G = 32, 32 + 4 adds by lane 0 at every row's end. With LANES a lane of its own sums each
// group (S_q, over its GS members in member order, written over the group's first member), then the
// storing lane adds the S_q in group order -- dp_fold's additions in dp_fold's order, so its bits. With G
// from n_in the lanes' runtime loops cost more than they save: those fold on the storing lane.
template <int NMAT, bool LANES = false, int NT, class Store>
__device__ __forceinline__ void dp_combine(DpCombine<NMAT, NT>& cw, const float (&acc)[NMAT][NT], int G,
                                           int rows_per_warp, int nt, int base, int n_out, Store store) {
    const int lane = threadIdx.x & 31, GS = dp_group_size(G), NG = G / GS, items = rows_per_warp * NT;
#pragma unroll
    for (int m = 0; m < NMAT; ++m)
#pragma unroll
        for (int t = 0; t < NT; ++t)
            if (t < nt) cw.s[m][t][lane] = acc[m][t];
    __syncwarp();
    if constexpr (LANES) {
        const int lg_ng = __ffs(NG) - 1;  // NG: 1, 2 or 4 (G a power of two): no integer division below
        for (int u = lane; u < items * NG; u += 32) {  // u: group u % NG of (the warp's row f / NT, token f % NT)
            const int f = u >> lg_ng, q = u & (NG - 1), r = f / NT, t = f % NT;
            if (base + r >= n_out || t >= nt) continue;
#pragma unroll
            for (int m = 0; m < NMAT; ++m) {
                float* sq = &cw.s[m][t][r * G + q * GS];
                float grp = 0.0f;
#pragma unroll
                for (int j = 0; j < DP_GROUP; ++j)  // GS <= DP_GROUP
                    if (j < GS) grp = grp + sq[j];
                sq[0] = grp;
            }
        }
        __syncwarp();
    }
    for (int f = lane; f < items; f += 32) {  // f: (the warp's row f / NT, token f % NT)
        const int r = f / NT, t = f % NT;
        if (base + r >= n_out || t >= nt) continue;
        float v[NMAT];
#pragma unroll
        for (int m = 0; m < NMAT; ++m) {
            if constexpr (LANES) {
                v[m] = 0.0f;
#pragma unroll
                for (int q = 0; q < 32 / DP_GROUP; ++q)  // NG <= 32 / DP_GROUP (G <= 32)
                    if (q < NG) v[m] = v[m] + cw.s[m][t][r * G + q * GS];
            } else {
                v[m] = dp_fold(G, [&](int j) { return cw.s[m][t][r * G + j]; });
            }
        }
        store(t, base + r, v);
    }
    __syncwarp();  // the next pass overwrites cw
}

// Chunk c of a weight row into ch, its unpack told s for c: every unpack reads only c & 7 (a K-quant
// chunk's place in its super-block), so with G a multiple of 8 a lane passes its own g & 7 -- the
// same every chunk, and the shifts and selects that follow from it leave the loop.
template <int QT>
__device__ __forceinline__ void dp_load_at(DpChunk<QT>& ch, const unsigned char* row, int c, int s) {
    if constexpr (QT == GB_F32 || QT == GB_F16 || QT == GB_BF16) ch.load(row, c);
    else ch.unpack(DpChunk<QT>::fetch(row, c), s);
}

// DP_TILE_BREAK: how a chunk's token loop passes the tile's slots past the step's nt tokens (a decode
// step has 1 of 8). With BRK, it leaves at the first (one test at N = 1); without, it tests each of the 8,
// the tests' predicates hoisted by ptxas. The same bits either way; what differs is the code ptxas makes:
// in the separate launches BRK gives fewer instructions a chunk for more registers (fewer blocks an SM),
// in the fused kernels fewer of both. So the fused kernels (ffn_fused.cuh, layer_dp4a.cu) take BRK; the
// separate launches take DP_TILE_BREAK, 0 -- a probe (through SHARPINF_NVRTC_OPTIONS,
// bench/gpu_slot.sh) says whether their fewer instructions beat their warps.
#ifndef DP_TILE_BREAK
#define DP_TILE_BREAK 0
#endif

// NMAT = 1: Y = X W^T (+ bias) (+ Y when accumulate).   NMAT = 2 (W2 the second matrix, the same
// type and shape): Y = act(X W^T) * (X W2^T), the SwiGLU (or GeGLU) of a gate and an up projection.
// GC: G when known at compile time (the _g16 and _g32 entries, DP_GC below; 0: from n_in at run time).
// BRK: leave the token loop at the first slot past nt (DP_TILE_BREAK above).
template <int QT, int NMAT, int GC = 0, bool BRK = DP_TILE_BREAK != 0>
__device__ __forceinline__ void dp4a_rows(const unsigned char* __restrict__ W, const unsigned char* __restrict__ W2,
                                          const signed char* __restrict__ xq, const float* __restrict__ xd,
                                          const int* __restrict__ xs, const float* __restrict__ bias, float* Y,
                                          int n_tokens, int n_out, int n_in, int has_bias, int accumulate,
                                          long long y_stride, int act = ACT_SILU) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_chunks = n_in / 32;
    const int G = GC ? GC : dp_group_lanes(n_chunks), g = lane % G, rows_per_warp = 32 / G;
    const int t0 = blockIdx.y * DP_TILE;
    const int nt = n_tokens - t0 < DP_TILE ? n_tokens - t0 : DP_TILE;
    const long long row_bytes = gb_row_bytes<QT>(n_in);
    const int rows_per_pass = gridDim.x * DP_WARPS * rows_per_warp;
    __shared__ DpCombine<NMAT> comb[DP_WARPS];
    DpCombine<NMAT>& cw = comb[warp];
    // Every lane runs every pass (the combine's __syncwarp needs the whole warp); rows past n_out are skipped.
    for (int base = (blockIdx.x * DP_WARPS + warp) * rows_per_warp; base < n_out; base += rows_per_pass) {
        const int row = base + lane / G;
        const bool live = row < n_out;
        float acc[NMAT][DP_TILE];
#pragma unroll
        for (int m = 0; m < NMAT; ++m)
#pragma unroll
            for (int t = 0; t < DP_TILE; ++t) acc[m][t] = 0.0f;
        if (live) {
            const unsigned char* wrow[2] = {W + (long long)row * row_bytes, NMAT > 1 ? W2 + (long long)row * row_bytes : W};
            // DP_UNROLL chunks a pass: their weight loads are all issued before the first dot, so
            // a lane has several loads in flight (one at a time leaves HBM idle at decode); the
            // chunks are still added in the order c, c + G, c + 2G, ...
            constexpr int U = NMAT == 1 || DP_UNROLL == 1 ? DP_UNROLL : DP_UNROLL / 2;
            for (int c0 = g; c0 < n_chunks; c0 += U * G) {
                DpChunk<QT> ch[U][NMAT];
#pragma unroll
                for (int k = 0; k < U; ++k)
                    if (c0 + k * G < n_chunks)
#pragma unroll
                        for (int m = 0; m < NMAT; ++m) dp_load_at(ch[k][m], wrow[m], c0 + k * G, GC ? g & 7 : c0 + k * G);
#pragma unroll
                for (int k = 0; k < U; ++k) {
                    const int c = c0 + k * G;
                    if (c >= n_chunks) break;
#pragma unroll
                    for (int t = 0; t < DP_TILE; ++t) {
                        if (t >= nt) {  // the tile's tokens past the step's (DP_TILE_BREAK above)
                            if (BRK) break;
                            continue;
                        }
                        DpX x;
                        dp_load_x(xq, xd, xs, t0 + t, c, n_in, x);
#pragma unroll
                        for (int m = 0; m < NMAT; ++m) acc[m][t] = ch[k][m].acc_dot(acc[m][t], x);
                    }
                }
            }
        }
        // the G member sums of each (row, token) meet in one lane, folded in the canonical order
        auto store = [&](int t, int r, const float(&v)[NMAT]) {
            dp_store<NMAT>(Y + (long long)(t0 + t) * y_stride + r, v[0], v[NMAT - 1], bias, r, has_bias, accumulate, act);
        };
        dp_combine<NMAT, GC != 0>(cw, acc, G, rows_per_warp, nt, base, n_out, store);
    }
}

// G as a compile-time constant (the entries named ..._g16 and ..._g32, which launchers pick where G is
// 16 or 32: n_in in 512..1023, and from 1024): a lane's chunks are g + G k, so a K-quant chunk's
// place in its super-block (c % 8) is the lane's own (dp_load_at) and a chunk's offsets step by
// constants -- folded by the compiler, not recomputed every chunk; the same order, the same bits.
// Entries of their own, so the kernels of other rows keep their registers. Not for float weights
// (nothing to fold: ops/matmul_dp4a.py's FIXED_G_TYPES). A row's end folds on a lane a group, then a
// lane a row (dp_combine with LANES).
// DP_FIXED_G=0 (a probe, through SHARPINF_NVRTC_OPTIONS): those entries take G from n_in.
#ifndef DP_FIXED_G
#define DP_FIXED_G 1
#endif
#define DP_GC(G) (DP_FIXED_G ? (G) : 0)
// n_in's range where G is G (32: from 1024; 16: 512..1023), told the compiler (its offsets and trip
// counts fold with it: a condition it cannot see, as through a helper's return value, leaves the loop
// as it is)
#define DP_ASSUME_G(n_in, G)                                                \
    do {                                                                    \
        if ((n_in) < 32 * (G) || ((G) < 32 && (n_in) >= 64 * (G))) return; \
    } while (0)
