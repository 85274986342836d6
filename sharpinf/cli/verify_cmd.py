"""`sharpinf verify MODEL`: run the named oracles, show a table, exit non-zero on any failure."""

from __future__ import annotations

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from sharpinf.cli.app import app
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


TRACE_ONLY_TOKENS = 20  # past one 16-slot KV block, and a whole tensor-core tile of 16 tokens


def trace_cases(fps, results, tok, kv_dtypes, quick: bool, trace_only: bool, reports: dict) -> list:
    """An "op-trace" case per kernel set whose path oracles failed (every set when none did, or
    with --trace-only): the long prompt, in the KV dtype kernel-vs-reference failed in, else the
    first. Each case's TraceReport lands in reports[case]."""
    from oracles.compare import OracleResult
    from oracles.foundation import OracleCase
    from oracles.paths import verify_prompts
    from oracles.trace import trace_step

    picked = []
    for fp in fps:
        kvs = [k for k in kv_dtypes if not (k == "q8_0" and fp.cfg.head_dim % 32)] or list(kv_dtypes)
        tag = f"kernels {fp.choice.name}"
        failed = [r for r in results if r.case.endswith(tag) and not r.passed]
        kv = next((k for k in kvs for r in failed if r.oracle == "kernel-vs-reference" and f"KV {k}," in r.case),
                  kvs[0])
        picked.append((fp, kv, failed))
    if any(f for _, _, f in picked):
        picked = [p for p in picked if p[2]]
    _, tokens = verify_prompts(fps[0].cfg, tok, past_window=not quick)  # kernel-vs-reference's prompt
    if trace_only:
        tokens = tokens[:TRACE_ONLY_TOKENS]

    def case(fp, kv, failed):
        label = f"{len(tokens)} tokens, KV {kv}, kernels {fp.choice.name}"

        def run():
            rep = reports[label] = trace_step(fp, tokens, kv_dtype=kv)
            if not rep.passed:
                fd = rep.first_nonfinite or rep.first_divergence
                what = "first divergence:" if fd.finite else "non-finite from"
                detail = f"{what} {fd.name} ({', '.join(fd.kernels)})"
            else:
                names = sorted({r.oracle for r in failed})
                detail = ("every op within its bound: the fault is in what the failing oracle(s) vary "
                          f"({', '.join(names)}), not in one step's arithmetic" if failed else "")
            return OracleResult("op-trace", label, None, None, None, rep.passed, detail)

        return OracleCase("op-trace", label, run)

    return [case(*p) for p in picked]


def trace_table(rep) -> Table:
    """Per op, its first layer out of bound (else its worst): its error against its bound, and where."""
    t = Table("layer", "op", "kernels", "error", "bound", "unit", "worst at", "verdict",
              title=f"op-by-op trace: {rep.n_tokens} tokens, KV {rep.kv_dtype}, kernels {rep.kernels} "
              "(per op: the first layer out of bound, else the closest)")
    for r in rep.by_op():
        t.add_row("-" if r.layer is None else str(r.layer), r.op, "\n".join(r.kernels) or "-",
                  "non-finite" if not r.finite else f"{r.err:.2e}", f"{r.bound:.0e}", r.metric, r.at(),
                  Text("pass", style="green") if r.passed else Text("FAIL", style="red"))
    return t


# The oracles by group, for --only / --skip (an oracle's own name works too).
ORACLE_GROUPS = {
    "foundation": ("reference-vs-naive", "incremental-vs-full", "tokenizer-roundtrip"),  # no kernel runs
    "kernel": ("kernel-vs-reference",),
    "cross-path": ("packed-vs-sequential", "chunked-vs-whole", "batched-decode-vs-single-user", "placement"),
    "graph": ("graph-vs-eager",),
    "engine": ("speculative-vs-plain",),  # whole engines, with and without speculative decoding
}
ORACLE_NAMES = tuple(n for names in ORACLE_GROUPS.values() for n in names)


def selected_oracles(only: str | None, skip: str | None) -> set[str]:
    """The oracle names --only and --skip leave (comma lists of groups or oracle names)."""
    from sharpinf.errors import SharpinfError

    def names(text: str, flag: str) -> set[str]:
        out = set()
        for part in (p.strip() for p in text.split(",") if p.strip()):
            if part in ORACLE_GROUPS:
                out |= set(ORACLE_GROUPS[part])
            elif part in ORACLE_NAMES:
                out.add(part)
            else:
                raise SharpinfError(f"{flag} {part!r}: choose groups {', '.join(ORACLE_GROUPS)} or oracles "
                                    f"{', '.join(ORACLE_NAMES)}")
        return out

    chosen = names(only, "--only") if only else set(ORACLE_NAMES)
    return chosen - (names(skip, "--skip") if skip else set())


@app.command()
def verify(
    model: str = typer.Argument("smollm2-135m", help="Registered name or path to a .gguf."),
    backend: str = typer.Option("auto", help="reference: the oracle against independent truths; emu or cuda: "
                                "also the kernel path against the reference (auto: cuda if a GPU is usable, else emu)."),
    kv_dtype: list[str] = typer.Option(["f16", "q8_0"], help="KV dtypes for kernel-vs-reference (repeatable)."),
    kernels: str = typer.Option("auto", "--kernels", help=KERNELS_HELP + " 'all': every set and every other "
                                "registered variant (with what it requires) the model runs and fits."),
    quick: bool = typer.Option(False, "--quick", help="Short prompts only: on a model with sliding windows, "
                               "leave out the prompt that runs past the smallest window (Gemma 3: 553 tokens, "
                               "about 10 minutes on the emulator)."),
    trace: bool = typer.Option(False, "--trace", help="After the oracles, run the long prompt as one prefill step "
                               "op by op beside the reference (each op fed the kernels' own input) for each kernel "
                               "set that failed, or every set when none did: names the first op out of its bound "
                               "(layer, op, kernel, error, token and column) and where a first non-finite value "
                               "appeared, and prints each op's worst error."),
    trace_only: bool = typer.Option(False, "--trace-only", help=f"The trace alone, on the first {TRACE_ONLY_TOKENS} "
                                    "tokens of that prompt, no oracles: seconds on a small model."),
    only: str = typer.Option(None, "--only", help="Only these oracles (comma list): groups foundation (the "
                             "reference against float64 and the tokenizer: no kernel runs), kernel "
                             "(kernel-vs-reference), cross-path (packed, chunked, batched decode, placement), graph "
                             "(graph-vs-eager), engine (speculative-vs-plain: the engine with n-gram speculation "
                             "against plain decoding, ids and logprobs bit for bit, on each kernel set), or an "
                             "oracle's name."),
    skip: str = typer.Option(None, "--skip", help="Leave these oracles out (as --only)."),
    json_out: bool = typer.Option(False, "--json", help="One JSON list of results (with --trace, each trace's "
                                  "per-op records in its row)."),
):
    """Prove a path correct: every named oracle, a rich table, non-zero exit on any failure."""
    from oracles.foundation import foundation_cases
    from sharpinf.errors import SharpinfError
    from sharpinf.step.kv_pool import kv_dtype_name
    from sharpinf.ops.variants import choices_for

    choices = choices_for(kernels)  # checked before the model loads
    wanted = selected_oracles(only, skip)
    if not wanted and not (trace or trace_only):
        raise SharpinfError("--only / --skip leave no oracle to run")
    if (trace or trace_only) and backend == "reference":
        raise SharpinfError("--trace follows the kernels op by op: use --backend emu, cuda or auto")
    kv_dtypes = tuple(kv_dtype_name(k) for k in kv_dtype)
    loaded = load(model)
    tok = tokenizer_of(loaded)
    cases = [] if trace_only or not wanted & set(ORACLE_GROUPS["foundation"]) else foundation_cases(loaded, tok)
    fps = []
    kernel_oracles = wanted - set(ORACLE_GROUPS["foundation"])
    if backend != "reference" and (kernel_oracles or trace or trace_only):
        from oracles.paths import path_cases
        from sharpinf.step.forward import ForwardPass

        fp = ForwardPass(loaded, backend_named(backend), kernels=choices[0])
        choices = choices_for(kernels, fp.cfg, fp.model)  # the ops it runs, the variants that fit it
        for spec in choices:  # the same uploaded weights for each kernel set
            fpk = fp if spec is choices[0] else fp.with_own_buffers(kernels=spec)
            fps.append(fpk)
            if not trace_only:
                cases += path_cases(fpk, tok, kv_dtypes, past_window=not quick)
        if "speculative-vs-plain" in wanted and not trace_only:
            from oracles.speculative import speculative_cases

            sets = [c for c in choices if "=" not in c] or choices[:1]  # `all`: the sets, not each variant
            cases += speculative_cases(loaded, fp.backend, sets, kv_dtypes)
    cases = [c for c in cases if c.oracle in wanted]
    results = run_cases(cases, quiet=json_out)
    reports: dict[str, object] = {}
    if trace or trace_only:
        results += run_cases(trace_cases(fps, results, tok, kv_dtypes, quick, trace_only, reports), quiet=json_out)
    if json_out:
        traced = [r.oracle == "op-trace" and r.case in reports for r in results]
        print_json([{**r.to_json(), "trace": reports[r.case].to_json()} if t else r.to_json()
                    for r, t in zip(results, traced)])
    else:
        console.print(results_table(results))
        for rep in reports.values():
            console.print(trace_table(rep))
            console.print(Text(rep.describe()), soft_wrap=True)
    failed = sum(not r.passed for r in results)
    if not json_out:
        console.print(f"{len(results) - failed} passed, {failed} failed")
    raise typer.Exit(1 if failed else 0)
