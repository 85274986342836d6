/* Stand-ins for CUDA device-only math: fast float intrinsics, bit casts,
   integer intrinsics, __ldg, and the __half/__nv_bfloat16 math that
   cuda_fp16.h/cuda_bf16.h only declare for the device (computed in float,
   rounded once, which is what the hardware does for these ops). */
#pragma once

#ifndef CUDART_INF_F
#define CUDART_INF_F __builtin_huge_valf()
#endif
#ifndef CUDART_NAN_F
#define CUDART_NAN_F __builtin_nanf("")
#endif
#ifndef CUDART_INF
#define CUDART_INF __builtin_huge_val()
#endif
#ifndef CUDART_NAN
#define CUDART_NAN __builtin_nan("")
#endif

// ---- float intrinsics ---------------------------------------------------------------
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return exp10f(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float* s, float* c) { *s = sinf(x); *c = cosf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : (x == x ? x : 0.0f)); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
inline void sincospif(float x, float* s, float* c) { *s = sinf((float)M_PI * x); *c = cosf((float)M_PI * x); }
inline float normcdff(float x) { return 0.5f * erfcf(-x * (float)M_SQRT1_2); }

// ---- bit casts and conversions ----------------------------------------------------------
inline int __float_as_int(float x) { int i; memcpy(&i, &x, 4); return i; }
inline unsigned __float_as_uint(float x) { unsigned i; memcpy(&i, &x, 4); return i; }
inline float __int_as_float(int i) { float x; memcpy(&x, &i, 4); return x; }
inline float __uint_as_float(unsigned i) { float x; memcpy(&x, &i, 4); return x; }
inline long long __double_as_longlong(double x) { long long i; memcpy(&i, &x, 8); return i; }
inline double __longlong_as_double(long long i) { double x; memcpy(&x, &i, 8); return x; }
inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline int __float2int_rd(float x) { return (int)floorf(x); }
inline int __float2int_ru(float x) { return (int)ceilf(x); }
inline unsigned __float2uint_rn(float x) { return (unsigned)nearbyintf(x); }
inline unsigned __float2uint_rz(float x) { return (unsigned)x; }
inline float __int2float_rn(int i) { return (float)i; }
inline float __uint2float_rn(unsigned i) { return (float)i; }

// ---- integer intrinsics -----------------------------------------------------------------
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    return __builtin_bswap32(x);
}
inline int __mul24(int a, int b) { return a * b; }
inline unsigned __umul24(unsigned a, unsigned b) { return a * b; }
inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
    return (unsigned)((((unsigned long long)hi << 32) | lo) >> (shift & 31));
}
inline unsigned __funnelshift_rc(unsigned lo, unsigned hi, unsigned shift) {
    return (unsigned)((((unsigned long long)hi << 32) | lo) >> (shift < 32 ? shift : 32));
}
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
    for (int i = 0; i < 4; ++i) c += ((a >> (8 * i)) & 0xff) * ((b >> (8 * i)) & 0xff);
    return c;
}

// CUDA's global min/max overloads (device code calls them unqualified).
#define SHARPINF_EMU_MM(T)                                  \
    inline T min(T a, T b) { return a < b ? a : b; }        \
    inline T max(T a, T b) { return a > b ? a : b; }
SHARPINF_EMU_MM(int)
SHARPINF_EMU_MM(unsigned)
SHARPINF_EMU_MM(long long)
SHARPINF_EMU_MM(unsigned long long)
#undef SHARPINF_EMU_MM
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

template <class T>
inline T __ldg(const T* p) { return *p; }
template <class T>
inline T __ldcs(const T* p) { return *p; }
template <class T>
inline T __ldcg(const T* p) { return *p; }
template <class T>
inline void __stcs(T* p, T v) { *p = v; }
template <class T>
inline void __stcg(T* p, T v) { *p = v; }

// ---- __half / __nv_bfloat16 math (float-based) ------------------------------------------
#define SHARPINF_EMU_HMATH(H, TOF, FROMF, H2, TO2, FROM2)                                    \
    inline H __hfma(H a, H b, H c) { return FROMF(fmaf(TOF(a), TOF(b), TOF(c))); }          \
    inline H __hfma_relu(H a, H b, H c) { float r = fmaf(TOF(a), TOF(b), TOF(c)); return FROMF(r > 0.f ? r : 0.f); } \
    inline H hexp(H a) { return FROMF(expf(TOF(a))); }                                      \
    inline H hexp2(H a) { return FROMF(exp2f(TOF(a))); }                                    \
    inline H hexp10(H a) { return FROMF(exp10f(TOF(a))); }                                  \
    inline H hlog(H a) { return FROMF(logf(TOF(a))); }                                      \
    inline H hlog2(H a) { return FROMF(log2f(TOF(a))); }                                    \
    inline H hlog10(H a) { return FROMF(log10f(TOF(a))); }                                  \
    inline H hsqrt(H a) { return FROMF(sqrtf(TOF(a))); }                                    \
    inline H hrsqrt(H a) { return FROMF(1.0f / sqrtf(TOF(a))); }                            \
    inline H hrcp(H a) { return FROMF(1.0f / TOF(a)); }                                     \
    inline H hsin(H a) { return FROMF(sinf(TOF(a))); }                                      \
    inline H hcos(H a) { return FROMF(cosf(TOF(a))); }                                      \
    inline H htanh(H a) { return FROMF(tanhf(TOF(a))); }                                    \
    inline H hceil(H a) { return FROMF(ceilf(TOF(a))); }                                    \
    inline H hfloor(H a) { return FROMF(floorf(TOF(a))); }                                  \
    inline H htrunc(H a) { return FROMF(truncf(TOF(a))); }                                  \
    inline H hrint(H a) { return FROMF(rintf(TOF(a))); }                                    \
    inline H2 __hfma2(H2 a, H2 b, H2 c) {                                                   \
        float2 x = TO2(a), y = TO2(b), z = TO2(c);                                          \
        return FROM2(make_float2(fmaf(x.x, y.x, z.x), fmaf(x.y, y.y, z.y)));               \
    }                                                                                       \
    inline H2 h2exp(H2 a) { float2 x = TO2(a); return FROM2(make_float2(expf(x.x), expf(x.y))); } \
    inline H2 h2log(H2 a) { float2 x = TO2(a); return FROM2(make_float2(logf(x.x), logf(x.y))); } \
    inline H2 h2sqrt(H2 a) { float2 x = TO2(a); return FROM2(make_float2(sqrtf(x.x), sqrtf(x.y))); } \
    inline H2 h2rsqrt(H2 a) { float2 x = TO2(a); return FROM2(make_float2(1.f / sqrtf(x.x), 1.f / sqrtf(x.y))); } \
    inline H2 h2rcp(H2 a) { float2 x = TO2(a); return FROM2(make_float2(1.f / x.x, 1.f / x.y)); }

SHARPINF_EMU_HMATH(__half, __half2float, __float2half_rn, __half2, __half22float2, __float22half2_rn)
SHARPINF_EMU_HMATH(__nv_bfloat16, __bfloat162float, __float2bfloat16_rn, __nv_bfloat162,
                   __bfloat1622float2, __float22bfloat162_rn)
#undef SHARPINF_EMU_HMATH
inline int __half2int_rn(__half h) { return (int)nearbyintf(__half2float(h)); }
inline int __bfloat162int_rn(__nv_bfloat16 h) { return (int)nearbyintf(__bfloat162float(h)); }
