"""ffn=fused (kernels_cu/ffn_dp4a.cu): one cooperative launch with two grid barriers
equals the dp4a path's three launches (gate_up_dp4a, quantize_q8_1, matmul_dp4a accumulating
into x) bit for bit, at every step size it serves (1..8 tokens), whatever grid the barrier joins;
it declines (launching nothing) past 8 tokens and where the three matrices' types differ. The
emulator runs each block on its own thread at the barrier, in both thread orders (make test's
reverse pass)."""

from __future__ import annotations

import numpy as np
import pytest

from sharpinf.model import quants
from sharpinf.ops.matmul_dp4a import ffn_dp4a, gate_up_dp4a, matmul_dp4a
from sharpinf.ops.quant_act import Q8Act, quantize_q8_1
from asserts import assert_bits
from test_kernels_matmul_dp4a import _act, _raw, _rng

def _shape(qtype) -> tuple[int, int]:
    """(n_embd, n_ff): phase 2 spans several q8_1 blocks a row, phase 1 more row blocks than the
    emulator holds resident (4), so the grid strides."""
    n = max(64, quants.BLOCK_ELEMS[qtype])
    return n, max(256, n)


def _weights(be, rng, qtype, shape=None):
    n_embd, n_ff = shape or _shape(qtype)
    return {k: be.upload(_raw(rng, qtype, *dims)) for k, dims in
            (("g", (n_ff, n_embd)), ("u", (n_ff, n_embd)), ("d", (n_embd, n_ff)))}


def _three_launches(be, W, qtype, X, x0, n, act, shape=None):
    N_EMBD, N_FF = shape or _shape(qtype)
    h, hq = be.empty((n, N_FF), np.float32), Q8Act.empty(be, n, N_FF)
    gate_up_dp4a(be, W["g"], W["u"], qtype, X, h, n, N_FF, N_EMBD, act)
    quantize_q8_1(be, h, hq, n, N_FF)
    x = be.upload(x0)
    matmul_dp4a(be, W["d"], qtype, hq, x, n, N_EMBD, N_FF, accumulate=True)
    return be.download(x)


def _fused(be, W, qtypes, X, x0, n, act, shape=None):
    N_EMBD, N_FF = shape or _shape(qtypes[0])
    h, hq, x = be.empty((n, N_FF), np.float32), Q8Act.empty(be, n, N_FF), be.upload(x0)
    ran = ffn_dp4a(be, W["g"], W["u"], W["d"], qtypes, X, h, hq, x, n, N_FF, N_EMBD, act, be.zeros((2,), np.uint32))
    return ran, be.download(x)


@pytest.mark.parametrize("qtype", [quants.Q4_1, quants.Q4_K, quants.Q6_K, quants.Q8_0], ids=quants.qtype_name)
def test_the_fused_ffn_equals_the_three_launches(backend, qtype):
    rng = _rng("ffn", qtype)
    W, (N_EMBD, _) = _weights(backend, rng, qtype), _shape(qtype)
    for n, act in ((1, "silu"), (3, "gelu_tanh"), (8, "silu")):
        X, *_ = _act(backend, rng, n, N_EMBD)
        x0 = rng.standard_normal((n, N_EMBD)).astype(np.float32)
        want = _three_launches(backend, W, qtype, X, x0, n, act)
        ran, got = _fused(backend, W, (qtype,) * 3, X, x0, n, act)
        assert ran and np.isfinite(want).all() and not np.array_equal(want, x0)
        assert_bits(got, want, f"{quants.qtype_name(qtype)} n={n} {act}")


def test_the_fused_ffn_declines_what_it_does_not_serve(backend):
    rng, qtype = _rng("ffn-declines"), quants.Q8_0
    W, (N_EMBD, _) = _weights(backend, rng, qtype), _shape(qtype)
    X, *_ = _act(backend, rng, 9, N_EMBD)
    x0 = rng.standard_normal((9, N_EMBD)).astype(np.float32)
    assert _fused(backend, W, (qtype,) * 3, X, x0, 9, "silu") == (False, pytest.approx(x0))  # past one tile
    X1, *_ = _act(backend, rng, 1, N_EMBD)
    ran, got = _fused(backend, W, (qtype, qtype, quants.Q6_K), X1, x0[:1], 1, "silu")  # down of another type
    assert not ran and np.array_equal(got, x0[:1])


@pytest.mark.parametrize("qtype,shape,entry", [
    (quants.Q4_K, (512, 1024), "ffn_dp4a_q4_k_g16_32"),   # SmolLM2's pair of G (n_embd 576, n_ff 1536)
    (quants.Q8_0, (1024, 1024), "ffn_dp4a_q8_0_g32_32"),  # every model's from n_embd 1024 on
], ids=lambda v: v if isinstance(v, str) else None)
def test_the_fused_ffn_with_g_compiled_in_equals_the_three_launches(backend, qtype, shape, entry):
    """The entries whose phases take G as a compile-time constant (gate+up's from n_embd, down's from
    n_ff; the lanes' fold at a row's end) give the three launches' bits -- which run their own _g16 /
    _g32 entries."""
    rng = _rng("ffn-g", qtype)
    W = _weights(backend, rng, qtype, shape)
    for n, act in ((1, "silu"), (8, "gelu_tanh")):
        X, *_ = _act(backend, rng, n, shape[0])
        x0 = rng.standard_normal((n, shape[0])).astype(np.float32)
        with backend.collecting() as wanted:
            _fused(backend, W, (qtype,) * 3, X, x0, n, act, shape)
        assert ("ffn_dp4a.cu", entry) in wanted
        want = _three_launches(backend, W, qtype, X, x0, n, act, shape)
        ran, got = _fused(backend, W, (qtype,) * 3, X, x0, n, act, shape)
        assert ran and np.isfinite(want).all() and not np.array_equal(want, x0)
        assert_bits(got, want, f"{entry} n={n} {act}")
