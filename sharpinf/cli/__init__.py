"""The `sharpinf` command line: typer app, one module per command group.

Every user error (SharpinfError) is printed as one red line and exits 1; a usage error
(unknown option, a value of the wrong type) as click prints it, exit 2; a traceback
means a bug in sharpinf.
"""

from __future__ import annotations

import importlib
import sys

import typer
from rich.text import Text

from sharpinf.errors import SharpinfError

from sharpinf.cli.app import app  # the command modules below register on it

# command modules register themselves on `app`
from sharpinf.cli import (bench_cmd, doctor_cmd, info_cmd, kernels_cmd, models_cmd, serve_cmd, text_cmds,  # noqa: E402,F401
                          verify_cmd)


def _click_modules() -> list:
    """Where the click exceptions typer raises live: its vendored copy (typer >= 0.2x, which does
    not even need click installed) and the click package (older typer). Both are caught."""
    mods = []
    for name in ("typer._click.exceptions", "click.exceptions"):
        try:
            mods.append(importlib.import_module(name))
        except ImportError:
            pass
    return mods


_CLICK = _click_modules()
USAGE_ERRORS = tuple(m.ClickException for m in _CLICK)
EXITS = tuple({typer.Exit, *(m.Exit for m in _CLICK if hasattr(m, "Exit"))})
ABORTS = tuple({typer.Abort, *(m.Abort for m in _CLICK if hasattr(m, "Abort"))})


def main(argv: list[str] | None = None) -> None:
    try:
        rv = app(args=argv, standalone_mode=False)
    except SharpinfError as exc:
        from sharpinf.cli.common import err_console

        # a Text, never markup: a fix like `pip install -e ".[cuda13]"` keeps its brackets
        err_console.print(Text.assemble(("error:", "bold red"), " ", str(exc)), soft_wrap=True)
        sys.exit(1)
    except EXITS as exc:
        sys.exit(exc.exit_code)
    except ABORTS:
        sys.exit(130)
    except USAGE_ERRORS as exc:
        exc.show()  # click's usage line, a hint and "Error: ..."; exit 2 for usage errors
        sys.exit(exc.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)
