"""Launcher for kernels_cu/kv_cache.cu (this step's K/V rows -> the paged cache), the cache
layout helpers the KV pool uses, and the NumPy reference.

Layouts (per layer, K and V alike, num_blocks * block_size slots):
  f16 / bf16 / f32: [slots, n_kv_heads, head_dim] of float16 / uint16 (bf16 bits) / float32;
  q8_0: uint8 [slots, n_kv_heads, head_dim/32 * 34]: head_dim/32 GGML Q8_0 blocks, quantized by
        model/quants.py's one Q8_0 quantizer (ggml's rounding, which the kernels follow).
"""

from __future__ import annotations

import numpy as np

from sharpinf.errors import SharpinfError
from sharpinf.model import quants
from sharpinf.ops.launch import kernel

I32 = np.int32
KV_DTYPES = ("f16", "bf16", "f32", "q8_0")
_FLOAT_TYPES = {"f16": np.dtype(np.float16), "bf16": np.dtype(np.uint16), "f32": np.dtype(np.float32)}  # bf16: its bits
Q8_BLOCK, Q8_BYTES = quants.BLOCK_ELEMS[quants.Q8_0], quants.BLOCK_BYTES[quants.Q8_0]
BLOCK = 128
_GRID_CAP = 65535


def check_kv(kv_dtype: str, head_dim: int) -> None:
    """A KV dtype the cache stores, and a head_dim it can hold (one clear line otherwise)."""
    if kv_dtype not in KV_DTYPES:
        raise SharpinfError(f"unknown KV dtype {kv_dtype!r}; expected one of {KV_DTYPES}")
    if kv_dtype == "q8_0" and head_dim % Q8_BLOCK:
        raise SharpinfError(f"q8_0 KV needs head_dim divisible by 32, got {head_dim}")


def kv_cache_shape(kv_dtype: str, num_blocks: int, block_size: int, n_kv_heads: int,
                   head_dim: int) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, numpy dtype) of one layer's K (or V) cache."""
    check_kv(kv_dtype, head_dim)
    slots = num_blocks * block_size
    if kv_dtype == "q8_0":
        return (slots, n_kv_heads, head_dim // Q8_BLOCK * Q8_BYTES), np.dtype(np.uint8)
    return (slots, n_kv_heads, head_dim), _FLOAT_TYPES[kv_dtype]


def element_bytes(kv_dtype: str) -> float:
    """Bytes one K (or V) element takes in the cache (q8_0: 34 per 32)."""
    return Q8_BYTES / Q8_BLOCK if kv_dtype == "q8_0" else float(_FLOAT_TYPES[kv_dtype].itemsize)


def stored_bytes(kv_dtype: str, head_dim: int) -> int:
    """Bytes one head's K (or V) row takes in the cache."""
    return head_dim // Q8_BLOCK * Q8_BYTES if kv_dtype == "q8_0" else head_dim * _FLOAT_TYPES[kv_dtype].itemsize


def kv_append(be, kv_dtype: str, qkv, qkv_stride: int, k_col: int, v_col: int, slot_mapping, k_cache, v_cache,
              n_tokens: int, n_kv_heads: int, head_dim: int) -> None:
    """Write token t's K (columns k_col..) and V (columns v_col..) rows of `qkv` into slot slot_mapping[t]
    (negative: skipped) of k_cache / v_cache, converting to the cache's dtype."""
    check_kv(kv_dtype, head_dim)
    if n_tokens <= 0:
        return
    if kv_dtype == "q8_0":
        threads = n_tokens * n_kv_heads * (head_dim // Q8_BLOCK) * 32  # one warp per 32-element block
    else:
        threads = n_tokens * n_kv_heads * head_dim
    grid = max(1, min(-(-threads // BLOCK), _GRID_CAP))
    be.launch(kernel(be, "kv_cache.cu", f"kv_append_{kv_dtype}"), grid, BLOCK,
              (qkv, I32(qkv_stride), I32(k_col), I32(v_col), slot_mapping, k_cache, v_cache, I32(n_tokens),
               I32(n_kv_heads), I32(head_dim)),
              io=(4 * n_tokens * (2 * n_kv_heads * head_dim + 1), 2 * n_tokens * n_kv_heads * stored_bytes(kv_dtype, head_dim)))


# -- NumPy reference ---------------------------------------------------------------------
def float_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), round to nearest even (NaN stays NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


def bf16_bits_to_float(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def encode_kv(kv_dtype: str, x: np.ndarray) -> np.ndarray:
    """float32 rows [..., head_dim] -> the cache's stored form."""
    x = np.asarray(x, dtype=np.float32)
    check_kv(kv_dtype, x.shape[-1])
    if kv_dtype == "f32":
        return x.copy()
    if kv_dtype == "f16":
        return x.astype(np.float16)
    if kv_dtype == "bf16":
        return float_to_bf16_bits(x)
    return quants.quantize(x, quants.Q8_0).reshape(*x.shape[:-1], stored_bytes(kv_dtype, x.shape[-1]))


def decode_kv(kv_dtype: str, stored: np.ndarray) -> np.ndarray:
    """The cache's stored form -> float32 values [..., head_dim] (what the attention kernel reads)."""
    check_kv(kv_dtype, Q8_BLOCK)
    if kv_dtype == "f32":
        return np.asarray(stored, dtype=np.float32)
    if kv_dtype == "f16":
        return np.asarray(stored).astype(np.float32)
    if kv_dtype == "bf16":
        return bf16_bits_to_float(stored)
    stored = np.asarray(stored)
    return quants.dequantize(stored, quants.Q8_0, (*stored.shape[:-1], stored.shape[-1] // Q8_BYTES * Q8_BLOCK))


def kv_append_reference(kv_dtype: str, k_rows: np.ndarray, v_rows: np.ndarray, slot_mapping: np.ndarray,
                        k_cache: np.ndarray, v_cache: np.ndarray) -> None:
    """In place on host caches: k_rows, v_rows float32 [N, n_kv_heads, head_dim]; slot < 0 skipped."""
    slots = np.asarray(slot_mapping)
    keep = slots >= 0
    k_cache[slots[keep]] = encode_kv(kv_dtype, k_rows[keep])
    v_cache[slots[keep]] = encode_kv(kv_dtype, v_rows[keep])
