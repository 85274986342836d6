"""Each variant of each op on the model's real shapes: time, achieved GB/s, share of the
device's measured bandwidth, and the speedup over the readable baseline.

    op          cases (layer 0's shapes and types)            variants
    norm        rmsnorm of N rows of n_embd                    simple -> float, dp4a -> q8_1 (fused)
    matmul      qkv, o, down, lm_head                          simple (float X), dp4a (q8_1 X), mma (N >= 16)
    ffn_in      gate + up + SwiGLU                             simple (2 matmuls + silu_gate), dp4a (gate_up_dp4a)
    rope_kv     qk-norm, RoPE, KV append                       simple (3-5 kernels), fused (rope_kv)
    attention   N sequences decoding at `context`              simple, split

for N = 1, 8, 64 tokens. GB/s counts the compulsory bytes (weights, activations in and out;
attention: the K/V of the context) over the median device time of a launch: on a GPU each case
runs back to back in a CUDA graph (bench.common.launch_timed), over enough copies of its weights
(or KV cache) to exceed the L2 cache, so small shapes are timed from device memory too.
Decode is bound by memory, so GB/s beside the measured device bandwidth (a device-to-device
copy) says how close a kernel is to the roofline. ptxas facts (registers, spills, shared
memory) of the fast kernels the model uses come along where NVRTC is installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from rich.console import Group
from rich.table import Table

from sharpinf.bench.common import BenchContext, envelope, launch_timed, pyplot, save_fig, title_of
from sharpinf.model import quants
from sharpinf.ops import attention as attn_ops
from sharpinf.ops import basic
from sharpinf.ops import kv_cache as kv_ops
from sharpinf.ops import matmul_mma as mma_ops
from sharpinf.ops import rope as rope_ops
from sharpinf.ops.matmul import matmul
from sharpinf.ops.matmul_dp4a import gate_up_dp4a, matmul_dp4a
from sharpinf.ops.quant_act import Q8Act, quantize_q8_1, rmsnorm_q8_1
from sharpinf.ops.variants import VARIANTS

SUITE = "kernels"
FAST_FILES = ("rmsnorm_q8_1.cu", "matmul_dp4a.cu", "gate_up_dp4a.cu", "rope_kv.cu", "attention_split.cu",
              "matmul_mma.cu", "gate_up_mma.cu")
# the variant names each bench op runs, baseline first (the norm and ffn_in ops are the matmul family's)
OP_VARIANTS = {"norm": VARIANTS["matmul"], "matmul": VARIANTS["matmul"], "ffn_in": VARIANTS["matmul"],
               "rope_kv": VARIANTS["rope_kv"], "attention": VARIANTS["attention"]}


def defaults(on_gpu: bool, quick: bool) -> dict:
    if on_gpu:
        return dict(tokens=[1, 8, 64], context=4096 if not quick else 1024, repeats=50 if not quick else 10,
                    kv_dtype="f16")
    if quick:
        return dict(tokens=[1, 8], context=48, repeats=1, kv_dtype="f16")
    return dict(tokens=[1, 8, 64], context=128, repeats=2, kv_dtype="f16")


@dataclass
class _Case:
    op: str
    shape: str
    variant: str
    tokens: int
    nbytes: int  # compulsory bytes moved by one call
    calls: list[Callable[[], None]]  # the same work over copies of its inputs (timed together, per call)
    flops: int = 0  # multiply-adds x 2 of one call (matmuls), for TFLOP/s at prefill sizes


ROTATE_BYTES = 256 << 20  # copies of a case's inputs add up to this, past any L2 cache (50-60 MB on Hopper)
MAX_COPIES = 64


def _copies(be, arr, nbytes: int) -> list:
    """arr and enough device copies of it that together they exceed the L2 cache (GPU only)."""
    if not be.gpu_shapes:
        return [arr]
    k = max(1, min(MAX_COPIES, -(-ROTATE_BYTES // max(1, nbytes))))
    host = be.download(arr)
    return [arr] + [be.upload(host) for _ in range(k - 1)]


def _cases(ctx: BenchContext, N: int, context: int, kv_dtype: str, rng) -> list[_Case]:
    """Every (op, shape, variant) at N tokens over fresh buffers (random data of the right form)."""
    be, fp = ctx.backend, ctx.forward_pass()
    cfg, L = fp.cfg, fp.layers[0]

    def rand(*shape, scale=1.0):
        return be.upload((rng.standard_normal(shape) * scale).astype(np.float32))

    def q8(x, n):
        out = Q8Act.empty(be, N, n)
        quantize_q8_1(be, x, out, N, n)
        return out

    x_e, x_ff, x_att = rand(N, cfg.n_embd), rand(N, cfg.n_ff), rand(N, cfg.q_dim)
    xq_e, xq_ff, xq_att = q8(x_e, cfg.n_embd), q8(x_ff, cfg.n_ff), q8(x_att, cfg.q_dim)
    cases: list[_Case] = []

    # norm: float out (then the float matmul reads 4 bytes a value) or q8_1 out (1 + 1/4 per 32)
    h, hq = be.empty((N, cfg.n_embd), np.float32), Q8Act.empty(be, N, cfg.n_embd)
    nb_in = 4 * N * cfg.n_embd + 4 * cfg.n_embd
    cases += [_Case("norm", f"{N}x{cfg.n_embd}", "simple", N, nb_in + 4 * N * cfg.n_embd,
                    [lambda: basic.rmsnorm(be, x_e, L.attn_norm, h, N, cfg.n_embd, cfg.rms_eps)]),
              _Case("norm", f"{N}x{cfg.n_embd}", "dp4a", N, nb_in + N * cfg.n_embd * 9 // 8,
                    [lambda: rmsnorm_q8_1(be, x_e, L.attn_norm, hq, N, cfg.n_embd, cfg.rms_eps)])]

    # matmuls: the layer's projections and the LM head, each variant into its own output
    mats = [(f"qkv {W.n_out}x{W.n_in}" if len(L.wqkv) == 1 else f"{n} {W.n_out}x{W.n_in}", W, x_e, xq_e)
            for n, W in zip("qkv" if len(L.wqkv) > 1 else ["qkv"], L.wqkv)]
    mats += [(f"o {L.wo.n_out}x{L.wo.n_in}", L.wo, x_att, xq_att),
             (f"down {L.w_down.n_out}x{L.w_down.n_in}", L.w_down, x_ff, xq_ff),
             (f"lm_head {fp.output.n_out}x{fp.output.n_in}", fp.output, x_e, xq_e)]
    for label, W, xf, xq in mats:
        y = be.empty((N, W.n_out), np.float32)
        wb = W.n_out * quants.row_bytes(W.qtype, W.n_in)
        shape = f"{label} {quants.qtype_name(W.qtype)}"
        ws = _copies(be, W.raw, wb)
        cases += [_Case("matmul", shape, "simple", N, wb + 4 * N * (W.n_in + W.n_out),
                        [lambda W=W, w=w, xf=xf, y=y: matmul(be, w, W.qtype, xf, y, N, W.n_out, W.n_in) for w in ws]),
                  _Case("matmul", shape, "dp4a", N, wb + N * W.n_in * 9 // 8 + 4 * N * W.n_out,
                        [lambda W=W, w=w, xq=xq, y=y: matmul_dp4a(be, w, W.qtype, xq, y, N, W.n_out, W.n_in)
                         for w in ws], flops=2 * N * W.n_out * W.n_in)]
        if N >= mma_ops.MIN_TOKENS and mma_ops.supports(W.qtype):
            cases.append(_Case("matmul", shape, "mma", N, wb + N * W.n_in * 9 // 8 + 4 * N * W.n_out,
                               [lambda W=W, w=w, xq=xq, y=y: mma_ops.matmul_mma(be, w, W.qtype, xq, y, N, W.n_out, W.n_in)
                                for w in ws], flops=2 * N * W.n_out * W.n_in))

    # the FFN's first half: gate and up and SwiGLU
    g, u = L.w_gate, L.w_up
    gate, up = be.empty((N, cfg.n_ff), np.float32), be.empty((N, cfg.n_ff), np.float32)
    wb = (g.n_out * quants.row_bytes(g.qtype, g.n_in) + u.n_out * quants.row_bytes(u.qtype, u.n_in))
    shape = f"gate+up 2x{cfg.n_ff}x{cfg.n_embd} {quants.qtype_name(g.qtype)}"

    gus = list(zip(_copies(be, g.raw, wb), _copies(be, u.raw, wb)))

    def ffn_simple(gw, uw):
        matmul(be, gw, g.qtype, x_e, gate, N, g.n_out, g.n_in)
        matmul(be, uw, u.qtype, x_e, up, N, u.n_out, u.n_in)
        basic.silu_gate(be, gate, up, gate, N * cfg.n_ff)

    cases.append(_Case("ffn_in", shape, "simple", N, wb + 4 * N * (cfg.n_embd + cfg.n_ff),
                       [lambda gw=gw, uw=uw: ffn_simple(gw, uw) for gw, uw in gus]))
    if g.qtype == u.qtype:
        cases.append(_Case("ffn_in", shape, "dp4a", N, wb + N * cfg.n_embd * 9 // 8 + 4 * N * cfg.n_ff,
                           [lambda gw=gw, uw=uw: gate_up_dp4a(be, gw, uw, g.qtype, xq_e, gate, N, cfg.n_ff, cfg.n_embd)
                            for gw, uw in gus], flops=4 * N * cfg.n_ff * cfg.n_embd))
    if g.qtype == u.qtype and N >= mma_ops.MIN_TOKENS and mma_ops.supports(g.qtype):
        cases.append(_Case("ffn_in", shape, "mma", N, wb + N * cfg.n_embd * 9 // 8 + 4 * N * cfg.n_ff,
                           [lambda gw=gw, uw=uw: mma_ops.gate_up_mma(be, gw, uw, g.qtype, xq_e, gate, N, cfg.n_ff,
                                                                     cfg.n_embd) for gw, uw in gus],
                           flops=4 * N * cfg.n_ff * cfg.n_embd))

    # rope + KV append (+ qk-norm), and attention: N sequences, each decoding at `context`
    bs = 16
    per_seq = -(-(context + 1) // bs)
    shape_kv, dt = kv_ops.kv_cache_shape(kv_dtype, N * per_seq + 1, bs, cfg.n_head_kv, cfg.head_dim)
    slots_total = shape_kv[0]
    k_cache, v_cache = (be.upload(kv_ops.encode_kv(kv_dtype, rng.standard_normal(
        (slots_total, cfg.n_head_kv, cfg.head_dim)).astype(np.float32))) for _ in range(2))
    qkv_w = cfg.q_dim + 2 * cfg.kv_dim
    qkv = rand(N, qkv_w, scale=0.5)
    positions = be.upload(np.full(N, context, np.int32))
    slots = be.upload((np.arange(N) * per_seq * bs + context).astype(np.int32))
    tables = be.upload(np.arange(N * per_seq, dtype=np.int32).reshape(N, per_seq))
    cu = be.upload(np.arange(N + 1, dtype=np.int32))
    kv_elt = int(np.prod(shape_kv[1:])) * np.dtype(dt).itemsize  # bytes of one slot's K (or V)
    rope_bytes = 4 * N * qkv_w + 4 * N * (cfg.q_dim + cfg.kv_dim) + 2 * N * kv_elt

    rope_args = (be, kv_dtype, qkv, qkv_w, positions, slots, L.q_norm, L.k_norm, k_cache, v_cache, N, cfg.n_head,
                 cfg.n_head_kv, cfg.head_dim, cfg.rope_theta, cfg.rms_eps, cfg.rope_style)
    cases += [_Case("rope_kv", f"{N} tokens", "simple", N, rope_bytes, [lambda: rope_ops.rope_kv_separate(*rope_args)]),
              _Case("rope_kv", f"{N} tokens", "fused", N, rope_bytes, [lambda: rope_ops.rope_kv(*rope_args)])]

    out = be.empty((N, cfg.q_dim), np.float32)
    att_bytes = 2 * N * (context + 1) * kv_elt + 8 * N * cfg.q_dim
    kvs = list(zip(_copies(be, k_cache, att_bytes // 2), _copies(be, v_cache, att_bytes // 2)))
    args = [(be, kv_dtype, qkv, qkv_w, kc, vc, tables, per_seq, cu, positions, out, N, N, cfg.n_head,
             cfg.n_head_kv, cfg.head_dim, bs, 1.0 / float(np.sqrt(cfg.head_dim))) for kc, vc in kvs]
    shape = f"{N} seqs x {context + 1} keys, KV {kv_dtype}"
    cases.append(_Case("attention", shape, "simple", N, att_bytes, [lambda a=a: attn_ops.attention(*a) for a in args]))
    if cfg.head_dim in attn_ops.SPLIT_HEAD_DIMS:
        scratch = attn_ops.SplitScratch.alloc(be, N, cfg.n_head, cfg.n_head_kv, cfg.head_dim)
        cases.append(_Case("attention", shape, "split", N, att_bytes,
                           [lambda a=a: attn_ops.attention_split(*a, scratch) for a in args]))
    return cases


def _ptxas(ctx: BenchContext) -> dict:
    """Registers / spills / shared memory of the fast kernels this model runs (sm_90)."""
    from sharpinf.runtime.ptxas_report import ptxas_available, ptxas_report

    why = ptxas_available()
    if why:
        return {"available": False, "why": why}
    fp = ctx.forward_pass()
    fast = fp if fp.choice.name == "fast" else fp.with_own_buffers(kernels="fast")  # the report is the fast set's
    used = {e for f, e in fast.kernels_used(fast.kv_dtype) if f in FAST_FILES}
    rows = [p.to_json() for p in ptxas_report(list(FAST_FILES), "sm_90", used)]
    return {"available": True, "arch": "sm_90", "entries": rows, "spills": sum(bool(r["spill_stores"] or r["spill_loads"])
                                                                                for r in rows)}


def run(ctx: BenchContext, tokens: list[int], context: int, repeats: int, kv_dtype: str) -> dict:
    be, cfg = ctx.backend, ctx.model.config
    if context + 1 >= cfg.context_length:
        raise ValueError(f"context {context} does not fit the model's context length {cfg.context_length}")
    bw = be.device_bandwidth()
    rng = np.random.default_rng(ctx.seed)
    rows = []
    with ctx.progress() as bar:
        task = None
        for N in tokens:
            cases = _cases(ctx, N, context, kv_dtype, rng)
            if task is None:
                task = bar.add_task(f"{SUITE}: {len(cases)} cases x N = {', '.join(map(str, tokens))}",
                                    total=len(cases) * len(tokens))
            for c in cases:
                times = launch_timed(be, c.calls, repeats)
                t = float(np.median(times))
                rows.append({"op": c.op, "shape": c.shape, "variant": c.variant, "tokens": N, "us": t * 1e6,
                             "us_min": min(times) * 1e6, "bytes": c.nbytes, "gb_s": c.nbytes / t / 1e9,
                             "tflops": c.flops / t / 1e12 if c.flops else None,
                             "pct_of_bandwidth": 100 * c.nbytes / t / 1e9 / bw if bw else None})
                bar.advance(task)
    base = {(r["op"], r["shape"], r["tokens"]): r["us"] for r in rows if r["variant"] == OP_VARIANTS[r["op"]][0]}
    for r in rows:
        r["speedup"] = base[(r["op"], r["shape"], r["tokens"])] / r["us"]
    config = dict(tokens=tokens, context=context, repeats=repeats, kv_dtype=kv_dtype,
                  timing="median of repeats of a graph replay (GPU: back-to-back calls over input copies past "
                         "the L2 cache, per call; elsewhere one call), after 1 warm-up",
                  bytes="compulsory: weights + activations in and out; attention: the context's K and V")
    results = {"device_bandwidth_gb_s": bw, "rows": rows, "ptxas": _ptxas(ctx)}
    ctx.release()
    return envelope(ctx, SUITE, config, results)


def table(doc: dict):
    r = doc["results"]
    bw = r["device_bandwidth_gb_s"]
    t = Table("op", "shape", "N", "variant", "us", "GB/s", "% of bw", "TFLOP/s", "x baseline",
              title=f"kernel variants (device bandwidth {f'{bw:,.0f} GB/s' if bw else 'not measured on this backend'})")
    t.columns[1].overflow = "fold"
    if doc["backend"] != "cuda":
        t.caption = f"on {doc['backend']}: the emulator's times, which say nothing about a GPU's"
    for row in r["rows"]:
        t.add_row(row["op"], row["shape"], str(row["tokens"]), row["variant"], f"{row['us']:,.1f}",
                  f"{row['gb_s']:,.2f}", "-" if row["pct_of_bandwidth"] is None else f"{row['pct_of_bandwidth']:.0f}%",
                  "-" if not row.get("tflops") else f"{row['tflops']:.2f}", f"{row['speedup']:.2f}")
    p = r["ptxas"]
    if not p.get("available"):
        return Group(t, f"ptxas report left out: {p.get('why')}")
    pt = Table("kernel", "registers", "spill st/ld (B)", "stack (B)", "smem (B)",
               title=f"ptxas -v, fast kernels of this model ({p['arch']}): {p['spills']} with spills")
    for e in p["entries"]:
        pt.add_row(e["entry"], str(e["registers"]), f"{e['spill_stores']}/{e['spill_loads']}", str(e["stack_bytes"]),
                   str(e["smem_bytes"]))
    return Group(t, pt)


def plot(doc: dict, path):
    plt = pyplot()
    if plt is None:
        return None
    r = doc["results"]
    rows, bw = r["rows"], r["device_bandwidth_gb_s"]
    Ns = sorted({row["tokens"] for row in rows})
    fig, axes = plt.subplots(1, len(Ns), figsize=(5.5 * len(Ns), 4.6), squeeze=False)
    for ax, N in zip(axes[0], Ns):
        sel = [row for row in rows if row["tokens"] == N]
        labels = list(dict.fromkeys(f"{row['op']}\n{row['shape'].split(' ')[0]}" for row in sel))
        for vi, kind in enumerate(("baseline", "fast")):
            xs, ys = [], []
            for row in sel:
                is_base = row["variant"] == OP_VARIANTS[row["op"]][0]
                if is_base == (kind == "baseline"):
                    xs.append(labels.index(f"{row['op']}\n{row['shape'].split(' ')[0]}") + (vi - 0.5) * 0.4)
                    ys.append(row["gb_s"])
            ax.bar(xs, ys, width=0.4, label="simple (baseline)" if kind == "baseline" else "fast variant")
        if bw:
            ax.axhline(bw, color="black", linestyle="--", linewidth=1, label=f"device bandwidth {bw:,.0f} GB/s")
        ax.set_xticks(range(len(labels)), labels, fontsize=7)
        ax.set_ylabel("achieved GB/s (compulsory bytes / time)")
        ax.set_title(f"N = {N} tokens")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    fig.suptitle(title_of(doc), fontsize=10)
    return save_fig(plt, fig, path)
