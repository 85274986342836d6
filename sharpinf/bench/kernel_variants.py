"""Each variant of each op on the model's real shapes: time, achieved GB/s, share of the
device's measured bandwidth, and the speedup over the readable baseline.

    op          cases (layer 0's shapes and types)            variants
    norm        rmsnorm of N rows of n_embd                    simple -> float, dp4a -> q8_1 (fused)
    matmul      qkv, o, down, lm_head                          simple (float X), dp4a (q8_1 X), mma (N >= 16)
    ffn_in      gate + up + SwiGLU                             simple (2 matmuls + silu_gate), dp4a (gate_up_dp4a)
    rope_kv     qk-norm, RoPE, KV append                       simple (3-5 kernels), fused (rope_kv)
    attention   N sequences decoding at `context`              simple, split, flash

for N = 1, 8, 64 tokens (decode). Prefill (rows marked "prefill"): the matmuls and gate+up at
N = 128, 512, 2048 tokens (simple, dp4a, mma; TFLOP/s beside the device's dense tensor-core peak
where known), and attention over one prompt of 512, 2048, 8192 tokens from position 0 (simple,
split, flash; TFLOP/s of the causal half: 2 x 2 x L(L+1)/2 x heads x head_dim). GB/s counts the compulsory bytes (weights, activations in and out;
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

from sharpinf.errors import SharpinfError
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
from sharpinf.ops.variants import variants_of

SUITE = "kernels"
FAST_FILES = ("rmsnorm_q8_1.cu", "matmul_dp4a.cu", "gate_up_dp4a.cu", "rope_kv.cu", "attention_split.cu", "attention_flash.cu",
              "matmul_mma.cu", "gate_up_mma.cu")
# the variant names each bench op runs, baseline first (the norm and ffn_in ops are the matmul family's)
OP_VARIANTS = {"norm": variants_of("matmul"), "matmul": variants_of("matmul"), "ffn_in": variants_of("matmul"),
               "rope_kv": variants_of("rope_kv"), "attention": variants_of("attention")}


PREFILL_REPEATS = 3  # prefill cases run long: fewer repeats


def defaults(on_gpu: bool, quick: bool) -> dict:
    if on_gpu:
        return dict(tokens=[1, 8, 64], context=4096 if not quick else 1024, repeats=50 if not quick else 10,
                    kv_dtype="f16", prefill=[128, 512, 2048] if not quick else [128],
                    prefill_context=[512, 2048, 8192] if not quick else [512])
    if quick:
        return dict(tokens=[1, 8], context=48, repeats=1, kv_dtype="f16", prefill=[16], prefill_context=[24])
    return dict(tokens=[1, 8, 64], context=128, repeats=2, kv_dtype="f16", prefill=[32], prefill_context=[64])


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


def _rand(be, rng, *shape, scale=1.0):
    return be.upload((rng.standard_normal(shape) * scale).astype(np.float32))


def _cases(ctx: BenchContext, N: int, context: int, kv_dtype: str, rng) -> list[_Case]:
    """Every (op, shape, variant) of a decode step at N tokens over fresh buffers (random data of
    the right form)."""
    be, fp = ctx.backend, ctx.forward_pass()
    cfg, L = fp.cfg, fp.layers[0]
    x_e = _rand(be, rng, N, cfg.n_embd)
    cases: list[_Case] = []

    # norm: float out (then the float matmul reads 4 bytes a value) or q8_1 out (1 + 1/4 per 32)
    h, hq = be.empty((N, cfg.n_embd), np.float32), Q8Act.empty(be, N, cfg.n_embd)
    nb_in = 4 * N * cfg.n_embd + 4 * cfg.n_embd
    cases += [_Case("norm", f"{N}x{cfg.n_embd}", "simple", N, nb_in + 4 * N * cfg.n_embd,
                    [lambda: basic.rmsnorm(be, x_e, L.attn_norm, h, N, cfg.n_embd, cfg.rms_eps)]),
              _Case("norm", f"{N}x{cfg.n_embd}", "dp4a", N, nb_in + N * cfg.n_embd * 9 // 8,
                    [lambda: rmsnorm_q8_1(be, x_e, L.attn_norm, hq, N, cfg.n_embd, cfg.rms_eps)])]
    cases += _linear_cases(ctx, N, rng, lm_head=True)
    return cases + _rope_attention_cases(ctx, N, context, kv_dtype, rng)


def _linear_cases(ctx: BenchContext, N: int, rng, lm_head: bool) -> list[_Case]:
    """The layer's projections (and the LM head), then gate + up + SwiGLU, at N tokens, each
    variant into its own output."""
    be, fp = ctx.backend, ctx.forward_pass()
    cfg, L = fp.cfg, fp.layers[0]

    def q8(x, n):
        out = Q8Act.empty(be, N, n)
        quantize_q8_1(be, x, out, N, n)
        return out

    x_e, x_ff, x_att = (_rand(be, rng, N, n) for n in (cfg.n_embd, cfg.n_ff, cfg.q_dim))
    xq_e, xq_ff, xq_att = q8(x_e, cfg.n_embd), q8(x_ff, cfg.n_ff), q8(x_att, cfg.q_dim)
    cases: list[_Case] = []
    mats = [(f"qkv {W.n_out}x{W.n_in}" if len(L.wqkv) == 1 else f"{n} {W.n_out}x{W.n_in}", W, x_e, xq_e)
            for n, W in zip("qkv" if len(L.wqkv) > 1 else ["qkv"], L.wqkv)]
    mats += [(f"o {L.wo.n_out}x{L.wo.n_in}", L.wo, x_att, xq_att),
             (f"down {L.w_down.n_out}x{L.w_down.n_in}", L.w_down, x_ff, xq_ff)]
    if lm_head:  # (a prefill step runs the head on one row a sequence: not a prefill GEMM)
        mats.append((f"lm_head {fp.output.n_out}x{fp.output.n_in}", fp.output, x_e, xq_e))
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
        basic.act_gate(be, gate, up, gate, N * cfg.n_ff, cfg.ffn_act)

    cases.append(_Case("ffn_in", shape, "simple", N, wb + 4 * N * (cfg.n_embd + cfg.n_ff),
                       [lambda gw=gw, uw=uw: ffn_simple(gw, uw) for gw, uw in gus]))
    if g.qtype == u.qtype:
        cases.append(_Case("ffn_in", shape, "dp4a", N, wb + N * cfg.n_embd * 9 // 8 + 4 * N * cfg.n_ff,
                           [lambda gw=gw, uw=uw: gate_up_dp4a(be, gw, uw, g.qtype, xq_e, gate, N, cfg.n_ff, cfg.n_embd,
                                                                act=cfg.ffn_act)
                            for gw, uw in gus], flops=4 * N * cfg.n_ff * cfg.n_embd))
    if g.qtype == u.qtype and N >= mma_ops.MIN_TOKENS and mma_ops.supports(g.qtype):
        cases.append(_Case("ffn_in", shape, "mma", N, wb + N * cfg.n_embd * 9 // 8 + 4 * N * cfg.n_ff,
                           [lambda gw=gw, uw=uw: mma_ops.gate_up_mma(be, gw, uw, g.qtype, xq_e, gate, N, cfg.n_ff,
                                                                     cfg.n_embd, act=cfg.ffn_act) for gw, uw in gus],
                           flops=4 * N * cfg.n_ff * cfg.n_embd))
    return cases


def _attention_variants(ctx: BenchContext, op: str, shape: str, N: int, nbytes: int, args: list, flops: int = 0,
                        window: int | None = None) -> list[_Case]:
    """The attention variants over the same argument tuples (one per K/V copy), as layer 0 runs them
    (its sliding window, if any: gemma3)."""
    be, cfg = ctx.backend, ctx.forward_pass().cfg
    sw = cfg.window(0)
    if sw:
        shape += f", window {sw}"
    cases = [_Case(op, shape, "simple", N, nbytes,
                   [lambda a=a: attn_ops.attention(*a, sliding_window=sw) for a in args], flops)]
    if cfg.head_dim not in attn_ops.SPLIT_HEAD_DIMS:
        return cases
    scratch = attn_ops.SplitScratch.alloc(be, window or N, cfg.n_head, cfg.n_head_kv, cfg.head_dim)
    cases.append(_Case(op, shape, "split", N, nbytes,
                       [lambda a=a: attn_ops.attention_split(*a, scratch, sliding_window=sw) for a in args], flops))
    if not attn_ops.flash_fits(cfg.n_head, cfg.n_head_kv, cfg.head_dim):
        cases.append(_Case(op, shape, "flash", N, nbytes,
                           [lambda a=a: attn_ops.attention_flash(*a, scratch, sliding_window=sw) for a in args],
                           flops))
    return cases


def _prefill_attention_cases(ctx: BenchContext, P: int, kv_dtype: str, rng) -> list[_Case]:
    """One prompt of P tokens attending causally from position 0 (its K/V already in the cache)."""
    be, cfg = ctx.backend, ctx.forward_pass().cfg
    bs = 16
    nblk = -(-P // bs)
    shape_kv, dt = kv_ops.kv_cache_shape(kv_dtype, nblk, bs, cfg.n_head_kv, cfg.head_dim)
    k_cache, v_cache = (be.upload(kv_ops.encode_kv(kv_dtype, rng.standard_normal(
        (shape_kv[0], cfg.n_head_kv, cfg.head_dim)).astype(np.float32))) for _ in range(2))
    qkv_w = cfg.q_dim + 2 * cfg.kv_dim
    qkv = _rand(be, rng, P, qkv_w, scale=0.5)
    positions, cu = be.upload(np.arange(P, dtype=np.int32)), be.upload(np.array([0, P], np.int32))
    tables = be.upload(np.arange(nblk, dtype=np.int32)[None, :])
    kv_bytes = int(np.prod(shape_kv)) * np.dtype(dt).itemsize
    nbytes = 2 * kv_bytes + 8 * P * cfg.q_dim
    out = be.empty((P, cfg.q_dim), np.float32)
    kvs = list(zip(_copies(be, k_cache, nbytes // 2), _copies(be, v_cache, nbytes // 2)))
    args = [(be, kv_dtype, qkv, qkv_w, kc, vc, tables, nblk, cu, positions, out, P, 1, cfg.n_head, cfg.n_head_kv,
             cfg.head_dim, bs, cfg.kq_scale) for kc, vc in kvs]
    flops = 4 * (P * (P + 1) // 2) * cfg.n_head * cfg.head_dim
    return _attention_variants(ctx, "attention", f"prefill 1 x {P} tokens, KV {kv_dtype}", P, nbytes, args, flops,
                               window=attn_ops.SPLIT_WINDOW)


def _rope_attention_cases(ctx: BenchContext, N: int, context: int, kv_dtype: str, rng) -> list[_Case]:
    """rope + KV append (+ qk-norm), and attention: N sequences, each decoding at `context`."""
    be, fp = ctx.backend, ctx.forward_pass()
    cfg, L = fp.cfg, fp.layers[0]
    cases: list[_Case] = []
    bs = 16
    per_seq = -(-(context + 1) // bs)
    shape_kv, dt = kv_ops.kv_cache_shape(kv_dtype, N * per_seq + 1, bs, cfg.n_head_kv, cfg.head_dim)
    slots_total = shape_kv[0]
    k_cache, v_cache = (be.upload(kv_ops.encode_kv(kv_dtype, rng.standard_normal(
        (slots_total, cfg.n_head_kv, cfg.head_dim)).astype(np.float32))) for _ in range(2))
    qkv_w = cfg.q_dim + 2 * cfg.kv_dim
    qkv = _rand(be, rng, N, qkv_w, scale=0.5)
    positions = be.upload(np.full(N, context, np.int32))
    slots = be.upload((np.arange(N) * per_seq * bs + context).astype(np.int32))
    tables = be.upload(np.arange(N * per_seq, dtype=np.int32).reshape(N, per_seq))
    cu = be.upload(np.arange(N + 1, dtype=np.int32))
    kv_elt = int(np.prod(shape_kv[1:])) * np.dtype(dt).itemsize  # bytes of one slot's K (or V)
    rope_bytes = 4 * N * qkv_w + 4 * N * (cfg.q_dim + cfg.kv_dim) + 2 * N * kv_elt

    theta, freq_scale = cfg.rope_for(0)
    rope_args = (be, kv_dtype, qkv, qkv_w, positions, slots, L.q_norm, L.k_norm, k_cache, v_cache, N, cfg.n_head,
                 cfg.n_head_kv, cfg.head_dim, theta, cfg.rms_eps, cfg.rope_style)
    cases += [_Case("rope_kv", f"{N} tokens", "simple", N, rope_bytes,
                    [lambda: rope_ops.rope_kv_separate(*rope_args, freq_scale=freq_scale)]),
              _Case("rope_kv", f"{N} tokens", "fused", N, rope_bytes,
                    [lambda: rope_ops.rope_kv(*rope_args, freq_scale=freq_scale)])]

    out = be.empty((N, cfg.q_dim), np.float32)
    att_bytes = 2 * N * (context + 1) * kv_elt + 8 * N * cfg.q_dim
    kvs = list(zip(_copies(be, k_cache, att_bytes // 2), _copies(be, v_cache, att_bytes // 2)))
    args = [(be, kv_dtype, qkv, qkv_w, kc, vc, tables, per_seq, cu, positions, out, N, N, cfg.n_head,
             cfg.n_head_kv, cfg.head_dim, bs, cfg.kq_scale) for kc, vc in kvs]
    shape = f"{N} seqs x {context + 1} keys, KV {kv_dtype}"
    return cases + _attention_variants(ctx, "attention", shape, N, att_bytes, args)


def _ptxas(ctx: BenchContext) -> dict:
    """Registers / spills / shared memory of the fast and tensor-core kernels this model runs (sm_90)."""
    from sharpinf.runtime.ptxas_report import ptxas_available, ptxas_report

    why = ptxas_available()
    if why:
        return {"available": False, "why": why}
    fp = ctx.forward_pass()
    used = set()  # the report covers the fast and the tensor-core sets
    for name in ("fast", "tensor"):
        try:
            other = fp if fp.choice.name == name else fp.with_own_buffers(kernels=name)
        except SharpinfError:  # a variant the model's shapes do not fit
            continue
        used |= {e for f, e in other.kernels_used(other.kv_dtype) if f in FAST_FILES}
    rows = [p.to_json() for p in ptxas_report(list(FAST_FILES), "sm_90", used)]
    return {"available": True, "arch": "sm_90", "entries": rows, "spills": sum(bool(r["spill_stores"] or r["spill_loads"])
                                                                                for r in rows)}


def run(ctx: BenchContext, tokens: list[int], context: int, repeats: int, kv_dtype: str,
        prefill: list[int] = (), prefill_context: list[int] = ()) -> dict:
    be, cfg = ctx.backend, ctx.model.config
    if context + 1 >= cfg.context_length:
        raise ValueError(f"context {context} does not fit the model's context length {cfg.context_length}")
    too_long = [P for P in prefill_context if P > cfg.context_length]
    if too_long:
        raise ValueError(f"prefill length {too_long[0]} does not fit the model's context length {cfg.context_length}")
    bw = be.device_bandwidth()
    rng = np.random.default_rng(ctx.seed)
    # (phase, N, cases): decode steps, then prefill GEMMs, then prefill attention
    groups = ([("decode", N, lambda N=N: _cases(ctx, N, context, kv_dtype, rng)) for N in tokens]
              + [("prefill", N, lambda N=N: _linear_cases(ctx, N, rng, lm_head=False)) for N in prefill]
              + [("prefill", P, lambda P=P: _prefill_attention_cases(ctx, P, kv_dtype, rng)) for P in prefill_context])
    rows = []
    with ctx.progress() as bar:
        task = bar.add_task(f"{SUITE}: decode N = {', '.join(map(str, tokens))}; prefill "
                            f"{', '.join(map(str, list(prefill) + list(prefill_context))) or 'none'}", total=len(groups))
        for phase, N, make in groups:
            for c in make():
                times = launch_timed(be, c.calls, repeats if phase == "decode" else min(repeats, PREFILL_REPEATS))
                t = float(np.median(times))
                rows.append({"phase": phase, "op": c.op, "shape": c.shape, "variant": c.variant, "tokens": N,
                             "us": t * 1e6, "us_min": min(times) * 1e6, "bytes": c.nbytes, "gb_s": c.nbytes / t / 1e9,
                             "tflops": c.flops / t / 1e12 if c.flops else None,
                             "pct_of_bandwidth": 100 * c.nbytes / t / 1e9 / bw if bw else None})
            bar.advance(task)
    base = {(r["op"], r["shape"], r["tokens"]): r["us"] for r in rows if r["variant"] == OP_VARIANTS[r["op"]][0]}
    for r in rows:
        r["speedup"] = base[(r["op"], r["shape"], r["tokens"])] / r["us"]
    config = dict(tokens=tokens, context=context, repeats=repeats, kv_dtype=kv_dtype, prefill=list(prefill),
                  prefill_context=list(prefill_context),
                  timing="median of repeats of a graph replay (GPU: back-to-back calls over input copies past "
                         "the L2 cache, per call; elsewhere one call), after 1 warm-up",
                  bytes="compulsory: weights + activations in and out; attention: the context's K and V")
    results = {"device_bandwidth_gb_s": bw, "rows": rows, "ptxas": _ptxas(ctx)}
    ctx.release()
    return envelope(ctx, SUITE, config, results)


def table(doc: dict):
    r = doc["results"]
    bw = r["device_bandwidth_gb_s"]
    t = Table("phase", "op", "shape", "N", "variant", "us", "GB/s", "% of bw", "TFLOP/s", "x baseline",
              title=f"kernel variants (device bandwidth {f'{bw:,.0f} GB/s' if bw else 'not measured on this backend'})")
    t.columns[2].overflow = "fold"
    if doc["backend"] != "cuda":
        t.caption = f"on {doc['backend']}: the emulator's times, which say nothing about a GPU's"
    for row in r["rows"]:
        t.add_row(row.get("phase", "decode"), row["op"], row["shape"], str(row["tokens"]), row["variant"], f"{row['us']:,.1f}",
                  f"{row['gb_s']:,.2f}", "-" if row["pct_of_bandwidth"] is None else f"{row['pct_of_bandwidth']:.0f}%",
                  "-" if not row.get("tflops") else f"{row['tflops']:.2f}", f"{row['speedup']:.2f}")
    p = r["ptxas"]
    if not p.get("available"):
        return Group(t, f"ptxas report left out: {p.get('why')}")
    pt = Table("kernel", "registers", "spill st/ld (B)", "stack (B)", "smem (B)",
               title=f"ptxas -v, fast and tensor-core kernels of this model ({p['arch']}): {p['spills']} with spills")
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
    rows = [row for row in rows if row.get("phase", "decode") == "decode"]  # the roofline view: decode
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
