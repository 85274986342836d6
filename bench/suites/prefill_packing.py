"""Packed vs sequential prefill: S prompts in one packed step vs one step per prompt, for each
(S, length) configuration -- on a GPU 8 x 128, 2 x 2048, and one prompt alone at 512 and 2048
tokens (the prefill tokens/s the ratios report, beside 8 x 128's packed over sequential) -- and,
when the matmuls are dp4a's, the same with the tensor-core variants beside them: matmul=mma alone (bit-identical to dp4a, so
the next tokens must agree exactly) and the tensor set (mma matmuls + flash attention, whose f16
operands round differently: agreement reported, not required); on a device with a clock,
matmul=timed too (each shape on its fastest candidate: the same bits as dp4a).

Both runs feed exactly the same tokens into the same KV slots; packing turns S skinny
matmuls into one fat one (weights read once instead of S times) and S sets of launches
into one. Also checks both give each prompt the same next token.
"""

from __future__ import annotations

import numpy as np
from rich.table import Table

from sharpinf.step.batch import Batch, SeqChunk
from bench.suites.common import (BenchContext, envelope, fmt_ms, fmt_rate, pyplot, random_prompt, save_fig,
                                   timed, title_of)
from sharpinf.step.kv_pool import KVPool
from sharpinf.ops.variants import TENSOR

SUITE = "prefill"


def defaults(on_gpu: bool, quick: bool) -> dict:
    if on_gpu:  # one prompt alone at 512 and 2048 tokens: the prefill tokens/s the summary reports
        return dict(configs=[[8, 128], [2, 2048], [1, 512], [1, 2048]] if not quick else [[8, 128], [1, 512]],
                    repeats=10 if not quick else 3, block_size=16)
    if quick:
        return dict(configs=[[4, 16]], repeats=1, block_size=16)
    return dict(configs=[[8, 64], [2, 128]], repeats=3, block_size=16)


def _measure(ctx: BenchContext, fp, pool, packed, singles, repeats: int, label: str) -> dict:
    be = ctx.backend

    def run_packed():
        return fp.greedy(packed, pool, validate=False)

    def run_sequential():
        return [fp.greedy(b, pool, validate=False) for b in singles]

    # warm-up, and the agreement check: the same next token for every prompt either way
    best_packed = run_packed().tolist()
    best_seq = [int(o[0]) for o in run_sequential()]
    t_packed, t_seq = [], []
    with ctx.progress() as bar:
        task = bar.add_task(f"{SUITE}: {label}, kernels {fp.choice.name}", total=repeats)
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
        "next_token_agreement": sum(a == b for a, b in zip(best_packed, best_seq)) / len(singles),
        "next_tokens": best_packed,
    }


def run(ctx: BenchContext, configs: list, repeats: int, block_size: int, prompts: int | None = None,
        prompt_len: int | None = None) -> dict:
    """configs: [[S, length], ...]; --prefill-prompts / --prefill-len make it one configuration."""
    cfg, be = ctx.model.config, ctx.backend
    if prompts is not None or prompt_len is not None:
        configs = [[prompts or configs[0][0], prompt_len or configs[0][1]]]
    for S, n in configs:
        if n >= cfg.context_length:
            raise ValueError(f"prompt_len {n} does not fit the model's context length {cfg.context_length}")
        if S < 1 or n < 1:
            raise ValueError(f"prefill: {S} prompts x {n} tokens: both must be at least 1")
    fp = ctx.forward_pass()
    # beside a q8_1 choice, the other q8_1 matmuls (dp4a, mma: the same bits; tuned where it can time) and
    # the tensor set
    others, own = [], fp.choice.to_json()
    if fp.choice.q8_activations:
        tuned = [{**own, "matmul": "timed"}] if be.can_time() else []
        for kernels in ({**own, "matmul": "dp4a"}, {**own, "matmul": "mma"}, *tuned, {**own, **TENSOR}):
            if kernels != own and all(kernels != o.choice.to_json() for o in others):
                others.append(fp.with_own_buffers(kernels=kernels))
    rng = np.random.default_rng(ctx.seed)
    out = ctx.row_log(SUITE)  # each configuration on disk as it is timed: a cut run keeps them
    for S, n in configs:
        per_seq = -(-n // block_size)
        pool = KVPool(be, cfg, S * per_seq, block_size)
        chunks = [SeqChunk(random_prompt(rng, n, cfg.n_vocab), 0, list(range(i * per_seq, (i + 1) * per_seq)))
                  for i in range(S)]
        packed = Batch.build(chunks, block_size).validate(pool.num_blocks, cfg.n_vocab)
        singles = [Batch.build([c], block_size).validate(pool.num_blocks, cfg.n_vocab) for c in chunks]
        label = f"{S} x {n} tokens"
        res = {"prompts": S, "prompt_len": n, **_measure(ctx, fp, pool, packed, singles, repeats, label),
               "variants": {}}
        for other in others:
            v = _measure(ctx, other, pool, packed, singles, repeats, label)
            v["same_next_tokens"] = v["next_tokens"] == res["next_tokens"]  # as the suite's own choice
            v["must_agree"] = other.choice.same_bits(fp.choice)  # the variants' declared bits (the q8_1 matmuls: dp4a's)
            res["variants"][other.choice.name] = v
        out.append(res)
        del pool
    config = dict(configs=[list(c) for c in configs], repeats=repeats, block_size=block_size,
                  timing="median of repeats after 1 warm-up, synchronized")
    ctx.release()
    res = {"kernels": fp.choice.name, "configs": out}
    return envelope(ctx, SUITE, config, {**res, "ratios": ratios(res)})


def ratios(res: dict) -> dict:
    """Per kernel set: tokens/s of one prompt prefilled alone, by its length (the S = 1 configurations:
    512 and 2048 on a GPU), and packed over sequential for several prompts, by "SxLEN" (8x128)."""
    out: dict = {}
    for c in res["configs"]:
        for kname, m in [(res["kernels"], c)] + list(c["variants"].items()):
            r = out.setdefault(kname, {"prefill_tok_s": {}, "packed_vs_sequential": {}})
            if c["prompts"] == 1:
                r["prefill_tok_s"][str(c["prompt_len"])] = m["packed"]["tok_per_s"]
            else:
                r["packed_vs_sequential"][f"{c['prompts']}x{c['prompt_len']}"] = m["speedup"]
    return out


def summary(doc: dict) -> list[str]:
    """A line per kernel set: prefill tokens/s by prompt length, packed vs sequential."""
    lines = []
    for kname, r in doc["results"]["ratios"].items():
        parts = [f"{n} tokens {fmt_rate(v)} tok/s" for n, v in r["prefill_tok_s"].items()]
        parts += [f"{k} packed {v:.2f}x sequential" for k, v in r["packed_vs_sequential"].items()]
        lines.append(f"prefill, {kname}: " + "; ".join(parts))
    return lines


def table(doc: dict) -> Table:
    r = doc["results"]
    t = Table("prompts", "mode", "kernels", "steps", "tokens", "time (ms)", "tokens/s", "x sequential",
              title=f"prefill: packed (one step) vs sequential (a step a prompt), kernels {r['kernels']}")
    for c in r["configs"]:
        for kname, m in [(r["kernels"], c)] + list(c["variants"].items()):
            for name in ("packed", "sequential"):
                x = m[name]
                t.add_row(f"{c['prompts']} x {c['prompt_len']}", name, kname, str(x["steps"]), f"{x['tokens']:,}",
                          fmt_ms(x["time_s"]), fmt_rate(x["tok_per_s"]),
                          f"{m['speedup']:.2f}" if name == "packed" else "1.00")
    agree = [f"{c['prompts']} x {c['prompt_len']}: {c['next_token_agreement']:.0%}" for c in r["configs"]]
    t.caption = "\n".join(["packed and sequential give the same next token: " + ", ".join(agree)] + summary(doc))
    return t


def plot(doc: dict, path):
    plt = pyplot()
    if plt is None:
        return None
    r = doc["results"]
    configs = r["configs"]
    fig, axes = plt.subplots(1, len(configs), figsize=(6 * len(configs), 4.4), squeeze=False)
    for ax, c in zip(axes[0], configs):
        sets = [(r["kernels"], c)] + list(c["variants"].items())
        width = 0.8 / len(sets)
        for i, (kname, m) in enumerate(sets):
            vals = [m["packed"]["tok_per_s"], m["sequential"]["tok_per_s"]]
            bars = ax.bar([x + (i - (len(sets) - 1) / 2) * width for x in (0, 1)], vals, width=width, label=kname)
            for b, v in zip(bars, vals):
                ax.annotate(f"{v:,.0f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
        ax.set_xticks([0, 1], ["packed (1 step)", f"sequential ({c['prompts']} steps)"])
        ax.set_ylabel("prefill tokens/s")
        ax.set_title(f"{c['prompts']} prompts x {c['prompt_len']} tokens (packed {c['speedup']:.2f}x)")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    fig.suptitle(title_of(doc), fontsize=10)
    return save_fig(plt, fig, path)
