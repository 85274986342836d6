"""`sharpinf info MODEL`: architecture, dimensions, tensor types, KV bytes per token."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict

import typer
from rich.table import Table

from sharpinf.cli import app
from sharpinf.cli.common import console, load, print_json


def model_facts(m) -> dict:
    cfg = m.config
    by_type: dict[str, dict] = defaultdict(lambda: {"tensors": 0, "params": 0, "bytes": 0})
    for t in m.tensors.values():
        row = by_type[t.qtype_name]
        row["tensors"] += 1
        row["params"] += int(__import__("math").prod(t.shape))
        row["bytes"] += int(t.nbytes)
    return {
        "path": str(m.path),
        "config": asdict(cfg),
        "n_params": sum(r["params"] for r in by_type.values()),
        "tensor_types": dict(by_type),
        "tied_output": cfg.tied_output,
        "kv_bytes_per_token": {"fp16": cfg.kv_bytes_per_token(2), "fp32": cfg.kv_bytes_per_token(4),
                               "q8_0": cfg.kv_bytes_per_token(34 / 32)},
    }


@app.command()
def info(model: str = typer.Argument(..., help="Registered name or path to a .gguf."),
         json_out: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """Architecture, dimensions, a table of tensor types and sizes, KV bytes per token."""
    facts = model_facts(load(model))
    if json_out:
        return print_json(facts)
    cfg = facts["config"]
    console.print(f"[bold]{facts['path']}[/]")
    t = Table("field", "value", show_header=False, title="config")
    for k, v in cfg.items():
        t.add_row(k, str(v))
    t.add_row("parameters", f"{facts['n_params'] / 1e6:.1f} M")
    t.add_row("output", "tied to token_embd" if facts["tied_output"] else "separate output.weight")
    console.print(t)
    tt = Table("type", "tensors", "params", "MiB", title="tensor types")
    for name, r in sorted(facts["tensor_types"].items()):
        tt.add_row(name, str(r["tensors"]), f"{r['params']:,}", f"{r['bytes'] / 2**20:.1f}")
    console.print(tt)
    kv = Table("KV dtype", "bytes / token", title="KV cache")
    for k, v in facts["kv_bytes_per_token"].items():
        kv.add_row(k, f"{v:,.0f}")
    console.print(kv)
