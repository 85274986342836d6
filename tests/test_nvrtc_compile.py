"""Every kernel compiles under NVRTC (the compiler CuPy uses) for sm_80 and sm_90 -- no GPU
needed: NVRTC comes from the pip package nvidia-cuda-nvrtc-cu12 and runs ptxas too."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from sharpinf.runtime.paths import kernels_dir, pip_nvrtc_library

pytestmark = pytest.mark.skipif(pip_nvrtc_library() is None, reason="pip install nvidia-cuda-nvrtc-cu12")

ARCHS = ("sm_80", "sm_90")
FULL = os.environ.get("SHARPINF_TEST_TIER") == "all"


def spill_checked() -> set[str]:
    """The files whose sm_90 ptxas report test_variant_kernels_do_not_spill reads."""
    from bench.suites.kernel_variants import fast_files

    return {*fast_files(), "sampling.cu"}


def unoptimized(path: Path, arch: str) -> bool:
    """make test compiles with -G (NVVM and ptxas unoptimized: 70 s of NVRTC instead of 240 for sm_80
    on this machine) all but the optimized sm_90 builds the spill check reads: every source still goes
    through the front end and every instruction through each arch's ptxas. make test-all and make
    nvrtc-check optimize every build."""
    return not FULL and (arch != "sm_90" or path.parent != kernels_dir() or path.name not in spill_checked())


def compiled_here(path: Path, arch: str) -> bool:
    """make test compiles every source for sm_90 (the GPU this project is lent and measures on), and for
    sm_80 the readable baselines and the primitives only: the one arch-dependent code is pdl.cuh's
    (griddepcontrol from sm_90 on), which every file includes, so they take its sm_80 branch through
    the front end and sm_80's ptxas; the variants' sm_80 builds (3.6 of NVRTC's 10 CPU-minutes, cold)
    run in make test-all."""
    return FULL or arch != "sm_80" or path.parent != kernels_dir() or path.name not in spill_checked()


SM80_ALL = pytest.mark.tier_all("the variants' sm_80 builds: make test compiles the baselines for sm_80 (pdl.cuh's "
                                "branch), every file for sm_90")
PRIMS = Path(__file__).parent / "kernels_prims"
SOURCES = sorted(kernels_dir().glob("*.cu")) + sorted(PRIMS.glob("*.cu"))


@pytest.fixture(scope="module")
def nvrtc():
    from sharpinf.runtime.nvrtc_check import Nvrtc

    return Nvrtc()


def test_there_are_kernels():
    assert {p.name for p in kernels_dir().glob("*.cu")} >= {"elementwise.cu", "rmsnorm.cu", "matmul.cu", "attention.cu"}


@pytest.fixture(scope="module")
def all_results():
    """Every source x arch, compiled once, in parallel (the big kernels take a while)."""
    from sharpinf.runtime.nvrtc_check import check_all

    return {(Path(r.file).resolve(), r.arch): r
            for r in check_all(ARCHS, extra_dirs=[PRIMS], ptxas_verbose=True, debug=unoptimized, only=compiled_here)}


@pytest.mark.parametrize("source,arch", [pytest.param(s, a, marks=() if compiled_here(s, a) else SM80_ALL,
                                                     id=f"{s.parent.name}/{s.name}-{a}") for a in ARCHS for s in SOURCES])
def test_compiles(all_results, source, arch):
    r = all_results[(source.resolve(), arch)]
    assert r.ok, r.log


def test_variant_kernels_do_not_spill(all_results):
    """ptxas -v (sm_90) of every entry point of the registered variants' files (all but the baselines'),
    and of sampling.cu (every variant's head runs it): no spill stores or loads -- read from the same
    compiles as above, which are the project's build: this machine's NVRTC (the `check` extra's 12.x in
    CI; a GPU machine's cuda12/cuda13 extra, whose NVRTC the CUDA backend compiles with at run time),
    `--gpu-architecture=sm_90 -std=c++17 -I kernels_cu -I <its CUDA headers> --ptxas-options=-v`,
    optimized (no -G) -- what cuda_source.nvrtc_options gives CuPy, less the entry selection."""
    from sharpinf.runtime.ptxas_report import parse_ptxas_log

    files = sorted(spill_checked())
    assert not any(unoptimized(kernels_dir() / f, "sm_90") for f in files)
    report = [p for f in files for p in parse_ptxas_log(all_results[((kernels_dir() / f).resolve(), "sm_90")].log, f)]
    assert len(report) >= 40 and {p.file for p in report} == set(files)
    assert all(p.registers > 0 for p in report)
    assert not [p.entry for p in report if p.spills]


def test_every_entry_waits_before_it_reads_what_a_kernel_wrote(all_results):
    """Programmatic dependent launch's contract (common.cuh; SHARPINF_PDL=1 on a GPU lets a kernel start
    before the one ahead of it ends): every entry of every kernels_cu file reaches griddepcontrol.wait
    before any global memory access or branch -- read off the sm_90 PTX of the compiles above
    (sharpinf/runtime/pdl_check.py)."""
    judged, broken = 0, []
    for src in sorted(kernels_dir().glob("*.cu")):
        r = all_results[(src.resolve(), "sm_90")]
        assert r.pdl, f"{src.name}: no entry judged"
        judged += len(r.pdl)
        broken += [f"{src.name}: {entry}: {why}" for entry, why in r.pdl.items() if why is not None]
    assert judged > 700 and not broken, "\n".join(broken[:20])


def _includes_common(path: Path, seen: frozenset = frozenset()) -> bool:
    """common.cuh included directly or through another local header."""
    for name in re.findall(r'#include\s+"([^"]+)"', path.read_text()):
        if name == "common.cuh":
            return True
        local = path.parent / name
        if local.is_file() and name not in seen and _includes_common(local, seen | {name}):
            return True
    return False


def test_kernel_files_follow_conventions():
    for src in sorted(kernels_dir().glob("*.cu")):
        text = src.read_text()
        assert text.startswith("//"), f"{src.name}: starts with a header comment"
        assert _includes_common(src), f"{src.name}: includes common.cuh"
        assert "INFINITY" not in text.replace("CUDART_INF", ""), f"{src.name}: use CUDART_INF_F"


def test_broken_source_reports_log(nvrtc, tmp_path):
    from sharpinf.runtime.nvrtc_check import check_file

    bad = tmp_path / "broken.cu"
    bad.write_text('#include "common.cuh"\nextern "C" __global__ void k(float* x) { x[0] = undeclared_thing; }\n')
    results = check_file(bad, ARCHS, nvrtc)
    assert [r.ok for r in results] == [False, False]
    assert all("undeclared_thing" in r.log for r in results)


@pytest.mark.parametrize("debug_archs", [(), ("sm_80", "sm_90")], ids=["optimized", "debug"])
def test_bad_inline_asm_is_caught_by_ptxas(nvrtc, tmp_path, debug_archs):
    # Compiling to a CUBIN (sm_XX) runs ptxas, optimized or with -G (unoptimized()), so a malformed PTX
    # instruction, or one sm_80 lacks, fails here.
    from sharpinf.runtime.nvrtc_check import check_file

    bad = tmp_path / "badasm.cu"
    bad.write_text('extern "C" __global__ void k(float* x) { asm volatile("not.an.instruction;"); }\n')
    (r,) = check_file(bad, ("sm_80",), nvrtc, debug_archs=debug_archs)
    assert not r.ok and r.log
    sm90_only = tmp_path / "sm90only.cu"  # a cluster barrier: sm_90's, not sm_80's
    sm90_only.write_text('extern "C" __global__ void k(float* x) { asm volatile("barrier.cluster.arrive;"); }\n')
    r80, r90 = check_file(sm90_only, ("sm_80", "sm_90"), nvrtc, debug_archs=debug_archs)
    assert not r80.ok and "sm_90" in r80.log and r90.ok, (r80.log, r90.log)


def test_check_all_extra_dir():
    from sharpinf.runtime.nvrtc_check import check_all

    results = check_all(archs=("sm_80",), extra_dirs=[PRIMS], include_kernels=False)
    assert {Path(r.file).name for r in results} == {p.name for p in PRIMS.glob("*.cu")}
    assert all(r.ok for r in results), [r.log for r in results if not r.ok]


def test_a_compile_is_cached_until_anything_it_reads_changes(nvrtc, tmp_path, monkeypatch):
    """The verdict and log come back from the cache for the same inputs; a changed header (reached
    through another), option or source compiles again -- a broken header is never hidden."""
    from sharpinf.runtime import nvrtc_check

    monkeypatch.setenv("SHARPINF_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "inner.cuh").write_text("#define V 1.0f\n")
    (tmp_path / "outer.cuh").write_text('#include "inner.cuh"\n')
    src = tmp_path / "k.cu"
    src.write_text('#include "outer.cuh"\nextern "C" __global__ void k(float* x) { x[0] = V; }\n')

    def check(*archs):
        before = nvrtc_check.compiles
        results = nvrtc_check.check_file(src, archs, nvrtc)
        return [r.ok for r in results], nvrtc_check.compiles - before, results

    assert check("compute_90")[:2] == ([True], 1)
    assert check("compute_90")[:2] == ([True], 0)  # a hit
    assert check("compute_80")[:2] == ([True], 1)  # another option
    (tmp_path / "inner.cuh").write_text("#define V undeclared_thing\n")
    oks, n, results = check("compute_90")
    assert (oks, n) == ([False], 1) and "undeclared_thing" in results[0].log
    assert check("compute_90")[:2] == ([False], 0)  # the failure is cached too, with its log
    monkeypatch.setenv("SHARPINF_NVRTC_CACHE", "0")
    assert check("compute_90")[:2] == ([False], 1)
