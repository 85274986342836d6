"""The dp4a matmul variant (kernels_cu/matmul_dp4a.cu) against its NumPy reference, every type,
every backend; batch invariance bit for bit; the fused bias and residual epilogue.

Tolerance: the kernel's integer dot per 32-value chunk is exact; only a few float products per
chunk, the per-lane chunk sum and the member-order combine round: |Y - Y_ref| <= 1e-5 * sum |w x| + tiny,
with Y_ref = dequantize(X) @ dequantize(W)^T in float64 (ops/matmul_dp4a.py)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from sharpinf.model import quants
from sharpinf.ops.matmul_dp4a import group_lanes, matmul_dp4a, matmul_dp4a_reference, member_groups
from sharpinf.ops.quant_act import Q8Act, dequantize_q8_1, quantize_q8_1_reference
from asserts import assert_same

TYPES = list(quants.KERNEL_TYPES)
TYPE_IDS = [quants.qtype_name(q) for q in TYPES]
F16_FIELDS = {
    quants.Q8_0: (0,), quants.Q4_0: (0,), quants.Q5_0: (0,), quants.Q4_1: (0, 2), quants.Q5_1: (0, 2),
    quants.Q4_K: (0, 2), quants.Q5_K: (0, 2), quants.Q6_K: (208,),
    quants.Q2_K: (80, 82), quants.Q3_K: (108,), quants.IQ4_NL: (0,), quants.IQ4_XS: (0,), quants.MXFP4: (),
}
E8M0_FIELDS = {quants.MXFP4: (0,)}  # exponent bytes: random ones at 2^-10 to 1, as the fp16 scales


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _raw(rng, qtype, n_out, n_in):
    """Every quant bit pattern (random block bytes) with sane fp16 scales; random floats for F32/F16/BF16."""
    if qtype in (quants.F32, quants.F16, quants.BF16):
        return quants.quantize(rng.standard_normal((n_out, n_in)).astype(np.float32), qtype)
    n_blocks = n_out * n_in // quants.BLOCK_ELEMS[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, quants.BLOCK_BYTES[qtype]), dtype=np.uint8)
    for at in F16_FIELDS[qtype]:
        scale = (rng.uniform(-1, 1, n_blocks) * 10.0 ** rng.uniform(-3, 0, n_blocks)).astype(np.float16)
        blocks[:, at:at + 2] = scale.reshape(-1, 1).view(np.uint8)
    for at in E8M0_FIELDS.get(qtype, ()):
        blocks[:, at] = rng.integers(118, 129, n_blocks)
    return blocks.reshape(n_out, -1)


def _act(be, rng, n_tokens, n_in):
    x = (rng.standard_normal((n_tokens, n_in)) * rng.choice([0.01, 1, 30], (n_tokens, 1))).astype(np.float32)
    q, d, s = quantize_q8_1_reference(x)
    X = Q8Act(be.upload(q), be.upload(d), be.upload(s), n_in)
    return X, q, d, s


def _run(be, raw, qtype, X, n_tokens, n_out, n_in, bias=None, residual=None):
    Y = be.upload(residual) if residual is not None else be.empty((n_tokens, n_out), np.float32)
    matmul_dp4a(be, be.upload(raw), qtype, X, Y, n_tokens, n_out, n_in,
                None if bias is None else be.upload(bias), accumulate=residual is not None)
    return be.download(Y)


def _bound(raw, qtype, q, d):
    X = np.abs(dequantize_q8_1(q, d))
    n_in = X.shape[1]
    W = np.abs(quants.dequantize(np.asarray(raw).reshape(-1), qtype, (raw.shape[0], n_in)).astype(np.float64))
    return 1e-5 * (X @ W.T) + 1e-30


@pytest.mark.parametrize("qtype", TYPES, ids=TYPE_IDS)
@pytest.mark.parametrize("n_tokens,n_out,blocks", [(1, 5, 1), (3, 33, 2), (9, 17, 3), (8, 64, 18)])
def test_dp4a_matmul_matches_the_reference(backend, qtype, n_tokens, n_out, blocks):
    rng = _rng("dp4a", qtype, n_tokens, n_out, blocks)
    n_in = blocks * max(32, quants.BLOCK_ELEMS[qtype])
    raw = _raw(rng, qtype, n_out, n_in)
    X, q, d, _ = _act(backend, rng, n_tokens, n_in)
    bias = rng.standard_normal(n_out).astype(np.float32)
    got = _run(backend, raw, qtype, X, n_tokens, n_out, n_in, bias)
    want = matmul_dp4a_reference(raw, qtype, q, d, bias)
    err = np.abs(got.astype(np.float64) - want)
    assert np.isfinite(got).all()
    assert (err <= _bound(raw, qtype, q, d) + 1e-6 * np.abs(bias)).all(), f"max err {err.max():.3g}"


@pytest.mark.parametrize("qtype", [quants.Q4_1, quants.Q6_K, quants.Q8_0], ids=["Q4_1", "Q6_K", "Q8_0"])
def test_residual_epilogue_is_x_plus_the_product(backend, qtype):
    rng = _rng("res", qtype)
    n_in = 256
    raw = _raw(rng, qtype, 48, n_in)
    X, q, d, _ = _act(backend, rng, 5, n_in)
    resid = rng.standard_normal((5, 48)).astype(np.float32)
    plain = _run(backend, raw, qtype, X, 5, 48, n_in)
    fused = _run(backend, raw, qtype, X, 5, 48, n_in, residual=resid)
    assert_same(fused, resid + plain)  # x + (X W^T): the simple path's add, same bits


@pytest.mark.parametrize("qtype", TYPES, ids=TYPE_IDS)
def test_a_tokens_output_is_the_same_in_any_batch(backend, qtype):
    """Batch invariance: each token alone, in a partial tile, in two full tiles: the same bits."""
    rng = _rng("inv", qtype)
    n_in = 2 * max(32, quants.BLOCK_ELEMS[qtype])
    raw = _raw(rng, qtype, 40, n_in)
    n = 19
    X, q, d, s = _act(backend, rng, n, n_in)
    full = _run(backend, raw, qtype, X, n, 40, n_in)
    for lo, hi in [(0, 1), (5, 6), (3, 10), (8, 19)]:
        sub = Q8Act(*(backend.upload(np.ascontiguousarray(a[lo:hi])) for a in (q, d, s)), n_in)
        assert_same(_run(backend, raw, qtype, sub, hi - lo, 40, n_in), full[lo:hi])


def test_group_lanes_follow_n_in_only():
    sizes = (32, 64, 96, 128, 256, 576, 1024, 1536, 4096)
    assert [group_lanes(n) for n in sizes] == [1, 2, 2, 4, 8, 16, 32, 32, 32]
    # the canonical order's second level: groups of 8 members (dp4a.cuh's DP_GROUP; mmq's grid.z)
    assert [member_groups(n) for n in sizes] == [1, 1, 1, 1, 1, 2, 4, 4, 4]


@pytest.mark.parametrize("qtype", TYPES, ids=TYPE_IDS)
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_gate_up_is_act_gate_of_the_two_matmuls_bit_for_bit(backend, qtype, act):
    from sharpinf.ops import basic
    from sharpinf.ops.matmul_dp4a import gate_up_dp4a

    rng = _rng("gu", qtype, act)
    n_in, n_ff, n = 2 * max(32, quants.BLOCK_ELEMS[qtype]), 37, 11
    wg, wu = _raw(rng, qtype, n_ff, n_in), _raw(rng, qtype, n_ff, n_in)
    X, *_ = _act(backend, rng, n, n_in)
    g, u = _run(backend, wg, qtype, X, n, n_ff, n_in), _run(backend, wu, qtype, X, n, n_ff, n_in)
    want = backend.empty((n, n_ff), np.float32)
    basic.act_gate(backend, backend.upload(g), backend.upload(u), want, n * n_ff, act)
    got = backend.empty((n, n_ff), np.float32)
    gate_up_dp4a(backend, backend.upload(wg), backend.upload(wu), qtype, X, got, n, n_ff, n_in, act=act)
    assert_same(backend.download(got), backend.download(want))


def test_emulator_rejects_a_load_the_gpu_could_not_do(emu):
    """128-bit loads need 16-byte aligned addresses on a GPU; the emulator checks each dp4a load's
    alignment, so activations at an odd offset fail the launch instead of passing silently."""
    from sharpinf.errors import BackendError

    rng = _rng("align")
    n_in, n_out = 64, 8
    W = _raw(rng, quants.Q8_0, n_out, n_in)
    q, d, s = quantize_q8_1_reference(rng.standard_normal((1, n_in)).astype(np.float32))
    # 4 bytes past a 16-byte boundary, wherever the allocation starts (strict memcheck ends it flush with
    # a page, so its start is only as aligned as its size)
    buf = emu.upload(np.zeros(q.size + 32, np.int8))
    off = (4 - buf.ctypes.data) % 16
    shifted = buf[off:off + q.size]
    emu.copy_to_device(q.reshape(-1), shifted)
    X = Q8Act(shifted, emu.upload(d), emu.upload(s), n_in)
    y = emu.empty((1, n_out), np.float32)
    with pytest.raises(BackendError, match="aligned"):
        matmul_dp4a(emu, emu.upload(W), quants.Q8_0, X, y, 1, n_out, n_in)
