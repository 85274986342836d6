"""The backend interface: the one surface model and engine code use to run kernels.

Two implementations: CudaBackend (cupy arrays, NVRTC) and EmuBackend (numpy arrays,
g++ against the CPU emulator). Code above this layer never asks which one it has.

Kernel arguments follow CuPy's RawKernel convention: device arrays are passed as
pointers, scalars must be NumPy scalars of the exact C type (np.int32, np.float32,
np.uint32, np.int64, ...), so the same call works on both backends.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from typing import Any, Sequence

import numpy as np

Dim3 = int | tuple[int] | tuple[int, int] | tuple[int, int, int]


def as_dim3(d: Dim3) -> tuple[int, int, int]:
    t = (d,) if isinstance(d, int) else tuple(d)
    if not 1 <= len(t) <= 3 or any((not isinstance(x, (int, np.integer))) or x < 1 for x in t):
        raise ValueError(f"grid/block dimensions must be 1 to 3 positive ints, got {d!r}")
    return tuple(int(x) for x in t) + (1,) * (3 - len(t))


class Kernel(ABC):
    """A compiled `extern "C" __global__` entry point (or a template instantiation)."""

    name: str


class Graph(ABC):
    """A captured sequence of launches that can be replayed."""

    @abstractmethod
    def replay(self) -> None: ...


class Backend(ABC):
    name: str  # "cuda" or "emu"

    # -- kernels ---------------------------------------------------------------
    @abstractmethod
    def kernel(self, filename: str, name: str, name_expressions: Sequence[str] = ()) -> Kernel:
        """Compile (cached) kernels_cu/<filename> and return entry point `name`.

        `name` may be a template instantiation such as "matmul_q<2>", in which case it
        must also appear in `name_expressions` (every instantiation the module needs).
        """

    @abstractmethod
    def launch(self, kernel: Kernel, grid: Dim3, block: Dim3, args: Sequence[Any], shared_mem: int = 0) -> None:
        """Launch on the backend's current stream; asynchronous on CUDA."""

    # -- memory ----------------------------------------------------------------
    @abstractmethod
    def empty(self, shape, dtype) -> Any: ...

    @abstractmethod
    def zeros(self, shape, dtype) -> Any: ...

    def full(self, shape, value, dtype) -> Any:
        a = self.empty(shape, dtype)
        a[...] = value
        return a

    @abstractmethod
    def upload(self, host: np.ndarray) -> Any:
        """A device copy of a host array (same shape and dtype)."""

    @abstractmethod
    def download(self, dev: Any) -> np.ndarray:
        """A host copy of a device array; waits for pending work."""

    @abstractmethod
    def synchronize(self) -> None: ...

    # -- CUDA graphs -----------------------------------------------------------
    @abstractmethod
    def capture(self) -> AbstractContextManager[Graph]:
        """`with backend.capture() as g: ...launches...` then `g.replay()`."""

    # -- device memory (the KV budget probe) ------------------------------------
    def memory_info(self) -> tuple[int, int] | None:
        """(free, total) device bytes, or None where memory is the host's (the emulator)."""
        return None

    def h2d_bandwidth(self, nbytes: int = 64 << 20) -> float | None:
        """Measured pinned host-to-device copy rate in GB/s, or None where there is no copy."""
        return None

    # -- facts -----------------------------------------------------------------
    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """What `sharpinf doctor` shows: device name, memory, compiler versions, cache dir."""
