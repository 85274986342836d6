"""Pick a backend by name: "cuda", "emu", or "auto" (cuda when the GPU probe passes, else emu);
"trace" (launches checked and counted, none run: the host-cost bench) only when named."""

from __future__ import annotations

import os
import shutil
from typing import Any

from sharpinf.errors import BackendError
from sharpinf.runtime.backend import Backend
from sharpinf.runtime.cuda_probe import cuda_checks, cuda_status  # noqa: F401  (cuda_checks: for doctor)

NAMES = ("auto", "cuda", "emu", "trace")
EMU_HINT = "the emulator needs g++ on PATH (e.g. `apt-get install g++`)"

_last_auto: tuple[str, str] | None = None  # what the last get_backend call picked for "auto", and why


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


def last_auto_choice() -> tuple[str, str] | None:
    """(name, why) that the last get_backend call picked for "auto"; None when it was given a backend."""
    return _last_auto


def get_backend(name: str | None = None, **options: Any) -> Backend:
    """The backend `name` (else $SHARPINF_BACKEND, else "auto"), built with `options`
    (CudaBackend: device; EmuBackend: order, strict, workers)."""
    global _last_auto
    _last_auto = None
    name = (name or os.environ.get("SHARPINF_BACKEND") or "auto").strip().lower()
    if name not in NAMES:
        raise BackendError(f"unknown backend {name!r}; choose one of {', '.join(NAMES)}")
    if name == "auto":
        ok, why = cuda_status()
        name = "cuda" if ok else "emu"
        _last_auto = (name, why)
    if name == "cuda":
        ok, why = cuda_status()
        if not ok:  # why names the failing check and its fix
            raise BackendError(f"cuda backend unavailable: {why}")
        from sharpinf.runtime.cuda_backend import CudaBackend

        return CudaBackend(**options)
    ok, why = emu_status()
    if not ok:  # the trace backend learns kernel signatures from the emulator's builds too
        raise BackendError(f"{name} backend unavailable: {why}")
    if name == "trace":
        from sharpinf.runtime.trace_backend import TraceBackend

        return TraceBackend()
    from sharpinf.runtime.emu_backend import EmuBackend

    return EmuBackend(**options)
