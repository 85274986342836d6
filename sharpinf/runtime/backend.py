"""The backend interface: the one surface model and engine code use to run kernels.

Two implementations: CudaBackend (cupy arrays, NVRTC) and EmuBackend (numpy arrays,
g++ against the CPU emulator). Code above this layer never asks which one it has.

Kernel arguments follow CuPy's RawKernel convention: device arrays are passed as
pointers, scalars must be NumPy scalars of the exact C type (np.int32, np.float32,
np.uint32, np.int64, ...), so the same call works on both backends.

A launch is checked and packed once by `prepare` into a `Launch`; `run` replays a list of
them with no further checks. `launch` is prepare + run. Inside `recording()` launches are
collected instead of run: that is how the forward pass turns one step into a plan (a list
of Launches over fixed buffers) that eager mode runs and a CUDA graph captures.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from sharpinf.errors import BackendError

Dim3 = int | tuple[int] | tuple[int, int] | tuple[int, int, int]


def env_flag(name: str) -> bool:
    """An on/off environment switch (SHARPINF_SYNC, SHARPINF_PDL, the emulator's checks): 1, true, yes, on."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def as_dim3(d: Dim3) -> tuple[int, int, int]:
    t = (d,) if isinstance(d, int) else tuple(d)
    if not 1 <= len(t) <= 3 or any((not isinstance(x, (int, np.integer))) or x < 1 for x in t):
        raise ValueError(f"grid/block dimensions must be 1 to 3 positive ints, got {d!r}")
    return tuple(int(x) for x in t) + (1,) * (3 - len(t))


# A cooperative launch on the emulator runs each block on its own OS thread: a few suffice to
# exercise every cross-block order a grid barrier must make right.
EMU_RESIDENT_BLOCKS = 4


class Kernel(ABC):
    """A compiled `extern "C" __global__` entry point (or a template instantiation)."""

    name: str


@dataclass(eq=False)
class Launch:
    """One kernel launch with its arguments checked and packed: run it any number of times.

    io: (bytes read, bytes written) as the launcher counts them (the host bench reports them);
    handle: the backend's packed form (CUDA: a kernel-parameter array; emu: argument bytes)."""

    kernel: Kernel
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    io: tuple[int, int] | None
    handle: Any
    cooperative: bool = False  # every block resident at once: the kernel may call sharpinf_grid_sync

    @property
    def name(self) -> str:
        return self.kernel.name


class Graph(ABC):
    """A captured sequence of launches that can be replayed."""

    @abstractmethod
    def replay(self) -> None: ...


class Wanted(list):
    """collecting()'s list of (file, entry), one a launch, and `also`: the kernels a step may launch
    in their place (compiled ahead all the same)."""

    def __init__(self):
        super().__init__()
        self.also: list[tuple[str, str]] = []


class Backend(ABC):
    name: str  # "cuda", "emu" or "trace"
    gpu_shapes: bool = False  # launchers pick grids for a GPU (cuda, trace) or for the emulator
    # the GPU's SMs, for launchers whose choice depends on filling them (matmul=best); 0 on the
    # emulator, where no such rule applies
    multiprocessors: int = 0
    _recording: list[Launch] | None = None
    _collecting: list[tuple[str, str]] | None = None

    # -- kernels ---------------------------------------------------------------
    @abstractmethod
    def kernel(self, filename: str, name: str, name_expressions: Sequence[str] = ()) -> Kernel:
        """Compile (cached) kernels_cu/<filename> and return entry point `name`.

        `name` may be a template instantiation such as "matmul_q<2>", in which case it
        must also appear in `name_expressions` (every instantiation the module needs).
        """

    @abstractmethod
    def prepare(self, kernel: Kernel, grid: Dim3, block: Dim3, args: Sequence[Any], shared_mem: int = 0,
                io: tuple[int, int] | None = None, cooperative: bool = False) -> Launch:
        """Check the launch (dimensions, argument types) and pack its arguments, once.
        cooperative: all blocks must be resident at once (a kernel calling sharpinf_grid_sync;
        the grid no larger than `resident_blocks` says)."""

    @abstractmethod
    def run(self, launches: Sequence[Launch]) -> None:
        """Run prepared launches in order on the backend's stream (asynchronous on CUDA);
        inside capture() they are captured instead."""

    def resident_blocks(self, kernel: Kernel, threads: int, shared_mem: int = 0) -> int:
        """How many blocks of `kernel` (threads each, shared_mem dynamic bytes) can be resident
        at once: the largest grid a cooperative launch may have. The emulator holds a small
        fixed number (one OS thread each); the CUDA backend asks the occupancy calculator."""
        return EMU_RESIDENT_BLOCKS

    def compile(self, requests: Sequence[tuple[str, str]], progress=None) -> None:
        """Compile ahead the entry points `requests` names [(file, entry)]; progress(file) is
        called before each file. The CUDA backend compiles only those entries of each file."""
        for filename in dict.fromkeys(f for f, _ in requests):
            if progress is not None:
                progress(filename)
            for f, name in requests:
                if f == filename:
                    self.kernel(f, name)

    @contextmanager
    def collecting(self) -> Iterator[Wanted]:
        """`with be.collecting() as wanted: ...launchers...`: the (file, entry) pairs the
        launchers ask for, one a launch, with nothing compiled or run (ops.launch.kernel honours
        it); `wanted.also`: those they may launch instead (also_wanted), to compile ahead."""
        wanted = Wanted()
        self._collecting = wanted
        try:
            yield wanted
        finally:
            self._collecting = None

    @contextmanager
    def also_wanted(self) -> Iterator[None]:
        """Inside collecting(): what the launchers ask for in the block goes to `wanted.also`, not
        among the launches (a tuner's other candidates: compiled ahead, not counted)."""
        outer = self._collecting
        if outer is None:
            raise BackendError("also_wanted() is for inside collecting()")
        self._collecting = outer.also
        try:
            yield
        finally:
            self._collecting = outer

    def collect(self, filename: str, name: str) -> bool:
        """Inside collecting(): note that a launcher wants (file, entry) and return True, so it
        compiles nothing; outside, False."""
        if self._collecting is None:
            return False
        self._collecting.append((filename, name))
        return True

    def launch(self, kernel: Kernel, grid: Dim3, block: Dim3, args: Sequence[Any], shared_mem: int = 0,
               io: tuple[int, int] | None = None, cooperative: bool = False) -> None:
        """prepare + run; inside recording() the launch is collected, not run."""
        if self._collecting is not None:
            return
        l = self.prepare(kernel, grid, block, args, shared_mem, io, cooperative)
        if self._recording is not None:
            self._recording.append(l)
        else:
            self.run((l,))

    @contextmanager
    def recording(self) -> Iterator[list[Launch]]:
        """`with be.recording() as plan: ...launchers...`: the launches, prepared, not run."""
        if self._recording is not None:
            raise BackendError("recording() does not nest")
        plan: list[Launch] = []
        self._recording = plan
        try:
            yield plan
        finally:
            self._recording = None

    @property
    def collecting_now(self) -> bool:
        """Inside collecting(): launchers only say which kernels they want."""
        return self._collecting is not None

    @contextmanager
    def eager(self) -> Iterator[None]:
        """Launches inside run now, even inside recording() (a tuner timing its candidates while the
        plan that asked it is being recorded); the recording goes on after the block."""
        saved, self._recording = self._recording, None
        try:
            yield
        finally:
            self._recording = saved

    def can_time(self) -> bool:
        """device_seconds can time launches now: a device clock, and launches that run (not recorded,
        not captured)."""
        return False

    def device_seconds(self, fn: Callable[[], Any], repeats: int = 5, flush: Any = None) -> float | None:
        """Seconds of device time fn()'s launches take, by the device's clock: recorded once, run once
        untimed, then `repeats` times, each between two events, the median. `flush`: a device buffer
        (twice the L2 cache: l2_bytes) overwritten before each timed run, so the run reads its weights
        from memory as a step does, not from the cache the run before filled. None where there is no
        such clock (the emulator, the trace backend) or nothing runs now (can_time)."""
        return None

    def l2_bytes(self) -> int:
        """The device's L2 cache in bytes (0: none to speak of, or unknown)."""
        return 0

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
    def fill_bytes(self, dev: Any, byte: int) -> None:
        """Set every byte of a device array (poisoning, zeroing), in stream order."""

    @abstractmethod
    def host_buffer(self, nbytes: int) -> np.ndarray:
        """A uint8 host array that copies can use asynchronously (pinned memory on CUDA)."""

    @abstractmethod
    def copy_to_device(self, host: np.ndarray, dev: Any) -> None:
        """dev[...] = host, asynchronous in stream order; host must stay untouched until the
        next synchronize() (it is pinned staging memory, see host_buffer)."""

    @abstractmethod
    def copy_to_host(self, dev: Any, host: np.ndarray) -> None:
        """host[...] = dev, asynchronous in stream order: read host only after synchronize()."""

    @abstractmethod
    def copy_device(self, src: Any, dst: Any) -> None:
        """dst[...] = src between two contiguous device arrays of one size, in stream order."""

    @abstractmethod
    def synchronize(self) -> None: ...

    def marker(self) -> Any:
        """A reusable point in the stream's work (a CUDA event); None where work is synchronous."""
        return None

    def record(self, marker: Any) -> None:
        """Move `marker` to the end of the work queued so far."""

    def wait(self, marker: Any) -> None:
        """Block the host until the work before `marker` is done (e.g. an async copy out of a
        staging buffer the host is about to overwrite)."""

    # -- CUDA graphs -----------------------------------------------------------
    @abstractmethod
    def capture(self) -> AbstractContextManager[Graph]:
        """`with backend.capture() as g: backend.run(plan)` then `g.replay()`."""

    def graph_memory(self) -> int | None:
        """Device bytes the captured graphs hold, where the backend can tell (None: unknown)."""
        return None

    # -- device memory (the KV budget probe) ------------------------------------
    def memory_info(self) -> tuple[int, int] | None:
        """(free, total) device bytes, or None where memory is the host's (the emulator)."""
        return None

    def h2d_bandwidth(self, nbytes: int = 64 << 20) -> float | None:
        """Measured pinned host-to-device copy rate in GB/s, or None where there is no copy."""
        return None

    def device_bandwidth(self, nbytes: int = 512 << 20) -> float | None:
        """Measured device memory bandwidth in GB/s (bytes read + written by a device-to-device
        copy), the roofline the bench compares kernels with; None where memory is the host's."""
        return None

    # -- facts -----------------------------------------------------------------
    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """What `sharpinf doctor` shows: device name, memory, compiler versions, cache dir."""
