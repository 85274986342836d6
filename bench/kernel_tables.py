"""Markdown tables of the kernels bench's JSON, for a results folder's README.

    python bench/kernel_tables.py KERNELS_JSON [KERNELS_JSON ...] [--ops matmul,attention]

One table an op: a row a (phase, shape, N), a column a variant -- for the split frame's attention
variants a column a launch shape ("split walk"), so a run with the split forced and one with the walk
forced (bench/gpu_slot.sh) merge into one table; a run of a probe build (its kernels compiled with
SHARPINF_NVRTC_OPTIONS, recorded in the backend's description) gets columns of its own, labelled with
its defines ("gemv [GV_COALESCE=2]"), so a probe never stands in a default build's cell. A cell is
the median microseconds a call; at N <= 8 with the share of the device bandwidth beside it; a `*`
where the launch-shape rule (auto) takes the other shape. Rows and columns keep the order they first
appear in, file after file; a (row, column) timed twice keeps the last file's. No GPU needed: it reads the files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.suites.common import read_result_files

BANDWIDTH_ROWS = 8  # up to this many tokens a call is a matvec: its share of the bandwidth is the figure


def build(doc: dict) -> str:
    """A run's probe defines ("GV_COALESCE=2 DP_FIXED_G=0"; "" for the kernels as committed): the
    SHARPINF_NVRTC_OPTIONS the GPU backend compiled every kernel with."""
    options = ((doc.get("device") or {}).get("describe") or {}).get("nvrtc_options", "")
    return " ".join(o[2:] if o.startswith("-D") else o for o in options.split())


def column(row: dict, build: str = "") -> str:
    """The variant, with the launch shape it ran in where it has two, and the probe build's defines."""
    shape = row.get("launch_shape")
    label = f"{row['variant']} {shape}" if shape else row["variant"]
    return f"{label} [{build}]" if build else label


def cell(row: dict) -> str:
    text = f"{row['us']:,.1f}"
    pct = row.get("pct_of_bandwidth")
    if row["tokens"] <= BANDWIDTH_ROWS and pct is not None:
        text += f" ({pct:.0f}%)"
    if row.get("launch_shape") and row.get("rule_shape") not in (None, row["launch_shape"]):
        text += "*"
    return text


def tables(docs: list[dict], ops: list[str] | None = None) -> str:
    """The markdown: one table an op, in the order the ops first appear."""
    by_op: dict[str, dict] = {}
    for doc in docs:
        defines = build(doc)
        for row in doc.get("results", {}).get("rows", []):
            if ops and row["op"] not in ops:
                continue
            t = by_op.setdefault(row["op"], {"cols": [], "rows": {}})
            col = column(row, defines)
            if col not in t["cols"]:
                t["cols"].append(col)
            t["rows"].setdefault((row.get("phase", "decode"), row["shape"], row["tokens"]), {})[col] = cell(row)
    out = []
    for op, t in by_op.items():
        out.append(f"### {op} (us a call; at N <= {BANDWIDTH_ROWS} the share of the device bandwidth; "
                   "*: the launch-shape rule takes the other shape)")
        out.append("")
        out.append("| phase | shape | N | " + " | ".join(t["cols"]) + " |")
        out.append("| --- | --- | ---: | " + " | ".join("---:" for _ in t["cols"]) + " |")
        for (phase, shape, tokens), cells in t["rows"].items():
            out.append(f"| {phase} | {shape} | {tokens} | " + " | ".join(cells.get(c, "-") for c in t["cols"]) + " |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path, help="kernels bench JSON files (kernels.json)")
    ap.add_argument("--ops", default="", help="comma list of ops to show (default: every op in the files)")
    args = ap.parse_args(argv)
    docs = read_result_files(args.files, "kernel_tables")
    if docs is None:
        return 2
    text = tables(docs, [o.strip() for o in args.ops.split(",") if o.strip()] or None)
    if not text:
        print("kernel_tables: no rows in these files", file=sys.stderr)
        return 1
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
