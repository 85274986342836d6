"""`sharpinf verify MODEL`: run the named oracles, show a table, exit non-zero on any failure."""

from __future__ import annotations

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from sharpinf.cli import app
from sharpinf.cli.common import (KERNELS_HELP, backend_named, console, err_console, load, print_json,
                                 tokenizer_of)


def run_cases(cases, quiet: bool):
    from oracles.compare import OracleResult

    results = []
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, disable=quiet, transient=True) as bar:
        task = bar.add_task("verify", total=len(cases))
        for c in cases:
            bar.update(task, description=escape(f"{c.oracle}: {c.case}"))  # the column reads markup
            try:
                results.append(c.run())
            except Exception as exc:  # an oracle that crashes is a failed oracle, not a crashed verify
                results.append(OracleResult(c.oracle, c.case, None, None, None, False, f"{type(exc).__name__}: {exc}"))
            bar.advance(task)
    return results


def results_table(results) -> Table:
    t = Table("oracle", "case", "max |dlogit|", "top-5 overlap", "argmax", "verdict", title="sharpinf verify")
    t.columns[0].no_wrap = True
    for r in results:
        t.add_row(
            r.oracle, r.case,
            "-" if r.max_abs_dlogit is None else f"{r.max_abs_dlogit:.2e}",
            "-" if r.min_top5_overlap is None else f"{r.min_top5_overlap}/5",
            "-" if r.argmax_equal is None else ("equal" if r.argmax_equal else "DIFFERS"),
            Text("pass", style="green") if r.passed else Text.assemble(("FAIL", "red"), " ", r.detail),
        )
    return t


@app.command()
def verify(
    model: str = typer.Argument("smollm2-135m", help="Registered name or path to a .gguf."),
    backend: str = typer.Option("auto", help="reference: the oracle against independent truths; emu or cuda: "
                                "also the kernel path against the reference (auto: cuda if a GPU is usable, else emu)."),
    kv_dtype: list[str] = typer.Option(["f16", "q8_0"], help="KV dtypes for kernel-vs-reference (repeatable)."),
    kernels: str = typer.Option("auto", "--kernels", help=KERNELS_HELP + " 'all': every oracle for the simple "
                                "and the fast set (between them every variant of every op)."),
    quick: bool = typer.Option(False, "--quick", help="Short prompts only: on a model with sliding windows, "
                               "leave out the prompt that runs past the smallest window (Gemma 3: 553 tokens, "
                               "about 10 minutes on the emulator)."),
    json_out: bool = typer.Option(False, "--json", help="One JSON list of results."),
):
    """Prove a path correct: every named oracle, a rich table, non-zero exit on any failure."""
    from oracles.foundation import foundation_cases
    from sharpinf.kv_pool import kv_dtype_name
    from sharpinf.ops.variants import choices_for

    choices = choices_for(kernels)  # checked before the model loads
    loaded = load(model)
    tok = tokenizer_of(loaded)
    cases = foundation_cases(loaded, tok)
    if backend != "reference":
        from oracles.paths import path_cases
        from sharpinf.forward import ForwardPass

        fp = ForwardPass(loaded, backend_named(backend), kernels=choices[0])
        for spec in choices:  # the same uploaded weights for each kernel set
            fpk = fp if spec is choices[0] else fp.with_own_buffers(kernels=spec)
            cases += path_cases(fpk, tok, tuple(kv_dtype_name(k) for k in kv_dtype), past_window=not quick)
    results = run_cases(cases, quiet=json_out)
    if json_out:
        print_json([r.to_json() for r in results])
    else:
        console.print(results_table(results))
    failed = sum(not r.passed for r in results)
    if not json_out:
        console.print(f"{len(results) - failed} passed, {failed} failed")
    raise typer.Exit(1 if failed else 0)
