"""Serve: a bounded load generator against `sharpinf serve` on loopback.

A server over the bench's model starts in this process (127.0.0.1, a free port); N streaming
completion requests (token-id prompts, lengths drawn from ranges, ignore_eos) go at a fixed
concurrency C through httpx, and the run stops by itself when all N are answered. Reported the
way vLLM's serving benchmark prints them, so the numbers compare: request throughput, output and
total tokens/s, TTFT, TPOT (time per output token after the first), ITL (gaps between streamed
tokens), end-to-end latency (mean, p50, p90, p99), and failures.

Then the same requests again with structured output (a JSON schema through llguidance; a
request ends when its document does, else at its max_tokens): its numbers beside the plain
run's, and the ratios of TPOT and output tok/s, which are the cost of the per-step mask (its
computation on the host and the masked sampling rows).
"""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
from rich.table import Table

from bench.suites.common import (BenchContext, envelope, fmt_ms, fmt_rate, latency_cdf, pyplot, random_prompt,
                                   save_fig, title_of)

SUITE = "serve"
# the structured run's schema: a list of records, so a document can run as long as the output
STRUCTURED = {"type": "json_schema", "json_schema": {"name": "records", "schema": {
    "type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
                               "required": ["id", "name"]}}}}


def defaults(on_gpu: bool, quick: bool) -> dict:
    if on_gpu:
        d = dict(requests=200, concurrency=32, prompt_len=(64, 512), output_len=(32, 256), max_num_seqs=64,
                 max_num_batched_tokens=1024, num_blocks=None)
        if quick:
            d.update(requests=48, output_len=(16, 64))
        return d
    d = dict(requests=32, concurrency=8, prompt_len=(8, 48), output_len=(4, 24), max_num_seqs=16,
             max_num_batched_tokens=128, num_blocks=96)
    if quick:
        d.update(requests=12, concurrency=4, output_len=(2, 6))
    return d


def _pcts(xs) -> dict:
    xs = [float(x) for x in xs]
    if not xs:
        return {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None}
    return {"n": len(xs), "mean": float(np.mean(xs)), "p50": float(np.percentile(xs, 50)),
            "p90": float(np.percentile(xs, 90)), "p99": float(np.percentile(xs, 99))}


async def _one(h, prompt: list[int], n_out: int, rec: dict, extra: dict) -> None:
    body = {"prompt": prompt, "max_tokens": n_out, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, **extra}
    t0 = time.perf_counter()
    rec.update(start=t0, times=[], ok=False, output_tokens=0, error=None)
    try:
        async with h.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                rec["error"] = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    rec["error"] = chunk["error"]["message"]
                    return
                if chunk.get("choices"):
                    rec["times"].append(time.perf_counter())
                if chunk.get("usage"):
                    rec["output_tokens"] = chunk["usage"]["completion_tokens"]
                    rec["prompt_tokens"] = chunk["usage"]["prompt_tokens"]
        rec["ok"] = rec["error"] is None
    except Exception as exc:  # a failure is counted, never fatal to the run
        rec["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        rec["end"] = time.perf_counter()


def run(ctx: BenchContext, requests: int, concurrency: int, prompt_len: tuple[int, int], output_len: tuple[int, int],
        max_num_seqs: int, max_num_batched_tokens: int, num_blocks: int | None) -> dict:
    import httpx

    from bench.suites.throughput import _warm
    from sharpinf.engine.llm_engine import LLMEngine
    from sharpinf.serve.loopback import LoopbackServer

    cfg = ctx.model.config
    if prompt_len[1] + output_len[1] >= cfg.context_length:
        raise ValueError(f"prompt + output up to {prompt_len[1] + output_len[1]} tokens exceeds the context length")
    rng = np.random.default_rng(ctx.seed)
    jobs = [(random_prompt(rng, int(rng.integers(prompt_len[0], prompt_len[1] + 1)), cfg.n_vocab),
             int(rng.integers(output_len[0], output_len[1] + 1))) for _ in range(requests)]
    engine_config = dict(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                         num_blocks=num_blocks, kernels=ctx.kernels)
    _warm(ctx)

    async def main(url: str, recs: list[dict], extra: dict, what: str, jobs=jobs) -> None:
        sem = asyncio.Semaphore(concurrency)
        done = [0]

        async def go(job, rec, h, bar, task):
            async with sem:
                await _one(h, job[0], job[1], rec, extra)
            done[0] += 1
            bar.update(task, completed=done[0])

        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as h:
            with ctx.progress() as bar:
                task = bar.add_task(f"{SUITE}: {len(jobs)} {what}requests at concurrency {concurrency}", total=len(jobs))
                await asyncio.gather(*(go(j, r, h, bar, task) for j, r in zip(jobs, recs)))

    def engine() -> LLMEngine:
        e = LLMEngine(ctx.model, backend=ctx.backend, **engine_config)
        e.grammars.prepare()  # llguidance's tokenizer outside the timed runs
        return e

    runs = {}
    kinds = (("plain", {}), ("structured", {"response_format": STRUCTURED}))
    with LoopbackServer(engine, "bench") as server:
        warm = jobs[:concurrency]  # untimed: every step shape both runs meet is recorded before either is timed
        for name, extra in kinds:
            asyncio.run(main(server.url, [dict() for _ in warm], extra, f"warm-up {name} ", warm))
        for name, extra in kinds:
            recs = [dict() for _ in jobs]
            t0 = time.perf_counter()
            asyncio.run(main(server.url, recs, extra, "structured " if extra else ""))
            runs[name] = _metrics(recs, requests, time.perf_counter() - t0)
        clean = server.idle(30)
    results = dict(runs["plain"], server_idle_after=clean)  # every request ended and every KV block free
    st = runs["structured"]
    st.pop("samples")
    results["structured"] = st
    results["structured_vs_plain"] = {
        "tpot_ratio": _ratio(st["tpot_s"]["mean"], results["tpot_s"]["mean"]),
        "output_tok_per_s_ratio": _ratio(st["output_tok_per_s"], results["output_tok_per_s"])}
    config = dict(requests=requests, concurrency=concurrency, prompt_len=list(prompt_len), output_len=list(output_len),
                  engine=engine_config, seed=ctx.seed, client="httpx, streaming /v1/completions, token-id prompts")
    ctx.release()
    return envelope(ctx, SUITE, config, results)


def _ratio(a, b) -> float | None:
    return None if a is None or not b else a / b


def _metrics(recs: list[dict], requests: int, elapsed: float) -> dict:
    ok = [r for r in recs if r["ok"]]
    out_toks = sum(r["output_tokens"] for r in ok)
    in_toks = sum(r.get("prompt_tokens", 0) for r in ok)
    ttft = [r["times"][0] - r["start"] for r in ok if r["times"]]
    itl = [b - a for r in ok for a, b in zip(r["times"], r["times"][1:])]
    tpot = [(r["end"] - r["times"][0]) / (r["output_tokens"] - 1) for r in ok if r["times"] and r["output_tokens"] > 1]
    e2e = [r["end"] - r["start"] for r in ok]
    return {
        "requests": requests, "completed": len(ok), "failed": requests - len(ok),
        "failures": [r["error"] for r in recs if not r["ok"]][:20],
        "duration_s": elapsed,
        "request_throughput_per_s": len(ok) / elapsed,
        "output_tok_per_s": out_toks / elapsed,
        "total_tok_per_s": (out_toks + in_toks) / elapsed,
        "prompt_tokens": in_toks, "output_tokens": out_toks,
        "ttft_s": _pcts(ttft), "tpot_s": _pcts(tpot), "itl_s": _pcts(itl), "e2e_s": _pcts(e2e),
        "samples": {"ttft_s": ttft, "itl_s": itl},
    }


def table(doc: dict) -> Table:
    r, c = doc["results"], doc["config"]
    t = Table("metric", "value", title=f"serve: {r['completed']}/{r['requests']} requests at concurrency "
                                       f"{c['concurrency']}, {r['duration_s']:.2f} s")
    t.add_row("failed requests", str(r["failed"]))
    t.add_row("request throughput (req/s)", f"{r['request_throughput_per_s']:.2f}")
    t.add_row("output tok/s", fmt_rate(r["output_tok_per_s"]))
    t.add_row("total tok/s (prompt + output)", fmt_rate(r["total_tok_per_s"]))
    for key, name in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "end-to-end")):
        s = r[key]
        t.add_row(f"{name} mean / p50 / p90 / p99 (ms)",
                  " / ".join(fmt_ms(s[k]) for k in ("mean", "p50", "p90", "p99")))
    st, vs = r.get("structured"), r.get("structured_vs_plain", {})
    if st is not None:
        t.add_row("structured (JSON schema): failed requests", str(st["failed"]))
        t.add_row("structured: output tok/s (x plain)",
                  f"{fmt_rate(st['output_tok_per_s'])} ({_fmt_x(vs.get('output_tok_per_s_ratio'))})")
        t.add_row("structured: TPOT mean (ms) (x plain)",
                  f"{fmt_ms(st['tpot_s']['mean'])} ({_fmt_x(vs.get('tpot_ratio'))})")
        t.add_row("structured: output tokens (plain)", f"{st['output_tokens']} ({r['output_tokens']})")
    t.add_row("server idle after (all blocks free)", str(r["server_idle_after"]))
    return t


def _fmt_x(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def plot(doc: dict, path) -> object | None:
    plt = pyplot()
    if plt is None:
        return None
    r = doc["results"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    latency_cdf(axes[0], r["samples"]["ttft_s"], "TTFT", "requests")
    latency_cdf(axes[1], r["samples"]["itl_s"], "ITL", "token gaps")
    fig.suptitle(f"{title_of(doc)}: {r['request_throughput_per_s']:.2f} req/s, "
                 f"{fmt_rate(r['output_tok_per_s'])} output tok/s, {r['failed']} failed", fontsize=10)
    return save_fig(plt, fig, path)
