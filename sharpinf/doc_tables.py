"""Tables the docs copy from the code (the variant table, the support table): each copy sits between
its markers, and is rewritten or checked here."""

from __future__ import annotations

from pathlib import Path

from sharpinf.errors import SharpinfError


def with_marked(text: str, begin: str, end: str, table: str, where: str, kind: str) -> str:
    """text with the table between begin and end replaced by `table`."""
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise SharpinfError(f"{where}: no {kind} table markers ({begin!r} ... {end!r})")
    return text[: start + len(begin)] + "\n" + table + text[stop:]


def rewrite_marked(path: Path, begin: str, end: str, table: str, kind: str) -> bool:
    """Rewrite path's copy of the table; whether it changed."""
    text = path.read_text()
    new = with_marked(text, begin, end, table, str(path), kind)
    if new != text:
        path.write_text(new)
    return new != text
