"""Cells of notebooks/04_mixture_of_experts.ipynb (built by make_notebooks.py)."""

from __future__ import annotations

from anatomy_cells import code, md  # notebooks/ is make_notebooks.py's folder


MOE_NB = [
    md("""
# A mixture-of-experts step: routing, grouped experts, invariance

In a mixture-of-experts model (Qwen3-30B-A3B, Mixtral, gpt-oss...) each layer's FFN is `n_expert` small
FFNs, and a **router** sends every token to `k` of them. Batching gets interesting: the weights an expert
reads are shared only by the tokens that chose it, the loads are uneven, and a token's result must still
not depend on which other tokens share its experts. This notebook runs one packed step of a small
synthetic `qwen3moe` model (8 experts, 2 used) on the CPU emulator and looks at

1. **the routing** — which token went to which expert, with what weight (`moe_route.cu`);
2. **the grouped experts** — the (token, expert) pairs sorted by expert into tiles of at most 8, so an
   expert's weights are read once per tile (`moe_dp4a.cu`, the `grouped` variant);
3. **invariance** — every token's logits bit for bit the same alone, packed, and under skewed routing.

The formula, and the NumPy twins the kernels are checked against, are in `sharpinf/ops/moe.py`.
"""),
    code("""
import io

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Image, display

from sharpinf.model.loader import load_model
from sharpinf.model.synth import synthetic_model
from oracles import paths
from sharpinf.runtime.select import get_backend
from sharpinf.step.forward import ForwardPass

be = get_backend("emu")

def show(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    display(Image(data=buf.getvalue()))

model = load_model(synthetic_model("qwen3moe", "Q8_0", n_embd=128))
cfg = model.config
fp = ForwardPass(model, be, kernels="fast")
print(f"{cfg.n_layer} layers, {cfg.n_expert} experts a layer, {cfg.n_expert_used} used per token, "
      f"expert FFN {cfg.n_ff_exp}; moe variant: {fp.choice.moe}")
"""),
    md("""
## 1. One packed step and its routing

Two prompts in one step (12 + 7 tokens). After the step, the routing of every layer is still in the
step's scratch (`ws.moe.ids`, `ws.moe.wts`: per layer, pair `t * k + r` is token `t`'s `r`-th expert and
its renormalised weight, best first).
"""),
    code("""
prompts = [list(range(40, 52)), list(range(300, 307))]
runner = paths.fresh_runner(fp, "f16", paths.blocks_for([len(p) for p in prompts], 16), 16, 0)
sids = [runner.new_seq() for _ in prompts]
packed = runner.step(list(zip(sids, prompts)), all_logits=True)
k, T = cfg.n_expert_used, sum(len(p) for p in prompts)
ids = be.download(fp.ws.moe.ids)[:, : T * k].reshape(cfg.n_layer, T, k)
wts = be.download(fp.ws.moe.wts)[:, : T * k].reshape(cfg.n_layer, T, k)

fig, axes = plt.subplots(1, cfg.n_layer, figsize=(4.2 * cfg.n_layer, 4.5), sharey=True)
for layer, ax in enumerate(np.atleast_1d(axes)):
    grid = np.zeros((T, cfg.n_expert))
    for t in range(T):
        for r in range(k):
            grid[t, ids[layer, t, r]] = wts[layer, t, r]
    ax.imshow(grid, cmap="Blues", aspect="auto", vmin=0, vmax=1)
    ax.axhline(len(prompts[0]) - 0.5, color="tab:red", lw=1)
    ax.set_title(f"layer {layer}: token -> expert (weight)")
    ax.set_xlabel("expert")
np.atleast_1d(axes)[0].set_ylabel("token of the packed step (red line: next prompt)")
show(fig)
print("each token's weights sum to 1:", np.allclose(wts.sum(-1), 1.0, atol=1e-6))
"""),
    md("""
## 2. The grouped experts: pairs sorted by expert, in tiles

The `grouped` variant does not walk tokens: a counting sort (`moe_sort`) orders the step's pairs by expert and
cuts each expert's run into tiles of at most 8 pairs. One block of the gate+up and down kernels takes a
tile: it reads that expert's weights once for up to 8 tokens. The tiles below are the last layer's (the
scratch is reused layer after layer); a tile's bounds depend on the routing, but the launch shape
depends on the token count only (`max_tiles`), so one plan or CUDA graph serves every routing.
"""),
    code("""
from sharpinf.ops.mmq_tiles import max_tiles

from sharpinf.step.plan import bucket_for

Nb = bucket_for(T, fp.token_ladder)  # the step ran padded to its graph's size: padding tokens route too
P = Nb * k
mt = max_tiles(P, cfg.n_expert)  # the tiles a step of P pairs may need: its launch shape
flat = be.download(fp.ws.moe.tiles).reshape(-1)
tiles = np.stack([flat[:mt], flat[mt : 2 * mt], flat[2 * mt : 3 * mt]])  # expert, first sorted pair, pairs
live = tiles[:, tiles[2] > 0]
all_ids = be.download(fp.ws.moe.ids)[-1, :P]
load = np.bincount(all_ids, minlength=cfg.n_expert)
fig, ax = plt.subplots(figsize=(7, 3.2))
ax.bar(range(cfg.n_expert), load, color="lightgray", label="pairs routed to the expert")
for e, start, n in live.T:
    ax.bar(e, n, bottom=start - load[:e].sum(), fill=False, edgecolor="tab:blue", lw=1.5)
ax.set_xlabel("expert")
ax.set_ylabel("pairs (outlined: one tile each)")
ax.set_title(f"last layer: {P} pairs ({T} tokens + {Nb - T} padding, k = {k}) in {live.shape[1]} tiles "
             f"(the launch has {mt})")
show(fig)
assert live[2].sum() == P and (live[2] <= 8).all()
print("expert loads:", load.tolist(), "-- tiles per expert:", np.bincount(live[0], minlength=cfg.n_expert).tolist())
"""),
    md("""
## 3. Invariance: alone, packed, and a skewed batch

A token's output must not depend on the batch. Two things in the design make that hold: a token's `k`
expert outputs are summed in **rank order** (best expert first), never in the order pairs finish, and
inside a tile each pair's dot products follow `dp4a.cuh`'s fixed reduction order, whatever else is in
the tile. So each prompt's logits alone equal its rows of the packed step **bit for bit** -- and the same
holds for a model whose router sends every token to the same two experts (one expert, many tiles).
"""),
    code("""
def alone(fp, prompt):
    r = paths.fresh_runner(fp, "f16", paths.blocks_for([len(prompt)], 16), 16, 0)
    return r.step([(r.new_seq(), prompt)], all_logits=True)[0]

for p, rows in zip(prompts, packed):
    assert np.array_equal(alone(fp, p), rows), "a token's logits depend on its batch"
print("normal routing: every prompt alone == its rows of the packed step, bit for bit")

skewed = ForwardPass(load_model(synthetic_model("qwen3moe", "Q8_0", n_embd=128, routing="skewed")), be, kernels="fast")
prompts2 = [list(range(10, 30)), list(range(60, 66))]
r = paths.fresh_runner(skewed, "f16", paths.blocks_for([len(p) for p in prompts2], 16), 16, 0)
packed2 = r.step([(r.new_seq(), p) for p in prompts2], all_logits=True)
ids2 = be.download(skewed.ws.moe.ids)[0, : 26 * k]
for p, rows in zip(prompts2, packed2):
    assert np.array_equal(alone(skewed, p), rows)
print("skewed routing: experts used", sorted(set(ids2.tolist())), "by all 26 tokens; alone == packed, bit for bit")
r2 = paths.oracle_chunked_vs_whole(fp, list(range(5, 45)), "f16", 16, chunks=[1, 3, 8, 28])
print(r2.oracle, r2.case, "->", "pass" if r2.passed else "FAIL", f"(max |dlogit| {r2.max_abs_dlogit})")
assert r2.passed and r2.max_abs_dlogit == 0.0
"""),
    md("""
`sharpinf verify MODEL --kernels all` runs these oracles (and the rest) on any qwen3moe GGUF, and
`tests/test_llamacpp_agreement.py` holds the NumPy reference's routing to llama.cpp's on a synthetic
file. Still to come: a tensor-core grouped GEMM for prefill (the `tensor` set runs these dp4a tiles), and
the Qwen3-30B-A3B shape timed beside llama.cpp on a GPU.
"""),
]
