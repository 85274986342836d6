"""The emulator's shared-memory checks (sharpinf/runtime/emu/emu_racecheck.cpp): racecheck names
a hazard between two threads of one barrier interval, initcheck a read of shared memory no
thread of the block wrote -- kernel, array, byte offset, both threads and both source lines --
and static shared arrays are poisoned for every block. The planted bugs live in
tests/kernels_emu/races.cu, each on a line marked MARK:<name>."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from sharpinf.errors import BackendError
from sharpinf.runtime.emu_backend import EmuBackend

SRC = str(Path(__file__).parent / "kernels_emu" / "races.cu")
ORDERS = ("forward", "reverse", "random")


def line(mark: str) -> str:
    for i, text in enumerate(Path(SRC).read_text().splitlines(), 1):
        if f"MARK:{mark}" in text:
            return f"races.cu:{i}"
    raise AssertionError(mark)


_BACKENDS: dict[tuple, EmuBackend] = {}


def checked(order: str = "forward", race: bool = True, init: bool = True) -> EmuBackend:
    key = (order, race, init)
    if key not in _BACKENDS:
        _BACKENDS[key] = EmuBackend(order=order, racecheck=race, initcheck=init)
    return _BACKENDS[key]


def run(be: EmuBackend, name: str, grid: int, block: int, *args, shared: int = 0) -> None:
    be.launch(be.kernel(SRC, name), grid, block, args, shared)


def failure(be: EmuBackend, name: str, grid: int, block: int, *args, shared: int = 0) -> str:
    with pytest.raises(BackendError) as e:
        run(be, name, grid, block, *args, shared=shared)
    return str(e.value)


def floats(be, n):
    return be.zeros((n,), np.float32)


@pytest.mark.parametrize("order", ORDERS)
def test_a_read_across_warps_without_a_barrier_is_a_hazard(order):
    be = checked(order)
    msg = failure(be, "raw_across_warps", 1, 64, floats(be, 64))
    assert msg.startswith("kernel raw_across_warps, block (0,0,0): racecheck: "), msg
    assert re.search(r"(read-after-write|write-after-read) hazard: shared array `s` \(declared at races.cu:7\), "
                     r"byte \d+ \(element \d+ of 4 bytes\)", msg), msg
    # the two threads are one warp apart (writer t, reader t + 32) and both lines are named
    t = sorted(int(x) for x in re.findall(r"thread (\d+) \(warp", msg))
    assert len(t) == 2 and t[1] - t[0] == 32, msg
    assert line("raw_write") in msg and line("raw_read") in msg, msg


@pytest.mark.parametrize("order", ORDERS)
def test_a_reduction_missing_its_barrier_is_caught_and_the_right_one_passes(order):
    be = checked(order)
    x = be.upload(np.ones(128, np.float32))
    msg = failure(be, "reduce", 1, 128, x, floats(be, 1), np.int32(0))
    assert "racecheck:" in msg and "shared array `red`" in msg and line("reduce_add") in msg, msg
    out = floats(be, 1)
    run(be, "reduce", 1, 128, x, out, np.int32(1))
    assert out[0] == 128.0


@pytest.mark.parametrize("order", ORDERS)
def test_syncwarp_orders_lanes_and_a_shuffle_does_not(order):
    be = checked(order)
    out = floats(be, 32)
    run(be, "warp_exchange", 1, 32, out, np.int32(1))
    assert np.array_equal(out, (np.arange(32) ^ 1).astype(np.float32))  # each lane read its neighbour's
    msg = failure(be, "warp_exchange", 1, 32, floats(be, 32), np.int32(0))
    assert "racecheck: read-after-write hazard: shared array `w`" in msg, msg
    assert line("warp_write") in msg and line("warp_read") in msg and "(warp 0, lane" in msg, msg


@pytest.mark.parametrize("order", ORDERS)
def test_a_reader_of_another_warp_is_kept_whichever_order_the_readers_came_in(order):
    be = checked(order)
    msg = failure(be, "war_third_reader", 1, 64, floats(be, 64))
    assert "racecheck: write-after-read hazard: shared array `w`" in msg, msg
    assert "thread 40 (warp 1" in msg and line("third_write") in msg and line("third_read") in msg, msg


@pytest.mark.parametrize("order", ORDERS)
def test_a_lanes_read_after_its_warps_syncwarp_is_the_one_kept(order):
    be = checked(order)
    msg = failure(be, "war_reread", 1, 32, floats(be, 32))
    assert re.search(r"racecheck: (write-after-read|read-after-write) hazard: shared array `r`", msg), msg
    assert line("reread") in msg and line("reread_write") in msg, msg


def test_two_writers_of_one_word_in_one_interval():
    be = checked()
    msg = failure(be, "waw_same_word", 1, 32, be.zeros((32,), np.int32))
    assert "racecheck: write-after-write hazard: shared array `flag`" in msg and line("waw_write") in msg, msg


@pytest.mark.parametrize("order", ORDERS)
def test_initcheck_names_a_read_of_unwritten_static_and_dynamic_shared_memory(order):
    be = checked(order, race=False)
    msg = failure(be, "uninit_static", 1, 64, floats(be, 64))
    assert "initcheck: uninitialised read: shared array `half_s` (declared at races.cu:50)" in msg, msg
    assert line("uninit_read") in msg and re.search(r"byte (1[2-9]\d|2[0-5]\d) \(element (3[2-9]|[4-6]\d)", msg), msg
    msg = failure(be, "uninit_dynamic", 1, 64, floats(be, 64), shared=128 * 4)
    assert "initcheck: uninitialised read: dynamic shared memory `dyn_s`, byte 256: thread 63" in msg, msg
    assert line("uninit_dyn") in msg, msg


@pytest.mark.parametrize("order", ORDERS)
def test_correct_code_passes_both_checks(order):
    """Barriers, shared atomics, fixed-size copies into shared memory, a 2-D array, multiple blocks."""
    be = checked(order)
    x = be.upload(np.arange(64, dtype=np.float32))
    out, count = floats(be, 128), be.zeros((1,), np.int32)
    run(be, "clean", 1, 128, x, out, count)
    assert count[0] == 128
    t = np.arange(128)
    want = np.arange(64, dtype=np.float32)[((t // 32 + 1) % 4 * 32 + t % 32) % 64]
    assert np.array_equal(out, want)


@pytest.mark.parametrize("order", ORDERS)
def test_a_copy_longer_than_16_bytes_is_seen_by_both_checks(order):
    """g++ instruments a memcpy only where it becomes one access of at most 16 bytes; the emulator
    reports every copy's ranges itself."""
    be = checked(order)
    x = be.upload(np.arange(64, dtype=np.int32))
    out = be.zeros((64,), np.int32)
    run(be, "copy32", 1, 64, x, out, np.int32(0), np.int32(32))
    assert np.array_equal(out, np.arange(64)[::-1])
    msg = failure(be, "copy32", 1, 64, x, out, np.int32(1), np.int32(32))
    assert "hazard" in msg and line("copy32_write") in msg, msg


def test_static_shared_memory_is_poisoned_per_block_under_the_checks():
    out = EmuBackend(racecheck=False, initcheck=False)
    run(out, "raw_across_warps", 1, 64, floats(out, 64))  # unchecked: the race runs unreported
    be = checked(race=True, init=False)
    res = be.zeros((3,), np.int32)
    run(be, "static_per_block", 3, 32, res)
    assert res.tolist() == [42, -1, -1]  # blocks 1 and 2 see the poison (0xFF bytes), not block 0's 42
    msg = failure(checked(race=False, init=True), "static_per_block", 3, 32, be.zeros((3,), np.int32))
    assert "block (1,0,0): initcheck: uninitialised read: shared array `carried`" in msg, msg
    assert out.describe()["racecheck"] is False and checked().describe()["racecheck"] is True


def test_the_checks_follow_the_environment(monkeypatch):
    monkeypatch.setenv("SHARPINF_EMU_RACECHECK", "1")
    monkeypatch.setenv("SHARPINF_EMU_INITCHECK", "0")
    be = EmuBackend()
    assert be.racecheck and not be.initcheck
