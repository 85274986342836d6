"""Registers, spills and shared memory of kernels as ptxas reports them (`ptxas -v`), without a
GPU: each file is compiled once by NVRTC (runtime/nvrtc_check.py, whose cache the NVRTC check
shares) with --ptxas-options=-v and the log is read per entry point. `sharpinf bench --suite kernels` shows it for the fast
variants; tests/test_nvrtc_compile.py holds them to no spills.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from sharpinf.runtime.paths import kernels_dir

_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


@dataclass(frozen=True)
class PtxasInfo:
    file: str
    entry: str
    arch: str
    registers: int
    spill_stores: int  # bytes
    spill_loads: int  # bytes
    stack_bytes: int
    smem_bytes: int

    @property
    def spills(self) -> bool:
        return bool(self.spill_stores or self.spill_loads)

    def to_json(self) -> dict:
        return asdict(self)


def parse_ptxas_log(log: str, file: str) -> list[PtxasInfo]:
    """The per-entry facts of one compile's `ptxas -v` log."""
    out, cur = [], None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            cur = {"entry": m.group(1), "arch": m.group(2), "stack": 0, "st": 0, "ld": 0, "regs": 0, "smem": 0}
            out.append(cur)
        elif cur is not None:
            if m := _FRAME.search(line):
                cur["stack"], cur["st"], cur["ld"] = map(int, m.groups())
            if m := _REGS.search(line):
                cur["regs"] = int(m.group(1))
                if s := _SMEM.search(line):
                    cur["smem"] = int(s.group(1))
    return [PtxasInfo(file, c["entry"], c["arch"], c["regs"], c["st"], c["ld"], c["stack"], c["smem"]) for c in out]


def ptxas_report(files: list[str], arch: str = "sm_90", entries: set[str] | None = None, nvrtc=None) -> list[PtxasInfo]:
    """ptxas facts of every entry point of `files` (kernels_cu/ names), or of `entries` only."""
    from sharpinf.runtime.nvrtc_check import Nvrtc, check_file

    nvrtc = nvrtc or Nvrtc()
    # the options the GPU backend adds to every compile (cuda_source: SHARPINF_NVRTC_OPTIONS, e.g. a
    # register cap), so the report describes the kernels that ran
    extra = tuple(os.environ.get("SHARPINF_NVRTC_OPTIONS", "").split())
    out = []
    for name in files:
        (r,) = check_file(Path(kernels_dir()) / name, (arch,), nvrtc, ptxas_verbose=True,  # the NVRTC check's compile
                          extra_options=extra)
        ok, log = r.ok, r.log
        if not ok:
            raise RuntimeError(f"{name} does not compile for {arch}:\n{log}")
        out += [p for p in parse_ptxas_log(log, name) if entries is None or p.entry in entries]
    return out


def ptxas_available() -> str | None:
    """None when NVRTC can be loaded, else why not (the report is then left out)."""
    try:
        from sharpinf.runtime.nvrtc_check import Nvrtc

        Nvrtc()
        return None
    except Exception as exc:  # no NVRTC wheel or library: the report is optional
        return f"{type(exc).__name__}: {exc}"
