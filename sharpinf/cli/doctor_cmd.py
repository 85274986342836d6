"""`sharpinf doctor`: what this machine can run, and what to install when it can't."""

from __future__ import annotations

import typer
from rich.table import Table
from rich.text import Text

from sharpinf.cli.app import app
from sharpinf.cli.common import console, print_json


def checks_table(checks: list[dict]) -> Table:
    """The GPU probe, one row per step; Text cells, so `.[cuda13]` keeps its brackets."""
    t = Table("GPU check", "", "detail", title="the CUDA backend's probe, in order")
    for c in checks:
        verdict = Text("ok", style="green") if c["ok"] else Text("FAIL", style="bold red")
        t.add_row(c["name"], verdict, Text(c["detail"]))
    return t


def _cell(v) -> Text:
    if isinstance(v, dict) and {"ok", "reason"} <= set(v):  # a backend's verdict
        return Text(f"{'ok' if v['ok'] else 'FAIL'}: {v['reason']}")
    return Text(str(v))


def facts_table(facts: dict) -> Table:
    t = Table("item", "value", show_header=False)
    for k, v in facts.items():
        if isinstance(v, dict):
            for k2, v2 in v.items():
                t.add_row(f"{k}.{k2}", _cell(v2))
        elif isinstance(v, list):
            t.add_row(k, Text("\n".join(map(str, v)) or "-"))
        else:
            t.add_row(k, Text(str(v)))
    return t


@app.command()
def doctor(json_out: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """The GPU probe step by step, backends, NVRTC and headers, g++, cache folders, install hints."""
    from sharpinf.runtime.doctor import collect

    facts = collect()
    if json_out:
        return print_json(facts)
    advice = facts.pop("advice")
    console.print(checks_table(facts.pop("cuda_checks")))
    console.print(facts_table(facts))
    for line in advice:
        console.print(Text(f"advice: {line}"), soft_wrap=True)
