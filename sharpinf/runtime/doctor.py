"""What `sharpinf doctor` reports: which backends run here and why not, the GPU, the
compiler versions, the caches, and what to install for whatever is missing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from sharpinf.runtime.paths import cache_root, cuda_include_dirs, kernels_dir, pip_nvrtc_library
from sharpinf.runtime.select import CUDA_HINT, available_backends


def _dir_size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else 0


def _gxx() -> str | None:
    exe = shutil.which("g++")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout
    except Exception:
        return None
    return out.splitlines()[0] if out else None


def _gpu() -> dict[str, Any] | None:
    """The CUDA backend's own description plus the measured pinned host-to-device rate,
    or None when no GPU is usable."""
    try:
        from sharpinf.runtime.cuda_backend import CudaBackend

        be = CudaBackend()
        facts = be.describe()
        facts["h2d_pinned_gb_per_s"] = round(be.h2d_bandwidth(), 2)
        return facts
    except Exception:
        return None


def _pip_nvrtc() -> dict[str, Any]:
    lib = pip_nvrtc_library()
    if lib is None:
        return {"path": None, "version": None}
    try:
        from sharpinf.runtime.nvrtc_check import Nvrtc

        major, minor = Nvrtc(lib).version()
        return {"path": str(lib), "version": f"{major}.{minor}"}
    except Exception as exc:
        return {"path": str(lib), "version": None, "error": str(exc)}


def collect() -> dict[str, Any]:
    backends = {name: {"ok": ok, "reason": why} for name, (ok, why) in available_backends().items()}
    gpu = _gpu() if backends["cuda"]["ok"] else None
    gxx = _gxx()
    nvrtc = _pip_nvrtc()
    root = cache_root()
    caches = {}
    if root.is_dir():
        for sub in sorted(p for p in root.iterdir() if p.is_dir()):
            caches[sub.name] = {"path": str(sub), "bytes": _dir_size(sub)}
    try:
        kdir = str(kernels_dir())
    except Exception as exc:
        kdir = f"not found ({exc})"

    advice = []
    if not backends["cuda"]["ok"]:
        advice.append(f"GPU backend: {CUDA_HINT}; it also needs an NVIDIA driver and a GPU")
    if gxx is None:
        advice.append("CPU emulator: install g++ (e.g. `apt-get install g++`)")
    if nvrtc["version"] is None:
        advice.append("GPU-free kernel compile check: `pip install nvidia-cuda-nvrtc-cu12` (in the [dev] extra)")
    if not cuda_include_dirs():
        advice.append("CUDA headers (cuda_fp16.h) not found: `pip install nvidia-cuda-runtime-cu12` or set CUDA_PATH")

    return {
        "backends": backends,
        "gpu": gpu,  # name, compute capability, memory, cuda runtime/driver, cupy's nvrtc
        "nvrtc_pip": nvrtc,
        "gxx": gxx,
        "cuda_include_dirs": [str(d) for d in cuda_include_dirs()],
        "kernels_dir": kdir,
        "cache_root": str(root),
        "caches": caches,
        "advice": advice,
        "kv_budget": "see `sharpinf info MODEL --backend cuda`: tokens of KV that fit after the weights",
    }


if __name__ == "__main__":
    import json

    print(json.dumps(collect(), indent=2))
