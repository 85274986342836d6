"""q8_1 activations (kernels_cu/rmsnorm_q8_1.cu) against their NumPy twin, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from sharpinf.ops import basic
from sharpinf.ops.quant_act import (Q8Act, dequantize_q8_1, quantize_q8_1, quantize_q8_1_reference, rmsnorm_q8_1,
                                    round_q8_1)
from asserts import assert_bits, assert_same


def _rows(rng, rows, n):
    x = (rng.standard_normal((rows, n)) * rng.choice([1e-3, 1.0, 40.0], size=(rows, 1))).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block: scale 0, q 0
    x[-1, 32:64] = np.float32(0.5) * np.arange(32, dtype=np.float32) / 31 * 127  # halves: round away from zero
    return x


@pytest.mark.parametrize("rows,n", [(3, 64), (5, 576), (2, 1536), (2, 2080), (1, 12288)])  # 2080, 12288: several blocks a row
def test_quantize_matches_the_reference_exactly(backend, rows, n):
    rng = np.random.default_rng(n)
    x = _rows(rng, rows, n)
    out = Q8Act.empty(backend, rows, n)
    quantize_q8_1(backend, backend.upload(x), out, rows, n)
    q, d, s = quantize_q8_1_reference(x)
    assert_same(backend.download(out.q), q)
    assert_bits(backend.download(out.d), d)
    assert_same(backend.download(out.s), s)
    assert np.abs(dequantize_q8_1(q, d) - x).max() <= np.abs(x).max() / 127 / 2 * 1.0001 + 1e-12


@pytest.mark.parametrize("n", [64, 192, 576, 1536, 2080, 4096])  # 192: 128 summing threads, some with 2 values; > 2048: a 1024-thread block
def test_fused_norm_equals_norm_then_quantize(backend, n):
    """The fused kernel normalises exactly as rmsnorm_f32 does, then quantizes."""
    rng = np.random.default_rng(7)
    rows = 4
    x = _rows(rng, rows, n)
    w = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    xd, wd = backend.upload(x), backend.upload(w)
    fused = Q8Act.empty(backend, rows, n)
    rmsnorm_q8_1(backend, xd, wd, fused, rows, n, 1e-5)
    h = backend.empty((rows, n), np.float32)
    basic.rmsnorm(backend, xd, wd, h, rows, n, 1e-5)
    q, d, s = quantize_q8_1_reference(backend.download(h))
    assert_same(backend.download(fused.q), q)
    assert_same(backend.download(fused.d), d)
    assert_same(backend.download(fused.s), s)


# -- exact ties: q8_1 rounds half away from zero -------------------------------------------------
# A block whose amax is 127 * d for a power-of-two d: d = amax / 127 and 1 / d are exact, so every
# value (k + 0.5) * d lands exactly on k + 0.5 after scaling (the kernel's v * (1/d) and the
# reference's alike). Half away from zero gives k + 1 (and -(k + 1) for -(k + 0.5)); round-half-even
# (rintf, __float2int_rn) gives k for even k, truncation k, floor(x + 0.5) -k for -(k + 0.5).
TIE_UNITS = [127, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.5, -3.5, 4.5, -4.5, 7.5, -7.5, 8.5, -8.5, 10.5, -10.5,
             63.5, -63.5, 64.5, -64.5, 100.5, -100.5, 125.5, -125.5, 126.5, -126.5, 126, -126, 0, 5, -127]
TIE_Q = [127, 1, -1, 2, -2, 3, -3, 4, -4, 5, -5, 8, -8, 9, -9, 11, -11,
         64, -64, 65, -65, 101, -101, 126, -126, 127, -127, 126, -126, 0, 5, -127]  # by hand
# a block that brings row 0's sum of squares to exactly 64 (mean 1, so rmsnorm with eps 0 scales by 1)
FILLER = [100 / 128] * 30 + [53 / 128, 295 / 128]


def _tie_rows() -> tuple[np.ndarray, list[tuple[int, int, float, list[int]]]]:
    """Two rows of two blocks: row 0 = ties at d = 2^-6, then the filler; row 1 = the filler, then the
    ties reversed at d = 2^4. Returns x and (row, block, d, expected q) of each tie block."""
    ties = np.array(TIE_UNITS)
    x = np.stack([np.concatenate([ties / 64, FILLER]), np.concatenate([FILLER, ties[::-1] * 16])]).astype(np.float32)
    assert np.sum(x[0].astype(np.float64) ** 2) == 64.0  # the construction is exact
    return x, [(0, 0, 2.0**-6, TIE_Q), (1, 1, 2.0**4, TIE_Q[::-1])]


def _assert_ties(q, d, s, where: str) -> None:
    for row, blk, scale, want in _tie_rows()[1]:
        got = np.asarray(q)[row, 32 * blk : 32 * blk + 32].astype(int).tolist()
        bad = [(u, g, w) for u, g, w in zip(TIE_UNITS if row == 0 else TIE_UNITS[::-1], got, want) if g != w]
        assert not bad, f"{where}: row {row}: (value/d, q, want) {bad[:6]}: ties must round half away from zero"
        assert float(np.asarray(d)[row, blk]) == scale, f"{where}: row {row} scale {np.asarray(d)[row, blk]} != {scale}"
        assert int(np.asarray(s)[row, blk]) == 5, f"{where}: row {row} sum {np.asarray(s)[row, blk]} != 5"


def test_reference_rounds_exact_ties_half_away_from_zero():
    x, _ = _tie_rows()
    q, d, s = quantize_q8_1_reference(x)
    _assert_ties(q, d, s, "quantize_q8_1_reference")
    back = round_q8_1(x)  # what Reference(act_quant="q8_1") feeds the matmuls
    assert_same(back[0, :32], np.array(TIE_Q, np.float32) / 64)


def test_kernels_round_exact_ties_half_away_from_zero(backend):
    """quantize_q8_1 and the fused rmsnorm_q8_1 (eps 0: row 0's scale is exactly 1) on exact ties,
    against the hand-computed ints, and every block against the reference bit for bit."""
    x, _ = _tie_rows()
    rows, n = x.shape
    xd = backend.upload(x)
    out = Q8Act.empty(backend, rows, n)
    quantize_q8_1(backend, xd, out, rows, n)
    q, d, s = (backend.download(a) for a in (out.q, out.d, out.s))
    _assert_ties(q, d, s, "quantize_q8_1")
    rq, rd, rs = quantize_q8_1_reference(x)
    assert_same(q, rq)
    assert_bits(d, rd)
    assert_same(s, rs)
    fused = Q8Act.empty(backend, 1, n)
    rmsnorm_q8_1(backend, xd, backend.upload(np.ones(n, np.float32)), fused, 1, n, 0.0)
    fq, fd, fs = (backend.download(a) for a in (fused.q, fused.d, fused.s))
    assert_same(fq[0, :32], np.array(TIE_Q, np.int8), "rmsnorm_q8_1: ties must round half away from zero")
    assert float(fd[0, 0]) == 2.0**-6 and int(fs[0, 0]) == 5, (fd[0, 0], fs[0, 0])
    assert_same(fq, rq[:1])
