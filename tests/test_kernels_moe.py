"""The MoE kernels against their NumPy twins (ops/moe.py), on every backend.

- the router (moe_route.cu, float and q8_1 input): the reference's experts and weights; exact ties go
  to the lower id; every logit tied gives experts 0..k-1 at 1/k;
- the experts, warp (moe_ffn.cu) and grouped (moe_dp4a.cu): x += sum of the k chosen experts'
  SwiGLU outputs, weighted, in rank order, within float32 rounding of the float64 truth;
- batch invariance bit for bit: a token's result alone equals its row in a batch where many tokens
  share its experts (several tiles of one expert in the grouped kernel);
- gpt-oss (a synthetic file's layer): the biased router with top-k softmax gating, the biased experts and
  the clamped SwiGLU, each variant against the reference's MoE (oracles/reference.py) and mmq and gemv
  bit for bit against grouped.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from oracles.reference import Reference
from sharpinf.model import quants
from sharpinf.model.loader import load_model
from sharpinf.model.synth import synthetic_model
from sharpinf.ops import mmq_tiles as mq
from sharpinf.ops import moe
from sharpinf.ops.basic import act_reference
from sharpinf.ops.matmul_dp4a import FIXED_G_TYPES
from sharpinf.ops.quant_act import Q8Act, quantize_q8_1_reference, round_q8_1
from sharpinf.ops.variants import variant, variants_of
from sharpinf.step.weights import _upload_experts
from asserts import assert_close, assert_same

MOE_VARIANTS = variants_of("moe")  # every registered variant runs these tests (the first: the baseline)

N_EMBD, N_FF, N_EXPERT = 64, 96, 8


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _q8(be, X: np.ndarray) -> Q8Act:
    q, d, s = quantize_q8_1_reference(X)
    a = Q8Act(be.upload(q), be.upload(d), be.upload(s), X.shape[1])
    return a


def _experts(be, rng, qtype, k, n_embd=N_EMBD, n_ff=N_FF, router=None):
    """(DeviceExperts, float truth: router, gate, up, down as the kernels see them)."""
    def stack(n_out, n_in):
        w = (rng.standard_normal((N_EXPERT, n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)
        raw = quants.quantize(w.reshape(-1, n_in), qtype)
        return raw, quants.dequantize(raw, qtype, w.shape)

    r = router if router is not None else (rng.standard_normal((N_EXPERT, n_embd)) * 2 / np.sqrt(n_embd)).astype(np.float32)
    (g_raw, g), (u_raw, u), (d_raw, d) = stack(n_ff, n_embd), stack(n_ff, n_embd), stack(n_embd, n_ff)
    E = moe.DeviceExperts(be.upload(r), be.upload(g_raw), be.upload(u_raw), be.upload(d_raw), qtype, qtype,
                          N_EXPERT, k, n_ff, n_embd)
    return E, (r, g, u, d)


def _truth(X, x0, w, k, q8: bool):
    """x0 + the MoE FFN of rows X in float64 (router and rounding points as the kernels: q8 rounds
    the inputs of the router, the gate/up and the down matmuls)."""
    r, g, u, d = w
    Xin = round_q8_1(X) if q8 else X
    ids, wts = moe.route_reference(moe.router_logits_reference(Xin, r), k)
    out = x0.astype(np.float64).copy()
    for t in range(len(X)):
        for slot in range(k):
            e = ids[t, slot]
            h = Xin[t].astype(np.float64)
            gu = act_reference("silu", g[e] @ h) * (u[e] @ h)
            if q8:
                gu = round_q8_1(gu.astype(np.float32)[None])[0].astype(np.float64)
            out[t] += wts[t, slot] * (d[e] @ gu)
    return out, ids, wts


def _run(be, name: str, E, X, x0, act: str = "silu"):
    """x0 + the registered moe variant `name`'s FFN of rows X (float or q8_1, as it declares)."""
    v, T = variant("moe", name), len(X)
    q8 = v.activations == "q8_1"
    s = moe.MoeScratch.alloc(be, T, E.n_used, E.n_ff, E.n_embd, E.n_expert, q8)
    x = be.upload(x0)
    v.launch(be, E, x, s, T, x_f=None if q8 else be.upload(X), x_q=_q8(be, X) if q8 else None, act=act)
    return be.download(x), be.download(s.ids).reshape(T, -1), be.download(s.wts).reshape(T, -1)


# -- the router -------------------------------------------------------------------------------------
# split: moe_route_split.cu (the grouped variants'), else moe_route.cu (one block a token)
SPLIT = pytest.mark.parametrize("split", [False, True], ids=["one-block", "split"])


@SPLIT
@pytest.mark.parametrize("q8", [False, True], ids=["f32", "q8_1"])
def test_router_picks_the_references_experts(backend, q8, split):
    rng = _rng("route", q8)
    T, k = 7, 3
    X = rng.standard_normal((T, N_EMBD)).astype(np.float32)
    r = (rng.standard_normal((N_EXPERT, N_EMBD)) * 2 / np.sqrt(N_EMBD)).astype(np.float32)
    r[5] = r[2]  # an exact tie: expert 2 must rank before 5 wherever they meet
    E = moe.DeviceExperts(backend.upload(r), None, None, None, quants.F32, quants.F32, N_EXPERT, k, 32, N_EMBD)
    s = moe.MoeScratch.alloc(backend, T, k, 32, N_EMBD, N_EXPERT, split)
    if q8:
        moe.route(backend, E, s, T, x_q=_q8(backend, X), split=split)
    else:
        moe.route(backend, E, s, T, x_f=backend.upload(X), split=split)
    ids, wts = backend.download(s.ids).reshape(T, k), backend.download(s.wts).reshape(T, k)
    want_ids, want_w = moe.route_reference(moe.router_logits_reference(round_q8_1(X) if q8 else X, r), k)
    assert (ids == want_ids).all(), (ids, want_ids)
    assert_close(wts, want_w, rtol=2e-6, atol=1e-7)
    with5 = [list(row) for row in ids if 5 in row]  # 5 ties 2: never chosen without 2 ranked before it
    assert with5 and all(2 in row and row.index(2) < row.index(5) for row in with5)


@SPLIT
def test_router_with_every_logit_tied_takes_the_lowest_ids(backend, split):
    T, k = 5, 3
    r = np.tile(_rng("tie").standard_normal((1, N_EMBD)).astype(np.float32), (N_EXPERT, 1))
    E = moe.DeviceExperts(backend.upload(r), None, None, None, quants.F32, quants.F32, N_EXPERT, k, 32, N_EMBD)
    s = moe.MoeScratch.alloc(backend, T, k, 32, N_EMBD, N_EXPERT, split)
    moe.route(backend, E, s, T, x_f=backend.upload(_rng("tie x").standard_normal((T, N_EMBD)).astype(np.float32)),
              split=split)
    assert (backend.download(s.ids).reshape(T, k) == [0, 1, 2]).all()
    assert (backend.download(s.wts) == np.float32(1 / 3)).all()


@SPLIT
@pytest.mark.parametrize("q8", [False, True], ids=["f32", "q8_1"])
def test_a_biased_top_k_softmax_router_picks_the_references_experts(backend, q8, split):
    """gpt-oss's router: logits + bias, the top k by logit, a softmax over those k. Experts 2 and 5 tie
    (equal rows and biases: 2 ranks first) ~250 above the rest, whose probabilities all underflow to zero:
    a softmax-first choice would take the lowest ids among them, the logits take the largest; biases ~30
    against logits ~60 wide change the choice."""
    rng = _rng("route oss", q8)
    T, k = 7, 3
    X = rng.standard_normal((T, N_EMBD)).astype(np.float32)
    r = (rng.standard_normal((N_EXPERT, N_EMBD)) * 60 / np.sqrt(N_EMBD)).astype(np.float32)
    b = (rng.standard_normal(N_EXPERT) * 30).astype(np.float32)
    r[2] = r[5] = X.sum(axis=0) * 4
    b[5] = b[2]
    E = moe.DeviceExperts(backend.upload(r), None, None, None, quants.F32, quants.F32, N_EXPERT, k, 32, N_EMBD,
                          router_bias=backend.upload(b), gating="topk_softmax")
    s = moe.MoeScratch.alloc(backend, T, k, 32, N_EMBD, N_EXPERT, split)
    moe.route(backend, E, s, T, split=split, **({"x_q": _q8(backend, X)} if q8 else {"x_f": backend.upload(X)}))
    ids, wts = backend.download(s.ids).reshape(T, k), backend.download(s.wts).reshape(T, k)
    logits = moe.router_logits_reference(round_q8_1(X) if q8 else X, r) + b
    want_ids, want_w = moe.route_reference(logits, k, gating="topk_softmax")
    assert (want_ids != moe.route_reference(logits, k)[0]).any(), "the case must tell the gatings apart"
    assert (want_ids != moe.route_reference(logits - b, k, gating="topk_softmax")[0]).any(), "and the bias matter"
    assert (ids == want_ids).all(), (ids, want_ids)
    assert_close(wts, want_w, rtol=2e-6, atol=1e-7)
    with5 = [list(row) for row in ids if 5 in row]
    assert with5 and all(2 in row and row.index(2) < row.index(5) for row in with5)


@SPLIT
@pytest.mark.parametrize("gating", list(moe.GATING))
def test_a_nan_in_the_router_makes_nan_weights_never_a_silent_choice(backend, split, gating):
    """One router row NaN: every probability is NaN after the softmax's sum, so the weights come out
    NaN (the forward pass's logits then fail every oracle) rather than a finite pick of the others;
    top-k softmax gating (its softmax over the k only) says so for a NaN logit anywhere."""
    T, k = 3, 2
    r = (_rng("nan").standard_normal((N_EXPERT, N_EMBD)) / np.sqrt(N_EMBD)).astype(np.float32)
    r[3, 5] = np.nan
    E = moe.DeviceExperts(backend.upload(r), None, None, None, quants.F32, quants.F32, N_EXPERT, k, 32, N_EMBD,
                          gating=gating)
    s = moe.MoeScratch.alloc(backend, T, k, 32, N_EMBD, N_EXPERT, split)
    moe.route(backend, E, s, T, x_f=backend.upload(_rng("nan x").standard_normal((T, N_EMBD)).astype(np.float32)),
              split=split)
    assert np.isnan(backend.download(s.wts)).all()
    ids = backend.download(s.ids)
    assert ((0 <= ids) & (ids < N_EXPERT)).all()  # still in range: the experts' kernels read no stray rows


@pytest.mark.parametrize("n_expert,k", [(8, 2), (128, 8), (200, 200)])
def test_the_split_router_gives_the_one_block_routers_bits(backend, n_expert, k):
    """moe_route_split.cu against moe_route.cu, ids and weights byte for byte: pairs of equal router rows
    (exact ties, settled by id), k up to every expert (the whole ranking), float and q8_1 input; twice
    (the tickets left at zero serve the next launch, as a graph replay); both gatings (gpt-oss's with
    its logits' bias)."""
    rng = _rng("split route", n_expert, k)
    T = 4
    r = (rng.standard_normal((n_expert, N_EMBD)) / np.sqrt(N_EMBD)).astype(np.float32)
    r[1::7] = r[0::7][:len(r[1::7])]  # ties
    X = rng.standard_normal((T, N_EMBD)).astype(np.float32)
    b = rng.standard_normal(n_expert).astype(np.float32)
    b[1::7] = b[0::7][:len(b[1::7])]  # the ties stay ties with gpt-oss's bias
    for gating, bias in (("softmax", None), ("topk_softmax", backend.upload(b))):
        E = moe.DeviceExperts(backend.upload(r), None, None, None, quants.F32, quants.F32, n_expert, k, 32, N_EMBD,
                              router_bias=bias, gating=gating)
        got = {}
        for split in (False, True):
            s = moe.MoeScratch.alloc(backend, T, k, 32, N_EMBD, n_expert, True)
            for q8 in (False, True):
                for rep in range(2 if split else 1):
                    moe.route(backend, E, s, T, **({"x_q": _q8(backend, X)} if q8 else {"x_f": backend.upload(X)}),
                              split=split)
                    got[split, q8, rep] = backend.download(s.ids).tobytes(), backend.download(s.wts).tobytes()
            if split:
                assert not backend.download(s.tickets).any(), "the last block must leave every ticket at zero"
        for q8 in (False, True):
            assert got[True, q8, 0] == got[False, q8, 0] == got[True, q8, 1], (gating, q8)


# -- the experts ------------------------------------------------------------------------------------
TYPES = [quants.Q8_0, quants.Q4_1, quants.BF16, quants.Q4_0, quants.Q5_1, quants.F16]  # three a variant


@pytest.mark.parametrize("name,qtype", [(n, q) for i, n in enumerate(MOE_VARIANTS) for q in TYPES[3 * (i % 2):][:3]],
                         ids=[f"{n}-{quants.qtype_name(q)}" for i, n in enumerate(MOE_VARIANTS)
                              for q in TYPES[3 * (i % 2):][:3]])
def test_experts_add_the_weighted_ffns_in_rank_order(backend, name, qtype):
    rng = _rng("ffn", name, qtype)
    T, k = 6, 2
    E, w = _experts(backend, rng, qtype, k)
    X = rng.standard_normal((T, N_EMBD)).astype(np.float32)
    x0 = rng.standard_normal((T, N_EMBD)).astype(np.float32)
    got, ids, _ = _run(backend, name, E, X, x0)
    q8 = variant("moe", name).activations == "q8_1"
    want, want_ids, _ = _truth(X, x0, w, k, q8=q8)
    assert (ids == want_ids).all()
    # the q8_1 rounding of the pairs' SwiGLU rows can land either side of a half step: a looser bound
    assert_close(got, want, rtol=0, atol=(2e-3 if q8 else 2e-5) * float(np.abs(want).max()))


# the baselines' own types one a variant in turn; MXFP4, gpt-oss's experts, on every variant
BASE_ONLY_CASES = list(dict.fromkeys([(MOE_VARIANTS[i % len(MOE_VARIANTS)], q) for i, q in enumerate(quants.BASE_ONLY)]
                                     + [(n, quants.MXFP4) for n in MOE_VARIANTS]))


@pytest.mark.parametrize("name,qtype", BASE_ONLY_CASES, ids=[f"{n}-{quants.qtype_name(q)}" for n, q in BASE_ONLY_CASES])
def test_the_baselines_own_types_run_on_every_moe_variant(backend, name, qtype):
    """Q2_K, Q3_K, IQ4_NL, IQ4_XS and MXFP4 (quants.BASE_ONLY): moe=warp and grouped compile them, mmq and
    gemv hand them to grouped (a step inside each one's token range, so the hand-over is what runs) --
    the other types' bound against the float64 truth."""
    v = variant("moe", name)
    rng = _rng("base-only", name, qtype)
    T, k = max(6, v.min_tokens or 0), 2
    E, w = _experts(backend, rng, qtype, k, n_embd=256, n_ff=256)
    X = rng.standard_normal((T, 256)).astype(np.float32)
    x0 = rng.standard_normal((T, 256)).astype(np.float32)
    got, ids, _ = _run(backend, name, E, X, x0)
    want, want_ids, _ = _truth(X, x0, w, k, q8=v.activations == "q8_1")
    assert (ids == want_ids).all()
    assert_close(got, want, rtol=0, atol=(2e-3 if v.activations == "q8_1" else 2e-5) * float(np.abs(want).max()))


@pytest.mark.parametrize("name", MOE_VARIANTS)
def test_a_tokens_experts_give_the_same_bits_in_any_batch(backend, name):
    """Token 0 alone, then among 19 tokens that all take experts 0 and 1 (skewed: every logit tied),
    so the grouped kernel cuts those experts' 19 pairs into 3 tiles: the same bits."""
    rng = _rng("invariance", name)
    qtype = quants.Q4_K if name != MOE_VARIANTS[0] else quants.Q5_0
    router = np.tile(rng.standard_normal((1, 256)).astype(np.float32), (N_EXPERT, 1))
    E, _ = _experts(backend, rng, qtype, 2, n_embd=256, n_ff=256, router=router)
    X = rng.standard_normal((19, 256)).astype(np.float32)
    x0 = rng.standard_normal((19, 256)).astype(np.float32)
    alone, ids1, _ = _run(backend, name, E, X[:1], x0[:1])
    batch, ids, _ = _run(backend, name, E, X, x0)
    assert (ids == [0, 1]).all() and (ids1 == [0, 1]).all()
    assert_same(batch[:1], alone)
    # and a token placed last gives what it gives first
    last, _, _ = _run(backend, name, E, X[::-1], x0[::-1])
    assert_same(last[::-1], batch)


@pytest.mark.parametrize("n_expert,P,tile", [(8, 1, 8), (128, 24, 8), (512, 700, 8), (512, 700, 64)])
def test_the_sort_cuts_each_experts_pairs_into_tiles_in_expert_order(backend, n_expert, P, tile):
    """moe_sort against the counting sort in NumPy: tiles (expert, first, count <= tile) expert by expert,
    count 0 past the last; order holds each expert's pairs in its range (any order within it: atomics)."""
    rng = _rng("sort", n_expert, P, tile)
    ids = rng.integers(0, n_expert, P).astype(np.int32)
    ids[: P // 3] = n_expert - 1  # a skewed expert: several tiles
    mt = mq.max_tiles(P, n_expert, tile)
    s = moe.MoeScratch(backend.upload(ids[None]), None, None, None, order=backend.empty((P,), np.int32),
                       tiles=backend.full((3, mt), -7, np.int32))
    moe.sort_pairs(backend, s, P, n_expert, mt, tile)
    tiles, order = backend.download(s.tiles), backend.download(s.order)
    counts = np.bincount(ids, minlength=n_expert)
    want, at = [], 0
    for e in range(n_expert):
        want += [(e, at + c, min(tile, counts[e] - c)) for c in range(0, counts[e], tile)]
        at += counts[e]
    n = len(want)
    assert [tuple(t) for t in tiles[:, :n].T] == want
    assert (tiles[2, n:] == 0).all()
    starts = np.concatenate([[0], np.cumsum(counts)])
    assert sorted(order) == list(range(P))
    for e in range(n_expert):
        assert (ids[order[starts[e]:starts[e + 1]]] == e).all(), e


def test_max_tiles_bounds_every_routing():
    """The worst case: every expert with one pair over a full tile. The bound is what the grid launches."""
    for P, n_expert in [(1, 8), (16, 8), (17, 8), (64, 128), (3, 128)]:
        worst = sum(-(-c // mq.TILE) for c in _worst_counts(P, n_expert))
        assert worst <= mq.max_tiles(P, n_expert)


def test_the_reserved_split_scratch_serves_every_smaller_step():
    """Workspace reserves mmq's split-K scratch for its capacity before graphs are recorded; a smaller
    step must never need more (a plan's floats are not monotone in its tiles: the window's floor).
    The shape where the capacity's own plan fell short: experts of 256 from 512, 8 of them, k = 4."""
    from types import SimpleNamespace


    cfg = SimpleNamespace(q_dim=512, kv_dim=128, n_embd=512, n_vocab=1000, is_moe=True, n_expert_used=4,
                          n_expert=8, n_ff_exp=256, n_ff=0)
    class HostArrays:  # the two allocations reserve_scratch makes (a backend is a weak key)
        empty, zeros = staticmethod(np.empty), staticmethod(np.zeros)

    be = HostArrays()
    T = 4096
    got = mq.reserve_scratch(be, cfg, T, 64)
    for n in range(1, T + 1):
        for n_out, n_in, nmat in ((cfg.n_ff_exp, cfg.n_embd, 2), (cfg.n_embd, cfg.n_ff_exp, 1)):
            for rows in (mq.ROWS_PER_BLOCK, mq.NARROW_ROWS):
                _, floats, tickets = mq.split_plan(n_out, n_in, mq.max_tiles(n * 4, 8, mq.MMQ_TILE), nmat, rows)
                assert floats <= got.partial.size and tickets <= got.tickets.size, (n, n_out, rows)


def _worst_counts(P: int, n_expert: int) -> list[int]:
    counts = [1] * min(P, n_expert)  # as many groups as can be...
    counts[0] += P - len(counts)  # ... the rest in one
    return counts


MMQ_ALL = pytest.mark.tier_all("Q8_0, Q4_K and Q6_K cover moe_mmq's tiles (plain, K-quant with mins and split down, "
                                "halves); each type's DpChunk is held to dp4a in test_kernels_matmul_mma.py")


@pytest.mark.parametrize("qtype", [quants.Q8_0, pytest.param(quants.Q4_1, marks=MMQ_ALL),
                                   pytest.param(quants.Q5_0, marks=MMQ_ALL), quants.Q4_K, quants.Q6_K],
                         ids=lambda q: quants.qtype_name(q))
def test_tensor_core_experts_equal_the_dp4a_tiles_bit_for_bit(backend, qtype, monkeypatch):
    """moe=mmq (tiles of 64 pairs an expert on int8 tensor cores) against moe=grouped (tiles of 8, dp4a):
    the same bits, for a skewed routing (every token to experts 0 and 1: 70 pairs each, a full tile
    and a partial one) and a spread one (partial tiles of many experts). 512 inputs to gate/up: two
    groups of 8 members (the canonical order's second level: split-K, a block each, the tile's last
    folding them; two sums add alike in either order -- the dense window test's four groups see a fold
    out of order). Q4_K also splits down (n_ff 512) and runs with a scratch of one row tile: the
    grids in windows of row tiles; every ticket is back at zero after the step (graphs replay them)."""
    _assert_mmq_experts_equal_grouped(backend, qtype, monkeypatch)


@pytest.mark.tier_all("moe_mmq's MQ_GROUP_SHARED probe (not what the fast set runs); make test runs it as built")
@pytest.mark.parametrize("kind", ["emu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_tensor_core_experts_with_group_sums_in_shared_memory_keep_the_bits(kind, mmq_group_sums_shared, monkeypatch):
    """moe_down_mmq with its group sums in shared memory (mmq_rows.cuh's probe): the same bits as the
    dp4a tiles, split and in windows (Q4_K's case above)."""
    _assert_mmq_experts_equal_grouped(mmq_group_sums_shared(kind), quants.Q4_K, monkeypatch)


def _assert_mmq_experts_equal_grouped(backend, qtype, monkeypatch):

    rng = _rng("mmq", qtype)
    n_ff = 512 if qtype == quants.Q4_K else 256
    if qtype == quants.Q4_K:
        monkeypatch.setattr(mq, "SCRATCH_FLOATS", 1)
    tied = np.tile(rng.standard_normal((1, 512)).astype(np.float32), (N_EXPERT, 1))
    for router in (tied, None):
        E, _ = _experts(backend, rng, qtype, 2, n_embd=512, n_ff=n_ff, router=router)
        X = rng.standard_normal((70, 512)).astype(np.float32)
        x0 = rng.standard_normal((70, 512)).astype(np.float32)
        got, ids, _ = _run(backend, "mmq", E, X, x0)
        assert not backend.download(mq._SCRATCH[backend].tickets).any()
        want, want_ids, _ = _run(backend, "grouped", E, X, x0)
        assert (ids == want_ids).all()
        assert_same(got, want)
        if router is tied:
            assert (ids == [0, 1]).all()


ONLY_ALL = pytest.mark.tier_all("Q8_0, Q4_K and Q6_K cover gemv_rows' paths (runs, fixed G, the K-quants)")


@pytest.mark.parametrize("qtype", [quants.Q8_0, quants.Q4_K, quants.Q6_K, pytest.param(quants.Q4_1, marks=ONLY_ALL),
                                   pytest.param(quants.BF16, marks=ONLY_ALL)], ids=lambda q: quants.qtype_name(q))
def test_streamed_decode_experts_equal_the_dp4a_tiles_bit_for_bit(backend, qtype, monkeypatch):
    """moe=gemv (one tile an expert of up to NT pairs, gemv_rows.cuh's row stream) against moe=grouped (tiles
    of 8, dp4a): the same bits at the step sizes it serves -- its 1-, 2-, 4- and 8-pair tiles full (a
    skewed routing: every token to experts 0 and 1, one tile of T pairs each) and its 4- and 8-pair
    tiles partly filled (3 and 5 tokens, a spread routing: a few pairs an expert). gate+up reads 1,024
    inputs (G = 32: the _g32 entries, the lanes' fold), down 512 (G = 16); Q8_0 and Q6_K load coalesced
    runs. (Steps of more than 8 tokens go to grouped itself: the invariance test above runs 19.)"""
    used = []
    real_kernel = moe.kernel
    monkeypatch.setattr(moe, "kernel", lambda be, f, e: used.append(e) or real_kernel(be, f, e))
    rng = _rng("gemv", qtype)
    tied = np.tile(rng.standard_normal((1, 1024)).astype(np.float32), (N_EXPERT, 1))
    for router, steps in ((tied, (1, 2, 4, 8)), (None, (3, 5))):
        E, _ = _experts(backend, rng, qtype, 2, n_embd=1024, n_ff=512, router=router)
        for T in steps:
            X = rng.standard_normal((T, 1024)).astype(np.float32)
            x0 = rng.standard_normal((T, 1024)).astype(np.float32)
            used.clear()
            got, ids, _ = _run(backend, "gemv", E, X, x0)
            nt = next(n for n in (1, 2, 4, 8) if n >= T)
            suffix = ("_g32", "_g16") if qtype in FIXED_G_TYPES else ("", "")  # BF16: G from n_in
            gemv = [e for e in used if "_gemv_" in e]
            name = quants.qtype_name(qtype).lower()
            assert gemv == [f"moe_gate_up_gemv_{name}_t{nt}{suffix[0]}", f"moe_down_gemv_{name}_t{nt}{suffix[1]}"]
            want, want_ids, _ = _run(backend, "grouped", E, X, x0)
            assert (ids == want_ids).all()
            assert_same(got, want)
            if router is tied:
                assert (ids == [0, 1]).all()


# -- gpt-oss ----------------------------------------------------------------------------------------
# Q8_0 experts (64 wide, 128 inside) and a K-quant's (256, 256); not MXFP4: that type is the kernels' next
OSS_TYPES = [quants.Q8_0, quants.Q4_K]


@pytest.fixture(scope="module")
def oss_layers():
    """qtype -> (the loaded one-layer gpt-oss file, its reference at f32 and at q8_1 MoE inputs)."""
    out = {}
    for qt in OSS_TYPES:
        shape = {} if qt == quants.Q8_0 else dict(n_embd=256, n_ff_exp=256)
        m = load_model(synthetic_model("gpt-oss", "Q8_0", expert_qtype=quants.qtype_name(qt), n_layer=1, **shape))
        out[qt] = m, {a: Reference(m, moe_act_quant=a) for a in ("f32", "q8_1")}
    return out


OSS_ALL = pytest.mark.tier_all("Q8_0 runs the biases and the clamp through every variant's epilogue, which every "
                                "type shares; Q4_K's rows (a K-quant's) in make test-all")


@pytest.mark.parametrize("qtype", [OSS_TYPES[0], pytest.param(OSS_TYPES[1], marks=OSS_ALL)],
                         ids=lambda q: quants.qtype_name(q))
@pytest.mark.parametrize("name", MOE_VARIANTS)
def test_gpt_oss_experts_match_the_reference_and_keep_the_shared_bits(backend, oss_layers, name, qtype):
    """A gpt-oss layer's MoE -- the biased router's top k by logit and their softmax, the experts' gate,
    up and down biases, the clamped SwiGLU -- in each variant against the reference's (oracles/reference.py,
    its inputs rounded as the variant reads them), within the qwen3moe cases' bounds; mmq and gemv (a step
    each serves: 16 and 5 tokens) give grouped's bits. The inputs reach past the clamp."""
    m, refs = oss_layers[qtype]
    v, cfg = variant("moe", name), m.config
    T = max(5, v.min_tokens or 0)
    E = _upload_experts(backend, m, "blk.0.")
    assert E.gating == "topk_softmax" and E.router_bias is not None and E.gate_up_bias is not None
    ref, L = refs[v.activations], refs[v.activations].layers[0]
    rng = _rng("oss", name, qtype)
    X = rng.standard_normal((T, cfg.n_embd)).astype(np.float32)
    x0 = rng.standard_normal((T, cfg.n_embd)).astype(np.float32)
    got, ids, _ = _run(backend, name, E, X, x0, act=cfg.ffn_act)
    want_ids, _ = ref.route(X, L)
    assert (ids == want_ids).all()
    want = x0 + ref._moe(X, L)
    assert_close(got, want, rtol=0, atol=(2e-3 if v.activations == "q8_1" else 2e-5) * float(np.abs(want).max()))
    gu = np.concatenate([X @ L.exps_gate_up[e].T + L.exps_gate_up_b[e] for e in np.unique(ids)])
    n = cfg.n_ff_exp
    assert (gu[:, :n] > 7).any() and (np.abs(gu[:, n:]) > 7).any(), "gates and ups must reach the clamp"
    if v.bits not in (None, name):
        same, _, _ = _run(backend, v.bits, E, X, x0, act=cfg.ffn_act)
        assert_same(got, same)


def test_a_model_without_moe_biases_uploads_none_and_the_softmax_gating(emu):
    """qwen3moe's experts upload no bias and the default gating: the kernels take today's path (has_bias 0)."""
    E = _upload_experts(emu, load_model(synthetic_model("qwen3moe", "Q8_0", n_embd=128)), "blk.0.")
    assert (E.router_bias, E.gate_up_bias, E.down_bias, E.gating) == (None, None, None, "softmax")
