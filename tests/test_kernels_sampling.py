"""Device sampling (kernels_cu/sampling.cu) against its NumPy twin, on every backend.

Token-for-token: the kernel must pick exactly sample_reference's token for the same
(seed, step). The only tolerated difference is float rounding at a cut: where the
reference's running mass (top-p cut, min-p cut or the final u * total crossing) lies within
EPS (relative) of its threshold, the case is skipped and counted; the count must stay tiny.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from sharpinf.ops import sampling as S
from sharpinf.ops import sampling_reference as SR
from sharpinf.ops.variants import variants_of
from sharpinf.params import SamplingParams

EPS = 1e-5
# uniform(0, 0), uniform(1, 2), uniform(2**63 - 1, 123456), checked against a C build of the hash
PINNED = [0.4560544490814209, 0.37979239225387573, 0.3238658905029297]


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _run(be, sampler, logits, params, seeds, steps, seen, block=S.BLOCK):
    logits = np.ascontiguousarray(logits, np.float32)
    R, V = logits.shape
    out = be.empty((R,), np.int32)
    S.sample(be, be.upload(logits), R, V, params, seeds, steps, seen, out, block=block, kernels=sampler)
    return be.download(out)


def _random_params(rng, V) -> SamplingParams:
    kind = rng.integers(0, 6)
    t = float(rng.choice([0.0, 0.3, 0.7, 1.0, 1.5, 3.0])) if kind else 0.0
    return SamplingParams(
        temperature=t,
        top_k=int(rng.choice([0, 0, 1, 5, 50, V, V + 3])),
        top_p=float(rng.choice([1.0, 1.0, 0.95, 0.8, 0.5, 0.1, 1e-6])),
        min_p=float(rng.choice([0.0, 0.0, 0.05, 0.2, 0.9])),
        repetition_penalty=float(rng.choice([1.0, 1.0, 1.3, 0.8, 2.0])),
    )


def _check_rows(be, sampler, logits, params, seeds, steps, seen, block=S.BLOCK) -> tuple[int, int]:
    got = _run(be, sampler, logits, params, seeds, steps, seen, block)
    checked = skipped = 0
    for r in range(len(params)):
        want, margin = SR.sample_reference_detail(logits[r], params[r], seeds[r], steps[r], seen[r])
        if margin < EPS:
            skipped += 1
            continue
        checked += 1
        assert got[r] == want, (r, params[r], seeds[r], steps[r], got[r], want, margin)
    return checked, skipped


# -- the uniform ----------------------------------------------------------------------------
def test_uniform_counter_hash():
    u = S.uniforms(1234, np.arange(20000))
    assert u.dtype == np.float32 and np.all((u >= 0) & (u < 1))
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    assert S.uniform(1234, 7) == u[7]  # stateless: any step, any order
    assert S.uniform(1235, 7) != u[7] and S.uniform(0, 0) != S.uniform(0, 1)
    hist = np.bincount((u * 10).astype(int), minlength=10)
    assert np.all(np.abs(hist - 2000) < 200)
    # pinned values: a change of the hash (which the kernel must mirror) shows up here
    assert [S.uniform(0, 0), S.uniform(1, 2), S.uniform(2**63 - 1, 123456)] == PINNED
    assert len({S.uniform(s, 0) for s in range(1000)}) > 990


# -- greedy ---------------------------------------------------------------------------------
@pytest.mark.parametrize("V", [1, 2, 33, 1000, 4097])
def test_greedy_is_argmax(backend, sampler, V):
    rng = _rng("greedy", V)
    R = 6
    x = rng.standard_normal((R, V)).astype(np.float32)
    x[1] = np.round(x[1])  # many ties: the lowest id wins
    x[2, :] = 0.5  # all equal: id 0
    x[3, V // 2:] = x[3].max() + 1  # ties in the upper half
    params = [SamplingParams(temperature=0.0)] * (R - 1) + [SamplingParams(temperature=0.0, repetition_penalty=3.0)]
    seen = [[] for _ in range(R - 1)] + [[int(np.argmax(x[R - 1]))]]
    got = _run(backend, sampler, x, params, list(range(R)), [0] * R, seen)
    want = [int(np.argmax(x[r])) for r in range(R - 1)]
    want.append(int(np.argmax(SR.apply_repetition_penalty(x[R - 1], seen[R - 1], 3.0))))
    assert got.tolist() == want


@pytest.mark.parametrize("V", [3, 1000])
def test_greedy_special_values_as_numpy_argmax(backend, sampler, V):
    """NaN wins (the first one), as np.argmax; +inf beats every finite value; -inf everywhere is id 0."""
    x = np.random.default_rng(V).standard_normal((4, V)).astype(np.float32)
    x[0, [V // 2, V - 1]] = np.nan
    x[1, [1, V - 1]] = np.inf
    x[2, :] = -np.inf
    x[3, [2, 0]] = [np.inf, np.nan]
    got = _run(backend, sampler, x, [SamplingParams(temperature=0.0)] * 4, [0] * 4, [0] * 4, [[]] * 4)
    assert got.tolist() == [int(np.argmax(r)) for r in x] == [V // 2, 1, 0, 0]


# -- token for token against the reference --------------------------------------------------
@pytest.mark.parametrize("V", [1, 2, 7, 31, 33, 255, 257, 1000, 2049, 4999])
def test_matches_reference(backend, sampler, V):
    rng = _rng("ref", V)
    checked = skipped = 0
    for trial in range(3):
        R = int(rng.integers(1, 9))
        x = (rng.standard_normal((R, V)) * rng.choice([0.5, 2.0, 6.0])).astype(np.float32)
        params = [_random_params(rng, V) for _ in range(R)]
        seeds = [int(s) for s in rng.integers(0, 2**63 - 1, R, dtype=np.int64)]
        steps = [int(s) for s in rng.integers(0, 5000, R)]
        seen = [[int(i) for i in rng.integers(-1, V + 2, rng.integers(0, 40))] for _ in range(R)]
        c, s = _check_rows(backend, sampler, x, params, seeds, steps, seen)
        checked, skipped = checked + c, skipped + s
    assert skipped <= max(1, (checked + skipped) // 10) and checked >= 3


@pytest.mark.parametrize("block", [32, 1024])
def test_matches_reference_other_blocks(backend, block):
    """The baseline at other block sizes (radix's block is fixed)."""
    rng = _rng("blocks", block)
    V, R = 1500, 4
    x = (rng.standard_normal((R, V)) * 2).astype(np.float32)
    params = [SamplingParams(temperature=1.0, top_p=0.9), SamplingParams(temperature=0.8, top_k=20),
              SamplingParams(temperature=1.2, min_p=0.1), SamplingParams(temperature=1.0, top_k=300, top_p=0.7)]
    c, s = _check_rows(backend, variants_of("sample")[0], x, params, [11, 12, 13, 14], [5, 6, 7, 8], [[]] * R, block)
    assert s <= 1


@pytest.mark.parametrize("V", [32003, 262144], ids=["32k", "gemma3-262k"])
def test_large_vocab(backend, sampler, V):
    rng = _rng("large", V)
    R = 3
    x = (rng.standard_normal((R, V)) * 3).astype(np.float32)
    params = [SamplingParams(temperature=0.8, top_k=50, top_p=0.95),
              SamplingParams(temperature=1.0, top_p=0.9, min_p=0.01),
              SamplingParams(temperature=0.6, top_k=2000, repetition_penalty=1.1)]
    c, s = _check_rows(backend, sampler, x, params, [5, 6, 7], [1, 2, 3], [[1, 2, 3]] * R)
    assert c >= 2


def test_many_steps_small_vocab(backend, sampler):
    # one row per step: covers many u values on the same distribution, ties included
    rng = _rng("steps")
    V, R = 40, 8
    base = np.round(rng.standard_normal(V) * 2, 1).astype(np.float32)  # rounding makes ties
    x = np.tile(base, (R, 1))
    p = SamplingParams(temperature=0.9, top_k=12, top_p=0.85, min_p=0.02)
    total_checked = 0
    for start in range(0, 32, R):
        c, s = _check_rows(backend, sampler, x, [p] * R, [77] * R, list(range(start, start + R)), [[1, 2, 3]] * R)
        total_checked += c
    assert total_checked >= 28


# -- filters at their limits ----------------------------------------------------------------
def test_filters_that_keep_only_the_max(backend, sampler):
    rng = _rng("limits")
    V, R = 777, 8
    x = (rng.standard_normal((R, V)) * 2).astype(np.float32)
    kinds = [dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0)]
    for kind in kinds:
        params = [SamplingParams(temperature=float(t), **kind) for t in (0.5, 1.0, 2.0, 10.0, 0.5, 1.0, 2.0, 10.0)]
        got = _run(backend, sampler, x, params, list(range(R)), list(range(R)), [[]] * R)
        assert got.tolist() == [int(np.argmax(x[r])) for r in range(R)], kind


def test_ties_at_the_cut(backend, sampler):
    V = 64
    x = np.zeros((8, V), np.float32)  # all equal: ranking is by id
    x[4:, 10] = 1.0  # one clear winner, then ties
    params = [
        SamplingParams(temperature=1.0, top_k=3),  # ids 0..2
        SamplingParams(temperature=1.0, top_p=0.1),  # ceil(6.4) = 7 ties: ids 0..6
        SamplingParams(temperature=1.0, top_k=5, top_p=0.05),  # top-p 4 ties < top-k 5
        SamplingParams(temperature=1.0, min_p=1.0),  # min-p keeps every tie: all ids
        SamplingParams(temperature=1.0, top_k=2),  # id 10, then id 0
        SamplingParams(temperature=1.0, top_k=4),  # id 10, then ids 0, 1, 2
        SamplingParams(temperature=1.0, min_p=0.5),  # exp(-1) < 0.5: only id 10
        SamplingParams(temperature=1.0, top_k=64),
    ]
    allowed = [set(range(3)), set(range(7)), set(range(4)), set(range(V)), {10, 0}, {10, 0, 1, 2}, {10}, set(range(V))]
    seen_tokens = [set() for _ in params]
    for step in range(12):
        got = _run(backend, sampler, x, params, [3] * 8, [step] * 8, [[]] * 8)
        for r, t in enumerate(got):
            assert int(t) in allowed[r], (r, t)
            assert int(t) == SR.sample_reference(x[r], params[r], 3, step)
            seen_tokens[r].add(int(t))
    assert len(seen_tokens[1]) >= 3  # the tie rule does not just keep the first


def test_repetition_penalty_changes_the_choice(backend, sampler):
    x = np.full((2, 10), -10.0, np.float32)
    x[:, 3], x[:, 7] = 5.0, 4.0  # 3 wins unless penalised: 5 / 2 = 2.5 < 4
    x[:, 5] = -0.5  # negative logits get multiplied: -0.5 * 2 = -1 (still loses)
    params = [SamplingParams(temperature=0.05), SamplingParams(temperature=0.05, repetition_penalty=2.0)]
    got = _run(backend, sampler, x, params, [9, 9], [0, 0], [[3, 3, 5, -1], [3, 3, 5, -1]])
    assert got.tolist() == [3, 7]
    greedy = _run(backend, sampler, x, [SamplingParams(temperature=0.0, repetition_penalty=2.0)] * 2, [0, 0], [0, 0], [[3], []])
    assert greedy.tolist() == [7, 3]


# -- batch independence ---------------------------------------------------------------------
def test_same_seed_same_token_anywhere_in_the_batch(backend, sampler):
    rng = _rng("batch")
    V = 3000
    row = (rng.standard_normal(V) * 2).astype(np.float32)
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=200, repetition_penalty=1.2)
    seen = [int(i) for i in rng.integers(0, V, 30)]
    others = (rng.standard_normal((7, V)) * 3).astype(np.float32)
    other_params = [_random_params(rng, V) for _ in range(7)]
    for step in range(3):
        alone = _run(backend, sampler, row[None], [p], [42], [step], [seen])[0]
        for pos in (0, 3, 7):
            x = np.insert(others, pos, row, axis=0)
            params = other_params[:pos] + [p] + other_params[pos:]
            seeds = list(range(7))
            seeds.insert(pos, 42)
            steps = [step + 100 + i for i in range(7)]
            steps.insert(pos, step)
            seens = [[1, 2]] * 7
            seens.insert(pos, seen)
            got = _run(backend, sampler, x, params, seeds, steps, seens)
            assert got[pos] == alone, (step, pos)
        assert alone == SR.sample_reference(row, p, 42, step, seen) or \
            SR.sample_reference_detail(row, p, 42, step, seen)[1] < EPS


def test_scratch_reuse_and_seedless_error(backend):
    x = np.zeros((1, 5), np.float32)
    with pytest.raises(ValueError):
        S.sample(backend, backend.upload(x), 1, 5, [SamplingParams(temperature=1.0)], [None], [0], [[]],
                 backend.empty((1,), np.int32))
    scratch = backend.empty((1, 10), np.float32)
    out = backend.empty((1,), np.int32)
    x[0, 2] = 100.0
    S.sample(backend, backend.upload(x), 1, 5, [SamplingParams(temperature=1.0)], [1], [0], [[]], out, scratch)
    assert backend.download(out).tolist() == [2]


# -- statistics (NumPy reference only) ----------------------------------------------------
def _filtered_probs(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The filters written plainly, apart from the kernel's rule: probabilities after temperature,
    top-k, top-p and min-p (float64, sums to 1)."""
    z = logits.astype(np.float64) / p.temperature
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")  # descending, ties to the lowest id
    keep = np.ones(len(order), dtype=bool)
    if p.top_k > 0:
        keep[p.top_k :] = False
    if p.top_p < 1.0:
        cum = np.cumsum(probs[order])
        # keep the smallest prefix whose mass reaches top_p (the token crossing it stays)
        keep &= np.concatenate([[True], cum[:-1] < p.top_p])
    if p.min_p > 0.0:
        keep &= probs[order] >= p.min_p * probs[order[0]]
    probs[order[~keep]] = 0.0
    return probs / probs.sum()


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=6),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=1.0, min_p=0.1, repetition_penalty=1.5),
    SamplingParams(temperature=2.0, top_k=10, top_p=0.9, min_p=0.05),
])
def test_reference_distribution_matches_the_filters(params):
    rng = _rng("stats", repr(params))
    V, N = 16, 4000
    x = (rng.standard_normal(V) * 1.5).astype(np.float32)
    seen = [0, 1, 2]
    draws = np.array([SR.sample_reference(x, params, 2024, step, seen) for step in range(N)])
    p = _filtered_probs(SR.apply_repetition_penalty(x, seen, params.repetition_penalty), params)
    assert set(np.unique(draws)) <= set(np.flatnonzero(p > 0))
    counts = np.bincount(draws, minlength=V)
    keep = p > 0
    expected = N * p[keep]
    chi2 = float(((counts[keep] - expected) ** 2 / expected).sum())
    df = max(1, int(keep.sum()) - 1)
    assert chi2 < df + 6 * np.sqrt(2 * df) + 10, (chi2, df)
