/* Fiber context switch and guarded stack allocation (see emu_fiber.h). */
#include "emu_fiber.h"
#include <sys/mman.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>

namespace sharpinf_emu {

#if defined(__x86_64__) && !defined(SHARPINF_EMU_UCONTEXT)
// sharpinf_emu_switch(void** save_sp, void* new_sp): push callee-saved
// registers, store rsp, load the other fiber's rsp, pop its registers, ret.
extern "C" void sharpinf_emu_switch(void** save_sp, void* new_sp) __attribute__((visibility("hidden")));
extern "C" void sharpinf_emu_trampoline() __attribute__((visibility("hidden")));
asm(R"(
    .text
    .globl sharpinf_emu_switch
    .hidden sharpinf_emu_switch
    .type sharpinf_emu_switch,@function
sharpinf_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size sharpinf_emu_switch, .-sharpinf_emu_switch

    .globl sharpinf_emu_trampoline
    .hidden sharpinf_emu_trampoline
    .type sharpinf_emu_trampoline,@function
sharpinf_emu_trampoline:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size sharpinf_emu_trampoline, .-sharpinf_emu_trampoline
)");

void fiber_init(FiberCtx* ctx, char* stack, size_t size, FiberMain main, void* arg) {
    uintptr_t top = ((uintptr_t)(stack + size)) & ~(uintptr_t)15;
    // 6 saved registers + return address; after `ret` rsp is 16-aligned so
    // the trampoline's call gives main a standard entry alignment.
    void** sp = (void**)(top - 72);
    sp[0] = nullptr;          // r15
    sp[1] = nullptr;          // r14
    sp[2] = (void*)main;      // r13
    sp[3] = arg;              // r12
    sp[4] = nullptr;          // rbx
    sp[5] = nullptr;          // rbp
    sp[6] = (void*)&sharpinf_emu_trampoline;
    ctx->sp = sp;
}

void fiber_switch(FiberCtx* from, FiberCtx* to) { sharpinf_emu_switch(&from->sp, to->sp); }

#else

static void uc_entry(unsigned hi, unsigned lo, unsigned mhi, unsigned mlo) {
    void* arg = (void*)(((uintptr_t)hi << 32) | lo);
    FiberMain m = (FiberMain)(((uintptr_t)mhi << 32) | mlo);
    m(arg);
    abort();
}

void fiber_init(FiberCtx* ctx, char* stack, size_t size, FiberMain main, void* arg) {
    getcontext(&ctx->uc);
    ctx->uc.uc_stack.ss_sp = stack;
    ctx->uc.uc_stack.ss_size = size;
    ctx->uc.uc_link = nullptr;
    uintptr_t a = (uintptr_t)arg, m = (uintptr_t)main;
    makecontext(&ctx->uc, (void (*)())uc_entry, 4, (unsigned)(a >> 32), (unsigned)a,
                (unsigned)(m >> 32), (unsigned)m);
}

void fiber_switch(FiberCtx* from, FiberCtx* to) { swapcontext(&from->uc, &to->uc); }

#endif

// One PROT_NONE page below each stack turns an overflow into a clean SIGSEGV
// instead of silently corrupting a neighbouring fiber.
char* StackPool::get() {
    if (!free_list.empty()) {
        char* s = free_list.back();
        free_list.pop_back();
        return s;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char* base = (char*)mmap(nullptr, size + page, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        perror("sharpinf emu: mmap fiber stack");
        abort();
    }
    mprotect(base, page, PROT_NONE);
    return base + page;
}

// Micro-benchmark hook (bench/emu_micro.py): nanoseconds per switch between
// two fibers that do nothing but switch back and forth.
namespace {
struct PingPong {
    FiberCtx main, a;
    long left;
};
void pong(void* arg) {
    PingPong* p = (PingPong*)arg;
    for (;;) fiber_switch(&p->a, &p->main);
}
}  // namespace

extern "C" __attribute__((visibility("default"))) double sharpinf_emu_switch_ns(long n) {
    StackPool pool(64 * 1024);
    char* s = pool.get();
    PingPong p;
    fiber_init(&p.a, s, pool.size, pong, &p);
    timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    for (long i = 0; i < n; ++i) fiber_switch(&p.main, &p.a);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    pool.put(s);
    return ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / (2.0 * n);
}

StackPool::~StackPool() {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (char* s : free_list) munmap(s - page, size + page);
}

}  // namespace sharpinf_emu
