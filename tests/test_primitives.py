"""The hardware primitives of kernels_cu/common.cuh through small test kernels
(tests/kernels_prims/*.cu): on the emulator this checks the PTX fragment layouts the
emulated branches follow; on a GPU the same test checks the real instructions."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from asserts import assert_close, assert_same

PRIMS = Path(__file__).parent / "kernels_prims"


def _k(backend, file, name):
    return backend.kernel(str(PRIMS / file), name)


def _mma_inputs(seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((16, 16)).astype(np.float16)
    b = rng.standard_normal((16, 8)).astype(np.float16)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    return a, b, c


@pytest.mark.parametrize("variant", ["mma_direct", "mma_ldmatrix"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mma_m16n8k16(backend, variant, seed):
    a, b, c = _mma_inputs(seed)
    d = backend.zeros((16, 8), np.float32)
    args = (backend.upload(a), backend.upload(np.ascontiguousarray(b.T)), backend.upload(c), d)
    backend.launch(_k(backend, "mma.cu", variant), 1, 32, args)
    want = a.astype(np.float64) @ b.astype(np.float64) + c
    # fp16 products are exact in fp32; only the fp32 accumulation order differs
    assert_close(backend.download(d), want, rtol=1e-5, atol=1e-5)


def test_mma_fragment_positions(backend):
    # one-hot A and B: any fragment-index mistake moves or loses the single 1
    d = backend.zeros((16, 8), np.float32)
    kern = _k(backend, "mma.cu", "mma_direct")
    for i, k, j in [(0, 0, 0), (15, 15, 7), (8, 3, 5), (7, 9, 2), (3, 14, 6)]:
        a = np.zeros((16, 16), np.float16)
        b = np.zeros((16, 8), np.float16)
        a[i, k], b[k, j] = 1, 1
        c = np.zeros((16, 8), np.float32)
        backend.launch(kern, 1, 32, (backend.upload(a), backend.upload(np.ascontiguousarray(b.T)), backend.upload(c), d))
        want = np.zeros((16, 8), np.float32)
        want[i, j] = 1
        assert_same(backend.download(d), want)


def test_ldmatrix_x4_layout(backend):
    rng = np.random.default_rng(7)
    src = rng.integers(0, 2**16, size=(32, 16), dtype=np.uint16)
    rowsel = rng.permutation(32).astype(np.int32)  # each lane points at an arbitrary row
    out = backend.zeros((32, 4), np.uint32)
    backend.launch(_k(backend, "ldmatrix.cu", "ldmatrix_rows"), 1, 32, (backend.upload(src), backend.upload(rowsel), out))
    want = np.zeros((32, 4), np.uint32)
    for lane in range(32):
        for i in range(4):
            owner = i * 8 + (lane >> 2)  # the lane that supplied this row's address
            row = src[rowsel[owner], 8 * (owner & 1):][2 * (lane & 3):]
            want[lane, i] = int(row[0]) | (int(row[1]) << 16)
    assert_same(backend.download(out), want)


@pytest.mark.parametrize("nchunks", [1, 7, 256, 257, 1000])
def test_cp_async_copy(backend, nchunks):
    src = np.random.default_rng(nchunks).integers(0, 2**32, size=(nchunks, 4), dtype=np.uint32)
    dst = backend.zeros((nchunks, 4), np.uint32)
    grid = -(-nchunks // 256)
    backend.launch(_k(backend, "cp_async.cu", "cp_async_copy"), grid, 128, (backend.upload(src), dst, np.int32(nchunks)))
    want = np.concatenate([src[s:s + 256][::-1] for s in range(0, nchunks, 256)])
    assert_same(backend.download(dst), want)


@pytest.mark.parametrize("blocks,block", [(1, 32), (3, 64), (5, 96)])
def test_warp_reduce(backend, blocks, block):
    x = np.random.default_rng(blocks).standard_normal(blocks * block).astype(np.float32)
    s, m = backend.empty(x.shape, np.float32), backend.empty(x.shape, np.float32)
    backend.launch(_k(backend, "reduce.cu", "warp_reduce"), blocks, block, (backend.upload(x), s, m))
    warps = x.reshape(-1, 32)
    assert_close(backend.download(s).reshape(-1, 32), np.repeat(warps.sum(1, keepdims=True), 32, 1),
                               rtol=1e-5, atol=1e-5)
    assert_same(backend.download(m).reshape(-1, 32), np.repeat(warps.max(1, keepdims=True), 32, 1))


def _butterfly(warps: np.ndarray, op) -> np.ndarray:
    """Every lane's result of the xor butterfly, as the shuffles compute it: at each round lane j
    takes op(its value, lane j^off's), off = 16, 8, 4, 2, 1."""
    x, lanes = warps.copy(), np.arange(32)
    for off in (16, 8, 4, 2, 1):
        x = op(x, x[:, lanes ^ off])
    return x


def test_warp_reductions_are_the_xor_butterfly_bit_for_bit(backend):
    """The order is part of the contract (a token's bits follow it), so it is checked exactly: values
    spread over 40 binades make any other order of the float adds give other bits. On the emulator
    this is what its stand-ins (one exchange, the rounds replayed: common.cuh) must reproduce."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(4 * 64) * 2.0 ** rng.integers(-20, 20, 4 * 64)).astype(np.float32)
    s, m = backend.empty(x.shape, np.float32), backend.empty(x.shape, np.float32)
    backend.launch(_k(backend, "reduce.cu", "warp_reduce"), 4, 64, (backend.upload(x), s, m))
    warps = x.reshape(-1, 32)
    want = _butterfly(warps, np.add)
    assert_same(backend.download(s).reshape(-1, 32), want)
    in_lane_order = functools.reduce(lambda acc, col: acc + col, warps.T)  # another order: other bits
    assert not np.array_equal(want[:, 0], in_lane_order)
    assert_same(backend.download(m).reshape(-1, 32), _butterfly(warps, np.fmax))
    xi = rng.integers(-2**31, 2**31, 4 * 64, dtype=np.int64).astype(np.int32)  # sums wrap, as int adds do
    out = backend.empty(xi.shape, np.int32)
    backend.launch(_k(backend, "reduce.cu", "warp_sum_ints"), 4, 64, (backend.upload(xi), out))
    with np.errstate(over="ignore"):
        assert_same(backend.download(out).reshape(-1, 32), _butterfly(xi.reshape(-1, 32), np.add))


@pytest.mark.parametrize("rows,block,n", [(1, 32, 1), (3, 96, 33), (5, 160, 1000), (7, 1024, 4097), (3, 1024, 5)])
def test_block_reduce(backend, rows, block, n):
    x = (np.random.default_rng(n).standard_normal((rows, n)) - 3).astype(np.float32)  # all-negative-ish: max is real
    s, m = backend.empty((rows, block), np.float32), backend.empty((rows, block), np.float32)
    backend.launch(_k(backend, "reduce.cu", "block_reduce"), rows, block, (backend.upload(x), s, m, np.int32(n)))
    want_s = x.astype(np.float64).sum(1, keepdims=True)
    assert_close(backend.download(s), np.repeat(want_s, block, 1), rtol=1e-5, atol=1e-4)
    assert_same(backend.download(m), np.repeat(x.max(1, keepdims=True), block, 1))
