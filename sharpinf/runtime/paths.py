"""Where things live: the kernel sources, the caches, the CUDA headers."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import sys
from pathlib import Path

from sharpinf.errors import BackendError, SharpinfError

_REPO_ROOT = Path(__file__).resolve().parents[2]  # sharpinf/runtime/paths.py -> repo root


def kernels_dir() -> Path:
    """The folder holding kernels_cu/*.cu and common.cuh.

    A source checkout or editable install uses the repo's kernels_cu/; a wheel ships the
    same files as the package `sharpinf_kernels` (see pyproject's package-dir);
    $SHARPINF_KERNELS_DIR points at another copy (an experiment beside the repo's).
    """
    env = os.environ.get("SHARPINF_KERNELS_DIR")
    if env:
        d = Path(env).expanduser()
        if not (d / "common.cuh").is_file():
            raise BackendError(f"SHARPINF_KERNELS_DIR={env}: no common.cuh there (point it at a copy of kernels_cu/)")
        return d
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
    return writable_dir(d, "SHARPINF_CACHE_DIR") if create else d


@contextlib.contextmanager
def one_builder(out: Path):
    """Across processes (pytest-xdist's workers, two shells), one builds `out` while the others
    wait for it, instead of every process making the same cached file at once."""
    with open(out.with_name(out.name + ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def writable_dir(d: Path, var: str) -> Path:
    """d, created if missing, that we can write into; else one line naming the folder and the
    environment variable that chose it (or that would choose another)."""
    env = os.environ.get(var)
    fix = f"(from {var}={env})" if env else f"(set {var} to use another folder)"
    if d.exists() and not d.is_dir():
        raise SharpinfError(f"{d} is not a folder {fix}")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SharpinfError(f"cannot create the folder {d}: {exc.strerror} {fix}") from None
    if not os.access(d, os.W_OK | os.X_OK):
        raise SharpinfError(f"the folder {d} is not writable {fix}")
    return d


# NVIDIA's pip wheels of CUDA components, by CUDA major, under the `nvidia` namespace package:
# (NVRTC's folder, its library, the headers' folder). The CUDA 12 wheels (nvidia-cuda-*-cu12) keep a
# folder per component; the CUDA 13 ones (nvidia-cuda-nvrtc, -runtime, -crt) share nvidia/cu13/.
PIP_LAYOUT: dict[int, tuple[tuple[str, ...], str, tuple[str, ...]]] = {
    12: (("cuda_nvrtc", "lib"), "libnvrtc.so.12", ("cuda_runtime", "include")),
    13: (("cu13", "lib"), "libnvrtc.so.13", ("cu13", "include")),
}
SYSTEM_CUDA = Path("/usr/local/cuda")


def _pip_nvidia_dirs(*parts: str) -> list[Path]:
    """<site-packages>/nvidia/<parts...> for the pip CUDA wheels (a namespace package)."""
    try:
        import nvidia  # namespace package from the nvidia-cuda-* wheels
    except ImportError:
        return []
    return [Path(p, *parts) for p in getattr(nvidia, "__path__", [])]


def pip_nvrtc_libraries() -> dict[int, Path]:
    """{CUDA major: libnvrtc.so.N} for each pip NVRTC wheel installed."""
    found = {}
    for major, (lib_dir, name, _) in PIP_LAYOUT.items():
        for d in _pip_nvidia_dirs(*lib_dir):
            if (d / name).is_file():
                found.setdefault(major, d / name)
    return found


def pip_nvrtc_library(major: int | None = None) -> Path | None:
    """The pip NVRTC of CUDA `major`; by default the newest one installed (one, where the
    install follows the Makefile: a venv never holds two majors)."""
    libs = pip_nvrtc_libraries()
    if major is not None:
        return libs.get(major)
    return libs[max(libs)] if libs else None


def nvrtc_major() -> int | None:
    """The major of the NVRTC that compiles here: cupy's once cupy is imported (the cuda backend's
    compiler), else the pip wheel's (the compile check's); None when there is neither."""
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            return int(cupy.cuda.nvrtc.getVersion()[0])
        except Exception:  # cupy without a loadable NVRTC: the pip one may still be there
            pass
    libs = pip_nvrtc_libraries()
    return max(libs) if libs else None


def header_major(include_dir: Path) -> int | None:
    """The CUDA major of a header folder, from `#define CUDA_VERSION 12090` in its cuda.h."""
    try:
        m = re.search(r"^#define\s+CUDA_VERSION\s+(\d+)", (include_dir / "cuda.h").read_text(errors="replace"), re.M)
    except OSError:
        return None
    return int(m.group(1)) // 1000 if m else None


def cuda_include_dirs(major: int | None = None) -> list[Path]:
    """The folder with cuda_fp16.h & co. for NVRTC `major` (default: nvrtc_major()): the pip wheel
    of that major, else /usr/local/cuda/include or $CUDA_PATH/include when their cuda.h says the
    same major -- an NVRTC never compiles against another major's headers. With no NVRTC at all
    (the emulator's case) any set will do. Empty when none is found."""
    major = major or nvrtc_major()
    majors = [major] if major else sorted(PIP_LAYOUT)
    candidates = [d for m in majors if m in PIP_LAYOUT for d in _pip_nvidia_dirs(*PIP_LAYOUT[m][2])]
    system = [SYSTEM_CUDA / "include"]
    if os.environ.get("CUDA_PATH"):
        system.append(Path(os.environ["CUDA_PATH"]) / "include")
    candidates += [d for d in system if major is None or header_major(d) == major]
    for c in candidates:
        if (c / "cuda_fp16.h").is_file():
            return [c]
    return []
