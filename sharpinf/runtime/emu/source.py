"""Source preparation for an emulator build: the local headers a kernel
includes (for the cache key) and the one rewrite g++ needs, `extern __shared__`
(dynamic shared memory) turned into a pointer to the per-launch buffer."""

from __future__ import annotations

import functools
import re
from pathlib import Path

_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
_ANGLE_INCLUDE = re.compile(r"^\s*#\s*include\s*<([^>]+)>", re.M)
_ENTRY = re.compile(r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(')
_DYN_SHARED = re.compile(r"\bextern\s+__shared__\s+([^;\[]*?)\s*\b(\w+)\s*\[\s*\]\s*;")
_ALIGN = re.compile(r"\b(?:__align__|alignas)\s*\(\s*\d+\s*\)")
_CODE = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|[{}]', re.S)
_STATIC_SHARED = re.compile(r"(?<!\w)__shared__(?!\w)")
_DECLARATOR = re.compile(r"(\w+)\s*(?:\[[^\]]*\]\s*)*(?:=.*)?$", re.S)


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


def angle_includes_in(files: list[Path], dirs: list[Path]) -> bool:
    """Whether any of files includes <name> where one of dirs holds name (g++ finds it there through
    their -I; local_headers follows quoted includes only)."""
    for f in files:
        try:
            names = _ANGLE_INCLUDE.findall(f.read_text(errors="replace"))
        except OSError:
            continue
        if any((d / n).is_file() for n in names for d in dirs):
            return True
    return False


def entry_names(text: str) -> list[str]:
    """Names of the `extern "C" __global__ void NAME(` kernels in a source written out by hand."""
    return list(dict.fromkeys(_ENTRY.findall(text)))


_SCANNED_ENTRY = re.compile(r'extern\s+"C"\s+__sharpinf_global__\s+void\s+(\w+)\s*\(')


def scanned_entry_names(preprocessed: str) -> list[str]:
    """Entry names in a source preprocessed with -DSHARPINF_EMU_SCAN (cuda_emu.h keeps `__global__`
    visible as `__sharpinf_global__` there): the written-out ones and those a macro family makes
    (SHARPINF_KV_HD_ENTRIES, GB_ENTRIES), launch bounds and all."""
    return list(dict.fromkeys(_SCANNED_ENTRY.findall(preprocessed)))


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
        ptr = f'reinterpret_cast<{typ}*>(::sharpinf_emu::dyn_smem("{name}"))'
        if _brace_depth(text, m.start()) > 0:
            return f"{typ}* const {name} = {ptr};"
        line = text.count("\n", 0, m.end()) + 1
        return f'\n#define {name} ({ptr})\n#line {line} "{filename}"\n'

    return _DYN_SHARED.sub(sub, text)


def _skipped_spans(text: str) -> list[tuple[int, int]]:
    """Comments and string literals: a `__shared__` there is no declaration."""
    return [(m.start(), m.end()) for m in _CODE.finditer(text) if m.group() not in "{}"]


def split_top(text: str) -> list[str]:
    """text split at the commas outside (), [], {} and <>."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def static_shared_names(decl: str) -> list[str]:
    """The names a static shared declaration declares, from the text between `__shared__` and
    its `;`: "__align__(16) float a[4][8], b[2], c" -> [a, b, c]."""
    names = []
    for part in split_top(_ALIGN.sub("", decl)):
        m = _DECLARATOR.search(part.strip())
        if m:
            names.append(m.group(1))
    return names


def register_static_shared(text: str) -> str:
    """After each static `__shared__` declaration inside a function, on the same line, add
    SHARPINF_EMU_SMEM(name) for each array it declares (cuda_emu.h: per-block poisoning and the
    shared-memory checks). File-scope declarations are left as they are (and unchecked)."""
    skipped = _skipped_spans(text)
    inserts: list[tuple[int, str]] = []
    for m in _STATIC_SHARED.finditer(text):
        at = m.start()
        if any(a <= at < b for a, b in skipped) or re.search(r"\bextern\s*$", text[max(0, at - 40):at]):
            continue
        end = text.find(";", m.end())
        if end < 0 or _brace_depth(text, at) <= 0:
            continue
        names = static_shared_names(text[m.end():end])
        inserts.append((end + 1, "".join(f" SHARPINF_EMU_SMEM({n});" for n in names)))
    for pos, add in reversed(inserts):
        text = text[:pos] + add + text[pos:]
    return text


# A file whose entries come one a weight type (ggml_blocks.cuh's GB_ENTRIES families) is built once per
# type a test asks for (GB_ONE_TYPE): a Q4_0 test of moe_gemv.cu compiles Q4_0's entries, not eleven
# types' (its checked build: ~11x less g++ time); the entries written out by hand are in every build.
_TYPED_FILE = re.compile(r"\bGB_(?:\w+_)?ENTR(?:Y|IES)(?:_ATTRS)?\s*\(")
GB_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q2_k", "q3_k", "iq4_nl",
            "iq4_xs", "mxfp4")
_TYPE_IN_NAME = re.compile(r"_(" + "|".join(GB_TYPES) + r")(?=_|$)")


@functools.cache
def _typed(src: Path, mtime_ns: int) -> bool:
    return bool(_TYPED_FILE.search(src.read_text(errors="replace")))


def module_type(src: Path, name: str) -> str | None:
    """The weight type whose build of src holds entry `name`: its type for a typed file ('' for a
    hand-written entry there), None for a file built whole."""
    try:
        typed = _typed(src, src.stat().st_mtime_ns)
    except OSError:
        return None
    if not typed:
        return None
    m = _TYPE_IN_NAME.search(name)
    return m.group(1) if m else ""
