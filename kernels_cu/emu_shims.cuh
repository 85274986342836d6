// emu_shims.cuh -- the emulator's own helpers (compiled only with SHARPINF_EMU, the g++ build against
// cuda_emu.h): the alignment check a GPU load would fault on, and the stand-ins common.cuh's
// primitives take on the CPU. Each stand-in follows the PTX result bit for bit (a warp reduction's
// rounds, an mma's fragment layout), through one warp exchange (cuda_emu.h's sharpinf_emu_warp_share,
// the runtime's W_SHARE) instead of the 5-32 shuffles the GPU code would take.
//   SHARPINF_ASSERT_ALIGNED(p, n)     a vector load's alignment, as the GPU needs it
//   sharpinf_emu_butterfly<OP>(v)     warp_reduce_sum / _max's xor butterfly (reduce.cuh)
//   sharpinf_emu_half_bits(h)         IEEE binary16 -> float, exactly
//   sharpinf_emu_mma<F16>(...)        mma.m16n8k16 .f16 / mma.m16n8k32 .s8 (mma_frag.cuh)
//   sharpinf_emu_fma_full_tile(...)   a full tile's fma chains, interleaved (matmul.cu); on a GPU: false
#pragma once
#include "types.cuh"

#ifdef SHARPINF_EMU
// On the emulator every vector load checks the alignment the GPU's load instruction needs (a
// misaligned vector load faults on a GPU; a memcpy on the CPU would hide it), so the tests catch it.
#define SHARPINF_ASSERT_ALIGNED(p, n) \
    assert(((unsigned long long)(p) & ((n) - 1)) == 0 && "load not aligned as the GPU needs")

// The emulator's exchange helpers below touch only the runtime's exchange buffer and their own
// locals, never shared memory: kept out of the checked builds' instrumentation, which would check
// each of their hundred-odd loads and stores (a call apiece: g++ does not inline a function with
// another sanitizer attribute into instrumented code). They take and return values, not arrays.
#ifdef SHARPINF_EMU_RACECHECK
#define SHARPINF_EMU_UNCHECKED inline __attribute__((noinline, no_sanitize_thread))
#else
#define SHARPINF_EMU_UNCHECKED inline __attribute__((always_inline))
#endif
// The emulator's xor butterfly: one exchange of the 32 values (a shuffle is a rendezvous of the
// warp's 32 fibers, and a butterfly takes five), then the rounds replayed -- lane j combines its own
// value first with lane j^off's, as `v = op(v, __shfl_xor_sync(v, off))` does on the GPU, so each
// lane's result has the bits the five shuffles give. This lane's result needs, at the round of
// `off`, only the `off` lanes that agree with it above bit log2(off) (16 + 8 + 4 + 2 + 1 steps);
// the partners they read were updated in the round before, and are not written in this one.
enum { SHARPINF_EMU_ADD, SHARPINF_EMU_MAX };
template <int OP, typename T>
SHARPINF_EMU_UNCHECKED T sharpinf_emu_butterfly(T v) {
    const unsigned char* all = sharpinf_emu_warp_share(&v, sizeof v);
    const int lane = threadIdx.x & 31;
    T x[32];
    for (int l = 0; l < 32; ++l) __builtin_memcpy(&x[l], all + ::sharpinf_emu::SHARE_STRIDE * l, sizeof(T));
    for (int off = 16; off > 0; off >>= 1)
        for (int j = lane & ~(off - 1), end = j + off; j < end; ++j) {
            if constexpr (OP == SHARPINF_EMU_ADD) x[j] = x[j] + x[j ^ off];
            else x[j] = fmaxf(x[j], x[j ^ off]);
        }
    return x[lane];
}

// Bit-exact IEEE binary16 -> float, independent of what the emulator's headers offer.
__device__ __forceinline__ float sharpinf_emu_half_bits(unsigned short h) {
    const unsigned sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    float v;
    if (exp == 0) v = (float)mant * 0x1p-24f;  // subnormal: exact (a normal float)
    else if (exp == 31) v = mant ? __builtin_nanf("") : __builtin_huge_valf();
    else {  // normal: the same value, rebiased (15 -> 127) and widened (10 -> 23 mantissa bits)
        const unsigned bits = ((exp + 112u) << 23) | (mant << 13);
        __builtin_memcpy(&v, &bits, 4);
    }
    return sign ? -v : v;
}
__device__ __forceinline__ float sharpinf_emu_lo(unsigned r) { return sharpinf_emu_half_bits((unsigned short)(r & 0xffffu)); }
__device__ __forceinline__ float sharpinf_emu_hi(unsigned r) { return sharpinf_emu_half_bits((unsigned short)(r >> 16)); }

// An emulated mma.m16n8k* (both shapes share the layout by lane): one exchange of every lane's six
// fragment registers, not 32 shuffles; then A rows g, g+8 (g = lane>>2) come from lanes
// (lane & ~3) + j -- ra[j] = that lane's a[0..3] -- and B columns 2t, 2t+1 from lanes (2t+cs)*4 + j
// -- rb[cs][j] = that lane's b[0..1] (j = 0..3). Fragments and accumulators pass by value: an array
// passed by reference would be addressable in the kernel, and every later read of it checked.
template <typename Acc> struct SharpinfEmuD4 { Acc v[4]; };
template <bool F16, typename Acc>
SHARPINF_EMU_UNCHECKED SharpinfEmuD4<Acc> sharpinf_emu_mma(unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                                          unsigned b0, unsigned b1, Acc c0, Acc c1, Acc c2, Acc c3) {
    const int lane = threadIdx.x & 31, t = lane & 3;
    const unsigned mine[6] = {a0, a1, a2, a3, b0, b1};
    const unsigned char* all = sharpinf_emu_warp_share(mine, sizeof mine);
    unsigned ra[4][4], rb[2][4][2];
    for (int j = 0; j < 4; ++j) __builtin_memcpy(ra[j], all + ::sharpinf_emu::SHARE_STRIDE * ((lane & ~3) + j), 16);
    for (int cs = 0; cs < 2; ++cs)
        for (int j = 0; j < 4; ++j) __builtin_memcpy(rb[cs][j], all + ::sharpinf_emu::SHARE_STRIDE * ((2 * t + cs) * 4 + j) + 16, 8);
    const Acc c[4] = {c0, c1, c2, c3};
    SharpinfEmuD4<Acc> d;
    for (int rs = 0; rs < 2; ++rs)        // row g + 8*rs
        for (int cs = 0; cs < 2; ++cs) {  // col 2t + cs
            Acc acc = c[rs * 2 + cs];
            if constexpr (F16) {
                for (int k = 0; k < 16; ++k) {  // k = 8*kb + 2*j + half: register kb of lane j
                    const int j = (k & 7) >> 1, kb = k >> 3;
                    const unsigned ar = ra[j][rs + 2 * kb], br = rb[cs][j][kb];
                    const float av = (k & 1) ? sharpinf_emu_hi(ar) : sharpinf_emu_lo(ar);
                    const float bv = (k & 1) ? sharpinf_emu_hi(br) : sharpinf_emu_lo(br);
                    acc += av * bv;
                }
            } else {
                for (int k = 0; k < 32; ++k) {  // k = 16*kh + 4*j + e: register kh of lane j, byte e
                    const int kh = k >> 4, j = (k >> 2) & 3, e = k & 3;
                    const signed char av = (signed char)(ra[j][rs + 2 * kh] >> (8 * e));
                    const signed char bv = (signed char)(rb[cs][j][kh] >> (8 * e));
                    acc += (int)av * (int)bv;
                }
            }
            d.v[rs * 2 + cs] = acc;
        }
    return d;
}
#endif

// sharpinf_emu_fma_full_tile(acc, w, x, stride, nt): on the emulator, for a full tile (nt == T), each of
// the T tokens' chains acc[t] = fma(w[31], x_t[31], ... fma(w[0], x_t[0], acc[t])), x_t = x + t * stride,
// run with the T chains interleaved so the CPU overlaps them -- every token's fmas in the same order
// (gb_fma's __builtin_fmaf), so the same bits -- and true. Elsewhere (a partial tile; always on a GPU)
// false: the caller runs its own loop. matmul.cu's emulator speed path.
template <int T>
__device__ __forceinline__ bool sharpinf_emu_fma_full_tile(float (&acc)[T], const float (&w)[32], const float* x,
                                                           int stride, int nt) {
#ifdef SHARPINF_EMU
    if (nt != T) return false;
    float a[T];
    for (int t = 0; t < T; ++t) a[t] = acc[t];
    for (int e = 0; e < 32; ++e)
        for (int t = 0; t < T; ++t) a[t] = __builtin_fmaf(w[e], x[(long long)t * stride + e], a[t]);
    for (int t = 0; t < T; ++t) acc[t] = a[t];
    return true;
#else
    (void)acc, (void)w, (void)x, (void)stride, (void)nt;
    return false;
#endif
}
