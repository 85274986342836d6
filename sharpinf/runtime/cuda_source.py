"""What NVRTC compiles for the CUDA backend: a kernel file's source, its options, and the modules made of it.

A file is compiled with only the entry points a step uses (SHARPINF_WANT in common.cuh:
`selection_defines`), one module per file and selection; CuPy's disk cache keys on the code and the
options, so the code carries a hash of the headers it can see (`source_with_deps`). cupy is passed
in, never imported here: importing this module needs no GPU.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Sequence

from sharpinf.errors import BackendError
from sharpinf.runtime.cuda_launch import CudaKernel
from sharpinf.runtime.paths import cuda_include_dirs, kernels_dir


def resolve_source(filename: str | os.PathLike) -> Path:
    """kernels_cu/<filename>, or the file itself when the path is absolute."""
    p = Path(filename)
    if not p.is_absolute():
        p = kernels_dir() / p
    if not p.is_file():
        raise BackendError(f"kernel source not found: {p}")
    return p


def source_with_deps(path: Path) -> tuple[str, str]:
    """(code to compile, its hash). CuPy's disk cache keys on the code and options only, so a
    changed header would be missed: the code is prefixed with a hash of the headers it can see,
    and a #line directive keeps compiler messages pointing at the real file and line."""
    h = hashlib.sha256(path.read_bytes())
    for d in dict.fromkeys([kernels_dir(), path.parent]):
        for hdr in sorted(Path(d).glob("*.cuh")) + sorted(Path(d).glob("*.h")):
            h.update(hdr.name.encode() + b"\0" + hdr.read_bytes())
    digest = h.hexdigest()
    code = f'// sharpinf source+headers sha256 {digest}\n#line 1 "{path.name}"\n' + path.read_text()
    return code, digest


def selection_defines(entries: Sequence[str]) -> tuple[str, ...]:
    """-D options that compile only `entries` of a file (SHARPINF_WANT in common.cuh): each
    entry name and each of its '_'-prefixes is wanted."""
    wanted = set()
    for e in entries:
        parts = e.split("_")
        wanted.update("_".join(parts[:i]) for i in range(1, len(parts) + 1))
    return ("-DSHARPINF_SELECT",) + tuple(f"-DSHARPINF_WANT_{w}=1" for w in sorted(wanted))


def nvrtc_options(path: Path, pdl_prefetch: bool) -> tuple[str, ...]:
    """The options every compile of `path` gets: C++17, the include dirs, SHARPINF_NVRTC_OPTIONS, and
    with programmatic dependent launch the matvecs' early L2 prefetch."""
    dirs = [str(kernels_dir())] + ([str(path.parent)] if path.parent != kernels_dir() else [])
    dirs += [str(d) for d in cuda_include_dirs()]  # cuda_fp16.h where NVRTC lacks it built in
    # SHARPINF_NVRTC_OPTIONS: extra options for every kernel, e.g. "-DDP_UNROLL=1" to measure a
    # kernel's tuning constant without editing it (CuPy's cache keys on the options)
    extra = tuple(os.environ.get("SHARPINF_NVRTC_OPTIONS", "").split())
    # with PDL the matvecs ask L2 for their first rows before their wait (common.cuh): a build of its own
    pdl = ("-DSHARPINF_PDL_PREFETCH=1",) if pdl_prefetch else ()
    return ("-std=c++17",) + tuple(f"-I{d}" for d in dirs) + extra + pdl


class NvrtcModules:
    """The compiled modules of one backend (cupy.RawModule), by source hash, name expressions and entries."""

    def __init__(self, cp: Any, pdl_prefetch: bool):
        self.cp = cp
        self.pdl_prefetch = pdl_prefetch
        self._modules: dict[tuple, Any] = {}
        self._selected: dict[Path, tuple[frozenset, Any]] = {}  # file -> (entries, module) from compile()

    def module(self, path: Path, exprs: tuple[str, ...], entries: frozenset | None) -> Any:
        """The compiled module of `path` with every entry point, or with only `entries` (eagerly
        compiled: CuPy's disk cache keys on the code and options, defines included)."""
        code, digest = source_with_deps(path)
        key = (digest, exprs, entries)
        module = self._modules.get(key)
        if module is None:
            opts = nvrtc_options(path, self.pdl_prefetch) + (selection_defines(sorted(entries)) if entries else ())
            try:
                module = self.cp.RawModule(code=code, options=opts, name_expressions=exprs or None)
                module.compile()
            except Exception as exc:
                raise BackendError(f"{path.name}: does not compile: {exc}") from exc
            self._modules[key] = module
        return module

    def compile(self, requests: Sequence[tuple[str, str]], progress=None) -> None:
        """One module per file holding only the requested entry points (see SHARPINF_WANT)."""
        by_file: dict[Path, set[str]] = {}
        for filename, name in requests:
            by_file.setdefault(resolve_source(filename), set()).add(name)
        for path, names in by_file.items():
            if progress is not None:
                progress(path.name)
            entries = frozenset(names) | self._selected.get(path, (frozenset(), None))[0]
            self._selected[path] = (entries, self.module(path, (), entries))

    def kernel(self, filename: str, name: str, name_expressions: Sequence[str] = ()) -> CudaKernel:
        """Entry point `name` of `filename`: from the module compile() made, else compiled alone."""
        path = resolve_source(filename)
        exprs = tuple(name_expressions)
        if "<" in name and name not in exprs:
            raise BackendError(f"{name!r} is a template instantiation; list it in name_expressions")
        selected = self._selected.get(path)
        if not exprs and selected is not None and name in selected[0]:
            module = selected[1]
        else:  # compile just this entry (templates: the whole file, instantiating exprs)
            module = self.module(path, exprs, None if exprs else frozenset([name]))
        try:
            return CudaKernel(name, path, module.get_function(name))
        except Exception as exc:
            raise BackendError(f"{path.name}: cannot get kernel {name!r}: {exc}") from exc
