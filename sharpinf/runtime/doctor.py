"""What `sharpinf doctor` reports: each step of the GPU probe, which backends run here and why not,
the GPU, the NVRTC and headers in use, the caches, and what to install for whatever is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from sharpinf.runtime.cuda_probe import cuda_checks, driver_major_from_smi, install_command
from sharpinf.runtime.paths import cache_root, cuda_include_dirs, kernels_dir, nvrtc_major, pip_nvrtc_library
from sharpinf.runtime.select import available_backends


def _dir_size(p: Path) -> int:
    """Bytes under p. A build running beside doctor makes and removes temporary files and folders
    while we walk, so whatever vanishes between listing and stat counts as nothing."""
    total = 0
    for root, _dirs, files in os.walk(p):  # os.walk skips folders that vanish (onerror=None)
        for name in files:
            try:
                total += os.stat(os.path.join(root, name), follow_symlinks=False).st_size
            except FileNotFoundError:
                pass
    return total


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
    """The NVRTC the GPU-free compile check (`make nvrtc-check`) uses, and its headers."""
    lib = pip_nvrtc_library()
    if lib is None:
        return {"path": None, "version": None, "headers": None}
    try:
        from sharpinf.runtime.nvrtc_check import Nvrtc

        major, minor = Nvrtc(lib).version()
    except Exception as exc:
        return {"path": str(lib), "version": None, "headers": None, "error": str(exc)}
    headers = cuda_include_dirs(major)
    return {"path": str(lib), "version": f"{major}.{minor}", "headers": str(headers[0]) if headers else None}


def driver_major() -> int | None:
    """The CUDA major the driver supports: from cupy when it loads, else from nvidia-smi."""
    try:
        import cupy

        v = int(cupy.cuda.runtime.driverGetVersion())
        if v > 0:
            return v // 1000
    except Exception:
        pass
    return driver_major_from_smi()


def collect() -> dict[str, Any]:
    checks = [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in cuda_checks()]
    backends = {name: {"ok": ok, "reason": why} for name, (ok, why) in available_backends().items()}
    driver = driver_major()
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
        if driver is None:
            advice.append(f"GPU backend: needs an NVIDIA driver and a GPU; then {install_command(None)}")
        else:
            advice.append(f"GPU backend, for this CUDA {driver} driver: {install_command(driver)}")
    if gxx is None:
        advice.append("CPU emulator: install g++ (e.g. `apt-get install g++`)")
    if nvrtc["version"] is None:
        advice.append('GPU-free kernel compile check: pip install -e ".[check]" (or the cuda12/cuda13 extra)')
    elif nvrtc["headers"] is None:
        advice.append(f"CUDA {nvrtc['version'].split('.')[0]} headers (cuda_fp16.h) for the compile check not found: "
                      "reinstall the extra that brought its NVRTC, or set CUDA_PATH")

    major = nvrtc_major()
    return {
        "cuda_checks": checks,  # the GPU probe, in order, up to its first failure
        "backends": backends,
        "driver_cuda_major": driver,
        "gpu": gpu,  # name, compute capability, memory, cuda runtime/driver, cupy's nvrtc
        "nvrtc_pip": nvrtc,
        "gxx": gxx,
        "nvrtc_major": major,  # cupy's NVRTC once cupy is loaded, else the pip one
        "cuda_include_dirs": [str(d) for d in cuda_include_dirs(major)],
        "kernels_dir": kdir,
        "cache_root": str(root),
        "caches": caches,
        "advice": advice,
        "kv_budget": "see `sharpinf info MODEL --backend cuda`: tokens of KV that fit after the weights",
    }


if __name__ == "__main__":
    import json

    print(json.dumps(collect(), indent=2))
