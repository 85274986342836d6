"""Speculative decoding: what it keeps, what it saves, and what one verification step costs.

Three parts, all on the backend the suite runs on:
    ngram   the model on code-editing prompts (its output copies much of its prompt: what prompt
            lookup is for), 1 and B streams, plain and with n-gram speculation
    draft   draft/target pairs: the model as its own draft (every greedy guess kept: the upper
            bound, and the draft's whole cost), and synthetic pairs on a 4-layer synthetic llama
            (Q8_0): its own weights in Q4_0 as the draft, and its first layer as the draft (the
            same seed shares the embedding, the first layer and the tied head: an early exit).
            Random weights give logits with small margins, so a draft that is not the target
            itself agrees with it rarely: these pairs measure what a poor draft costs; the real
            model's n-gram rows are the acceptance a user sees
    step    one packed step of B sequences with t = 1, 2, 4, 8 tokens each and logits at every
            token (a verification's shape), against t = 1: what batching makes of k guesses
Each engine run is warmed first on a short request (kernels compiled, graphs captured), its
metrics reset, then timed: output tokens/s over the whole run, and per request the time per
output token after the first (TPOT). The speculating run's token ids must equal the plain run's
("identical"): batch invariance makes them so, and a run where they differ is a bug to report.
Plain decoding runs with async scheduling (the engine's default); speculation runs without it.
"""

from __future__ import annotations

import time

import numpy as np
from rich.table import Table

from bench.suites.common import (BenchContext, check_context, envelope, fmt_ms, fmt_rate, pyplot, random_prompt,
                                   repeat_timed, save_fig, title_of)

SUITE = "speculative"

# Editing requests: the answer repeats most of the code it was given.
EDITS = (
    "Rename the variable `total` to `acc` in this Python function and print the whole function again.\n\n"
    "def sum_list(xs):\n    total = 0\n    for x in xs:\n        if x is not None:\n            total = total + x\n"
    "    return total\n",
    "Add a docstring to this function and print the whole function again.\n\n"
    "def clamp(value, low, high):\n    if value < low:\n        return low\n    if value > high:\n        return high\n"
    "    return value\n",
    "Change the loop to start at 1 instead of 0 and print the whole code again.\n\n"
    "for i in range(0, 10):\n    square = i * i\n    print(i, square)\nprint('done')\n",
    "Replace every `print` with `log` in this code and print the code again.\n\n"
    "def report(items):\n    print('start')\n    for item in items:\n        print(item)\n    print('end')\n",
)
SYNTH_TARGET = dict(n_embd=128, n_layer=4)  # the synthetic target (llama, Q8_0)
SYNTH_DRAFTS = {"synthetic, its Q4_0 copy": ("Q4_0", SYNTH_TARGET),  # name: (type, shape) of the draft
                "synthetic, its first layer": ("Q8_0", dict(SYNTH_TARGET, n_layer=1))}


def defaults(on_gpu: bool, quick: bool) -> dict:
    d = dict(k=4, max_tokens=128, streams=[1, 8], step_batch=[1, 8, 32], step_tokens=[1, 2, 4, 8], context=512,
             repeats=10, block_size=16, self_draft=True) if on_gpu else \
        dict(k=4, max_tokens=32, streams=[1, 4], step_batch=[1, 4], step_tokens=[1, 2, 4, 8], context=64, repeats=3,
             block_size=16, self_draft=True)
    if quick:
        d.update(max_tokens=48, streams=[1], step_batch=[1, 8], repeats=3) if on_gpu else \
            d.update(max_tokens=8, streams=[1], step_batch=[1], step_tokens=[1, 4], context=16, repeats=1)
    return d


def _tokenizer(model):
    from sharpinf.model.tokenizer import Tokenizer

    return Tokenizer.from_gguf_metadata(model.metadata, where=str(model.path))


def edit_prompts(model, n: int) -> list[list[int]]:
    """n code-editing prompts (cycling EDITS), in the model's chat template when it has one."""
    tok = _tokenizer(model)
    texts = [EDITS[i % len(EDITS)] for i in range(n)]
    if tok.chat_template:
        return [tok.apply_chat([{"role": "user", "content": t}]) for t in texts]
    return [tok.encode(t) for t in texts]


def run_pair(ctx: BenchContext, model, prompts: list[list[int]], max_tokens: int, speculative, k: int) -> dict:
    """The prompts through the engine plainly, then with `speculative`: each run's figures, and
    whether the token ids are identical."""
    from sharpinf.params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    plain, plain_ids = _timed_run(ctx, model, prompts, params, None)
    spec, spec_ids = _timed_run(ctx, model, prompts, params, dict(speculative, num_speculative_tokens=k))
    first = next((i for i, (a, b) in enumerate(zip(plain_ids, spec_ids)) if a != b), None)
    text = _tokenizer(model).decode(plain_ids[0])  # what was decoded: how much of it the prompt holds
    return {"streams": len(prompts), "plain": plain, "speculative": spec, "identical": first is None, "text_0": text,
            **({"first_difference_in_request": first} if first is not None else {}),
            "speedup": (spec["output_tok_per_s"] / plain["output_tok_per_s"]
                        if spec["output_tok_per_s"] and plain["output_tok_per_s"] else None)}


def _timed_run(ctx: BenchContext, model, prompts, params, speculative) -> tuple[dict, list[list[int]]]:
    from sharpinf.engine.llm_engine import LLMEngine
    from sharpinf.engine.speculative import SpecMetrics
    from sharpinf.params import SamplingParams

    longest = max(map(len, prompts)) + params.max_tokens + 8
    eng = LLMEngine(model, backend=ctx.backend, kernels=ctx.kernels, max_num_seqs=max(8, len(prompts)),
                    max_model_len=min(model.config.context_length, longest), speculative=speculative)
    warm = SamplingParams(max_tokens=6, ignore_eos=True)
    for p in prompts[:2]:  # every step shape the timed run starts with: prefill, decode, verification
        eng.add_request(p, warm)
    while eng.has_unfinished():
        eng.step()
    if eng.spec is not None:  # the timed run's own counts
        eng.spec.metrics = SpecMetrics()
    draft_steps0 = _draft_steps(eng)
    ctx.backend.synchronize()
    t0 = time.perf_counter()
    rids = [eng.add_request(p, params) for p in prompts]
    steps = 0
    while eng.has_unfinished():
        eng.step()
        steps += 1
    ctx.backend.synchronize()
    wall = time.perf_counter() - t0
    seqs = [eng.requests[r] for r in rids]
    gen = sum(len(s.output_ids) for s in seqs)
    tpot = [(s.metrics.finished - s.metrics.first_token) / (len(s.output_ids) - 1) for s in seqs
            if len(s.output_ids) > 1 and s.metrics.first_token is not None and s.metrics.finished is not None]
    out = {"wall_s": wall, "engine_steps": steps, "generated_tokens": gen, "output_tok_per_s": gen / wall,
           "tpot_s": float(np.mean(tpot)) if tpot else None}
    if eng.spec is not None:
        out.update({k: v for k, v in eng.spec.to_json().items() if k not in ("model", "draft_steps")})
    if draft_steps0 is not None:  # the draft model's own steps: its cost beside the target's passes
        out["draft_steps"] = _draft_steps(eng) - draft_steps0
    ids = [list(s.output_ids) for s in seqs]
    eng.fp.release_plans()
    del eng
    ctx.release()
    return out, ids


def _draft_steps(eng) -> int | None:
    return None if eng.spec is None else eng.spec.to_json().get("draft_steps")


def step_cost(ctx: BenchContext, batch_sizes: list[int], tokens: list[int], context: int, block_size: int,
              repeats: int, log: list) -> list[dict]:
    """One packed step of B sequences, t tokens each at `context`, a logits row and a greedy pick at every
    token; its time against the fewest tokens' (t = 1) at the same B. Each row also goes to `log`."""
    from sharpinf.step.batch import Batch, SeqChunk
    from sharpinf.step.buffers import SamplingRows
    from sharpinf.step.kv_pool import KVPool

    cfg, be = ctx.model.config, ctx.backend
    check_context(cfg.context_length, context + max(tokens))
    fp = ctx.forward_pass()
    per_seq = -(-(context + max(tokens)) // block_size)
    pool = KVPool(be, cfg, max(batch_sizes) * per_seq, block_size, "f16")
    rng = np.random.default_rng(ctx.seed)
    rows = []
    for B in batch_sizes:
        for t in tokens:
            chunks = [SeqChunk(random_prompt(rng, t, cfg.n_vocab), context, list(range(i * per_seq, (i + 1) * per_seq)),
                               n_logits=t) for i in range(B)]
            batch = Batch.build(chunks, block_size)
            batch.validate(pool.num_blocks, cfg.n_vocab)
            sampling = SamplingRows.greedy(len(batch.logits_rows))
            times = repeat_timed(be, lambda: fp.submit(batch, pool, validate=False, sampling=sampling).result(),
                                 repeats, warmup=1)
            row = {"part": "step", "batch_size": B, "tokens_per_seq": t, "step_s": float(np.median(times)),
                   "step_s_all": times}
            base = next(r["step_s"] for r in rows + [row] if r["batch_size"] == B)  # the fewest tokens (t = 1)
            row["x_vs_1"] = row["step_s"] / base
            rows.append(row)
            log.append(row)
    del pool
    ctx.release()
    return rows


def run(ctx: BenchContext, k: int, max_tokens: int, streams: list[int], step_batch: list[int], step_tokens: list[int],
        context: int, repeats: int, block_size: int, self_draft: bool) -> dict:
    from sharpinf.model.loader import load_model
    from sharpinf.model.synth import synthetic_model

    results: dict = {"step": [], "ngram": [], "draft": []}
    log = ctx.row_log(SUITE)  # every row on disk as it is measured: a cut run keeps them
    target = load_model(synthetic_model("llama", "Q8_0", **SYNTH_TARGET))
    pairs = [(name, target, {"method": "draft", "model": synthetic_model("llama", q, **shape)})
             for name, (q, shape) in SYNTH_DRAFTS.items()]
    pairs += [("self", ctx.model, {"method": "draft", "model": ctx.model})] if self_draft else []  # the costliest: last
    total = len(streams) + len(pairs) + 1
    with ctx.progress() as bar:  # the step's cost first: the cheapest part, and the kernels' own
        task = bar.add_task(f"{SUITE}: step cost, n-gram, draft pairs", total=total)
        results["step"] = step_cost(ctx, step_batch, step_tokens, context, block_size, repeats, log)
        bar.advance(task)
        for n in streams:
            row = {"part": "ngram", **run_pair(ctx, ctx.model, edit_prompts(ctx.model, n), max_tokens,
                                               {"method": "ngram"}, k)}
            results["ngram"].append(row)
            log.append(row)
            bar.advance(task)
        for name, model, spec in pairs:
            row = {"part": "draft", "pair": name, **run_pair(ctx, model, edit_prompts(model, 1), max_tokens, spec, k)}
            results["draft"].append(row)
            log.append(row)
            bar.advance(task)
    config = dict(k=k, max_tokens=max_tokens, streams=streams, step_batch=step_batch, step_tokens=step_tokens,
                  context=context, repeats=repeats, block_size=block_size, self_draft=self_draft,
                  synthetic_target=dict(SYNTH_TARGET, type="Q8_0"),
                  synthetic_drafts={n: dict(shape, type=q) for n, (q, shape) in SYNTH_DRAFTS.items()}, sampling="greedy",
                  timing="one warm-up request pair first; wall time of the whole run, synchronized")
    return envelope(ctx, SUITE, config, results)


def summary(doc: dict) -> list[str]:
    r, lines = doc["results"], []
    for row in r["ngram"] + r["draft"]:
        s = row["speculative"]
        name = f"n-gram, {row['streams']} stream(s)" if row["part"] == "ngram" else f"draft ({row['pair']})"
        lines.append(f"{name}: {s['accepted_tokens']}/{s['draft_tokens']} guesses kept, "
                     f"{_f(s['target_passes_per_token'])} target passes a token, {_x(row['speedup'])} tokens/s, "
                     + ("identical" if row["identical"] else "OUTPUTS DIFFER"))
    by_b: dict = {}
    for s in r["step"]:
        by_b.setdefault(s["batch_size"], []).append(f"t={s['tokens_per_seq']} {s['x_vs_1']:.2f}x")
    lines += [f"step at B = {b}, t tokens a sequence vs 1: " + ", ".join(v) for b, v in by_b.items()]
    return lines


def _f(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def table(doc: dict) -> Table:
    t = Table("run", "streams", "kept / guessed", "accept", "mean run", "passes/token", "tok/s plain", "tok/s spec",
              "TPOT plain / spec (ms)", "identical", title=f"speculative decoding (k = {doc['config']['k']}, greedy)")
    for row in doc["results"]["ngram"] + doc["results"]["draft"]:
        p, s = row["plain"], row["speculative"]
        t.add_row("n-gram" if row["part"] == "ngram" else f"draft: {row['pair']}", str(row["streams"]),
                  f"{s['accepted_tokens']} / {s['draft_tokens']}", _f(s["acceptance_rate"]), _f(s["mean_accepted_length"]),
                  _f(s["target_passes_per_token"]), fmt_rate(p["output_tok_per_s"]), fmt_rate(s["output_tok_per_s"]),
                  f"{fmt_ms(p['tpot_s'])} / {fmt_ms(s['tpot_s'])}", "yes" if row["identical"] else "NO")
    t.caption = "\n".join(summary(doc))
    return t


def plot(doc: dict, path):
    plt = pyplot()
    if plt is None:
        return None
    r = doc["results"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for b in sorted({s["batch_size"] for s in r["step"]}):
        pts = [s for s in r["step"] if s["batch_size"] == b]
        a1.plot([s["tokens_per_seq"] for s in pts], [s["x_vs_1"] for s in pts], "o-", label=f"B = {b}")
    a1.axhline(1.0, color="gray", ls="--", lw=1)
    a1.set_xlabel("tokens a sequence in the step (t)")
    a1.set_ylabel("step time / step time at t = 1")
    a1.set_title("a verification step's cost")
    a1.legend(fontsize=8)
    a1.grid(alpha=0.3)
    runs = r["ngram"] + r["draft"]
    names = [f"ngram x{x['streams']}" if x["part"] == "ngram" else x["pair"].replace("synthetic, ", "") for x in runs]
    a2.bar(names, [x["speculative"]["target_passes_per_token"] or 0 for x in runs], color="tab:blue")
    a2.axhline(1.0, color="gray", ls="--", lw=1, label="plain decoding")
    a2.set_ylabel("target passes per output token")
    a2.set_title("target passes per token (lower: more guesses kept)")
    a2.legend(fontsize=8)
    fig.suptitle(title_of(doc), fontsize=10)
    return save_fig(plt, fig, path)
