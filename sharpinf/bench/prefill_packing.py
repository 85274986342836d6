"""Packed vs sequential prefill: S prompts in one packed step vs one step per prompt (and, when
the matmuls are dp4a's, the same with the int8 tensor-core matmuls, matmul=mma, beside them).

Both runs feed exactly the same tokens into the same KV slots; packing turns S skinny
matmuls into one fat one (weights read once instead of S times) and S sets of launches
into one. Also checks both give each prompt the same next token.
"""

from __future__ import annotations

import numpy as np
from rich.table import Table

from sharpinf.batch import Batch, SeqChunk
from sharpinf.bench.common import (BenchContext, envelope, fmt_ms, fmt_rate, pyplot, random_prompt, save_fig,
                                   timed, title_of)
from sharpinf.kv_pool import KVPool

SUITE = "prefill"


def defaults(on_gpu: bool, quick: bool) -> dict:
    if on_gpu:
        return dict(prompts=16, prompt_len=256 if not quick else 128, repeats=10 if not quick else 3, block_size=16)
    if quick:
        return dict(prompts=4, prompt_len=16, repeats=1, block_size=16)
    return dict(prompts=8, prompt_len=64, repeats=3, block_size=16)


def run(ctx: BenchContext, prompts: int, prompt_len: int, repeats: int, block_size: int) -> dict:
    cfg, be = ctx.model.config, ctx.backend
    if prompt_len >= cfg.context_length:
        raise ValueError(f"prompt_len {prompt_len} does not fit the model's context length {cfg.context_length}")
    fp = ctx.forward_pass()
    per_seq = -(-prompt_len // block_size)
    pool = KVPool(be, cfg, prompts * per_seq, block_size)
    rng = np.random.default_rng(ctx.seed)
    chunks = [SeqChunk(random_prompt(rng, prompt_len, cfg.n_vocab), 0, list(range(i * per_seq, (i + 1) * per_seq)))
              for i in range(prompts)]
    packed = Batch.build(chunks, block_size).validate(pool.num_blocks, cfg.n_vocab)
    singles = [Batch.build([c], block_size).validate(pool.num_blocks, cfg.n_vocab) for c in chunks]

    def measure(fp) -> dict:
        def run_packed():
            return fp.greedy(packed, pool, validate=False)

        def run_sequential():
            return [fp.greedy(b, pool, validate=False) for b in singles]

        # warm-up, and the agreement check: the same next token for every prompt either way
        best_packed = run_packed().tolist()
        best_seq = [int(o[0]) for o in run_sequential()]
        t_packed, t_seq = [], []
        with ctx.progress() as bar:
            task = bar.add_task(f"{SUITE}: {prompts} x {prompt_len} tokens, kernels {fp.choice.name}", total=repeats)
            for _ in range(repeats):
                t_packed.append(timed(be, run_packed))
                t_seq.append(timed(be, run_sequential))
                bar.advance(task)
        tp, ts = float(np.median(t_packed)), float(np.median(t_seq))
        n_packed, n_seq = packed.n_tokens, sum(b.n_tokens for b in singles)
        return {
            "packed": {"steps": 1, "tokens": n_packed, "time_s": tp, "time_s_all": t_packed, "tok_per_s": n_packed / tp},
            "sequential": {"steps": len(singles), "tokens": n_seq, "time_s": ts, "time_s_all": t_seq,
                           "tok_per_s": n_seq / ts},
            "speedup": ts / tp,
            "next_token_agreement": sum(a == b for a, b in zip(best_packed, best_seq)) / prompts,
            "next_tokens": best_packed,
        }

    results = measure(fp)
    results["kernels"] = fp.choice.name
    # with the dp4a matmuls: the same prefill with the tensor-core matmuls beside it (bit-identical,
    # so the next tokens must agree exactly)
    if fp.choice.matmul == "dp4a":
        mma = fp.with_own_buffers(kernels={**fp.choice.to_json(), "matmul": "mma"})
        other = measure(mma)
        other["same_next_tokens_as_dp4a"] = other["next_tokens"] == results["next_tokens"]
        results["variants"] = {mma.choice.name: other}
    config = dict(prompts=prompts, prompt_len=prompt_len, repeats=repeats, block_size=block_size,
                  timing="median of repeats after 1 warm-up, synchronized")
    del pool
    ctx.release()
    return envelope(ctx, SUITE, config, results)


def table(doc: dict) -> Table:
    r, c = doc["results"], doc["config"]
    t = Table("mode", "steps", "tokens", "time (ms)", "tokens/s",
              title=f"prefill: {c['prompts']} prompts x {c['prompt_len']} tokens (packed {r['speedup']:.2f}x faster)")
    for name in ("packed", "sequential"):
        m = r[name]
        t.add_row(name, str(m["steps"]), f"{m['tokens']:,}", fmt_ms(m["time_s"]), fmt_rate(m["tok_per_s"]))
    for kname, v in r.get("variants", {}).items():
        for name in ("packed", "sequential"):
            m = v[name]
            t.add_row(f"{name}, {kname}", str(m["steps"]), f"{m['tokens']:,}", fmt_ms(m["time_s"]),
                      fmt_rate(m["tok_per_s"]))
    t.caption = f"same next token for {r['next_token_agreement']:.0%} of the prompts"
    return t


def plot(doc: dict, path):
    plt = pyplot()
    if plt is None:
        return None
    r, c = doc["results"], doc["config"]
    names = ["packed\n(1 step)", f"sequential\n({r['sequential']['steps']} steps)"]
    colors = ["tab:green", "tab:gray"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.2))
    times = [r["packed"]["time_s"] * 1e3, r["sequential"]["time_s"] * 1e3]
    rates = [r["packed"]["tok_per_s"], r["sequential"]["tok_per_s"]]
    for ax, vals, label, f in ((a1, times, "time (ms)", "{:.1f} ms"), (a2, rates, "prefill tokens/s", "{:,.0f}")):
        bars = ax.bar(names, vals, color=colors)
        for b, v in zip(bars, vals):
            ax.annotate(f.format(v), (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=9)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
    a1.set_title(f"{c['prompts']} prompts x {c['prompt_len']} tokens")
    a2.set_title(f"packed is {r['speedup']:.2f}x faster")
    fig.suptitle(title_of(doc), fontsize=10)
    return save_fig(plt, fig, path)
