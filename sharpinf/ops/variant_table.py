"""The variant table, rendered from the registry: `sharpinf kernels list --markdown` prints it, and
README.md's and ARCHITECTURE.md's copies sit between the markers below (`--write FILE` rewrites one;
tests/test_variant_table.py fails while a copy differs from the registry)."""

from __future__ import annotations

from pathlib import Path

from sharpinf.errors import SharpinfError
from sharpinf.ops.variants import describe_variants

BEGIN = "<!-- variants:begin (generated from sharpinf/ops/variants.toml: sharpinf kernels list --markdown --write FILE) -->"
END = "<!-- variants:end -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|") or "-"


def markdown_table() -> str:
    """One row per registered variant, baseline first per op: files, what it does, what it declares
    (activations, norm, token range, scratch, rounding, requirements, bits) and the sets that pick it."""
    lines = ["| op | variant | files | what it does | declares | in sets |", "| --- | --- | --- | --- | --- | --- |"]
    for r in describe_variants():
        name = f"`{r['variant']}`" + (" (baseline)" if r["baseline"] else "") + (f" (like `{r['like']}`)" if r["like"] else "")
        files = ", ".join(f"`{f}`" for f in r["files"]) or "(none: the other ops' launches)"
        lines.append(f"| {r['op']} | {name} | {files} | {_cell(r['summary'])} | {_cell(r['declares'])} | "
                     f"{', '.join(r['sets']) or '-'} |")
    return "\n".join(lines) + "\n"


def with_table(text: str, where: str = "the text") -> str:
    """text with the table between its markers replaced by the registry's."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SharpinfError(f"{where}: no variant table markers ({BEGIN!r} ... {END!r})")
    return text[: start + len(BEGIN)] + "\n" + markdown_table() + text[end:]


def write_table(path: Path) -> bool:
    """Rewrite path's table from the registry; whether it changed."""
    text = path.read_text()
    new = with_table(text, str(path))
    if new != text:
        path.write_text(new)
    return new != text
