"""Every registered matmul variant (sharpinf/ops/variants.toml, `sharpinf kernels new matmul NAME`
included), as the forward pass launches it: against its NumPy reference for each weight type it
serves, and batch-invariant -- a token's row bit for bit the same in a step of 1 and of 19 tokens.

  float variants (float and its copies)    vs dequantize(W) @ X^T in float64, ops/matmul.py's bound;
  q8_1 variants (dp4a, mma, their copies) vs ops/matmul_dp4a.py's reference within its bound, and
                                          bit for bit equal to dp4a: one reduction order for every
                                          variant and every step size, so prefill and decode agree;
                                          a token's row (and its gate+up row) the same bits in steps
                                          of 1, 15, 16, 17, 64 and 300 tokens (every tile edge).
The exhaustive per-kernel tests stay in test_kernels_matmul*.py; this file is what a new variant
gets for free."""

from __future__ import annotations

import numpy as np
import pytest

from sharpinf.model import quants
from sharpinf.ops.matmul import matmul_error_bound, matmul_reference
from sharpinf.ops.matmul_dp4a import matmul_dp4a, matmul_dp4a_reference
from sharpinf.ops.variants import variant, variants_of
from asserts import assert_bits
from test_kernels_matmul_dp4a import _act, _bound, _raw, _rng

# MXFP4, a type of the baselines alone (quants.BASE_ONLY): what the faster variants run for it is their hand-over
TYPES = [quants.F16, quants.Q8_0, quants.Q4_1, quants.Q4_K, quants.Q6_K, quants.MXFP4]
N_TOKENS = 19  # past mma's 16-token tile, with a partial tile


def _cases(v):
    return [q for q in TYPES if v.serves(q)]


def _own_kernels(names):
    """The variants whose linear layers run kernels of their own (the fused FFN and the link are ops of
    their own: test_kernels_matmul_ffn.py, test_kernels_layer_link.py); matmul=timed runs the others'
    (whichever its clock picks, each tested here: test_matmul_tuned.py tests the picking) -- its
    launcher is matmul_tuned's."""
    from sharpinf.ops import matmul_tuned

    seen, out = set(), []
    for n in names:
        v = variant("matmul", n)
        if v.launcher is not matmul_tuned.matmul_tuned and (v.launcher, v.files[0]) not in seen:
            seen.add((v.launcher, v.files[0]))
            out.append(n)
    return out


@pytest.mark.parametrize("name", _own_kernels(variants_of("matmul")))
def test_every_matmul_variant_matches_its_reference_and_is_batch_invariant(backend, name):
    v = variant("matmul", name)
    for qtype in _cases(v):
        rng = _rng("variants", name, qtype)
        n_in = 2 * max(32, quants.BLOCK_ELEMS[qtype])
        n_out = 40
        raw = _raw(rng, qtype, n_out, n_in)
        X, q, d, s = _act(backend, rng, N_TOKENS, n_in)
        bias = rng.standard_normal(n_out).astype(np.float32)
        W = backend.upload(raw)

        def run(rows: slice):
            n = rows.stop - rows.start
            Y = backend.empty((n, n_out), np.float32)
            if v.activations == "q8_1":
                from sharpinf.ops.quant_act import Q8Act

                Xr = Q8Act(backend.upload(q[rows]), backend.upload(d[rows]), backend.upload(s[rows]), n_in)
                v.launch(backend, W, qtype, Xr, Y, n, n_out, n_in, bias_dev=backend.upload(bias))
            else:
                xf = (q * np.repeat(d, 32, axis=1)).astype(np.float32)[rows]  # the same activations, as floats
                v.launch(backend, W, qtype, backend.upload(xf), Y, n, n_out, n_in, bias_dev=backend.upload(bias))
            return backend.download(Y)

        got = run(slice(0, N_TOKENS))
        assert np.isfinite(got).all(), f"{name} {quants.qtype_name(qtype)}: non-finite output"
        if v.activations == "q8_1":
            want = matmul_dp4a_reference(raw, qtype, q, d, bias)
            err = np.abs(got.astype(np.float64) - want)
            assert (err <= _bound(raw, qtype, q, d) + 1e-6 * np.abs(bias)).all(), f"{name}: max err {err.max():.3g}"
            dp4a = backend.empty((N_TOKENS, n_out), np.float32)
            matmul_dp4a(backend, W, qtype, X, dp4a, N_TOKENS, n_out, n_in, backend.upload(bias))
            assert_bits(got, backend.download(dp4a), err_msg=f"{name} vs dp4a, {quants.qtype_name(qtype)}")
        else:
            xf = (q * np.repeat(d, 32, axis=1)).astype(np.float32)
            want = matmul_reference(raw, qtype, xf, bias)
            bound = matmul_error_bound(raw, qtype, xf) + 1e-6 * np.abs(bias)
            assert (np.abs(got.astype(np.float64) - want) <= bound).all(), f"{name} {quants.qtype_name(qtype)}"
        for t in (0, 7, 18):  # the same token alone: the same bits
            assert_bits(run(slice(t, t + 1))[0], got[t], err_msg=f"{name} token {t} alone, {quants.qtype_name(qtype)}")


STEP_SIZES = (1, 2, 3, 8, 15, 16, 17, 64, 300)  # gemv's compiled counts (1, 2, 4 partly, 8); below, at and
# past a 16-token tile; a 64-token tile; several
STEP_TYPES = [(quants.Q5_0, 1024), (quants.Q4_K, 4096), (quants.Q6_K, 512)]  # 2-byte aligned; K-quants with 4
# chunks a lane (the order within a lane: gemv loads 4 ahead); halves


@pytest.mark.parametrize("name", [n for n in _own_kernels(variants_of("matmul"))
                                  if variant("matmul", n).activations == "q8_1"])
def test_a_tokens_bits_do_not_depend_on_the_step_size(backend, name):
    """Each step size N runs the variant on the first N tokens of one 300-token activation; every
    row equals dp4a's for that token in the 300-token step (lane groups of 32 and 16 chunks)."""
    _assert_steps_equal_dp4a(backend, name)


@pytest.mark.tier_all("mmq's MQ_GROUP_SHARED probe (not what the fast set runs); make test runs mmq as built")
@pytest.mark.parametrize("kind", ["emu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_mmq_with_group_sums_in_shared_memory_keeps_dp4as_bits(kind, mmq_group_sums_shared):
    _assert_steps_equal_dp4a(mmq_group_sums_shared(kind), "mmq")


def _assert_steps_equal_dp4a(backend, name):
    from sharpinf.ops.matmul_dp4a import gate_up_dp4a
    from sharpinf.ops.quant_act import Q8Act

    v = variant("matmul", name)
    for qtype, n_in in STEP_TYPES:
        rng = _rng("steps", qtype)
        n_out, n = 24, max(STEP_SIZES)
        wg, wu = backend.upload(_raw(rng, qtype, n_out, n_in)), backend.upload(_raw(rng, qtype, n_out, n_in))
        X, q, d, s = _act(backend, rng, n, n_in)
        want = backend.empty((n, n_out), np.float32)
        matmul_dp4a(backend, wg, qtype, X, want, n, n_out, n_in)
        want_gu = backend.empty((n, n_out), np.float32)
        gate_up_dp4a(backend, wg, wu, qtype, X, want_gu, n, n_out, n_in)
        want, want_gu = backend.download(want), backend.download(want_gu)
        for N in STEP_SIZES:
            Xn = Q8Act(*(backend.upload(np.ascontiguousarray(a[:N])) for a in (q, d, s)), n_in)
            Y = backend.empty((N, n_out), np.float32)
            v.launch(backend, wg, qtype, Xn, Y, N, n_out, n_in)
            assert_bits(backend.download(Y), want[:N], err_msg=f"{name} {quants.qtype_name(qtype)} N={N}")
            if v.gate_up is not None:
                v.gate_up(backend, wg, wu, qtype, Xn, Y, N, n_out, n_in)
                assert_bits(backend.download(Y), want_gu[:N], err_msg=f"{name} gate+up {quants.qtype_name(qtype)} N={N}")


# gemv walks a warp's rows as one stream of batches (gemv_rows.cuh): rows past one pass of the grid
# (the emulator holds 4 blocks, so 67 rows of G = 32 lanes take 16 warps up to 5 rows each, the next
# row's first batch fetched while a row finishes), lanes of one row with different chunk counts (n_in
# 576: 18 chunks over 16 lanes; 1536: 48 over 32 -- some lanes' last batch empty), a last warp whose
# second row is past n_out (G = 16: 2 rows a warp), and each compiled token count with a partial one.
# The 2-byte aligned types load a row's run of G chunks as one span of words (GV_COALESCE): Q5_0 at
# n_in 800 (25 chunks of 22 bytes: odd rows start 2 bytes past a word, a run of 16 chunks then one of
# 9 that ends 2 bytes into its last word), Q6_K at 768 (runs of two 210-byte super-blocks, then one;
# odd rows 2 bytes past a word) and at 1536 (runs of four, then two). Q8_0 at 288: G = 8 from n_in (the
# entries without a compiled G, dp_combine's fold), runs of 8 chunks then 1, odd rows 2 bytes past a word.
GEMV_SHAPES = [(quants.Q4_1, 576), (quants.Q4_K, 1536), (quants.Q6_K, 1536), (quants.Q8_0, 4096), (quants.Q5_0, 800),
               (quants.Q6_K, 768), (quants.Q8_0, 288)]


def test_gemv_streams_rows_and_ragged_lanes_with_dp4as_bits(backend):
    _assert_gemv_equals_dp4a(backend, GEMV_SHAPES)


@pytest.mark.tier_all("gemv's GV_COALESCE probes (not what matmul=gemv runs); make test runs gemv as built")
@pytest.mark.parametrize("gemv_coalesce", [0, 2], indirect=True)
@pytest.mark.parametrize("kind", ["emu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_gemv_coalesce_probes_keep_dp4as_bits(kind, gemv_coalesce):
    """GV_COALESCE=0 (every type's blocks loaded lane by lane) and 2 (Q4_1, Q5_1, Q4_K and Q5_K as
    coalesced runs too): the shapes above, a Q5_1 row of runs of 16 chunks and Q5_K's super-blocks."""
    _assert_gemv_equals_dp4a(gemv_coalesce(kind), GEMV_SHAPES + [(quants.Q5_1, 576), (quants.Q5_K, 768)])


def _assert_gemv_equals_dp4a(be, shapes):
    from sharpinf.ops.matmul_dp4a import gate_up_dp4a
    from sharpinf.ops.matmul_gemv import gate_up_gemv, matmul_gemv
    from sharpinf.ops.quant_act import Q8Act

    n_out = 67
    for qtype, n_in in shapes:
        rng = _rng("gemv-stream", qtype, n_in)
        wg, wu = be.upload(_raw(rng, qtype, n_out, n_in)), be.upload(_raw(rng, qtype, n_out, n_in))
        X, q, d, s = _act(be, rng, 8, n_in)
        for N in (1, 2, 3, 8):
            Xn = Q8Act(*(be.upload(np.ascontiguousarray(a[:N])) for a in (q, d, s)), n_in)
            for fn, ref, args in ((matmul_gemv, matmul_dp4a, (wg,)), (gate_up_gemv, gate_up_dp4a, (wg, wu))):
                got, want = be.empty((N, n_out), np.float32), be.empty((N, n_out), np.float32)
                fn(be, *args, qtype, Xn, got, N, n_out, n_in)
                ref(be, *args, qtype, Xn, want, N, n_out, n_in)
                assert_bits(be.download(got), be.download(want),
                            err_msg=f"{fn.__name__} {quants.qtype_name(qtype)} n_in={n_in} N={N}")
