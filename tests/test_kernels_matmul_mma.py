"""The int8 tensor-core matmuls (kernels_cu/matmul_mma.cu, gate_up_mma.cu: 16 tokens a block;
matmul_mmq.cu, gate_up_mmq.cu: 64 rows x 64 tokens a block; their narrow files: 16 rows) against the dp4a kernels, bit for bit: every quantized type, chunk counts that give every lane-group size (1, 2, 4, 8, 16,
32: every member count of the canonical order), partial row and token tiles, bias and residual. Through
dp4a the NumPy reference holds too (tests/test_kernels_matmul_dp4a.py)."""

from __future__ import annotations

import numpy as np
import pytest

from sharpinf.model import quants
from sharpinf.ops.matmul_dp4a import gate_up_dp4a, matmul_dp4a
from sharpinf.ops.matmul_mma import MMA_TYPES, gate_up_mma, matmul_mma
from sharpinf.ops.matmul_mmq import gate_up_mmq, gate_up_mmq_narrow, matmul_mmq, matmul_mmq_narrow

from test_kernels_matmul_dp4a import _act, _raw, _rng
from asserts import assert_bits

TYPES = sorted(MMA_TYPES)
TYPE_IDS = [quants.qtype_name(q) for q in TYPES]
K_QUANTS = {quants.Q4_K, quants.Q5_K, quants.Q6_K}
KERNELS = {"mma": (matmul_mma, gate_up_mma), "mmq": (matmul_mmq, gate_up_mmq),
           "mmq_narrow": (matmul_mmq_narrow, gate_up_mmq_narrow)}


def _shapes(qtype):
    """(n_in, n_out, n_tokens): chunk counts 1..64 (lane groups 1..32), rows and tokens past a tile
    (16 tokens for mma, 64 rows and 64 tokens for mmq, 16 rows for mmq_narrow)."""
    if qtype in K_QUANTS:
        return [(256, 70, 5), (512, 33, 17), (1024, 64, 16), (2048, 17, 3), (512, 20, 70)]
    return [(32, 20, 3), (96, 70, 17), (160, 33, 1), (576, 65, 20), (2048, 16, 33), (64, 130, 66)]


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("qtype", TYPES, ids=TYPE_IDS)
def test_tensor_core_matmul_equals_dp4a_bit_for_bit(backend, qtype, kernel):
    rng = _rng("mma", qtype)
    for n_in, n_out, n_tok in _shapes(qtype):
        raw = _raw(rng, qtype, n_out, n_in)
        X, *_ = _act(backend, rng, n_tok, n_in)
        W = backend.upload(raw)
        bias = backend.upload(rng.standard_normal(n_out).astype(np.float32))
        res = rng.standard_normal((n_tok, n_out)).astype(np.float32)
        for kw in ({}, {"bias_dev": bias}, {"accumulate": True}):
            ys = []
            for fn in (matmul_dp4a, KERNELS[kernel][0]):
                Y = backend.upload(res) if kw.get("accumulate") else backend.empty((n_tok, n_out), np.float32)
                fn(backend, W, qtype, X, Y, n_tok, n_out, n_in, **kw)
                ys.append(backend.download(Y))
            assert_bits(ys[1], ys[0], err_msg=f"{kernel} {n_in} {n_out} {n_tok} {kw}")


@pytest.mark.parametrize("qtype", [quants.Q4_0, quants.Q5_1, quants.Q4_K, quants.Q6_K],
                         ids=lambda q: quants.qtype_name(q))
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_tensor_core_gate_up_equals_dp4a_bit_for_bit(backend, qtype, act, kernel):
    rng = _rng("gu-mma", qtype)
    n_in = 512 if qtype in K_QUANTS else 160
    n_ff, n_tok = 70, 19 if kernel == "mma" else 67
    wg, wu = _raw(rng, qtype, n_ff, n_in), _raw(rng, qtype, n_ff, n_in)
    X, *_ = _act(backend, rng, n_tok, n_in)
    outs = []
    for fn in (gate_up_dp4a, KERNELS[kernel][1]):
        out = backend.empty((n_tok, n_ff), np.float32)
        fn(backend, backend.upload(wg), backend.upload(wu), qtype, X, out, n_tok, n_ff, n_in, act=act)
        outs.append(backend.download(out))
    assert_bits(outs[1], outs[0])


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_float_weights_have_no_int8_form(backend, kernel):
    rng = _rng("mma-f32")
    X, *_ = _act(backend, rng, 2, 64)
    with pytest.raises(ValueError, match="no int8 form"):
        KERNELS[kernel][0](backend, backend.upload(np.zeros((4, 64), np.float32)), quants.F32, X,
                   backend.empty((2, 4), np.float32), 2, 4, 64)


@pytest.mark.parametrize("kernel", ["mmq", "mmq_narrow"])
def test_split_k_in_windows_of_row_tiles_changes_no_bit(backend, kernel, monkeypatch):
    """mmq's split-K (a block for each group of a row's members, the tile's last block folding the
    group sums) with a scratch of one row tile: the grid runs in windows of row tiles (x0), the
    bits stay dp4a's, and every ticket is back at zero after each launch (graphs replay them)."""
    from sharpinf.ops import mmq_tiles as mq
    from sharpinf.ops.matmul_dp4a import member_groups

    monkeypatch.setattr(mq, "SCRATCH_FLOATS", 1)
    rng = _rng("mmq-windows")
    qtype, n_in, n_tok = quants.Q4_K, 1024, 70  # 4 groups of 8 members; 2 token tiles
    rows = mq.ROWS_PER_BLOCK if kernel == "mmq" else mq.NARROW_ROWS
    n_out = 2 * rows + 5  # 3 row tiles: 3 windows
    assert mq.split_plan(n_out, n_in, mq.token_tiles(n_tok), 1, rows)[0] == 1 and member_groups(n_in) == 4
    wg, wu = _raw(rng, qtype, n_out, n_in), _raw(rng, qtype, n_out, n_in)
    X, *_ = _act(backend, rng, n_tok, n_in)
    res = rng.standard_normal((n_tok, n_out)).astype(np.float32)
    matmul, gate_up = KERNELS[kernel]
    ys = []
    for fn in (matmul_dp4a, matmul):
        Y = backend.upload(res)
        fn(backend, backend.upload(wg), qtype, X, Y, n_tok, n_out, n_in, accumulate=True)
        ys.append(backend.download(Y))
    assert_bits(ys[1], ys[0])
    assert not backend.download(mq._SCRATCH[backend].tickets).any()
    outs = []
    for fn in (gate_up_dp4a, gate_up):
        out = backend.empty((n_tok, n_out), np.float32)
        fn(backend, backend.upload(wg), backend.upload(wu), qtype, X, out, n_tok, n_out, n_in)
        outs.append(backend.download(out))
    assert_bits(outs[1], outs[0])
    assert not backend.download(mq._SCRATCH[backend].tickets).any()
