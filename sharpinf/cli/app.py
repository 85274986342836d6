"""The typer app every command module registers itself on (sharpinf/cli/__init__.py imports them)."""

import typer

app = typer.Typer(
    name="sharpinf",
    help="LLM inference research toolkit: readable CUDA C kernels, a NumPy oracle, continuous batching.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
