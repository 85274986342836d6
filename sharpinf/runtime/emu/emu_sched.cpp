/* The block scheduler: runs a grid's blocks one after another (or on a small
   worker pool), each block's CUDA threads as fibers on one OS thread.

   A block starts in "loop mode": one fiber calls the kernel for each thread in
   turn, with no switching, which is all a barrier-free kernel ever needs. The
   first barrier or warp op ends loop mode: the blocked thread keeps the loop
   fiber's stack and the threads not yet started get fibers (pooled stacks)
   when first scheduled. Barriers and warp ops release eagerly at the last
   arrival; when no thread can run and some have not finished, that is a
   deadlock, reported with each stuck thread's op and file:line.

   Memcheck (memcheck.py): after the grid, run_grid checks the launch's guard
   bytes; in strict mode a SIGSEGV/SIGBUS in a block (an access to the PROT_NONE
   page beside a buffer) ends that block like __trap(), with a fault record
   naming the address, the access and the thread.

   Shared memory checks (emu_racecheck.cpp): each block starts a fresh poisoning and, under
   racecheck/initcheck, a fresh shadow; barriers and __syncwarp are reported to the checker.

   Cooperative launches (LaunchCfg.coop, for kernels that call sharpinf_grid_sync): every
   block of the grid is resident at once, each on its own OS thread (its own fibers, static
   and dynamic shared memory, checker state), and the blocks take turns: one block runs
   until all its threads wait at the grid barrier (or have exited), then passes the turn to
   the next block in thread order (reverse order walks the blocks backwards too). When every
   block waits, the barrier releases and the turns start again; when some wait and the others
   have exited, that is a deadlock, reported naming the blocks on each side. So a cooperative
   launch is as deterministic as any other, and a missing grid barrier shows as a wrong read.
   (Only the turns order blocks: a kernel spinning on a flag another block sets would spin for
   ever here, so cross-block waits go through sharpinf_grid_sync, never a hand-written loop.) */
#include "emu_rt.h"
#include "emu_fiber.h"
#include "emu_racecheck.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace sharpinf_emu {

__thread Tls tls;

enum St : uint8_t { S_NEW, S_READY, S_RUNNING, S_BAR, S_WARP, S_DONE };
static const int OP_BARRIER = -1, OP_GRID = -2;  // a block barrier, the grid barrier

struct EThread {
    FiberCtx ctx;
    uint3 tid;
    int lin;
    uint8_t st;
    int op;            // what it waits at (OP_BARRIER or a WarpOp)
    const char* file;
    int line;
    unsigned mask;     // warp op: participating lanes
    int arg, width;
    uint64_t val, res;
};

struct Warp {
    unsigned arrived, want, existing, exited;
};

// A strict-memcheck fault, as LaunchCfg.fault receives it: filled (1), address,
// access (0 read, 1 write, 2 unknown), block x y z, thread (linear, x y z), signal.
enum { F_FILLED, F_ADDR, F_ACCESS, F_BX, F_BY, F_BZ, F_LIN, F_TX, F_TY, F_TZ, F_SIG, F_WORDS };
struct Fault {
    uint64_t w[F_WORDS];
};

struct Grid;

struct Block {
    const LaunchCfg* cfg;
    Grid* grid;   // the cooperative launch this block belongs to, else null
    int gidx;     // its linear block index there
    bool quiet;   // failed only because another block of the grid did: report that one
    ThreadFn fn;
    void* ctx;
    int n;
    std::vector<EThread> th;
    std::vector<int> order;   // position -> linear tid
    std::vector<Warp> warps;
    std::vector<unsigned char> share;  // W_SHARE's exchange, SHARE_STRIDE x 32 bytes a warp (grown, never cleared)
    int alive, ndone, first_done, at_bar, nrun, bar_count, cursor, loop_pos;
    int bar_op;   // what the waiting threads wait at: OP_BARRIER or OP_GRID
    bool looping, failed;
    Fault fault;  // strict memcheck: set by on_fault, w[F_FILLED] = 1
    const char* bar_file;
    int bar_line;
    FiberCtx main;
    std::string err;
    std::vector<char*> stacks;  // every stack this block took from the pool
};

struct Worker {
    StackPool pool;
    Block blk;
    std::vector<unsigned char> smem;
    Worker() : pool(stack_bytes()) {}
    static size_t stack_bytes() {
        const char* e = getenv("SHARPINF_EMU_STACK_KB");
        long kb = e ? atol(e) : 64;
        return (size_t)(kb < 16 ? 16 : kb) * 1024;
    }
};

static Worker& worker() {
    static thread_local std::unique_ptr<Worker> w;
    if (!w) w.reset(new Worker());
    return *w;
}

static const char* op_name(int op) {
    switch (op) {
        case OP_BARRIER: return "__syncthreads";
        case OP_GRID: return "sharpinf_grid_sync";
        case W_SYNC: return "__syncwarp";
        case W_IDX: return "__shfl_sync";
        case W_UP: return "__shfl_up_sync";
        case W_DOWN: return "__shfl_down_sync";
        case W_XOR: return "__shfl_xor_sync";
        case W_BALLOT: return "__ballot_sync";
        case W_ALL: return "__all_sync";
        case W_ANY: return "__any_sync";
        case W_SHARE: return "warp exchange (common.cuh's mma/ldmatrix/warp reduction stand-ins)";
    }
    return "?";
}

static std::string where(const Block* b) {
    char s[256];
    snprintf(s, sizeof s, "kernel %s, block (%u,%u,%u)", b->cfg->kernel, tls.blockIdx.x,
             tls.blockIdx.y, tls.blockIdx.z);
    return s;
}

static std::string tid_str(const Block* b, int lin) {
    char s[64];
    const EThread& t = b->th[lin];
    if (b->cfg->block[1] == 1 && b->cfg->block[2] == 1)
        snprintf(s, sizeof s, "%d", lin);
    else
        snprintf(s, sizeof s, "%d (%u,%u,%u)", lin, t.tid.x, t.tid.y, t.tid.z);
    return s;
}

// Abandon the block: suspended fibers are dropped, their stacks recycled.
[[noreturn]] static void fail(Block* b, const std::string& msg) {
    b->failed = true;
    b->err = where(b) + ": " + msg;
    FiberCtx dead;
    fiber_switch(&dead, &b->main);
    abort();  // unreachable: the main context never resumes a failed block
}

static void fiber_entry(void* arg);
static void leave_loop(Block* b);

static EThread* pick(Block* b) {
    if (b->nrun == 0) return nullptr;
    int n = b->n, i = b->cursor;
    for (;;) {
        if (++i == n) i = 0;
        EThread* t = &b->th[b->order[i]];
        if (t->st == S_READY || t->st == S_NEW) {
            b->cursor = i;
            return t;
        }
    }
}

static void deadlock(Block* b) {
    // Group stuck threads by (op, file, line) and list their ids as ranges.
    std::string msg = "deadlock: no thread can make progress";
    std::vector<bool> seen(b->n, false);
    for (int i = 0; i < b->n; ++i) {
        const EThread& t = b->th[i];
        if (seen[i] || t.st == S_DONE) continue;
        std::string ids;
        int listed = 0, run_start = -1, prev = -2;
        auto flush = [&]() {
            if (run_start < 0) return;
            if (listed++) ids += ", ";
            ids += tid_str(b, run_start);
            if (prev != run_start) ids += "-" + tid_str(b, prev);
        };
        for (int j = i; j < b->n; ++j) {
            const EThread& u = b->th[j];
            if (seen[j] || u.st == S_DONE || u.op != t.op || u.line != t.line ||
                strcmp(u.file ? u.file : "", t.file ? t.file : "") != 0)
                continue;
            seen[j] = true;
            if (j != prev + 1) { flush(); run_start = j; }
            prev = j;
        }
        flush();
        char head[512];
        snprintf(head, sizeof head, "\n  thread %s waits at %s (%s:%d)", ids.c_str(), op_name(t.op),
                 t.file ? t.file : "?", t.line);
        msg += head;
        if (t.op != OP_BARRIER && t.op != OP_GRID) {
            const Warp& w = b->warps[t.lin >> 5];
            char more[160];
            snprintf(more, sizeof more, " for lanes 0x%08x of warp %d; arrived 0x%08x, exited 0x%08x",
                     w.want, t.lin >> 5, w.arrived, w.exited);
            msg += more;
        }
    }
    if (b->ndone) msg += "\n  " + std::to_string(b->ndone) + " thread(s) had exited";
    fail(b, msg);
}

// Suspend the running thread t (already marked as waiting or ready) and run
// others until t is ready again.
static void suspend(Block* b, EThread* t) {
    EThread* nx = pick(b);
    if (!nx) deadlock(b);
    b->nrun--;
    if (nx == t) {
        t->st = S_RUNNING;
        return;
    }
    if (nx->st == S_NEW) {
        char* s = worker().pool.get();
        b->stacks.push_back(s);
        fiber_init(&nx->ctx, s, worker().pool.size, fiber_entry, nx);
    }
    nx->st = S_RUNNING;
    tls.cur = nx;
    tls.threadIdx = nx->tid;
    fiber_switch(&t->ctx, &nx->ctx);
    // Whoever resumed us set our state and tls.
}

static void grid_arrive(Block* b);

static void release_barrier(Block* b) {
    if (b->bar_op == OP_GRID) grid_arrive(b);  // the whole block is there: wait for the other blocks
    rc_barrier();
    for (int i = 0; i < b->n; ++i) {
        EThread& u = b->th[i];
        if (u.st == S_BAR) {
            u.st = S_READY;
            u.res = (uint64_t)b->bar_count;
        }
    }
    b->nrun += b->at_bar;
    b->at_bar = 0;
}

static void thread_exit(Block* b, EThread* t) {
    t->st = S_DONE;
    b->alive--;
    if (b->ndone++ == 0) b->first_done = t->lin;
    b->warps[t->lin >> 5].exited |= 1u << (t->lin & 31);
    if (b->at_bar > 0) {
        if (b->cfg->strict) {
            char s[512];
            snprintf(s, sizeof s,
                     "strict: thread %s exited while other threads wait at %s (%s:%d) "
                     "(early exit before a barrier)",
                     tid_str(b, t->lin).c_str(), op_name(b->bar_op), b->bar_file, b->bar_line);
            fail(b, s);
        }
        if (b->at_bar == b->alive) release_barrier(b);
    }
}

// Loop mode keeps no per-thread state up to date (that is its speed);
// leaving it rebuilds the states: earlier positions exited, later ones new.
static void leave_loop(Block* b) {
    if (!b->looping) return;
    b->looping = false;
    int lp = b->loop_pos;
    for (int p = 0; p < b->n; ++p) {
        EThread& u = b->th[b->order[p]];
        if (p < lp) {
            u.st = S_DONE;
            b->warps[u.lin >> 5].exited |= 1u << (u.lin & 31);
        } else if (p > lp) {
            u.st = S_NEW;
        }
    }
    b->th[b->order[lp]].st = S_RUNNING;
    if (lp > 0) b->first_done = b->order[0];
    b->nrun = b->n - lp - 1;
    b->cursor = lp;
}

// Body of every fiber: run thread t, then keep this stack busy with the next
// thread to start (loop mode, or a not-yet-started thread), else switch to a
// suspended one or back to the block's caller.
static void run_on_this_fiber(Block* b, EThread* t) {
    if (b->looping) {
        ThreadFn fn = b->fn;
        void* ctx = b->ctx;
        const int* order = b->order.data();
        EThread* th = b->th.data();
        for (;;) {
            tls.cur = t;
            tls.threadIdx = t->tid;
            fn(ctx);
            if (!b->looping) break;  // t left loop mode (blocked) and has now finished
            b->alive--;
            b->ndone++;
            if (++b->loop_pos == b->n) {
                FiberCtx dead;
                fiber_switch(&dead, &b->main);
            }
            t = &th[order[b->loop_pos]];
        }
        thread_exit(b, t);
    } else {
        t->st = S_RUNNING;
        tls.cur = t;
        tls.threadIdx = t->tid;
        b->fn(b->ctx);
        thread_exit(b, t);
    }
    for (;;) {
        EThread* nx = pick(b);
        if (!nx) {
            if (b->ndone == b->n) {
                FiberCtx dead;
                fiber_switch(&dead, &b->main);
            }
            deadlock(b);
        }
        b->nrun--;
        bool fresh = nx->st == S_NEW;
        nx->st = S_RUNNING;
        tls.cur = nx;
        tls.threadIdx = nx->tid;
        if (fresh) {  // not started: run it on this stack, nothing of t is left here
            b->fn(b->ctx);
            thread_exit(b, nx);
            continue;
        }
        FiberCtx dead;
        fiber_switch(&dead, &nx->ctx);
    }
}

static void fiber_entry(void* arg) { run_on_this_fiber(tls.blk, (EThread*)arg); }

// Some threads of the block wait at __syncthreads, others at the grid barrier: on a GPU the
// grid barrier's own __syncthreads would pair with the block's and the grid would hang or race.
[[noreturn]] static void mixed_barriers(Block* b, EThread* t, const char* file, int line) {
    char s[640];
    snprintf(s, sizeof s, "threads of one barrier phase wait at %s (%s:%d) and %s (%s:%d) (thread %s)",
             op_name(b->bar_op), b->bar_file, b->bar_line, op_name(b->bar_op == OP_GRID ? OP_BARRIER : OP_GRID),
             file, line, tid_str(b, t->lin).c_str());
    fail(b, s);
}

// Thread t arrives at the block's barrier phase of kind op (a __syncthreads, or the grid barrier's block
// part): the first arrival names the phase, a thread at the other kind fails it (mixed_barriers).
static void arrive(Block* b, EThread* t, int op, const char* file, int line) {
    if (b->at_bar > 0 && b->bar_op != op) mixed_barriers(b, t, file, line);
    if (b->at_bar == 0) {
        b->bar_file = file;
        b->bar_line = line;
        b->bar_count = 0;
        b->bar_op = op;
    }
    t->st = S_BAR;
    t->op = op;
    t->file = file;
    t->line = line;
}

int sync_block(const char* file, int line, int pred) {
    Block* b = tls.blk;
    EThread* t = tls.cur;
    leave_loop(b);
    if (b->cfg->strict) {
        if (b->ndone > 0) {
            char s[512];
            snprintf(s, sizeof s,
                     "strict: __syncthreads (%s:%d) reached after thread %s exited "
                     "(early exit before a barrier)",
                     file, line, tid_str(b, b->first_done).c_str());
            fail(b, s);
        }
        if (b->at_bar > 0 && (line != b->bar_line || strcmp(file, b->bar_file) != 0)) {
            char s[640];
            snprintf(s, sizeof s,
                     "strict: threads of one barrier phase wait at different __syncthreads: "
                     "%s:%d and %s:%d (thread %s)",
                     b->bar_file, b->bar_line, file, line, tid_str(b, t->lin).c_str());
            fail(b, s);
        }
    }
    arrive(b, t, OP_BARRIER, file, line);
    b->bar_count += pred != 0;
    if (++b->at_bar == b->alive) release_barrier(b);
    suspend(b, t);
    return (int)t->res;
}

void grid_sync(const char* file, int line) {
    Block* b = tls.blk;
    EThread* t = tls.cur;
    leave_loop(b);
    if (!b->grid) {
        char s[400];
        snprintf(s, sizeof s, "sharpinf_grid_sync (%s:%d) in a launch that is not cooperative (thread %s): "
                 "launch it with cooperative=True", file, line, tid_str(b, t->lin).c_str());
        fail(b, s);
    }
    arrive(b, t, OP_GRID, file, line);
    if (++b->at_bar == b->alive) release_barrier(b);
    suspend(b, t);
}

static void complete_warp(Block* b, int w) {
    Warp& W = b->warps[w];
    EThread* lanes = &b->th[w * 32];
    unsigned arrived = W.arrived, ballot = 0, synced = 0;
    for (unsigned m = arrived; m; m &= m - 1) {
        int l = __builtin_ctz(m);
        if (lanes[l].val) ballot |= 1u << l;
        if (lanes[l].op == W_SYNC) synced |= 1u << l;
    }
    if (synced) rc_syncwarp(w, synced);  // __syncwarp orders memory among its lanes
    unsigned char* shared = nullptr;
    for (unsigned m = arrived; m; m &= m - 1) {
        int l = __builtin_ctz(m);
        if (lanes[l].op != W_SHARE) continue;
        if (!shared) {
            size_t need = b->warps.size() * 32 * SHARE_STRIDE;
            if (b->share.size() < need) b->share.resize(need);
            shared = &b->share[(size_t)w * 32 * SHARE_STRIDE];
        }
        memcpy(shared + l * SHARE_STRIDE, (const void*)(uintptr_t)lanes[l].val, (size_t)lanes[l].arg);  // 1..32: warp_op
    }
    for (unsigned m = arrived; m; m &= m - 1) {
        int l = __builtin_ctz(m);
        EThread& x = lanes[l];
        int wd = x.width, seg = l & ~(wd - 1), src = l;
        switch (x.op) {
            case W_IDX: src = seg + (x.arg & (wd - 1)); break;
            case W_UP: src = (l - seg) >= x.arg ? l - x.arg : l; break;
            case W_DOWN: src = (l - seg) + x.arg < wd ? l + x.arg : l; break;
            case W_XOR: src = l ^ x.arg; if (src >= seg + wd || src > 31) src = l; break;
        }
        switch (x.op) {
            case W_IDX: case W_UP: case W_DOWN: case W_XOR: x.res = lanes[src].val; break;
            case W_BALLOT: x.res = ballot & x.mask; break;
            case W_ALL: x.res = (ballot & x.mask & arrived) == (x.mask & arrived); break;
            case W_ANY: x.res = (ballot & x.mask) != 0; break;
            case W_SHARE: x.res = (uint64_t)(uintptr_t)shared; break;
            default: x.res = 0;
        }
        x.st = S_READY;
    }
    b->nrun += __builtin_popcount(arrived);
    W.arrived = 0;
    W.want = 0;
}

uint64_t warp_op(const char* file, int line, int op, unsigned mask, uint64_t val, int arg, int width) {
    Block* b = tls.blk;
    EThread* t = tls.cur;
    leave_loop(b);
    int w = t->lin >> 5;
    unsigned bit = 1u << (t->lin & 31);
    Warp& W = b->warps[w];
    if (width < 1 || width > 32 || (width & (width - 1))) width = 32;
    unsigned m = (mask | bit) & W.existing;
    if (b->cfg->strict) {
        if (m != W.existing || !(mask & bit)) {
            char s[512];
            snprintf(s, sizeof s,
                     "strict: partial-warp %s at %s:%d (thread %s, mask 0x%08x, warp lanes 0x%08x)",
                     op_name(op), file, line, tid_str(b, t->lin).c_str(), mask, W.existing);
            fail(b, s);
        }
        if (W.exited) {
            char s[512];
            snprintf(s, sizeof s,
                     "strict: %s at %s:%d after lanes 0x%08x of warp %d exited (thread %s)",
                     op_name(op), file, line, W.exited, w, tid_str(b, t->lin).c_str());
            fail(b, s);
        }
    }
    if (op == W_SHARE && (arg < 1 || arg > SHARE_STRIDE)) {
        char s[300];
        snprintf(s, sizeof s, "%s at %s:%d posts %d bytes: 1..%d (thread %s)", op_name(op), file, line, arg,
                 (int)SHARE_STRIDE, tid_str(b, t->lin).c_str());
        fail(b, s);
    }
    t->st = S_WARP;
    t->op = op;
    t->file = file;
    t->line = line;
    t->mask = m;
    t->val = val;
    t->arg = arg;
    t->width = width;
    W.arrived |= bit;
    W.want |= m;
    if ((W.arrived & W.want) == W.want) complete_warp(b, w);
    suspend(b, t);
    return t->res;
}

unsigned active_mask() {
    Block* b = tls.blk;
    leave_loop(b);
    const Warp& W = b->warps[tls.cur->lin >> 5];
    return W.existing & ~W.exited;
}

[[noreturn]] void fail_running_block(const std::string& msg) {
    leave_loop(tls.blk);
    fail(tls.blk, msg);
}

int running_thread() { return tls.cur->lin; }

std::string thread_label(int lin) {
    char s[48];
    snprintf(s, sizeof s, " (warp %d, lane %d)", lin >> 5, lin & 31);
    return tid_str(tls.blk, lin) + s;
}

void trap(const char* file, int line) {
    leave_loop(tls.blk);
    char s[300];
    snprintf(s, sizeof s, "__trap() at %s:%d (thread %s)", file, line,
             tid_str(tls.blk, tls.cur->lin).c_str());
    fail(tls.blk, s);
}

void assert_fail(const char* expr, const char* file, int line) {
    leave_loop(tls.blk);
    char s[600];
    snprintf(s, sizeof s, "assertion `%s` failed at %s:%d (thread %s)", expr, file, line,
             tid_str(tls.blk, tls.cur->lin).c_str());
    fail(tls.blk, s);
}

// ---- memcheck ----------------------------------------------------------------------
static const unsigned char GUARD_BYTE = 0xA5;  // memcheck.py GUARD_BYTE

static bool guards_intact(const LaunchCfg& cfg) {
    for (int i = 0; i < cfg.nguards; ++i) {
        const unsigned char* p = (const unsigned char*)cfg.guards[2 * i];
        size_t n = cfg.guards[2 * i + 1];
        unsigned char bad = 0;
        for (size_t j = 0; j < n; ++j) bad |= p[j] ^ GUARD_BYTE;  // no early exit: vectorizes
        if (bad) return false;
    }
    return true;
}

static __thread int t_catch;  // this OS thread runs blocks of a strict-memcheck launch
static struct sigaction g_old_segv, g_old_bus;

// Strict memcheck: a fault in a block ends the block as fail() does, from the
// signal handler (on the alternate stack; SA_NODEFER so nothing stays blocked
// after we switch away without returning). Kernel code holds no locks, so the
// abandoned fiber leaves nothing inconsistent; the message is built later, in
// run_block, outside the handler. Faults anywhere else go to the previous handler.
static void on_fault(int sig, siginfo_t* si, void* ucv) {
    Block* b = tls.blk;
    if (!t_catch || !b || !tls.cur) {
        sigaction(sig, sig == SIGBUS ? &g_old_bus : &g_old_segv, nullptr);
        return;  // the access faults again, under the previous handler (or the default: a crash)
    }
    uint64_t access = 2;
#if defined(__x86_64__)
    if (si->si_code == SEGV_MAPERR || si->si_code == SEGV_ACCERR)  // page faults: bit 1 of the error code is "write"
        access = (((ucontext_t*)ucv)->uc_mcontext.gregs[REG_ERR] & 2) ? 1 : 0;
#else
    (void)ucv;
#endif
    const EThread* t = tls.cur;
    b->fault = Fault{{1, (uint64_t)(uintptr_t)si->si_addr, access, tls.blockIdx.x, tls.blockIdx.y, tls.blockIdx.z,
                      (uint64_t)t->lin, t->tid.x, t->tid.y, t->tid.z, (uint64_t)sig}};
    b->failed = true;
    FiberCtx dead;
    fiber_switch(&dead, &b->main);
    abort();  // unreachable
}

static void arm_fault_handler() {
    for (int sig : {SIGSEGV, SIGBUS}) {
        struct sigaction cur;
        sigaction(sig, nullptr, &cur);
        if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_fault) continue;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_fault;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(sig, &sa, sig == SIGBUS ? &g_old_bus : &g_old_segv);
    }
}

// The handler must not run on the fiber's own 64 KiB stack; keep an existing
// alternate stack of the thread (Python's faulthandler sets one) if it is big enough.
static void ensure_altstack() {
    static __thread bool done;
    if (done) return;
    done = true;
    const size_t want = 64 * 1024;
    stack_t cur;
    if (sigaltstack(nullptr, &cur) == 0 && !(cur.ss_flags & SS_DISABLE) && cur.ss_size >= 32 * 1024) return;
    void* m = mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return;  // then the handler runs on the fiber stack
    stack_t ss;
    ss.ss_sp = m;
    ss.ss_size = want;
    ss.ss_flags = 0;
    sigaltstack(&ss, nullptr);  // kept for the thread's life (helpers are never joined)
}

// Per-launch thread layout shared by all blocks of the launch.
static void setup_block(Block* b, const LaunchCfg& cfg, ThreadFn fn, void* ctx) {
    b->cfg = &cfg;
    b->fn = fn;
    b->ctx = ctx;
    int bx = cfg.block[0], by = cfg.block[1], n = bx * by * cfg.block[2];
    b->n = n;
    b->th.resize(n);
    b->order.resize(n);
    for (int i = 0; i < n; ++i) {
        EThread& t = b->th[i];
        t.lin = i;
        t.tid.x = i % bx;
        t.tid.y = (i / bx) % by;
        t.tid.z = i / (bx * by);
        b->order[i] = cfg.order == 1 ? n - 1 - i : i;
    }
    int nw = (n + 31) / 32;
    b->warps.assign(nw, Warp{0, 0, 0, 0});
    for (int w = 0; w < nw; ++w) {
        int lanes = n - w * 32 < 32 ? n - w * 32 : 32;
        b->warps[w].existing = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
    }
}

static uint64_t splitmix(uint64_t& s) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static bool run_block(Worker& wk, Block* b, uint64_t block_lin) {
    int n = b->n;
    if (b->cfg->order == 2) {  // random order: a fresh permutation per block
        uint64_t s = b->cfg->seed * 0x100000001b3ull + block_lin;
        for (int i = 0; i < n; ++i) b->order[i] = i;
        for (int i = n - 1; i > 0; --i) {
            int j = (int)(splitmix(s) % (uint64_t)(i + 1));
            int x = b->order[i]; b->order[i] = b->order[j]; b->order[j] = x;
        }
    }
    for (Warp& w : b->warps) w.arrived = w.want = w.exited = 0;
    b->alive = n;
    b->ndone = 0;
    b->at_bar = 0;
    b->nrun = n - 1;
    b->cursor = 0;
    b->loop_pos = 0;
    b->looping = true;
    b->failed = false;
    b->quiet = false;
    b->fault.w[F_FILLED] = 0;
    if (b->cfg->shared) memset(wk.smem.data(), 0xFF, b->cfg->shared);  // NaN poison
    tls.blk = b;
    rc_block_begin(*b->cfg, wk.smem.data());
    char* s = wk.pool.get();
    b->stacks.push_back(s);
    EThread* first = &b->th[b->order[0]];
    fiber_init(&first->ctx, s, wk.pool.size, fiber_entry, first);
    fiber_switch(&b->main, &first->ctx);
    rc_block_end();
    for (char* st : b->stacks) wk.pool.put(st);
    b->stacks.clear();
    if (b->fault.w[F_FILLED]) {
        const uint64_t* f = b->fault.w;
        char s[200];
        snprintf(s, sizeof s, "memcheck: thread %s: %s %s at address 0x%llx",
                 tid_str(b, (int)f[F_LIN]).c_str(), f[F_SIG] == SIGBUS ? "SIGBUS" : "SIGSEGV",
                 f[F_ACCESS] == 0 ? "reading" : f[F_ACCESS] == 1 ? "writing" : "accessing",
                 (unsigned long long)f[F_ADDR]);
        b->err = where(b) + ": " + s;
    }
    return !b->failed;
}

// Runs blocks [next++] until exhausted or a failure; returns false on failure.
static bool run_blocks(const LaunchCfg& cfg, ThreadFn fn, void* ctx, std::atomic<uint64_t>& next,
                       uint64_t nblocks, std::atomic<bool>& stop, std::string& err, Fault& fault) {
    Worker& wk = worker();
    Block* b = &wk.blk;
    if (cfg.memcheck == 2) ensure_altstack();
    struct Catch {
        explicit Catch(bool on) { t_catch = on; }
        ~Catch() { t_catch = 0; }
    } catching(cfg.memcheck == 2);
    setup_block(b, cfg, fn, ctx);
    b->grid = nullptr;
    if (wk.smem.size() < cfg.shared) wk.smem.resize(cfg.shared);
    tls.dyn_smem = wk.smem.data();
    tls.blockDim = uint3{cfg.block[0], cfg.block[1], cfg.block[2]};
    tls.gridDim = uint3{cfg.grid[0], cfg.grid[1], cfg.grid[2]};
    unsigned gx = cfg.grid[0], gy = cfg.grid[1];
    for (;;) {
        if (stop.load(std::memory_order_relaxed)) return true;
        uint64_t i = next.fetch_add(1, std::memory_order_relaxed);
        if (i >= nblocks) return true;
        tls.blockIdx = uint3{(unsigned)(i % gx), (unsigned)((i / gx) % gy), (unsigned)(i / ((uint64_t)gx * gy))};
        if (!run_block(wk, b, i)) {
            err = b->err;
            fault = b->fault;
            stop = true;
            return false;
        }
    }
}

// Persistent helper threads for workers > 1: they keep their fiber stacks
// and TLS between launches (a thread per launch would re-mmap its stacks).
class HelperPool {
  public:
    // Runs job(1..extra) on helpers while the caller runs job(0); returns when all are done.
    void run(int extra, const std::function<void(int)>& job) {
        std::lock_guard<std::mutex> one_launch_at_a_time(launch_);
        {
            std::unique_lock<std::mutex> lk(m_);
            while ((int)threads_.size() < extra) {
                int idx = (int)threads_.size() + 1;
                threads_.emplace_back([this, idx] { loop(idx); });
                threads_.back().detach();  // lives as long as the process
            }
            job_ = &job;
            want_ = extra;
            pending_ = extra;
            ++gen_;
        }
        cv_.notify_all();
        job(0);
        std::unique_lock<std::mutex> lk(m_);
        done_.wait(lk, [this] { return pending_ == 0; });
        job_ = nullptr;
    }

  private:
    void loop(int idx) {
        uint64_t seen = 0;
        for (;;) {
            const std::function<void(int)>* job;
            {
                std::unique_lock<std::mutex> lk(m_);
                cv_.wait(lk, [&] { return gen_ != seen; });
                seen = gen_;
                if (idx > want_) continue;
                job = job_;
            }
            (*job)(idx);
            std::lock_guard<std::mutex> lk(m_);
            if (--pending_ == 0) done_.notify_all();
        }
    }
    std::mutex launch_, m_;
    std::condition_variable cv_, done_;
    std::vector<std::thread> threads_;
    const std::function<void(int)>* job_ = nullptr;
    int want_ = 0, pending_ = 0;
    uint64_t gen_ = 0;
};

static HelperPool* g_helpers;

// A forked child (run_isolated) has none of the parent's helper threads:
// it starts from an empty pool. The old one is leaked on purpose.
static void reset_helpers_after_fork() { g_helpers = nullptr; }

static HelperPool& helpers() {
    static bool registered = (pthread_atfork(nullptr, nullptr, reset_helpers_after_fork), true);
    (void)registered;
    if (!g_helpers) g_helpers = new HelperPool();  // never destroyed: helpers are detached
    return *g_helpers;
}


// ---- cooperative launches (see the header comment) -------------------------------------------
enum GSt : uint8_t { G_RUN, G_WAIT, G_DONE };

struct Grid {
    std::mutex m;
    std::condition_variable cv;
    std::vector<uint8_t> st;  // per block: runnable, waiting at the grid barrier, finished
    std::vector<int> seq;     // the order blocks take turns in
    int turn = -1;            // position in seq of the block that runs; -1: none
    bool abort = false;       // a block failed (or a deadlock): every waiting block ends
    std::string err;          // the first failure
    Fault fault{{0}};
    const char* file = nullptr;  // the barrier the waiting blocks wait at
    int line = 0;
    const char* kernel = "?";
};

static std::string block_list(const Grid& g, uint8_t want) {
    std::string s;
    for (int i = 0; i < (int)g.st.size(); ++i)
        if (g.st[i] == want) s += (s.empty() ? "" : ", ") + std::to_string(i);
    return s;
}

// With g.m held: give the turn to the next runnable block after the current one; if none,
// release the barrier (all wait), end (all finished) or report the deadlock (some of each).
static void pass_turn(Grid& g) {
    int n = (int)g.seq.size(), waiting = 0;
    for (int k = 1; k <= n; ++k) {
        int p = (g.turn + k) % n;
        if (g.st[g.seq[p]] == G_RUN) {
            g.turn = p;
            g.cv.notify_all();
            return;
        }
    }
    for (uint8_t x : g.st) waiting += x == G_WAIT;
    g.turn = -1;
    if (waiting == n) {
        for (uint8_t& x : g.st) x = G_RUN;
        g.turn = 0;
    } else if (waiting > 0 && !g.abort) {
        char head[400];
        snprintf(head, sizeof head, "deadlock at the grid barrier sharpinf_grid_sync (%s:%d): ", g.file ? g.file : "?",
                 g.line);
        g.err = std::string("kernel ") + g.kernel + ": " + head + "block(s) " + block_list(g, G_WAIT) +
                " wait there (all their threads); block(s) " + block_list(g, G_DONE) +
                " exited without reaching it";
        g.abort = true;
    }
    g.cv.notify_all();
}

// The last thread of block b to arrive at the grid barrier waits here (its OS thread blocks)
// until every block has arrived; then release_barrier lets the block's threads go on.
static void grid_arrive(Block* b) {
    Grid& g = *b->grid;
    {
        std::unique_lock<std::mutex> lk(g.m);
        g.st[b->gidx] = G_WAIT;
        g.file = b->bar_file;
        g.line = b->bar_line;
        pass_turn(g);
        int me = b->gidx;
        g.cv.wait(lk, [&] { return g.abort || (g.turn >= 0 && g.seq[g.turn] == me); });
        if (!g.abort) return;
    }
    b->quiet = true;
    fail(b, "abandoned: another block of the cooperative launch failed");
}

// One block of a cooperative launch, on this OS thread: wait for its first turn, run it,
// then hand the turn on.
static void run_coop_block(const LaunchCfg& cfg, ThreadFn fn, void* ctx, Grid& g, int idx) {
    Worker& wk = worker();
    Block* b = &wk.blk;
    if (cfg.memcheck == 2) ensure_altstack();
    struct Catch {
        explicit Catch(bool on) { t_catch = on; }
        ~Catch() { t_catch = 0; }
    } catching(cfg.memcheck == 2);
    setup_block(b, cfg, fn, ctx);
    b->grid = &g;
    b->gidx = idx;
    if (wk.smem.size() < cfg.shared) wk.smem.resize(cfg.shared);
    tls.dyn_smem = wk.smem.data();
    tls.blockDim = uint3{cfg.block[0], cfg.block[1], cfg.block[2]};
    tls.gridDim = uint3{cfg.grid[0], cfg.grid[1], cfg.grid[2]};
    unsigned gx = cfg.grid[0], gy = cfg.grid[1];
    tls.blockIdx = uint3{idx % gx, (idx / gx) % gy, idx / (gx * gy)};
    {
        std::unique_lock<std::mutex> lk(g.m);
        g.cv.wait(lk, [&] { return g.abort || (g.turn >= 0 && g.seq[g.turn] == idx); });
        if (g.abort) {
            g.st[idx] = G_DONE;
            return;
        }
    }
    bool ok = run_block(wk, b, (uint64_t)idx);
    std::lock_guard<std::mutex> lk(g.m);
    g.st[idx] = G_DONE;
    if (!ok && !b->quiet) {
        if (g.err.empty()) {
            g.err = b->err;
            g.fault = b->fault;
        }
        g.abort = true;
    }
    if (g.turn >= 0 && g.seq[g.turn] == idx) pass_turn(g);
    g.cv.notify_all();
}

static const uint64_t MAX_COOP_BLOCKS = 256;  // one OS thread each

static int run_coop(const LaunchCfg& cfg, ThreadFn fn, void* ctx, uint64_t nblocks, std::string& err, Fault& fault) {
    Grid g;
    g.kernel = cfg.kernel;
    g.st.assign(nblocks, G_RUN);
    for (uint64_t p = 0; p < nblocks; ++p) g.seq.push_back(cfg.order == 1 ? (int)(nblocks - 1 - p) : (int)p);
    g.turn = 0;
    helpers().run((int)nblocks - 1, [&](int w) { run_coop_block(cfg, fn, ctx, g, w); });
    if (g.err.empty()) return 0;
    err = g.err;
    fault = g.fault;
    return 1;
}

int run_grid(const LaunchCfg& cfg, ThreadFn fn, void* ctx, char* err, size_t errlen) {
    auto report = [&](const std::string& m) {
        snprintf(err, errlen, "%s", m.c_str());
        return 1;
    };
    if (cfg.fault) cfg.fault[F_FILLED] = 0;
    uint64_t nthreads = (uint64_t)cfg.block[0] * cfg.block[1] * cfg.block[2];
    if (nthreads == 0 || nthreads > 1024)
        return report(std::string("kernel ") + cfg.kernel + ": block of " + std::to_string(nthreads) +
                      " threads (CUDA allows 1 to 1024)");
    if (cfg.block[2] > 64 || cfg.grid[1] > 65535 || cfg.grid[2] > 65535)
        return report(std::string("kernel ") + cfg.kernel + ": grid/block dimension over CUDA's limits");
    if (cfg.shared > 227 * 1024)
        return report(std::string("kernel ") + cfg.kernel + ": " + std::to_string(cfg.shared) +
                      " bytes of dynamic shared memory (max 232448)");
    uint64_t nblocks = (uint64_t)cfg.grid[0] * cfg.grid[1] * cfg.grid[2];
    std::atomic<uint64_t> next{0};
    std::atomic<bool> stop{false};
    int nw = cfg.workers < 1 ? 1 : cfg.workers;
    if ((uint64_t)nw > nblocks) nw = (int)nblocks;
    // Shared memory checks keep one shadow: one launch at a time, its blocks on this thread.
    static std::mutex checked_launch;
    std::unique_lock<std::mutex> one_checked(checked_launch, std::defer_lock);
    if (cfg.check) {
        nw = 1;
        one_checked.lock();
    }
    std::vector<std::string> errs(nw);
    std::vector<Fault> faults(nw, Fault{{0}});
    if (cfg.memcheck == 2) arm_fault_handler();
    if (cfg.coop) {
        if (nblocks > MAX_COOP_BLOCKS)
            return report(std::string("kernel ") + cfg.kernel + ": cooperative launch of " + std::to_string(nblocks) +
                          " blocks (the emulator holds at most " + std::to_string(MAX_COOP_BLOCKS) + " resident)");
        run_coop(cfg, fn, ctx, nblocks, errs[0], faults[0]);
    } else if (nw == 1) {
        run_blocks(cfg, fn, ctx, next, nblocks, stop, errs[0], faults[0]);
    } else {
        helpers().run(nw - 1, [&](int w) { run_blocks(cfg, fn, ctx, next, nblocks, stop, errs[w], faults[w]); });
    }
    int rc = cfg.nguards && !guards_intact(cfg) ? 2 : 0;
    for (int w = 0; w < nw; ++w) {
        if (errs[w].empty()) continue;
        if (cfg.fault && faults[w].w[F_FILLED]) memcpy(cfg.fault, faults[w].w, sizeof faults[w].w);
        return report(errs[w]) | rc;
    }
    return rc;
}

}  // namespace sharpinf_emu
