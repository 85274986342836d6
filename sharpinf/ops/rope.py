"""Launcher for kernels_cu/rope.cu (rotary position embedding, in place) and its NumPy reference.

RoPE (rope_reference below; the Reference's too): pair i of a head is rotated by angle = pos * freqs[i],
cos and sin times mscale -- the model's table (model/rope_scaling.py: base, frequency factors, linear
or YaRN scaling folded in); style "norm" pairs elements (2i, 2i+1), "neox" pairs (i, i + head_dim/2).
The launchers take the table on the device (float64 [head_dim/2]) and mscale as a float. After the
rotation the queries (never the keys) are multiplied by the attention temperature of their position,
1 + temp_scale ln(floor(pos / temp_floor) + 1) (mistral3's: model/config.py attn_temp,
kernels_cu/attn_temp.cuh); temp_scale 0, every other model, is none.
"""

from __future__ import annotations

import numpy as np

from sharpinf.errors import SharpinfError
from sharpinf.model.config import attn_temp
from sharpinf.ops import basic, kv_cache
from sharpinf.ops.launch import kernel

I32, F32 = np.int32, np.float32
STYLES = ("norm", "neox")
BLOCK = 128
_GRID_CAP = 65535


def offset_view(buf, elems: int):
    """A contiguous 1-D view of `buf` starting `elems` elements in: how a launcher passes `buf + elems`
    (works for numpy and cupy arrays alike; `buf` must be C-contiguous)."""
    return buf.reshape(-1)[elems:] if elems else buf


def _check_temp(temp_scale: float, temp_floor: int) -> None:
    if temp_scale and temp_floor <= 0:
        raise SharpinfError(f"the attention temperature {temp_scale:g} needs an original context > 0, got {temp_floor}")


def rope(be, qkv, row_stride: int, positions, n_tokens: int, n_heads: int, head_dim: int, freqs,
         style: str, col: int = 0, mscale: float = 1.0, file: str = "rope.cu", temp_scale: float = 0.0,
         temp_floor: int = 0) -> None:
    """In place: rotate the n_heads heads that start at column `col` of the float32 rows of `qkv`
    (row stride `row_stride` elements), then multiply them by the temperature (pass it for Q only);
    positions: int32 device array [n_tokens]; freqs: the RoPE table, float64 device array [head_dim/2]."""
    _check_temp(temp_scale, temp_floor)
    if style not in STYLES:
        raise SharpinfError(f"unknown rope style {style!r}; expected one of {STYLES}")
    if head_dim % 2:
        raise SharpinfError(f"rope needs an even head_dim, got {head_dim}")
    if n_tokens <= 0 or n_heads <= 0:
        return
    items = n_tokens * (head_dim // 2)
    grid = max(1, min(-(-items // BLOCK), _GRID_CAP))
    be.launch(kernel(be, file, f"rope_{style}"), grid, BLOCK,
              (offset_view(qkv, col), I32(row_stride), positions, I32(n_tokens), I32(n_heads), I32(head_dim),
               freqs, F32(mscale), F32(temp_scale), I32(temp_floor)), io=(4 * n_tokens * (n_heads * head_dim + 1) + 4 * head_dim, 4 * n_tokens * n_heads * head_dim))


def rope_kv(be, kv_dtype: str, qkv, qkv_stride: int, positions, slot_mapping, q_norm, k_norm, k_cache, v_cache,
            n_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int, freqs, eps: float, style: str,
            mscale: float = 1.0, file: str = "rope_kv.cu", temp_scale: float = 0.0, temp_floor: int = 0) -> None:
    """The fused variant (kernels_cu/rope_kv.cu): per token, (qwen3: q_norm/k_norm given) RMSNorm of each
    Q and K head, RoPE of Q and K in place in qkv (Q times the temperature), then K and V into the cache
    at slot_mapping."""
    _check_temp(temp_scale, temp_floor)
    if style not in STYLES:
        raise SharpinfError(f"unknown rope style {style!r}; expected one of {STYLES}")
    if head_dim % 2 or (kv_dtype == "q8_0" and head_dim % 32) or head_dim > 256:
        raise SharpinfError(f"rope_kv: head_dim {head_dim} must be even, at most 256 (a multiple of 32 for a q8_0 cache)")
    if n_tokens <= 0:
        return
    has_norm = q_norm is not None
    kv_dim = n_kv_heads * head_dim
    pairs = (n_heads + n_kv_heads) * head_dim // 2  # a thread per rotation (results do not depend on it)
    block = min(1024, max(128, -(-pairs // 32) * 32))
    be.launch(kernel(be, file, f"rope_kv_{kv_dtype}"), n_tokens, block,
              (qkv, I32(qkv_stride), positions, slot_mapping, q_norm if has_norm else qkv, k_norm if has_norm else qkv,
               k_cache, v_cache, I32(n_tokens), I32(n_heads), I32(n_kv_heads), I32(head_dim), freqs, F32(mscale),
               F32(temp_scale), I32(temp_floor), F32(eps),
               I32(style == "neox"), I32(has_norm)),
              io=(4 * n_tokens * ((n_heads + 2 * n_kv_heads) * head_dim + 2), 4 * n_tokens * (n_heads + n_kv_heads) * head_dim
                  + 2 * n_tokens * kv_dim * (4 if kv_dtype == "f32" else 2)))


def rope_kv_separate(be, kv_dtype: str, qkv, qkv_stride: int, positions, slot_mapping, q_norm, k_norm, k_cache,
                     v_cache, n_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int, freqs, eps: float,
                     style: str, mscale: float = 1.0, file: str = "rope.cu", temp_scale: float = 0.0,
                     temp_floor: int = 0) -> None:
    """rope_kv() by the readable kernels, one launch per part: (qwen3) qk_norm.cu for Q and K,
    rope.cu (`file`) for Q (with the temperature) and K (without), kv_cache.cu's append (the baseline
    the fused kernel must equal)."""
    q_dim, kv_dim = n_heads * head_dim, n_kv_heads * head_dim
    if q_norm is not None:
        basic.qk_norm(be, qkv, q_norm, n_tokens, n_heads, head_dim, qkv_stride, 0, eps)
        basic.qk_norm(be, qkv, k_norm, n_tokens, n_kv_heads, head_dim, qkv_stride, q_dim, eps)
    rope(be, qkv, qkv_stride, positions, n_tokens, n_heads, head_dim, freqs, style, col=0, mscale=mscale, file=file,
         temp_scale=temp_scale, temp_floor=temp_floor)
    rope(be, qkv, qkv_stride, positions, n_tokens, n_kv_heads, head_dim, freqs, style, col=q_dim, mscale=mscale,
         file=file)
    kv_cache.kv_append(be, kv_dtype, qkv, qkv_stride, q_dim, q_dim + kv_dim, slot_mapping, k_cache, v_cache,
                       n_tokens, n_kv_heads, head_dim)


# -- NumPy reference ---------------------------------------------------------------------
def rope_reference(x: np.ndarray, positions: np.ndarray, freqs: np.ndarray, style: str, mscale: float = 1.0,
                   temp_scale: float = 0.0, temp_floor: int = 0) -> np.ndarray:
    """x: [T, heads, head_dim] float32 (the Reference's arithmetic) or float64 (a kernel's exact
    target) -> rotated, in x's type. freqs: the RoPE table (float64 [head_dim/2]). Angles in float64,
    cos and sin rounded to x's type and multiplied by mscale there; pair (a, b) is the complex number
    a + ib and its rotation the product with c + i s. With temp_scale (pass it for Q heads only) the
    rotated values times the temperature of their position, in x's type."""
    if temp_scale:
        _check_temp(temp_scale, temp_floor)
        t = attn_temp(positions, temp_scale, temp_floor).astype(x.dtype)[:, None, None]
        return (rope_reference(x, positions, freqs, style, mscale) * t).astype(x.dtype)
    if style not in STYLES:
        raise SharpinfError(f"unknown rope style {style!r}")
    d = x.shape[-1]
    ang = np.asarray(positions, dtype=np.float64)[:, None] * np.asarray(freqs, dtype=np.float64)[None, : d // 2]
    cplx = np.result_type(x.dtype, np.complex64)  # complex64 for float32, complex128 for float64
    m = x.dtype.type(F32(mscale))
    rot = ((np.cos(ang).astype(x.dtype) * m) + 1j * (np.sin(ang).astype(x.dtype) * m)).astype(cplx)[:, None, :]
    if style == "norm":  # pairs (2i, 2i+1): x viewed as complex *is* the pairs
        return (np.ascontiguousarray(x).view(cplx) * rot).view(x.dtype)
    half = d // 2  # neox: pairs (i, i + d/2), the two halves
    z = (x[..., :half] + 1j * x[..., half:]).astype(cplx) * rot
    return np.concatenate([z.real, z.imag], axis=-1)
