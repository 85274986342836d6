"""CudaBackend: cupy arrays, kernels compiled at run time by NVRTC through cupy.RawModule (cuda_source.py).

Every launch, allocation, fill and copy runs on one dedicated non-blocking stream, so
work is ordered among itself and a CUDA graph can capture it. cupy is imported lazily:
importing this module never needs a GPU.

Launches: `prepare` packs a launch once into a kernel-parameter array (ctypes, cuda_launch.py); `run`
hands each to cuLaunchKernel with nothing else to do, so a step of hundreds of launches
costs microseconds each, and the same list is what a graph captures.

Programmatic dependent launch (SHARPINF_PDL=1, sm_90 and later): every launch but a cooperative
one goes through cuLaunchKernelEx with the programmatic-stream-serialization attribute
(pdl_launch.py), so a kernel's blocks may start while the one before it finishes; each entry
waits for its inputs itself (common.cuh; pdl_check.py proves it on the PTX). Off by default
until a GPU run shows what it buys (bench/gpu_slot.sh times both).

Faults: CUDA reports a kernel's illegal access at the next synchronizing call. Every such
call here turns CuPy's error into a BackendError naming the last kernel launched;
SHARPINF_SYNC=1 synchronizes after every launch to name the one that faulted.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import numpy as np

from sharpinf.errors import BackendError
from sharpinf.runtime.backend import Backend, Dim3, Graph, Kernel, Launch, as_dim3, env_flag
from sharpinf.runtime.args import check_args
from sharpinf.runtime.cuda_launch import CudaKernel, pack_launch
from sharpinf.runtime.cuda_source import NvrtcModules
from sharpinf.runtime.paths import cache_dir, kernels_dir
from sharpinf.runtime.pdl_launch import PdlLauncher, check_pdl_env, pdl_requested

MAX_THREADS_PER_BLOCK = 1024


def _import_cupy():
    # sharpinf/__init__ already pointed CUPY_CACHE_DIR at our cache (before any cupy import)
    try:
        import cupy
    except Exception as exc:
        raise BackendError(
            f"cupy is not importable ({type(exc).__name__}: {exc}); "
            "install it with `pip install -e .[cuda12]` (CUDA 12 driver) or `pip install -e .[cuda13]`"
        ) from exc
    return cupy


def _version(v: int) -> str:
    """CUDA's encoded version (12090) as "12.9"."""
    return f"{v // 1000}.{(v % 1000) // 10}"


_H2D, _D2H, _D2D = 1, 2, 3  # cudaMemcpyKind


class CudaGraph(Graph):
    def __init__(self, backend: "CudaBackend"):
        self._backend = backend
        self._graph = None

    def replay(self) -> None:
        if self._graph is None:
            raise BackendError("graph replayed before its capture finished")
        with self._backend._errors("graph replay"):
            self._graph.launch(self._backend._stream)


class CudaBackend(Backend):
    name = "cuda"
    gpu_shapes = True

    def __init__(self, device: int = 0):
        cp = _import_cupy()
        try:
            if cp.cuda.runtime.getDeviceCount() < 1:
                raise BackendError("no CUDA device found")
            self._device = cp.cuda.Device(device)
            self._device.use()
            self._stream = cp.cuda.Stream(non_blocking=True)
            sms = int(cp.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"])
        except BackendError:
            raise
        except Exception as exc:  # driver missing or too old, device busy, ...
            raise BackendError(f"CUDA is not usable: {exc}") from exc
        self.cp = cp
        self.device_id = device
        self.multiprocessors = sms
        self._launch_kernel = cp.cuda.driver.launchKernel
        # cuLaunchCooperativeKernel guarantees a cooperative launch's blocks co-resident (or fails)
        self._launch_coop = getattr(cp.cuda.driver, "launchCooperativeKernel", None)
        self._cuda_errors = (cp.cuda.runtime.CUDARuntimeError, cp.cuda.driver.CUDADriverError)
        self._sync_each = env_flag("SHARPINF_SYNC")
        self._capturing = False
        self._last = "(none yet)"
        self._graph_bytes = 0
        self._pdl, self._pdl_state = self._pdl_launcher()
        self._nvrtc = NvrtcModules(cp, pdl_prefetch=self._pdl is not None)

    def _pdl_launcher(self) -> tuple[PdlLauncher | None, str]:
        """(the launcher, what describe() says): on with SHARPINF_PDL=1 on sm_90 and later, with a
        driver whose stream capture keeps the launches' programmatic edges in a graph (CUDA 12.3)."""
        check_pdl_env()
        if not pdl_requested():
            return None, "off"
        rt = self.cp.cuda.runtime
        major = int(rt.getDeviceProperties(self.device_id)["major"])
        if major < 9:
            return None, f"off: SHARPINF_PDL=1 needs sm_90 or later (this GPU is sm_{major}x)"
        driver = rt.driverGetVersion()
        if driver < 12030:
            return None, f"off: SHARPINF_PDL=1 needs a CUDA 12.3 driver or later (this one is {_version(driver)})"
        return PdlLauncher(), "on"

    # -- errors ------------------------------------------------------------------
    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """CuPy's CUDA errors as one BackendError that says what was running."""
        try:
            yield
        except self._cuda_errors as exc:
            hint = "" if self._sync_each else "; set SHARPINF_SYNC=1 to synchronize after every launch and name the kernel that faulted"
            raise BackendError(f"CUDA error at {what} ({exc}); the last kernel launched was {self._last}{hint}. "
                               "After an illegal memory access the CUDA context is unusable: restart the process") from exc

    # -- kernels -----------------------------------------------------------------
    def compile(self, requests: Sequence[tuple[str, str]], progress=None) -> None:
        """One module per file holding only the requested entry points (see SHARPINF_WANT)."""
        self._nvrtc.compile(requests, progress)

    def kernel(self, filename: str, name: str, name_expressions: Sequence[str] = ()) -> Kernel:
        return self._nvrtc.kernel(filename, name, name_expressions)

    def prepare(self, kernel: Kernel, grid: Dim3, block: Dim3, args: Sequence[Any], shared_mem: int = 0,
                io: tuple[int, int] | None = None, cooperative: bool = False) -> Launch:
        if not isinstance(kernel, CudaKernel):
            raise BackendError(f"{kernel!r} was not compiled by the cuda backend")
        if cooperative and self._launch_coop is None:
            raise BackendError(f"{kernel.name}: a cooperative launch needs CuPy's driver.launchCooperativeKernel")
        try:
            g, b = as_dim3(grid), as_dim3(block)
        except ValueError as exc:
            raise BackendError(str(exc)) from exc
        if b[0] * b[1] * b[2] > MAX_THREADS_PER_BLOCK:
            raise BackendError(f"{kernel.name}: block {b} has more than {MAX_THREADS_PER_BLOCK} threads")
        if not isinstance(shared_mem, (int, np.integer)) or shared_mem < 0:
            raise BackendError(f"shared_mem must be a non-negative int, got {shared_mem!r}")
        args = check_args(args, lambda a: isinstance(a, self.cp.ndarray), self.name)
        handle = pack_launch(kernel, g, b, shared_mem, args, self.cp.ndarray)
        # as a programmatic dependent: a kernel of kernels_dir() (the tree whose every entry the NVRTC test proves
        # waits before it reads what a kernel wrote: pdl_check.py), not a cooperative one (its grid starts whole)
        checked = kernel.path is not None and kernel.path.parent == kernels_dir()
        if self._pdl is not None and not cooperative and checked:
            handle.pdl = self._pdl.config(handle.head, self._stream.ptr)
        if cooperative:
            resident = self.resident_blocks(kernel, b[0] * b[1] * b[2], int(shared_mem))
            if g[0] * g[1] * g[2] > resident:
                raise BackendError(f"{kernel.name}: cooperative grid {g} is larger than the {resident} blocks "
                                   "that can be resident at once")
        return Launch(kernel, g, b, int(shared_mem), io, handle, bool(cooperative))

    def run(self, launches: Sequence[Launch]) -> None:
        launch, stream = self._launch_kernel, self._stream.ptr
        sync_each = self._sync_each and not self._capturing
        l = None
        try:
            for l in launches:
                h = l.handle
                if l.cooperative:
                    self._launch_coop(*h.head, stream, h.params_ptr)
                elif h.pdl is not None:
                    self._pdl.launch(h.pdl, h.head[0], h.params_ptr)
                else:
                    launch(*h.head, stream, h.params_ptr, 0)
                if sync_each:
                    self._stream.synchronize()
        except (*self._cuda_errors, BackendError) as exc:
            raise BackendError(f"CUDA error in kernel {l.name} (grid {l.grid}, block {l.block}): {exc}"
                               + ("" if sync_each else "; it may have come from an earlier kernel: set SHARPINF_SYNC=1")) from exc
        if l is not None:
            self._last = l.name

    def resident_blocks(self, kernel: Kernel, threads: int, shared_mem: int = 0) -> int:
        """SMs x the blocks of `kernel` one SM holds at once (the occupancy calculator)."""
        if not isinstance(kernel, CudaKernel):
            raise BackendError(f"{kernel!r} was not compiled by the cuda backend")
        drv = self.cp.cuda.driver
        with self._errors("occupancy query"):
            per_sm = drv.occupancyMaxActiveBlocksPerMultiprocessor(kernel.ptr, threads, shared_mem)
        return int(per_sm) * self.multiprocessors

    # -- memory ------------------------------------------------------------------
    def empty(self, shape, dtype) -> Any:
        with self._errors("allocation"), self._stream:
            return self.cp.empty(shape, dtype=dtype)

    def zeros(self, shape, dtype) -> Any:
        with self._errors("allocation"), self._stream:
            return self.cp.zeros(shape, dtype=dtype)

    def full(self, shape, value, dtype) -> Any:
        with self._errors("allocation"), self._stream:  # the fill kernel must run on our stream
            return self.cp.full(shape, value, dtype=dtype)

    def upload(self, host: np.ndarray) -> Any:
        host = np.ascontiguousarray(host)
        with self._errors("upload"), self._stream:
            dev = self.cp.empty(host.shape, dtype=host.dtype)
            dev.set(host, stream=self._stream)
        return dev

    def download(self, dev: Any) -> np.ndarray:
        if not isinstance(dev, self.cp.ndarray):
            raise BackendError(f"download expects a cupy array, got {type(dev).__name__}")
        with self._errors("download"):
            host = dev.get(stream=self._stream)
            self._stream.synchronize()
        return host

    def fill_bytes(self, dev: Any, byte: int) -> None:
        with self._errors("fill"):
            self.cp.cuda.runtime.memsetAsync(dev.data.ptr, int(byte), dev.nbytes, self._stream.ptr)

    def host_buffer(self, nbytes: int) -> np.ndarray:
        with self._errors("pinned allocation"):
            mem = self.cp.cuda.alloc_pinned_memory(max(1, nbytes))
        return np.frombuffer(mem, np.uint8, nbytes)  # the array keeps `mem` alive

    def _check_copy(self, host: np.ndarray, dev: Any) -> None:
        if host.nbytes != dev.nbytes or not host.flags.c_contiguous or not dev.flags.c_contiguous:
            raise BackendError(f"copy between {host.nbytes} host bytes and {dev.nbytes} device bytes: "
                               "sizes must match and both be contiguous")

    def copy_to_device(self, host: np.ndarray, dev: Any) -> None:
        self._check_copy(host, dev)
        with self._errors("host-to-device copy"):
            self.cp.cuda.runtime.memcpyAsync(dev.data.ptr, host.ctypes.data, host.nbytes, _H2D, self._stream.ptr)

    def copy_to_host(self, dev: Any, host: np.ndarray) -> None:
        self._check_copy(host, dev)
        with self._errors("device-to-host copy"):
            self.cp.cuda.runtime.memcpyAsync(host.ctypes.data, dev.data.ptr, host.nbytes, _D2H, self._stream.ptr)

    def copy_device(self, src: Any, dst: Any) -> None:
        if src.nbytes != dst.nbytes or not src.flags.c_contiguous or not dst.flags.c_contiguous:
            raise BackendError(f"device copy of {src.nbytes} bytes into {dst.nbytes}: sizes must match and both "
                               "be contiguous")
        with self._errors("device-to-device copy"):
            self.cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, _D2D, self._stream.ptr)

    def synchronize(self) -> None:
        with self._errors("synchronize"):
            self._stream.synchronize()

    def marker(self) -> Any:
        return self.cp.cuda.Event(block=False, disable_timing=True)

    def record(self, marker: Any) -> None:
        marker.record(self._stream)

    def wait(self, marker: Any) -> None:
        with self._errors("wait for a copy"):
            marker.synchronize()  # an event never recorded counts as done

    def can_time(self) -> bool:
        # not with SHARPINF_SYNC: a host sync after each launch would sit inside the timed interval
        return not (self._capturing or self._recording is not None or self.collecting_now or self._sync_each)

    def device_seconds(self, fn, repeats: int = 5, flush=None) -> float | None:
        if not self.can_time():  # nothing runs now: nothing to time
            return None
        with self.recording() as plan:  # prepared once: the timed runs are the launches alone
            fn()
        events = [tuple(self.cp.cuda.Event(block=False, disable_timing=False) for _ in range(2))
                  for _ in range(repeats)]
        with self._errors("timing a launch"):
            self.run(plan)  # untimed: first-launch costs, clocks up
            for start, end in events:
                if flush is not None:  # the weights out of L2; the host queues the run meanwhile
                    self.fill_bytes(flush, 0)
                start.record(self._stream)
                self.run(plan)
                end.record(self._stream)
            events[-1][1].synchronize()
            times = sorted(self.cp.cuda.get_elapsed_time(a, b) for a, b in events)
        return times[len(times) // 2] / 1e3

    def l2_bytes(self) -> int:
        try:
            return int(self.cp.cuda.Device().attributes.get("L2CacheSize", 0))
        except Exception:
            return 0

    @property
    def stream(self) -> Any:
        """The cupy stream every launch uses (for interop: `with backend.stream: ...`)."""
        return self._stream

    # -- device memory ------------------------------------------------------------
    def memory_info(self) -> tuple[int, int]:
        self.synchronize()
        free, total = self.cp.cuda.runtime.memGetInfo()
        # cupy's pool holds freed blocks: they are free for us too
        pool_free = self.cp.get_default_memory_pool().free_bytes()
        return int(free) + int(pool_free), int(total)

    def h2d_bandwidth(self, nbytes: int = 64 << 20) -> float:
        """Pinned host -> device, best of 5 copies of nbytes."""
        host = self.host_buffer(nbytes)
        host[:] = 1
        dev = self.empty(nbytes, np.uint8)
        best = float("inf")
        for _ in range(5):
            self.synchronize()
            t = time.perf_counter()
            self.copy_to_device(host, dev)
            self.synchronize()
            best = min(best, time.perf_counter() - t)
        del dev
        return nbytes / best / 1e9

    def device_bandwidth(self, nbytes: int = 512 << 20) -> float:
        """Device -> device copy of nbytes, best of 5: (read + written bytes) / time."""
        src, dst = self.zeros(nbytes, np.uint8), self.empty(nbytes, np.uint8)
        best = float("inf")
        for _ in range(5):
            self.synchronize()
            t = time.perf_counter()
            with self._errors("device-to-device copy"):
                self.cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes, _D2D, self._stream.ptr)
            self.synchronize()
            best = min(best, time.perf_counter() - t)
        del src, dst
        return 2 * nbytes / best / 1e9

    # -- CUDA graphs --------------------------------------------------------------
    @contextmanager
    def capture(self) -> Iterator[Graph]:
        """Capture the launches in the block into a graph. Compile kernels and allocate
        buffers before capturing: neither is legal while a stream is being captured."""
        graph = CudaGraph(self)
        free_before = self.cp.cuda.runtime.memGetInfo()[0]
        self._stream.begin_capture()
        self._capturing = True
        try:
            yield graph
        except BaseException:
            self._capturing = False
            try:
                self._stream.end_capture()
            except Exception:
                pass
            raise
        self._capturing = False
        with self._errors("graph capture"):
            graph._graph = self._stream.end_capture()  # instantiated here
            graph._graph.upload(self._stream)
            self._stream.synchronize()
        self._graph_bytes += max(0, free_before - self.cp.cuda.runtime.memGetInfo()[0])

    def graph_memory(self) -> int:
        """Device memory the driver took for graphs captured so far (free memory before - after)."""
        return self._graph_bytes

    # -- facts --------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        cp = self.cp
        rt = cp.cuda.runtime
        props = rt.getDeviceProperties(self.device_id)
        name = props["name"]
        free, total = rt.memGetInfo()
        nv_major, nv_minor = cp.cuda.nvrtc.getVersion()
        return {
            "backend": self.name,
            "device": self.device_id,
            "gpu": name.decode() if isinstance(name, bytes) else str(name),
            "compute_capability": f"{props['major']}.{props['minor']}",
            "multiprocessors": int(props.get("multiProcessorCount", 0)),
            "memory_total_bytes": int(total),
            "memory_free_bytes": int(free),
            "cuda_runtime": _version(rt.runtimeGetVersion()),
            "cuda_driver": _version(rt.driverGetVersion()),
            "nvrtc": f"{nv_major}.{nv_minor}",
            "cupy": cp.__version__,
            "kernels_dir": str(kernels_dir()),
            "cache_dir": os.environ.get("CUPY_CACHE_DIR", str(cache_dir("cupy", create=False))),
            "sync_each_launch": self._sync_each,
            "pdl": self._pdl_state,  # programmatic dependent launch (SHARPINF_PDL)
            # a probe's defines (SHARPINF_NVRTC_OPTIONS: every kernel compiled with them), so a run's
            # JSON says which build of the kernels it timed
            "nvrtc_options": os.environ.get("SHARPINF_NVRTC_OPTIONS", ""),
        }
