"""RoPE (rope.cu) against its NumPy reference, and every registered rope_kv variant (RoPE,
QK-norm and KV append fused) against the baseline's separate kernels, on every backend (emu
everywhere, cuda on a GPU); the queries' attention temperature (mistral3, attn_temp.cuh) after
every rotation: the reference's factor bit for bit, on Q and never on K."""

from __future__ import annotations

import numpy as np
import pytest

from sharpinf.model.config import attn_temp
from sharpinf.model.rope_scaling import RopeScaling, RopeTable, rope_freqs, yarn_attn_factor
from sharpinf.ops import kv_cache as kv_ops
from sharpinf.ops import rope as rope_ops
from sharpinf.ops.variants import variant as _registered
from sharpinf.ops.variants import variants_of
from asserts import assert_close, assert_same
from test_kernels_kv_cache import KV_DTYPES, TIES, _poison, _rng


# -- rope -------------------------------------------------------------------------------------
def _table(scaling: str, theta: float, head_dim: int) -> RopeTable:
    """unscaled; linear (factor 8); YaRN (factor 4 over an original context of 256, so the ramp
    falls inside the head) with Llama 3.1-style frequency factors in [1, 8] and its cos/sin factor."""
    if scaling == "yarn4+factors":
        y = RopeScaling("yarn", 0.25, ext_factor=1.0, attn_factor=yarn_attn_factor(0.25), n_ctx_orig=256)
        factors = 1 + 7 * _rng("factors", head_dim).random(head_dim // 2)
        return RopeTable(rope_freqs(theta, head_dim, y, factors), y.mscale)
    return RopeTable.plain(theta, head_dim, {"unscaled": 1.0, "linear8": 0.125}[scaling])


@pytest.mark.parametrize("style", ["norm", "neox"])
@pytest.mark.parametrize("n_tokens,n_heads,head_dim", [(1, 1, 16), (7, 3, 64), (13, 5, 128), (3, 1, 32), (5, 2, 256)])
@pytest.mark.parametrize("scaling", ["unscaled", "linear8", "yarn4+factors"])
def test_rope(backend, style, n_tokens, n_heads, head_dim, scaling):
    rng = _rng("rope", style, n_tokens, n_heads, head_dim)
    col, pad = 5 * head_dim, 3  # rotate heads that start mid-row; the rest of the row must be untouched
    stride = col + n_heads * head_dim + pad
    x = rng.standard_normal((n_tokens, stride)).astype(np.float32)
    pos = rng.integers(0, 8001, n_tokens).astype(np.int32)
    pos[0] = 8000
    table = _table(scaling, 10000.0 if head_dim != 128 else 1e6, head_dim)
    dx = backend.upload(x)
    rope_ops.rope(backend, dx, stride, backend.upload(pos), n_tokens, n_heads, head_dim, backend.upload(table.freqs),
                  style, col=col, mscale=table.mscale)
    got = backend.download(dx)
    assert_same(got[:, :col], x[:, :col])
    assert_same(got[:, col + n_heads * head_dim:], x[:, col + n_heads * head_dim:])
    want = rope_ops.rope_reference(x[:, col:col + n_heads * head_dim].reshape(n_tokens, n_heads, head_dim),
                                   pos, table.freqs, style, table.mscale)
    # angles are formed and reduced in double: the error is a few float ulps of |x| at every position
    # (measured <= 3e-7 * max|x| on the emulator); a float angle would be off by ~pos * 2e-7 rad (1.6e-3 at 8000)
    err = np.abs(got[:, col:col + n_heads * head_dim].reshape(want.shape) - want)
    assert err.max() <= 6e-7 * table.mscale * np.abs(x).max(), err.max()


def test_rope_position_zero_is_identity(backend):
    x = _rng("rope0").standard_normal((2, 3 * 64)).astype(np.float32)
    dx = backend.upload(x)
    freqs = backend.upload(RopeTable.plain(10000.0, 64).freqs)
    rope_ops.rope(backend, dx, 3 * 64, backend.upload(np.zeros(2, np.int32)), 2, 3, 64, freqs, "neox")
    assert_same(backend.download(dx), x)


# -- the rope_kv variants (the fused rope + qk-norm + KV append, and any registered since) ----------
ROPE_VARIANTS = [v for v in variants_of("rope_kv")[1:]]  # each against the baseline's three kernels


@pytest.mark.parametrize("variant", ROPE_VARIANTS)
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("head_dim,nh,nkv", [(32, 4, 2), (64, 4, 2), (128, 4, 2), (256, 4, 2), (128, 32, 8)])
def test_rope_kv_equals_the_separate_kernels(backend, kv_dtype, norm, head_dim, nh, nkv, variant):
    """rope_kv.cu (and every other registered rope_kv variant) against qk_norm.cu + rope.cu +
    kv_cache.cu: the same rotation bits (the queries' temperature on: positions up to 3000 over an
    original context of 256); with the norm (a warp per head instead of a block) within float
    rounding. 32 + 8 heads of 128: more rotations than a block's 1024 threads."""
    rng = _rng("ropekv", kv_dtype, norm, head_dim, nh)
    n, bs, eps = 9, 4, 1e-6
    # YaRN with factors on a gemma-wide head (its mscale too), plain RoPE on the rest
    table = _table("yarn4+factors" if head_dim == 256 else "unscaled", 10000.0, head_dim)
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
        fn(backend, kv_dtype, d, stride, dpos, dslots, qn, kn, kc, vc, n, nh, nkv, head_dim,
           backend.upload(table.freqs), eps, "neox", mscale=table.mscale, temp_scale=0.5, temp_floor=256)
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


# -- the queries' attention temperature (mistral3's 1 + s ln(floor(p / n_ctx_orig) + 1)) --------------
# (temperature_scale, n_ctx_orig): Ministral's 0.1 over 16384, a small context, a scale with no short float
TEMPS = [(0.1, 16384), (0.5, 16), (float(np.float32(1 / 3)), 3)]


def _temp_positions(floor: int, n: int, seed: int) -> np.ndarray:
    """Every edge floor(p / floor) turns at (k floor - 1 and k floor), position 0, the far end of
    the int range a float holds exactly (2^24), and random ones between."""
    k = np.array([1, 2, 3, 7, 100, 1000])
    edges = np.concatenate([[0, 1, 2**24 - 1], k * floor - 1, k * floor])
    rand = _rng("temp-pos", floor, seed).integers(0, 2**24, n - len(edges))
    return np.clip(np.concatenate([edges, rand]), 0, 2**24 - 1).astype(np.int32)


@pytest.mark.parametrize("style", ["norm", "neox"])
@pytest.mark.parametrize("scale,floor", TEMPS)
def test_the_temperature_on_q_is_the_references_factor_bit_for_bit(backend, style, scale, floor):
    """rope.cu with a table of zero angles (cos 1, sin 0: the rotation is the identity, bit for bit)
    leaves the factor alone on each Q value: x * attn_temp(p) exactly, the float32 the reference
    multiplies by (model/config.py, the kernel's formula in NumPy). The K call (temp_scale 0) leaves
    K's bits as they were. Control: the factor is not 1 at most of these positions, so a kernel that
    skipped it, or took it in float or with a fused multiply-add at an edge, would fail."""
    n, nh, hd = 300, 2, 4
    pos = _temp_positions(floor, n, 0)
    x = _rng("temp", style, floor).standard_normal((n, 2 * nh * hd)).astype(np.float32)
    zero = backend.upload(np.zeros(hd // 2))
    dx, dpos = backend.upload(x), backend.upload(pos)
    rope_ops.rope(backend, dx, 2 * nh * hd, dpos, n, nh, hd, zero, style, temp_scale=scale, temp_floor=floor)
    rope_ops.rope(backend, dx, 2 * nh * hd, dpos, n, nh, hd, zero, style, col=nh * hd)  # K: no temperature
    got, t = backend.download(dx), attn_temp(pos, scale, floor)
    assert_same(got[:, : nh * hd], x[:, : nh * hd] * t[:, None])
    assert_same(got[:, nh * hd :], x[:, nh * hd :])
    assert (t[pos < floor] == 1).all() and (t[pos >= floor] > 1).all() and (pos >= floor).mean() > 0.9


@pytest.mark.parametrize("variant", variants_of("rope_kv"))
@pytest.mark.parametrize("norm", [False, True])
def test_every_rope_kv_variant_multiplies_q_and_never_k_by_the_temperature(backend, variant, norm):
    """The baseline (qk_norm.cu, rope.cu for Q with the temperature and for K without, kv_cache.cu) and
    every fused variant: run with mistral3's temperature, Q is the same launch without it times the
    factor, bit for bit (one float multiply after the rotation), K, V and the cache unchanged; and
    that Q is the NumPy twin's (rope_reference with the temperature) within the rotation's rounding.
    Control: past the original context the factor is > 1, so a skipped or K-side factor fails."""
    rng = _rng("ropekv-temp", variant, norm)
    n, nh, nkv, hd, bs, eps, scale, floor = 11, 4, 2, 64, 4, 1e-6, 0.5, 64
    table = _table("yarn4+factors", 10000.0, hd)
    q_dim, kv_dim = nh * hd, nkv * hd
    stride = q_dim + 2 * kv_dim
    qkv = rng.standard_normal((n, stride)).astype(np.float32)
    pos = np.concatenate([[0, floor - 1, floor, 2 * floor, 3 * floor - 1], rng.integers(0, 3000, n - 5)]).astype(np.int32)
    slots = rng.permutation(8 * bs)[:n].astype(np.int32)
    wq, wk = (1 + 0.1 * rng.standard_normal((2, hd))).astype(np.float32)
    shape, dt = kv_ops.kv_cache_shape("f16", 8, bs, nkv, hd)
    outs = {}
    for temp in (0.0, scale):
        d, kc, vc = backend.upload(qkv), backend.upload(_poison(shape, dt)), backend.upload(_poison(shape, dt))
        qn, kn = (backend.upload(wq), backend.upload(wk)) if norm else (None, None)
        _registered("rope_kv", variant).launch(backend, "f16", d, stride, backend.upload(pos), backend.upload(slots), qn,
                                               kn, kc, vc, n, nh, nkv, hd, backend.upload(table.freqs), eps, "norm",
                                               mscale=table.mscale, temp_scale=temp, temp_floor=floor)
        outs[temp] = [backend.download(a) for a in (d, kc, vc)]
    (q0, k0, v0), (q1, k1, v1) = outs[0.0], outs[scale]
    t = attn_temp(pos, scale, floor)
    assert (t[pos >= floor] > 1).all() and (pos >= floor).sum() >= 3
    assert_same(q1[:, :q_dim], q0[:, :q_dim] * t[:, None])
    assert_same(q1[:, q_dim:], q0[:, q_dim:])
    assert_same(k1.view(np.uint8), k0.view(np.uint8))
    assert_same(v1.view(np.uint8), v0.view(np.uint8))
    x = qkv[:, :q_dim].reshape(n, nh, hd).astype(np.float64)
    if norm:
        x = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * wq
    want = rope_ops.rope_reference(x, pos, table.freqs, "norm", table.mscale, scale, floor).reshape(n, q_dim)
    assert_close(q1[:, :q_dim], want, rtol=0, atol=2e-6 * np.abs(want).max())
