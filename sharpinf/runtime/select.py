"""Pick a backend by name: "cuda", "emu", or "auto" (cuda when a GPU is usable, else emu)."""

from __future__ import annotations

import os
import shutil
from typing import Any

from sharpinf.errors import BackendError
from sharpinf.runtime.backend import Backend

NAMES = ("auto", "cuda", "emu")
CUDA_HINT = "install cupy with `pip install -e .[cuda12]` (CUDA 12 driver) or `pip install -e .[cuda13]` (CUDA 13 driver)"
EMU_HINT = "the emulator needs g++ on PATH (e.g. `apt-get install g++`)"


def cuda_status() -> tuple[bool, str]:
    """(usable, why): cupy importable and at least one device answering."""
    try:
        import cupy
    except Exception as exc:
        return False, f"cupy not importable ({type(exc).__name__}: {exc}); {CUDA_HINT}"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, driver too old for this cupy, ...
        return False, f"no usable CUDA driver/device ({exc})"
    if n < 1:
        return False, "no CUDA device found"
    return True, f"{n} CUDA device(s)"


def emu_status() -> tuple[bool, str]:
    try:
        from sharpinf.runtime.emu_backend import EmuBackend  # noqa: F401
    except Exception as exc:
        return False, f"emulator not importable ({type(exc).__name__}: {exc})"
    gxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("g++")
    if gxx is None:
        return False, f"g++ not found; {EMU_HINT}"
    return True, f"g++ at {gxx}"


def available_backends() -> dict[str, tuple[bool, str]]:
    """{"cuda": (ok, reason), "emu": (ok, reason)}."""
    return {"cuda": cuda_status(), "emu": emu_status()}


def get_backend(name: str | None = None, **options: Any) -> Backend:
    """The backend `name` (else $SHARPINF_BACKEND, else "auto"), built with `options`
    (CudaBackend: device; EmuBackend: order, strict, workers)."""
    name = (name or os.environ.get("SHARPINF_BACKEND") or "auto").strip().lower()
    if name not in NAMES:
        raise BackendError(f"unknown backend {name!r}; choose one of {', '.join(NAMES)}")
    if name == "auto":
        name = "cuda" if cuda_status()[0] else "emu"
    if name == "cuda":
        ok, why = cuda_status()
        if not ok:
            hint = "" if CUDA_HINT in why else f"; {CUDA_HINT}"
            raise BackendError(f"cuda backend unavailable: {why}{hint}")
        from sharpinf.runtime.cuda_backend import CudaBackend

        return CudaBackend(**options)
    ok, why = emu_status()
    if not ok:
        raise BackendError(f"emu backend unavailable: {why}")
    from sharpinf.runtime.emu_backend import EmuBackend

    return EmuBackend(**options)
