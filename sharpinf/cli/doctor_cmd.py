"""`sharpinf doctor`: what this machine can run, and what to install when it can't."""

from __future__ import annotations

import typer
from rich.table import Table

from sharpinf.cli import app
from sharpinf.cli.common import console, print_json


@app.command()
def doctor(json_out: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """Backends available, GPU, CUDA/NVRTC/g++ versions, cache folders, install hints."""
    from sharpinf.runtime.doctor import collect

    facts = collect()
    if json_out:
        return print_json(facts)
    t = Table("item", "value", show_header=False)
    for k, v in facts.items():
        if isinstance(v, dict):
            for k2, v2 in v.items():
                t.add_row(f"{k}.{k2}", str(v2))
        elif isinstance(v, list):
            t.add_row(k, "\n".join(map(str, v)) or "-")
        else:
            t.add_row(k, str(v))
    console.print(t)
