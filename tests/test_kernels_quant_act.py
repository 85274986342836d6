"""q8_1 activations (kernels_cu/rmsnorm_q8_1.cu) against their NumPy twin, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from sharpinf.ops import basic
from sharpinf.ops.quant_act import Q8Act, dequantize_q8_1, quantize_q8_1, quantize_q8_1_reference, rmsnorm_q8_1


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
    np.testing.assert_array_equal(backend.download(out.q), q)
    np.testing.assert_array_equal(backend.download(out.d).view(np.uint32), d.view(np.uint32))
    np.testing.assert_array_equal(backend.download(out.s), s)
    assert np.abs(dequantize_q8_1(q, d) - x).max() <= np.abs(x).max() / 127 / 2 * 1.0001 + 1e-12


@pytest.mark.parametrize("n", [64, 576, 1536, 2080, 4096])  # > 2048: a 1024-thread block
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
    np.testing.assert_array_equal(backend.download(fused.q), q)
    np.testing.assert_array_equal(backend.download(fused.d), d)
    np.testing.assert_array_equal(backend.download(fused.s), s)
