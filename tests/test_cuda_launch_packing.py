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
from sharpinf.runtime.cuda_backend import CudaBackend, CudaKernel


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
    return be


def fake_kernel(name: str = "k", ptr: int = 0xF00) -> CudaKernel:
    k = object.__new__(CudaKernel)
    k.name, k.ptr, k.path = name, ptr, None
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
