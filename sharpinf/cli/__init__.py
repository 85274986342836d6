"""The `sharpinf` command line: typer app, one module per command group.

Every user error (SharpinfError) is printed as one red line and exits 1; a traceback
means a bug in sharpinf.
"""

from __future__ import annotations

import sys

import click
import typer

from sharpinf.errors import SharpinfError

app = typer.Typer(
    name="sharpinf",
    help="LLM inference research toolkit: readable CUDA C kernels, a NumPy oracle, continuous batching.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# command modules register themselves on `app`
from sharpinf.cli import bench_cmd, doctor_cmd, info_cmd, models_cmd, text_cmds, verify_cmd  # noqa: E402,F401


def main(argv: list[str] | None = None) -> None:
    try:
        rv = app(args=argv, standalone_mode=False)
    except SharpinfError as exc:
        from rich.markup import escape

        from sharpinf.cli.common import err_console

        # escaped: a fix like `pip install -e ".[cuda13]"` must keep its brackets
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)
