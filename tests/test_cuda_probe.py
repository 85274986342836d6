"""The GPU probe without a GPU: cupy faked step by step, each failure names its check and its fix,
`auto` falls back to the emulator saying why, and `cuda` refuses with the same reason."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest

from sharpinf.errors import BackendError
from sharpinf.runtime import cuda_probe, paths, select

FIX13 = 'pip install -e ".[cuda13]"'


class NoDevice(Exception):
    status = cuda_probe.CUDA_NO_DEVICE


def fake_cupy(driver=13000, devices=1, count_error=None, nvrtc=(13, 0)):
    """A cupy module with just what the probe reads; an Exception value raises when read."""
    def raising(value):
        def call():
            if isinstance(value, Exception):
                raise value
            return value
        return call

    cupy = types.ModuleType("cupy")
    cupy.__version__ = "14.2.0"
    runtime = types.SimpleNamespace(driverGetVersion=raising(driver), getDeviceCount=raising(count_error or devices))
    cupy.cuda = types.SimpleNamespace(runtime=runtime, nvrtc=types.SimpleNamespace(getVersion=raising(nvrtc)))
    return cupy


class FakeGpu:
    """The Backend calls the probe makes, on NumPy; `bad` breaks one of them."""

    def __init__(self, bad=None):
        self.bad = bad

    def kernel(self, filename, name):
        if self.bad == "compile":
            raise BackendError(f"{filename}: cannot get kernel {name!r}: error: identifier \"oops\" is undefined")
        return (filename, name)

    def upload(self, host):
        return np.array(host)

    def launch(self, kernel, grid, block, args):
        if self.bad == "launch":
            raise RuntimeError("CUDA_ERROR_LAUNCH_FAILED")
        a, b, out, n = args
        assert kernel == ("elementwise.cu", "add_f32") and isinstance(n, np.int32)
        out[:n] = a[:n] + b[:n] + (1 if self.bad == "wrong" else 0)

    def download(self, dev):
        return np.array(dev)


@pytest.fixture
def gpu(monkeypatch):
    """A fake GPU stack: returns a function that sets it up (cupy, headers, backend) and runs the
    probe. Afterwards, every failing check must have named its fix."""
    cuda_probe.cuda_checks.cache_clear()
    monkeypatch.setattr(cuda_probe, "driver_major_from_smi", lambda: 13)
    monkeypatch.setattr(cuda_probe, "cupy_major", lambda: 13)

    def setup(cupy=None, headers=(Path("/fake/cu13/include"),), backend=None):
        monkeypatch.setitem(sys.modules, "cupy", cupy if cupy is not None else fake_cupy())
        monkeypatch.setattr(cuda_probe, "cuda_include_dirs", lambda major=None: list(headers))
        monkeypatch.setattr(cuda_probe, "_make_backend", lambda: backend or FakeGpu())
        cuda_probe.cuda_checks.cache_clear()
        return [(c.name, c.ok) for c in cuda_probe.cuda_checks()]

    yield setup
    bad = [c for c in cuda_probe.cuda_checks() if not c.ok]
    cuda_probe.cuda_checks.cache_clear()
    assert all("; fix: " in c.detail for c in bad), f"every failure names its fix: {bad}"


def failed() -> list[str]:
    return [c.name for c in cuda_probe.cuda_checks() if not c.ok]


def test_all_steps_pass(gpu):
    assert gpu() == [(n, True) for n in ("cupy", "driver", "device", "nvrtc", "headers", "compile", "run")]
    ok, why = cuda_probe.cuda_status()
    assert ok and "CUDA 13.0 driver" in why and "NVRTC 13.0" in why
    assert cuda_probe.no_gpu_reason() is None


def test_cupy_missing(gpu, monkeypatch):
    gpu()
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    cuda_probe.cuda_checks.cache_clear()
    ok, why = cuda_probe.cuda_status()
    assert not ok and why.startswith("cupy: not importable") and FIX13 in why
    assert cuda_probe.no_gpu_reason()  # no cupy: GPU tests skip


@pytest.mark.parametrize("driver", [0, RuntimeError("libcuda.so.1: cannot open shared object file")])
def test_no_driver(gpu, driver):
    assert gpu(fake_cupy(driver=driver)) == [("cupy", True), ("driver", False)]
    assert "no NVIDIA driver" in cuda_probe.cuda_status()[1]
    assert cuda_probe.no_gpu_reason()


@pytest.mark.parametrize("cupy", [fake_cupy(devices=0), fake_cupy(count_error=NoDevice("cudaErrorNoDevice"))])
def test_no_device(gpu, cupy):
    assert gpu(cupy)[-1] == ("device", False)
    assert cuda_probe.no_gpu_reason().startswith("no CUDA GPU (device: no CUDA device visible")


def test_cupy_newer_than_driver_is_a_broken_install_not_a_missing_gpu(gpu):
    err = RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version")
    assert gpu(fake_cupy(driver=12040, count_error=err))[-1] == ("runtime", False)
    assert 'pip install -e ".[cuda12]"' in cuda_probe.cuda_status()[1]  # the extra of the driver's major
    assert cuda_probe.no_gpu_reason() is None  # a GPU is there: its tests must fail, not skip


def test_nvrtc_missing(gpu):
    assert gpu(fake_cupy(nvrtc=RuntimeError("libnvrtc.so.13: cannot open shared object file")))[-1] == ("nvrtc", False)
    ok, why = cuda_probe.cuda_status()
    assert why.startswith("nvrtc: NVRTC not loadable") and "libnvrtc.so.13" in why and FIX13 in why
    assert cuda_probe.no_gpu_reason() is None


def test_headers_of_the_nvrtc_major_are_asked_for(gpu, monkeypatch):
    gpu(fake_cupy(nvrtc=(12, 9)))
    asked = []
    monkeypatch.setattr(cuda_probe, "cuda_include_dirs", lambda major=None: asked.append(major) or [])
    cuda_probe.cuda_checks.cache_clear()
    assert failed() == ["headers"] and asked == [12]
    assert 'no CUDA 12 headers' in cuda_probe.cuda_status()[1]
    assert 'pip install -e ".[cuda12]"' in cuda_probe.cuda_status()[1]


def test_headers_missing(gpu):
    assert gpu(headers=())[-1] == ("headers", False)
    assert "cuda_fp16.h" in cuda_probe.cuda_status()[1] and FIX13 in cuda_probe.cuda_status()[1]


def test_compile_error(gpu):
    assert gpu(backend=FakeGpu("compile"))[-1] == ("compile", False)
    why = cuda_probe.cuda_status()[1]
    assert why.startswith("compile: elementwise.cu add_f32 did not compile") and "NVRTC 13.0" in why


@pytest.mark.parametrize("bad,needle", [("launch", "CUDA_ERROR_LAUNCH_FAILED"), ("wrong", "[4.0, 4.0")])
def test_run_fails(gpu, bad, needle):
    assert gpu(backend=FakeGpu(bad))[-1] == ("run", False)
    assert needle in cuda_probe.cuda_status()[1]


def test_probe_kernel_call_is_right_on_the_emulator(gpu, emu):
    # The emulator runs the real add_f32 with the probe's exact launch; its headers are found
    # through the (fake) cupy's NVRTC major, so fake the major that is really installed here.
    major = paths.nvrtc_major()
    if major is None:
        pytest.skip("no NVRTC installed: no CUDA headers for the emulator to pick by major")
    assert gpu(fake_cupy(nvrtc=(major, 0)), backend=emu)[-1] == ("run", True)


def test_probe_runs_once_per_process(gpu, monkeypatch):
    gpu()
    made = []
    monkeypatch.setattr(cuda_probe, "_make_backend", lambda: made.append(1) or FakeGpu())
    cuda_probe.cuda_status(), cuda_probe.cuda_status(), select.available_backends()
    assert made == []  # cached from gpu()'s run


def test_auto_falls_back_to_emu_with_the_reason(gpu):
    gpu(fake_cupy(nvrtc=RuntimeError("libnvrtc.so.13: cannot open shared object file")))
    be = select.get_backend("auto")
    assert be.name == "emu"
    name, why = select.last_auto_choice()
    assert name == "emu" and why.startswith("nvrtc:") and FIX13 in why
    with pytest.raises(BackendError, match=r"cuda backend unavailable: nvrtc: NVRTC not loadable.*\.\[cuda13\]"):
        select.get_backend("cuda")
    assert select.last_auto_choice() is None  # that call named its backend
    select.get_backend("emu")


def test_cli_says_why_auto_did_not_use_the_gpu(gpu, capsys):
    from sharpinf.cli.common import backend_named

    gpu(headers=())
    assert backend_named("auto").name == "emu"
    err = capsys.readouterr().err
    assert err.startswith("auto: using the CPU emulator (headers: no CUDA 13 headers") and FIX13 in err
    assert len(err.strip().splitlines()) == 1
    backend_named("emu")
    assert capsys.readouterr().err == ""


def test_gpu_fixture_fails_instead_of_skipping_a_broken_gpu(gpu):
    import conftest

    gpu(fake_cupy(nvrtc=RuntimeError("no NVRTC")))
    assert conftest.cuda_unavailable_reason() is None  # the cuda cases are collected, not skipped...
    with pytest.raises(BackendError, match="nvrtc: NVRTC not loadable"):
        conftest._make_backend("cuda")  # ...and the backend fixture raises the probe's reason


def test_doctor_rows_and_brackets(gpu, monkeypatch):
    from typer.testing import CliRunner

    from sharpinf.cli import app
    from sharpinf.runtime import doctor

    gpu(fake_cupy(nvrtc=RuntimeError("libnvrtc.so.13 missing")))
    monkeypatch.setattr(doctor, "_gpu", lambda: None)
    report = doctor.collect()
    assert [(c["name"], c["ok"]) for c in report["cuda_checks"]] == [
        ("cupy", True), ("driver", True), ("device", True), ("nvrtc", False)]
    assert report["driver_cuda_major"] == 13
    assert any(FIX13 in a for a in report["advice"])
    lines = CliRunner().invoke(app, ["doctor"]).output.splitlines()
    # Rich markup would eat `[cuda13]`: the probe's row and the advice keep it
    nvrtc_row = next(line for line in lines if line.startswith("│ nvrtc "))
    assert "FAIL" in nvrtc_row and FIX13 in nvrtc_row
    assert any(FIX13 in line for line in lines if line.startswith("advice:"))


def test_cli_error_keeps_the_fix_brackets(gpu, capsys):
    from sharpinf.cli import main
    from sharpinf.model.synth import synthetic_model

    gpu(headers=())
    with pytest.raises(SystemExit):
        main(["info", str(synthetic_model("llama", "F32", n_embd=64)), "--backend", "cuda"])
    err = capsys.readouterr().err
    assert "error: cuda backend unavailable: headers:" in err and FIX13 in err
