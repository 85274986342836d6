"""Cells of notebooks/03_from_simple_to_fast.ipynb (built by make_notebooks.py)."""

from __future__ import annotations

from anatomy_cells import code, md  # notebooks/ is make_notebooks.py's folder


VARIANTS_NB = [
    md("""
# From simple to fast: one op, two kernels

Every op in sharpinf has a **readable baseline** kernel, and some have **faster variants** beside it, each
in its own file (the registry `sharpinf/ops/variants.toml` declares them; `sharpinf kernels list` shows them). This notebook takes the op that decides decode
speed — the quantized **matvec** `y = W x`, which reads every weight byte once per token — and puts its two
kernels side by side:

| | `matmul.cu` (float, the simple set's) | `matmul_dp4a.cu` (dp4a) |
|---|---|---|
| activations | float32, 4 bytes a value | q8_1: int8 + a scale and a sum per 32 values, ~1.1 bytes |
| weights | decoded to 32 floats per chunk | unpacked to 8 words of 4 int8 |
| dot product | 32 float FMAs per chunk | 8 `__dp4a` (4 int8 products each, exact), 1-2 float ops |
| lanes per row | 32 (14 idle at n_in = 576) | G = min(32, 2^⌊log2(n_in/32)⌋): all busy |
| epilogue | bias | bias, residual add `x += ...`, SwiGLU (gate_up_dp4a.cu) |

We read the idea of each, prove both with the oracles, measure both, and place them on the roofline.
Everything runs on the CPU emulator (`emu`: the same CUDA C, run on the CPU), so times here are the
emulator's; the GPU's come from `sharpinf bench --suite kernels` on a GPU machine.
"""),
    code("""
import io
import re

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Image, Markdown, display

from oracles import paths
from sharpinf.step.forward import ForwardPass
from sharpinf.model import quants
from sharpinf.model.loader import load_model
from sharpinf.model.synth import synthetic_model
from sharpinf.ops.matmul import matmul, matmul_reference
from sharpinf.ops.matmul_dp4a import group_lanes, matmul_dp4a, matmul_dp4a_reference
from sharpinf.ops.quant_act import Q8Act, quantize_q8_1, quantize_q8_1_reference
from sharpinf.ops.variants import variant_names
from sharpinf.runtime.paths import kernels_dir
from sharpinf.runtime.select import get_backend

be = get_backend("emu")

def show(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    display(Image(data=buf.getvalue()))

def header(name):
    \"\"\"A kernel file's header comment: what it computes, how, its launch shape and bound.\"\"\"
    lines = (kernels_dir() / name).read_text().splitlines()
    return "\\n".join(l for l in lines[: next(i for i, l in enumerate(lines) if not l.startswith("//"))])

print(variant_names())
"""),
    md("""
## The simple kernel

A warp takes 4 output rows and up to 8 tokens; lane `l` walks the row's 32-value chunks `l, l+32, ...`,
decodes each chunk to 32 floats once and folds it into one accumulator per token, then a fixed
xor-butterfly sums the 32 lanes. Its header:
"""),
    code("""
print(header("matmul.cu"))
"""),
    md("""
## The idea of the fast one: integers where the work is

Quantize the activation row once per step to **q8_1** (per 32 values: `d = amax/127`, `q = round(x/d)`,
and the sum `s` of the q). A weight chunk of a legacy type is `d_w · (q_w - offset)`, so

  Σ_j w_j x_j = d_w d_x Σ_j q_w,j q_x,j  −  offset · d_w d_x · s_x

and the sum in the middle is **integer and exact**: `__dp4a(a, b, acc)` adds four int8 products to an
int32 at once. Per chunk the float work shrinks to a couple of products. Here is that identity for one
Q4_0 chunk in NumPy, against the float dot of the dequantized values:
"""),
    code("""
rng = np.random.default_rng(0)
w = rng.standard_normal(32).astype(np.float32)
x = rng.standard_normal(32).astype(np.float32)
blk = quants.quantize(w[None], quants.qtype_from_name("Q4_0")).reshape(-1)  # 18 bytes: f16 d, 16 bytes of nibbles
d_w = float(blk[:2].view(np.float16)[0])
q_w = np.concatenate([blk[2:] & 0xF, blk[2:] >> 4]).astype(np.int32)       # 0..15, value = d_w * (q - 8)
q_x, d_x, s_x = quantize_q8_1_reference(x[None])
idot = int((q_w * q_x[0].astype(np.int32)).sum())                          # what 8 __dp4a compute
fast = d_w * float(d_x[0, 0]) * (idot - 8 * int(s_x[0, 0]))
w_deq = quants.dequantize(blk, quants.qtype_from_name("Q4_0"), (1, 32))[0]
x_deq = q_x[0] * d_x[0, 0]
print(f"integer form {fast:.6f}  ==  float dot of the same values {float(w_deq.astype(np.float64) @ x_deq):.6f}")
print(f"(and the q8_1 rounding of x itself moves the dot by {abs(float(w_deq @ x) - fast):.2e})")
"""),
    md("""
The rounding of the activations is the one new approximation — so the NumPy reference rounds them the
same way when it checks this path (`Reference(act_quant="q8_1")`), and the tolerance for what remains is
stated in `oracles/tolerances.py`. The header of the fast kernel:
"""),
    code("""
print(header("matmul_dp4a.cu"))
"""),
    md("""
## Both kernels on one SmolLM2-shaped matrix

The MLP down projection of SmolLM2-135M: 576 × 1536, Q4_0 here. Each kernel against its NumPy twin
(float reference for the simple one, the dequantized q8_1 input for the dp4a one), then **batch
invariance**: token 0 alone and in a tile of 8 must be bit-identical, for both kernels.
"""),
    code("""
n_out, n_in, qt = 576, 1536, quants.qtype_from_name("Q4_0")
W = quants.quantize(rng.standard_normal((n_out, n_in)).astype(np.float32) / np.sqrt(n_in), qt)
X = rng.standard_normal((8, n_in)).astype(np.float32)
W_dev, X_dev = be.upload(W), be.upload(X)
Xq = Q8Act.empty(be, 8, n_in)
quantize_q8_1(be, X_dev, Xq, 8, n_in)

def run_simple(n):
    y = be.empty((n, n_out), np.float32)
    matmul(be, W_dev, qt, X_dev, y, n, n_out, n_in)
    return be.download(y)

def run_dp4a(n):
    y = be.empty((n, n_out), np.float32)
    matmul_dp4a(be, W_dev, qt, Xq, y, n, n_out, n_in)
    return be.download(y)

ys, yd = run_simple(8), run_dp4a(8)
ref_f = matmul_reference(W, qt, X)
ref_q = matmul_dp4a_reference(W, qt, be.download(Xq.q), be.download(Xq.d))
scale = np.abs(ref_f).max()
print(f"simple vs float reference:      max |dy| = {np.abs(ys - ref_f).max() / scale:.1e} of max |y|")
print(f"dp4a   vs q8_1 reference:       max |dy| = {np.abs(yd - ref_q).max() / scale:.1e} of max |y|")
print(f"dp4a   vs float reference:      max |dy| = {np.abs(yd - ref_f).max() / scale:.1e} of max |y|  (the q8_1 rounding)")
print("alone == in a tile of 8, bit for bit:  simple", np.array_equal(run_simple(1)[0], ys[0]),
      "  dp4a", np.array_equal(run_dp4a(1)[0], yd[0]))
print(f"dp4a lanes per row at n_in = {n_in}: {group_lanes(n_in)}; at n_in = 576: {group_lanes(576)} "
      "(the simple kernel always uses 32)")
"""),
    md("""
## `verify` on both

The same oracles `sharpinf verify --kernels all` runs, on a small synthetic llama: the kernels against
the NumPy reference, and the cross-path oracles — packed vs sequential, chunked vs whole, batched decode vs
alone, other KV blocks, graph vs eager — which are **bit-exact** for both variants, because every kernel's
arithmetic for a token depends only on that token, its position and its own sequence's KV.
"""),
    code("""
model = load_model(synthetic_model("llama", "Q4_0", n_embd=128))
simple = ForwardPass(model, be, kernels="simple")
fast = simple.with_own_buffers(kernels="fast")  # the same uploaded weights, the fast kernels
rows = []
for fp in (simple, fast):
    for case in paths.path_cases(fp, kv_dtypes=("f16",)):
        r = case.run()
        rows.append((fp.choice.name, r.oracle, r.max_abs_dlogit, "pass" if r.passed else "FAIL " + r.detail))
        assert r.passed, r
table = "| kernels | oracle | max abs dlogit | verdict |\\n|---|---|---|---|\\n" + "\\n".join(
    f"| {k} | {o} | {d:.2e} | {v} |" for k, o, d, v in rows)
display(Markdown(table))
print("launches a layer:", {fp.choice.name: fp.launches_per_layer() for fp in (simple, fast)})
"""),
    md("""
## Measure both: `sharpinf bench --suite kernels`

The suite times every variant of every op on the model's own shapes at N = 1, 8, 64 tokens and reports
the achieved GB/s (compulsory bytes over time) beside the device's measured bandwidth. Here the matmul
rows on the emulator, where the timings only show the suite working: the emulator runs each thread's C++
on a CPU core, so fewer, wider integer operations are not what it rewards. Run it on a GPU for the real
table (`make gpu-check` writes it under `bench/results/gpu/`).
"""),
    code("""
from pathlib import Path
from rich.console import Console

from bench.suites import kernel_variants
from bench.suites.common import BenchContext

ctx = BenchContext(be, model, "synthetic llama Q4_0", Path("/tmp/sharpinf-nb03"), quick=True,
                   console=Console(file=io.StringIO(), force_jupyter=False), kernels="fast")
doc = kernel_variants.run(ctx, tokens=[1, 8], context=48, repeats=1, kv_dtype="f16")
mm = [r for r in doc["results"]["rows"] if r["op"] in ("matmul", "ffn_in")]
display(Markdown("| op | shape | N | variant | us (emulator) | x baseline |\\n|---|---|---|---|---|---|\\n" + "\\n".join(
    f"| {r['op']} | {r['shape']} | {r['tokens']} | {r['variant']} | {r['us']:.0f} | {r['speedup']:.2f} |" for r in mm)))
p = doc["results"]["ptxas"]
if p["available"]:
    print("ptxas -v (sm_90) of the fast kernels this model runs:",
          ", ".join(f"{e['entry']} {e['registers']} regs" for e in p["entries"]), f"-- {p['spills']} spill")
"""),
    md("""
## The roofline

A kernel can go no faster than the slower of two roofs: the arithmetic peak, and bandwidth × arithmetic
intensity (FLOPs per byte moved). A decode matvec does 2 FLOPs per weight and reads each weight once per
step, so at N tokens its intensity is about 2N / (bytes per weight): far left of the ridge, under the
**bandwidth** roof. That is why the fast variant is judged by **GB/s**, and why its gains are bytes
(the activations shrink 3.6x, the weights are read in wide words, every lane and SM is busy) rather than
FLOPs. Figures: an H100 SXM's datasheet (3.35 TB/s HBM3, 67 TFLOPS FP32 without tensor cores); the points
are this matrix's intensity for each variant and N. The FP32 roof is the simple kernel's (one float FMA
per weight and token); `__dp4a` does four multiply-adds per instruction, so the fast kernel's compute roof
sits higher and it stays on the bandwidth roof longer as N grows.
"""),
    code("""
BW, PEAK = 3.35e12, 67e12  # H100 SXM datasheet: bytes/s, FP32 FLOP/s (no tensor cores)
wbytes = W.nbytes
def intensity(n, act_bytes):
    return 2 * n * n_out * n_in / (wbytes + n * n_in * act_bytes + 4 * n * n_out)
I = np.logspace(-1, 3, 200)
fig, ax = plt.subplots(figsize=(7, 4.2))
ax.loglog(I, np.minimum(PEAK, BW * I) / 1e12, color="black", lw=1.5, label="roofline (H100 SXM datasheet)")
for name, ab, mk in (("float (float x)", 4.0, "o"), ("dp4a (q8_1 x)", 9 / 8, "s")):
    for n in (1, 8, 64):
        i = intensity(n, ab)
        ax.scatter([i], [min(PEAK, BW * i) / 1e12], marker=mk, s=40,
                   color={1: "C0", 8: "C1", 64: "C2"}[n], label=f"{name}, N={n}")
ax.axvline(PEAK / BW, color="grey", ls=":", lw=1)
ax.text(PEAK / BW * 1.1, 0.2, "ridge", color="grey")
ax.set_xlabel("arithmetic intensity (FLOP / byte)")
ax.set_ylabel("attainable TFLOP/s")
ax.set_title(f"576 x 1536 Q4_0: float FMAs leave the bandwidth roof at N ~ {PEAK / BW / 2 * wbytes / (n_out * n_in):.0f}")
ax.legend(fontsize=7, ncol=2)
ax.grid(alpha=0.3, which="both")
show(fig)
"""),
    md("""
## Your turn

Change a kernel — say, `DP_WARPS` in `kernels_cu/dp4a.cuh`, or the lane grouping in `matmul_dp4a.cu` — then

```
sharpinf verify MODEL --kernels all                     # every oracle, both kernel sets
pytest tests/test_kernels_matmul_dp4a.py                 # the kernel's own checks, exact where they can be
sharpinf bench MODEL --suite kernels --backend cuda      # GB/s beside the device's bandwidth
```

A new variant is a new file beside these two, with its header (algorithm, tiles, launch shape, expected
bound), its launcher, an entry in `sharpinf/ops/variants.toml` (docs/adding-a-variant.md), and every oracle
the baseline passes.
"""),
]
