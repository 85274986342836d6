"""Cells of notebooks/05_gpt_oss.ipynb (built by make_notebooks.py)."""

from __future__ import annotations

from anatomy_cells import code, md  # notebooks/ is make_notebooks.py's folder

GPT_OSS_NB = [
    md("""
# gpt-oss's two oddities: attention sinks and MXFP4 experts

gpt-oss (llama.cpp's `openai-moe` graph) changes two things a kernel researcher meets at once:

1. **attention sinks** -- every query head has one learned logit `z` that joins its softmax: the max is
   `max(scores, z)` and the sum gets `exp(z - max)`, but the sink is no key and has no value. A head can
   put weight on "nothing", so the weights over the real keys sum to less than one;
2. **MXFP4 experts** -- blocks of 32 values, each a 4-bit e2m1 number (16 levels) times one shared
   power-of-two scale (an e8m0 byte): 17 bytes for 32 weights.

This notebook looks at both on a small synthetic gpt-oss (`sharpinf models synth --arch gpt-oss`),
through the NumPy reference (`oracles/reference.py`), the truth the kernels are held to -- which itself
equals llama.cpp's log-probabilities on this file (tests/test_llamacpp_agreement.py, `gpt-oss-f32`).
"""),
    code("""
import io

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Image, display

from oracles.reference import Reference
from sharpinf.model import quants
from sharpinf.model.loader import load_model
from sharpinf.model.synth import synthetic_model

def show(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    display(Image(data=buf.getvalue()))

model = load_model(synthetic_model("gpt-oss", "Q8_0"))
cfg = model.config
ref = Reference(model)
print(f"{cfg.n_layer} layers (windows {cfg.layer_window}), {cfg.n_head} query heads, "
      f"{cfg.n_expert} experts of which {cfg.n_expert_used} a token, gating {cfg.moe_gating}, act {cfg.ffn_act}")
print("layer 0's sinks:", np.round(ref.layers[0].sinks, 3))
"""),
    md("""
## 1. One head's attention weights, with and without its sink

Run 24 tokens through the reference, keep every layer's queries and keys (layer 1 attends to the whole
context; layer 0 slides over 16 keys), and take the query and head whose sink takes the most weight: its
weights as the model forms them (sink in the softmax) and with the sink dropped. The bar at `sink` is the
weight the head gives to nothing: `exp(z - m) / sum`.
"""),
    code("""
ids = np.random.default_rng(0).integers(0, cfg.n_vocab, 24).tolist()
seen = []  # each layer's attention inputs, as the reference's forward hands them over
attend = ref._attention
ref._attention = lambda q, keys, vals, mask, sinks=None: (seen.append((q, keys, mask, sinks)),
                                                          attend(q, keys, vals, mask, sinks))[1]
ref.logits(ids)
ref._attention = attend

def weights(layer, t, head, sink=True):
    q, keys, mask, sinks = seen[layer]
    scores = (q[t, head] @ keys[: t + 1, head // cfg.gqa_group].T) * np.float32(cfg.kq_scale) + mask[t, : t + 1]
    m = max(scores.max(), sinks[head]) if sink else scores.max()
    e = np.exp(scores - m)
    return e / (e.sum() + (np.exp(sinks[head] - m) if sink else 0))

# the (layer, query, head) from position 3 on whose sink takes the most weight
layer, t, head = max(((l, t, h) for l in range(cfg.n_layer) for t in range(3, len(ids)) for h in range(cfg.n_head)),
                     key=lambda c: 1 - weights(*c).sum())
z, with_sink, without = seen[layer][3][head], weights(layer, t, head), weights(layer, t, head, sink=False)
fig, ax = plt.subplots(figsize=(9, 3))
x = np.arange(t + 1)
ax.bar(x - 0.2, without, 0.4, label="no sink")
ax.bar(x + 0.2, with_sink, 0.4, label=f"sink z = {z:.2f}")
ax.bar([t + 1.2], [1 - with_sink.sum()], 0.4, color="grey", label="weight on the sink")
ax.set_xticks(list(x) + [t + 1], [str(i) for i in x] + ["sink"], fontsize=7)
ax.set_xlabel("key position"); ax.set_ylabel("weight"); ax.legend(fontsize=8)
ax.set_title(f"layer {layer}, head {head}: query {t}'s weights")
show(fig)
print(f"weights over the keys sum to {with_sink.sum():.3f} with the sink, {without.sum():.3f} without")
"""),
    md("""
## 2. One MXFP4 block, byte by byte

An expert's row is a run of 17-byte blocks. Byte 0 is the exponent `e`: the scale is `2^(e - 127) / 2`
(the half undoes the levels' doubling). Bytes 1..16 hold 32 nibbles, Q4_0's order: value `j` is the low
nibble of byte `j`, value `j + 16` the high one. A nibble indexes 16 levels: the e2m1 numbers
0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, stored doubled as integers.
"""),
    code("""
t = model.tensors["blk.0.ffn_up_exps.weight"]
print(t.name, t.qtype_name, t.shape, f"{t.raw.shape[1]} bytes a row of {t.shape[-1]} values")
block = np.asarray(t.raw[0, :17])
e, qs = int(block[0]), block[1:]
nibbles = np.concatenate([qs & 0x0F, qs >> 4])
scale = float(quants.e8m0_half(np.array([e], np.uint8))[0])
values = quants.dequantize(block, quants.MXFP4, (32,))
assert np.array_equal(values, scale * quants.MXFP4_LEVELS[nibbles].astype(np.float32))
print(f"exponent byte {e}: scale 2^({e} - 127) / 2 = {scale:g}")
fig, (a, b) = plt.subplots(1, 2, figsize=(10, 2.8))
a.bar(range(32), nibbles); a.set_title("the 32 nibbles (level indices)"); a.set_xlabel("value j")
b.bar(range(32), values); b.set_title(f"decoded: levels x {scale:g}"); b.set_xlabel("value j")
show(fig)
print("levels (doubled):", quants.MXFP4_LEVELS.tolist())
"""),
]
