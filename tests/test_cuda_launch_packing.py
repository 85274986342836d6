"""The CUDA backend's launch path without a GPU: cupy is replaced by a stand-in whose
cuLaunchKernel reads back the kernel-parameter array exactly as the driver would, so the
packing (pointer and scalar slots, C types), the launch geometry and the error wrapping are
checked on every commit. The real thing runs in the GPU tests."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

from sharpinf.errors import BackendError
from sharpinf.runtime.cuda_backend import CudaBackend
from sharpinf.runtime.cuda_launch import CudaKernel


class FakeDeviceArray:
    def __init__(self, ptr: int):
        self.data = SimpleNamespace(ptr=ptr)


class FakeCudaError(Exception):
    pass


def fake_backend(on_launch):
    be = object.__new__(CudaBackend)
    be.cp = SimpleNamespace(ndarray=FakeDeviceArray)
    be._launch_kernel = on_launch
    be._stream = SimpleNamespace(ptr=0x5EA, synchronize=lambda: None)
    be._cuda_errors = (FakeCudaError,)
    be._sync_each, be._capturing, be._last = False, False, "(none yet)"
    be._pdl, be._pdl_state = None, "off"
    be._launch_coop = lambda *a: on_launch(*a[:-1], "coop")
    return be


def fake_kernel(name: str = "k", ptr: int = 0xF00, path=None) -> CudaKernel:
    k = object.__new__(CudaKernel)
    k.name, k.ptr, k.path = name, ptr, path
    return k


def test_parameters_reach_the_driver_as_the_kernel_declares_them():
    seen = []

    def launch(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        slots = (ctypes.c_void_p * 5).from_address(params)
        vals = (ctypes.c_uint64.from_address(slots[0]).value, ctypes.c_int32.from_address(slots[1]).value,
                ctypes.c_float.from_address(slots[2]).value, ctypes.c_uint64.from_address(slots[3]).value,
                ctypes.c_uint16.from_address(slots[4]).value)
        seen.append(((f, gx, gy, gz, bx, by, bz, smem, stream, extra), vals))

    be = fake_backend(launch)
    l = be.prepare(fake_kernel(), (3, 2), 128, (FakeDeviceArray(0x7F0000001000), np.int32(-7), np.float32(1.5),
                                                 np.uint64(2**40 + 3), np.float16(1.0)), shared_mem=64, io=(10, 20))
    assert l.grid == (3, 2, 1) and l.block == (128, 1, 1) and l.io == (10, 20)
    be.run([l, l])
    assert len(seen) == 2 and be._last == "k"
    geometry, vals = seen[0]
    assert geometry == (0xF00, 3, 2, 1, 128, 1, 1, 64, 0x5EA, 0)
    assert vals == (0x7F0000001000, -7, 1.5, 2**40 + 3, 0x3C00)  # half 1.0 passed as its bits


def test_launch_checks_happen_once_at_prepare():
    be = fake_backend(lambda *a: None)
    with pytest.raises(BackendError, match="pass a NumPy scalar"):
        be.prepare(fake_kernel(), 1, 32, (FakeDeviceArray(1), 5))
    with pytest.raises(BackendError, match="more than 1024 threads"):
        be.prepare(fake_kernel(), 1, (64, 32), (FakeDeviceArray(1),))
    with pytest.raises(BackendError, match="upload it first"):
        be.prepare(fake_kernel(), 1, 32, (np.zeros(3, np.float32),))


def test_a_driver_error_names_the_kernel():
    def launch(*a):
        raise FakeCudaError("CUDA_ERROR_ILLEGAL_ADDRESS")

    be = fake_backend(launch)
    l = be.prepare(fake_kernel("attention_f16_d64"), 1, 32, (FakeDeviceArray(1),))
    with pytest.raises(BackendError, match=r"attention_f16_d64 .*ILLEGAL_ADDRESS.*SHARPINF_SYNC=1"):
        be.run([l])


def test_errors_at_a_sync_point_name_the_last_kernel():
    be = fake_backend(lambda *a: None)
    be.run([be.prepare(fake_kernel("matmul_q4_k"), 1, 32, (FakeDeviceArray(1),))])
    with pytest.raises(BackendError, match="last kernel launched was matmul_q4_k.*SHARPINF_SYNC=1"):
        with be._errors("synchronize"):
            raise FakeCudaError("an illegal memory access was encountered")


def test_pdl_launches_carry_the_attribute_and_the_same_parameters():
    """SHARPINF_PDL's path: cuLaunchKernelEx gets cuda.h's CUlaunchConfig (geometry, the stream, one
    attribute: programmatic stream serialization = 1) and the parameter array prepare packed; a
    cooperative launch stays an ordinary one (its grid must start whole), and so does a kernel from
    outside kernels_dir() (whose entries no test has proven to wait)."""
    from sharpinf.runtime.paths import kernels_dir
    from sharpinf.runtime.pdl_launch import LaunchConfig, PdlLauncher

    seen, plain = [], []

    def launch_ex(cfg_ptr, f, params, extra):
        c = LaunchConfig.from_address(cfg_ptr)
        a = c.attrs[0]
        value = ctypes.c_int32.from_address(ctypes.c_void_p.from_address(params).value).value
        seen.append(((c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.blockDimY, c.blockDimZ, c.sharedMemBytes),
                     c.hStream, c.numAttrs, a.id, a.value, f, value, extra))
        return 0

    be = fake_backend(lambda *a: plain.append(a))
    be.resident_blocks = lambda kernel, threads, shared_mem=0: 132
    be._pdl = object.__new__(PdlLauncher)
    be._pdl._fn, be._pdl._error_string = launch_ex, None
    k = fake_kernel("rmsnorm_q8_1", 0xABC, kernels_dir() / "rmsnorm_q8_1.cu")
    be.run([be.prepare(k, (5, 1, 2), 96, (np.int32(41),), shared_mem=256)])
    assert seen == [((5, 1, 2, 96, 1, 1, 256), 0x5EA, 1, 6, 1, 0xABC, 41, None)] and not plain
    be.run([be.prepare(k, 4, 32, (np.int32(1),), cooperative=False), be.prepare(k, 2, 32, (np.int32(2),),
                                                                            cooperative=True)])
    assert len(seen) == 2 and len(plain) == 1 and plain[0][-1] == "coop"
    elsewhere = fake_kernel("probe", 0xDEF, kernels_dir().parent / "tests" / "kernels_prims" / "probe.cu")
    be.run([be.prepare(elsewhere, 1, 32, (np.int32(4),))])
    assert len(seen) == 2 and len(plain) == 2 and plain[1][0] == 0xDEF

    be._pdl._fn = lambda *a: 700  # CUDA_ERROR_ILLEGAL_ADDRESS
    with pytest.raises(BackendError, match=r"rmsnorm_q8_1 .*cuLaunchKernelEx failed: CUresult 700"):
        be.run([be.prepare(k, 1, 32, (np.int32(3),))])


def test_pdl_env_is_checked(monkeypatch):
    from sharpinf.runtime.pdl_launch import check_pdl_env, pdl_requested

    for v, on in (("1", True), ("on", True), ("0", False), ("", False)):
        monkeypatch.setenv("SHARPINF_PDL", v)
        check_pdl_env()
        assert pdl_requested() is on
    monkeypatch.setenv("SHARPINF_PDL", "maybe")
    with pytest.raises(BackendError, match="SHARPINF_PDL must be 0 or 1, got 'maybe'"):
        check_pdl_env()


def test_pdl_is_on_only_where_asked_on_sm_90_with_a_12_3_driver(monkeypatch):
    """What describe() says of SHARPINF_PDL (the backend's _pdl_launcher, with CuPy's runtime faked)."""
    import sharpinf.runtime.cuda_backend as cb

    monkeypatch.setattr(cb, "PdlLauncher", lambda: "launcher")

    def state(major, driver):
        be = fake_backend(lambda *a: None)
        rt = SimpleNamespace(getDeviceProperties=lambda dev: {"major": major}, driverGetVersion=lambda: driver)
        be.cp = SimpleNamespace(ndarray=FakeDeviceArray, cuda=SimpleNamespace(runtime=rt))
        be.device_id = 0
        return be._pdl_launcher()

    monkeypatch.delenv("SHARPINF_PDL", raising=False)
    assert state(9, 13000) == (None, "off")
    monkeypatch.setenv("SHARPINF_PDL", "1")
    assert state(9, 13000) == ("launcher", "on")
    assert state(8, 13000) == (None, "off: SHARPINF_PDL=1 needs sm_90 or later (this GPU is sm_8x)")
    assert state(9, 12020) == (None, "off: SHARPINF_PDL=1 needs a CUDA 12.3 driver or later (this one is 12.2)")
    monkeypatch.setenv("SHARPINF_PDL", "2")
    with pytest.raises(BackendError, match="SHARPINF_PDL must be 0 or 1"):
        state(9, 13000)


def test_device_seconds_times_the_recorded_launches_alone_with_l2_emptied_before_each_run():
    """matmul=timed's clock: the call's launches prepared once (recorded), run once untimed, then each
    timed run between two events with the L2 flush queued before the first event; the median (ms -> s).
    Not while capturing, nor with SHARPINF_SYNC (a host sync would sit in the interval)."""
    timeline = []

    class Event:
        def __init__(self, block=False, disable_timing=True):
            assert not disable_timing
            self.i = None

        def record(self, stream):
            self.i = len(timeline)
            timeline.append("event")

        def synchronize(self):
            timeline.append("sync")

    be = fake_backend(lambda f, *a: timeline.append(f"launch {f:#x}"))
    ms = [5.0, 1.0, 3.0, 2.0, 4.0]
    be.cp.cuda = SimpleNamespace(Event=Event, get_elapsed_time=lambda a, b: ms[(a.i - 2) // 4],
                                 runtime=SimpleNamespace(memsetAsync=lambda *a: timeline.append("flush")))
    be._recording = be._collecting = None
    k, flush = fake_kernel(ptr=0xA), SimpleNamespace(data=SimpleNamespace(ptr=1), nbytes=64)
    prepared = []
    real_prepare = be.prepare
    be.prepare = lambda *a, **kw: prepared.append(1) or real_prepare(*a, **kw)
    s = be.device_seconds(lambda: be.launch(k, 1, 32, ()), repeats=5, flush=flush)
    assert prepared == [1]  # recorded once, then only run
    assert timeline == ["launch 0xa"] + ["flush", "event", "launch 0xa", "event"] * 5 + ["sync"]
    assert s == pytest.approx(3.0e-3)  # the median of 5, 1, 3, 2, 4 ms
    be._capturing = True
    assert not be.can_time() and be.device_seconds(lambda: timeline.append("ran")) is None
    be._capturing, be._sync_each = False, True
    assert not be.can_time() and "ran" not in timeline
