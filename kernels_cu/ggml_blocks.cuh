// ggml_blocks.cuh -- decoding GGML weight blocks on the device (the kernels' side of
// sharpinf/model/quants.py, which is the truth these functions are tested against).
//
// A weight row of n values is row_bytes = n / BLOCK_ELEMS * BLOCK_BYTES raw GGUF bytes,
// little-endian. Rows are back to back, so a block can sit at any byte offset: every
// multi-byte field is read bytewise here (never a 2- or 4-byte load), which is legal
// on the GPU for any alignment.
//
// The unit of work is a *chunk*: 32 consecutive values of a row (row values 32c..32c+31).
// gb_decode_chunk<QT>(row, c, w) writes chunk c of `row` into w[0..31] in value order.
// A legacy block is exactly one chunk; a K-quant super-block is eight.
//
// Every dequantized value equals quants.dequantize's bit for bit: each product of a
// scale and a quant is exact in float32 (at most 24 significant bits: an fp16 mantissa
// of 11 bits times integers of <= 13 bits; MXFP4's a power of two times one of <= 4 bits,
// exact but where it overflows), so the only rounding is the final add or subtract, and FMA
// contraction cannot change a result.
//
// QT is the gguf.GGMLQuantizationType value of the type.
#pragma once
#include "common.cuh"

#define GB_F32 0
#define GB_F16 1
#define GB_Q4_0 2
#define GB_Q4_1 3
#define GB_Q5_0 6
#define GB_Q5_1 7
#define GB_Q8_0 8
#define GB_Q4_K 12
#define GB_Q5_K 13
#define GB_Q6_K 14
#define GB_BF16 30
// the baselines' own (GB_ALL_ENTRIES below; embedding.cu)
#define GB_Q2_K 10
#define GB_Q3_K 11
#define GB_IQ4_NL 20
#define GB_IQ4_XS 23
#define GB_MXFP4 39

#define GB_CHUNK 32  // values per chunk

// One entry point per weight type from one line (SHARPINF_ENTRY, common.cuh): name_<type><sfx>,
// its body FN<GB_TYPE>(call...). GB_QUANT_ENTRIES: the eight quantized types; GB_ENTRIES: all eleven.
// GB_ONE_TYPE (the emulator's builds, sharpinf/runtime/emu/build.py): only the entries of the type t
// with GB_TYPE_<t> defined as 1 (or of none) -- a test of one type builds that type's code, not all eleven.
#ifdef GB_ONE_TYPE
#define GB_TYPE_WANTED(t) SHARPINF_SECOND_(GB_CAT(SHARPINF_IS_, GB_TYPE_##t), 0, ~)
#else
#define GB_TYPE_WANTED(t) 1
#endif
#define GB_CAT(a, b) GB_CAT_(a, b)
#define GB_CAT_(a, b) a##b
#define GB_IF_1(...) __VA_ARGS__
#define GB_IF_0(...)
#define GB_ENTRY(name, t, sfx, QT, params, FN, ...) GB_ENTRY_ATTRS(name, t, sfx, , QT, params, FN, __VA_ARGS__)
#define GB_ENTRY_ATTRS(name, t, sfx, attrs, QT, params, FN, ...) \
    GB_CAT(GB_IF_, GB_TYPE_WANTED(t))(SHARPINF_ENTRY_ATTRS(name##_##t##sfx, attrs, params, FN<QT>(__VA_ARGS__)))
#define GB_QUANT_ENTRIES(name, sfx, params, FN, ...) GB_QUANT_ENTRIES_ATTRS(name, sfx, GB_NO_ATTRS, params, FN, __VA_ARGS__)
// ... with attributes before each name: ATTRS(QT), e.g. a macro giving __launch_bounds__(128, 3)
#define GB_NO_ATTRS(QT)
#define GB_QUANT_ENTRIES_ATTRS(name, sfx, ATTRS, params, FN, ...)                       \
    GB_ENTRY_ATTRS(name, q8_0, sfx, ATTRS(GB_Q8_0), GB_Q8_0, params, FN, __VA_ARGS__)   \
    GB_PACKED_ENTRIES_ATTRS(name, sfx, ATTRS, params, FN, __VA_ARGS__)
// GB_PACKED_ENTRIES: the seven packed types, every quantized type but Q8_0 (whose values are whole
// bytes: nothing to unpack)
#define GB_PACKED_ENTRIES(name, sfx, params, FN, ...) GB_PACKED_ENTRIES_ATTRS(name, sfx, GB_NO_ATTRS, params, FN, __VA_ARGS__)
#define GB_PACKED_ENTRIES_ATTRS(name, sfx, ATTRS, params, FN, ...)                      \
    GB_ENTRY_ATTRS(name, q4_0, sfx, ATTRS(GB_Q4_0), GB_Q4_0, params, FN, __VA_ARGS__)   \
    GB_ENTRY_ATTRS(name, q4_1, sfx, ATTRS(GB_Q4_1), GB_Q4_1, params, FN, __VA_ARGS__)   \
    GB_ENTRY_ATTRS(name, q5_0, sfx, ATTRS(GB_Q5_0), GB_Q5_0, params, FN, __VA_ARGS__)   \
    GB_ENTRY_ATTRS(name, q5_1, sfx, ATTRS(GB_Q5_1), GB_Q5_1, params, FN, __VA_ARGS__)   \
    GB_ENTRY_ATTRS(name, q4_k, sfx, ATTRS(GB_Q4_K), GB_Q4_K, params, FN, __VA_ARGS__)   \
    GB_ENTRY_ATTRS(name, q5_k, sfx, ATTRS(GB_Q5_K), GB_Q5_K, params, FN, __VA_ARGS__)   \
    GB_ENTRY_ATTRS(name, q6_k, sfx, ATTRS(GB_Q6_K), GB_Q6_K, params, FN, __VA_ARGS__)
// GB_ALL_ENTRIES: those eleven and the five the baselines alone compile (the simple matmul, dp4a and its
// MoE form; the faster variants hand them to dp4a: quants.BASE_ONLY)
#define GB_ALL_ENTRIES(name, sfx, params, FN, ...)                                        \
    GB_ENTRIES(name, sfx, params, FN, __VA_ARGS__)                                         \
    GB_ENTRY(name, q2_k, sfx, GB_Q2_K, params, FN, __VA_ARGS__)                            \
    GB_ENTRY(name, q3_k, sfx, GB_Q3_K, params, FN, __VA_ARGS__)                            \
    GB_ENTRY(name, iq4_nl, sfx, GB_IQ4_NL, params, FN, __VA_ARGS__)                        \
    GB_ENTRY(name, iq4_xs, sfx, GB_IQ4_XS, params, FN, __VA_ARGS__)                        \
    GB_ENTRY(name, mxfp4, sfx, GB_MXFP4, params, FN, __VA_ARGS__)
#define GB_ENTRIES(name, sfx, params, FN, ...) GB_ENTRIES_ATTRS(name, sfx, GB_NO_ATTRS, params, FN, __VA_ARGS__)
#define GB_ENTRIES_ATTRS(name, sfx, ATTRS, params, FN, ...)                               \
    GB_ENTRY_ATTRS(name, f32, sfx, ATTRS(GB_F32), GB_F32, params, FN, __VA_ARGS__)        \
    GB_ENTRY_ATTRS(name, f16, sfx, ATTRS(GB_F16), GB_F16, params, FN, __VA_ARGS__)        \
    GB_ENTRY_ATTRS(name, bf16, sfx, ATTRS(GB_BF16), GB_BF16, params, FN, __VA_ARGS__)     \
    GB_QUANT_ENTRIES_ATTRS(name, sfx, ATTRS, params, FN, __VA_ARGS__)

// --- scalar helpers ----------------------------------------------------------------------
__device__ __forceinline__ unsigned gb_u16(const unsigned char* p) { return (unsigned)p[0] | ((unsigned)p[1] << 8); }
__device__ __forceinline__ unsigned gb_u32(const unsigned char* p) {
    return (unsigned)p[0] | ((unsigned)p[1] << 8) | ((unsigned)p[2] << 16) | ((unsigned)p[3] << 24);
}

// IEEE binary16 bits -> float, exact (subnormals, inf and NaN included).
__device__ __forceinline__ float gb_half_bits(unsigned h) {
#ifdef SHARPINF_EMU
    return sharpinf_emu_half_bits((unsigned short)h);
#else
    return __half2float(__ushort_as_half((unsigned short)h));
#endif
}

__device__ __forceinline__ float gb_bits_float(unsigned u) {
#ifdef SHARPINF_EMU
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
#else
    return __uint_as_float(u);
#endif
}

__device__ __forceinline__ float gb_f16_at(const unsigned char* p) { return gb_half_bits(gb_u16(p)); }

// a*b+c with one rounding on both compilers (never left to the compiler's contraction choice)
__device__ __forceinline__ float gb_fma(float a, float b, float c) {
#ifdef SHARPINF_EMU
    return __builtin_fmaf(a, b, c);
#else
    return __fmaf_rn(a, b, c);
#endif
}

// --- block geometry --------------------------------------------------------------------------
template <int QT> struct GbInfo;
template <> struct GbInfo<GB_F32>  { enum { elems = 1,   bytes = 4 }; };
template <> struct GbInfo<GB_F16>  { enum { elems = 1,   bytes = 2 }; };
template <> struct GbInfo<GB_BF16> { enum { elems = 1,   bytes = 2 }; };
template <> struct GbInfo<GB_Q8_0> { enum { elems = 32,  bytes = 34 }; };
template <> struct GbInfo<GB_Q4_0> { enum { elems = 32,  bytes = 18 }; };
template <> struct GbInfo<GB_Q4_1> { enum { elems = 32,  bytes = 20 }; };
template <> struct GbInfo<GB_Q5_0> { enum { elems = 32,  bytes = 22 }; };
template <> struct GbInfo<GB_Q5_1> { enum { elems = 32,  bytes = 24 }; };
template <> struct GbInfo<GB_Q4_K> { enum { elems = 256, bytes = 144 }; };
template <> struct GbInfo<GB_Q5_K> { enum { elems = 256, bytes = 176 }; };
template <> struct GbInfo<GB_Q6_K> { enum { elems = 256, bytes = 210 }; };
template <> struct GbInfo<GB_Q2_K> { enum { elems = 256, bytes = 84 }; };
template <> struct GbInfo<GB_Q3_K> { enum { elems = 256, bytes = 110 }; };
template <> struct GbInfo<GB_IQ4_NL> { enum { elems = 32, bytes = 18 }; };
template <> struct GbInfo<GB_IQ4_XS> { enum { elems = 256, bytes = 136 }; };
template <> struct GbInfo<GB_MXFP4> { enum { elems = 32, bytes = 17 }; };

// bytes of one row of n values (n a multiple of the block size)
template <int QT> __device__ __forceinline__ long long gb_row_bytes(int n) {
    return (long long)(n / GbInfo<QT>::elems) * GbInfo<QT>::bytes;
}

// --- float types: one value per "block" ------------------------------------------------------
// F32:  4 bytes, IEEE float32.   F16: 2 bytes, IEEE binary16.   BF16: 2 bytes, the top half of a float32.
template <int QT> __device__ __forceinline__ float gb_decode_value(const unsigned char* row, long long i);
template <> __device__ __forceinline__ float gb_decode_value<GB_F32>(const unsigned char* row, long long i) {
    return gb_bits_float(gb_u32(row + 4 * i));
}
template <> __device__ __forceinline__ float gb_decode_value<GB_F16>(const unsigned char* row, long long i) {
    return gb_half_bits(gb_u16(row + 2 * i));
}
template <> __device__ __forceinline__ float gb_decode_value<GB_BF16>(const unsigned char* row, long long i) {
    return gb_bits_float(gb_u16(row + 2 * i) << 16);
}

template <int QT> __device__ __forceinline__ void gb_decode_float_chunk(const unsigned char* row, int c, float (&w)[32]) {
#pragma unroll
    for (int e = 0; e < 32; ++e) w[e] = gb_decode_value<QT>(row, (long long)c * 32 + e);
}

// --- legacy 32-value blocks ----------------------------------------------------------------
// Nibble order of qs[16]: value j < 16 is the low nibble of qs[j], value j + 16 its high nibble.

// Q8_0 (34 bytes): [d: f16][qs: 32 x int8]                               w = d * q
__device__ __forceinline__ void gb_decode_q8_0(const unsigned char* b, float (&w)[32]) {
    const float d = gb_f16_at(b);
#pragma unroll
    for (int j = 0; j < 32; ++j) w[j] = d * (float)(signed char)b[2 + j];
}

// Q4_0 (18 bytes): [d: f16][qs: 16 bytes]                                 w = d * (q - 8)
__device__ __forceinline__ void gb_decode_q4_0(const unsigned char* b, float (&w)[32]) {
    const float d = gb_f16_at(b);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const int q = b[2 + j];
        w[j] = d * (float)((q & 15) - 8);
        w[j + 16] = d * (float)((q >> 4) - 8);
    }
}

// Q4_1 (20 bytes): [d: f16][m: f16][qs: 16 bytes]                         w = d * q + m
__device__ __forceinline__ void gb_decode_q4_1(const unsigned char* b, float (&w)[32]) {
    const float d = gb_f16_at(b), m = gb_f16_at(b + 2);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const int q = b[4 + j];
        w[j] = d * (float)(q & 15) + m;
        w[j + 16] = d * (float)(q >> 4) + m;
    }
}

// Q5_0 (22 bytes): [d: f16][qh: 4 bytes, bit j = 5th bit of value j][qs: 16 bytes]
//                                                                          w = d * (q - 16)
__device__ __forceinline__ void gb_decode_q5_0(const unsigned char* b, float (&w)[32]) {
    const float d = gb_f16_at(b);
    const unsigned qh = gb_u32(b + 2);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const int q = b[6 + j];
        const int lo = (q & 15) | (int)(((qh >> j) & 1u) << 4);
        const int hi = (q >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
        w[j] = d * (float)(lo - 16);
        w[j + 16] = d * (float)(hi - 16);
    }
}

// Q5_1 (24 bytes): [d: f16][m: f16][qh: 4 bytes][qs: 16 bytes]             w = d * q + m
__device__ __forceinline__ void gb_decode_q5_1(const unsigned char* b, float (&w)[32]) {
    const float d = gb_f16_at(b), m = gb_f16_at(b + 2);
    const unsigned qh = gb_u32(b + 4);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const int q = b[8 + j];
        const int lo = (q & 15) | (int)(((qh >> j) & 1u) << 4);
        const int hi = (q >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
        w[j] = d * (float)lo + m;
        w[j + 16] = d * (float)hi + m;
    }
}

// --- K-quants: 256-value super-blocks, decoded one 32-value chunk (index s = 0..7) at a time ---

// The 12 packed scale bytes of Q4_K/Q5_K -> the 6-bit scale and min of sub-block s:
//   s < 4:  sc = k[s] & 63,                          m = k[s+4] & 63
//   s >= 4: sc = (k[s+4] & 15) | (k[s-4] >> 6) << 4,  m = (k[s+4] >> 4) | (k[s] >> 6) << 4
__device__ __forceinline__ void gb_k_scale_min(const unsigned char* k, int s, int& sc, int& m) {
    if (s < 4) {
        sc = k[s] & 63;
        m = k[s + 4] & 63;
    } else {
        sc = (k[s + 4] & 15) | ((k[s - 4] >> 6) << 4);
        m = (k[s + 4] >> 4) | ((k[s] >> 6) << 4);
    }
}

// Q4_K (144 bytes): [d: f16][dmin: f16][scales: 12 bytes][qs: 128 bytes]
//   sub-block s (values 32s..32s+31): w = (d * sc_s) * q - (dmin * m_s);
//   q of value l is nibble (s & 1) of qs[32 * (s >> 1) + l] (low nibble for even s).
__device__ __forceinline__ void gb_decode_q4_k(const unsigned char* b, int s, float (&w)[32]) {
    int sc, m;
    gb_k_scale_min(b + 4, s, sc, m);
    const float dl = gb_f16_at(b) * (float)sc, ml = gb_f16_at(b + 2) * (float)m;
    const unsigned char* qs = b + 16 + 32 * (s >> 1);
    const int shift = (s & 1) * 4;
#pragma unroll
    for (int l = 0; l < 32; ++l) w[l] = dl * (float)((qs[l] >> shift) & 15) - ml;
}

// Q5_K (176 bytes): [d: f16][dmin: f16][scales: 12 bytes][qh: 32 bytes][qs: 128 bytes]
//   as Q4_K, with q |= ((qh[l] >> s) & 1) << 4.
__device__ __forceinline__ void gb_decode_q5_k(const unsigned char* b, int s, float (&w)[32]) {
    int sc, m;
    gb_k_scale_min(b + 4, s, sc, m);
    const float dl = gb_f16_at(b) * (float)sc, ml = gb_f16_at(b + 2) * (float)m;
    const unsigned char* qh = b + 16;
    const unsigned char* qs = b + 48 + 32 * (s >> 1);
    const int shift = (s & 1) * 4;
#pragma unroll
    for (int l = 0; l < 32; ++l) {
        const int q = ((qs[l] >> shift) & 15) | (((qh[l] >> s) & 1) << 4);
        w[l] = dl * (float)q - ml;
    }
}

// Q6_K (210 bytes): [ql: 128 bytes][qh: 64 bytes][scales: 16 x int8][d: f16]
//   16 sub-blocks of 16 values: w = (d * scales[v / 16]) * (q - 32), q 6 bits.
//   Chunk s = 4h + k (half h = 0..1, k = 0..3) holds values 128h + 32k + l, l = 0..31:
//     low 4 bits:  nibble (k >> 1) of ql[64h + 32 * (k & 1) + l]
//     high 2 bits: bits 2k, 2k+1 of qh[32h + l]
__device__ __forceinline__ void gb_decode_q6_k(const unsigned char* b, int s, float (&w)[32]) {
    const int h = s >> 2, k = s & 3;
    const float d = gb_f16_at(b + 208);
    const float dl0 = d * (float)(signed char)b[192 + 2 * s];      // values l < 16
    const float dl1 = d * (float)(signed char)b[192 + 2 * s + 1];  // values l >= 16
    const unsigned char* ql = b + 64 * h + 32 * (k & 1);
    const unsigned char* qh = b + 128 + 32 * h;
    const int lshift = (k >> 1) * 4, hshift = 2 * k;
#pragma unroll
    for (int l = 0; l < 32; ++l) {
        const int q = (((ql[l] >> lshift) & 15) | (((qh[l] >> hshift) & 3) << 4)) - 32;
        w[l] = (l < 16 ? dl0 : dl1) * (float)q;
    }
}

// Q2_K (84 bytes): [scales: 16 bytes, sc low nibble, m high][qs: 64 bytes][d: f16][dmin: f16]
//   16 sub-blocks of 16: w = (d * sc) * q - (dmin * m), q 2 bits. Chunk s = 4h + j (half h, j = 0..3)
//   holds values 128h + 32j + l: q = bits 2j, 2j+1 of qs[32h + l]; scales[2s] for l < 16, [2s+1] after.
__device__ __forceinline__ void gb_decode_q2_k(const unsigned char* b, int s, float (&w)[32]) {
    const float d = gb_f16_at(b + 80), dmin = gb_f16_at(b + 82);
    const int sc0 = b[2 * s], sc1 = b[2 * s + 1];
    const float dl0 = d * (float)(sc0 & 15), ml0 = dmin * (float)(sc0 >> 4);
    const float dl1 = d * (float)(sc1 & 15), ml1 = dmin * (float)(sc1 >> 4);
    const unsigned char* qs = b + 16 + 32 * (s >> 2);
    const int shift = 2 * (s & 3);
#pragma unroll
    for (int l = 0; l < 32; ++l) {
        const float q = (float)((qs[l] >> shift) & 3);
        w[l] = l < 16 ? dl0 * q - ml0 : dl1 * q - ml1;
    }
}

// Q3_K (110 bytes): [hmask: 32 bytes][qs: 64 bytes][scales: 12 bytes, 16 x 6 bits][d: f16]
//   16 sub-blocks of 16: w = (d * (scale - 32)) * q, q = the 2 low bits (as Q2_K's) - 4 unless bit s of
//   hmask[l] is set. Scale i: low 4 bits nibble i / 8 of byte i % 8, high 2 bits 2(i / 4) of byte 8 + i % 4.
__device__ __forceinline__ int gb_q3_k_scale(const unsigned char* k, int i) {
    const int lo = (k[i & 7] >> (4 * (i >> 3))) & 15, hi = (k[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
    return (lo | (hi << 4)) - 32;
}
__device__ __forceinline__ void gb_decode_q3_k(const unsigned char* b, int s, float (&w)[32]) {
    const float d = gb_f16_at(b + 108);
    const float dl0 = d * (float)gb_q3_k_scale(b + 96, 2 * s), dl1 = d * (float)gb_q3_k_scale(b + 96, 2 * s + 1);
    const unsigned char* qs = b + 32 + 32 * (s >> 2);
    const int shift = 2 * (s & 3);
#pragma unroll
    for (int l = 0; l < 32; ++l) {
        const int q = ((qs[l] >> shift) & 3) - (((b[l] >> s) & 1) ? 0 : 4);
        w[l] = (l < 16 ? dl0 : dl1) * (float)q;
    }
}

// IQ4_NL's and IQ4_XS's 16 levels (quants.IQ4_LEVELS: -127, -104, -83, -65, -49, -35, -22, -10, 1, 13,
// 25, 38, 53, 69, 89, 113): a nibble indexes them. Levels 0..7 and 8..15 are the bytes of two 64-bit
// constants, so a lookup is a shift in registers, never a local array.
#define GB_IQ4_LO 0xF6EADDCFBFAD9881ULL
#define GB_IQ4_HI 0x7159453526190D01ULL
// entry i of a 16-entry int8 table held as two 64-bit constants (entries 0..7 the bytes of lo)
__device__ __forceinline__ int gb_level16(unsigned long long lo, unsigned long long hi, int i) {
    return (signed char)(unsigned char)(((i & 8) ? hi : lo) >> (8 * (i & 7)));
}
__device__ __forceinline__ int gb_iq4_level(int i) { return gb_level16(GB_IQ4_LO, GB_IQ4_HI, i); }

// IQ4_NL (18 bytes): [d: f16][qs: 16 bytes, nibbles as Q4_0's]            w = d * level[nibble]
__device__ __forceinline__ void gb_decode_iq4_nl(const unsigned char* b, float (&w)[32]) {
    const float d = gb_f16_at(b);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        w[j] = d * (float)gb_iq4_level(b[2 + j] & 15);
        w[j + 16] = d * (float)gb_iq4_level(b[2 + j] >> 4);
    }
}

// IQ4_XS (136 bytes): [d: f16][scales_h: u16][scales_l: 4 bytes][qs: 128 bytes]   8 sub-blocks of 32:
//   w = (d * (ls - 32)) * level[nibble], ls = nibble s % 2 of scales_l[s / 2] | bits 2s, 2s+1 of
//   scales_h << 4; sub-block s's nibbles as Q4_0's in qs[16s .. 16s + 15].
__device__ __forceinline__ void gb_decode_iq4_xs(const unsigned char* b, int s, float (&w)[32]) {
    const int ls = ((b[4 + (s >> 1)] >> (4 * (s & 1))) & 15) | (((int)(gb_u16(b + 2) >> (2 * s)) & 3) << 4);
    const float dl = gb_f16_at(b) * (float)(ls - 32);
    const unsigned char* qs = b + 8 + 16 * s;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        w[j] = dl * (float)gb_iq4_level(qs[j] & 15);
        w[j + 16] = dl * (float)gb_iq4_level(qs[j] >> 4);
    }
}

// MXFP4's 16 levels (quants.MXFP4_LEVELS, ggml's kvalues_mxfp4: the e2m1 values doubled): 0, 1, 2, 3,
// 4, 6, 8, 12, then the same negated (8: -0, as 0)
#define GB_MXFP4_LO 0x0C08060403020100ULL
#define GB_MXFP4_HI 0xF4F8FAFCFDFEFF00ULL
__device__ __forceinline__ int gb_mxfp4_level(int i) { return gb_level16(GB_MXFP4_LO, GB_MXFP4_HI, i); }

// An e8m0 exponent byte -> 2^(e - 127) / 2, the half undoing the levels' doubling (quants.e8m0_half,
// ggml_e8m0_to_fp32_half): e < 2 the subnormals 2^-128, 2^-127; e = 255 2^127 (the OCP spec's NaN byte,
// which no quantizer of finite weights writes: theirs stop at 252).
__device__ __forceinline__ float gb_e8m0_half(unsigned e) {
    return gb_bits_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// MXFP4 (17 bytes, so a block at any byte offset): [e: e8m0][qs: 16 bytes, nibbles as Q4_0's]
//   w = e8m0_half(e) * level[nibble]: a power of two times an integer, exact -- or, from 2^128 (e >= 253
//   and |level| >= 2^(256 - e)), the inf the reference's float product rounds to as well
__device__ __forceinline__ void gb_decode_mxfp4(const unsigned char* b, float (&w)[32]) {
    const float d = gb_e8m0_half(b[0]);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        w[j] = d * (float)gb_mxfp4_level(b[1 + j] & 15);
        w[j + 16] = d * (float)gb_mxfp4_level(b[1 + j] >> 4);
    }
}

// --- one entry point for every type ------------------------------------------------------------
// Chunk c (values 32c..32c+31) of a row of type QT; the row must hold at least 32(c+1) values.
template <int QT> __device__ __forceinline__ void gb_decode_chunk(const unsigned char* row, int c, float (&w)[32]);
template <> __device__ __forceinline__ void gb_decode_chunk<GB_F32>(const unsigned char* r, int c, float (&w)[32]) { gb_decode_float_chunk<GB_F32>(r, c, w); }
template <> __device__ __forceinline__ void gb_decode_chunk<GB_F16>(const unsigned char* r, int c, float (&w)[32]) { gb_decode_float_chunk<GB_F16>(r, c, w); }
template <> __device__ __forceinline__ void gb_decode_chunk<GB_BF16>(const unsigned char* r, int c, float (&w)[32]) { gb_decode_float_chunk<GB_BF16>(r, c, w); }
template <> __device__ __forceinline__ void gb_decode_chunk<GB_Q8_0>(const unsigned char* r, int c, float (&w)[32]) { gb_decode_q8_0(r + (long long)c * 34, w); }
template <> __device__ __forceinline__ void gb_decode_chunk<GB_Q4_0>(const unsigned char* r, int c, float (&w)[32]) { gb_decode_q4_0(r + (long long)c * 18, w); }
template <> __device__ __forceinline__ void gb_decode_chunk<GB_Q4_1>(const unsigned char* r, int c, float (&w)[32]) { gb_decode_q4_1(r + (long long)c * 20, w); }
template <> __device__ __forceinline__ void gb_decode_chunk<GB_Q5_0>(const unsigned char* r, int c, float (&w)[32]) { gb_decode_q5_0(r + (long long)c * 22, w); }
template <> __device__ __forceinline__ void gb_decode_chunk<GB_Q5_1>(const unsigned char* r, int c, float (&w)[32]) { gb_decode_q5_1(r + (long long)c * 24, w); }
template <> __device__ __forceinline__ void gb_decode_chunk<GB_Q4_K>(const unsigned char* r, int c, float (&w)[32]) { gb_decode_q4_k(r + (long long)(c >> 3) * 144, c & 7, w); }
template <> __device__ __forceinline__ void gb_decode_chunk<GB_Q5_K>(const unsigned char* r, int c, float (&w)[32]) { gb_decode_q5_k(r + (long long)(c >> 3) * 176, c & 7, w); }
template <> __device__ __forceinline__ void gb_decode_chunk<GB_Q6_K>(const unsigned char* r, int c, float (&w)[32]) { gb_decode_q6_k(r + (long long)(c >> 3) * 210, c & 7, w); }
template <> __device__ __forceinline__ void gb_decode_chunk<GB_Q2_K>(const unsigned char* r, int c, float (&w)[32]) { gb_decode_q2_k(r + (long long)(c >> 3) * 84, c & 7, w); }
template <> __device__ __forceinline__ void gb_decode_chunk<GB_Q3_K>(const unsigned char* r, int c, float (&w)[32]) { gb_decode_q3_k(r + (long long)(c >> 3) * 110, c & 7, w); }
template <> __device__ __forceinline__ void gb_decode_chunk<GB_IQ4_NL>(const unsigned char* r, int c, float (&w)[32]) { gb_decode_iq4_nl(r + (long long)c * 18, w); }
template <> __device__ __forceinline__ void gb_decode_chunk<GB_IQ4_XS>(const unsigned char* r, int c, float (&w)[32]) { gb_decode_iq4_xs(r + (long long)(c >> 3) * 136, c & 7, w); }
template <> __device__ __forceinline__ void gb_decode_chunk<GB_MXFP4>(const unsigned char* r, int c, float (&w)[32]) { gb_decode_mxfp4(r + (long long)c * 17, w); }
