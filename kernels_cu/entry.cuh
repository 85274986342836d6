// entry.cuh -- how a kernel file declares its entry points: SHARPINF_ENTRY / SHARPINF_ENTRY_ATTRS (one
// `extern "C" __global__` entry, compiled only when wanted: SHARPINF_WANT), the families that make many
// from one line (SHARPINF_KV_HD_ENTRIES: every KV dtype x head_dim), the statement every entry starts
// with (SHARPINF_PDL_AT_ENTRY, pdl.cuh), and SHARPINF_SHARED_FN for a function several entries call.
#pragma once
#include "pdl.cuh"

// SHARPINF_SHARED_FN: a device function that more than one kernel of a file calls (attention_split.cu's
// split and walk entries): on the emulator one function a template instance, which g++ compiles once
// instead of into every caller (the module builds faster); on a GPU inlined, as __forceinline__.
// Inlining changes no result: the function's arithmetic is its own either way.
#ifdef SHARPINF_EMU
#define SHARPINF_SHARED_FN __device__ __noinline__
#else
#define SHARPINF_SHARED_FN __device__ __forceinline__
#endif

// --- entry-point selection ----------------------------------------------------------
// A backend may compile a file for only the entry points a model uses (the GPU backend
// does, at ForwardPass construction: compiling every weight type's matmul takes seconds).
// It then defines SHARPINF_SELECT, and SHARPINF_WANT_<p>=1 for each requested entry name and
// each of its '_'-prefixes: attention_f16_d64 -> attention_f16_d64, attention_f16, attention.
// A file wraps groups of entries in #if SHARPINF_WANT(group). Without SHARPINF_SELECT (the
// emulator, the NVRTC compile check) every entry point is compiled.
#ifdef SHARPINF_SELECT
#define SHARPINF_WANT(group) (SHARPINF_WANT_##group + 0)
#else
#define SHARPINF_WANT(group) 1
#endif

// --- entry-point families ------------------------------------------------------------
// SHARPINF_ENTRY(name, (params), body...) defines `extern "C" __global__ void name params { body; }`
// when name is wanted (as SHARPINF_WANT above; a macro cannot hold an #if, so the test is done
// by the preprocessor's pasting: SHARPINF_WANT_<name> defined as 1 selects the definition). The
// families below give one entry per KV dtype x head_dim or per weight type from one line; the
// emulator finds entries in the preprocessed source, so families need no list anywhere else.
#define SHARPINF_CAT(a, b) SHARPINF_CAT_(a, b)
#define SHARPINF_CAT_(a, b) a##b
#define SHARPINF_SECOND(a, b, ...) b
#define SHARPINF_SECOND_(...) SHARPINF_SECOND(__VA_ARGS__)
#define SHARPINF_IS_1 ~, 1
#define SHARPINF_IF_1(...) __VA_ARGS__
#define SHARPINF_IF_0(...)
#ifdef SHARPINF_SELECT
#define SHARPINF_WANTED(name) SHARPINF_SECOND_(SHARPINF_CAT(SHARPINF_IS_, SHARPINF_WANT_##name), 0, ~)
#else
#define SHARPINF_WANTED(name) 1
#endif
#define SHARPINF_ENTRY(name, params, ...) SHARPINF_ENTRY_ATTRS(name, , params, __VA_ARGS__)
// ... with attributes before the name (e.g. __launch_bounds__(128, 1))
#define SHARPINF_ENTRY_ATTRS(name, attrs, params, ...)                                        \
    SHARPINF_CAT(SHARPINF_IF_, SHARPINF_WANTED(name))(extern "C" __global__ void attrs name params { \
        SHARPINF_PDL_AT_ENTRY();                                                                   \
        __VA_ARGS__;                                                                               \
    })
// an entry's first statement (programmatic dependent launch, pdl.cuh): trigger and wait. A file whose
// entries wait in their body, after their prefetches, redefines it as sharpinf_pdl_trigger before
// them (the preprocessor expands it where an entry is written, with the definition in force there).
#define SHARPINF_PDL_AT_ENTRY sharpinf_pdl_enter

// name_<kv>_d<hd> for KV f32/f16/bf16 x head_dim 16..256 (TYPED<HD, T>(call...)) and q8_0 x 32..256
// (Q8<HD>(call...)): the attention kernels' 20 entries; ATTRS(hd) gives each entry's attributes
// (SHARPINF_NO_ATTRS: none).
#define SHARPINF_NO_ATTRS(hd)
#define SHARPINF_KV_HD_ENTRY(name, kv, hd, ATTRS, params, ...) \
    SHARPINF_ENTRY_ATTRS(name##_##kv##_d##hd, ATTRS(hd), params, __VA_ARGS__)
#define SHARPINF_HD_FAMILY(name, kv, T, ATTRS, params, TYPED, ...)                          \
    SHARPINF_KV_HD_ENTRY(name, kv, 16, ATTRS, params, TYPED<16, T>(__VA_ARGS__))            \
    SHARPINF_KV_HD_ENTRY(name, kv, 32, ATTRS, params, TYPED<32, T>(__VA_ARGS__))            \
    SHARPINF_KV_HD_ENTRY(name, kv, 64, ATTRS, params, TYPED<64, T>(__VA_ARGS__))            \
    SHARPINF_KV_HD_ENTRY(name, kv, 128, ATTRS, params, TYPED<128, T>(__VA_ARGS__))          \
    SHARPINF_KV_HD_ENTRY(name, kv, 256, ATTRS, params, TYPED<256, T>(__VA_ARGS__))
#define SHARPINF_KV_HD_ENTRIES(name, ATTRS, params, TYPED, Q8, ...)                          \
    SHARPINF_HD_FAMILY(name, f32, float, ATTRS, params, TYPED, __VA_ARGS__)                 \
    SHARPINF_HD_FAMILY(name, f16, __half, ATTRS, params, TYPED, __VA_ARGS__)                \
    SHARPINF_HD_FAMILY(name, bf16, __nv_bfloat16, ATTRS, params, TYPED, __VA_ARGS__)        \
    SHARPINF_KV_HD_ENTRY(name, q8_0, 32, ATTRS, params, Q8<32>(__VA_ARGS__))                \
    SHARPINF_KV_HD_ENTRY(name, q8_0, 64, ATTRS, params, Q8<64>(__VA_ARGS__))                \
    SHARPINF_KV_HD_ENTRY(name, q8_0, 128, ATTRS, params, Q8<128>(__VA_ARGS__))              \
    SHARPINF_KV_HD_ENTRY(name, q8_0, 256, ATTRS, params, Q8<256>(__VA_ARGS__))
