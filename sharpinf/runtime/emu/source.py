"""Source preparation for an emulator build: the local headers a kernel
includes (for the cache key) and the one rewrite g++ needs, `extern __shared__`
(dynamic shared memory) turned into a pointer to the per-launch buffer."""

from __future__ import annotations

import re
from pathlib import Path

_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
_ENTRY = re.compile(r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(')
_DYN_SHARED = re.compile(r"\bextern\s+__shared__\s+([^;\[]*?)\s*\b(\w+)\s*\[\s*\]\s*;")
_ALIGN = re.compile(r"\b(?:__align__|alignas)\s*\(\s*\d+\s*\)")


def local_headers(src: Path, search: list[Path]) -> list[Path]:
    """Every #include "..." reachable from src that resolves to a file (dir of the
    including file first, then `search`), in a stable order, src excluded."""
    seen: dict[Path, None] = {}
    stack = [src]
    while stack:
        f = stack.pop()
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        for inc in _INCLUDE.findall(text):
            for d in [f.parent, *search]:
                p = (d / inc).resolve()
                if p.is_file():
                    if p not in seen and p != src:
                        seen[p] = None
                        stack.append(p)
                    break
    return sorted(seen)


def entry_names(text: str) -> list[str]:
    """Names of the `extern "C" __global__ void NAME(` kernels in a source."""
    return list(dict.fromkeys(_ENTRY.findall(text)))


def _brace_depth(text: str, upto: int) -> int:
    """Brace nesting at offset `upto`, skipping comments and string literals."""
    depth, i = 0, 0
    code = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|[{}]', re.S)
    for m in code.finditer(text, 0, upto):
        if m.group() == "{":
            depth += 1
        elif m.group() == "}":
            depth -= 1
    return depth


def rewrite_dynamic_shared(text: str, filename: str) -> str:
    """`extern __shared__ T name[];` -> a `T*` bound to the launch's dynamic shared
    buffer; the line count is kept so __FILE__/__LINE__ stay those of the source."""

    def sub(m: re.Match) -> str:
        typ = _ALIGN.sub("", m.group(1)).strip()
        name = m.group(2)
        ptr = f"reinterpret_cast<{typ}*>(::sharpinf_emu::dyn_smem())"
        if _brace_depth(text, m.start()) > 0:
            return f"{typ}* const {name} = {ptr};"
        line = text.count("\n", 0, m.end()) + 1
        return f'\n#define {name} ({ptr})\n#line {line} "{filename}"\n'

    return _DYN_SHARED.sub(sub, text)
