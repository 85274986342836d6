"""Launchers for the small kernel families: elementwise, rmsnorm, qk_norm, gather.

Each launcher takes device arrays from the backend and plain ints/floats; it casts
scalars to the C types the kernels declare, and states the launch's compulsory traffic
(io = bytes read, bytes written: each input once, each output once) for the host bench's
roofline table. The NumPy references live beside them.
"""

from __future__ import annotations

import numpy as np

from sharpinf.model.gpt_oss_fields import SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT
from sharpinf.ops.launch import kernel

I32, F32 = np.int32, np.float32


def _grid_1d(n: int, block: int = 256, cap: int = 1024) -> int:
    return max(1, min(-(-n // block), cap))


def add(be, a, b, out, n: int) -> None:
    """out = a + b (float32, n elements); out may alias a."""
    be.launch(kernel(be, "elementwise.cu", "add_f32"), _grid_1d(n), 256, (a, b, out, I32(n)), io=(8 * n, 4 * n))


def act_gate(be, gate, up, out, n: int, act: str) -> None:
    """out = act(gate) * up: "silu" (SwiGLU) or "gelu_tanh" (GeGLU, gemma3)."""
    name = {"silu": "silu_gate_f32", "gelu_tanh": "gelu_gate_f32"}[act]
    be.launch(kernel(be, "elementwise.cu", name), _grid_1d(n), 256, (gate, up, out, I32(n)), io=(8 * n, 4 * n))


def softcap(be, x, n: int, cap: float) -> None:
    """In place: x = cap * tanh(x / cap) (final-logit softcapping)."""
    be.launch(kernel(be, "elementwise.cu", "softcap_f32"), _grid_1d(n), 256, (x, I32(n), F32(cap)), io=(4 * n, 4 * n))


def rmsnorm(be, x, w, y, rows: int, n: int, eps: float) -> None:
    """y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for `rows` rows of length n (QK-norm: rows = tokens x heads)."""
    be.launch(kernel(be, "rmsnorm.cu", "rmsnorm_f32"), rows, 128 if n <= 256 else 256, (x, w, y, I32(n), F32(eps)),
              io=(4 * (rows * n + n), 4 * rows * n))


def rmsnorm_add(be, y, w, x, rows: int, n: int, eps: float) -> None:
    """x[r] += rmsnorm(y[r]) * w: a sublayer's output through its post-norm into the residual (gemma3)."""
    be.launch(kernel(be, "rmsnorm.cu", "rmsnorm_add_f32"), rows, 128 if n <= 256 else 256, (y, w, x, I32(n), F32(eps)),
              io=(4 * (2 * rows * n + n), 4 * rows * n))


def qk_norm(be, qkv, w, n_tokens: int, n_heads: int, head_dim: int, row_stride: int, col: int, eps: float) -> None:
    """In place: RMSNorm of each head (head_dim floats) of the heads starting at column `col` of qkv."""
    be.launch(kernel(be, "qk_norm.cu", "qk_norm_f32"), n_tokens * n_heads, 32 if head_dim <= 64 else 128,
              (qkv, w, I32(n_tokens), I32(n_heads), I32(head_dim), I32(row_stride), I32(col), F32(eps)),
              io=(4 * (n_tokens * n_heads * head_dim + head_dim), 4 * n_tokens * n_heads * head_dim))


def gather_rows(be, x, rows, out, n_rows: int, n_cols: int) -> None:
    be.launch(kernel(be, "gather.cu", "gather_rows_f32"), n_rows, 256, (x, rows, out, I32(n_rows), I32(n_cols)),
              io=(4 * n_rows * (n_cols + 1), 4 * n_rows * n_cols))


# -- NumPy references ---------------------------------------------------------------------
# Each computes in its input's float type: float32 is the Reference's arithmetic (oracles/reference.py
# calls these), float64 the exact value a kernel is held to.
def act_reference(act: str, x: np.ndarray) -> np.ndarray:
    """act_gate's activation: "silu" x / (1 + e^-x), "gelu_tanh" ggml_gelu's tanh form."""
    t = x.dtype.type
    if act == "silu":
        return x / (t(1) + np.exp(-x))
    if act == "gelu_tanh":
        inner = t(np.sqrt(2.0 / np.pi)) * x * (t(1) + t(0.044715) * x * x)
        return t(0.5) * x * (t(1) + np.tanh(inner))
    raise ValueError(f"unknown activation {act!r}")


def glu_reference(act: str, g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The gated activation of gate rows g and up rows u: act(g) * u, or "swiglu_oai" (gpt-oss, llama.cpp's
    ggml_swiglu_oai): x = min(g, limit), y = clamp(u, -limit, limit), x / (1 + e^(alpha * -x)) * (y + 1)."""
    if act != "swiglu_oai":
        return act_reference(act, g) * u
    t = g.dtype.type
    x, y = np.minimum(g, t(SWIGLU_OAI_LIMIT)), np.clip(u, t(-SWIGLU_OAI_LIMIT), t(SWIGLU_OAI_LIMIT))
    return x / (t(1) + np.exp(t(SWIGLU_OAI_ALPHA) * -x)) * (y + t(1))


def rmsnorm_reference(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w over the last axis."""
    t = x.dtype.type
    ms = np.square(x).sum(axis=-1, keepdims=True) / t(x.shape[-1])
    return x / np.sqrt(ms + t(eps)) * w.astype(x.dtype, copy=False)

