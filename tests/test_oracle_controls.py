"""Negative controls: every oracle can fail, and NaN never passes one.

Each cross-path oracle compares two runs of the kernel path, so a bug that breaks both alike
(NaN logits everywhere: a missing barrier, a poisoned read) makes them agree bit for bit. Here
the forward pass is planted, at its output, with
  - NaN everywhere: every oracle must fail and say "NaN";
  - a one-ulp change that only one side of each oracle sees (the packed step, the chunk past the
    first, the batched decode, one block placement, the graph replay): each must fail, which
    proves the comparison is exact and really runs both paths;
  - a change of 5 logits at one position: kernel-vs-reference must fail its tolerance.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest

from oracles import compare, paths
from oracles.graph_oracle import oracle_graph_vs_eager, standard_schedule
from oracles.tolerances import Tolerance
from sharpinf.step.forward import ForwardPass
from sharpinf.model.loader import load_model
from sharpinf.model.synth import synthetic_model

pytestmark = pytest.mark.once  # the kernels are the simple set's, re-run in reverse order by their own tests

TOKS = list(range(3, 22))
PROMPTS = [list(range(5, 12)), list(range(20, 31)), list(range(40, 44))]


@functools.cache
def _fp(backend) -> ForwardPass:
    model = load_model(synthetic_model("llama", "Q8_0", n_layer=1, n_embd=64, n_head=2, n_head_kv=1, n_ff=128))
    return ForwardPass(model, backend, kernels="simple")


ORACLES = {
    "kernel-vs-reference": lambda fp: paths.oracle_kernel_vs_reference(fp, TOKS, "f16", 4),
    "packed-vs-sequential": lambda fp: paths.oracle_packed_vs_sequential(fp, PROMPTS, "f16", 4),
    "chunked-vs-whole": lambda fp: paths.oracle_chunked_vs_whole(fp, TOKS, "f16", 4, chunks=[5, 9, 5]),
    "batched-decode-vs-single-user": lambda fp: paths.oracle_batched_decode(fp, PROMPTS, [[1, 2], [3, 4], [5, 6]],
                                                                            "f16", 4),
    "placement": lambda fp: paths.oracle_placement(fp, TOKS, "f16", 4),
    "graph-vs-eager": lambda fp: oracle_graph_vs_eager(fp, standard_schedule(fp.cfg.n_vocab), "f16", 4),
}

# which step each plant changes: only one side of its oracle runs such a step
ONE_SIDE = {
    "packed-vs-sequential": lambda fp, b: b.n_seqs > 1 and b.n_tokens > b.n_seqs,
    "chunked-vs-whole": lambda fp, b: int(b.positions[0]) > 0,
    "batched-decode-vs-single-user": lambda fp, b: b.n_seqs > 1 and b.n_tokens == b.n_seqs,
    "placement": lambda fp, b: int(b.block_tables[0, 0]) % 2 == 1,
    "graph-vs-eager": lambda fp, b: not fp.exact_shapes,
}


def _plant(monkeypatch, change):
    """ForwardPass.forward with `change(fp, batch, logits)` applied to the logits it returns (the
    emulator's logits are the workspace's NumPy rows, changed in place before anyone reads them)."""
    real = ForwardPass.forward

    def forward(self, batch, kv, validate=True, sampling=None):
        out = real(self, batch, kv, validate, sampling)
        change(self, batch, out.logits)
        return out

    monkeypatch.setattr(ForwardPass, "forward", forward)


def _one_ulp(logits):
    logits.reshape(-1)[:1].view(np.uint32)[0] += 1


@pytest.mark.parametrize("oracle", list(ORACLES))
def test_nan_logits_fail_every_oracle(emu, monkeypatch, oracle):
    _plant(monkeypatch, lambda fp, b, logits: logits.fill(np.nan))
    r = ORACLES[oracle](_fp(emu))
    assert not r.passed and "NaN" in r.detail, r


@pytest.mark.parametrize("oracle", list(ONE_SIDE))
def test_a_one_ulp_difference_on_one_side_fails_each_cross_path_oracle(emu, monkeypatch, oracle):
    fp = _fp(emu)
    assert ORACLES[oracle](fp).passed  # unplanted: the control's baseline
    hits = []

    def change(fp, batch, logits):
        if ONE_SIDE[oracle](fp, batch) and logits.size:
            hits.append(1)
            _one_ulp(logits)

    _plant(monkeypatch, change)
    r = ORACLES[oracle](fp)
    assert hits and not r.passed, r


def test_kernel_vs_reference_fails_past_its_tolerance(emu, monkeypatch):
    def change(fp, batch, logits):
        if logits.shape[0] > 3:
            logits[3, 7] += 5.0

    _plant(monkeypatch, change)
    r = ORACLES["kernel-vs-reference"](_fp(emu))
    assert not r.passed and r.max_abs_dlogit >= 4.0 and "tolerance" in r.detail, r


def test_compare_and_exact_name_non_finite_values():
    want = np.zeros((3, 8), np.float32)
    got = want.copy()
    got[1, 5] = np.inf
    tol = Tolerance(1.0, 4, True, "test")
    r = compare.compare_logits("o", "c", got, want, tol)
    assert not r.passed and "first at token 1, id 5 where reference is finite" in r.detail, r
    r = compare.compare_logits("o", "c", want, got, tol)  # a non-finite reference never passes either
    assert not r.passed and "non-finite logit(s) in reference" in r.detail, r
    nan = np.full((2, 4), np.nan, np.float32)
    r = compare.exact("o", "c", nan, nan.copy())  # bit-identical NaN: still a failure
    assert not r.passed and "NaN logit(s) in one path" in r.detail and "the other" in r.detail, r
    r = compare.exact("o", "c", want, want.copy())
    assert r.passed and r.max_abs_dlogit == 0.0


def test_an_argmax_flip_passes_only_where_the_rows_error_explains_it():
    """compare_logits' near-tie rule: the greedy token may differ only where the reference's own
    top-2 gap is within 2 x that row's typical (90th-percentile) |dlogit| -- the whole row moved by
    the numerics. The same flip made by changing one logit fails, though the error is within the
    tolerance: twice the row's *largest* error, the rule before 2026-11-27, explains every flip."""
    tol = Tolerance(1.0, 4, True, "test")
    want = np.tile(np.array([3.0, 2.99, 1.0, 0.5, 0.2, 0.0, -0.5, -1.0, -2.0, -3.0], np.float32), (2, 1))
    got = want.copy()
    got[1] += np.array([-0.01, 0.01, 0.01, -0.01, 0.01, -0.01, 0.01, -0.01, 0.01, -0.01], np.float32)
    r = compare.compare_logits("o", "c", got, want, tol)  # row 1 flips, every logit moved by 0.01
    assert r.passed and r.argmax_equal and r.detail == "1 argmax flip(s) at near-ties", r
    want[0, 1] = 2.8
    got = want.copy()
    got[0, 1] += 0.5  # row 0 flips by one logit's error of 0.5 (the gap: 0.2), the rest exact
    r = compare.compare_logits("o", "c", got, want, tol)
    assert not r.passed and not r.argmax_equal and "argmax differs at [0]" in r.detail, r
    assert compare.compare_logits("o", "c", want, want.copy(), tol).detail == ""  # no flip, nothing said


def test_top5_swaps_pass_only_where_the_rows_error_explains_them():
    """The same rule at the top-5 cut: reference ids the kernels leave out of their top 5 count as kept
    when the reference puts them within 2 x the row's typical |dlogit| of its 6th logit (ranks 4-7
    within a few tenths: a 2-layer synthetic model's, the tensor set, 2026-11-28). Two ids pushed out
    by errors of their own, the rest of the row within 0.03, fail."""
    tol = Tolerance(3.0, 4, True, "test")  # wide: only the top-5 rule decides here
    want = np.concatenate([[9.0, 7.0, 5.0, 4.0, 3.02, 3.01, 3.0, 2.99], np.linspace(-1, -5, 92)]).astype(np.float32)[None]
    noise = np.where(np.arange(100) % 2, 0.01, -0.01).astype(np.float32)[None]
    noise[0, 4:8] = [-0.03, -0.03, 0.03, 0.03]  # ranks 5 and 6 leave, 7 and 8 come in
    r = compare.compare_logits("o", "c", want + noise, want, tol)
    assert r.passed and r.min_top5_overlap == 4 and r.detail == "", r  # one swap: within the overlap asked
    bad = noise.copy()
    bad[0, 2:4] = [-2.5, -1.5]  # ranks 3 and 4 drop below the cut by errors of their own
    r = compare.compare_logits("o", "c", want + bad, want, tol)
    assert not r.passed and r.min_top5_overlap == 3, r
    want[0, 3] = 3.03  # rank 4 itself a near tie at the cut: the row's noise explains both swaps
    noise[0, 3] = -0.04
    r = compare.compare_logits("o", "c", want + noise, want, tol)
    assert r.passed and r.min_top5_overlap == 3 and r.detail == "2 top-5 swap(s) at near-ties", r


def test_the_test_asserts_never_match_nan():
    from asserts import assert_bits, assert_close, assert_same

    nan = np.full(4, np.nan, np.float32)
    for check in (assert_close, assert_same, assert_bits):
        with pytest.raises(AssertionError, match="NaN|non-finite"):
            check(nan, nan.copy())
    with pytest.raises(AssertionError, match="non-finite value.*where the expected value is finite"):
        assert_close(np.array([1.0, np.inf], np.float32), np.array([1.0, 2.0], np.float32))
    assert_same(np.array([-0.0, 1.0], np.float32), np.array([0.0, 1.0], np.float32))  # values, not bits


def test_nan_logits_fail_the_engine_oracle(monkeypatch):
    """Greedy argmax over NaN logits is token 0 in the engine and alone alike: the engine oracles'
    lone run must refuse non-finite logits rather than agree with it."""
    from oracles.engine_oracles import oracle_engine_vs_single_user
    from sharpinf.llm import LLM
    from sharpinf.params import SamplingParams

    path = synthetic_model("llama", "Q8_0", n_layer=1, n_embd=64, n_head=2, n_head_kv=1, n_ff=128)
    llm = LLM(path, backend="emu", num_blocks=16, block_size=4, enforce_eager=True, kernels="simple")
    _plant(monkeypatch, lambda fp, b, logits: logits.fill(np.nan))
    r = oracle_engine_vs_single_user(llm, [[5, 6, 7], [9, 10]], [SamplingParams(max_tokens=3)] * 2, [0, 0])
    assert not r.passed and "non-finite logits alone" in r.detail, r


def _under_counting_scheduler(monkeypatch, engine):
    """The planted bug: a prefill chunk that does not reach its sequence's end advances num_computed
    one token short, so the next chunk computes that token again. Batch invariance makes the
    recomputed K/V bit-identical, so every output stays right: only the accounting can see it."""
    register = engine.blocks.register_full_blocks

    def short(seq):
        if 1 < seq.num_computed < len(seq.prompt_ids):  # a chunk that stopped mid-prompt
            seq.num_computed -= 1
        return register(seq)
    monkeypatch.setattr(engine.blocks, "register_full_blocks", short)


@pytest.mark.parametrize("oracle", ["engine-vs-single-user", "preemption"])
def test_work_done_twice_fails_the_engine_oracles(monkeypatch, oracle):
    """With the scheduler under-counting a chunk by one, the outputs still equal the lone runs, and
    the engine oracles fail on their accounting (the work is done twice), naming the position."""
    from oracles.engine_oracles import oracle_engine_vs_single_user, oracle_preemption
    from sharpinf.llm import LLM
    from sharpinf.params import SamplingParams

    path = synthetic_model("llama", "Q8_0", n_layer=1, n_embd=64, n_head=2, n_head_kv=1, n_ff=128)
    params = [SamplingParams(max_tokens=4)] * 3
    blocks = 80 if oracle == "engine-vs-single-user" else 13  # room for all, or a pool that must preempt
    llm = LLM(path, backend="emu", num_blocks=blocks, block_size=4, max_num_batched_tokens=8, enforce_eager=True,
              kernels="simple")

    def run(first: int):  # prompts of its own each run: the prefix cache serves none of them
        prompts = [list(range(first, first + 37)), list(range(first + 50, first + 63)), list(range(first + 70, first + 100))]
        if oracle == "engine-vs-single-user":
            return oracle_engine_vs_single_user(llm, prompts, params, [0, 0, 1])
        return oracle_preemption(llm, prompts, params)
    assert run(3).passed, "the engine oracles pass before the bug is planted"
    _under_counting_scheduler(monkeypatch, llm.engine)
    r = run(200)
    assert not r.passed and r.detail.startswith("accounting:") and re.search(r"position \d+ computed 2 times", r.detail), r.detail
