/* Fibers: a saved stack pointer per suspended CUDA thread and a pool of
   guarded stacks. x86-64 switches with a few instructions of hand-written
   asm (callee-saved registers + rsp, ~8 ns); other CPUs fall back to
   ucontext (swapcontext makes a sigprocmask syscall each switch). */
#pragma once
#include <stddef.h>
#include <vector>
#if !defined(__x86_64__) || defined(SHARPINF_EMU_UCONTEXT)
#include <ucontext.h>
#endif

namespace sharpinf_emu {

typedef void (*FiberMain)(void* arg);

struct FiberCtx {
#if defined(__x86_64__) && !defined(SHARPINF_EMU_UCONTEXT)
    void* sp = nullptr;
#else
    ucontext_t uc;
#endif
};

// Prepare ctx so that switching to it runs main(arg) on [stack, stack+size).
// main must never return (it switches away at the end).
void fiber_init(FiberCtx* ctx, char* stack, size_t size, FiberMain main, void* arg) __attribute__((visibility("hidden")));
void fiber_switch(FiberCtx* from, FiberCtx* to) __attribute__((visibility("hidden")));

// Stacks are reused across blocks and launches (per OS thread).
struct StackPool {
    size_t size;
    std::vector<char*> free_list;
    explicit StackPool(size_t sz) : size(sz) {}
    ~StackPool();
    char* get();
    void put(char* s) { free_list.push_back(s); }
};

}  // namespace sharpinf_emu
