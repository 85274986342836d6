"""presence/frequency penalties, logit_bias and allowed-token masks in sample_rows, against
sample_reference, token for token (the margin rule of test_kernels_sampling.py)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from sharpinf.ops import sampling as S
from sharpinf.ops import sampling_reference as SR
from sharpinf.ops.variants import variant
from sharpinf.params import SamplingParams

EPS = 1e-5


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _run(be, sampler, logits, params, seeds, steps, seen, generated, masks):
    logits = np.ascontiguousarray(logits, np.float32)
    R, V = logits.shape
    out = be.empty((R,), np.int32)
    S.sample(be, be.upload(logits), R, V, params, seeds, steps, seen, out, generated=generated, masks=masks,
             kernels=sampler)
    return be.download(out)


def _mask(allowed: np.ndarray) -> np.ndarray:
    """u32 words of a bool [V] allowed vector (bit id = id allowed)."""
    V = allowed.size
    bits = np.zeros(S.history_words(V) * 32, np.uint8)
    bits[:V] = allowed
    return np.packbits(bits, bitorder="little").view(np.uint32)


def _random_case(rng, V):
    t = float(rng.choice([0.0, 0.0, 0.7, 1.0]))
    bias = {int(i): float(rng.choice([-100.0, -3.5, 0.25, 2.0, 100.0])) for i in rng.choice(V, rng.integers(0, 6), replace=False)}
    p = SamplingParams(temperature=t, top_k=int(rng.choice([0, 5])), top_p=float(rng.choice([1.0, 0.9])),
                       repetition_penalty=float(rng.choice([1.0, 1.3])),
                       presence_penalty=float(rng.choice([0.0, 1.5, -0.5, 2.0])),
                       frequency_penalty=float(rng.choice([0.0, 0.7, -2.0, 2.0])), logit_bias=bias)
    generated = rng.integers(0, min(V, 40), rng.integers(0, 30)).tolist()
    seen = rng.integers(0, V, rng.integers(0, 10)).tolist() + generated
    mask = _mask(rng.random(V) < 0.3) if rng.random() < 0.4 else None
    return p, seen, generated, mask


@pytest.mark.parametrize("V", [37, 1000])
def test_penalties_bias_mask_match_reference(backend, sampler, V):
    rng = _rng("pen", V)
    R = 48
    x = (rng.standard_normal((R, V)) * 3).astype(np.float32)
    x[rng.random((R, V)) < 0.01] = np.nan  # NaN and inf logits: masked ones must not matter
    x[rng.random((R, V)) < 0.01] = np.inf
    x[rng.random((R, V)) < 0.01] = -np.inf
    cases = [_random_case(rng, V) for _ in range(R)]
    params, seen, generated, masks = (list(c) for c in zip(*cases))
    seeds, steps = rng.integers(0, 2**63, R).tolist(), rng.integers(0, 500, R).tolist()
    got = _run(backend, sampler, x, params, seeds, steps, seen, generated, masks)
    checked = changed = 0
    for r in range(R):
        want, margin = SR.sample_reference_detail(x[r], params[r], seeds[r], steps[r], seen[r], generated[r], masks[r])
        if margin < EPS:
            continue
        checked += 1
        assert got[r] == want, (r, params[r], got[r], want)
        if masks[r] is not None and want >= 0:
            assert SR.apply_mask(x[r], masks[r])[1][want], "a disallowed id was chosen"
        plain = SR.sample_reference(x[r], SamplingParams(temperature=params[r].temperature, top_k=params[r].top_k,
                                                         top_p=params[r].top_p), seeds[r], steps[r])
        changed += plain != want
    assert checked >= R - 3
    assert changed >= R // 4, "the new filters changed too few choices to test anything"


def test_mask_edges(backend, sampler):
    """Nothing allowed -> -1 (and no crash); allowed ids all -inf -> the lowest allowed id, never a
    disallowed one; an allowed NaN wins greedy as in np.argmax; the mask beats a +100 bias."""
    V = 70
    x = np.zeros((4, V), np.float32)
    none = _mask(np.zeros(V, bool))
    only = np.zeros(V, bool)
    only[[40, 66]] = True
    x[1] = -np.inf
    x[2, 66] = np.nan
    x[3, 5] = 50.0
    p = [SamplingParams(), SamplingParams(temperature=1.0), SamplingParams(), SamplingParams(logit_bias={5: 100})]
    got = _run(backend, sampler, x, p, [1, 2, 3, 4], [0] * 4, [[]] * 4, [[]] * 4, [none, _mask(only), _mask(only), _mask(only)])
    assert got.tolist() == [-1, 40, 66, 40]
    for r in range(4):
        assert SR.sample_reference(x[r], p[r], r + 1, 0, mask=[none, *[_mask(only)] * 3][r]) == got[r]
    # negative control: without the mask the same rows pick other ids
    got = _run(backend, sampler, x, p, [1, 2, 3, 4], [0] * 4, [[]] * 4, [[]] * 4, None)
    assert got.tolist()[2:] == [66, 5] and got[0] == 0


def test_bias_extremes(backend, sampler):
    """+100 on one id forces it under sampling; -100 on the argmax removes it."""
    rng = _rng("bias")
    V, R = 500, 8
    x = rng.standard_normal((R, V)).astype(np.float32)
    forced = rng.integers(0, V, R)
    p = [SamplingParams(temperature=1.0, logit_bias={int(forced[r]): 100}) for r in range(R)]
    assert _run(backend, sampler, x, p, list(range(R)), [3] * R, [[]] * R, [[]] * R, None).tolist() == forced.tolist()
    top = np.argmax(x, axis=1)
    p = [SamplingParams(logit_bias={int(top[r]): -100}) for r in range(R)]
    got = _run(backend, sampler, x, p, list(range(R)), [0] * R, [[]] * R, [[]] * R, None)
    second = np.argsort(-x, axis=1, kind="stable")[:, 1]
    assert got.tolist() == second.tolist()
    plain = _run(backend, sampler, x, [SamplingParams(temperature=1.0)] * R, list(range(R)), [3] * R, [[]] * R, [[]] * R, None)
    assert (plain != forced).sum() >= R - 1  # negative control: without the bias the forced ids are not drawn


def test_counts_saturate(backend, sampler):
    """Counts are u16 on the device: 70000 generated copies of id 3 count as 65535, neither 70000
    (row 0: id 3 wins only below 68074) nor a wrapped 4464 (row 1: id 3 wins only above 60000)."""
    V = 40
    x = np.zeros((2, V), np.float32)
    x[0] = 63000.0
    x[0, 3], x[0, 7] = 131075.0, 63001.0
    x[1, 7] = 60000.0
    p = [SamplingParams(frequency_penalty=1.0), SamplingParams(frequency_penalty=-1.0)]
    gen = [[3] * 70000] * 2
    got = _run(backend, sampler, x, p, [0, 0], [0, 0], gen, gen, None)
    assert got.tolist() == [3, 3]
    assert [SR.sample_reference(x[r], p[r], 0, 0, gen[r], gen[r]) for r in range(2)] == [3, 3]
    assert SR.generated_counts(gen[0], V)[3] == S.COUNT_MAX


def test_kernel_counts_what_it_picks(backend, sampler):
    """The chosen id's count goes up on the device (the host never sends generated ids again), the
    rebuild path counts only the last count_n ids of the add list, and a second step reads both."""
    be, V = backend, 64
    p, k = S.pack_params([SamplingParams(presence_penalty=2.0, frequency_penalty=0.5)])
    dev = {n: be.upload(a) for n, a in dict(p=p, k=k, seeds=np.zeros(1, np.uint64), steps=np.zeros(1, np.int32),
                                               slots=np.zeros(1, np.int32), mask_idx=np.full(1, -1, np.int32),
                                               bias=np.zeros((1, S.BIAS_STRIDE), np.int32)).items()}
    bits = be.empty((1, S.history_words(V)), np.uint32)
    counts = be.empty((1, S.count_words(V)), np.uint32)
    out, scratch, masks = be.empty((1,), np.int32), be.empty((1, 2 * V), np.float32), be.upload(np.zeros((1, 2), np.uint32))

    def step(logits, clear, adds, count_n):
        variant("sample", sampler).launch(be, be.upload(np.asarray([logits], np.float32)), 1, V, dev["p"], dev["k"], dev["seeds"],
                      dev["steps"], bits, dev["slots"], be.upload(np.array([clear], np.int32)),
                      be.upload(np.array([0, len(adds)], np.int32)), be.upload(np.array(adds + [-1], np.int32)),
                      counts, be.upload(np.array([count_n], np.int32)), dev["bias"], dev["mask_idx"], masks, out,
                      scratch)
        return int(be.download(out)[0])

    x = np.zeros(V, np.float32)
    x[9], x[11] = 3.0, 2.9
    # prompt ids 9, 11 (seen, not counted), then generated 11 (counted): 11 -> 2.9 - 0.5 - 2
    assert step(x, 1, [9, 11, 11], 1) == 9
    c = be.download(counts).view(np.uint16)[0]
    assert c[9] == 1 and c[11] == 1 and c.sum() == 2  # 9 by the kernel, 11 by the rebuild
    x[11] = 3.5  # 9: 3 - 0.5 - 2 = 0.5; 11: 3.5 - 2.5 = 1.0
    assert step(x, 0, [], 0) == 11
    assert be.download(counts).view(np.uint16)[0][11] == 2
