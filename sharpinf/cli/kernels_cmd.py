"""`sharpinf kernels list|new`: the kernel-variant registry, and a new variant to start from."""

from __future__ import annotations

import typer
from rich.table import Table
from rich.text import Text

from sharpinf.cli.app import app
from sharpinf.cli.common import console, print_json

kernels_app = typer.Typer(help="Kernel variants: the registry (sharpinf/ops/variants.toml) and new ones.",
                          no_args_is_help=True)
app.add_typer(kernels_app, name="kernels")


@kernels_app.command("list")
def list_variants(json_out: bool = typer.Option(False, "--json", help="Machine-readable output."),
                  markdown: bool = typer.Option(False, "--markdown", help="The variant table in markdown (the docs' copy)."),
                  write: list[str] = typer.Option([], "--write", help="With --markdown: rewrite the table between this "
                                                  "file's variant markers (README.md, ARCHITECTURE.md); repeatable.")):
    """Every registered variant: its op, files, what it does, what it declares (activations and norm,
    token range, scratch, rounding, requirements, bits), the kernel sets that pick it."""
    from pathlib import Path

    from sharpinf.ops.variant_table import describe_variants, markdown_table, write_table
    from sharpinf.ops.variants import registry_file

    rows = describe_variants()
    if json_out:
        return print_json(rows)
    if markdown:
        for f in write:
            console.print(Text(f"{f}: {'rewritten' if write_table(Path(f)) else 'already the registry table'}"))
        if not write:
            print(markdown_table(), end="")
        return
    t = Table("op", "variant", "files", "what it does", "declares", "in sets",
              title=f"kernel variants ({registry_file()})")
    t.columns[3].overflow = t.columns[4].overflow = "fold"
    for r in rows:
        name = r["variant"] + (" (baseline)" if r["baseline"] else "") + (f" (like {r['like']})" if r["like"] else "")
        t.add_row(r["op"], name, ", ".join(r["files"]) or "-", r["summary"], r["declares"] or "-",
                  ", ".join(r["sets"]) or "-")
    console.print(t)
    console.print(Text("choose with --kernels SET or OP=VARIANT,...; `sharpinf kernels new OP NAME` starts a new one"))


@kernels_app.command("new")
def new(op: str = typer.Argument(..., help="The op: matmul, ffn, link, attention, rope_kv, moe or sample."),
        name: str = typer.Argument(..., help="The variant's name (a lowercase identifier): --kernels OP=NAME."),
        like: str = typer.Option(None, "--from", help="The registered variant to copy (default: the op's baseline)."),
        summary: str = typer.Option(None, help="One line for the registry: what it changes."),
        json_out: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """Start a variant: kernels_cu/OP_NAME.cu (a copy of a registered variant's file) and its registry entry.

    It compiles, dispatches and passes every oracle as it is; tests, --kernels all, bench and help include it.
    """
    from sharpinf.ops.scaffold import OP_TESTS, new_variant

    s = new_variant(op, name, like, summary)
    if json_out:
        return print_json({"op": s.op, "name": s.name, "like": s.like, "file": str(s.file), "registry": str(s.registry)})
    console.print(Text(f"created {s.file} (a copy of {s.op}={s.like}'s file under a header to fill in)"))
    console.print(Text(f"registered {s.op}={s.name} in {s.registry}:"))
    console.print(Text(s.entry.strip()))
    console.print(Text(f"next: edit {s.file.name}, then\n"
                       f"  pytest {OP_TESTS[s.op]} -k {s.name}\n"
                       f"  sharpinf verify MODEL --kernels {s.op}={s.name} --only kernel,cross-path\n"
                       f"  sharpinf bench MODEL --suite kernels --op {s.op} --variant {s.name}\n"
                       "  (docs/adding-a-variant.md walks the loop)"))
