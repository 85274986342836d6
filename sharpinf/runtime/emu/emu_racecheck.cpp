/* Shared memory checks: per-block poisoning, racecheck and initcheck.

   Poisoning: the dynamic buffer is filled with 0xFF (NaN) before each block (emu_sched.cpp,
   always); under the checks a static __shared__ array is registered by the statement the build
   adds after its declaration (source.py, cuda_emu.h's SHARPINF_EMU_SMEM) and filled with 0xFF
   the first time a thread of a block passes that declaration -- before any thread of the block
   can touch it. So a checked block never sees the previous block's values (a GPU gives no
   guarantee either way).

   Racecheck and initcheck (LaunchCfg.check; the kernel module compiled with -fsanitize=thread,
   see build.py): g++ calls __tsan_{read,write}N(address) before every memory access of the
   kernel's code. Accesses outside this block's shared arrays return at once;
   inside, a shadow record per byte keeps the last write and up to two reads of the current
   barrier interval (the span between two __syncthreads; keep_reader says which two), with the thread, its warp's
   __syncwarp count and the code address. Then, as compute-sanitizer's racecheck defines a
   hazard, two accesses to one byte by different threads in one interval, at least one a
   write, are a read-after-write, write-after-write or write-after-read hazard -- unless both
   threads are lanes of one warp and a __syncwarp that both joined came between (the CUDA
   programming guide: __syncwarp orders memory among its lanes; shuffles and votes exchange
   registers and order nothing). Initcheck: a read of a byte no thread of this block wrote.
   The first finding ends the block as __trap() does, with a message naming the kernel,
   block, array (and where it is declared), byte offset and element, both threads and both
   code addresses (module.py turns those into file:line).

   Atomics are not instrumented (cuda_emu_atomic.h): they neither race with each other nor
   count as writes; a plain access racing with an atomic goes unseen. memcpy and memset calls
   into the C library are seen as ranges where g++ instruments the call (__tsan_*_range). Racecheck runs a launch's blocks on one OS thread.
*/
#include "emu_racecheck.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <memory>
#include <vector>

namespace sharpinf_emu {

enum : int { CHECK_RACE = 1, CHECK_INIT = 2 };

// One byte's history in the current block (see the header comment).
struct Shadow {
    uint32_t init;       // serial of the block that last wrote it (initialised iff == the current one)
    uint32_t w_iv;       // interval of the last write
    uint32_t r_iv;       // interval of the reads recorded in r_*
    uint16_t w_lin;      // the writer
    uint16_t r_lin[2];   // up to two distinct readers of interval r_iv
    uint32_t w_ws;       // the writer's warp's __syncwarp count at the write
    uint32_t r_ws[2];
    uint8_t nr;          // readers recorded
    const void* w_pc;    // code addresses, for the report
    const void* r_pc[2];
};

// A shared array of this block: [lo, lo + bytes), its shadow, what to call it.
struct Range {
    uintptr_t lo;
    size_t bytes, elem;
    const char* name;
    const char* file;
    int line;
    Shadow* shadow;
};

// Static arrays keep their address for the life of the OS thread (thread_local), so their
// poisoning record and shadow are kept per address.
struct StaticArray {
    uintptr_t lo;
    size_t bytes;
    uint64_t poisoned_in;  // block serial
    std::unique_ptr<Shadow[]> shadow;
};

struct PerThread {
    uint64_t serial = 0;  // blocks run by this OS thread, the current one included
    std::vector<StaticArray> statics;
};
static thread_local PerThread pt;

// The checker's state while a checked launch runs: one OS thread runs its blocks, or, in a
// cooperative launch, one OS thread each block (so the state is per OS thread).
struct Check {
    int bits = 0;
    pthread_t owner;              // the OS thread running the launch (others' accesses are not this launch's)
    uint32_t serial = 0, iv = 0;  // the block's serial and its current interval
    std::vector<Range> ranges;    // this block's shared arrays
    uintptr_t lo = 0, hi = 0;     // their hull: most accesses fail this test and return
    std::vector<Shadow> dyn_shadow;
    const char* dyn_name = nullptr;
    std::vector<uint32_t> ws;     // per warp: __syncwarp count in this block
    std::vector<unsigned> ws_ring;  // per warp: the lanes of its last 32 __syncwarps
};
static thread_local Check g_check;
static __thread Check* g_on = nullptr;  // non-null inside a checked block

static void add_range(Check& c, uintptr_t lo, size_t bytes, size_t elem, const char* name, const char* file, int line,
                      Shadow* sh) {
    c.ranges.push_back(Range{lo, bytes, elem, name, file, line, sh});
    if (c.ranges.size() == 1 || lo < c.lo) c.lo = lo;
    if (c.ranges.size() == 1 || lo + bytes > c.hi) c.hi = lo + bytes;
}

void rc_block_begin(const LaunchCfg& cfg, unsigned char* dyn) {
    ++pt.serial;
    if (!cfg.check) return;  // g_check is this OS thread's (run_grid holds the checked launches' lock)
    Check& c = g_check;
    c.bits = cfg.check;
    c.owner = pthread_self();
    size_t dyn_bytes = cfg.shared;
    c.serial = (uint32_t)pt.serial;
    ++c.iv;
    c.ranges.clear();
    c.dyn_name = nullptr;
    if (dyn_bytes) {
        if (c.dyn_shadow.size() < dyn_bytes) c.dyn_shadow.assign(dyn_bytes, Shadow{});
        add_range(c, (uintptr_t)dyn, dyn_bytes, 1, nullptr, nullptr, 0, c.dyn_shadow.data());
    }
    c.ws.clear();
    c.ws_ring.clear();
    g_on = &c;
}

// The checked launch's state if this OS thread runs it, else null (another thread may run
// unchecked launches meanwhile).
static inline Check* mine() {
    Check* c = g_on;
    return c && pthread_equal(c->owner, pthread_self()) ? c : nullptr;
}

void rc_block_end() {
    if (mine()) g_on = nullptr;
}

void rc_barrier() {
    if (Check* c = mine()) ++c->iv;
}

void rc_syncwarp(int warp, unsigned lanes) {
    Check* c = mine();
    if (!c) return;
    if ((int)c->ws.size() <= warp) {
        c->ws.resize(warp + 1, 0);
        c->ws_ring.resize(32 * (warp + 1), 0);
    }
    uint32_t n = ++c->ws[warp];
    c->ws_ring[32 * warp + (n & 31)] = lanes;
}

static uint32_t ws_now(const Check& c, int lin) {
    int w = lin >> 5;
    return w < (int)c.ws.size() ? c.ws[w] : 0;
}

// Whether an access by `earlier` (when its warp had done `then` __syncwarps) happens before
// an access by `now` in the same interval: the same thread, or lanes of one warp with a
// __syncwarp both joined in between.
static bool ordered(const Check& c, int earlier, uint32_t then, int now) {
    if (earlier == now) return true;
    int w = now >> 5;
    if ((earlier >> 5) != w) return false;
    uint32_t cur = ws_now(c, now);
    if (cur - then > 32) return true;  // older than the ring: long since synchronised
    unsigned both = (1u << (earlier & 31)) | (1u << (now & 31));
    for (uint32_t g = cur; g != then; --g)
        if ((c.ws_ring[32 * w + (g & 31)] & both) == both) return true;
    return false;
}

static std::string where_code(const void* pc) {
    // "<module>+0xOFF": module.py symbolizes it into file:line (addr2line on the module)
    Dl_info info;
    char s[600];
    if (pc && dladdr(pc, &info) && info.dli_fname)
        snprintf(s, sizeof s, "[[pc:%s+0x%lx]]", info.dli_fname, (unsigned long)((uintptr_t)pc - (uintptr_t)info.dli_fbase));
    else
        snprintf(s, sizeof s, "code %p", pc);
    return s;
}

static std::string array_label(const Range& r, size_t off) {
    char s[400];
    if (r.name && r.file) {
        const char* base = strrchr(r.file, '/');
        snprintf(s, sizeof s, "shared array `%s` (declared at %s:%d), byte %zu (element %zu of %zu bytes)", r.name,
                 base ? base + 1 : r.file, r.line, off, off / r.elem, r.elem);
    }
    else
        snprintf(s, sizeof s, "dynamic shared memory `%s`, byte %zu", g_check.dyn_name ? g_check.dyn_name : "extern __shared__",
                 off);
    return s;
}

[[noreturn]] static void report(const char* what, const Range& r, size_t off, int lin, bool write, const void* pc,
                                int other, bool other_write, const void* other_pc) {
    std::string m = std::string(what) + ": " + array_label(r, off) + ": thread " + thread_label(lin) +
                    (write ? " wrote" : " read") + " at " + where_code(pc);
    if (other >= 0)
        m += "; thread " + thread_label(other) + (other_write ? " wrote" : " read") + " it at " + where_code(other_pc) +
             " in the same barrier interval, with no __syncthreads (or __syncwarp of both lanes) between";
    else
        m += ", but no thread of this block had written it";
    fail_running_block(m);
}

// Which two readers of an interval a byte keeps, so that a later write finds an unordered one
// whatever order the readers came in: a lane's latest read (a __syncwarp that orders it orders its
// earlier ones), and a reader of another warp in place of the second of one warp's two (with readers
// of two warps kept, any writer is in another warp than one of them). Left to order: a third reader
// of the same warp when both kept ones were ordered before the write by a __syncwarp it did not join.
static void keep_reader(Shadow& s, int lin, uint32_t ws, const void* pc) {
    int slot = -1;
    for (int i = 0; i < s.nr; ++i)
        if (s.r_lin[i] == lin) slot = i;
    if (slot < 0 && s.nr < 2) slot = s.nr++;
    if (slot < 0 && (s.r_lin[0] >> 5) == (s.r_lin[1] >> 5) && (lin >> 5) != (s.r_lin[0] >> 5)) slot = 1;
    if (slot < 0) return;
    s.r_lin[slot] = (uint16_t)lin, s.r_ws[slot] = ws, s.r_pc[slot] = pc;
}

__attribute__((noinline)) static void access(Check& c, uintptr_t a, size_t n, bool write, const void* pc) {
    for (const Range& r : c.ranges) {
        if (a + n <= r.lo || a >= r.lo + r.bytes) continue;
        int lin = running_thread();
        uint32_t ws = ws_now(c, lin);
        size_t first = a < r.lo ? 0 : a - r.lo, last = a + n - r.lo > r.bytes ? r.bytes : a + n - r.lo;
        for (size_t off = first; off < last; ++off) {
            Shadow& s = r.shadow[off];
            bool fresh_w = s.w_iv == c.iv;
            if (!write) {
                if ((c.bits & CHECK_INIT) && s.init != c.serial) report("initcheck: uninitialised read", r, off, lin, false, pc, -1, false, nullptr);
                if ((c.bits & CHECK_RACE) && fresh_w && !ordered(c, s.w_lin, s.w_ws, lin))
                    report("racecheck: read-after-write hazard", r, off, lin, false, pc, s.w_lin, true, s.w_pc);
                if (s.r_iv != c.iv) s.r_iv = c.iv, s.nr = 0;
                keep_reader(s, lin, ws, pc);
                continue;
            }
            if (c.bits & CHECK_RACE) {
                if (fresh_w && !ordered(c, s.w_lin, s.w_ws, lin))
                    report("racecheck: write-after-write hazard", r, off, lin, true, pc, s.w_lin, true, s.w_pc);
                if (s.r_iv == c.iv)
                    for (int i = 0; i < s.nr; ++i)
                        if (!ordered(c, s.r_lin[i], s.r_ws[i], lin))
                            report("racecheck: write-after-read hazard", r, off, lin, true, pc, s.r_lin[i], false, s.r_pc[i]);
            }
            s.w_iv = c.iv, s.w_lin = (uint16_t)lin, s.w_ws = ws, s.w_pc = pc;
            s.init = c.serial;
        }
    }
}

static inline void check(uintptr_t a, size_t n, bool write, const void* pc) {
    Check* c = g_on;
    if (__builtin_expect(c == nullptr, 1) || a >= c->hi || a + n <= c->lo || !pthread_equal(c->owner, pthread_self()))
        return;
    access(*c, a, n, write, pc);
}

// ---- registration of shared arrays (the statements source.py adds) ----------------------------
void smem_static(void* p, size_t bytes, size_t elem, const char* name, const char* file, int line) {
    uintptr_t lo = (uintptr_t)p;
    StaticArray* a = nullptr;
    for (StaticArray& s : pt.statics)
        if (s.lo == lo && s.bytes == bytes) { a = &s; break; }
    if (!a) {
        pt.statics.push_back(StaticArray{lo, bytes, 0, nullptr});
        a = &pt.statics.back();
    }
    if (a->poisoned_in == pt.serial) return;  // an earlier thread of this block got here first
    a->poisoned_in = pt.serial;
    memset(p, 0xFF, bytes);  // NaN poison, per block
    Check* c = mine();
    if (!c) return;
    if (!a->shadow) a->shadow.reset(new Shadow[bytes]());
    add_range(*c, lo, bytes, elem ? elem : 1, name, file, line, a->shadow.get());
}

void smem_dyn_name(const char* name) {
    if (Check* c = mine()) c->dyn_name = name;
}

}  // namespace sharpinf_emu

// ---- the hooks g++ calls in a -fsanitize=thread build -------------------------------------------
// ThreadSanitizer's interface as g++ emits it; its runtime is never linked (build.py), these are.
#define RC_PC __builtin_return_address(0)
#define RC_HOOKS(n)                                                                                          \
    extern "C" SHARPINF_EMU_API void __tsan_read##n(void* a) { sharpinf_emu::check((uintptr_t)a, n, false, RC_PC); } \
    extern "C" SHARPINF_EMU_API void __tsan_write##n(void* a) { sharpinf_emu::check((uintptr_t)a, n, true, RC_PC); } \
    extern "C" SHARPINF_EMU_API void __tsan_unaligned_read##n(void* a) { sharpinf_emu::check((uintptr_t)a, n, false, RC_PC); } \
    extern "C" SHARPINF_EMU_API void __tsan_unaligned_write##n(void* a) { sharpinf_emu::check((uintptr_t)a, n, true, RC_PC); }
RC_HOOKS(1)
RC_HOOKS(2)
RC_HOOKS(4)
RC_HOOKS(8)
RC_HOOKS(16)
extern "C" SHARPINF_EMU_API void __tsan_read_range(void* a, size_t n) { sharpinf_emu::check((uintptr_t)a, n, false, RC_PC); }
extern "C" SHARPINF_EMU_API void __tsan_write_range(void* a, size_t n) { sharpinf_emu::check((uintptr_t)a, n, true, RC_PC); }
// The module constructor's call, function entry/exit (off by --param, kept for other g++ versions),
// C++ vtable pointers: nothing to record. Fences (__threadfence) stay real fences.
extern "C" SHARPINF_EMU_API void __tsan_init() {}
extern "C" SHARPINF_EMU_API void __tsan_func_entry(void*) {}
extern "C" SHARPINF_EMU_API void __tsan_func_exit() {}
extern "C" SHARPINF_EMU_API void __tsan_vptr_update(void**, void*) {}
extern "C" SHARPINF_EMU_API void __tsan_vptr_read(void**) {}
extern "C" SHARPINF_EMU_API void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
extern "C" SHARPINF_EMU_API void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
