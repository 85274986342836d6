"""The host side of an engine step, measured without a GPU: launches and host microseconds.

The engine runs on the trace backend (sharpinf.runtime.trace_backend): every kernel launch
is checked and counted, none is run, so the wall time of `engine.step()` is what the host
spends around the GPU -- schedule, build the batch, pack and upload the step descriptor,
launch the plan's kernels or replay its graphs, read the sampled ids back, stop rules and
text (with async scheduling, the engine's default, a step() schedules and submits the next step
and collects the last: the "run" part is only the wait for its ids). Three step kinds on the
model's shape, eager and with CUDA graphs:
    decode_s1   one sequence decoding
    decode_s64  64 sequences decoding together
    mixed       63 decoding while a long prompt is prefilled in budget-sized chunks
Also each kernel's compulsory bytes (inputs read once, outputs written once) per step, the
input to a roofline. What the trace cannot show: the CUDA driver's own CPU time per
cuLaunchKernel (~2-4 us) and per graph launch, and the time the GPU takes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
from rich.table import Table

from bench.suites.common import BenchContext, envelope, kernels_name, pyplot, random_prompt, save_fig
from sharpinf.step.kv_pool import kv_bytes_per_slot

SUITE = "host"
KINDS = ("decode_s1", "decode_s64", "mixed")


def defaults(on_gpu: bool, quick: bool) -> dict:
    return dict(steps=5 if quick else 30, prompt_len=32 if quick else 128, budget=512, block_size=16)


@dataclass
class _Setup:
    kind: str
    decoding: int  # sequences decoding when the timed steps start
    long_prompt: int  # tokens of the prompt that arrives then (0: none)


def _setups(budget: int, steps: int) -> list[_Setup]:
    return [_Setup("decode_s1", 1, 0), _Setup("decode_s64", 64, 0), _Setup("mixed", 63, (budget - 63) * (steps + 2))]


def _engine(ctx: BenchContext, eager: bool, budget: int, block_size: int, blocks: int):
    from sharpinf.engine.llm_engine import LLMEngine

    return LLMEngine(ctx.model, backend=ctx.backend, kernels=ctx.kernels, num_blocks=blocks, block_size=block_size,
                     max_num_seqs=64, max_num_batched_tokens=budget, enforce_eager=eager)


def _kernel_bytes(eng, log) -> list[dict]:
    """Per kernel of one step: launches and compulsory bytes (attention: + the K/V it reads)."""
    cfg = eng.cfg
    batch = eng.runner.last_batch
    per_layer_kv = kv_bytes_per_slot(cfg, eng.config.kv_dtype) / cfg.n_layer
    kv_read = int(batch.context_lens.astype(np.int64).sum() * per_layer_kv)
    rows: dict[str, dict] = {}
    for l in log:
        r = rows.setdefault(l.name, {"kernel": l.name, "launches": 0, "bytes_read": 0, "bytes_written": 0})
        r["launches"] += 1
        if l.io:
            r["bytes_read"] += l.io[0] + (kv_read if l.name.startswith("attention") else 0)
            r["bytes_written"] += l.io[1]
    return sorted(rows.values(), key=lambda r: -(r["bytes_read"] + r["bytes_written"]))


def _measure(ctx: BenchContext, setup: _Setup, eager: bool, steps: int, prompt_len: int, budget: int,
             block_size: int) -> tuple[dict, int]:
    from sharpinf.params import SamplingParams

    cfg = ctx.model.config
    need = setup.decoding * (prompt_len + steps + 4) + setup.long_prompt + 64
    eng = _engine(ctx, eager, budget, block_size, -(-need // block_size) + 64)
    be = eng.backend
    rng = np.random.default_rng(ctx.seed)
    long_ok = setup.long_prompt < cfg.context_length - 8
    sp = SamplingParams(max_tokens=steps + 8, ignore_eos=True)
    for _ in range(setup.decoding):
        eng.add_request(random_prompt(rng, prompt_len, cfg.n_vocab), sp)
    while any(s.num_computed < len(s.prompt_ids) for s in eng.requests.values()):
        eng.step()  # prefill every prompt: from here on each step decodes them all
    if setup.long_prompt:
        n = setup.long_prompt if long_ok else cfg.context_length - 8
        eng.add_request(random_prompt(rng, n, cfg.n_vocab), SamplingParams(max_tokens=1, ignore_eos=True))
    times, launches, replays, parts = [], [], [], []
    be.counts.reset()
    eng.step()  # warm: first use of this shape
    for i in range(steps):
        be.counts.reset(keep_log=(i == 0))
        t0 = time.perf_counter()
        eng.step()
        times.append(time.perf_counter() - t0)
        launches.append(be.counts.launches)
        replays.append(be.counts.graph_replays)
        st = eng.last_step_times
        parts.append((st.schedule_s, st.run_s, st.finish_s))
        if i == 0:
            batch = eng.runner.last_batch
            kernels = _kernel_bytes(eng, be.counts.log)
            shape = {"tokens": batch.n_tokens, "seqs": batch.n_seqs, "logits_rows": int(len(batch.logits_rows))}
    p = np.median(np.array(parts), axis=0) * 1e6
    return {
        "host_us": float(np.median(times)) * 1e6,
        "host_us_min": float(np.min(times)) * 1e6,
        "host_us_parts": {"schedule": float(p[0]), "run": float(p[1]), "finish": float(p[2])},
        "kernel_launches": int(np.median(launches)),
        "graph_replays": int(np.median(replays)),
        "step": shape,
        "kernels": kernels,
    }, eng.fp.launches_per_layer()


def run(ctx: BenchContext, steps: int, prompt_len: int, budget: int, block_size: int) -> dict:
    from sharpinf.runtime.trace_backend import TraceBackend

    ctx = replace(ctx, backend=TraceBackend(), _fp=None)  # whatever --backend says: host cost is measured on the trace
    prompt_len = min(prompt_len, ctx.model.config.context_length // 4)
    setups = _setups(budget, steps)
    out: dict[str, dict] = {}
    per_layer = None
    with ctx.progress() as bar:
        task = bar.add_task(f"{SUITE}: {', '.join(KINDS)} x eager, graph", total=2 * len(setups))
        for s in setups:
            out[s.kind] = {}
            for mode in ("eager", "graph"):
                out[s.kind][mode], per_layer = _measure(ctx, s, mode == "eager", steps, prompt_len, budget, block_size)
                bar.advance(task)
    results = {
        "kernels": kernels_name(ctx),
        "launches_per_layer": per_layer,  # eager: the layer's kernels, the unit the decode path is judged by
        # launches per step: kernel launches (eager) / graph replays plus any launch outside them (graph)
        "launches_per_step": {k: {"eager": v["eager"]["kernel_launches"],
                                  "graph": v["graph"]["graph_replays"] + v["graph"]["kernel_launches"]} for k, v in out.items()},
        "host_us_per_step": {k: {m: v[m]["host_us"] for m in ("eager", "graph")} for k, v in out.items()},
        "detail": out,
    }
    config = dict(steps=steps, prompt_len=prompt_len, budget=budget, block_size=block_size, max_num_seqs=64,
                  backend="trace (launches checked and counted, not run)",
                  timing="median wall time of engine.step() over the timed steps, after one warm step")
    ctx.release()
    return envelope(ctx, SUITE, config, results)


def table(doc: dict) -> Table:
    r = doc["results"]
    t = Table("step", "tokens", "launches (eager)", "host us (eager)", "launches (graph)", "host us (graph)",
              "graph: schedule+submit / wait / finish us", title=f"host cost of an engine step, kernels {r.get('kernels', '?')}, "
              f"{r.get('launches_per_layer', '?')} launches a layer (trace backend: kernels not run)")
    t.columns[0].no_wrap = True
    for k in KINDS:
        d = r["detail"][k]
        gp = d["graph"]["host_us_parts"]
        t.add_row(k, str(d["eager"]["step"]["tokens"]), str(r["launches_per_step"][k]["eager"]),
                  f"{r['host_us_per_step'][k]['eager']:.0f}", str(r["launches_per_step"][k]["graph"]),
                  f"{r['host_us_per_step'][k]['graph']:.0f}",
                  f"{gp['schedule']:.0f} / {gp['run']:.0f} / {gp['finish']:.0f}")
    return t


def plot(doc: dict, path):
    plt = pyplot()
    if plt is None:
        return None
    r = doc["results"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    x = np.arange(len(KINDS))
    for i, mode in enumerate(("eager", "graph")):
        parts = [r["detail"][k][mode]["host_us_parts"] for k in KINDS]
        bottom = np.zeros(len(KINDS))
        for j, (name, color) in enumerate((("schedule", "#4c72b0"), ("run", "#dd8452"), ("finish", "#55a868"))):
            vals = np.array([p[name] for p in parts])
            a1.bar(x + (i - 0.5) * 0.38, vals, 0.36, bottom=bottom, color=color, alpha=1.0 if mode == "graph" else 0.55,
                   label=f"{name}" if i == 1 else None, edgecolor="black", linewidth=0.3)
            bottom += vals
        for xi, total in zip(x, bottom):
            a1.text(xi + (i - 0.5) * 0.38, total, mode, ha="center", va="bottom", fontsize=7)
    a1.set_xticks(x, KINDS)
    a1.set_ylabel("host microseconds per engine step (median)")
    a1.set_title("where a step's host time goes (pale: eager)")
    a1.legend(fontsize=8)
    a1.grid(alpha=0.3, axis="y")
    ker = r["detail"]["decode_s1"]["eager"]["kernels"][:10]
    a2.barh([k["kernel"] for k in ker][::-1], [(k["bytes_read"] + k["bytes_written"]) / 1e6 for k in ker][::-1])
    a2.set_xlabel("MB moved per decode step (compulsory), S = 1")
    a2.set_title("bytes by kernel: the roofline's input")
    a2.grid(alpha=0.3, axis="x")
    fig.suptitle(f"{doc['model']['label']}: host cost of an engine step (trace backend: kernels counted, not run)",
                 fontsize=10)
    return save_fig(plt, fig, path)
