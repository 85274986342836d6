"""Compile kernel sources with NVRTC -- the compiler CuPy uses -- without a GPU.

NVRTC's C API is loaded with ctypes from a pip NVRTC wheel -- CUDA 12 from the `check` extra,
or CUDA 13 from `cuda13` on a GPU machine -- with the CUDA headers of the same major, and
each source is compiled to a CUBIN for every requested arch ("sm_80", "sm_90"), so
ptxas runs too and inline-asm mistakes (mma/ldmatrix/cp.async operands) are caught.
An arch spelled "compute_XX" stops at PTX.

A file's verdict and log are cached on disk (~/.cache/sharpinf/nvrtc), keyed by everything the
compile reads: the source, every local header it reaches, the options (include paths and arch),
the NVRTC library and version. The NVRTC check, the ptxas report of `bench --suite kernels` and
`make gpu-check`'s copy of it then compile each file once between them (SHARPINF_NVRTC_CACHE=0:
always compile).

    python -m sharpinf.runtime.nvrtc_check [extra_dir ...]
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from sharpinf.errors import BackendError
from sharpinf.runtime import paths
from sharpinf.runtime.paths import cuda_include_dirs, kernels_dir, pip_nvrtc_library

DEFAULT_ARCHS = ("sm_80", "sm_90")


@dataclass(frozen=True)
class Result:
    file: str
    arch: str
    ok: bool
    log: str
    # sm_90 and later: each entry's programmatic-dependent-launch verdict (pdl_check.entry_verdicts:
    # None where it keeps the contract); None for an arch without it or a failed compile
    pdl: dict | None = None


class Nvrtc:
    """The few NVRTC entry points we need, over ctypes."""

    def __init__(self, path: str | Path | None = None):
        path = path or pip_nvrtc_library()
        if path is None:
            raise BackendError('NVRTC not found: pip install -e ".[check]" (or the cuda12/cuda13 extra)')
        try:
            self.lib = ctypes.CDLL(str(path))
        except OSError as exc:
            raise BackendError(f"cannot load NVRTC from {path}: {exc}") from exc
        self.path = Path(path)
        lib = self.lib
        P = ctypes.c_void_p
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
        lib.nvrtcVersion.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
        lib.nvrtcCreateProgram.argtypes = [ctypes.POINTER(P), ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                                           ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p)]
        lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(P)]
        lib.nvrtcAddNameExpression.argtypes = [P, ctypes.c_char_p]
        lib.nvrtcCompileProgram.argtypes = [P, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.nvrtcGetProgramLogSize.argtypes = [P, ctypes.POINTER(ctypes.c_size_t)]
        lib.nvrtcGetProgramLog.argtypes = [P, ctypes.c_char_p]
        for stem in ("PTX", "CUBIN"):
            getattr(lib, f"nvrtcGet{stem}Size").argtypes = [P, ctypes.POINTER(ctypes.c_size_t)]
            getattr(lib, f"nvrtcGet{stem}").argtypes = [P, ctypes.c_char_p]
        self.major = self.version()[0]  # picks the CUDA headers of the same major

    def version(self) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        return major.value, minor.value

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise BackendError(f"{what}: {self.lib.nvrtcGetErrorString(rc).decode()}")

    def compile(self, source: str, name: str, options: Sequence[str],
                name_expressions: Sequence[str] = (), ptx: bool = False) -> tuple[bool, str, bytes]:
        """(ok, log, PTX or CUBIN bytes); with ptx=True the PTX whatever the target (NVRTC keeps it
        beside a CUBIN). Never raises for a compile error: the log says why."""
        prog = ctypes.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
                    "nvrtcCreateProgram")
        try:
            for expr in name_expressions:
                self._check(self.lib.nvrtcAddNameExpression(prog, expr.encode()), "nvrtcAddNameExpression")
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            rc = self.lib.nvrtcCompileProgram(prog, len(options), opts)
            size = ctypes.c_size_t()
            self._check(self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
            buf = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
            log = buf.value.decode(errors="replace")
            if rc != 0:
                err = self.lib.nvrtcGetErrorString(rc).decode()
                return False, f"{err}\n{log}".strip(), b""
            real = any(o.startswith("--gpu-architecture=sm_") for o in options)
            stem = "CUBIN" if real and not ptx else "PTX"
            self._check(getattr(self.lib, f"nvrtcGet{stem}Size")(prog, ctypes.byref(size)), f"nvrtcGet{stem}Size")
            out = ctypes.create_string_buffer(size.value)
            self._check(getattr(self.lib, f"nvrtcGet{stem}")(prog, out), f"nvrtcGet{stem}")
            return True, log, out.raw
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


def compile_options(arch: str, include_dirs: Iterable[Path] = (), major: int | None = None) -> list[str]:
    """NVRTC flags; `major` is the NVRTC's CUDA major, whose headers are used."""
    opts = [f"--gpu-architecture={arch}", "-std=c++17", f"-I{kernels_dir()}"]
    opts += [f"-I{d}" for d in include_dirs]
    opts += [f"-I{d}" for d in cuda_include_dirs(major)]
    return opts


compiles = 0  # NVRTC compiles this process ran (the rest came from the cache; tests count them)


@functools.cache
def _checker_source() -> str:
    """pdl_check.py's text: the cached PDL verdicts are its, so a change to it is a cache miss."""
    return (Path(__file__).parent / "pdl_check.py").read_text()


def _cache_key(nvrtc: Nvrtc, path: Path, source: str, options: Sequence[str], name_expressions: Sequence[str]) -> str:
    from sharpinf.runtime.emu.source import local_headers

    h = hashlib.sha256()
    search = [Path(o[2:]) for o in options if o.startswith("-I")]
    for part in (str(nvrtc.path), repr(nvrtc.version()), path.name, source, *options, "\0", *name_expressions,
                 _checker_source()):
        h.update(part.encode())
        h.update(b"\0")
    for header in local_headers(path.resolve(), search):
        h.update(str(header).encode() + b"\0" + header.read_bytes() + b"\0")
    return h.hexdigest()[:32]


def pdl_arch(options: Sequence[str]) -> bool:
    """Whether the compile's target has programmatic dependent launch (sm_90 and later)."""
    archs = [o.split("=", 1)[1] for o in options if o.startswith("--gpu-architecture=")]
    number = archs[-1].split("_")[-1].rstrip("af") if archs else ""  # sm_90a -> 90
    return number.isdigit() and int(number) >= 90


def _compile_checked(nvrtc: Nvrtc, path: Path, source: str, options: Sequence[str],
                     name_expressions: Sequence[str]) -> tuple[bool, str, dict | None]:
    """One compile: (ok, log, the entries' PDL verdicts where the target has PDL)."""
    global compiles
    compiles += 1
    want = pdl_arch(options)
    ok, log, ptx = nvrtc.compile(source, path.name, options, name_expressions, ptx=want)
    if not (ok and want):
        return ok, log, None
    from sharpinf.runtime.pdl_check import entry_verdicts

    return ok, log, entry_verdicts(ptx.rstrip(b"\0").decode(errors="replace"))


def compile_file(nvrtc: Nvrtc, path: Path, options: Sequence[str],
                 name_expressions: Sequence[str] = ()) -> tuple[bool, str, dict | None]:
    """(ok, log, PDL verdicts or None) of compiling one kernels file, from the cache when nothing it
    reads has changed."""
    source = path.read_text()
    if os.environ.get("SHARPINF_NVRTC_CACHE", "1").strip() == "0":
        return _compile_checked(nvrtc, path, source, options, name_expressions)
    out = paths.cache_dir("nvrtc") / f"{path.stem}-{_cache_key(nvrtc, path, source, options, name_expressions)}.json"
    with paths.one_builder(out):  # a second process waits for the first's result
        if out.exists():
            try:
                hit = json.loads(out.read_text())
                return bool(hit["ok"]), str(hit["log"]), hit["pdl"]
            except (OSError, ValueError, KeyError):
                pass  # a damaged entry, or one from before the PDL verdicts: compile again
        ok, log, pdl = _compile_checked(nvrtc, path, source, options, name_expressions)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"ok": ok, "log": log, "pdl": pdl}))
        os.replace(tmp, out)
    return ok, log, pdl


def check_file(path: Path, archs: Sequence[str] = DEFAULT_ARCHS, nvrtc: Nvrtc | None = None,
               name_expressions: Sequence[str] = (), ptxas_verbose: bool = False,
               debug_archs: Sequence[str] = (), extra_options: Sequence[str] = ()) -> list[Result]:
    """Compile one file per arch; with ptxas_verbose the log carries ptxas -v's per-entry facts
    (registers, spills: ptxas_report.parse_ptxas_log) at no extra compile. An arch in debug_archs
    compiles with -G: NVVM and ptxas unoptimized, ~4x faster over kernels_cu/ -- every source still
    goes through the front end and every instruction through that arch's ptxas, but its registers
    and spills are not the optimized build's."""
    nvrtc = nvrtc or Nvrtc()
    path = Path(path)
    results = []
    extra = (["--ptxas-options=-v"] if ptxas_verbose else []) + list(extra_options)
    for arch in archs:
        debug = ["-G"] if arch in debug_archs else []
        ok, log, pdl = compile_file(nvrtc, path, compile_options(arch, [path.parent], nvrtc.major) + extra + debug,
                                    name_expressions)
        results.append(Result(str(path), arch, ok, log, pdl))
    return results


def check_all(archs: Sequence[str] = DEFAULT_ARCHS, extra_dirs: Iterable[str | Path] = (),
              include_kernels: bool = True, jobs: int | None = None, ptxas_verbose: bool = False,
              debug: Callable[[Path, str], bool] | None = None,
              only: Callable[[Path, str], bool] | None = None) -> list[Result]:
    """Compile every kernels_cu/*.cu (and every *.cu in extra_dirs) for each arch (with -G where
    debug(file, arch) says so: check_file's debug_archs), or only the (file, arch) pairs `only` keeps.

    Compiles run in `jobs` threads (default: CPU count): NVRTC programs are independent
    and ctypes releases the GIL during the call."""
    nvrtc = Nvrtc()
    dirs = ([kernels_dir()] if include_kernels else []) + [Path(d) for d in extra_dirs]
    tasks = [(f, arch) for d in dirs for f in sorted(Path(d).glob("*.cu")) for arch in archs
             if only is None or only(f, arch)]
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        return [r for rs in pool.map(lambda t: check_file(t[0], (t[1],), nvrtc, ptxas_verbose=ptxas_verbose,
                                                          debug_archs=(t[1],) if debug and debug(*t) else ()), tasks)
                for r in rs]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    nvrtc = Nvrtc()
    major, minor = nvrtc.version()
    headers = cuda_include_dirs(major)
    print(f"NVRTC {major}.{minor} ({nvrtc.path}); headers: {headers[0] if headers else 'none found'}")
    results = check_all(extra_dirs=argv)
    width = max([len(r.file) for r in results] + [4])
    for r in results:
        print(f"{r.file:<{width}}  {r.arch:<7}  {'ok' if r.ok else 'FAIL'}")
    failed = [r for r in results if not r.ok]
    for r in failed:
        print(f"\n--- {r.file} [{r.arch}] ---\n{r.log}")
    print(f"\n{len(results) - len(failed)}/{len(results)} compiled")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
