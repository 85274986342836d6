"""Progress bars for the long start-up work (compiling kernels, capturing graphs).

Shown on stderr when it is a terminal, or always with SHARPINF_PROGRESS=1, never with
SHARPINF_PROGRESS=0; a library call in a test or a pipe stays quiet. Labels are printed
literally (no Rich markup).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Callable, Iterator


def progress_enabled() -> bool:
    env = os.environ.get("SHARPINF_PROGRESS", "").strip()
    if env in ("0", "1"):
        return env == "1"
    return sys.stderr.isatty()


@contextmanager
def progress_bar(description: str, total: int) -> Iterator[Callable[[str], None]]:
    """Yields advance(label): call it before each of `total` items of work."""
    if not progress_enabled() or total <= 0:
        yield lambda label: None
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(escape(description), total=total)
        started = [False]

        def advance(label: str) -> None:
            if started[0]:
                bar.advance(task)
            started[0] = True
            bar.update(task, description=escape(f"{description}: {label}"))

        yield advance
        bar.update(task, completed=total)


def note(text: str) -> None:
    """One line on stderr, where progress bars show (a summary after one)."""
    if progress_enabled():
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
