"""Kernel files state their contract, not their history (issue 51): every kernels_cu/ file opens with a
short header comment, no file carries a date or the lab notebook's words, and every .cu header names
its launch shape, its batch-invariance rule and its bound. What was measured and tried lives in
docs/kernel-notes.md. Reads the sources only: nothing is compiled."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels_cu"
MAX_HEADER = 45  # lines of the leading comment block
DATE = re.compile(r"20\d\d-\d\d-\d\d")
DIARY = ("Tried", "not kept", "later that day", "Measured (", "Next:")


def header(text: str) -> list[str]:
    """The leading comment block: the // lines before the first line that is not one."""
    lines = []
    for line in text.splitlines():
        if not line.lstrip().startswith("//"):
            break
        lines.append(line)
    return lines


def problems(name: str, text: str) -> list[str]:
    """What keeps a kernels_cu/ file's text from stating its contract (empty: nothing)."""
    found = []
    head = header(text)
    if not head:
        found.append("no header comment")
    elif len(head) > MAX_HEADER:
        found.append(f"a header of {len(head)} lines (at most {MAX_HEADER})")
    for no, line in enumerate(text.splitlines(), 1):
        if DATE.search(line):
            found.append(f"line {no}: a date ({DATE.search(line).group()})")
        found += [f"line {no}: {word!r}" for word in DIARY if word.lower() in line.lower()]
    if name.endswith(".cu"):
        words = " ".join(head)
        if not re.search(r"\bLaunch\b|\bgrid\b", words):
            found.append("the header names no launch shape ('Launch' or 'grid')")
        if not re.search(r"invarian", words, re.I):
            found.append("the header states no batch-invariance rule")
        if not re.search(r"\bBound\b", words):
            found.append("the header states no bound")
    return found


SOURCES = sorted(p.name for p in KERNELS.iterdir() if p.suffix in (".cu", ".cuh"))


def test_every_kernel_source_is_checked():
    assert len(SOURCES) > 40 and "common.cuh" in SOURCES and "attention.cu" in SOURCES


@pytest.mark.parametrize("name", SOURCES)
def test_kernel_file_states_its_contract(name):
    assert problems(name, (KERNELS / name).read_text()) == []


# the checker itself: a contract passes, each way of being a lab notebook fails (the oracle can fail)
CONTRACT = """// k.cu -- what it computes.
//   k(x, n)   x float [n]
// Launch: grid = n / 128, block 128.
// Batch invariance: element i depends on x[i] only.
// Bound: memory -- 8 bytes an element.
#include "common.cuh"
"""


def _with(extra: str) -> str:
    return CONTRACT.replace("#include", extra + "\n#include")


@pytest.mark.parametrize("name, text, expect", [
    ("k.cu", _with("// Measured (H200, 2026-11-26): 153 us."), "a date"),
    ("k.cu", _with("// Measured (H200): 153 us."), "'Measured ('"),
    ("k.cu", _with("// Tried, not kept: two chunks a barrier."), "'Tried'"),
    ("k.cu", _with("// Then, later that day, the loads batched."), "'later that day'"),
    ("k.cu", _with("// Next: time this version."), "'Next:'"),
    ("k.cu", CONTRACT.replace("#include", "    x = 1;  // fixed 2026-11-28\n#include"), "a date"),
    ("k.cuh", "// k.cuh -- a helper.\n" + "// more\n" * MAX_HEADER + "#pragma once\n", "a header of"),
    ("k.cuh", "#pragma once\n", "no header comment"),
    ("k.cu", CONTRACT.replace("// Launch: grid = n / 128, block 128.\n", ""), "launch shape"),
    ("k.cu", CONTRACT.replace("// Batch invariance: element i depends on x[i] only.\n", ""), "batch-invariance"),
    ("k.cu", CONTRACT.replace("// Bound: memory -- 8 bytes an element.\n", ""), "no bound"),
], ids=["date", "measured", "tried", "later-that-day", "next", "date-in-body", "long-header", "no-header",
        "no-launch", "no-invariance", "no-bound"])
def test_the_checker_fails_a_lab_notebook(name, text, expect):
    found = problems(name, text)
    assert any(expect in p for p in found), found


def test_the_checker_passes_a_contract():
    assert problems("k.cu", CONTRACT) == []
    assert problems("k.cuh", "// k.cuh -- a helper.\n#pragma once\n") == []  # a .cuh names no launch


def test_common_cuh_is_an_umbrella_the_cache_keys_see_through():
    """common.cuh includes a header a topic; the emulator's build key and the NVRTC check's cache key
    (both local_headers) reach every one of them from a kernel, so a change to any rebuilds."""
    from sharpinf.runtime.emu.source import local_headers

    parts = re.findall(r'^#include "([^"]+)"', (KERNELS / "common.cuh").read_text(), re.M)
    assert len(parts) >= 8 and all((KERNELS / p).is_file() for p in parts), parts
    for src in ("gather.cu", "matmul_mmq.cu", "attention_flash.cu"):
        seen = {p.name for p in local_headers((KERNELS / src).resolve(), [KERNELS])}
        assert set(parts) <= seen, (src, sorted(set(parts) - seen))
