"""EmuBackend: the Backend interface on the CPU emulator. Arrays are NumPy
ndarrays; kernels are the same CUDA C sources, built by g++ against
emu/cuda_emu.h (see emu/build.py) and run by the fiber scheduler.

Settings (constructor, else environment): order forward|reverse|random
(SHARPINF_EMU_ORDER) - the order a block's threads are run and resumed, to
expose missing barriers; strict (SHARPINF_EMU_STRICT=1) - early exits before
barriers, divergent barriers and partial-warp ops become errors; workers
(SHARPINF_EMU_WORKERS, default 1 for determinism) - OS threads running blocks;
memcheck on|off|strict (SHARPINF_EMU_MEMCHECK, default on) - device allocations get
guard bytes checked after each launch, which names the kernel, argument and offset
of a store past either end; strict also puts PROT_NONE pages around each allocation
and turns the fault of an out-of-bounds load or store into a launch failure naming
the thread (see emu/memcheck.py); racecheck (SHARPINF_EMU_RACECHECK=1) - a shared-memory
access racing another thread's in one barrier interval ends the launch naming the kernel,
array, offset, both threads and both source lines; initcheck (SHARPINF_EMU_INITCHECK=1) -
so does a read of shared memory no thread of the block wrote (see emu/emu_racecheck.cpp;
either builds the kernels instrumented, and runs a launch's blocks on one worker)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from sharpinf.errors import BackendError
from sharpinf.runtime import paths
from sharpinf.runtime.backend import Backend, Dim3, Kernel, Launch, as_dim3, env_flag
from sharpinf.runtime.emu import build
from sharpinf.runtime.emu.graph import EmuGraph, capturing, check_alive, make_handle
from sharpinf.runtime.emu.isolate import run_isolated  # noqa: F401 - re-exported for tests
from sharpinf.runtime.emu.memcheck import MODES, OFF, allocate, fault_message, guard_report, mode_from
from sharpinf.runtime.emu.module import EmuKernel, Module
from sharpinf.runtime.emu.signature import param_names
from sharpinf.runtime.emu.source import module_type

ORDERS = {"forward": 0, "reverse": 1, "random": 2}


class EmuBackend(Backend):
    name = "emu"

    def __init__(self, order: str | None = None, strict: bool | None = None, workers: int | None = None,
                 seed: int | None = None, memcheck: str | bool | None = None, racecheck: bool | None = None,
                 initcheck: bool | None = None):
        order = (order or os.environ.get("SHARPINF_EMU_ORDER") or "forward").strip().lower()
        if order not in ORDERS:
            raise BackendError(f"emu: unknown thread order {order!r}; choose forward, reverse or random")
        self.order = order
        self.strict = env_flag("SHARPINF_EMU_STRICT") if strict is None else bool(strict)
        self.workers = int(workers if workers is not None else os.environ.get("SHARPINF_EMU_WORKERS", "1"))
        if self.workers < 1:
            raise BackendError("emu: workers must be >= 1")
        self.seed = int(seed if seed is not None else os.environ.get("SHARPINF_EMU_SEED", "0"))
        self._order_code = ORDERS[order]
        self.memcheck = mode_from(memcheck)  # OFF, GUARD or STRICT (memcheck.py)
        self.racecheck = env_flag("SHARPINF_EMU_RACECHECK") if racecheck is None else bool(racecheck)
        self.initcheck = env_flag("SHARPINF_EMU_INITCHECK") if initcheck is None else bool(initcheck)
        self._check = int(self.racecheck) | 2 * int(self.initcheck)  # LaunchCfg.check
        self._modules: dict[Path, Module] = {}
        self._kernels: dict[tuple, tuple[EmuKernel, list]] = {}  # (filename, name, exprs) -> (kernel, stamps)
        self._graph: EmuGraph | None = None

    # -- kernels ---------------------------------------------------------------
    def _source(self, filename: str) -> Path:
        p = Path(filename)
        return p if p.is_absolute() else paths.kernels_dir() / p

    def kernel(self, filename: str, name: str, name_expressions: Sequence[str] = ()) -> Kernel:
        key = (filename, name, tuple(name_expressions))
        hit = self._kernels.get(key)
        if hit is not None and build.fresh(hit[1]):  # a few stat() calls, no hashing
            return hit[0]
        src = self._source(filename)
        checked = bool(self._check)
        wtype = module_type(src, name)
        so = build.build_module(src, key[2], checked, wtype)
        mod = self._modules.get(so)
        if mod is None:
            mod = self._modules[so] = Module(so)
        k = mod.kernels.get(name)
        if k is None:
            hint = " (template instantiations must be listed in name_expressions)" if "<" in name else ""
            raise BackendError(f"emu: {filename} has no kernel {name!r}{hint}; it has {', '.join(mod.kernels)}")
        self._kernels[key] = (k, build.stamps_of(src, key[2], checked, wtype))
        return k

    def prepare(self, kernel: Kernel, grid: Dim3, block: Dim3, args: Sequence[Any], shared_mem: int = 0,
                io: tuple[int, int] | None = None, cooperative: bool = False) -> Launch:
        if not isinstance(kernel, EmuKernel):
            raise BackendError(f"emu: not an emulator kernel: {kernel!r}")
        if not isinstance(args, (tuple, list)):
            raise BackendError(f"kernel args must be a tuple or list, got {type(args).__name__}")
        g = (grid, 1, 1) if type(grid) is int and grid > 0 else as_dim3(grid)
        b = (block, 1, 1) if type(block) is int and block > 0 else as_dim3(block)
        if not isinstance(shared_mem, (int, np.integer)) or shared_mem < 0:
            raise BackendError(f"shared_mem must be a non-negative int, got {shared_mem!r}")
        packed, arrays = kernel.pack(args)
        return Launch(kernel, g, b, int(shared_mem), io, make_handle(packed, arrays), bool(cooperative))

    def run(self, launches: Sequence[Launch]) -> None:
        if self._graph is not None:
            self._graph.launches.extend(launches)
            return
        check_alive(launches, "launch")
        mc = self.memcheck
        for l in launches:
            h = l.handle
            rc = l.kernel.module.launch(l.kernel, l.grid, l.block, l.shared_mem, h.packed, self._order_code,
                                        self.strict, self.workers, self.seed, mc, h.guards if mc else b"", self._check,
                                        l.cooperative)
            if rc:
                raise BackendError(self._failure(l, rc))

    def _failure(self, l: Launch, rc: int) -> str:
        """The message for a failed launch: the kernel's error or fault, then what it wrote
        into guards (which are refilled, so later launches are not blamed)."""
        mod = l.kernel.module
        guarded = [(idx, ref(), n) for idx, ref, n in l.handle.guarded]  # alive: check_alive ran
        names = param_names(mod.path, l.name, len(l.kernel.params)) if guarded else None
        parts = []
        if rc & 1:
            parts.append(fault_message(l.name, mod.fault, l.block, guarded, names) if mod.fault[0] else mod.error())
        if rc & 2:
            parts.append(guard_report(l.name, guarded, names) or f"memcheck: kernel {l.name} overwrote a guard")
        return "; ".join(parts)

    # -- memory ----------------------------------------------------------------
    def empty(self, shape, dtype) -> np.ndarray:
        return allocate(shape, dtype, self.memcheck)

    def zeros(self, shape, dtype) -> np.ndarray:
        if self.memcheck == OFF:
            return np.zeros(shape, dtype)
        a = allocate(shape, dtype, self.memcheck)
        a.fill(0)
        return a

    def upload(self, host: np.ndarray) -> np.ndarray:
        if self.memcheck == OFF:
            return np.array(host, copy=True, order="C")
        host = np.asarray(host)
        a = allocate(host.shape, host.dtype, self.memcheck)
        a[...] = host
        return a

    def download(self, dev: np.ndarray) -> np.ndarray:
        return np.array(dev, copy=True)

    def fill_bytes(self, dev: np.ndarray, byte: int) -> None:
        dev.reshape(-1).view(np.uint8).fill(byte)

    def host_buffer(self, nbytes: int) -> np.ndarray:
        return self.zeros(nbytes, np.uint8)

    def copy_to_device(self, host: np.ndarray, dev: np.ndarray) -> None:
        np.copyto(dev, host)

    def copy_to_host(self, dev: np.ndarray, host: np.ndarray) -> None:
        np.copyto(host, dev)

    def copy_device(self, src: np.ndarray, dst: np.ndarray) -> None:
        if src.nbytes != dst.nbytes:
            raise BackendError(f"device copy of {src.nbytes} bytes into {dst.nbytes}: sizes must match")
        np.copyto(dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8))

    def synchronize(self) -> None:
        pass

    # -- graphs ------------------------------------------------------------------
    def capture(self):
        return capturing(self, self.run)

    # -- facts -----------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        inc = paths.cuda_include_dirs()
        return {
            "backend": "emu",
            "device": "CPU emulator (fibers)",
            "compiler": build.gxx_version(),
            "cache_dir": str(paths.cache_dir("emu", create=False)),
            "cuda_include": str(inc[0]) if inc else None,
            "order": self.order,
            "strict": self.strict,
            "workers": self.workers,
            "memcheck": next(k for k, v in MODES.items() if v == self.memcheck),
            "racecheck": self.racecheck,
            "initcheck": self.initcheck,
        }
