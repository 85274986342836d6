"""Inter-token latency of decoding sequences while a long prompt arrives, chunked prefill on vs off.

D sequences are decoding; after a few steps a prompt of `long_mult` x the token budget
arrives. With chunked prefill the prompt is fed a budget-sized chunk per step alongside
the decodes, so every step stays about the same size; without it the prompt runs whole in
one step, and every decoder waits for that step: one long gap in its token stream.
The price of chunking is the long prompt's own time to first token (more, smaller steps).
"""

from __future__ import annotations

import time

import numpy as np
from rich.table import Table

from bench.suites.common import BenchContext, envelope, fmt_ms, pyplot, random_prompt, save_fig, stats, title_of

SUITE = "chunking"


def defaults(on_gpu: bool, quick: bool) -> dict:
    if on_gpu:
        return dict(budget=256, decoders=8, decoder_prompt=32, long_mult=8 if quick else 16, arrive_step=8)
    if quick:
        return dict(budget=16, decoders=2, decoder_prompt=8, long_mult=8, arrive_step=4)
    return dict(budget=32, decoders=4, decoder_prompt=8, long_mult=12, arrive_step=6)


def _one(ctx: BenchContext, chunked: bool, budget: int, decoders: int, decoder_prompt: int, long_len: int,
         decode_tokens: int, arrive_step: int, progress, task) -> dict:
    from sharpinf.engine.llm_engine import LLMEngine
    from sharpinf.params import SamplingParams

    cfg, bs = ctx.model.config, 16
    rng = np.random.default_rng(ctx.seed)
    need_blocks = decoders * -(-(decoder_prompt + decode_tokens) // bs) + -(-(long_len + 8) // bs) + 8
    eng = LLMEngine(ctx.model, backend=ctx.backend, kernels=ctx.kernels, max_num_batched_tokens=budget,
                    enable_chunked_prefill=chunked, enable_prefix_caching=False, num_blocks=need_blocks, block_size=bs,
                    max_num_seqs=decoders + 2)
    # warm-up in this engine: kernels compiled, allocator primed
    eng.add_request(random_prompt(rng, 4, cfg.n_vocab), SamplingParams(max_tokens=2, ignore_eos=True))
    while eng.has_unfinished():
        eng.step()
    dec = [eng.add_request(random_prompt(rng, decoder_prompt, cfg.n_vocab),
                           SamplingParams(max_tokens=decode_tokens, ignore_eos=True)) for _ in range(decoders)]
    long_rid, steps, arrived_at = None, [], None
    t0 = time.perf_counter()
    while eng.has_unfinished():
        decoding = all(len(eng.requests[r].output_ids) >= 1 for r in dec)
        if long_rid is None and decoding and sum(1 for s in steps if s["decoding"]) >= arrive_step:
            long_rid = eng.add_request(random_prompt(rng, long_len, cfg.n_vocab),
                                       SamplingParams(max_tokens=4, ignore_eos=True))
            arrived_at = eng.requests[long_rid].metrics.arrival
        computed = eng.requests[long_rid].num_computed if long_rid is not None else 0
        a = time.perf_counter()
        eng.step()
        ctx.backend.synchronize()
        b = time.perf_counter()
        last = eng.runner.last_batch  # the step this call submitted (with async scheduling, the next one)
        long_seq = eng.requests[long_rid] if long_rid is not None else None  # a step fed it prompt tokens:
        prefilled = long_seq is not None and computed < len(long_seq.prompt_ids) and long_seq.num_computed > computed
        steps.append({"t_s": a - t0, "dt_s": b - a, "tokens": int(last.n_tokens) if last is not None else 0,
                      "decoding": decoding, "long_prefill": prefilled})
        progress.advance(task)
    if long_rid is None:
        raise RuntimeError("the decoders finished before the long prompt could arrive: raise decode_tokens")
    gaps, timeline = [], []
    for r in dec:
        tt = eng.requests[r].metrics.token_times
        for x, y in zip(tt, tt[1:]):
            gaps.append(y - x)
            timeline.append({"t_s": y - arrived_at, "gap_s": y - x, "request": r})
    long_seq = eng.requests[long_rid]
    out = {
        "chunked_prefill": chunked,
        "gap_s": stats(gaps),
        "max_gap_s": max(gaps),
        "p99_gap_s": float(np.percentile(gaps, 99)),
        "long_prompt_ttft_s": long_seq.metrics.first_token - long_seq.metrics.arrival,
        "long_prompt_prefill_steps": sum(s["long_prefill"] for s in steps),  # steps that fed it a chunk
        "steps": len(steps),
        "max_step_tokens": max(s["tokens"] for s in steps),
        "timeline": sorted(timeline, key=lambda p: p["t_s"]),
        "step_log": [{**s, "t_s": s["t_s"] + t0 - arrived_at} for s in steps],
    }
    del eng
    ctx.release()
    return out


def run(ctx: BenchContext, budget: int, decoders: int, decoder_prompt: int, long_mult: int, arrive_step: int) -> dict:
    cfg = ctx.model.config
    long_len = min(long_mult * budget, cfg.context_length - 16)
    prefill_steps = -(-long_len // max(1, budget - decoders))
    decode_tokens = arrive_step + prefill_steps + max(8, prefill_steps // 2)  # decoders outlive the chunked prefill
    if decoder_prompt + decode_tokens >= cfg.context_length:
        raise ValueError("decoders would overrun the context length: lower long_mult or budget")
    runs = {}
    total = 2 * (decode_tokens + prefill_steps + 8)
    with ctx.progress() as bar:
        task = bar.add_task(f"{SUITE}: {decoders} decoders, {long_len}-token prompt", total=total)
        for chunked in (True, False):
            runs["on" if chunked else "off"] = _one(ctx, chunked, budget, decoders, decoder_prompt, long_len,
                                                    decode_tokens, arrive_step, bar, task)
        bar.update(task, completed=total)
    on, off = runs["on"], runs["off"]
    results = {
        "on": on,
        "off": off,
        "max_gap_reduction": off["max_gap_s"] / on["max_gap_s"] if on["max_gap_s"] > 0 else None,
        "long_prompt_tokens": long_len,
    }
    config = dict(budget=budget, decoders=decoders, decoder_prompt=decoder_prompt, long_mult=long_mult,
                  long_len=long_len, decode_tokens=decode_tokens, arrive_step=arrive_step)
    return envelope(ctx, SUITE, config, results)


def table(doc: dict) -> Table:
    r, c = doc["results"], doc["config"]
    t = Table("chunked prefill", "ITL mean (ms)", "ITL p99 (ms)", "ITL max (ms)", "biggest step (tokens)",
              "long prompt TTFT (ms)", "its prefill steps",
              title=f"{c['decoders']} decoders; a {c['long_len']}-token prompt arrives (budget {c['budget']} tokens/step)")
    for k in ("on", "off"):
        m = r[k]
        t.add_row(k, fmt_ms(m["gap_s"]["mean"]), fmt_ms(m["p99_gap_s"]), fmt_ms(m["max_gap_s"]),
                  str(m["max_step_tokens"]), fmt_ms(m["long_prompt_ttft_s"]), str(m["long_prompt_prefill_steps"]))
    if r["max_gap_reduction"]:
        t.caption = f"chunking cuts the decoders' worst gap {r['max_gap_reduction']:.1f}x"
    return t


def plot(doc: dict, path):
    plt = pyplot()
    if plt is None:
        return None
    r, c = doc["results"], doc["config"]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    for k, color in (("off", "tab:red"), ("on", "tab:blue")):
        tl = r[k]["timeline"]
        ax.plot([p["t_s"] * 1e3 for p in tl], [p["gap_s"] * 1e3 for p in tl], ".", color=color, ms=5, alpha=0.8,
                label=f"chunked prefill {k}: max {r[k]['max_gap_s'] * 1e3:.1f} ms, p99 {r[k]['p99_gap_s'] * 1e3:.1f} ms")
        ttft = r[k]["long_prompt_ttft_s"] * 1e3
        ax.axvline(ttft, color=color, ls=":", lw=1)
        ax.annotate(f"long prompt's first token ({k})", (ttft, 0), rotation=90, va="bottom", ha="right", fontsize=7,
                    color=color)
    ax.axvline(0, color="black", ls="--", lw=1)
    ax.annotate(f"{c['long_len']}-token prompt arrives", (0, ax.get_ylim()[1]), va="top", ha="right", rotation=90,
                fontsize=8)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("time since the long prompt arrived (ms)")
    ax.set_ylabel("decoder inter-token gap (ms)")
    ax.set_title(f"{c['decoders']} decoding sequences, {c['budget']} tokens per step")
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3)
    fig.suptitle(title_of(doc), fontsize=10)
    return save_fig(plt, fig, path)
