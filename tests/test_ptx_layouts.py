"""The emulator's tensor-core primitives against the PTX ISA's fragment tables (tests/ptx_layouts.py).

Registers are packed and unpacked here from the ISA's tables alone; the kernels
(tests/kernels_prims/mma_raw.cu) only pass raw registers through the primitive. On a GPU the same
test checks the hardware against the same tables.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ptx_layouts as L  # tests/ptx_layouts.py (pytest puts tests/ on the path)
from asserts import assert_close, assert_same

RAW = str(Path(__file__).parent / "kernels_prims" / "mma_raw.cu")


def _covers(op: L.Operand, rows: int, cols: int) -> bool:
    """The table maps (lane, element) one to one onto the whole rows x cols matrix."""
    seen = [op.position(lane, i) for lane in range(32) for i in range(op.elements)]
    return len(seen) == len(set(seen)) == rows * cols and all(0 <= r < rows and 0 <= c < cols for r, c in seen)


def test_the_transcribed_tables_tile_their_matrices():
    m, n, k = L.MMA_M16N8K16_SHAPE
    assert _covers(L.MMA_M16N8K16_F16["A"], m, k) and _covers(L.MMA_M16N8K16_F16["B"], k, n)
    assert _covers(L.MMA_M16N8K16_F16["C"], m, n)
    m, n, k = L.MMA_M16N8K32_SHAPE
    assert _covers(L.MMA_M16N8K32_S8["A"], m, k) and _covers(L.MMA_M16N8K32_S8["B"], k, n)
    assert _covers(L.MMA_M16N8K32_S8["C"], m, n)
    assert _covers(L.LDMATRIX_X4_DEST, 8, 8)


def pack(op: L.Operand, mat: np.ndarray) -> np.ndarray:
    """Each lane's registers [32, regs] (uint32) holding mat's elements where the table puts them."""
    per = 32 // op.bits
    raw = mat.view(np.uint16 if op.bits == 16 else np.uint8 if op.bits == 8 else np.uint32)
    regs = np.zeros((32, op.elements // per), np.uint64)
    for lane in range(32):
        for i in range(op.elements):
            r, c = op.position(lane, i)
            regs[lane, i // per] |= int(raw[r, c]) << (op.bits * (i % per))
    return regs.astype(np.uint32)


def unpack(op: L.Operand, regs: np.ndarray, shape, dtype) -> np.ndarray:
    """The matrix a lane-major [32, elements] array of 32-bit values stands for, by the table."""
    out = np.full(shape, np.nan if np.dtype(dtype).kind == "f" else -(2**31), dtype)
    for lane in range(32):
        for i in range(op.elements):
            out[op.position(lane, i)] = regs[lane, i]
    return out


@pytest.mark.parametrize("seed", range(4))
def test_mma_m16n8k16_f16_follows_the_isa(backend, seed):
    rng = np.random.default_rng(seed)
    m, n, k = L.MMA_M16N8K16_SHAPE
    T = L.MMA_M16N8K16_F16
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    c = rng.standard_normal((m, n)).astype(np.float32)
    if seed == 0:  # one-hot: a misplaced element moves or loses the single product
        a[:], b[:] = 0, 0
        a[11, 13], b[13, 6] = 1, 1
    cregs = np.stack([[c[T["C"].position(l, i)] for i in range(4)] for l in range(32)]).astype(np.float32)
    d = backend.zeros((32, 4), np.float32)
    backend.launch(backend.kernel(RAW, "mma_f16_raw"), 1, 32,
                   (backend.upload(pack(T["A"], a)), backend.upload(pack(T["B"], b)), backend.upload(cregs), d))
    got = unpack(T["C"], backend.download(d), (m, n), np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64) + c
    assert_close(got, want, rtol=1e-5, atol=1e-5)  # f16 products exact in f32; sum order differs


@pytest.mark.parametrize("seed", range(4))
def test_mma_m16n8k32_s8_follows_the_isa_exactly(backend, seed):
    rng = np.random.default_rng(100 + seed)
    m, n, k = L.MMA_M16N8K32_SHAPE
    T = L.MMA_M16N8K32_S8
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    c = rng.integers(-2**20, 2**20, (m, n)).astype(np.int32)
    if seed == 0:
        a[:], b[:] = 0, 0
        a[9, 21], b[21, 3] = -7, 5
    cregs = np.stack([[c[T["C"].position(l, i)] for i in range(4)] for l in range(32)]).astype(np.int32)
    d = backend.zeros((32, 4), np.int32)
    backend.launch(backend.kernel(RAW, "mma_s8_raw"), 1, 32,
                   (backend.upload(pack(T["A"], a)), backend.upload(pack(T["B"], b)), backend.upload(cregs), d))
    got = unpack(T["C"], backend.download(d), (m, n), np.int64)
    want = a.astype(np.int64) @ b.astype(np.int64) + c
    assert_same(got, want)  # integer: exact


@pytest.mark.parametrize("seed", range(3))
def test_ldmatrix_x4_follows_the_isa(backend, seed):
    rng = np.random.default_rng(200 + seed)
    src = rng.integers(0, 2**16, (64, 8), dtype=np.uint16)  # 64 candidate rows of 8 b16 (16 bytes each)
    rows = rng.choice(64, 32, replace=False).astype(np.int32)  # lane l points at row rows[l]
    out = backend.zeros((32, 4), np.uint32)
    backend.launch(backend.kernel(RAW, "ldmatrix_raw"), 1, 32, (backend.upload(src), backend.upload(rows), out))
    got = backend.download(out)
    # matrix j row r is the row whose address lane (8j + r) gave, by the ISA's address rule
    providers = {(eval(L.LDMATRIX_X4_ADDRESS["matrix"], {}, {"lane": l}), eval(L.LDMATRIX_X4_ADDRESS["row"], {}, {"lane": l})): l
                 for l in range(32)}
    for j in range(4):
        mat = np.stack([src[rows[providers[(j, r)]]] for r in range(8)])
        lanes = np.stack([[(got[l, j] >> (16 * e)) & 0xFFFF for e in range(2)] for l in range(32)])
        assert_same(unpack(L.LDMATRIX_X4_DEST, lanes, (8, 8), np.int64), mat.astype(np.int64))
