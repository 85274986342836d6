"""Launch-argument validation shared by the backends, so a call that works on one works on the other."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from sharpinf.errors import BackendError


def check_args(args: Sequence[Any], is_device_array: Callable[[Any], bool], backend_name: str) -> tuple:
    """The launch-argument rules both backends share: device arrays for pointers, NumPy
    scalars of the exact C type for values (a Python int has no C type)."""
    if not isinstance(args, (tuple, list)):
        raise BackendError(f"kernel args must be a tuple or list, got {type(args).__name__}")
    for i, a in enumerate(args):
        if is_device_array(a):
            continue
        if isinstance(a, np.generic) and isinstance(a, (np.number, np.bool_)):
            continue
        if isinstance(a, np.ndarray):
            raise BackendError(f"arg {i}: a host numpy array; upload it first (backend.upload) for the {backend_name} backend")
        if isinstance(a, (bool, int, float)):
            raise BackendError(
                f"arg {i}: Python {type(a).__name__} {a!r} has no C type; pass a NumPy scalar such as "
                f"np.int32({a!r}) or np.float32({a!r})"
            )
        raise BackendError(f"arg {i}: unsupported kernel argument of type {type(a).__name__}")
    return tuple(args)
