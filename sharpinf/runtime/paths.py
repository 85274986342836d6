"""Where things live: the kernel sources, the caches, the CUDA headers."""

from __future__ import annotations

import os
from pathlib import Path

from sharpinf.errors import BackendError

_REPO_ROOT = Path(__file__).resolve().parents[2]  # sharpinf/runtime/paths.py -> repo root


def kernels_dir() -> Path:
    """The folder holding kernels_cu/*.cu and common.cuh.

    A source checkout or editable install uses the repo's kernels_cu/; a wheel ships the
    same files as the package `sharpinf_kernels` (see pyproject's package-dir).
    """
    local = _REPO_ROOT / "kernels_cu"
    if (local / "common.cuh").is_file():
        return local
    try:
        import importlib.util

        # a namespace package (no __init__.py): its folder is its one search location
        installed = Path(list(importlib.util.find_spec("sharpinf_kernels").submodule_search_locations)[0])
    except Exception as exc:  # not installed, or not a real folder
        raise BackendError(f"kernel sources not found: no {local} and no package sharpinf_kernels ({exc})") from exc
    if not (installed / "common.cuh").is_file():
        raise BackendError(f"kernel sources not found: {installed} has no common.cuh")
    return installed


def cache_root() -> Path:
    """~/.cache/sharpinf, or $SHARPINF_CACHE_DIR."""
    env = os.environ.get("SHARPINF_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "sharpinf"


def cache_dir(sub: str, create: bool = True) -> Path:
    """A named cache folder (e.g. "cupy", "emu") under cache_root(); created unless create=False."""
    d = cache_root() / sub
    if create:
        d.mkdir(parents=True, exist_ok=True)
    return d


def _pip_nvidia_dirs(*parts: str) -> list[Path]:
    """<site-packages>/nvidia/<parts...> for the pip CUDA wheels (a namespace package)."""
    try:
        import nvidia  # namespace package from nvidia-cuda-*-cu12 wheels
    except ImportError:
        return []
    return [Path(p, *parts) for p in getattr(nvidia, "__path__", [])]


def cuda_include_dirs() -> list[Path]:
    """Headers for cuda_fp16.h & co.: the pip nvidia-cuda-runtime wheel, else
    /usr/local/cuda/include, else $CUDA_PATH/include. Empty when none is found (NVRTC
    then relies on its built-in headers)."""
    candidates = _pip_nvidia_dirs("cuda_runtime", "include") + [Path("/usr/local/cuda/include")]
    if os.environ.get("CUDA_PATH"):
        candidates.append(Path(os.environ["CUDA_PATH"]) / "include")
    for c in candidates:
        if (c / "cuda_fp16.h").is_file():
            return [c]
    return []


def pip_nvrtc_library() -> Path | None:
    """libnvrtc.so.12 from the pip package nvidia-cuda-nvrtc-cu12, if installed."""
    for d in _pip_nvidia_dirs("cuda_nvrtc", "lib"):
        for name in ("libnvrtc.so.12", "libnvrtc.so"):
            if (d / name).is_file():
                return d / name
    return None
