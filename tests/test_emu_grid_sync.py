"""The emulator's grid barrier (common.cuh's sharpinf_grid_sync in a cooperative launch):
it orders global writes across blocks in both thread orders, keeps each block's shared
memory its own, and a grid that cannot pass it is reported, never hung. Kernels in
tests/kernels_emu/grid.cu."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sharpinf.errors import BackendError
from sharpinf.runtime.emu_backend import EmuBackend
from asserts import assert_same

GRID = str(Path(__file__).parent / "kernels_emu" / "grid.cu")
BLOCKS, THREADS, ROUNDS = 4, 64, 5


def line(mark: str) -> str:
    """'grid.cu:N' for the line carrying `// MARK:<mark>`."""
    for i, text in enumerate(Path(GRID).read_text().splitlines(), 1):
        if f"MARK:{mark}" in text:
            return f"grid.cu:{i}"
    raise AssertionError(mark)


def ring(be: EmuBackend, barrier: int) -> np.ndarray:
    buf = be.zeros((2, BLOCKS * THREADS), np.int32)
    out = be.zeros(BLOCKS * THREADS, np.int32)
    bar = be.zeros(2, np.uint32)
    be.launch(be.kernel(GRID, "grid_ring"), BLOCKS, THREADS, [buf, out, bar, np.int32(ROUNDS), np.int32(barrier)],
              cooperative=True)
    return be.download(out).reshape(BLOCKS, THREADS)


def ring_want() -> np.ndarray:
    b = (np.arange(BLOCKS) + ROUNDS) % BLOCKS
    return (b[:, None] * 1000 + np.arange(THREADS)[None, :]).astype(np.int32)


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_grid_barrier_orders_writes_across_blocks(order):
    be = EmuBackend(order=order, racecheck=True, initcheck=True)
    assert_same(ring(be, barrier=1), ring_want())
    # negative control: without the barrier a block reads its neighbour's slot before it is written
    assert not np.array_equal(ring(be, barrier=0), ring_want())


def test_grid_barrier_deadlock_names_the_blocks():
    be = EmuBackend()
    out = be.zeros(BLOCKS * 32, np.int32)
    with pytest.raises(BackendError) as e:
        be.launch(be.kernel(GRID, "grid_skip"), BLOCKS, 32, [out, be.zeros(2, np.uint32), np.int32(1)],
                  cooperative=True)
    msg = str(e.value)
    assert "deadlock at the grid barrier" in msg and line("grid_skip") in msg, msg
    assert "block(s) 0, 2, 3 wait there" in msg and "block(s) 1 exited" in msg, msg
    # the same kernel with every block reaching the barrier passes (the backend is still usable)
    be.launch(be.kernel(GRID, "grid_skip"), BLOCKS, 32, [out, be.zeros(2, np.uint32), np.int32(-1)],
              cooperative=True)
    assert_same(be.download(out), np.ones(BLOCKS * 32, np.int32))


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_grid_barrier_a_failing_block_ends_the_launch(order):
    # the trap is what is reported, not the blocks abandoned at the barrier
    be = EmuBackend(order=order)
    with pytest.raises(BackendError) as e:
        be.launch(be.kernel(GRID, "grid_trap"), BLOCKS, 32, [be.zeros(2, np.uint32), np.int32(2)], cooperative=True)
    msg = str(e.value)
    assert "__trap()" in msg and "block (2,0,0)" in msg and "abandoned" not in msg, msg


def test_racecheck_in_a_cooperative_launch_names_the_block():
    # each block keeps its own shadow: the race is block 1's alone, found in both orders
    for order in ("forward", "reverse"):
        be = EmuBackend(order=order, racecheck=True, initcheck=True)
        with pytest.raises(BackendError) as e:
            be.launch(be.kernel(GRID, "grid_race"), BLOCKS, 64, [be.zeros(BLOCKS * 64, np.int32), be.zeros(2, np.uint32)],
                      cooperative=True)
        msg = str(e.value)
        assert "block (1,0,0)" in msg and "racecheck:" in msg and "shared array `s`" in msg, msg
        assert line("grid_race_write") in msg and line("grid_race_read") in msg, msg


def test_grid_barrier_needs_a_cooperative_launch():
    be = EmuBackend()
    with pytest.raises(BackendError, match="not cooperative"):
        be.launch(be.kernel(GRID, "grid_skip"), 2, 32, [be.zeros(64, np.int32), be.zeros(2, np.uint32), np.int32(-1)])


def test_grid_barrier_mixed_with_syncthreads_is_reported():
    be = EmuBackend()
    with pytest.raises(BackendError, match="wait at sharpinf_grid_sync .* and __syncthreads|wait at __syncthreads .* and sharpinf_grid_sync"):
        be.launch(be.kernel(GRID, "grid_mixed"), 2, 64, [be.zeros(2, np.uint32)], cooperative=True)
