"""The speculative-vs-plain oracle: speculation changes how many target passes a request takes,
never what it gets.

The same workload -- requests arriving over the first steps, so guesses are verified beside other
requests' prefill chunks and decodes; greedy, seeded and penalised ones, logprobs, a stop string --
runs through an engine without speculation and one with it. Every request's token ids, finish
reason, text and logprobs (each value and its top list) must be equal, bit for bit: a verified
position's logits are the ones plain decoding computes (batch invariance), and each row's draw is
keyed as plain decoding keys it. The speculating run is held to the accounting oracle too (every
position computed once, but for the guesses it rolled back; every block back), and must have both
kept and rejected guesses: a run that never speculated, or never rolled back, proves nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oracles.accounting import accounted
from oracles.compare import OracleResult
from sharpinf.params import SamplingParams

NAME = "speculative-vs-plain"


@dataclass
class Arrival:
    step: int  # the engine step before which it is added
    prompt: list[int]
    params: SamplingParams


def standard_workload(n_vocab: int, seed: int = 0) -> list[Arrival]:
    """Repetitive prompts (so the n-gram proposer has matches), greedy and seeded, arriving while
    others run; one penalised request (it decodes plainly beside the speculating ones)."""
    rng = np.random.default_rng(seed)
    hi = min(n_vocab, 400)
    motif = rng.integers(3, hi, 5).tolist()
    other = rng.integers(3, hi, 7).tolist()
    return [
        Arrival(0, motif * 4, SamplingParams(max_tokens=24, ignore_eos=True)),
        Arrival(0, rng.integers(3, hi, 9).tolist() + motif * 2,
                SamplingParams(max_tokens=20, temperature=0.8, seed=11, logprobs=2, ignore_eos=True)),
        Arrival(2, other * 3, SamplingParams(max_tokens=18, ignore_eos=True, logprobs=1)),
        Arrival(3, motif * 3 + other, SamplingParams(max_tokens=16, temperature=0.6, top_p=0.9, seed=5,
                                                      ignore_eos=True)),
        Arrival(5, rng.integers(3, hi, 20).tolist(),  # a long prompt: prefill chunks beside the verifications
                SamplingParams(max_tokens=12, ignore_eos=True)),
        Arrival(6, other * 2, SamplingParams(max_tokens=10, repetition_penalty=1.3, seed=2, temperature=0.7,
                                             ignore_eos=True)),
    ]


def run_workload(engine, workload: list[Arrival]) -> tuple[dict, list[str]]:
    """Drive the engine step by step, adding each request at its step; per request (ids, finish
    reason, text, logprobs as tuples), and the accounting oracle's problems over the run."""
    def run():
        ids, step = [], 0
        pending = sorted(workload, key=lambda a: a.step)
        while pending or engine.has_unfinished():
            while pending and pending[0].step <= step:
                a = pending.pop(0)
                ids.append(engine.add_request(a.prompt, a.params))
            engine.step()
            step += 1
        return ids

    ids, problems = accounted(engine, run)
    out = {}
    for rid in ids:
        for s in engine.requests[rid].choices or [engine.requests[rid]]:  # n > 1: every choice
            out[s.key] = (list(s.output_ids), s.finish_reason, s.stop.text)
    return out, problems


def outputs_with_logprobs(engine, workload: list[Arrival]) -> tuple[dict, list[str]]:
    """As run_workload, with every new token's logprobs gathered from the step outputs."""
    lps: dict[str, list] = {}
    step_fn = engine.step

    def stepping():
        outs = step_fn()
        for o in outs:
            key = o.request_id if not o.index else f"{o.request_id}#{o.index}"
            for lp in o.new_logprobs or ():
                lps.setdefault(key, []).append((lp.token_id, lp.logprob, tuple(lp.top)))
        return outs

    engine.step = stepping
    try:
        out, problems = run_workload(engine, workload)
    finally:
        del engine.step
    return {rid: v + (tuple(lps.get(rid, ())),) for rid, v in out.items()}, problems


def oracle_speculative_vs_plain(make_engine, workload: list[Arrival], case: str, speculative="ngram") -> OracleResult:
    """make_engine(speculative) -> a fresh LLMEngine; the plain run and the speculating run compared."""
    plain, p_problems = outputs_with_logprobs(make_engine(None), workload)
    eng = make_engine(speculative)
    spec, s_problems = outputs_with_logprobs(eng, workload)
    m = eng.engine_metrics()["speculative"]
    detail, passed = [], True
    bad = [(who, rid) for who, run in (("plain", plain), ("speculative", spec)) for rid, v in run.items()
           if not all(np.isfinite(lp) and all(np.isfinite(x) for _, x in top) for _, lp, top in v[3])]
    if bad:  # equal NaN on both sides proves nothing
        passed = False
        detail.append(f"non-finite logprobs in the {bad[0][0]} run (request {bad[0][1]})")
    for rid in plain:
        a, b = plain[rid], spec[rid]
        if a == b:
            continue
        passed = False
        what = ["token ids", "finish reason", "text", "logprobs"]
        bad = [w for w, x, y in zip(what, a, b) if x != y]
        at = next((i for i, (x, y) in enumerate(zip(a[0], b[0])) if x != y), min(len(a[0]), len(b[0])))
        detail.append(f"request {rid}: {', '.join(bad)} differ (first token difference at {at})")
        break
    rejected = m["draft_tokens"] - m["accepted_tokens"]
    if passed and (m["accepted_tokens"] == 0 or rejected == 0):
        passed = False
        detail.append(f"vacuous: {m['accepted_tokens']} guesses kept, {rejected} rejected (both must happen)")
    for who, probs in (("plain", p_problems), ("speculative", s_problems)):
        if probs:
            passed = False
            detail.append(f"accounting ({who}): {probs[0]}" + (f" (+{len(probs) - 1} more)" if len(probs) > 1 else ""))
    n_tok = sum(len(v[0]) for v in plain.values())
    summary = (f"{len(plain)} requests, {n_tok} tokens; {m['verify_chunks']} verifications, "
               f"{m['accepted_tokens']}/{m['draft_tokens']} guesses kept, "
               f"{m['target_passes_per_token']:.2f} target passes a token")
    return OracleResult(NAME, case, None, None, None, passed, "; ".join(detail) or summary)


def speculative_cases(model, backend, choices, kv_dtypes) -> list:
    """verify's cases: the oracle on each kernel choice, the KV dtypes taken in turn (CUDA graphs
    on, as the engine runs by default), a small pool and budget so verifications share steps with
    prefill chunks."""
    from oracles.foundation import OracleCase
    from sharpinf.engine.llm_engine import LLMEngine

    work = standard_workload(model.config.n_vocab)
    cases = []
    for i, spec in enumerate(choices):
        kv = kv_dtypes[i % len(kv_dtypes)]

        def make(speculative, spec=spec, kv=kv):
            return LLMEngine(model, backend=backend, kernels=spec, kv_dtype=kv, num_blocks=64, block_size=16,
                             max_num_batched_tokens=16, max_num_seqs=6, max_model_len=min(256, model.config.context_length),
                             speculative=speculative)

        label = spec if isinstance(spec, str) else ",".join(f"{k}={v}" for k, v in spec.items())
        cases.append(OracleCase(NAME, f"ngram k=4, KV {kv}, kernels {label}",
                                lambda make=make, kv=kv, label=label: oracle_speculative_vs_plain(
                                    make, work, f"ngram k=4, KV {kv}, kernels {label}")))
    return cases
