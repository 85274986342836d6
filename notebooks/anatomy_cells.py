"""Cells of notebooks/02_anatomy_of_a_step.ipynb (built by make_notebooks.py)."""

from __future__ import annotations

from nbformat.v4 import new_code_cell, new_markdown_cell


def md(s: str):
    return new_markdown_cell(s.strip("\n"))


def code(s: str):
    return new_code_cell(s.strip("\n"))


ANATOMY = [
    md("""
# Anatomy of one engine step

Between two steps of the GPU, the host has to decide what runs, describe it, get the description to the
GPU, start the kernels and read back the chosen tokens. If that takes longer than the GPU's own work, the
GPU waits: the "eating air" sharpinf exists to end. This notebook follows one step of the engine through

1. **schedule** — which sequences run, and how many tokens each (`engine/scheduler.py`);
2. **batch** — the flat, packed descriptor of those tokens (`step/batch.py`);
3. **one upload** — the descriptor written into one pinned staging buffer and sent with one copy
   (`step/buffers.py`);
4. **the plan** — the step's kernel launches, prepared once per bucket over fixed buffers (`step/plan.py`);
5. **graph replay** — the plan captured once as a CUDA graph and replayed (`step/graphs.py` captures, `step/plan.py` replays);
6. **one wait** — for that step's own event: the sampled ids back through pinned memory, then stop
   rules and text. With async scheduling (the default) the engine has already queued the next step
   by then, so this bookkeeping runs while the GPU works (`eng.runner.last_batch` is that next step).

It runs on the CPU emulator with a tiny model; the last section measures the host cost on the trace
backend, which checks and counts every launch without running it.
"""),
    code("""
import io
import json
from collections import Counter
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Image, display

from sharpinf.llm import LLM
from sharpinf.model.synth import synthetic_model
from sharpinf.params import SamplingParams

def show(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    display(Image(data=buf.getvalue()))

model = synthetic_model("llama", "Q8_0", n_embd=128)
llm = LLM(model, backend="emu", num_blocks=64, block_size=4, max_num_batched_tokens=24, max_num_seqs=4)
eng = llm.engine
fp = eng.fp
print("graphs captured at start-up:", eng.graph_report)
print("kernels compiled ahead:", fp.compile_report)
"""),
    md("""
## 1. Schedule

Three requests: two short prompts that will be decoding, and a long one that arrives later and is
prefilled in chunks. After a few steps the scheduler makes a **mixed** step: the decodes first, then a
chunk of the long prompt, within the token budget of 24.
"""),
    code("""
rng = np.random.default_rng(0)
sp = SamplingParams(max_tokens=12, ignore_eos=True)
for n in (5, 9):
    eng.add_request(rng.integers(3, 500, n).tolist(), sp)
for _ in range(2):
    eng.step()
eng.add_request(rng.integers(3, 500, 50).tolist(), SamplingParams(max_tokens=3, temperature=0.8, seed=7))
outs = eng.step()
batch = eng.runner.last_batch
cu = batch.cu_seqlens
for s in range(batch.n_seqs):
    a, b = cu[s], cu[s + 1]
    print(f"sequence {s}: tokens {a}..{b - 1}  positions {batch.positions[a]}..{batch.positions[b - 1]}  "
          f"{'samples a token' if (b - 1) in batch.logits_rows else 'mid-prompt chunk: no logits'}")
print("step times (s):", eng.last_step_times)
"""),
    md("""
## 2. The batch and its descriptor: one copy

`Batch` is the flat description: `token_ids`, `positions`, `cu_seqlens`, `block_tables`, `slot_mapping`,
`logits_rows`. The forward pass writes it, with the sampling parameters and the repetition-penalty
history's new ids, into **one pinned staging buffer** laid out once for the engine's capacity, and sends
it with **one asynchronous copy** that stops after the last live block-table row. The step is padded up
to its **bucket**: padding tokens sit in an extra sequence whose block table is the pool's scratch block,
so they write and read only there.
"""),
    code("""
d = fp.descriptor
print(f"{'field':<14}{'dtype':<9}{'entries':>8}{'offset':>8}")
for name, f in d.fields.items():
    print(f"{name:<14}{str(f.dtype):<9}{f.count:>8}{f.offset:>8}")
live = d.fields["block_tables"].offset + batch.n_seqs * d.width * 4
print(f"\\nthis step uploads {live} of the descriptor's {d.nbytes} bytes in one copy")
print("bucket ladder (tokens):", fp.token_ladder, " this step:", batch.n_tokens, "tokens")
print("cu_seqlens as sent: the real sequences, empty ones, then the padding sequence:", d.h["cu_seqlens"])
"""),
    md("""
## 3. The plan

A plan is the list of the step's kernel launches with their arguments checked and packed once
(`Backend.prepare`), over buffers that never move: the activations (`Workspace`) and the device copy of
the descriptor. The per-step values live in those buffers, not in the launches, so one plan serves every
step of its bucket. A step runs two plans: the **body** (embedding and the layers, keyed by the padded
token count) and the **head** (the logits rows: gather, norm, LM head, sampling, keyed by the padded row
count). Eager mode runs the launches one by one; a CUDA graph captures them once.
"""),
    code("""
for key, plan in sorted(fp.plans.items(), key=str):
    print(key, len(plan), "launches")
body_key = max((k for k in fp.plans if k[0] == "body" and k[1] >= batch.n_tokens), key=lambda k: -k[1])
body = fp.plans[body_key]
print(f"\\nthis step's body plan {body_key}: first launches")
for l in body[:8]:
    print(f"  {l.name:<22} grid {l.grid}  block {l.block}  reads {l.io[0]:>8} B  writes {l.io[1]:>7} B")
print("kernels per body plan:", dict(Counter(l.name for l in body)))
"""),
    md("""
## 4. Graph replay

At start-up the engine captured one graph per token bucket (body) and per row bucket (head), after
sizing the KV pool. Each step replays two of them. On the emulator a "graph" is its recorded launches,
and every replay checks that no recorded buffer was freed or replaced since capture — the bug that on a
GPU silently reads stale memory. Graphs change nothing but the host's work: the same requests run eagerly
give the same tokens.
"""),
    code("""
before = fp.graph_replays
eng.step()
print("plans replayed from graphs in that step:", fp.graph_replays - before)

def run(enforce_eager):
    l = LLM(model, backend="emu", num_blocks=64, block_size=4, max_num_batched_tokens=24, max_num_seqs=4,
            enforce_eager=enforce_eager)
    r = np.random.default_rng(1)
    prompts = [r.integers(3, 500, n).tolist() for n in (5, 40, 9)]
    return [o.token_ids for o in l.generate(prompts, SamplingParams(max_tokens=6, temperature=0.9, seed=3))]

graphs, eager = run(False), run(True)
print("graphs:", graphs)
print("eager: ", eager)
assert graphs == eager
"""),
    md("""
## 5. What the host costs

`sharpinf bench MODEL --suite host` runs the engine on the **trace backend**: every launch is checked
against the kernel's real parameter list and counted, none is run, so the wall time of `engine.step()`
is the host's share alone: scheduling, the batch and its upload, the launches or graph replays, the
sampled ids and the stop rules. Here on the tiny model; below, the committed figures for SmolLM2's shape.
"""),
    code("""
from bench.suites import host_cost
from bench.suites.common import BenchContext
from sharpinf.model.loader import load_model
from sharpinf.runtime.select import get_backend

ctx = BenchContext(get_backend("emu"), load_model(model), "tiny synthetic llama", Path("/tmp"), quick=True)
doc = host_cost.run(ctx, **host_cost.defaults(False, True))
for kind, v in doc["results"]["host_us_per_step"].items():
    n = doc["results"]["launches_per_step"][kind]
    print(f"{kind:<11} eager {v['eager']:7.0f} us ({n['eager']} launches)   graph {v['graph']:7.0f} us ({n['graph']} replays)")
"""),
    code("""
committed = Path("bench/results/host/host.json")
if committed.exists():
    smol = json.loads(committed.read_text())
    print("model:", smol["model"]["label"], "| measured on", smol["host"]["machine"], smol["timestamp"])
    for kind, v in smol["results"]["host_us_per_step"].items():
        print(f"{kind:<11} eager {v['eager']:7.0f} us   graph {v['graph']:7.0f} us")
    show_doc = smol
else:
    show_doc = doc
kinds = list(show_doc["results"]["host_us_per_step"])
fig, ax = plt.subplots(figsize=(7, 3.5))
x = np.arange(len(kinds))
for i, mode in enumerate(("eager", "graph")):
    parts = [show_doc["results"]["detail"][k][mode]["host_us_parts"] for k in kinds]
    bottom = np.zeros(len(kinds))
    for name, color in (("schedule", "#4c72b0"), ("run", "#dd8452"), ("finish", "#55a868")):
        vals = np.array([p[name] for p in parts])
        ax.bar(x + (i - 0.5) * 0.38, vals, 0.36, bottom=bottom, color=color, alpha=0.55 if mode == "eager" else 1,
               label=name if i else None)
        bottom += vals
ax.set_xticks(x, kinds)
ax.set_ylabel("host us per step (pale: eager)")
ax.legend()
ax.set_title(show_doc["model"]["label"])
show(fig)
"""),
]
