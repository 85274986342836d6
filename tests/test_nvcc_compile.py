"""Every kernel also compiles under nvcc (the offline compiler a researcher may use to read
SASS or run ncu on a standalone build), for sm_90, to a CUBIN -- no GPU needed. NVRTC, the
compiler sharpinf runs with, is checked in test_nvrtc_compile.py; the two front ends differ
in what they accept (headers, builtins), so both are held to the same sources."""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sharpinf.runtime.paths import kernels_dir

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
SOURCES = sorted(kernels_dir().glob("*.cu"))


def _nvcc(src: Path, out_dir: Path) -> tuple[int, str]:
    p = subprocess.run([NVCC, "-arch=sm_90", "-cubin", "-std=c++17", f"-I{kernels_dir()}", "-o",
                        str(out_dir / (src.stem + ".cubin")), str(src)], capture_output=True, text=True, timeout=600)
    return p.returncode, p.stderr + p.stdout


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("nvcc")
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return dict(zip(SOURCES, pool.map(lambda s: _nvcc(s, out), SOURCES)))


@pytest.mark.slow
@pytest.mark.tier_all("nvcc's front end (~3 min of compiles); NVRTC, which sharpinf runs, compiles every kernel "
                      "in test_nvrtc_compile.py")
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_nvcc_compiles(results, source):
    rc, log = results[source]
    assert rc == 0, log


def test_nvcc_reports_a_broken_source(tmp_path):
    bad = tmp_path / "broken.cu"
    bad.write_text('#include "common.cuh"\nextern "C" __global__ void k(float* x) { x[0] = undeclared_thing; }\n')
    rc, log = _nvcc(bad, tmp_path)
    assert rc != 0 and "undeclared_thing" in log
