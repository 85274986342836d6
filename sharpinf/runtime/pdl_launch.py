"""Programmatic dependent launch from Python: cuLaunchKernelEx over ctypes.

CuPy's driver module has cuLaunchKernel and cuLaunchCooperativeKernel but not the extensible
launch, whose attributes carry CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: "this kernel
may start before the one ahead of it in the stream has finished; it waits itself" (common.cuh's
sharpinf_pdl_wait, proven for every entry by pdl_check.py). The structures below are cuda.h's
(CUDA 12.0 on): tests/test_pdl.py compiles a program against cuda.h and checks their sizes and
offsets. A stream capture turns such launches into a graph's programmatic edges (CUDA 12.3 on), so
graph replays keep the overlap.

    launcher = PdlLauncher()            # BackendError if the driver has no cuLaunchKernelEx
    cfg = launcher.config(head, stream)  # once, at prepare: grid, block, shared bytes, stream
    launcher.launch(cfg, function, params_ptr)
"""

from __future__ import annotations

import ctypes
import os
from typing import Sequence

from sharpinf.errors import BackendError
from sharpinf.runtime.backend import env_flag

PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


class LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: an id, 4 bytes of padding, a 64-byte value union (here its first int)."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("value_rest", ctypes.c_char * 60)]


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig."""

    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


def pdl_requested() -> bool:
    """SHARPINF_PDL=1 (or true/yes/on): launch with programmatic dependent launch where the GPU has it."""
    return env_flag("SHARPINF_PDL")


def check_pdl_env() -> None:
    """One line for a SHARPINF_PDL that is neither on nor off, before a long run ignores it."""
    v = os.environ.get("SHARPINF_PDL", "").strip().lower()
    if v not in ("", "0", "1", "true", "false", "yes", "no", "on", "off"):
        raise BackendError(f"SHARPINF_PDL must be 0 or 1, got {os.environ['SHARPINF_PDL']!r}")


class PdlConfig:
    """One launch's CUlaunchConfig with its attribute, kept alive together."""

    __slots__ = ("attr", "config", "ptr")

    def __init__(self, grid: Sequence[int], block: Sequence[int], shared_mem: int, stream: int):
        self.attr = LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
        self.config = LaunchConfig(*grid, *block, shared_mem, ctypes.c_void_p(stream), ctypes.pointer(self.attr), 1)
        self.ptr = ctypes.addressof(self.config)


class PdlLauncher:
    """cuLaunchKernelEx from the driver library the process already uses."""

    def __init__(self, library: str = "libcuda.so.1"):
        try:
            lib = ctypes.CDLL(library)
            fn = lib.cuLaunchKernelEx
        except (OSError, AttributeError) as exc:
            raise BackendError(f"programmatic dependent launch needs cuLaunchKernelEx (CUDA 12 driver): {exc}") from exc
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._fn = fn
        self._error_string = getattr(lib, "cuGetErrorString", None)

    def config(self, head: Sequence[int], stream: int) -> PdlConfig:
        """head: (function, grid x, y, z, block x, y, z, shared bytes), as CudaHandle keeps it."""
        return PdlConfig(head[1:4], head[4:7], head[7], stream)

    def launch(self, cfg: PdlConfig, function: int, params_ptr: int) -> None:
        rc = self._fn(cfg.ptr, function, params_ptr, None)
        if rc != 0:
            raise BackendError(f"cuLaunchKernelEx failed: {self.error_name(rc)}")

    def error_name(self, rc: int) -> str:
        if self._error_string is not None:
            s = ctypes.c_char_p()
            if self._error_string(rc, ctypes.byref(s)) == 0 and s.value:
                return f"{s.value.decode(errors='replace')} (CUresult {rc})"
        return f"CUresult {rc}"
