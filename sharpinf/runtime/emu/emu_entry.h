/* Entry-point glue, included by the generated trailer of each kernel module.
   make_entry deduces a kernel's parameter types from its function pointer,
   so Python can ask for the parameter list (kind + byte width) and launch
   with one packed argument buffer (each argument at an 8-aligned offset). */
#pragma once
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace sharpinf_emu {

// p pointer, i signed int, u unsigned int, f float, b bool, h __half,
// B __nv_bfloat16, s other (struct passed by value).
template <class T>
constexpr char kind_of() {
    if (std::is_pointer<T>::value) return 'p';
    if (std::is_same<T, bool>::value) return 'b';
    if (std::is_same<T, __half>::value) return 'h';
    if (std::is_same<T, __nv_bfloat16>::value) return 'B';
    if (std::is_floating_point<T>::value) return 'f';
    if (std::is_integral<T>::value) return std::is_signed<T>::value ? 'i' : 'u';
    return 's';
}

constexpr size_t slot(size_t n) { return (n + 7) & ~(size_t)7; }

struct Entry {
    const char* name;
    std::string sig;  // "p8,i4,f4"
    int (*launch)(void* fn, const LaunchCfg& cfg, const unsigned char* args, char* err, size_t errlen);
    void* fn;
};

template <auto K, class... A>
struct Launcher {
    struct Ctx {
        std::tuple<A...> args;
    };
    template <size_t... I>
    static void unpack(std::tuple<A...>& t, const unsigned char* buf, std::index_sequence<I...>) {
        size_t off = 0;
        ((memcpy((void*)&std::get<I>(t), buf + off, sizeof(A)), off += slot(sizeof(A))), ...);
        (void)buf;
        (void)off;
    }
    static void call(void* c) {
        // K is a compile-time constant, so the kernel body inlines here.
        std::apply(K, static_cast<Ctx*>(c)->args);
    }
    // args: the packed argument buffer, pointer slots holding data pointers
    static int launch(void* fn, const LaunchCfg& cfg, const unsigned char* args, char* err, size_t errlen) {
        (void)fn;
        Ctx ctx{};
        unpack(ctx.args, args, std::index_sequence_for<A...>{});
        return run_grid(cfg, &Launcher::call, &ctx, err, errlen);
    }
    static std::string sig() {
        std::string s;
        ((s += std::string(s.empty() ? "" : ",") + kind_of<A>() + std::to_string(sizeof(A))), ...);
        return s;
    }
};

template <auto K, class... A>
Entry make_entry_for(const char* name, void (*)(A...)) {
    return Entry{name, Launcher<K, A...>::sig(), &Launcher<K, A...>::launch, reinterpret_cast<void*>(K)};
}
// make_entry<&kernel>("kernel"): the parameter types are deduced from &kernel.
template <auto K>
Entry make_entry(const char* name) {
    return make_entry_for<K>(name, K);
}

}  // namespace sharpinf_emu

// The trailer lists the entries then expands SHARPINF_EMU_EXPORTS, which
// defines the module's C API (the only symbols a kernel .so exports).
#define SHARPINF_EMU_EXPORTS(entries)                                                            \
    extern "C" __attribute__((visibility("default"))) int sharpinf_emu_count() {                 \
        return (int)(sizeof(entries) / sizeof(entries[0]));                                      \
    }                                                                                            \
    extern "C" __attribute__((visibility("default"))) const char* sharpinf_emu_name(int i) {     \
        return entries[i].name;                                                                  \
    }                                                                                            \
    extern "C" __attribute__((visibility("default"))) const char* sharpinf_emu_sig(int i) {      \
        return entries[i].sig.c_str();                                                           \
    }                                                                                            \
    extern "C" __attribute__((visibility("default"))) int sharpinf_emu_launch(                   \
        int i, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,     \
        unsigned long long shared, const void* args, int order, int strict, int workers,         \
        unsigned long long seed, char* err, int errlen, int memcheck, const void* guards,        \
        int nguards, unsigned long long* fault, int check, int coop) {                           \
        ::sharpinf_emu::LaunchCfg c{{gx, gy, gz}, {bx, by, bz}, (size_t)shared, order, strict,   \
                                    workers, seed, entries[i].name, memcheck,                    \
                                    (const uint64_t*)guards, nguards, (uint64_t*)fault, check,   \
                                    coop};                                                       \
        return entries[i].launch(entries[i].fn, c, (const unsigned char*)args, err, (size_t)errlen); \
    }
