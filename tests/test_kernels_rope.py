"""RoPE (rope.cu) against its NumPy reference, and every registered rope_kv variant (RoPE,
QK-norm and KV append fused) against the baseline's separate kernels, on every backend (emu
everywhere, cuda on a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from sharpinf.ops import kv_cache as kv_ops
from sharpinf.ops import rope as rope_ops
from sharpinf.ops.variants import variant as _registered
from sharpinf.ops.variants import variants_of
from asserts import assert_close, assert_same
from test_kernels_kv_cache import KV_DTYPES, TIES, _poison, _rng


# -- rope -------------------------------------------------------------------------------------
@pytest.mark.parametrize("style", ["norm", "neox"])
@pytest.mark.parametrize("n_tokens,n_heads,head_dim", [(1, 1, 16), (7, 3, 64), (13, 5, 128), (3, 1, 32), (5, 2, 256)])
@pytest.mark.parametrize("freq_scale", [1.0, 0.125], ids=["unscaled", "linear8"])
def test_rope(backend, style, n_tokens, n_heads, head_dim, freq_scale):
    rng = _rng("rope", style, n_tokens, n_heads, head_dim)
    col, pad = 5 * head_dim, 3  # rotate heads that start mid-row; the rest of the row must be untouched
    stride = col + n_heads * head_dim + pad
    x = rng.standard_normal((n_tokens, stride)).astype(np.float32)
    pos = rng.integers(0, 8001, n_tokens).astype(np.int32)
    pos[0] = 8000
    theta = 10000.0 if head_dim != 128 else 1e6
    dx = backend.upload(x)
    rope_ops.rope(backend, dx, stride, backend.upload(pos), n_tokens, n_heads, head_dim, theta, style, col=col,
                  freq_scale=freq_scale)
    got = backend.download(dx)
    assert_same(got[:, :col], x[:, :col])
    assert_same(got[:, col + n_heads * head_dim:], x[:, col + n_heads * head_dim:])
    want = rope_ops.rope_reference(x[:, col:col + n_heads * head_dim].reshape(n_tokens, n_heads, head_dim),
                                   pos, theta, style, freq_scale)
    # angles are formed and reduced in double: the error is a few float ulps of |x| at every position
    # (measured <= 3e-7 * max|x| on the emulator); a float angle would be off by ~pos * 2e-7 rad (1.6e-3 at 8000)
    err = np.abs(got[:, col:col + n_heads * head_dim].reshape(want.shape) - want)
    assert err.max() <= 6e-7 * np.abs(x).max(), err.max()


def test_rope_position_zero_is_identity(backend):
    x = _rng("rope0").standard_normal((2, 3 * 64)).astype(np.float32)
    dx = backend.upload(x)
    rope_ops.rope(backend, dx, 3 * 64, backend.upload(np.zeros(2, np.int32)), 2, 3, 64, 10000.0, "neox")
    assert_same(backend.download(dx), x)


# -- the rope_kv variants (the fused rope + qk-norm + KV append, and any registered since) ----------
ROPE_VARIANTS = [v for v in variants_of("rope_kv")[1:]]  # each against the baseline's three kernels


@pytest.mark.parametrize("variant", ROPE_VARIANTS)
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("head_dim,nh,nkv", [(32, 4, 2), (64, 4, 2), (128, 4, 2), (256, 4, 2), (128, 32, 8)])
def test_rope_kv_equals_the_separate_kernels(backend, kv_dtype, norm, head_dim, nh, nkv, variant):
    """rope_kv.cu (and every other registered rope_kv variant) against qk_norm.cu + rope.cu +
    kv_cache.cu: the same rotation bits; with the norm (a warp per head instead of a block) within
    float rounding. 32 + 8 heads of 128: more rotations than a block's 1024 threads."""
    rng = _rng("ropekv", kv_dtype, norm, head_dim, nh)
    n, bs, theta, eps = 9, 4, 10000.0, 1e-6
    q_dim, kv_dim = nh * head_dim, nkv * head_dim
    stride = q_dim + 2 * kv_dim
    qkv = rng.standard_normal((n, stride)).astype(np.float32)
    qkv[0, q_dim + kv_dim:q_dim + kv_dim + 32] = TIES  # V is stored as it is: q8_0's ties reach the cache
    pos = rng.integers(0, 3000, n).astype(np.int32)
    slots = rng.permutation(8 * bs)[:n].astype(np.int32)
    slots[4] = -1
    wq, wk = (1 + 0.1 * rng.standard_normal((2, head_dim))).astype(np.float32)
    shape, dt = kv_ops.kv_cache_shape(kv_dtype, 8, bs, nkv, head_dim)
    outs = {}
    for fused in (False, True):
        d, dpos, dslots = backend.upload(qkv), backend.upload(pos), backend.upload(slots)
        kc, vc = backend.upload(_poison(shape, dt)), backend.upload(_poison(shape, dt))
        qn, kn = (backend.upload(wq), backend.upload(wk)) if norm else (None, None)
        fn = _registered("rope_kv", variant if fused else variants_of("rope_kv")[0]).launch
        fn(backend, kv_dtype, d, stride, dpos, dslots, qn, kn, kc, vc, n, nh, nkv, head_dim, theta, eps, "neox",
           freq_scale=0.125 if head_dim == 256 else 1.0)  # linear scaling on a gemma-wide head
        outs[fused] = [backend.download(a) for a in (d, kc, vc)]
    (q0, k0, v0), (q1, k1, v1) = outs[False], outs[True]
    if not norm or head_dim <= 64:  # one warp per head either way: the same sums
        assert_same(q1[:, :q_dim + kv_dim], q0[:, :q_dim + kv_dim])
        assert_same(k1.view(np.uint8), k0.view(np.uint8))
    else:
        assert_close(q1[:, :q_dim + kv_dim], q0[:, :q_dim + kv_dim], rtol=0, atol=2e-6 * np.abs(q0).max())
        assert_close(kv_ops.decode_kv(kv_dtype, k1)[slots[slots >= 0]],
                                   kv_ops.decode_kv(kv_dtype, k0)[slots[slots >= 0]], rtol=0,
                                   atol=0.02 * np.abs(q0).max())
    assert_same(v1.view(np.uint8), v0.view(np.uint8))
    want_v = kv_ops.encode_kv(kv_dtype, qkv[:, q_dim + kv_dim:].reshape(n, nkv, head_dim))
    assert_same(v1[slots[slots >= 0]].view(np.uint8), want_v[slots >= 0].view(np.uint8))
