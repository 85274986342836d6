"""Cells of notebooks/01_packed_step.ipynb (built by make_notebooks.py)."""

from __future__ import annotations

from anatomy_cells import code, md  # notebooks/ is make_notebooks.py's folder


PACKED_STEP = [
    md("""
# One packed, paged step

sharpinf runs every forward step — prefill, chunked prefill, decode, or any mix — as **one flat batch
of N tokens from S sequences**, with no padding. A small descriptor (`sharpinf.step.batch.Batch`) says which
tokens belong to which sequence, at which absolute positions, and where each sequence's KV cache lives
in a shared **paged** pool (fixed-size blocks, handed out in any order).

This notebook builds one such step on a tiny synthetic model, looks at the descriptor, draws it, runs it
on the CUDA emulator (`emu` backend: the real CUDA C kernels, run on the CPU), and checks it with the
packed-vs-sequential oracle.
"""),
    code("""
import io

import matplotlib
matplotlib.use("Agg")  # headless; show(fig) below puts each figure in the notebook as a PNG
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Image, Markdown, display

from oracles import paths
from sharpinf.step.batch import Batch, SeqChunk
from sharpinf.step.forward import ForwardPass
from sharpinf.step.kv_pool import KVPool
from sharpinf.model.loader import load_model
from sharpinf.model.synth import synthetic_model
from sharpinf.runtime.select import get_backend

be = get_backend("emu")
model = load_model(synthetic_model("llama", "Q8_0", n_embd=128))  # 2 layers, 4 heads of 32, 512 tokens
fp = ForwardPass(model, be)
cfg = fp.cfg
def show(fig):
    \"\"\"Agg draws off-screen: render the figure to PNG and display it as the cell's output.\"\"\"
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    display(Image(data=buf.getvalue()))

print(f"{cfg.n_layer} layers, n_embd {cfg.n_embd}, {cfg.n_head} heads / {cfg.n_head_kv} KV heads, vocab {cfg.n_vocab}")
"""),
    md("""
## The KV pool and three sequences

The pool has `num_blocks` blocks of `block_size` slots (per layer, K and V). It is NaN-**poisoned**: a
kernel that reads a slot nobody wrote would turn the logits NaN. Blocks are handed out from a shuffled
free list, so block tables are not contiguous.

* **A** — a 14-token prompt prefilled in chunks: its first 6 tokens ran in an earlier step (their KV is
  cached), and this step carries the middle chunk, positions 6..9. It wants no logits yet.
* **B** — a fresh 5-token prompt, positions 0..4.
* **C** — a 7-token prompt prefilled earlier; this step decodes its next token at position 7.
"""),
    code("""
BLOCK = 4
pool = KVPool(be, cfg, num_blocks=12, block_size=BLOCK, kv_dtype="f16")
pool.poison()
free = np.random.default_rng(3).permutation(pool.num_blocks).tolist()

def blocks(n_tokens):
    return [free.pop() for _ in range(-(-n_tokens // BLOCK))]

rng = np.random.default_rng(0)
A, B, C = (rng.integers(0, cfg.n_vocab, n).tolist() for n in (14, 5, 7))
table = {"A": blocks(10), "B": blocks(5), "C": blocks(8)}  # enough for each sequence's context after this step

# the earlier step: A's first chunk and C's whole prompt
earlier = Batch.build([SeqChunk(A[:6], 0, table["A"][:2]), SeqChunk(C, 0, table["C"][:2])], BLOCK)
c_next = int(fp.greedy(earlier, pool)[1])  # C's greedy next token (argmax on the device)
print("block tables:", table, "  C's next token:", c_next)
"""),
    md("""
## The descriptor

`Batch.build` packs the three chunks. Per sequence: its rows `cu_seqlens[s]..cu_seqlens[s+1]-1`, its
context length after the step, and its block table (`-1` past the end). Per token: the id, the absolute
position, and the physical slot its K/V is written to: `block_table[pos // block_size] * block_size + pos % block_size`.
`logits_rows` lists the rows that go through the LM head: B's and C's last tokens, not A's (mid-prompt).
"""),
    code("""
step = [
    SeqChunk(A[6:10], 6, table["A"], want_logits=False),  # A: mid-prefill chunk over a cached prefix
    SeqChunk(B, 0, table["B"]),                           # B: fresh prompt
    SeqChunk([c_next], 7, table["C"]),                    # C: one decode token
]
batch = Batch.build(step, BLOCK).validate(pool.num_blocks, cfg.n_vocab)
names = ["A", "B", "C"]
seq_of = np.repeat(np.arange(batch.n_seqs), np.diff(batch.cu_seqlens))

def table_md(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return Markdown("\\n".join(lines))

display(Markdown(f"**N = {batch.n_tokens} tokens, S = {batch.n_seqs} sequences, block_size = {batch.block_size}**; "
                 f"`cu_seqlens` = {batch.cu_seqlens.tolist()}, `logits_rows` = {batch.logits_rows.tolist()}"))
display(table_md(["seq", "rows (cu_seqlens)", "context_lens", "block_tables row"],
                 [(names[s], f"{batch.cu_seqlens[s]}..{batch.cu_seqlens[s + 1] - 1}", batch.context_lens[s],
                   batch.block_tables[s].tolist()) for s in range(batch.n_seqs)]))
display(table_md(["row", "seq", "token_ids", "positions", "slot_mapping", "block.offset", "logits?"],
                 [(i, names[seq_of[i]], batch.token_ids[i], batch.positions[i], batch.slot_mapping[i],
                   f"{batch.slot_mapping[i] // BLOCK}.{batch.slot_mapping[i] % BLOCK}",
                   "yes" if i in batch.logits_rows else "") for i in range(batch.n_tokens)]))
"""),
    md("""
## Pictures

**(a)** `cu_seqlens` cuts the flat token axis into one span per sequence (labels: absolute positions).
**(b)** the block tables: row = sequence, column = logical block, cell = physical block id.
**(c)** the attention pattern the kernel realises: query row *i* of sequence *s* at position *p* sees the
slots holding positions 0..*p* of *s* — found through *s*'s block table. Over the pool's slots this is
block-diagonal causal per sequence, scattered by the tables; every visible slot was written either in an
earlier step (A's and C's prefixes) or in this one, before attention runs.
"""),
    code("""
colors = plt.get_cmap("tab10").colors
fig, ax = plt.subplots(figsize=(9, 1.6))
for s in range(batch.n_seqs):
    a, b = batch.cu_seqlens[s], batch.cu_seqlens[s + 1]
    ax.barh(0, b - a, left=a, color=colors[s], edgecolor="black", label=f"{names[s]}: rows {a}..{b - 1}")
    for i in range(a, b):
        ax.text(i + 0.5, 0, f"p{batch.positions[i]}", ha="center", va="center", fontsize=9)
for c in batch.cu_seqlens:
    ax.axvline(c, color="black", lw=2)
ax.set_xticks(batch.cu_seqlens)
ax.set_xlabel("token row (ticks: cu_seqlens)")
ax.set_yticks([])
ax.set_title("(a) the packed batch: N tokens, one span per sequence")
ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.6), ncol=3, frameon=False)
show(fig)
"""),
    code("""
tables = batch.block_tables
fig, axes = plt.subplots(1, 2, figsize=(10, 2.4), gridspec_kw={"width_ratios": [tables.shape[1], pool.num_blocks]})
grid = np.where(tables >= 0, np.arange(batch.n_seqs)[:, None], np.nan)
axes[0].imshow(grid, cmap="tab10", vmin=0, vmax=10, aspect="auto")
for s in range(tables.shape[0]):
    for j in range(tables.shape[1]):
        axes[0].text(j, s, str(tables[s, j]), ha="center", va="center", fontsize=11)
axes[0].set_yticks(range(batch.n_seqs), names)
axes[0].set_xticks(range(tables.shape[1]))
axes[0].set_xlabel("logical block")
axes[0].set_title("(b) block_tables: physical block ids")
owner = np.full(pool.num_blocks, np.nan)
for s in range(batch.n_seqs):
    owner[tables[s][tables[s] >= 0]] = s
axes[1].imshow(owner[None, :], cmap="tab10", vmin=0, vmax=10, aspect="auto")
axes[1].set_xticks(range(pool.num_blocks))
axes[1].set_yticks([])
axes[1].set_xlabel("physical block of the pool (white: free, still NaN)")
axes[1].set_title("who owns each block")
plt.tight_layout()
show(fig)
"""),
    code("""
visible = np.full((batch.n_tokens, pool.num_slots), np.nan)
for i in range(batch.n_tokens):
    s, p = seq_of[i], batch.positions[i]
    for j in range(p + 1):  # causal: positions 0..p of the same sequence
        visible[i, tables[s, j // BLOCK] * BLOCK + j % BLOCK] = s
fig, ax = plt.subplots(figsize=(10, 3.2))
ax.imshow(visible, cmap="tab10", vmin=0, vmax=10, aspect="auto", interpolation="nearest")
for x in range(0, pool.num_slots + 1, BLOCK):
    ax.axvline(x - 0.5, color="grey", lw=0.5)
ax.scatter(batch.slot_mapping, np.arange(batch.n_tokens), marker="x", color="black", label="slot written this step")
ax.set_yticks(range(batch.n_tokens), [f"{names[seq_of[i]]} p{batch.positions[i]}" for i in range(batch.n_tokens)])
ax.set_xticks(range(0, pool.num_slots, BLOCK), [f"blk {b}" for b in range(pool.num_blocks)], fontsize=8)
ax.set_xlabel("KV slot of the pool")
ax.set_title("(c) which (query, slot) pairs attention reads")
ax.legend(loc="upper right", fontsize=8)
show(fig)
print("visible pairs per query:", (~np.isnan(visible)).sum(axis=1).tolist(), "= positions + 1:", (batch.positions + 1).tolist())
"""),
    md("""
## Run the step

One call: embedding, per layer RMSNorm → fused QKV matmul → RoPE at each token's position → K/V written to
`slot_mapping` → varlen paged causal attention through the block tables → output projection and MLP; then
only the `logits_rows` go through the final norm and the LM head.
"""),
    code("""
logits = be.download(fp.forward(batch, pool).logits)
best = fp.greedy(batch, pool)  # the same step again, picking each row's argmax on the device
print("logits", logits.shape, "finite:", bool(np.isfinite(logits).all()))
for r, row in enumerate(batch.logits_rows):
    s = seq_of[row]
    print(f"row {row} ({names[s]}, position {batch.positions[row]}): greedy next token {best[r]}, "
          f"logit {logits[r, best[r]]:.3f}")
"""),
    md("""
## Check it: packed vs sequential

`oracle_packed_vs_sequential` prefills several prompts in **one** packed step and each **alone**, in fresh
poisoned pools with shuffled blocks, and compares every position's logits (argmax equal, top-5 overlap
≥ 4, |Δlogit| ≤ 1). Here with the three sequences' full contexts after this step.
"""),
    code("""
contexts = [A[:10], B, C + [c_next]]
result = paths.oracle_packed_vs_sequential(fp, contexts, kv_dtype="f16", block_size=BLOCK)
print(result)
assert result.passed
"""),
    code("""
# and this step's own logits agree with each sequence run alone from scratch
alone = paths.fresh_runner(fp, "f16", 8, BLOCK, seed=0)
for row, ctx in zip(batch.logits_rows, [B, C + [c_next]]):
    ref = alone.prefill_chunks(ctx, [len(ctx)])[-1]
    r = list(batch.logits_rows).index(row)
    print(f"{names[seq_of[row]]}: max |dlogit| vs alone = {np.abs(logits[r] - ref).max():.2e}, "
          f"argmax {int(np.argmax(ref))} == {best[r]}")
"""),
]
