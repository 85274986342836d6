"""Micro-benchmarks of the CPU emulator (EmuBackend): fiber switch, block
barrier, warp shuffle, barrier-free thread cost and Python launch overhead.

    python bench/emu_micro.py
"""

from __future__ import annotations

import ctypes
import time

import numpy as np

from sharpinf.runtime import paths
from sharpinf.runtime.emu_backend import EmuBackend

SRC = r"""
extern "C" __global__ void barriers(float* x, int iters) {
    float v = x[threadIdx.x];
    for (int i = 0; i < iters; ++i) { v += 1.0f; __syncthreads(); }
    x[threadIdx.x] = v;
}
extern "C" __global__ void shuffles(float* x, int iters) {
    float v = x[threadIdx.x];
    for (int i = 0; i < iters; ++i) v += __shfl_xor_sync(0xffffffff, v, 1);
    x[threadIdx.x] = v;
}
extern "C" __global__ void axpy(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * 2.0f + 1.0f;
}
extern "C" __global__ void nothing(float* x) {}
"""


def best(fn, reps: int = 5) -> float:
    """Best of `reps` runs in CPU seconds of this thread (robust to a busy machine;
    workers=1 runs every block on the calling thread)."""
    fn()
    ts = []
    for _ in range(reps):
        t = time.thread_time()
        fn()
        ts.append(time.thread_time() - t)
    return min(ts)


def main() -> None:
    src = paths.cache_dir("emu") / "bench_emu_micro.cu"
    if not src.exists() or src.read_text() != SRC:
        src.write_text(SRC)
    b = EmuBackend()
    kb, ks, ka, kn = (b.kernel(str(src), n) for n in ("barriers", "shuffles", "axpy", "nothing"))
    x = np.zeros(1 << 20, np.float32)
    it = 20000

    lib = kb.module.lib
    lib.sharpinf_emu_switch_ns.restype = ctypes.c_double
    lib.sharpinf_emu_switch_ns.argtypes = [ctypes.c_long]
    sw = min(lib.sharpinf_emu_switch_ns(1_000_000) for _ in range(5))
    print(f"fiber switch (raw context switch):            {sw:8.1f} ns")
    t = best(lambda: b.launch(kb, 1, 2, [x, np.int32(it)]))
    print(f"  same with scheduler (2-thread barrier):     {t / (2 * it) * 1e9:8.1f} ns")
    t = best(lambda: b.launch(kb, 1, 256, [x, np.int32(it // 20)]))
    print(f"__syncthreads over 256 threads:               {t / (it // 20) * 1e6:8.2f} us")
    t = best(lambda: b.launch(ks, 1, 32, [x, np.int32(it // 10)]))
    print(f"warp shuffle, per lane:                       {t / (it // 10 * 32) * 1e9:8.1f} ns")
    n = x.size
    t = best(lambda: b.launch(ka, n // 256, 256, [x, np.int32(n)]))
    print(f"barrier-free kernel, per thread:              {t / n * 1e9:8.1f} ns")
    reps = 2000
    t = best(lambda: [b.launch(kn, 1, 1, [x]) for _ in range(reps)], 3)
    print(f"launch overhead (Python + 1 thread):          {t / reps * 1e6:8.2f} us")


if __name__ == "__main__":
    main()
