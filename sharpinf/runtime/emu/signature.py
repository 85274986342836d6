"""Parameter names of a module's kernels, for messages that name `out` rather than "argument 8".

The compiled module knows each parameter's type (emu_entry.h) but not its name, and a kernel's
parameter list may be a macro (rope_kv.cu's RK_ARGS), so the names are read from the source as
g++ sees it: the build folder's translation unit, preprocessed with the module's own flags. This
runs only when a message needs the names (a failed launch), and once per module."""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path

from sharpinf.runtime.emu.source import split_top

_IDENT = re.compile(r"[A-Za-z_]\w*")


def _balanced(text: str, open_at: int) -> int:
    """Index just past the parenthesis matching the one at open_at, or -1."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def names_in(params: str) -> list[str] | None:
    """'const float* __restrict__ x, int n = 4' -> ['x', 'n']; None where a parameter has no name."""
    params = params.strip()
    if params in ("", "void"):
        return []
    names = []
    for p in split_top(params):
        p = re.sub(r"\[[^\]]*\]", "", p.split("=")[0])
        idents = [w for w in _IDENT.findall(p) if w not in ("__restrict__", "__restrict", "restrict", "const", "volatile")]
        if len(idents) < 2:  # a type alone: unnamed
            return None
        names.append(idents[-1])
    return names


def kernel_params(source: str, kernel: str) -> list[str] | None:
    """The parameter names of `kernel` ("name" or a template instantiation "name<...>") in
    preprocessed source: its definition's parameter list (a declaration without a body is skipped)."""
    base = kernel.split("<", 1)[0].strip()
    for m in re.finditer(rf"\bvoid\s+{re.escape(base)}\s*\(", source):
        end = _balanced(source, m.end() - 1)
        if end < 0:
            continue
        if source[end:end + 200].lstrip().startswith("{"):
            return names_in(source[m.end():end - 1])
    return None


@functools.cache
def _preprocessed(so: str) -> str:
    from sharpinf.runtime.emu import build

    return build.preprocess_module(Path(so))


def param_names(so: Path, kernel: str, n_params: int) -> list[str] | None:
    """Names of `kernel`'s parameters in the module `so`, or None when they cannot be told."""
    try:
        names = kernel_params(_preprocessed(str(so)), kernel)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return names if names is not None and len(names) == n_params else None
