"""Decode step time vs batch size: B sequences at the same context, one token each, one forward.

Every matmul reads the weights once per step whatever B is, so while the step is bound by
reading the weights its time barely grows with B and tokens/s = B / step time grows almost
linearly; the "weight GB/s" column is the weight bytes of one step over its time.
The KV pool holds zeros: attention's cost depends on the context length, not on the values.
Then the engine's decode step at a few batch sizes (bench/suites/host_gap.py): its wall time minus the
device's time for it -- the host's gap -- with async scheduling off and on.
"""

from __future__ import annotations

import numpy as np
from rich.table import Table

from sharpinf.step.batch import Batch, SeqChunk
from bench.suites.common import (BenchContext, check_context, envelope, fmt_ms, fmt_rate, pyplot, random_prompt,
                                   repeat_timed, save_fig, title_of)
from bench.suites.host_gap import measure as measure_host_gap
from sharpinf.step.kv_pool import KVPool

SUITE = "decode"
RATIO_SIZES = (1, 8, 64)  # the batch sizes the summary compares: B = 64's step over B = 1's is the number that matters


def defaults(on_gpu: bool, quick: bool) -> dict:
    if on_gpu:
        return dict(batch_sizes=[1, 2, 4, 8, 16, 32, 64], context=512 if not quick else 256,
                    repeats=20 if not quick else 5, block_size=16, kv_dtype="f16",
                    gap_sizes=[1, 64] if not quick else [1, 8], gap_steps=50 if not quick else 20)
    if quick:
        return dict(batch_sizes=[1, 2, 4, 8], context=32, repeats=2, block_size=16, kv_dtype="f16",
                    gap_sizes=[1], gap_steps=3)
    return dict(batch_sizes=[1, 2, 4, 8, 16], context=128, repeats=5, block_size=16, kv_dtype="f16",
                gap_sizes=[1, 4], gap_steps=5)


def step_weight_bytes(fp) -> int:
    """Bytes of weights one step reads: every layer matrix and the LM head (the embedding
    lookup reads only B rows). An MoE layer counts its router and every expert: the most a step
    can read (a step of one token reads k of n_expert)."""
    n = sum(int(m.raw.nbytes) for L in fp.layers for m in (*L.wqkv, L.wo, L.w_gate, L.w_up, L.w_down)
            if m is not None)
    n += sum(int(a.nbytes) for L in fp.layers if L.moe is not None
             for a in (L.moe.router, L.moe.gate, L.moe.up, L.moe.down))
    return n + int(fp.output.raw.nbytes)


def run(ctx: BenchContext, batch_sizes: list[int], context: int, repeats: int, block_size: int, kv_dtype: str,
        gap_sizes: tuple[int, ...] = (), gap_steps: int = 5) -> dict:
    cfg, be = ctx.model.config, ctx.backend
    check_context(cfg.context_length, context)
    fp = ctx.forward_pass()
    per_seq = -(-(context + 1) // block_size)
    pool = KVPool(be, cfg, max(batch_sizes) * per_seq, block_size, kv_dtype)
    rng = np.random.default_rng(ctx.seed)
    wbytes = step_weight_bytes(fp)
    rows = ctx.row_log(SUITE)  # each row on disk as it is timed: a cut run keeps them
    with ctx.progress() as bar:
        task = bar.add_task(f"{SUITE}: B = {', '.join(map(str, batch_sizes))}", total=len(batch_sizes))
        for B in batch_sizes:
            toks = random_prompt(rng, B, cfg.n_vocab)
            chunks = [SeqChunk([toks[i]], context, list(range(i * per_seq, (i + 1) * per_seq))) for i in range(B)]
            batch = Batch.build(chunks, block_size)
            batch.validate(pool.num_blocks, cfg.n_vocab)  # once; the timed calls skip it
            times = repeat_timed(be, lambda: fp.forward(batch, pool, validate=False), repeats, warmup=1)
            t = float(np.median(times))
            rows.append({"batch_size": B, "step_s": t, "step_s_min": min(times), "step_s_all": times,
                         "tok_per_s": B / t, "weight_gb_per_s": wbytes / t / 1e9})
            bar.advance(task)
    base = rows[0]
    for r in rows:  # how much of the ideal B-fold speedup over B = smallest was reached
        r["speedup_vs_first"] = r["tok_per_s"] / base["tok_per_s"]
        r["step_time_ratio_vs_first"] = r["step_s"] / base["step_s"]
    config = dict(batch_sizes=batch_sizes, context=context, repeats=repeats, block_size=block_size,
                  kv_dtype=kv_dtype, timing="median of repeats after 1 warm-up, synchronized",
                  gap_sizes=list(gap_sizes), gap_steps=gap_steps,
                  gap_timing="median engine.step() wall time over gap_steps decode steps, minus the same step's "
                             "device time (its Batch submitted back to back)")
    del pool
    ctx.release()
    gaps = [measure_host_gap(ctx, B, context, gap_steps, block_size, kv_dtype) for B in gap_sizes]
    ctx.release()
    return envelope(ctx, SUITE, config, {"weight_bytes_per_step": wbytes, "rows": rows, "ratios": ratios(rows),
                                         "host_gap": gaps})


def ratios(rows: list[dict]) -> dict:
    """Step time at B = 1, 8, 64 (those measured) and each step over B = 1's: 1.0 is the ideal
    (weights read once a step whatever B), B = 64's is where the step stops being weight-bound."""
    step = {r["batch_size"]: r["step_s"] for r in rows}
    return {"step_ms": {str(b): step[b] * 1e3 for b in RATIO_SIZES if b in step},
            "step_time_x_vs_1": {str(b): step[b] / step[1] for b in RATIO_SIZES[1:] if b in step and 1 in step}}


def summary(doc: dict) -> list[str]:
    """A line: the step times at B = 1, 8, 64 and their ratios to B = 1."""
    r = doc["results"]["ratios"]
    if not r["step_ms"]:
        return ["decode: none of B = 1, 8, 64 measured"]
    times = ", ".join(f"{v:.2f}" for v in r["step_ms"].values())
    x = "; ".join(f"B = {b} / B = 1: {v:.2f}x" for b, v in r["step_time_x_vs_1"].items())
    lines = [f"decode step at B = {', '.join(r['step_ms'])}: {times} ms" + (f"; {x}" if x else "")]
    for g in doc["results"].get("host_gap", []):
        lines.append(f"engine decode step at B = {g['batch_size']}: device {g['device_ms']:.2f} ms; host gap "
                     f"{g['sync']['host_gap_ms']:.2f} ms sync, {g['async']['host_gap_ms']:.2f} ms async "
                     f"(step {g['sync']['step_ms']:.2f} -> {g['async']['step_ms']:.2f} ms)")
    return lines


def table(doc: dict) -> Table:
    c = doc["config"]
    t = Table("B", "step (ms)", "tokens/s", "x vs B=1", "step time x", "weight GB/s",
              title=f"decode step vs batch size (context {c['context']})")
    for r in doc["results"]["rows"]:
        t.add_row(str(r["batch_size"]), fmt_ms(r["step_s"]), fmt_rate(r["tok_per_s"]), f"{r['speedup_vs_first']:.2f}",
                  f"{r['step_time_ratio_vs_first']:.2f}", f"{r['weight_gb_per_s']:.2f}")
    t.caption = "\n".join(summary(doc))
    return t


def plot(doc: dict, path):
    plt = pyplot()
    if plt is None:
        return None
    rows = doc["results"]["rows"]
    B = [r["batch_size"] for r in rows]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    a1.plot(B, [r["step_s"] * 1e3 for r in rows], "o-")
    a1.set_xscale("log", base=2)
    a1.set_xticks(B, [str(b) for b in B])
    a1.set_ylim(bottom=0)
    a1.set_xlabel("batch size B (sequences, 1 token each)")
    a1.set_ylabel("decode step time (ms)")
    a1.set_title(f"step time at context {doc['config']['context']}")
    a1.grid(alpha=0.3)
    tps = [r["tok_per_s"] for r in rows]
    a2.plot(B, tps, "o-", label="measured")
    a2.plot(B, [tps[0] * b / B[0] for b in B], "--", color="gray", label="ideal (step time flat)")
    a2.set_xscale("log", base=2)
    a2.set_yscale("log")
    a2.set_xticks(B, [str(b) for b in B])
    a2.set_xlabel("batch size B")
    a2.set_ylabel("tokens/s = B / step time")
    a2.set_title("decode throughput")
    a2.legend(fontsize=8)
    a2.grid(alpha=0.3, which="both")
    fig.suptitle(title_of(doc), fontsize=10)
    return save_fig(plt, fig, path)
