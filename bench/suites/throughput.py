"""Throughput: N requests with random prompt/output lengths and Poisson arrivals through the engine.

Arrivals are a Poisson process in requests per engine step (deterministic on any machine)
or per second (wall clock). Reports output and total tokens/s, TTFT and inter-token
latency (mean, p50, p99), preemptions, the prefix-cache hit rate and KV pool usage.
A shared prefix on every prompt (--shared-prefix) gives the prefix cache something to hit.
"""

from __future__ import annotations

import math
import time
from collections import deque

import numpy as np
from rich.table import Table

from bench.suites.common import (BenchContext, envelope, fmt_ms, fmt_rate, latency_cdf, pyplot, random_prompt,
                                   save_fig, stats, title_of)

SUITE = "throughput"


def defaults(on_gpu: bool, quick: bool) -> dict:
    if on_gpu:
        d = dict(requests=256, prompt_len=(64, 512), output_len=(32, 256), rate=4.0, rate_unit="step",
                 shared_prefix=64, max_num_batched_tokens=1024, max_num_seqs=64, num_blocks=None)
        if quick:
            d.update(requests=48, output_len=(16, 64))
        return d
    d = dict(requests=32, prompt_len=(16, 64), output_len=(8, 32), rate=1.0, rate_unit="step",
             shared_prefix=16, max_num_batched_tokens=128, max_num_seqs=16, num_blocks=96)
    if quick:
        d.update(requests=8, prompt_len=(8, 24), output_len=(4, 8), rate=2.0, max_num_batched_tokens=64, num_blocks=32)
    return d


def _warm(ctx: BenchContext) -> None:
    """Compile every kernel the engine uses (sampling included) in a throwaway small engine."""
    from sharpinf.engine.llm_engine import LLMEngine
    from sharpinf.params import SamplingParams

    eng = LLMEngine(ctx.model, backend=ctx.backend, kernels=ctx.kernels, num_blocks=8, max_num_batched_tokens=64)
    eng.add_request(random_prompt(np.random.default_rng(12345), 8, ctx.model.config.n_vocab),
                    SamplingParams(max_tokens=2, ignore_eos=True))
    while eng.has_unfinished():
        eng.step()
    del eng
    ctx.release()


def run(ctx: BenchContext, requests: int, prompt_len: tuple[int, int], output_len: tuple[int, int], rate: float,
        rate_unit: str, shared_prefix: int, max_num_batched_tokens: int, max_num_seqs: int,
        num_blocks: int | None) -> dict:
    from sharpinf.engine.llm_engine import LLMEngine
    from sharpinf.params import SamplingParams

    cfg = ctx.model.config
    rng = np.random.default_rng(ctx.seed)
    hi_total = shared_prefix + prompt_len[1] + output_len[1]
    if hi_total >= cfg.context_length:
        raise ValueError(f"prompt + output up to {hi_total} tokens exceeds the context length {cfg.context_length}")
    prefix = random_prompt(rng, shared_prefix, cfg.n_vocab)
    plens = rng.integers(prompt_len[0], prompt_len[1] + 1, size=requests)
    olens = rng.integers(output_len[0], output_len[1] + 1, size=requests)
    gaps = rng.exponential(1.0 / rate, size=requests) if rate > 0 and math.isfinite(rate) else np.zeros(requests)
    arrivals = np.cumsum(gaps) - gaps[0]  # the first request arrives at 0
    work = deque((float(a), prefix + random_prompt(rng, int(p), cfg.n_vocab), int(o))
                 for a, p, o in zip(arrivals, plens, olens))
    engine_config = dict(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                         num_blocks=num_blocks, enable_prefix_caching=True, enable_chunked_prefill=True)
    _warm(ctx)
    eng = LLMEngine(ctx.model, backend=ctx.backend, kernels=ctx.kernels, **engine_config)

    rids: list[str] = []
    timeline = []  # per step: (t, tokens run, running, waiting, kv usage)
    step_i, t0 = 0, time.perf_counter()
    with ctx.progress() as bar:
        task = bar.add_task(f"{SUITE}: {requests} requests", total=requests)
        while work or eng.has_unfinished():
            clock = step_i if rate_unit == "step" else time.perf_counter() - t0
            while work and work[0][0] <= clock:
                a, prompt, out = work.popleft()
                rid = eng.add_request(prompt, SamplingParams(max_tokens=out, ignore_eos=True))
                if rate_unit == "s":  # it arrived at its scheduled time, not when this loop noticed it
                    eng.requests[rid].metrics.arrival = min(eng.requests[rid].metrics.arrival, t0 + a)
                rids.append(rid)
            if not eng.has_unfinished():  # idle until the next arrival
                if rate_unit == "step":
                    step_i = max(step_i + 1, math.ceil(work[0][0]))
                else:
                    time.sleep(max(0.0, work[0][0] - (time.perf_counter() - t0)))
                continue
            before = eng.metrics.tokens_computed
            eng.step()
            step_i += 1
            timeline.append((time.perf_counter() - t0, eng.metrics.tokens_computed - before, len(eng.scheduler.running),
                             len(eng.scheduler.waiting), eng.blocks.usage))
            bar.update(task, completed=eng.metrics.finished)
    ctx.backend.synchronize()
    seqs = [eng.requests[r] for r in rids]
    first_arrival = min(s.metrics.arrival for s in seqs)
    last_finish = max(s.metrics.finished or s.metrics.arrival for s in seqs)
    elapsed = last_finish - first_arrival
    gen = sum(len(s.output_ids) for s in seqs)
    prompt_toks = sum(len(s.prompt_ids) for s in seqs)
    ttft = [s.metrics.first_token - s.metrics.arrival for s in seqs if s.metrics.first_token is not None]
    itl = [b - a for s in seqs for a, b in zip(s.metrics.token_times, s.metrics.token_times[1:])]
    e2e = [s.metrics.finished - s.metrics.arrival for s in seqs if s.metrics.finished is not None]
    usage = [u for *_, u in timeline]
    results = {
        "requests": len(seqs),
        "finished": sum(1 for s in seqs if s.finish_reason in ("length", "stop")),
        "steps": len(timeline),
        "elapsed_s": elapsed,
        "prompt_tokens": prompt_toks,
        "generated_tokens": gen,
        "tokens_computed": eng.metrics.tokens_computed,  # prompt + decode, recomputation after preemption included
        "output_tok_per_s": gen / elapsed if elapsed > 0 else None,
        "total_tok_per_s": (gen + prompt_toks) / elapsed if elapsed > 0 else None,
        "ttft_s": stats(ttft),
        "itl_s": stats(itl),
        "e2e_s": stats(e2e),
        "preemptions": eng.scheduler.preemptions,
        "prefix_cache_hit_rate": eng.blocks.hit_rate,
        "cached_prompt_tokens": sum(s.metrics.cached_prompt_tokens for s in seqs),
        "kv_blocks": eng.budget.num_blocks,
        "kv_budget": eng.budget.to_json(),
        "kv_usage_mean": float(np.mean(usage)) if usage else 0.0,
        "kv_usage_max": float(np.max(usage)) if usage else 0.0,
        "per_request": [{"prompt_tokens": len(s.prompt_ids), "output_tokens": len(s.output_ids),
                         **s.metrics.to_json()} for s in seqs],
        "timeline": [{"t_s": t, "tokens": n, "running": r, "waiting": w, "kv_usage": u} for t, n, r, w, u in timeline],
        "samples": {"ttft_s": ttft, "itl_s": itl},
    }
    config = dict(requests=requests, prompt_len=list(prompt_len), output_len=list(output_len), rate=rate,
                  rate_unit=rate_unit, shared_prefix=shared_prefix, engine=engine_config, seed=ctx.seed)
    del eng
    ctx.release()
    return envelope(ctx, SUITE, config, results)


def table(doc: dict) -> Table:
    r = doc["results"]
    t = Table("metric", "value", title=f"throughput: {r['requests']} requests, {r['steps']} steps, {r['elapsed_s']:.2f} s")
    t.add_row("output tok/s", fmt_rate(r["output_tok_per_s"]))
    t.add_row("total tok/s (prompt + output)", fmt_rate(r["total_tok_per_s"]))
    t.add_row("prompt / generated tokens", f"{r['prompt_tokens']:,} / {r['generated_tokens']:,}")
    for key, name in (("ttft_s", "TTFT"), ("itl_s", "inter-token latency"), ("e2e_s", "end-to-end")):
        s = r[key]
        t.add_row(f"{name} mean / p50 / p99 (ms)", f"{fmt_ms(s['mean'])} / {fmt_ms(s['p50'])} / {fmt_ms(s['p99'])}")
    t.add_row("preemptions", str(r["preemptions"]))
    t.add_row("prefix-cache hit rate", f"{r['prefix_cache_hit_rate']:.1%}")
    t.add_row("KV usage mean / max", f"{r['kv_usage_mean']:.1%} / {r['kv_usage_max']:.1%} of {r['kv_blocks']} blocks")
    return t


def plot(doc: dict, path) -> object | None:
    plt = pyplot()
    if plt is None:
        return None
    r = doc["results"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    latency_cdf(axes[0], r["samples"]["ttft_s"], "TTFT", "requests")
    latency_cdf(axes[1], r["samples"]["itl_s"], "inter-token latency", "tokens")
    tl = r["timeline"]
    ax = axes[2]
    ts = [p["t_s"] for p in tl]
    ax.plot(ts, [p["running"] for p in tl], label="running", color="tab:blue")
    ax.plot(ts, [p["waiting"] for p in tl], label="waiting", color="tab:orange")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("sequences")
    ax2 = ax.twinx()
    ax2.plot(ts, [100 * p["kv_usage"] for p in tl], label="KV usage", color="tab:green", alpha=0.7)
    ax2.set_ylabel("KV usage (%)")
    ax2.set_ylim(0, 105)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="upper right")
    ax.set_title(f"load: {fmt_rate(r['output_tok_per_s'])} output tok/s")
    fig.suptitle(title_of(doc), fontsize=10)
    return save_fig(plt, fig, path)
