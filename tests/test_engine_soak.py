"""Prefix caching under adversarial sharing, and a bounded soak of the whole engine (issue 11).

Prefix caching: prompts built from a small set of blocks -- the same block after different
prefixes, at the same and at other block indices, prompts that are prefixes of others,
partial last blocks, a pool small enough to evict -- give the tokens they give with the
cache off, and the tokens each gives alone.

Soak: >= 500 requests through interleaved streams on a pool ~5% of the demand, ~10% of
them bad, ~10% abandoned mid-way, most sharing prefixes: every good request ends with its
single-user greedy output, each delta once, none lost; every block is free at the end."""

from __future__ import annotations

import functools

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oracles.accounting import check_accounting, ledger
from oracles.engine_oracles import agrees, run_alone
from oracles.scheduler_invariants import watch
from sharpinf.errors import SharpinfError
from sharpinf.llm import LLM
from sharpinf.model.synth import synthetic_model
from sharpinf.params import SamplingParams

GREEDY = SamplingParams(max_tokens=5, ignore_eos=True)
SOAK = SamplingParams(max_tokens=12, ignore_eos=True)  # long enough that decodes outgrow the pool


@functools.cache
def model():
    return synthetic_model("llama", "Q8_0", n_embd=128)


_alone: dict = {}  # prompt -> its lone greedy run (one model for the whole module)


def alone(llm: LLM, prompt: list[int], sp: SamplingParams = GREEDY):
    key = (tuple(prompt), sp)
    if key not in _alone:
        _alone[key] = run_alone(llm.engine.fp.with_own_buffers(), llm.tokenizer, list(prompt), sp, 4)
    return _alone[key]


@st.composite
def shared_prompts(draw):
    bs = 4
    rng = np.random.default_rng(draw(st.integers(0, 2**16), label="seed"))
    blocks = [rng.integers(3, 500, bs).tolist() for _ in range(draw(st.integers(2, 4), label="distinct blocks"))]
    prompts = []
    for _ in range(draw(st.integers(3, 10), label="requests")):
        if prompts and rng.random() < 0.25:  # a prefix of an earlier prompt, or an earlier prompt extended
            base = prompts[int(rng.integers(0, len(prompts)))]
            p = base[: int(rng.integers(1, len(base) + 1))] if rng.random() < 0.5 else base + blocks[0][:3]
        else:
            seq = [blocks[int(rng.integers(0, len(blocks)))] for _ in range(int(rng.integers(1, 6)))]
            p = [t for b in seq for t in b] + rng.integers(3, 500, int(rng.integers(0, bs))).tolist()
        prompts.append(p)
    return prompts, draw(st.integers(0, 6), label="spare blocks"), draw(st.sampled_from([6, 16, 64]), label="budget")


@settings(max_examples=10, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=shared_prompts())
def test_prefix_caching_under_adversarial_sharing_changes_nothing(case):
    prompts, spare, budget = case
    need = max(-(-(len(p) + GREEDY.max_tokens) // 4) for p in prompts)
    outs = {}
    for caching in (True, False):
        llm = LLM(model(), backend="emu", num_blocks=need + spare, block_size=4, max_num_batched_tokens=budget,
                  max_num_seqs=3, enable_prefix_caching=caching)
        eng = llm.engine
        watch(eng)
        counts = ledger(eng)
        rids = [eng.add_request(p, GREEDY) for p in prompts]
        seqs = {r: eng.requests[r] for r in rids}
        while eng.has_unfinished():
            eng.step()
        assert not check_accounting(eng, counts, seqs)
        outs[caching] = [seqs[r].output_ids for r in rids]
    assert outs[True] == outs[False]
    for p, got in zip(prompts, outs[True]):
        ok, note = agrees(got, alone(llm, p))
        assert ok, note


def test_soak_500_requests_none_lost():
    rng = np.random.default_rng(11)
    families = [rng.integers(3, 500, int(rng.integers(8, 24))).tolist() for _ in range(12)]
    good = []
    for _ in range(40):  # distinct good prompts, most extending a shared family prefix
        fam = families[int(rng.integers(0, len(families)))]
        tail = rng.integers(3, 500, int(rng.integers(0, 9))).tolist()
        good.append(fam[: int(rng.integers(4, len(fam) + 1))] + tail if rng.random() < 0.8 else tail + [7])
    bad = [[], [1, 99999], [5] * 1030, [-3]]
    plan = []  # (prompt, kind): kind "good", "bad" or "abandon" (closed after a few deltas)
    for i in range(520):
        r = rng.random()
        if r < 0.1:
            plan.append((bad[i % len(bad)], "bad"))
        elif r < 0.2:
            plan.append((good[int(rng.integers(0, len(good)))], "abandon"))
        else:
            plan.append((good[int(rng.integers(0, len(good)))], "good"))
    demand = sum(len(p) + SOAK.max_tokens for p, k in plan if k != "bad")
    blocks = max(int(0.05 * demand / 4), max(-(-(len(p) + SOAK.max_tokens) // 4) for p in good))
    llm = LLM(model(), backend="emu", num_blocks=blocks, block_size=4, max_num_batched_tokens=64, max_num_seqs=64)
    watch(llm.engine)

    live: dict[int, object] = {}
    got: dict[int, list] = {}
    rejected = 0
    arrived = 0
    while arrived < len(plan) or live:
        for _ in range(48):  # new requests arrive in waves
            if arrived < len(plan):
                prompt, kind = plan[arrived]
                try:
                    live[arrived] = llm.stream(prompt, SOAK)  # queued now; deltas as it is advanced
                    got[arrived] = []
                except SharpinfError:
                    assert kind == "bad"
                    rejected += 1
                arrived += 1
        for i in list(live):  # every live stream advanced in turn
            prompt, kind = plan[i]
            if got[i] and got[i][-1].finished:
                del live[i]
                continue
            if kind == "abandon" and len(got[i]) >= 2:
                live.pop(i).close()  # the consumer walks away: the request is aborted, its blocks freed
                continue
            try:
                got[i].append(next(live[i]))
            except StopIteration:
                del live[i]
    assert rejected == sum(1 for _, k in plan if k == "bad")
    for i, (prompt, kind) in enumerate(plan):
        if kind != "good":
            continue
        deltas = got[i]
        assert deltas[-1].finished and sum(d.finished for d in deltas) == 1, i
        tokens = [t for d in deltas for t in d.new_token_ids]
        assert tokens == deltas[-1].token_ids  # each delta once, in order
        ok, note = agrees(tokens, alone(llm, prompt, SOAK))
        assert ok, (i, note)
    eng = llm.engine
    assert eng.blocks.num_free == eng.blocks.num_blocks and not any(eng.blocks.ref) and not eng.requests
    m = llm.metrics()
    assert m["rejected"] == rejected and m["preemptions"] > 0
