/* CUDA atomics with exactly CUDA's overload set (so code that would not
   compile with nvcc/NVRTC, e.g. atomicMax on float, fails here too). They are
   real atomics because pool workers run blocks concurrently. In a build for the shared-memory
   checks (-fsanitize=thread, emu_racecheck.cpp) they are left uninstrumented: atomics do not
   race with each other, and they are called, not inlined, there. */
#pragma once
#ifdef SHARPINF_EMU_RACECHECK
#define SHARPINF_EMU_ATOMIC inline __attribute__((no_sanitize_thread))
#else
#define SHARPINF_EMU_ATOMIC inline
#endif

namespace sharpinf_emu {
template <class T>
SHARPINF_EMU_ATOMIC T atomic_fetch_add(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

// Floating/half adds: compare-and-swap on the bit pattern.
template <class T, class U, class F>
SHARPINF_EMU_ATOMIC T cas_update(T* p, F f) {
    static_assert(sizeof(T) == sizeof(U), "cas_update width");
    U* q = reinterpret_cast<U*>(p);
    U old = __atomic_load_n(q, __ATOMIC_RELAXED);
    for (;;) {
        T cur;
        memcpy(&cur, &old, sizeof(T));
        T nv = f(cur);
        U nu;
        memcpy(&nu, &nv, sizeof(T));
        if (__atomic_compare_exchange_n(q, &old, nu, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return cur;
    }
}
}  // namespace sharpinf_emu

#define SHARPINF_EMU_ATOMIC_INT(name, builtin)                                                    \
    SHARPINF_EMU_ATOMIC int name(int* p, int v) { return builtin(p, v, __ATOMIC_RELAXED); }                   \
    SHARPINF_EMU_ATOMIC unsigned name(unsigned* p, unsigned v) { return builtin(p, v, __ATOMIC_RELAXED); }     \
    SHARPINF_EMU_ATOMIC unsigned long long name(unsigned long long* p, unsigned long long v) {                  \
        return builtin(p, v, __ATOMIC_RELAXED);                                                   \
    }

SHARPINF_EMU_ATOMIC int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
SHARPINF_EMU_ATOMIC unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
SHARPINF_EMU_ATOMIC unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
SHARPINF_EMU_ATOMIC float atomicAdd(float* p, float v) {
    return sharpinf_emu::cas_update<float, uint32_t>(p, [v](float x) { return x + v; });
}
SHARPINF_EMU_ATOMIC double atomicAdd(double* p, double v) {
    return sharpinf_emu::cas_update<double, uint64_t>(p, [v](double x) { return x + v; });
}
SHARPINF_EMU_ATOMIC __half atomicAdd(__half* p, __half v) {
    return sharpinf_emu::cas_update<__half, uint16_t>(
        p, [v](__half x) { return __float2half(__half2float(x) + __half2float(v)); });
}
SHARPINF_EMU_ATOMIC __half2 atomicAdd(__half2* p, __half2 v) {
    return sharpinf_emu::cas_update<__half2, uint32_t>(p, [v](__half2 x) {
        return __floats2half2_rn(__low2float(x) + __low2float(v), __high2float(x) + __high2float(v));
    });
}
SHARPINF_EMU_ATOMIC __nv_bfloat16 atomicAdd(__nv_bfloat16* p, __nv_bfloat16 v) {
    return sharpinf_emu::cas_update<__nv_bfloat16, uint16_t>(
        p, [v](__nv_bfloat16 x) { return __float2bfloat16(__bfloat162float(x) + __bfloat162float(v)); });
}
SHARPINF_EMU_ATOMIC __nv_bfloat162 atomicAdd(__nv_bfloat162* p, __nv_bfloat162 v) {
    return sharpinf_emu::cas_update<__nv_bfloat162, uint32_t>(p, [v](__nv_bfloat162 x) {
        return __floats2bfloat162_rn(__low2float(x) + __low2float(v), __high2float(x) + __high2float(v));
    });
}
SHARPINF_EMU_ATOMIC int atomicSub(int* p, int v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }
SHARPINF_EMU_ATOMIC unsigned atomicSub(unsigned* p, unsigned v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }

SHARPINF_EMU_ATOMIC int atomicExch(int* p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
SHARPINF_EMU_ATOMIC unsigned atomicExch(unsigned* p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
SHARPINF_EMU_ATOMIC unsigned long long atomicExch(unsigned long long* p, unsigned long long v) {
    return __atomic_exchange_n(p, v, __ATOMIC_RELAXED);
}
SHARPINF_EMU_ATOMIC float atomicExch(float* p, float v) {
    return sharpinf_emu::cas_update<float, uint32_t>(p, [v](float) { return v; });
}

// atomicMin/Max: integer types only, as in CUDA.
#define SHARPINF_EMU_MINMAX(name, T, cmp)                                                  \
    SHARPINF_EMU_ATOMIC T name(T* p, T v) {                                                             \
        T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                      \
        while (v cmp old &&                                                                \
               !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) { \
        }                                                                                  \
        return old;                                                                        \
    }
SHARPINF_EMU_MINMAX(atomicMax, int, >)
SHARPINF_EMU_MINMAX(atomicMax, unsigned, >)
SHARPINF_EMU_MINMAX(atomicMax, long long, >)
SHARPINF_EMU_MINMAX(atomicMax, unsigned long long, >)
SHARPINF_EMU_MINMAX(atomicMin, int, <)
SHARPINF_EMU_MINMAX(atomicMin, unsigned, <)
SHARPINF_EMU_MINMAX(atomicMin, long long, <)
SHARPINF_EMU_MINMAX(atomicMin, unsigned long long, <)
#undef SHARPINF_EMU_MINMAX

SHARPINF_EMU_ATOMIC_INT(atomicAnd, __atomic_fetch_and)
SHARPINF_EMU_ATOMIC_INT(atomicOr, __atomic_fetch_or)
SHARPINF_EMU_ATOMIC_INT(atomicXor, __atomic_fetch_xor)
#undef SHARPINF_EMU_ATOMIC_INT

SHARPINF_EMU_ATOMIC unsigned atomicInc(unsigned* p, unsigned lim) {
    return sharpinf_emu::cas_update<unsigned, unsigned>(p, [lim](unsigned x) { return x >= lim ? 0u : x + 1; });
}
SHARPINF_EMU_ATOMIC unsigned atomicDec(unsigned* p, unsigned lim) {
    return sharpinf_emu::cas_update<unsigned, unsigned>(
        p, [lim](unsigned x) { return (x == 0 || x > lim) ? lim : x - 1; });
}

#define SHARPINF_EMU_CAS(T)                                                                  \
    SHARPINF_EMU_ATOMIC T atomicCAS(T* p, T cmp, T v) {                                                   \
        __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);   \
        return cmp;                                                                          \
    }
SHARPINF_EMU_CAS(int)
SHARPINF_EMU_CAS(unsigned)
SHARPINF_EMU_CAS(unsigned long long)
SHARPINF_EMU_CAS(unsigned short)
#undef SHARPINF_EMU_CAS
