"""Is the GPU usable? Each step the cuda backend needs, checked in order, each failure with its fix.

cupy imports -> a driver answers -> a device is counted -> NVRTC loads -> CUDA headers of that NVRTC's
major are found -> elementwise.cu's add_f32 compiles -> it runs and 1 + 2 == 3. The probe stops at
the first failing step (the later ones need it) and is run once per process.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
import shutil
import subprocess
from dataclasses import dataclass

import numpy as np

from sharpinf.runtime.paths import cuda_include_dirs

# A failure of one of these means there is no GPU here at all (GPU tests skip); any later one
# means a GPU whose install is broken (GPU tests fail, with the fix).
NO_GPU = ("cupy", "driver", "device")
CUDA_NO_DEVICE = 100  # cudaErrorNoDevice


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str  # what was found, or why not and "; fix: ..."


def driver_major_from_smi() -> int | None:
    """The CUDA major the driver supports ("CUDA Version: 13.0" in nvidia-smi's header), without cupy."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe], capture_output=True, text=True, timeout=20).stdout
    except Exception:
        return None
    m = re.search(r"CUDA Version:\s*(\d+)\.", out)
    return int(m.group(1)) if m else None


def cupy_major() -> int | None:
    """The CUDA major of the installed cupy wheel (cupy-cuda12x / cupy-cuda13x), if either is."""
    for major in (13, 12):
        try:
            importlib.metadata.version(f"cupy-cuda{major}x")
            return major
        except importlib.metadata.PackageNotFoundError:
            pass
    return None


def install_command(major: int | None) -> str:
    """The one line that installs the GPU stack (cupy, NVRTC, headers) for a CUDA `major` driver."""
    if major in (12, 13):
        return f'pip install -e ".[cuda{major}]"'
    return 'pip install -e ".[cuda13]" (CUDA 13 driver) or pip install -e ".[cuda12]" (CUDA 12 driver)'


def _version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"  # CUDA's 13000 -> "13.0"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _make_backend():
    from sharpinf.runtime.cuda_backend import CudaBackend

    return CudaBackend()


def _steps():
    """Yield Checks in order; the caller stops at the first that fails."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken cupy install
        smi = driver_major_from_smi()
        fix = install_command(smi) if smi else f"on a machine with an NVIDIA driver, {install_command(None)}"
        yield Check("cupy", False, f"not importable ({_first_line(exc)}); fix: {fix}")
        return
    yield Check("cupy", True, f"cupy {cupy.__version__}")
    rt = cupy.cuda.runtime

    try:
        driver = int(rt.driverGetVersion())
    except Exception as exc:
        driver, why = 0, _first_line(exc)
    else:
        why = "driver version 0"
    if driver <= 0:
        yield Check("driver", False, f"no NVIDIA driver ({why}); fix: install it (then nvidia-smi lists the GPU)")
        return
    yield Check("driver", True, f"CUDA {_version(driver)} driver")
    fix = install_command(cupy_major() or driver // 1000)  # the extra of the cupy already installed

    try:
        n = int(rt.getDeviceCount())
    except Exception as exc:
        if getattr(exc, "status", None) != CUDA_NO_DEVICE:  # e.g. cupy built for a newer CUDA than the driver
            yield Check("runtime", False, f"cupy cannot use the CUDA {_version(driver)} driver ({_first_line(exc)}); "
                                          f"fix: {install_command(driver // 1000)}")
            return
        n = 0
    if n < 1:
        yield Check("device", False, "no CUDA device visible; fix: check nvidia-smi and CUDA_VISIBLE_DEVICES")
        return
    yield Check("device", True, f"{n} device(s)")

    try:
        nv_major, nv_minor = (int(v) for v in cupy.cuda.nvrtc.getVersion())
    except Exception as exc:
        yield Check("nvrtc", False, f"NVRTC not loadable ({_first_line(exc)}); fix: {fix}")
        return
    yield Check("nvrtc", True, f"NVRTC {nv_major}.{nv_minor}")

    headers = cuda_include_dirs(nv_major)
    if not headers:
        yield Check("headers", False, f"no CUDA {nv_major} headers (cuda_fp16.h) in the pip wheels, /usr/local/cuda "
                                      f"or $CUDA_PATH; fix: {install_command(nv_major)}")
        return
    yield Check("headers", True, str(headers[0]))

    try:
        be = _make_backend()
        kernel = be.kernel("elementwise.cu", "add_f32")
    except Exception as exc:
        yield Check("compile", False, f"elementwise.cu add_f32 did not compile with NVRTC {nv_major}.{nv_minor} "
                                      f"({_first_line(exc)}); fix: {fix}")
        return
    yield Check("compile", True, "elementwise.cu add_f32")

    n = 5
    try:
        a, b = be.upload(np.ones(n, np.float32)), be.upload(np.full(n, 2, np.float32))
        out = be.upload(np.zeros(n, np.float32))
        be.launch(kernel, (1, 1, 1), (32, 1, 1), [a, b, out, np.int32(n)])
        got = np.asarray(be.download(out))
    except Exception as exc:
        yield Check("run", False, f"add_f32 failed to run ({_first_line(exc)}); the driver may be older than "
                                  f"NVRTC {nv_major}.{nv_minor}; fix: {install_command(driver // 1000)}")
        return
    if not np.array_equal(got, np.full(n, 3, np.float32)):
        yield Check("run", False, f"add_f32 gave {got.tolist()} for 1 + 2, expected 3s; fix: the GPU or driver "
                                  "is misbehaving, check nvidia-smi")
        return
    yield Check("run", True, "add_f32: 1 + 2 == 3")


@functools.cache
def cuda_checks() -> tuple[Check, ...]:
    """The probe's steps as run, up to and including the first failure."""
    checks = []
    for c in _steps():
        checks.append(c)
        if not c.ok:
            break
    return tuple(checks)


def cuda_status() -> tuple[bool, str]:
    """(usable, why): why names the failing check and its fix, or sums up what passed."""
    checks = cuda_checks()
    bad = [c for c in checks if not c.ok]
    if bad:
        return False, f"{bad[0].name}: {bad[0].detail}"
    return True, ", ".join(c.detail for c in checks if c.name in ("driver", "device", "nvrtc"))


def no_gpu_reason() -> str | None:
    """Why there is no GPU here at all (short: it is a skip reason), or None where one is, usable or not."""
    bad = [c for c in cuda_checks() if not c.ok]
    if not bad or bad[0].name not in NO_GPU:
        return None
    return f"no CUDA GPU ({bad[0].name}: {bad[0].detail.split('; fix: ')[0]})"
