"""Each variant of each op on the model's real shapes: time, achieved GB/s, share of the
device's measured bandwidth, and the speedup over the op's readable baseline. The variants are the
registry's (`sharpinf kernels list`); the cases, per bench op (kernel_cases.BENCH_OPS):

    norm        rmsnorm of N rows of n_embd: the norm each matmul variant declares (float or q8_1)
    matmul      qkv, o, down, lm_head: each matmul variant that serves the weight type at N tokens
    ffn_in      gate + up + activation: each matmul variant's fused gate+up (the baseline: 2 matmuls + act)
    ffn         the dense FFN of a decode step: each fused ffn variant beside the separate launches
    link        all between two attentions at decode (o-proj, FFN norm + FFN, the next norm, QKV,
                rope_kv): each link variant beside the separate launches
    attention   N sequences decoding at `context` (split and flash in their launch shapes)
    rope_kv     qk-norm, RoPE, KV append
    moe         router, the experts the tokens pick, combine (MoE models: no ffn_in or down matmul then)
    sample      one token for each of N logits rows

for N = 1, 8, 64 tokens (decode). Prefill (rows marked "prefill"): the matmuls, gate+up and moe at
N = 128, 512, 2048 tokens (TFLOP/s beside the device's dense tensor-core peak where known), and
attention over one prompt of 512, 2048, 8192 tokens from position 0 (TFLOP/s of the causal half:
2 x 2 x L(L+1)/2 x heads x head_dim). GB/s counts the compulsory bytes (weights, activations in and
out; attention: the K/V of the context; moe: the router and each expert the routing picked, its gate,
up and down once) over the median device time of a launch: on a GPU each case runs back to back in a
CUDA graph (bench.common.launch_timed), over enough copies of its weights (or KV cache) to exceed the
L2 cache, so small shapes are timed from device memory too. A moe row also holds its launch's expert
load (`expert_load`: the (token, expert) pairs each expert got, read back from the routing ids; random
rows spread over the experts as a trained router's need not). Decode is bound by memory, so GB/s
beside the measured device bandwidth (a device-to-device copy) says how close a kernel is to the
roofline. ptxas facts (registers, spills, shared memory) of the non-baseline kernels the model uses
come along where NVRTC is installed.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from rich.console import Group
from rich.table import Table

from bench.suites.common import BenchContext, check_context, envelope, launch_timed, pyplot, save_fig, title_of
from bench.suites.kernel_attention_cases import prefill_attention_cases, rope_attention_cases
from bench.suites.kernel_cases import (BENCH_OPS, DENSE_FFN_OPS, Case, Selection, linear_cases, moe_cases,
                                       norm_cases, rand, sample_cases)
from sharpinf.errors import SharpinfError
from sharpinf.ops.variants import OP_NAMES, REGISTRY, baseline

__all__ = ["BENCH_OPS", "Selection", "case_groups", "check_ops", "defaults", "fast_files", "plot", "run", "table"]
SUITE = "kernels"

EMU_NOTE = ("emulator times: each thread's C++ on one core, so they rank nothing a GPU would do; "
            "they show the harness runs and what each variant launches")


def fast_files() -> tuple[str, ...]:
    """The kernel files of every variant but the baselines (the ptxas report's scope)."""
    return tuple(dict.fromkeys(f for op in OP_NAMES for v in list(REGISTRY[op].values())[1:] for f in v.files))


PREFILL_REPEATS = 3  # prefill cases run long: fewer repeats


EMU_REPEATS = 5  # the emulator's times vary run to run (1 ms to 4 ms for one kernel): min / median / max of 5


def defaults(on_gpu: bool, quick: bool) -> dict:
    if on_gpu:
        return dict(tokens=[1, 8, 64], context=4096 if not quick else 1024, repeats=50 if not quick else 10,
                    kv_dtype="f16", prefill=[128, 512, 2048] if not quick else [128],
                    prefill_context=[512, 2048, 8192] if not quick else [512])
    if quick:
        return dict(tokens=[1], context=48, repeats=EMU_REPEATS, kv_dtype="f16", prefill=[16], prefill_context=[24])
    return dict(tokens=[1, 8, 64], context=128, repeats=EMU_REPEATS, kv_dtype="f16", prefill=[32], prefill_context=[64])


def _cases(ctx: BenchContext, N: int, context: int, kv_dtype: str, rng, sel: Selection) -> list[Case]:
    """Every selected (op, shape, variant) of a decode step at N tokens over fresh buffers (random data of
    the right form)."""
    x_e = rand(ctx.backend, rng, N, ctx.forward_pass().cfg.n_embd)
    return (norm_cases(ctx, N, rng, sel, x_e) + linear_cases(ctx, N, rng, lm_head=True, sel=sel)
            + rope_attention_cases(ctx, N, context, kv_dtype, rng, sel) + moe_cases(ctx, N, rng, sel)
            + sample_cases(ctx, N, rng, sel))


def _ptxas(ctx: BenchContext, sel: Selection) -> dict:
    """Registers / spills / shared memory of the selected non-baseline variants' kernels this model runs
    (sm_90): the named sets' and every other registered variant's."""
    from sharpinf.ops.variants import choices_for
    from sharpinf.runtime.ptxas_report import ptxas_available, ptxas_report

    why = ptxas_available()
    if why:
        return {"available": False, "why": why}
    fp = ctx.forward_pass()
    mine = {f for op in {BENCH_OPS[b] for b in sel.ops} for v in sel.variants_of(op)[1:] for f in v.files}
    files = tuple(f for f in fast_files() if f in mine)
    if not files:
        return {"available": False, "why": "no non-baseline variant selected"}
    used = set()
    for name in choices_for("all")[1:]:  # every variant, in the named sets and beside them
        try:
            other = fp if fp.choice.name == name else fp.with_own_buffers(kernels=name)
        except SharpinfError:  # a variant the model's shapes do not fit
            continue
        used |= {(f, e) for f, e in other.kernels_used(other.kv_dtype) if f in files}
    files = tuple(f for f in files if any(f == uf for uf, _ in used))  # (a dense model runs no moe file)
    rows = [p.to_json() for p in ptxas_report(list(files), "sm_90", {e for _, e in used})]
    return {"available": True, "arch": "sm_90", "entries": rows, "spills": sum(bool(r["spill_stores"] or r["spill_loads"])
                                                                                for r in rows)}



def case_groups(ctx: BenchContext, sel: Selection, tokens: list[int], context: int, kv_dtype: str,
                prefill: list[int] = (), prefill_context: list[int] = ()) -> list[tuple[str, int, Callable[[], list[Case]]]]:
    """(phase, N, make the cases): decode steps at each N, then prefill GEMMs, then prefill attention --
    what run() times, and what bench/ncu_targets.py launches once each under a profiler."""
    rng = np.random.default_rng(ctx.seed)
    return ([("decode", N, lambda N=N: _cases(ctx, N, context, kv_dtype, rng, sel)) for N in tokens]
            + [("prefill", N, lambda N=N: linear_cases(ctx, N, rng, False, sel) + moe_cases(ctx, N, rng, sel))
               for N in prefill if {"matmul", "ffn_in", "moe"} & sel.ops]
            + [("prefill", P, lambda P=P: prefill_attention_cases(ctx, P, kv_dtype, rng, sel))
               for P in prefill_context if "attention" in sel.ops])


def check_ops(ops: str | None, is_moe: bool, arch: str = "") -> None:
    """--op naming a layer the model has not: the dense FFN's ops on an MoE model, moe on a dense one.
    (matmul standing for ffn_in on an MoE model is no error.)"""
    named = {o.strip() for o in (ops or "").split(",")}
    absent = named & (DENSE_FFN_OPS if is_moe else {"moe"})
    if absent:
        raise SharpinfError(f"--op {', '.join(sorted(absent))}: {'an MoE' if is_moe else 'a dense'} model"
                            f"{f' ({arch})' if arch else ''} has no such layer")


def run(ctx: BenchContext, tokens: list[int], context: int, repeats: int, kv_dtype: str,
        prefill: list[int] = (), prefill_context: list[int] = (), ops: str | None = None,
        variants: str | None = None) -> dict:
    be, cfg = ctx.backend, ctx.model.config
    sel = Selection.parse(ops, variants)
    check_ops(ops, cfg.is_moe, cfg.arch)
    check_context(cfg.context_length, context, prefill_context)
    bw = be.device_bandwidth()
    groups = case_groups(ctx, sel, tokens, context, kv_dtype, prefill, prefill_context)
    rows = ctx.row_log(SUITE)  # each row on disk as it is timed: a cut run keeps them
    with ctx.progress() as bar:
        task = bar.add_task(f"{SUITE}: decode N = {', '.join(map(str, tokens))}; prefill "
                            f"{', '.join(map(str, list(prefill) + list(prefill_context))) or 'none'}", total=len(groups))
        for phase, N, make in groups:
            for c in make():
                launches, blocks = _grid_of(be, c.calls[0])
                times = launch_timed(be, c.calls, repeats if phase == "decode" or not be.gpu_shapes
                                     else min(repeats, PREFILL_REPEATS))
                t = float(np.median(times))
                load = c.expert_load() if c.expert_load else None
                nbytes = c.nbytes + c.expert_bytes * sum(n > 0 for n in load or [])
                rows.append({"phase": phase, "op": c.op, "shape": c.shape, "variant": c.variant, "tokens": N,
                             "us": t * 1e6, "us_min": min(times) * 1e6, "us_max": max(times) * 1e6,
                             "repeats": len(times), "launches": launches, "blocks": blocks,
                             "bytes": nbytes, "gb_s": nbytes / t / 1e9,
                             "tflops": c.flops / t / 1e12 if c.flops else None,
                             "pct_of_bandwidth": 100 * nbytes / t / 1e9 / bw if bw else None}
                            | ({"expert_load": load} if load is not None else {})
                            | ({"launch_shape": c.launch_shape, "rule_shape": c.rule_shape, "rule": c.rule}
                               if c.launch_shape else {}))
            bar.advance(task)
    base = {(r["op"], r["shape"], r["tokens"]): r["us"] for r in rows
            if r["variant"] == baseline(BENCH_OPS[r["op"]]).name}
    for r in rows:
        b = base.get((r["op"], r["shape"], r["tokens"]))
        r["speedup"] = b / r["us"] if b else None
    config = dict(tokens=tokens, context=context, repeats=repeats, kv_dtype=kv_dtype, prefill=list(prefill),
                  prefill_context=list(prefill_context), ops=sorted(sel.ops),
                  variants=sorted(sel.variants) if sel.variants else "all",
                  timing="median (and min, max) of repeats of a graph replay (GPU: back-to-back calls over input "
                         "copies past the L2 cache, per call; elsewhere one call), after 1 warm-up",
                  bytes="compulsory: weights + activations in and out; attention: the context's K and V; "
                        "moe: the router and the experts the routing picked, each once")
    if not be.gpu_shapes:
        config["note"] = EMU_NOTE
    results = {"device_bandwidth_gb_s": bw, "rows": rows, "ptxas": _ptxas(ctx, sel)}
    ctx.release()
    return envelope(ctx, SUITE, config, results)


def _grid_of(be, call: Callable[[], None]) -> tuple[int, int]:
    """(launches, blocks of all of them) of one call, recorded without running: how much of the GPU a
    variant's grid can fill (mmq's split-K, mmq_narrow's 16-row tiles)."""
    with be.recording() as plan:
        call()
    return len(plan), sum(math.prod(l.grid) for l in plan)


def _variant_label(row: dict) -> str:
    """The variant, and for the split frame the launch shape it ran in (* where the rule takes the other)."""
    shape = row.get("launch_shape")
    if not shape:
        return row["variant"]
    return f"{row['variant']} {shape}" + ("" if row.get("rule_shape") in (None, shape) else "*")


def table(doc: dict):
    r = doc["results"]
    bw = r["device_bandwidth_gb_s"]
    gpu = doc["backend"] == "cuda"
    t = Table("phase", "op", "shape", "N", "variant", "blocks", "us" if gpu else "us min/med/max", "GB/s", "% of bw",
              "TFLOP/s", "x baseline",
              title=f"kernel variants (device bandwidth {f'{bw:,.0f} GB/s' if bw else 'not measured on this backend'})")
    t.columns[2].overflow = "fold"
    notes = [f"on {doc['backend']}: {EMU_NOTE}"] if not gpu else []
    if any(row.get("launch_shape") for row in r["rows"]):
        notes.append("split / walk: the split frame's launch shape (ops/attention.py); *: its rule takes the other")
    t.caption = "\n".join(notes) or None
    for row in r["rows"]:
        us = f"{row['us']:,.1f}" if gpu else f"{row['us_min']:,.0f} / {row['us']:,.0f} / {row.get('us_max', row['us']):,.0f}"
        t.add_row(row.get("phase", "decode"), row["op"], row["shape"], str(row["tokens"]), _variant_label(row), _blocks(row), us,
                  f"{row['gb_s']:,.2f}", "-" if row["pct_of_bandwidth"] is None else f"{row['pct_of_bandwidth']:.0f}%",
                  "-" if not row.get("tflops") else f"{row['tflops']:.2f}",
                  "-" if row.get("speedup") is None else f"{row['speedup']:.2f}")
    loads = [_load_line(row) for row in r["rows"] if "expert_load" in row]
    p = r["ptxas"]
    if not p.get("available"):
        return Group(t, *loads, f"ptxas report left out: {p.get('why')}")
    pt = Table("kernel", "registers", "spill st/ld (B)", "stack (B)", "smem (B)",
               title=f"ptxas -v, the variants' kernels of this model ({p['arch']}): {p['spills']} with spills")
    for e in p["entries"]:
        pt.add_row(e["entry"], str(e["registers"]), f"{e['spill_stores']}/{e['spill_loads']}", str(e["stack_bytes"]),
                   str(e["smem_bytes"]))
    return Group(t, *loads, pt)


def _blocks(row: dict) -> str:
    """The blocks a call launches: 'B', or 'B in N' where they take N launches."""
    n, b = row.get("launches"), row.get("blocks")
    if not n:
        return "-"
    return f"{b:,}" if n == 1 else f"{b:,} in {n}"


def _load_line(row: dict) -> str:
    """One moe case's expert load in a line: how evenly its (token, expert) pairs spread."""
    load = row["expert_load"]
    mean = sum(load) / len(load)
    return (f"expert load, moe {row['variant']} {row.get('phase', 'decode')} N = {row['tokens']}: max {max(load)}, "
            f"mean {mean:.2f} (max/mean {max(load) / mean:.2f}), "
            f"{sum(n > 0 for n in load)} of {len(load)} experts used")


def plot(doc: dict, path):
    """Decode, the roofline view: per N, a group of bars per case, one bar per variant."""
    plt = pyplot()
    if plt is None:
        return None
    r = doc["results"]
    rows, bw = r["rows"], r["device_bandwidth_gb_s"]
    rows = [row for row in rows if row.get("phase", "decode") == "decode"]
    Ns = sorted({row["tokens"] for row in rows})
    if not Ns:
        return None
    names = list(dict.fromkeys(row["variant"] for row in rows))
    width = 0.8 / max(1, len(names))
    fig, axes = plt.subplots(1, len(Ns), figsize=(5.5 * len(Ns), 4.6), squeeze=False)
    for ax, N in zip(axes[0], Ns):
        sel = [row for row in rows if row["tokens"] == N]
        labels = list(dict.fromkeys(f"{row['op']}\n{row['shape'].split(' ')[0]}" for row in sel))
        for vi, name in enumerate(names):
            mine = [row for row in sel if row["variant"] == name]
            if not mine:
                continue
            xs = [labels.index(f"{row['op']}\n{row['shape'].split(' ')[0]}") + (vi - (len(names) - 1) / 2) * width
                  for row in mine]
            ax.bar(xs, [row["gb_s"] for row in mine], width=width, label=name)
        if bw:
            ax.axhline(bw, color="black", linestyle="--", linewidth=1, label=f"device bandwidth {bw:,.0f} GB/s")
        ax.set_xticks(range(len(labels)), labels, fontsize=7)
        ax.set_ylabel("achieved GB/s (compulsory bytes / time)")
        ax.set_title(f"N = {N} tokens")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    fig.suptitle(title_of(doc) + ("" if doc["backend"] == "cuda" else "  (emulator: not GPU timings)"), fontsize=10)
    return save_fig(plt, fig, path)

