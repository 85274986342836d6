"""Speculative decoding (engine/speculative.py): the speculative-vs-plain oracle on the kernel sets,
its negative controls, the rollback's block accounting over 200 verifications with rejections, and
the edges: stop strings and max_tokens inside a kept run, the config's refusals, the proposer."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import sharpinf.engine.speculative as speculative
from oracles.speculative import Arrival, oracle_speculative_vs_plain, standard_workload
from sharpinf.engine.llm_engine import LLMEngine
from sharpinf.engine.ngram import lookup
from sharpinf.engine.speculative import SpeculativeConfig, accept
from sharpinf.errors import SharpinfError
from sharpinf.model.synth import synthetic_model
from sharpinf.params import SamplingParams

CONFIG = dict(num_blocks=40, block_size=4, max_num_batched_tokens=16, max_num_seqs=6)
ALL = pytest.mark.tier_all("make test runs each set once, f16 and q8_0 alternating (the sets' bits are held "
                           "equal across KV dtypes by the path oracles)")


@functools.cache
def model():
    return synthetic_model("llama", "Q8_0", n_embd=128)


def maker(kernels="simple", kv="f16", **extra):
    def make(spec):
        return LLMEngine(model(), backend="emu", kernels=kernels, kv_dtype=kv, speculative=spec, **{**CONFIG, **extra})
    return make


@pytest.mark.parametrize("kernels,kv", [("simple", "f16"), ("fast", "q8_0"), ("tensor", "f16"),
                                        pytest.param("simple", "q8_0", marks=ALL), pytest.param("fast", "f16", marks=ALL),
                                        pytest.param("tensor", "q8_0", marks=ALL)])
def test_speculative_vs_plain(kernels, kv):
    """Greedy, seeded and penalised requests arriving while others run (CUDA graphs on): ids, text
    and logprobs equal plain decoding's bit for bit, with guesses both kept and rejected."""
    r = oracle_speculative_vs_plain(maker(kernels, kv), standard_workload(500), f"{kernels} {kv}")
    assert r.passed, r.detail


def test_the_oracle_fails_a_guess_accepted_unchecked(monkeypatch):
    """Negative control: acceptance that keeps every guess without comparing it to the target's pick."""
    monkeypatch.setattr(speculative, "accept", lambda guesses, picks: list(guesses) + [picks[-1]])
    r = oracle_speculative_vs_plain(maker(), standard_workload(500), "accept unchecked")
    assert not r.passed and "differ" in r.detail, r.detail


def test_the_oracle_fails_a_draw_keyed_by_the_chunk(monkeypatch):
    """Negative control: every row of a verified chunk drawn with the chunk's first key (the seeded
    requests then differ from plain decoding's)."""
    from sharpinf.engine import model_runner

    real = model_runner.ModelRunner.sampling_rows

    def one_key(self, chunks, forking=()):
        rows = real(self, chunks, forking)
        at = 0
        for c in chunks:
            rows.steps[at : at + 1 + c.seq.drafts] = rows.steps[at]
            at += 1 + c.seq.drafts
        return rows

    monkeypatch.setattr(model_runner.ModelRunner, "sampling_rows", one_key)
    r = oracle_speculative_vs_plain(maker(), standard_workload(500), "one key a chunk")
    assert not r.passed and "differ" in r.detail, r.detail


def test_the_oracle_fails_a_run_that_never_speculates():
    """Guesses that never come (k guesses, none matching: no repetition) prove nothing: the oracle
    says so rather than pass."""
    rng = np.random.default_rng(3)
    work = [Arrival(0, rng.permutation(np.arange(3, 40)).tolist(), SamplingParams(max_tokens=1, ignore_eos=True))]
    r = oracle_speculative_vs_plain(maker(), work, "no decode")
    assert not r.passed and "vacuous" in r.detail, r.detail


def test_preemption_choices_and_sliding_windows():
    """Every layer windowed (blocks slide while guesses are verified), a pool so small that sequences
    are preempted and recompute, a request of n = 2 choices: still plain decoding's outputs."""
    path = synthetic_model("gemma3", "Q8_0", n_embd=128, n_layer=2, n_head_kv=1, sliding_window=8)
    work = standard_workload(500) + [Arrival(1, [21, 22, 23] * 5, SamplingParams(n=2, max_tokens=14, temperature=0.9,
                                                                                 seed=9, ignore_eos=True))]
    made = []

    def make(spec):
        made.append(LLMEngine(path, backend="emu", kernels="fast", speculative=spec, **{**CONFIG, "num_blocks": 12}))
        return made[-1]

    r = oracle_speculative_vs_plain(make, work, "gemma3 local, preempting")
    assert r.passed, r.detail
    eng = made[-1]
    assert eng.blocks.window == 8 and eng.blocks.slid > 0 and eng.scheduler.preemptions > 0


def test_an_abort_mid_verification_run_frees_everything():
    eng = maker()("ngram")
    eng.add_request([7, 8, 9] * 6, SamplingParams(max_tokens=40, ignore_eos=True))
    eng.add_request([4, 5] * 8, SamplingParams(max_tokens=40, ignore_eos=True))
    while not eng.spec.metrics.verify_chunks and eng.has_unfinished():
        eng.step()
    assert eng.spec.metrics.verify_chunks > 0 and eng.requests["0"].output_ids
    eng.abort("0")
    while eng.has_unfinished():
        eng.step()
    assert eng.requests["0"].finish_reason == "aborted" and eng.requests["1"].finish_reason == "length"
    assert eng.blocks.num_free == eng.blocks.num_blocks and not any(eng.blocks.ref)


def test_nan_logits_fail_the_oracle(monkeypatch):
    """NaN rows alike in both runs must not agree their way through: logprobs rows planted with NaN."""
    from sharpinf.step.forward import ForwardPass

    real = ForwardPass.submit

    def submit(self, *args, **kwargs):
        pending = real(self, *args, **kwargs)
        if pending.logits_host is not None:
            pending.logits_host[:] = np.nan
        return pending

    monkeypatch.setattr(ForwardPass, "submit", submit)
    r = oracle_speculative_vs_plain(maker(), standard_workload(500), "NaN")
    assert not r.passed and "non-finite" in r.detail, r.detail


def _blocks_plain_holds(eng) -> list[str]:
    """Each running sequence holds the blocks of its computed positions, as a plain run does."""
    bs = eng.config.block_size
    return [f"{s.key}: {len(s.block_table)} blocks for {s.num_computed} computed"
            for s in eng.scheduler.running if len(s.block_table) != -(-s.num_computed // bs)]


def test_rollback_frees_the_rejected_guesses_blocks_over_200_verifications():
    """After every step of a long speculating run, each sequence holds what a plain run would;
    >= 200 steps rejected a guess; the prefix cache ends holding exactly the plain run's blocks (no
    rejected token is ever cached; the pool is large enough that neither run evicts) and every block
    is free."""
    rng = np.random.default_rng(7)
    prompts = [rng.integers(3, 60, 12).tolist() for _ in range(6)]  # a small alphabet: matches, often wrong
    params = [SamplingParams(max_tokens=380, temperature=0.9, seed=i, ignore_eos=True) for i in range(6)]
    cached, outs = {}, {}
    for spec in (None, {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}):
        eng = LLMEngine(model(), backend="emu", kernels="simple", speculative=spec,
                        **{**CONFIG, "num_blocks": 1000, "max_num_batched_tokens": 32})
        for p, sp in zip(prompts, params):
            eng.add_request(p, sp)
        rejecting = 0
        while eng.has_unfinished():
            m0 = dict(eng.spec.metrics.__dict__) if eng.spec else None
            eng.step()
            wrong = _blocks_plain_holds(eng)
            assert not wrong, wrong
            if eng.spec:
                m = eng.spec.metrics
                rejecting += (m.draft_tokens - m.accepted_tokens) > (m0["draft_tokens"] - m0["accepted_tokens"])
        assert eng.blocks.num_free == eng.blocks.num_blocks and not any(eng.blocks.ref)
        cached[spec is None] = {k: eng.blocks.info[b].tokens for k, b in eng.blocks.cached.items()}
        outs[spec is None] = [s.output_ids for s in eng.requests.values()]
    assert rejecting >= 200, f"only {rejecting} steps rejected a guess"
    assert outs[True] == outs[False]
    assert cached[True] == cached[False]


def test_stop_string_and_max_tokens_inside_a_kept_run():
    """A stop id met mid-run ends the request there (the kept guesses after it are dropped, never
    emitted); max_tokens is met exactly; a stream's deltas add up to the text."""
    base = maker()(None)
    p = [7, 8, 9, 10, 11] * 4
    base.add_request(p, SamplingParams(max_tokens=20, ignore_eos=True))
    while base.has_unfinished():
        base.step()
    ids = base.requests["0"].output_ids
    stop_id = ids[5]
    for params in (SamplingParams(max_tokens=20, stop_token_ids=(stop_id,), ignore_eos=True),
                   SamplingParams(max_tokens=7, ignore_eos=True)):
        got = {}
        for spec in (None, "ngram"):
            eng = maker()(spec)
            eng.add_request(p, params)
            deltas = []
            while eng.has_unfinished():
                deltas += [o.new_text for o in eng.step()]
            s = eng.requests["0"]
            assert "".join(deltas) == s.stop.text
            got[spec] = (s.output_ids, s.finish_reason)
        assert got[None] == got["ngram"], (params, got)


def test_config_parse_and_refusals():
    assert SpeculativeConfig.parse("ngram").method == "ngram"
    c = SpeculativeConfig.parse("draft:smollm2-135m", k=3)
    assert (c.method, c.model, c.num_speculative_tokens) == ("draft", "smollm2-135m", 3)
    assert SpeculativeConfig.parse(None) is None
    for bad, says in [("medusa", "choose ngram or draft"), ("draft", "draft:MODEL"), ({"method": "ngram", "k": 2}, "k"),
                      ({"method": "ngram", "num_speculative_tokens": 0}, ">= 1"), ("ngram:x", "no model")]:
        with pytest.raises(SharpinfError, match=says):
            SpeculativeConfig.parse(bad)
    with pytest.raises(SharpinfError, match="async_scheduling"):
        LLMEngine(model(), backend="emu", speculative="ngram", async_scheduling=True, **CONFIG)


def test_accept_and_lookup():
    assert accept([5, 6, 7], [5, 6, 9, 1]) == [5, 6, 9]
    assert accept([5, 6], [5, 6, 4]) == [5, 6, 4]
    assert accept([5], [3, 4]) == [3]
    assert lookup(np.array([1, 2, 3, 4, 1, 2]), 3, 4, 1) == [3, 4, 1]
    assert lookup(np.array([5, 6, 7]), 3, 4, 1) == []
    assert lookup(np.array([1, 2, 3, 4, 1, 2, 1, 2]), 3, 2, 1) == [3, 4, 1]  # the latest match with k after it
