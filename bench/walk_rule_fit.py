"""Fit the split frame's launch-shape rule to a GPU's timings of both shapes.

    python bench/walk_rule_fit.py KERNELS_JSON [KERNELS_JSON ...] [--json]

ops/attention.py's walks_pays estimates, from a step's walk blocks, its deepest query's partitions and
the resident blocks of each shape's kernel, whether the walk costs no more than the split launch; its
two constants (WALK_PASSES, MERGE_COST) are guesses until a GPU times both shapes. The kernels bench
(`sharpinf bench --suite kernels --op attention`) records, beside each attention row's time, the shape
it ran in (`launch_shape`, $SHARPINF_ATTENTION_MODE forces one) and what the rule read (`rule`). Give
this script the JSON of a run with the split forced and one with the walk forced (bench/gpu_slot.sh
makes both): it pairs the two times of each case (variant, shape, N), and over a grid of the two
constants counts the microseconds the rule's picks lose against the faster shape of each case. It
prints every case with both times and both picks, then the current constants' loss and the grid's
best pair (the least lost; among equals, the nearest to the current constants): the one-line change
to make in ops/attention.py. No GPU needed: it reads the files.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.suites.common import read_result_files
from sharpinf.ops.attention import MERGE_COST, WALK_PASSES, walks_pays

PASSES_GRID = [1.0 + 0.25 * i for i in range(9)]  # 1.0 .. 3.0
MERGE_GRID = [0.5 * i for i in range(17)]  # 0 .. 8


@dataclass(frozen=True)
class Case:
    """One attention case timed in both shapes, with what the rule reads for it."""

    variant: str
    shape: str
    tokens: int
    blocks: int
    parts: int
    splits: int
    walk_slots: int
    split_slots: int
    split_us: float
    walk_us: float

    def pick(self, walk_passes: float, merge_cost: float) -> str:
        walks = walks_pays(self.blocks, self.parts, self.splits, self.walk_slots, self.split_slots, walk_passes,
                           merge_cost)
        return "walk" if walks else "split"

    def us(self, shape: str) -> float:
        return self.walk_us if shape == "walk" else self.split_us

    def lost(self, walk_passes: float, merge_cost: float) -> float:
        """Microseconds the rule's pick costs over the faster shape."""
        return self.us(self.pick(walk_passes, merge_cost)) - min(self.split_us, self.walk_us)


def cases(docs: list[dict]) -> tuple[list[Case], list[str]]:
    """The cases timed in both shapes whose rule inputs are complete, and a line for each left out."""
    times: dict[tuple, dict[str, float]] = {}
    inputs: dict[tuple, dict] = {}
    for doc in docs:
        for r in doc.get("results", {}).get("rows", []):
            if r.get("op") != "attention" or not r.get("launch_shape"):
                continue
            key = (r["variant"], r["shape"], r["tokens"])
            times.setdefault(key, {})[r["launch_shape"]] = float(r["us"])
            inputs[key] = r.get("rule") or {}
    out, skipped = [], []
    for key, t in times.items():
        rule = inputs[key]
        missing = [k for k in ("blocks", "parts", "splits", "walk_slots", "split_slots") if rule.get(k) is None]
        if len(t) < 2 or missing:
            why = f"timed only {'/'.join(t)}" if len(t) < 2 else f"the rule read no {', '.join(missing)}"
            skipped.append(f"{key[0]} {key[1]} N={key[2]}: {why}")
            continue
        out.append(Case(*key, rule["blocks"], rule["parts"], rule["splits"], rule["walk_slots"], rule["split_slots"],
                        t["split"], t["walk"]))
    return out, skipped


def fit(found: list[Case]) -> dict:
    """The current constants' loss and the grid's best pair."""
    def loss(a: float, b: float) -> float:
        return sum(c.lost(a, b) for c in found)

    current = (WALK_PASSES, MERGE_COST)
    grid = [(a, b) for a in PASSES_GRID for b in MERGE_GRID]
    best = min(grid, key=lambda p: (round(loss(*p), 6), abs(p[0] - current[0]) + abs(p[1] - current[1])))
    return {"current": {"walk_passes": current[0], "merge_cost": current[1], "lost_us": loss(*current)},
            "best": {"walk_passes": best[0], "merge_cost": best[1], "lost_us": loss(*best)},
            "faster_total_us": sum(min(c.split_us, c.walk_us) for c in found)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path, help="kernels bench JSON files (kernels.json), split and walk runs")
    ap.add_argument("--json", action="store_true", help="print the cases and the fit as JSON")
    args = ap.parse_args(argv)
    docs = read_result_files(args.files, "walk_rule_fit")
    if docs is None:
        return 2
    found, skipped = cases(docs)
    if not found:
        print("walk_rule_fit: no attention case timed in both shapes with the rule's inputs (run the kernels "
              "bench on a GPU once with SHARPINF_ATTENTION_MODE=split and once with =walk)", file=sys.stderr)
        for line in skipped:
            print(f"  {line}", file=sys.stderr)
        return 1
    result = fit(found)
    best = result["best"]
    if args.json:
        print(json.dumps({"cases": [asdict(c) | {"current_pick": c.pick(WALK_PASSES, MERGE_COST),
                                                 "best_pick": c.pick(best["walk_passes"], best["merge_cost"])}
                                    for c in found], "skipped": skipped, **result}, indent=1))
        return 0
    print(f"{'variant':8} {'case':40} {'N':>5} {'blocks':>7} {'parts':>5} {'splits':>6} {'split us':>10} "
          f"{'walk us':>10} {'now':>6} {'best':>6}")
    for c in found:
        print(f"{c.variant:8} {c.shape[:40]:40} {c.tokens:>5} {c.blocks:>7} {c.parts:>5} {c.splits:>6} {c.split_us:>10,.1f} "
              f"{c.walk_us:>10,.1f} {c.pick(WALK_PASSES, MERGE_COST):>6} {c.pick(best['walk_passes'], best['merge_cost']):>6}")
    for line in skipped:
        print(f"left out: {line}")
    cur = result["current"]
    print(f"the faster shape everywhere: {result['faster_total_us']:,.1f} us; the rule now (WALK_PASSES "
          f"{cur['walk_passes']}, MERGE_COST {cur['merge_cost']}) loses {cur['lost_us']:,.1f} us; the best pair "
          f"(WALK_PASSES {best['walk_passes']}, MERGE_COST {best['merge_cost']}) loses {best['lost_us']:,.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
