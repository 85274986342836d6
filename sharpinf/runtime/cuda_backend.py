"""CudaBackend: cupy arrays, kernels compiled at run time by NVRTC through cupy.RawModule.

Every launch, allocation and copy runs on one dedicated non-blocking stream, so work
is ordered among itself and a CUDA graph can capture it. cupy is imported lazily:
importing this module never needs a GPU.
"""

from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from sharpinf.errors import BackendError
from sharpinf.runtime.backend import Backend, Dim3, Graph, Kernel, as_dim3
from sharpinf.runtime.args import check_args
from sharpinf.runtime.paths import cache_dir, cuda_include_dirs, kernels_dir

MAX_THREADS_PER_BLOCK = 1024


def _import_cupy():
    # cupy reads CUPY_CACHE_DIR when it compiles; point it at our cache unless the user chose one.
    os.environ.setdefault("CUPY_CACHE_DIR", str(cache_dir("cupy")))
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


def resolve_source(filename: str | os.PathLike) -> Path:
    """kernels_cu/<filename>, or the file itself when the path is absolute."""
    p = Path(filename)
    if not p.is_absolute():
        p = kernels_dir() / p
    if not p.is_file():
        raise BackendError(f"kernel source not found: {p}")
    return p


def source_with_deps(path: Path) -> tuple[str, str]:
    """(code to compile, its hash). CuPy's disk cache keys on the code and options only, so a
    changed header would be missed: the code is prefixed with a hash of the headers it can see,
    and a #line directive keeps compiler messages pointing at the real file and line."""
    h = hashlib.sha256(path.read_bytes())
    for d in dict.fromkeys([kernels_dir(), path.parent]):
        for hdr in sorted(Path(d).glob("*.cuh")) + sorted(Path(d).glob("*.h")):
            h.update(hdr.name.encode() + b"\0" + hdr.read_bytes())
    digest = h.hexdigest()
    code = f'// sharpinf source+headers sha256 {digest}\n#line 1 "{path.name}"\n' + path.read_text()
    return code, digest


class CudaKernel(Kernel):
    def __init__(self, name: str, path: Path, fn: Any):
        self.name = name
        self.path = path
        self.fn = fn

    def __repr__(self) -> str:
        return f"CudaKernel({self.name!r} from {self.path.name})"


class CudaGraph(Graph):
    def __init__(self, stream: Any):
        self._stream = stream
        self._graph = None

    def replay(self) -> None:
        if self._graph is None:
            raise BackendError("graph replayed before its capture finished")
        self._graph.launch(self._stream)


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self, device: int = 0):
        cp = _import_cupy()
        try:
            if cp.cuda.runtime.getDeviceCount() < 1:
                raise BackendError("no CUDA device found")
            self._device = cp.cuda.Device(device)
            self._device.use()
            self._stream = cp.cuda.Stream(non_blocking=True)
        except BackendError:
            raise
        except Exception as exc:  # driver missing or too old, device busy, ...
            raise BackendError(f"CUDA is not usable: {exc}") from exc
        self.cp = cp
        self.device_id = device
        self._modules: dict[tuple[str, tuple[str, ...]], Any] = {}

    # -- kernels -----------------------------------------------------------------
    def _options(self, path: Path) -> tuple[str, ...]:
        dirs = [str(kernels_dir())] + ([str(path.parent)] if path.parent != kernels_dir() else [])
        dirs += [str(d) for d in cuda_include_dirs()]  # cuda_fp16.h where NVRTC lacks it built in
        return ("-std=c++17",) + tuple(f"-I{d}" for d in dirs)

    def kernel(self, filename: str, name: str, name_expressions: Sequence[str] = ()) -> Kernel:
        path = resolve_source(filename)
        exprs = tuple(name_expressions)
        if "<" in name and name not in exprs:
            raise BackendError(f"{name!r} is a template instantiation; list it in name_expressions")
        code, digest = source_with_deps(path)
        key = (digest, exprs)
        try:
            module = self._modules.get(key)
            if module is None:
                module = self.cp.RawModule(code=code, options=self._options(path), name_expressions=exprs or None)
                self._modules[key] = module
            # RawModule compiles lazily (eagerly with name_expressions): errors surface here.
            fn = module.get_function(name)
        except Exception as exc:
            self._modules.pop(key, None)
            raise BackendError(f"{path.name}: cannot get kernel {name!r}: {exc}") from exc
        return CudaKernel(name, path, fn)

    def launch(self, kernel: Kernel, grid: Dim3, block: Dim3, args: Sequence[Any], shared_mem: int = 0) -> None:
        if not isinstance(kernel, CudaKernel):
            raise BackendError(f"{kernel!r} was not compiled by the cuda backend")
        try:
            g, b = as_dim3(grid), as_dim3(block)
        except ValueError as exc:
            raise BackendError(str(exc)) from exc
        if b[0] * b[1] * b[2] > MAX_THREADS_PER_BLOCK:
            raise BackendError(f"{kernel.name}: block {b} has more than {MAX_THREADS_PER_BLOCK} threads")
        if not isinstance(shared_mem, (int, np.integer)) or shared_mem < 0:
            raise BackendError(f"shared_mem must be a non-negative int, got {shared_mem!r}")
        args = check_args(args, lambda a: isinstance(a, self.cp.ndarray), self.name)
        try:
            with self._stream:
                kernel.fn(g, b, args, shared_mem=int(shared_mem))
        except self.cp.cuda.compiler.CompileException as exc:  # a lazily compiled module
            raise BackendError(f"{kernel.path.name}: {exc}") from exc

    # -- memory ------------------------------------------------------------------
    def empty(self, shape, dtype) -> Any:
        with self._stream:
            return self.cp.empty(shape, dtype=dtype)

    def zeros(self, shape, dtype) -> Any:
        with self._stream:
            return self.cp.zeros(shape, dtype=dtype)

    def full(self, shape, value, dtype) -> Any:
        with self._stream:  # the fill kernel must run on our stream, not the default one
            return self.cp.full(shape, value, dtype=dtype)

    def upload(self, host: np.ndarray) -> Any:
        host = np.ascontiguousarray(host)
        with self._stream:
            dev = self.cp.empty(host.shape, dtype=host.dtype)
            dev.set(host, stream=self._stream)
        return dev

    def download(self, dev: Any) -> np.ndarray:
        if not isinstance(dev, self.cp.ndarray):
            raise BackendError(f"download expects a cupy array, got {type(dev).__name__}")
        host = dev.get(stream=self._stream)
        self._stream.synchronize()
        return host

    def synchronize(self) -> None:
        self._stream.synchronize()

    @property
    def stream(self) -> Any:
        """The cupy stream every launch uses (for interop: `with backend.stream: ...`)."""
        return self._stream

    # -- device memory ------------------------------------------------------------
    def memory_info(self) -> tuple[int, int]:
        self._stream.synchronize()
        free, total = self.cp.cuda.runtime.memGetInfo()
        # cupy's pool holds freed blocks: they are free for us too
        pool_free = self.cp.get_default_memory_pool().free_bytes()
        return int(free) + int(pool_free), int(total)

    def h2d_bandwidth(self, nbytes: int = 64 << 20) -> float:
        """Pinned host -> device, best of 5 copies of nbytes."""
        import time

        pinned = self.cp.cuda.alloc_pinned_memory(nbytes)
        host = np.frombuffer(pinned, dtype=np.uint8, count=nbytes)
        host[:] = 1
        dev = self.cp.empty(nbytes, dtype=np.uint8)
        best = float("inf")
        for _ in range(5):
            self._stream.synchronize()
            t = time.perf_counter()
            dev.set(host, stream=self._stream)
            self._stream.synchronize()
            best = min(best, time.perf_counter() - t)
        del dev
        return nbytes / best / 1e9

    # -- CUDA graphs --------------------------------------------------------------
    @contextmanager
    def capture(self) -> Iterator[Graph]:
        """Capture the launches in the block into a graph. Compile kernels and allocate
        buffers before capturing: neither is legal while a stream is being captured."""
        graph = CudaGraph(self._stream)
        self._stream.begin_capture()
        try:
            yield graph
        except BaseException:
            try:
                self._stream.end_capture()
            except Exception:
                pass
            raise
        graph._graph = self._stream.end_capture()

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
            "memory_total_bytes": int(total),
            "memory_free_bytes": int(free),
            "cuda_runtime": _version(rt.runtimeGetVersion()),
            "cuda_driver": _version(rt.driverGetVersion()),
            "nvrtc": f"{nv_major}.{nv_minor}",
            "cupy": cp.__version__,
            "kernels_dir": str(kernels_dir()),
            "cache_dir": os.environ.get("CUPY_CACHE_DIR", str(cache_dir("cupy", create=False))),
        }
