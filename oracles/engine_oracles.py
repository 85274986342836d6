"""The engine's oracles: continuous batching must not change what a request gets.

(f) engine-vs-single-user   greedy tokens under random arrivals, budgets and pool sizes equal
                            each request run alone through the same forward pass, token for
                            token (logits are bit-identical, so near-ties break alike)
(g) preemption              a pool ~5% of the demand, >= 200 requests: all finish, none lost or
                            duplicated, outputs as in (f), preemptions counted
(h) prefix-caching          the same outputs with and without the prefix cache; hits counted
(i) seeded-sampling         the same seed gives the same tokens alone and in a busy batch
Each also holds the engine to the accounting oracle (oracles/accounting.py) over its run: every
prompt token the prefix cache did not serve and every fed token computed exactly once (a
preemption's recomputation aside), the engine's own count of that work right, every block back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oracles.accounting import accounted
from oracles.compare import OracleResult
from oracles.paged_runner import PagedRunner
from sharpinf.step.forward import ForwardPass
from sharpinf.step.kv_pool import KVPool
from sharpinf.params import SamplingParams
from sharpinf.textgen import GenerationResult, StopChecker


@dataclass
class LoneRun:
    tokens: list[int]
    gaps: list[float]  # top-1 minus top-2 logit at each generated position


def run_alone(fp: ForwardPass, tokenizer, prompt: list[int], params: SamplingParams, block_size: int = 16) -> LoneRun:
    """Greedy, one sequence, a fresh pool: prefill whole, then one token per step."""
    n_max = len(prompt) + (params.max_tokens or fp.cfg.context_length)
    pool = KVPool(fp.backend, fp.cfg, num_blocks=-(-n_max // block_size) + 1, block_size=block_size)
    run = PagedRunner(fp, pool)
    sid = run.new_seq()
    stop = StopChecker(params, tokenizer, context_left=fp.cfg.context_length - len(prompt))
    logits = run.step([(sid, list(prompt))])[0][-1]
    tokens, gaps = [], []
    for _ in range(n_max):  # the stop rules end it by max_tokens or the context: never loop past that
        if not np.isfinite(logits).all():  # argmax of NaN is 0 on both sides: it must not agree its way through
            raise AssertionError(f"non-finite logits alone at generated token {len(tokens)} "
                                 f"({int((~np.isfinite(logits)).sum())} of {logits.size})")
        top2 = np.sort(logits)[-2:]
        gaps.append(float(top2[1] - top2[0]))
        tok = int(np.argmax(logits))
        tokens.append(tok)
        if stop.add(tok):
            return LoneRun(tokens, gaps)
        logits = run.step([(sid, [tok])])[0][-1]
    raise AssertionError(f"run_alone: {n_max} tokens and the stop rules never ended the request")


def agrees(got: list[int], lone: LoneRun) -> tuple[bool, str]:
    """Token for token equal: a request's logits are bit-identical whatever else runs beside it
    (batch invariance), so even a near-tie must break the same way as alone."""
    for i, (a, b) in enumerate(zip(got, lone.tokens)):
        if a != b:
            return False, f"token {i}: engine {a} vs alone {b} (top-2 gap alone {lone.gaps[i]:.3g})"
    if len(got) != len(lone.tokens):
        return False, f"length {len(got)} vs alone {len(lone.tokens)}"
    return True, ""


def _failed(r: OracleResult, accounting: list[str]) -> OracleResult:
    """r, failed with the accounting oracle's first problems when it has any."""
    if not accounting:
        return r
    why = f"accounting: {'; '.join(accounting[:3])}" + (f" (+{len(accounting) - 3} more)" if len(accounting) > 3 else "")
    return OracleResult(r.oracle, r.case, None, None, None, False, why if r.passed else f"{r.detail}; {why}")


def check_against_alone(name: str, case: str, llm, prompts, params, results, lone_cache=None) -> OracleResult:
    """Every request's tokens vs its lone run; none lost, none duplicated."""
    lone_cache = {} if lone_cache is None else lone_cache
    fp, tok = llm.engine.fp.with_own_buffers(), llm.engine.tokenizer
    bad = []
    if len(results) != len(prompts) or any(r is None for r in results):
        return OracleResult(name, case, None, None, None, False, "a request was lost")
    for i, (p, sp, r) in enumerate(zip(prompts, params, results)):
        if r.finish_reason in ("rejected", "aborted", None):
            bad.append(f"request {i} ended {r.finish_reason}: {r.error}")
            continue
        key = (tuple(p), sp)
        if key not in lone_cache:
            try:
                lone_cache[key] = run_alone(fp, tok, list(p), sp, llm.engine.config.block_size)
            except AssertionError as exc:
                bad.append(f"request {i}: {exc}")
                continue
        ok, note = agrees(r.token_ids, lone_cache[key])
        if not ok:
            bad.append(f"request {i}: {note}")
    m = llm.metrics()
    detail = "; ".join(bad[:3]) if bad else f"{m['preemptions']} preemptions, every token as alone"
    return OracleResult(name, case, None, None, None, not bad, detail)


def oracle_engine_vs_single_user(llm, prompts, params, arrivals) -> OracleResult:
    """arrivals[i]: the engine step before which request i is added (0 = before the first)."""
    results = [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: arrivals[i])
    eng, rid_of = llm.engine, {}

    def run():
        at = step = 0
        while at < len(order) or eng.has_unfinished():
            while at < len(order) and arrivals[order[at]] <= step:
                i = order[at]
                rid_of[eng.add_request(list(prompts[i]), params[i])] = i
                at += 1
            eng.step()
            step += 1
    _, accounting = accounted(eng, run)
    for rid, i in rid_of.items():
        seq = eng.requests.pop(rid)
        results[i] = GenerationResult(seq.prompt_ids, seq.output_ids, seq.stop.text, seq.finish_reason)
    cfg = eng.config
    case = (f"{len(prompts)} requests, budget {cfg.max_num_batched_tokens}, pool {eng.budget.num_blocks}x"
            f"{cfg.block_size}, max_seqs {cfg.max_num_seqs}")
    return _failed(check_against_alone("engine-vs-single-user", case, llm, prompts, params, results), accounting)


def oracle_preemption(llm, prompts, params, lone_cache=None) -> OracleResult:
    results, accounting = accounted(llm.engine, lambda: llm.generate([list(p) for p in prompts], params))
    demand = sum(len(p) + sp.max_tokens for p, sp in zip(prompts, params))
    eng = llm.engine
    case = f"{len(prompts)} requests, pool {eng.budget.tokens} tokens = {eng.budget.tokens / demand:.0%} of demand"
    r = _failed(check_against_alone("preemption", case, llm, prompts, params, results, lone_cache), accounting)
    if r.passed and eng.scheduler.preemptions == 0:
        return OracleResult(r.oracle, r.case, None, None, None, False, "no preemption happened: the pool was not tight")
    return r


def oracle_prefix_caching(llm_cached, llm_plain, prompts, params) -> OracleResult:
    a, acc_a = accounted(llm_cached.engine, lambda: llm_cached.generate([list(p) for p in prompts], params))
    b, acc_b = accounted(llm_plain.engine, lambda: llm_plain.generate([list(p) for p in prompts], params))
    same = all(x.token_ids == y.token_ids for x, y in zip(a, b))
    rate = llm_cached.metrics()["prefix_cache_hit_rate"]
    ok = same and rate > 0
    detail = f"hit rate {rate:.0%}" if ok else ("outputs differ" if not same else "no prefix-cache hit")
    r = OracleResult("prefix-caching", f"{len(prompts)} requests sharing a prefix", None, None, None, ok, detail)
    return _failed(r, acc_a + acc_b)


def oracle_seeded_sampling(llm, prompt, params: SamplingParams, busy_prompts, busy_params) -> OracleResult:
    def run():
        alone = llm.generate([list(prompt)], [params])[0].token_ids
        mixed = llm.generate([list(p) for p in busy_prompts] + [list(prompt)], list(busy_params) + [params])[-1].token_ids
        return alone, mixed
    (alone, mixed), accounting = accounted(llm.engine, run)
    ok = alone == mixed and len(alone) > 0
    r = OracleResult("seeded-sampling", f"seed {params.seed}, T={params.temperature}, alone vs {len(busy_prompts)} others",
                     None, None, None, ok, "" if ok else f"{alone} != {mixed}")
    return _failed(r, accounting)
