"""Compile-ahead compiles only the entry points a model uses: SHARPINF_WANT (common.cuh) with
the defines CudaBackend passes. Checked with NVRTC itself (no GPU needed): the CUBIN of a
selective compile holds the wanted kernels and not the others."""

from __future__ import annotations

from pathlib import Path

import pytest

from sharpinf.runtime.cuda_source import selection_defines
from sharpinf.runtime.paths import kernels_dir


def _compile(file: str, entries: list[str]) -> bytes:
    nc = pytest.importorskip("sharpinf.runtime.nvrtc_check")
    try:
        nvrtc = nc.Nvrtc()
    except Exception as exc:
        pytest.skip(f"no NVRTC here: {exc}")
    src = (kernels_dir() / file).read_text()
    opts = nc.compile_options("sm_90", [kernels_dir()]) + (list(selection_defines(entries)) if entries else [])
    ok, log, cubin = nvrtc.compile(src, file, opts)
    assert ok, log
    return cubin


def test_defines_cover_each_entry_and_its_prefixes():
    d = selection_defines(["matmul_q4_k_ys", "attention_f16_d64"])
    assert d[0] == "-DSHARPINF_SELECT"
    for w in ("matmul", "matmul_q4", "matmul_q4_k", "matmul_q4_k_ys", "attention_f16", "attention_f16_d64"):
        assert f"-DSHARPINF_WANT_{w}=1" in d


@pytest.mark.slow
def test_selective_compile_holds_only_the_wanted_entry_points():
    cubin = _compile("matmul.cu", ["matmul_q4_1", "matmul_q6_k_ys"])
    assert b"matmul_q4_1" in cubin and b"matmul_q6_k_ys" in cubin
    assert b"matmul_q8_0" not in cubin and b"matmul_f16" not in cubin
    att = _compile("attention.cu", ["attention_q8_0_d64"])
    assert b"attention_q8_0_d64" in att and b"attention_q8_0_d128" not in att and b"attention_f16_d64" not in att


def test_every_guard_names_an_entry_point_of_its_file():
    """A guard naming no entry (a typo) would silently drop kernels from every selective build."""
    import re

    from sharpinf.runtime.emu.source import entry_names

    for f in Path(kernels_dir()).glob("*.cu"):
        text = f.read_text()
        entries = set(entry_names(text))  # the emulator's parser: launch bounds allowed
        for g in re.findall(r"SHARPINF_WANT\((\w+)\)", text):
            assert any(e == g or e.startswith(g + "_") for e in entries), (f.name, g)
