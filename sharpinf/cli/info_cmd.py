"""`sharpinf info MODEL`: what sharpinf reads of the file and what it would refuse (every metadata key
and tensor, before any weight is used), then architecture, dimensions, tensor types, KV bytes per
token."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict

import typer
from rich.table import Table
from rich.text import Text

from sharpinf.cli.app import app
from sharpinf.cli.common import backend_named, console, print_json
from sharpinf.errors import ModelError
from sharpinf.model.loader import FileReport, LoadedModel, inspect_model
from sharpinf.model.registry import resolve_model
from sharpinf.step.kv_pool import kv_bytes_per_slot


def _value(v) -> str:
    if isinstance(v, list):
        return f"[{len(v)} items]"
    s = repr(v)
    return s if len(s) <= 48 else s[:45] + "..."


def file_facts(r: FileReport) -> dict:
    """What the file holds and what sharpinf does with each of it (model/keys.py)."""
    uses = defaultdict(int)
    for u in r.keys:
        uses[u.use] += 1
    return {
        "path": str(r.path),
        "loads": r.error is None and r.refused is None,
        "error": r.error or r.refused,
        "keys": [{"key": u.key, "use": u.use, "why": u.why,
                  "value": u.value if not isinstance(u.value, list) else f"[{len(u.value)} items]"} for u in r.keys],
        "key_uses": dict(uses),
        "tensors": {"used": sum(t.use == "used" for t in r.tensor_uses),
                    "refused": [{"name": t.name, "shape": list(t.shape), "type": t.qtype, "why": t.why}
                                for t in r.tensor_uses if t.use == "refused"]},
    }


def print_file_facts(f: dict) -> None:
    """The keys sharpinf does not simply apply (checked, inert, refused) and the refused tensors."""
    counts = ", ".join(f"{n} {use}" for use, n in sorted(f["key_uses"].items()))
    t = Table("key", "value", "use", "why", title=f"metadata keys ({counts}; applied ones in --json)")
    for k in f["keys"]:
        if k["use"] != "applied" and not (k["use"] == "inert" and k["key"].startswith("general.")):
            t.add_row(k["key"], _value(k["value"]), k["use"], k["why"], style="red" if k["use"] == "refused" else None)
    console.print(t)
    refused = f["tensors"]["refused"]
    line = f"tensors: {f['tensors']['used']} read"
    if refused:
        line += f", {len(refused)} refused: " + "; ".join(f"{x['name']} ({x['why']})" for x in refused[:5])
        line += f" ... and {len(refused) - 5} more" if len(refused) > 5 else ""
    console.print(Text(line, style="red" if refused else ""))


def model_facts(m) -> dict:
    cfg = m.config
    by_type: dict[str, dict] = defaultdict(lambda: {"tensors": 0, "params": 0, "bytes": 0})
    for t in m.tensors.values():
        row = by_type[t.qtype_name]
        row["tensors"] += 1
        row["params"] += int(math.prod(t.shape))
        row["bytes"] += int(t.nbytes)
    return {
        "path": str(m.path),
        "config": asdict(cfg),
        "n_params": sum(r["params"] for r in by_type.values()),
        "tensor_types": dict(by_type),
        "tied_output": cfg.tied_output,
        "kv_bytes_per_token": {name: kv_bytes_per_slot(cfg, name) for name in ("fp16", "bf16", "fp32", "q8_0")},
        **({"experts": _experts(m)} if cfg.is_moe else {}),
    }


def rope_line(cfg) -> str:
    """The RoPE every layer runs, in words: style, base, scaling, factors, and gemma3's local layers."""
    base, scaling = cfg.rope_for(next((i for i in range(cfg.n_layer) if not cfg.window(i)), 0))
    line = f"{cfg.rope_style}, base {base:g}, {scaling.describe()}"
    line += ", frequency factors (rope_freqs.weight)" if cfg.has_rope_factors else ""
    if cfg.has_longrope:
        line += (f", rope_factors_{cfg.longrope_factors()}.weight (long past {cfg.n_ctx_orig} tokens a sequence, "
                 "short within: the engine's max_model_len)")
    nope = [i for i in range(cfg.n_layer) if not cfg.uses_rope(i)]
    if nope:
        line += f"; no RoPE on layers {', '.join(map(str, nope[:4]))}{', ...' if len(nope) > 4 else ''}"
    if cfg.rope_theta_local and any(cfg.window(i) for i in range(cfg.n_layer)):
        line += f"; windowed layers: base {cfg.rope_theta_local:g}, {'scaled alike' if cfg.local_rope_scaled else 'unscaled'}"
    if cfg.attn_temp_starts:
        line += (f"; queries x (1 + {cfg.attn_temp_scale:g} ln(floor(p / {cfg.n_ctx_orig}) + 1)), 1 before "
                 f"{cfg.attn_temp_starts}")
    return line


def _experts(m) -> dict:
    """An MoE model's experts: how many, their size, and the parameters one token runs through."""
    cfg = m.config
    per_expert = 3 * cfg.n_embd * cfg.n_ff_exp + (2 * cfg.n_ff_exp + cfg.n_embd if cfg.has_moe_bias else 0)
    total = sum(int(math.prod(t.shape)) for t in m.tensors.values())
    idle = cfg.n_layer * (cfg.n_expert - cfg.n_expert_used) * per_expert
    return {"n_expert": cfg.n_expert, "n_expert_used": cfg.n_expert_used, "n_ff_exp": cfg.n_ff_exp,
            "params_per_expert": per_expert, "active_params": total - idle}


def kv_budget_facts(m, backend: str, kv_dtype: str, gpu_memory_utilization: float, num_blocks: int | None) -> dict:
    """The KV budget as the engine sizes it at start-up: upload the weights, then size the KV pool."""
    from sharpinf.engine.config import EngineConfig
    from sharpinf.engine.kv_budget import plan_kv_budget
    from sharpinf.step.forward import ForwardPass

    be = backend_named(backend)
    ec = EngineConfig(backend=be.name, kv_dtype=kv_dtype, gpu_memory_utilization=gpu_memory_utilization,
                      num_blocks=num_blocks)
    ForwardPass(m, be)  # the weights take their place before free memory is measured
    return {"backend": be.name, **plan_kv_budget(be, m.config, ec).to_json()}


@app.command()
def info(model: str = typer.Argument(..., help="Registered name or path to a .gguf."),
         backend: str = typer.Option(None, help="Also size the KV pool on this backend (cuda, emu, auto), as at engine "
                                     "start-up: upload the weights, measure free memory and host-to-device bandwidth."),
         kv_dtype: str = typer.Option("fp16", help="KV dtype for the budget: fp16, bf16, fp32, q8_0."),
         gpu_memory_utilization: float = typer.Option(0.9, help="Share of the GPU the engine may use."),
         num_blocks: int = typer.Option(None, help="Fixed KV pool size in blocks (the emulator's budget)."),
         json_out: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """What sharpinf reads of the file and what it would refuse, and why (every metadata key and tensor,
    before any weight is used); then architecture, dimensions, a table of tensor types and sizes, KV
    bytes per token (and the KV budget). A file sharpinf would refuse exits 1 after its report."""
    report = inspect_model(resolve_model(model))
    reading = file_facts(report)
    if not reading["loads"]:
        if json_out:
            print_json({"path": reading["path"], "file": reading})
        else:
            print_file_facts(reading)
        raise ModelError(report.path, reading["error"])
    loaded = LoadedModel(path=report.path, config=report.config, tensors=report.tensors, metadata=report.metadata)
    facts = {**model_facts(loaded), "file": reading}
    if backend is not None:
        facts["kv_budget"] = kv_budget_facts(loaded, backend, kv_dtype, gpu_memory_utilization, num_blocks)
    if json_out:
        return print_json(facts)
    cfg = facts["config"]
    console.print(Text(facts["path"], style="bold"))
    print_file_facts(reading)
    t = Table("field", "value", show_header=False, title="config")
    for k, v in cfg.items():
        t.add_row(k, str(v))
    t.add_row("rope", rope_line(loaded.config))
    t.add_row("parameters", f"{facts['n_params'] / 1e6:.1f} M")
    t.add_row("output", "tied to token_embd" if facts["tied_output"] else "separate output.weight")
    if "experts" in facts:
        e = facts["experts"]
        t.add_row("experts", f"{e['n_expert']} a layer, FFN {e['n_ff_exp']} each, {e['n_expert_used']} a token "
                             f"({e['active_params'] / 1e6:.1f} M parameters active)")
    console.print(t)
    tt = Table("type", "tensors", "params", "MiB", title="tensor types")
    for name, r in sorted(facts["tensor_types"].items()):
        tt.add_row(name, str(r["tensors"]), f"{r['params']:,}", f"{r['bytes'] / 2**20:.1f}")
    console.print(tt)
    kv = Table("KV dtype", "bytes / token", title="KV cache")
    for k, v in facts["kv_bytes_per_token"].items():
        kv.add_row(k, f"{v:,.0f}")
    console.print(kv)
    if "kv_budget" in facts:
        b = facts["kv_budget"]
        bt = Table("field", "value", show_header=False, title=f"KV budget on {b['backend']} ({b['source']})")
        bt.add_row("pool", f"{b['num_blocks']:,} blocks x {b['block_size']} = {b['tokens']:,} tokens ({b['kv_dtype']})")
        if b["free_bytes"] is not None:
            bt.add_row("device memory", f"{b['free_bytes'] / 2**30:.2f} GiB free of {b['total_bytes'] / 2**30:.2f} GiB")
        bt.add_row("host->device (pinned)", "-" if b["h2d_gb_per_s"] is None else f"{b['h2d_gb_per_s']:.1f} GB/s")
        console.print(bt)
