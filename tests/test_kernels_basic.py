"""The first kernel families against NumPy, on every backend (emu everywhere, cuda on a GPU).

Shapes include odd sizes so partial warps, partial blocks and grid-stride tails all run.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from sharpinf.ops import basic
from asserts import assert_close, assert_same

SIZES = [1, 31, 33, 257, 1000, 4097]
BLOCK = 256


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))  # stable across runs, unlike hash()


def _grid_1d(n: int, block: int = BLOCK, cap: int = 4) -> int:
    # capped so the grid-stride loop runs several rounds on the larger sizes
    return max(1, min(-(-n // block), cap))


# -- elementwise --------------------------------------------------------------------------
def _silu_gate(g, u):
    with np.errstate(over="ignore"):  # exp(-g) -> inf for very negative g: the result is -0
        return basic.act_reference("silu", g.astype(np.float64)) * u.astype(np.float64)


def _gelu_gate(g, u):
    return basic.act_reference("gelu_tanh", g.astype(np.float64)) * u.astype(np.float64)


OPS = {"add": np.add, "silu_gate": _silu_gate, "gelu_gate": _gelu_gate}


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", list(OPS))
def test_elementwise_f32(backend, op, n):
    rng = _rng(op, n)
    a = (rng.standard_normal(n) * 4).astype(np.float32)
    b = (rng.standard_normal(n) * 4).astype(np.float32)
    da, db, out = backend.upload(a), backend.upload(b), backend.empty((n,), np.float32)
    k = backend.kernel("elementwise.cu", f"{op}_f32")
    backend.launch(k, _grid_1d(n), BLOCK, (da, db, out, np.int32(n)))
    got = backend.download(out)
    want = OPS[op](a, b)
    if op == "silu_gate":
        assert_close(got, want, rtol=2e-6, atol=1e-6 * np.abs(want).max())
    elif op == "gelu_gate":  # float32 1 + tanh(z) cancels for z < 0: a few 1e-5 relative where gelu is tiny
        assert_close(got, want, rtol=5e-5, atol=1e-6 * np.abs(want).max())
    else:
        assert_same(got, want.astype(np.float32))  # one IEEE rounding either way


def test_silu_gate_extremes(backend):
    g = np.array([-1e4, -100.0, -88.0, 0.0, 88.0, 100.0, 1e4], np.float32)
    u = np.ones_like(g)
    out = backend.empty(g.shape, np.float32)
    backend.launch(backend.kernel("elementwise.cu", "silu_gate_f32"), 1, 32,
                   (backend.upload(g), backend.upload(u), out, np.int32(g.size)))
    got = backend.download(out)
    assert np.all(np.isfinite(got))
    assert_close(got, _silu_gate(g, u), rtol=1e-6, atol=1e-30)


def test_gelu_gate_extremes_and_the_reference(backend):
    """GeGLU at the tails (gelu(-1e4) = -0, gelu(1e4) = 1e4: tanh saturates, nothing overflows) and
    against the Reference's float32 gelu_tanh."""
    g = np.array([-1e4, -100.0, -10.0, -3.0, -0.5, 0.0, 0.5, 3.0, 10.0, 100.0, 1e4], np.float32)
    u = np.linspace(0.5, 2.0, g.size).astype(np.float32)
    out = backend.empty(g.shape, np.float32)
    backend.launch(backend.kernel("elementwise.cu", "gelu_gate_f32"), 1, 32,
                   (backend.upload(g), backend.upload(u), out, np.int32(g.size)))
    got = backend.download(out)
    assert np.all(np.isfinite(got))
    assert_close(got, _gelu_gate(g, u), rtol=5e-5, atol=1e-6)
    assert_close(got, basic.act_reference("gelu_tanh", g) * u, rtol=5e-5, atol=1e-6)


def test_softcap(backend):
    """x = cap * tanh(x / cap) in place: small logits almost unchanged, large ones bounded by cap."""
    x = np.array([-1e4, -45.0, -3.0, 0.0, 0.25, 3.0, 29.0, 45.0, 1e4], np.float32)
    d = backend.upload(x)
    basic.softcap(backend, d, x.size, 30.0)
    got = backend.download(d)
    assert_close(got, 30.0 * np.tanh(x.astype(np.float64) / 30.0), rtol=2e-6, atol=1e-6)
    assert np.abs(got).max() <= 30.0


@pytest.mark.parametrize("n", [1, 100, 640, 1031])
def test_rmsnorm_add(backend, n):
    """Gemma 3's post-norm: x += rmsnorm(y) * w, as rmsnorm_f32 then add_f32 within an ulp (the add
    may fuse with the last product into one FMA), y untouched."""
    rng = _rng("rmsnorm_add", n)
    rows = 3
    x, y = (rng.standard_normal((2, rows, n)) * 3).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    dx, dy, dw = backend.upload(x), backend.upload(y), backend.upload(w)
    basic.rmsnorm_add(backend, dy, dw, dx, rows, n, 1e-6)
    normed = backend.empty((rows, n), np.float32)
    basic.rmsnorm(backend, dy, dw, normed, rows, n, 1e-6)
    want = backend.empty((rows, n), np.float32)
    basic.add(backend, backend.upload(x), normed, want, rows * n)
    assert_close(backend.download(dx), backend.download(want), rtol=0,
                               atol=2.5e-7 * np.abs(backend.download(want)).max())
    assert_same(backend.download(dy), y)
    assert_close(backend.download(dx), x + basic.rmsnorm_reference(y.astype(np.float64), w, 1e-6), rtol=1e-5, atol=1e-5)


# -- rmsnorm ----------------------------------------------------------------------------
def _rmsnorm(x, w, eps):
    return basic.rmsnorm_reference(x.astype(np.float64), w, eps)


@pytest.mark.parametrize("block", [32, 96, 256])
@pytest.mark.parametrize("n", SIZES)
def test_rmsnorm_f32(backend, n, block):
    rows, eps = 3, 1e-6
    rng = _rng("rms", n, block)
    scale = 10.0 ** rng.uniform(-3, 3)
    x = (rng.standard_normal((rows, n)) * scale).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    y = backend.empty((rows, n), np.float32)
    backend.launch(backend.kernel("rmsnorm.cu", "rmsnorm_f32"), rows, block,
                   (backend.upload(x), backend.upload(w), y, np.int32(n), np.float32(eps)))
    want = _rmsnorm(x, w, eps)
    # the output is O(|w|): scale the absolute tolerance by the row's magnitude
    assert_close(backend.download(y), want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_rmsnorm_zero_row_is_finite(backend):
    n = 33
    x, w = np.zeros((1, n), np.float32), np.ones(n, np.float32)
    y = backend.empty((1, n), np.float32)
    backend.launch(backend.kernel("rmsnorm.cu", "rmsnorm_f32"), 1, 64,
                   (backend.upload(x), backend.upload(w), y, np.int32(n), np.float32(1e-5)))
    assert_same(backend.download(y), 0.0)


# -- gather -------------------------------------------------------------------------------
@pytest.mark.parametrize("n_cols", [1, 33, 4097])  # 4097 at 256 threads: a second batch of 16, its tail
def test_gather_rows(backend, n_cols):
    """out[r] = x[rows[r]] exactly: rows repeated and out of order, NaN copied as it is."""
    rng = _rng("gather", n_cols)
    x = rng.standard_normal((5, n_cols)).astype(np.float32)
    x[3, -1] = np.nan
    rows = np.array([3, 0, 3, 4], np.int32)
    out = backend.full((len(rows), n_cols), -1.0, np.float32)
    basic.gather_rows(backend, backend.upload(x), backend.upload(rows), out, len(rows), n_cols)
    got = backend.download(out)
    assert got.tobytes() == x[rows].tobytes(), np.argwhere(got.view(np.int32) != x[rows].view(np.int32))[:5]
