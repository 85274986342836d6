"""A kernel launch packed for the driver: the CUfunction, its geometry and a kernel-parameter array.

CudaBackend.prepare packs a launch once (CudaHandle): each argument becomes a ctypes value -- a
device pointer, or the C type of the NumPy scalar a launcher passes (CuPy's rule) -- and `params`,
the void*[] cuLaunchKernel reads, points at them. Replaying a plan is then one driver call a launch.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from sharpinf.errors import BackendError
from sharpinf.runtime.backend import Kernel

# C types of kernel scalars, from the NumPy scalar a launcher passes (CuPy's rule)
SCALAR_CTYPES = {
    np.dtype(np.int8): ctypes.c_int8, np.dtype(np.int16): ctypes.c_int16, np.dtype(np.int32): ctypes.c_int32,
    np.dtype(np.int64): ctypes.c_int64, np.dtype(np.uint8): ctypes.c_uint8, np.dtype(np.uint16): ctypes.c_uint16,
    np.dtype(np.uint32): ctypes.c_uint32, np.dtype(np.uint64): ctypes.c_uint64, np.dtype(np.float32): ctypes.c_float,
    np.dtype(np.float64): ctypes.c_double, np.dtype(np.bool_): ctypes.c_bool,
    np.dtype(np.float16): ctypes.c_uint16,  # passed as its bits
}


class CudaKernel(Kernel):
    def __init__(self, name: str, path: Path, fn: Any):
        self.name = name
        self.path = path
        self.fn = fn  # cupy RawKernel
        self.ptr = int(fn.kernel.ptr)  # the CUfunction

    def __repr__(self) -> str:
        return f"CudaKernel({self.name!r} from {self.path.name})"


@dataclass(eq=False)
class CudaHandle:
    head: tuple  # (CUfunction, grid x, y, z, block x, y, z, shared bytes)
    params: Any  # ctypes void*[n]: what cuLaunchKernel reads
    values: list  # the ctypes values params points at (kept alive with it)
    arrays: list  # the device arrays (kept alive: a prepared launch never points at freed memory)
    params_ptr: int
    pdl: Any = None  # pdl_launch.PdlConfig: launched by cuLaunchKernelEx as a programmatic dependent


def pack_launch(kernel: CudaKernel, grid: tuple, block: tuple, shared_mem: int, args: Sequence[Any],
                device_array: type) -> CudaHandle:
    """The handle of one launch: `args` (checked: device_array instances and NumPy scalars) as the
    parameter array."""
    values, arrays = [], []
    for i, a in enumerate(args):
        if isinstance(a, device_array):
            values.append(ctypes.c_void_p(a.data.ptr))
            arrays.append(a)
            continue
        ctype = SCALAR_CTYPES.get(a.dtype)
        if ctype is None:
            raise BackendError(f"{kernel.name}: arg {i}: no C type for a NumPy {a.dtype} scalar")
        values.append(ctype((a.view(np.uint16) if a.dtype == np.float16 else a).item()))
    params = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
    return CudaHandle((kernel.ptr, *grid, *block, int(shared_mem)), params, values, arrays, ctypes.addressof(params))
