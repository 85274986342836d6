"""Speculative decoding with a draft model (engine/draft.py): outputs equal plain decoding's with a
smaller draft; the target as its own draft guesses exactly its greedy picks (every greedy guess kept,
and with seeded requests every guess the target's argmax at its row: the shadows' rollback of
rejected and unverified guesses is right), with a negative control; a draft of another vocabulary
or a shorter context is refused; a full draft pool means no guesses, never an error; no draft block
or shadow outlives its request."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import sharpinf.engine.draft as draft_mod
from oracles.speculative import oracle_speculative_vs_plain, standard_workload
from sharpinf.engine.llm_engine import LLMEngine
from sharpinf.errors import SharpinfError
from sharpinf.model.loader import load_model
from sharpinf.model.synth import synthetic_model
from sharpinf.params import SamplingParams

CONFIG = dict(num_blocks=40, block_size=4, max_num_batched_tokens=16, max_num_seqs=6)


@functools.cache
def target():
    return synthetic_model("llama", "Q8_0", n_embd=128)


@functools.cache
def small_draft():
    """The target's first layer alone (same seed, tied embeddings): guesses both kept and rejected."""
    return synthetic_model("llama", "Q8_0", n_embd=128, n_layer=1)


def make(draft=None, k=3, **extra):
    spec = None if draft is None else {"method": "draft", "model": draft, "num_speculative_tokens": k}
    return LLMEngine(target(), backend="emu", kernels="simple", speculative=spec, **{**CONFIG, **extra})


def draft_left(eng) -> list[str]:
    """What the draft still holds after every request ended (nothing, when nothing leaked)."""
    d = eng.spec.proposer
    out = [f"shadow {k}" for k in d.shadows]
    if d.blocks.num_free != d.blocks.num_blocks or any(d.blocks.ref):
        out.append(f"{d.blocks.num_blocks - d.blocks.num_free} of {d.blocks.num_blocks} blocks held")
    return out


def run(eng, arrivals) -> dict:
    """arrivals: (step, prompt, params), each added before that step; every request's output ids."""
    pending, ids, step = sorted(arrivals, key=lambda a: a[0]), [], 0
    while pending or eng.has_unfinished():
        while pending and pending[0][0] <= step:
            _, prompt, params = pending.pop(0)
            ids.append(eng.add_request(prompt, params))
        eng.step()
        step += 1
    return {rid: eng.requests[rid].output_ids for rid in ids}


def greedy_workload(seed=0):
    """Greedy requests: four at once (a budget of 10 then verifies fewer guesses than asked, or none,
    for the later ones: their shadows roll back their own guesses), and a prompt longer than a step
    arriving while they decode (the draft catches up on it in chunks)."""
    rng = np.random.default_rng(seed)
    g = lambda n: SamplingParams(max_tokens=n, ignore_eos=True)  # noqa: E731
    return [(0, rng.integers(3, 400, 2).tolist(), g(n)) for n in (30, 26, 28, 24)] + [
        (3, rng.integers(3, 400, 23).tolist(), g(16))]


def test_draft_vs_plain():
    """A smaller draft: greedy, seeded, logprobs and penalised requests mixed with others' prefill
    equal plain decoding's bit for bit (guesses both kept and rejected), the target's accounting
    holds, and the draft holds nothing after."""
    engines = []

    def maker(spec):
        engines.append(make() if spec is None else make(small_draft()))
        return engines[-1]

    spec = {"method": "draft", "model": small_draft(), "num_speculative_tokens": 3}
    r = oracle_speculative_vs_plain(maker, standard_workload(512), "draft", speculative=spec)
    assert r.passed, r.detail
    assert draft_left(engines[-1]) == []


def test_self_draft_keeps_every_greedy_guess():
    """The target as its own draft (given as a path): every greedy guess is kept, while the scheduler
    verifies fewer guesses than asked or none (the shadows roll back 1 to 3 positions), preempts, and
    a prompt arrives longer than a step; outputs are plain decoding's and the draft ends empty."""
    small = dict(max_num_batched_tokens=10, num_blocks=20)
    work = greedy_workload()
    plain = run(make(**small), work)
    eng = make(target(), **small)
    d, rolled, wrong = eng.spec.proposer, [], []
    sync = d._sync

    def syncing(seq):  # each rollback also frees the blocks past what the shadow keeps
        before = d.shadows[seq.key].seq.num_computed if seq.key in d.shadows else 0
        sh = sync(seq)
        rolled.append(before - sh.num_computed)
        if len(sh.block_table) != -(-sh.num_computed // eng.config.block_size):
            wrong.append(f"{seq.key}: {len(sh.block_table)} blocks for {sh.num_computed} computed")
        return sh

    d._sync = syncing
    got = run(eng, work)
    assert not wrong, wrong[:3]
    m = eng.engine_metrics()["speculative"]
    assert got == plain
    assert m["acceptance_rate"] == 1.0 and m["draft_tokens"] >= 60 and m["model"] == str(target()), m
    assert m["draft_steps"] >= m["verify_chunks"]  # k - 1 decodes (and catch-ups) for each verification
    assert {1, 3} <= set(rolled) and eng.scheduler.preemptions, (sorted(rolled), eng.scheduler.preemptions)
    assert draft_left(eng) == []


def argmax_misses(eng, work) -> tuple[list[str], int]:
    """Run work with logprobs; every verified guess i of a chunk must be the target's argmax at row i
    (its logits follow the guesses before it, which the chunk feeds): the draft's greedy pick when the
    draft is the target. Returns the misses and the guesses rejected."""
    misses, spec = [], eng.spec
    settle = spec.settle

    def checking(seq, picks, blocks):
        guesses = seq.tokens[len(seq.tokens) - seq.drafts :]
        best = [lp.top[0][0] for lp in eng.runner.last_logprobs[seq.key]]
        if guesses != best[: len(guesses)]:
            misses.append(f"{seq.key} at {len(seq.tokens) - len(guesses)}: guessed {guesses}, argmax {best}")
        return settle(seq, picks, blocks)

    spec.settle = checking
    run(eng, work)
    m = spec.metrics
    return misses, m.draft_tokens - m.accepted_tokens


def seeded_workload():
    rng = np.random.default_rng(1)
    p = lambda n, **kw: SamplingParams(max_tokens=n, ignore_eos=True, logprobs=1, **kw)  # noqa: E731
    return [(0, rng.integers(3, 400, 9).tolist(), p(24, temperature=0.8, seed=3)),
            (0, rng.integers(3, 400, 6).tolist(), p(24)),
            (1, rng.integers(3, 400, 20).tolist(), p(20, temperature=1.0, seed=4))]


def test_self_draft_guesses_the_targets_argmax_after_rejections():
    """Seeded requests reject guesses; every guess after their rollbacks is still the target's argmax."""
    misses, rejected = argmax_misses(make(target()), seeded_workload())
    assert not misses, misses[:3]
    assert rejected >= 10, rejected


def test_the_argmax_check_fails_a_shadow_not_synced():
    """Negative control: shadows rolled back but keeping their own tokens where the target's differ
    (a rejected guess is fed again instead of the target's pick)."""
    eng = make(target())
    d = eng.spec.proposer
    sync = d._sync

    def stale(seq):
        mine = list(d.shadows[seq.key].seq.tokens) if seq.key in d.shadows else []
        sh = sync(seq)
        if len(mine) >= len(sh.tokens):
            sh.tokens = mine[: len(sh.tokens)]
        return sh

    d._sync = stale
    misses, _ = argmax_misses(eng, seeded_workload())
    assert misses


def test_draft_refusals():
    """Another vocabulary (size, or token strings) or a shorter context: one line naming it."""
    tokens = list(load_model(target()).metadata["tokenizer.ggml.tokens"])
    tokens[17] = "zz-not-the-same"
    for model, says in [(synthetic_model("llama", "Q8_0", n_embd=64, n_vocab=600),
                         "vocabulary (600 tokens) is not the target's (512): a draft must share the target's tokenizer"),
                        (synthetic_model("llama", "Q8_0", n_embd=64, **{"tokenizer.ggml.tokens": tokens}),
                         "differs from the target's at token 17 ('zz-not-the-same'"),
                        (synthetic_model("llama", "Q8_0", n_embd=64, context_length=256),
                         "context (256 tokens) is shorter than the target's max_model_len (1024)")]:
        with pytest.raises(SharpinfError) as e:
            make(model)
        assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
    make(synthetic_model("llama", "Q8_0", n_embd=64, context_length=256), max_model_len=256)  # fits: runs


def test_a_full_draft_pool_gives_no_guesses_never_an_error(monkeypatch):
    """A draft pool too small for every shadow: those without blocks get no guesses that step; the
    outputs are plain decoding's; the draft ends empty."""
    monkeypatch.setattr(draft_mod, "plan_draft_blocks", lambda *a: 9)
    work = greedy_workload(2)[:3]
    plain = run(make(), work)
    eng = make(target())
    d, said = eng.spec.proposer, []
    propose = d.propose
    d.propose = lambda seqs, ks: said.append(propose(seqs, ks)) or said[-1]
    assert run(eng, work) == plain
    assert any(not g for out in said for g in out) and any(g for out in said for g in out)
    assert draft_left(eng) == []


def test_draft_pool_plan():
    """Known target pool (num_blocks, or the emulator's default): no more than it needs beside it; on a
    GPU the draft's share of the usable memory that gives both pools the same tokens; none: refused."""
    from sharpinf.engine.config import EngineConfig
    from sharpinf.engine.kv_budget import WORKSPACE_MARGIN_BYTES, plan_draft_blocks
    from sharpinf.step.kv_pool import kv_bytes_per_slot

    class Fake:
        def __init__(self, mem):
            self.mem = mem

        def memory_info(self):
            return self.mem

    t, d = load_model(target()).config, load_model(small_draft()).config
    ec = EngineConfig(block_size=4, max_num_seqs=6, num_blocks=40)
    assert plan_draft_blocks(Fake(None), d, t, ec, 1024, 3) == 40 + 6 * 2
    assert plan_draft_blocks(Fake(None), d, t, ec, 8, 3) == 6 * 2  # six sequences of 8 tokens
    ec = EngineConfig(block_size=4, max_num_seqs=6)
    assert plan_draft_blocks(Fake(None), d, t, ec, 1024, 3) == 256 + 6 * 2
    per_d, per_t = kv_bytes_per_slot(d, "f16"), kv_bytes_per_slot(t, "f16")
    total = 1 << 30
    free = int(0.1 * total) + WORKSPACE_MARGIN_BYTES + 1000 * 4 * int(per_d + per_t)  # 1000 blocks of both
    n = plan_draft_blocks(Fake((free, total)), d, t, ec, 10**6, 3)
    assert 990 <= n <= 1000, n
    assert plan_draft_blocks(Fake((free, total)), d, t, ec, 40, 3) == 6 * 10  # the sequences' own need
    with pytest.raises(SharpinfError, match="no room for the draft model's KV cache"):
        plan_draft_blocks(Fake((WORKSPACE_MARGIN_BYTES, total)), d, t, ec, 1024, 3)
