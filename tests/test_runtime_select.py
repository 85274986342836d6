"""Backend selection, paths, launch-argument rules and the doctor report -- no GPU needed."""

from __future__ import annotations

import numpy as np
import pytest

from sharpinf.errors import BackendError
from sharpinf.runtime import paths
from sharpinf.runtime.args import check_args
from sharpinf.runtime.select import available_backends, get_backend


def test_kernels_dir_has_common_header():
    assert (paths.kernels_dir() / "common.cuh").is_file()


def test_cache_dir_override(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARPINF_CACHE_DIR", str(tmp_path))
    d = paths.cache_dir("cupy")
    assert d == tmp_path / "cupy" and d.is_dir()


def test_unknown_backend_name():
    with pytest.raises(BackendError, match="unknown backend"):
        get_backend("metal")


def test_env_selects_backend(monkeypatch):
    monkeypatch.setenv("SHARPINF_BACKEND", "nonsense")
    with pytest.raises(BackendError, match="nonsense"):
        get_backend()


def test_cuda_unavailable_says_what_to_install():
    ok, _ = available_backends()["cuda"]
    if ok:
        pytest.skip("a GPU is usable here")
    with pytest.raises(BackendError, match=r"cuda backend unavailable: \w+: .*; fix: "):
        get_backend("cuda")


def test_available_backends_shape():
    av = available_backends()
    assert set(av) == {"cuda", "emu"}
    assert all(isinstance(ok, bool) and isinstance(why, str) and why for ok, why in av.values())


def test_check_args_rules():
    dev = object()
    is_dev = lambda a: a is dev  # noqa: E731
    assert check_args([dev, np.int32(3), np.float32(1.5)], is_dev, "x") == (dev, np.int32(3), np.float32(1.5))
    with pytest.raises(BackendError, match="np.int32"):
        check_args((dev, 3), is_dev, "x")
    with pytest.raises(BackendError, match="upload"):
        check_args((np.zeros(3),), is_dev, "x")
    with pytest.raises(BackendError, match="unsupported"):
        check_args(("s",), is_dev, "x")


def test_doctor_collect():
    from sharpinf.runtime.doctor import collect

    report = collect()
    assert set(report["backends"]) == {"cuda", "emu"}
    assert {"gpu", "nvrtc_pip", "gxx", "caches", "advice", "kernels_dir"} <= set(report)
    assert [c["name"] for c in report["cuda_checks"]][0] == "cupy"
    if not report["backends"]["cuda"]["ok"]:
        assert any('pip install -e ".[cuda1' in a for a in report["advice"])



def test_doctor_cache_size_survives_a_build_beside_it(tmp_path):
    """A build running beside `doctor` makes and removes temporary folders while the walk lists them
    (CI once failed this way: two xdist workers, one building, one sizing the caches)."""
    import threading
    import time

    from sharpinf.runtime import doctor

    for i in range(100):
        (tmp_path / f"kept{i}.so").write_bytes(b"x" * 7)
    stop = threading.Event()

    def build():
        i = 0
        while not stop.is_set():
            t = tmp_path / f"build{i}.tmp"
            t.mkdir()
            (t / "src").write_bytes(b"z" * 3)
            (t / "src").unlink()
            t.rmdir()
            i += 1

    builder = threading.Thread(target=build)
    builder.start()
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.5:
            assert doctor._dir_size(tmp_path) >= 700  # a file mid-build may count
    finally:
        stop.set()
        builder.join()
    assert doctor._dir_size(tmp_path) == 700
    assert doctor._dir_size(tmp_path / "missing") == 0
