"""Activations in q8_1 (kernels_cu/rmsnorm_q8_1.cu), the input format of the dp4a matmul, and
the NumPy twin of the rounding (the reference applies it where the fast path does).

A [rows, n] activation is three arrays: q int8 [rows, n], d float32 [rows, n/32] (amax/127 of
each 32-value block) and s int32 [rows, n/32] (the block's sum of q). value = d * q.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sharpinf.model.quants import q8_blocks
from sharpinf.ops.launch import kernel

I32, F32 = np.int32, np.float32
QBLOCK = 32


@dataclass
class Q8Act:
    """Device q8_1 activation buffers for up to `rows` rows of `n` values."""

    q: Any
    d: Any
    s: Any
    n: int

    def parts(self) -> tuple[Any, Any, Any]:
        """(q, d, s): the three kernel arguments, in the kernels' order."""
        return self.q, self.d, self.s

    @classmethod
    def empty(cls, be, rows: int, n: int) -> "Q8Act":
        if n % QBLOCK:
            raise ValueError(f"q8_1 activations need rows of a multiple of 32 values, got {n}")
        return cls(be.empty((rows, n), np.int8), be.empty((rows, n // QBLOCK), F32),
                   be.empty((rows, n // QBLOCK), I32), n)


def _block(n: int) -> int:
    # the kernel sums squares over basic.rmsnorm's 128/256 threads whatever the block (bits equal
    # rmsnorm_f32's); a long row gets more threads to quantize its 32-value blocks
    return 128 if n <= 256 else 256 if n <= 2048 else 1024


RQ_CHUNK = 64  # 32-value blocks per quantize_q8_1 block (kernels_cu/rmsnorm_q8_1.cu)


def rmsnorm_q8_1(be, x, w, out: Q8Act, rows: int, n: int, eps: float) -> None:
    """out = q8_1(rmsnorm(x) * w) for `rows` rows."""
    be.launch(kernel(be, "rmsnorm_q8_1.cu", "rmsnorm_q8_1"), rows, _block(n),
              (x, w, out.q, out.d, out.s, I32(n), F32(eps)), io=(4 * (rows * n + n), rows * n * 3 // 2))


def quantize_q8_1(be, x, out: Q8Act, rows: int, n: int) -> None:
    """out = q8_1(x) for `rows` rows."""
    be.launch(kernel(be, "rmsnorm_q8_1.cu", "quantize_q8_1"), (rows, -(-n // (32 * RQ_CHUNK))), 512,
              (x, out.q, out.d, out.s, I32(n)),
              io=(4 * rows * n, rows * n * 3 // 2))


# -- NumPy reference ------------------------------------------------------------------------------
def quantize_q8_1_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 [..., n] -> (q int8 [..., n], d float32 [..., n/32], s int32 [..., n/32]), the kernel's rule."""
    x = np.asarray(x, dtype=F32)
    n = x.shape[-1]
    if n % QBLOCK:
        raise ValueError(f"q8_1 needs a multiple of 32 values, got {n}")
    d, q = q8_blocks(x.reshape(*x.shape[:-1], n // QBLOCK, QBLOCK))  # d kept in float32 (not fp16 as Q8_0)
    return q.reshape(x.shape), d[..., 0], q.astype(I32).sum(axis=-1).astype(I32)


def dequantize_q8_1(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The values a q8_1 activation stands for (float64: d * q exactly)."""
    q = np.asarray(q)
    blocks = q.reshape(*q.shape[:-1], -1, QBLOCK).astype(np.float64)
    return (blocks * np.asarray(d, np.float64)[..., None]).reshape(q.shape)


def round_q8_1(x: np.ndarray) -> np.ndarray:
    """x as the dp4a path sees it: quantized to q8_1 and back (float32)."""
    q, d, _ = quantize_q8_1_reference(x)
    return dequantize_q8_1(q, d).astype(F32)
