"""KV-cache append (kv_cache.cu) against its NumPy reference, on every backend (emu everywhere,
cuda on a GPU): this step's K/V rows into a NaN-poisoned paged pool through slot_mapping, bit for
bit for every KV dtype. Also the cache's dtypes and poisoned pools that the RoPE and attention
tests share."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from sharpinf.ops import kv_cache as kv_ops
from asserts import assert_same

KV_DTYPES = kv_ops.KV_DTYPES
# a q8_0 block whose scale is exactly 1 (amax 127): every other value is a tie, x.5, which ggml's
# roundf (and so the KV kernels and model/quants.py's one Q8_0 quantizer) takes away from zero
TIES = np.concatenate([[127.0], np.arange(-15, 16) + 0.5]).astype(np.float32)
TIES_Q = (np.sign(TIES) * np.floor(np.abs(TIES) + 0.5)).astype(np.int8)


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _poison(shape, dtype) -> np.ndarray:
    """All bytes 0xFF: NaN for f32/f16/bf16, and a NaN fp16 scale for q8_0 blocks."""
    dtype = np.dtype(dtype)
    return np.full(int(np.prod(shape)) * dtype.itemsize, 0xFF, np.uint8).view(dtype).reshape(shape)


# -- kv_append ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("n_kv_heads,head_dim", [(1, 32), (3, 64), (2, 128)])
def test_kv_append(backend, kv_dtype, n_kv_heads, head_dim):
    rng = _rng("kv", kv_dtype, n_kv_heads, head_dim)
    n_tokens, num_blocks, block_size, q_dim = 11, 6, 4, 2 * n_kv_heads * head_dim
    kv_dim = n_kv_heads * head_dim
    stride = q_dim + 2 * kv_dim + 1
    qkv = (rng.standard_normal((n_tokens, stride)) * rng.uniform(0.01, 100, (n_tokens, 1))).astype(np.float32)
    qkv[3, q_dim:q_dim + 32] = 0.0  # an all-zero q8_0 block: d = 0
    qkv[4, q_dim + 1] = 127.5 / 127 * np.abs(qkv[4, q_dim:q_dim + 32]).max()  # a block whose amax quantizes to exactly 127
    qkv[6, q_dim:q_dim + 32] = TIES
    slots = rng.permutation(num_blocks * block_size)[:n_tokens].astype(np.int32)
    slots[5] = -1  # padding: writes nothing
    shape, dt = kv_ops.kv_cache_shape(kv_dtype, num_blocks, block_size, n_kv_heads, head_dim)
    k0, v0 = _poison(shape, dt), _poison(shape, dt)
    kc, vc = backend.upload(k0), backend.upload(v0)
    kv_ops.kv_append(backend, kv_dtype, backend.upload(qkv), stride, q_dim, q_dim + kv_dim, backend.upload(slots),
                     kc, vc, n_tokens, n_kv_heads, head_dim)
    wk, wv = k0.copy(), v0.copy()
    kv_ops.kv_append_reference(kv_dtype, qkv[:, q_dim:q_dim + kv_dim].reshape(n_tokens, n_kv_heads, head_dim),
                               qkv[:, q_dim + kv_dim:q_dim + 2 * kv_dim].reshape(n_tokens, n_kv_heads, head_dim),
                               slots, wk, wv)
    # bit-exact: one IEEE rounding (f16/bf16), and the q8_0 quantizer's exact float32 steps
    assert_same(backend.download(kc).view(np.uint8), wk.view(np.uint8))
    assert_same(backend.download(vc).view(np.uint8), wv.view(np.uint8))
    if kv_dtype == "q8_0":  # the ties, by name: d = 1, q = TIES rounded away from zero
        tie = backend.download(kc)[slots[6], 0, :34]
        assert tie[:2].view(np.float16)[0] == 1.0 and list(tie[2:].view(np.int8)) == list(TIES_Q)

