"""Emulator memcheck (emu/memcheck.py): every EmuBackend allocation carries guard bytes that
are checked after each launch, so an out-of-bounds store is reported with the kernel, the
argument and the byte offsets instead of corrupting the heap; strict mode puts PROT_NONE
pages around each allocation so out-of-bounds loads fail the launch too, naming the thread.
Test kernels: tests/kernels_emu/oob.cu. Anything that may crash runs in run_isolated."""

from __future__ import annotations

import ctypes
import gc
import mmap
from pathlib import Path

import numpy as np
import pytest

from sharpinf.errors import BackendError
from sharpinf.runtime.emu import memcheck
from sharpinf.runtime.emu.isolate import run_isolated
from sharpinf.runtime.emu_backend import EmuBackend
from asserts import assert_same

OOB = str(Path(__file__).parent / "kernels_emu" / "oob.cu")
F32 = np.float32


@pytest.fixture(scope="module")
def guarded():
    return EmuBackend(memcheck="on")


@pytest.fixture(scope="module")
def strict():
    return EmuBackend(memcheck="strict")


def add_into(be: EmuBackend, n: int, extra: int) -> tuple[np.ndarray, ...]:
    a = be.upload(np.arange(n + extra, dtype=F32))
    b = be.full((n + extra,), 1.0, F32)
    out = be.zeros((n,), F32)
    be.launch(be.kernel(OOB, "add_into"), -(-(n + extra) // 64), 64, [a, b, out, np.int32(n), np.int32(extra)])
    return a, b, out


def guard_bytes_intact(a: np.ndarray) -> bool:
    buf = a.base
    return all((buf[o:o + n] == memcheck.GUARD_BYTE).all() for o, n in buf.guards)


# -- guard mode (the default) ------------------------------------------------------------------------
def test_memcheck_is_on_by_default_and_env_turns_it_off_or_strict(monkeypatch):
    monkeypatch.delenv("SHARPINF_EMU_MEMCHECK", raising=False)
    assert EmuBackend().memcheck == memcheck.GUARD
    for value, mode in (("0", memcheck.OFF), ("off", memcheck.OFF), ("strict", memcheck.STRICT), ("1", memcheck.GUARD)):
        monkeypatch.setenv("SHARPINF_EMU_MEMCHECK", value)
        assert EmuBackend().memcheck == mode
    assert EmuBackend(memcheck="off").describe()["memcheck"] == "off"
    with pytest.raises(BackendError, match="unknown memcheck setting"):
        EmuBackend(memcheck="sometimes")


@pytest.mark.parametrize("mode", ["on", "strict"])
@pytest.mark.parametrize("shape, dtype", [((128,), F32), ((3, 5), np.float16), ((7,), np.uint8), ((), np.int64),
                                          ((0,), F32), ((2, 3, 4), np.float64)])
def test_allocations_are_plain_contiguous_views_of_a_guarded_owner(mode, shape, dtype):
    be = EmuBackend(memcheck=mode)
    host = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    for a in (be.empty(shape, dtype), be.zeros(shape, dtype), be.full(shape, 3, dtype), be.upload(host)):
        assert type(a) is np.ndarray and a.flags.c_contiguous and a.shape == shape and a.dtype == dtype
        assert type(a.base) is memcheck.GuardedBuffer and a.base.label == memcheck._label(shape, np.dtype(dtype))
        assert guard_bytes_intact(a)
        if mode == "on":
            assert a.ctypes.data % 64 == 0
        else:  # flush with the PROT_NONE page after it
            assert (a.ctypes.data + a.nbytes) % mmap.PAGESIZE == 0
    assert_same(be.zeros(shape, dtype), 0)
    assert_same(be.full(shape, 3, dtype), 3)
    assert_same(be.upload(host), host)
    assert_same(be.upload(host.T), host.T)  # a non-contiguous host array, copied contiguous
    assert be.upload(host.T).flags.c_contiguous


def test_in_bounds_kernel_is_not_flagged(guarded):
    _, _, out = add_into(guarded, 128, 0)
    assert_same(out, np.arange(128) + 1)


def test_store_past_the_end_names_kernel_argument_and_offset(guarded):
    with pytest.raises(BackendError) as e:
        add_into(guarded, 128, 1)
    assert str(e.value) == ("memcheck: kernel add_into wrote 4 bytes past the end of `out` (argument 2, "
                            "float32[128]): element 128 (bytes +0..+3 past the end)")


def test_store_before_the_start_names_the_offset(guarded):
    x = guarded.zeros((4, 16), F32)
    with pytest.raises(BackendError) as e:
        guarded.launch(guarded.kernel(OOB, "store_range"), 1, 32, [x, np.int32(-3), np.int32(3), np.float32(1)])
    assert str(e.value) == ("memcheck: kernel store_range wrote 12 bytes before the start of `x` (argument 0, "
                            "float32[4,16]): elements -3..-1 (bytes -12..-1 before the start)")


def test_store_through_a_view_names_the_allocation(guarded):
    x = guarded.zeros((100,), F32)
    with pytest.raises(BackendError, match=r"wrote 8 bytes past the end of `x` \(argument 0, a view into "
                                           r"float32\[100\]\): elements 100..101 \(bytes \+0..\+7 past the end\)"):
        guarded.launch(guarded.kernel(OOB, "store_range"), 1, 32, [x[90:], np.int32(0), np.int32(12), np.float32(1)])


def test_check_is_per_launch_and_guards_are_restored(guarded):
    x = guarded.zeros((64,), F32)
    k = guarded.kernel(OOB, "store_range")
    with pytest.raises(BackendError, match=r"past the end of `x` \(argument 0"):
        guarded.launch(k, 1, 64, [x, np.int32(60), np.int32(8), np.float32(2)])
    assert guard_bytes_intact(x)
    guarded.launch(k, 1, 64, [x, np.int32(0), np.int32(64), np.float32(5)])  # a good launch on the same buffer passes
    assert (x == 5).all()


def test_graph_replay_is_checked_and_still_detects_reallocation(guarded):
    k = guarded.kernel(OOB, "store_range")
    bufs = {"x": guarded.zeros((32,), F32)}
    with guarded.capture() as g:
        guarded.launch(k, 1, 32, [bufs["x"], np.int32(1), np.int32(32), np.float32(1)])
    with pytest.raises(BackendError, match=r"store_range wrote 4 bytes past the end of `x` .*\(bytes \+0..\+3 past"):
        g.replay()
    bufs["x"] = guarded.zeros((32,), F32)  # the owner of the captured pointer dies
    gc.collect()
    with pytest.raises(BackendError, match="argument 0 of kernel store_range was reallocated after capture"):
        g.replay()


def _stores_past_both_ends_then_works(mode: str) -> list[str]:
    """Stores a full guard's width past each end, then keeps allocating and freeing."""
    be = EmuBackend(memcheck=mode)
    k = be.kernel(OOB, "store_range")
    g = memcheck.GUARD_LEN // 4
    msgs = []
    for _ in range(20):
        x = be.zeros((64,), F32)
        for start in (64, -g):
            try:
                be.launch(k, 1, 64, [x, np.int32(start), np.int32(g), np.float32(-1)])
                msgs.append("no error")
            except BackendError as exc:
                msgs.append(str(exc))
        del x
        junk = [np.ones(n, F32) for n in range(1, 200)]  # malloc and free around the old buffers
        del junk
        gc.collect()
    return msgs


def test_out_of_bounds_stores_leave_the_process_intact():
    msgs = run_isolated(_stores_past_both_ends_then_works, "on", timeout=120)
    assert msgs[:2] == [
        "memcheck: kernel store_range wrote 256 bytes past the end of `x` (argument 0, float32[64]): elements 64..127 "
        "(bytes +0..+255 past the end)",
        "memcheck: kernel store_range wrote 256 bytes before the start of `x` (argument 0, float32[64]): elements "
        "-64..-1 (bytes -256..-1 before the start)",
    ]
    assert msgs == msgs[:2] * 20


def test_memcheck_off_restores_the_old_behaviour():
    be = EmuBackend(memcheck="off")
    for a in (be.empty((8,), F32), be.zeros((8,), F32), be.full((8,), 1, F32), be.upload(np.ones(8, F32))):
        assert type(a) is np.ndarray and a.base is None  # plain NumPy allocations, no guards
    be.kernel(OOB, "store_range")  # compile here (cached), not in the child
    try:  # the stores land in the heap: nothing reports them, the child survives or crashes
        msgs = run_isolated(_stores_past_both_ends_then_works, "off", timeout=120)
        assert set(msgs) == {"no error"}
    except BackendError as exc:
        assert "crashed" in str(exc)


# -- strict mode: each test's launches run in a child (run_isolated), so a broken fault handler
# crashes the child, not pytest --------------------------------------------------------------------
def launch_error(be: EmuBackend, kernel: str, grid: int, block: int, args: list) -> str:
    try:
        be.launch(be.kernel(OOB, kernel), grid, block, args)
    except BackendError as exc:
        return str(exc)
    return ""


def isolated_error(be: EmuBackend, kernel: str, grid: int, block: int, args: list) -> str:
    be.kernel(OOB, kernel)  # compile here (cached), not in the child
    return run_isolated(launch_error, be, kernel, grid, block, args, timeout=60)


def test_strict_catches_a_load_past_the_end_naming_the_thread(strict):
    x = strict.upload(np.arange(256, dtype=F32))
    y = strict.zeros((256,), F32)

    def bad_then_good():
        err = launch_error(strict, "copy_shift", 2, 128, [x, y, np.int32(256), np.int32(1)])
        return err, launch_error(strict, "copy_shift", 2, 128, [x, y, np.int32(256), np.int32(0)]), y.copy()

    strict.kernel(OOB, "copy_shift")
    err, next_err, y_after = run_isolated(bad_then_good, timeout=60)
    assert err == ("memcheck: kernel copy_shift, block (1,0,0), thread 127 read past the end of `x` "
                   "(argument 0, float32[256]): element 256 (byte +0 past the end)")
    assert next_err == ""  # the next launch passes
    assert_same(y_after, x)


def test_strict_catches_a_load_before_the_start_of_a_page_sized_buffer(strict):
    x = strict.zeros((mmap.PAGESIZE // 4,), F32)
    y = strict.zeros((32,), F32)
    err = isolated_error(strict, "copy_shift", 1, 32, [x, y, np.int32(32), np.int32(-1)])
    assert err == ("memcheck: kernel copy_shift, block (0,0,0), thread 0 read before the start of `x` "
                   f"(argument 0, float32[{mmap.PAGESIZE // 4}]): element -1 (byte -4 before the start)")


def test_strict_odd_sized_buffer_ends_flush_with_the_page(strict):
    x = strict.upload(np.arange(101, dtype=F32))
    y = strict.zeros((101,), F32)
    err = isolated_error(strict, "copy_shift", 1, 128, [x, y, np.int32(101), np.int32(1)])
    assert "thread 100 read past the end of `x` (argument 0, float32[101]): element 101 (byte +0 past" in err


def test_strict_store_faults_before_touching_memory(strict):
    x = strict.zeros((64, 4), F32)
    err = isolated_error(strict, "store_range", 1, 32, [x, np.int32(256), np.int32(1), np.float32(1)])
    assert "block (0,0,0), thread 0 wrote past the end of `x` (argument 0, float32[64,4]): element 256 " in err


def test_strict_store_into_the_gap_before_the_start_is_caught_by_guard_bytes(strict):
    x = strict.zeros((100,), F32)
    err = isolated_error(strict, "store_range", 1, 32, [x, np.int32(-1), np.int32(1), np.float32(1)])
    assert err == ("memcheck: kernel store_range wrote 4 bytes before the start of `x` (argument 0, "
                   "float32[100]): element -1 (bytes -4..-1 before the start)")


def test_strict_with_worker_threads():
    be = EmuBackend(memcheck="strict", workers=2)
    x = be.upload(np.arange(64 * 8, dtype=F32))
    y = be.zeros((64 * 8,), F32)
    err = isolated_error(be, "copy_shift", 8, 64, [x, y, np.int32(64 * 8), np.int32(1)])
    assert "block (7,0,0), thread 63 read past the end of `x` (argument 0" in err


def _load_from_an_unreadable_page(be: EmuBackend) -> tuple[int, str]:
    x = np.frombuffer(mmap.mmap(-1, mmap.PAGESIZE), F32)  # not the backend's allocation, and unreadable:
    addr = x.ctypes.data
    assert memcheck._libc.mprotect(addr, mmap.PAGESIZE, 0) == 0
    return addr, launch_error(be, "copy_shift", 1, 1, [x, be.zeros((1,), F32), np.int32(1), np.int32(0)])


def test_strict_fault_outside_the_arguments_guard_pages_is_a_launch_failure(strict):
    strict.kernel(OOB, "copy_shift")
    addr, err = run_isolated(_load_from_an_unreadable_page, strict, timeout=60)
    assert f"thread 0 read at address {addr:#x} (SIGSEGV): not next to any argument" in err


def _strict_launch_then_segfault_outside_a_kernel():
    be = EmuBackend(memcheck="strict")
    x = be.zeros((32,), F32)
    be.launch(be.kernel(OOB, "store_range"), 1, 32, [x, np.int32(0), np.int32(32), np.float32(1)])
    ctypes.string_at(8)  # a fault outside any kernel must still crash, not be swallowed
    return "survived"


def test_strict_handler_leaves_other_faults_alone(strict):
    strict.kernel(OOB, "store_range")
    with pytest.raises(BackendError, match="crashed with SIGSEGV"):
        run_isolated(_strict_launch_then_segfault_outside_a_kernel, timeout=60)
