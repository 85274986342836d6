"""The registry in words: each variant's row (`sharpinf kernels list`, its --json) and the markdown
variant table (`--markdown`), whose copies in README.md and ARCHITECTURE.md sit between the markers
below (`--write FILE` rewrites one; tests/test_registry.py fails while a copy differs from the registry)."""

from __future__ import annotations

from pathlib import Path

from sharpinf.doc_tables import rewrite_marked, with_marked
from sharpinf.ops.variants import OP_NAMES, REGISTRY, SETS, Variant

BEGIN = "<!-- variants:begin (generated from sharpinf/ops/variants.toml: sharpinf kernels list --markdown --write FILE) -->"
END = "<!-- variants:end -->"


def declares(v: Variant) -> str:
    """What it declares beyond its files, in words ('' for none): `kernels list`, the docs' tables."""
    out = []
    if v.activations:
        gate_up = f", gate+up {v.gate_up.__name__}" if v.gate_up else ""
        out.append(f"{v.activations} activations, norm {v.norm.__name__}{gate_up}")
    if v.min_tokens > 1 or v.max_tokens is not None:
        out.append(" and ".join(([f">= {v.min_tokens}"] if v.min_tokens > 1 else [])
                                + ([f"<= {v.max_tokens}"] if v.max_tokens is not None else [])) + " tokens")
    out += [f"scratch {', '.join(s.__name__ for s in v.scratch)}"] if v.scratch else []
    out += [f"rounding {v.rounding}"] if v.rounding != "f32" else []
    out += [f"requires {', '.join(map(str, v.requires))}"] if v.requires else []
    out += [f"{v.bits}'s bits"] if v.bits else []
    return "; ".join(out)


def describe_variants() -> list[dict]:
    """One row per registered (op, variant): what `sharpinf kernels list`, the bench and the docs show."""
    return [{"op": op, "variant": v.name, "baseline": i == 0, "files": list(v.files), "summary": v.summary,
             "declares": declares(v), "like": v.like, "sets": [s for s, ops in SETS.items() if ops[op] == v.name]}
            for op in OP_NAMES for i, v in enumerate(REGISTRY[op].values())]


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
    return with_marked(text, BEGIN, END, markdown_table(), where, "variant")


def write_table(path: Path) -> bool:
    """Rewrite path's table from the registry; whether it changed."""
    return rewrite_marked(path, BEGIN, END, markdown_table(), "variant")
