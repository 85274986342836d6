"""The gate: the kernel tests of every variant on the GPU (pytest -m gpu), the variants never timed on a GPU
first, and which variants failed -- read from pytest's JUnit XML, each failed test's parameter ids against
the registry (the kernel tests are parametrized by variant names) -- so that the timed stages leave them out
instead of the whole slot being lost to one broken kernel."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

# sharpinf is imported where it is used: the box installs the carried gguf first (bench/gpu_slot.py)

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "gpu"
# the kernel test files whose cases are one registry op's variants (the others test kernels no variant owns)
FILE_OPS = {"attention": "attention", "moe": "moe", "sampling": "sample", "sampling_penalties": "sample",
            "layer_link": "link", "matmul_ffn": "ffn", "rope": "rope_kv", "matmul": "matmul",
            "matmul_dp4a": "matmul", "matmul_mma": "matmul", "matmul_variants": "matmul"}


@dataclass
class GateResult:
    failed: dict[str, list[str]] = field(default_factory=dict)  # {op: [variant]}: left out of the timed stages
    unattributed: list[str] = field(default_factory=list)  # failed tests no variant owns (named, nothing left out)
    tests: int = 0
    failures: int = 0

    def merge(self, other: "GateResult") -> None:
        for op, names in other.failed.items():
            self.failed[op] = sorted(set(self.failed.get(op, [])) | set(names))
        self.unattributed += other.unattributed
        self.tests += other.tests
        self.failures += other.failures


def timed_variants(results: Path = RESULTS) -> set[tuple[str, str]]:
    """(op, variant) of every row of the committed GPU runs' kernels suites: the variants a GPU has timed."""
    seen = set()
    for f in results.glob("*/**/*kernels*.json"):
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        for r in (doc.get("results", {}).get("rows", []) if isinstance(doc, dict) else []):
            from bench.suites.kernel_cases import BENCH_OPS

            seen.add((BENCH_OPS.get(r.get("op"), r.get("op")), r.get("variant")))
    return seen


def never_timed(results: Path = RESULTS) -> list[str]:
    """The variant names no committed GPU run timed (so never known to run there): the gate's first pass."""
    from sharpinf.ops.variants import OP_NAMES, variants_of

    seen = timed_variants(results)
    seen |= {(op, variants_of(op)[0]) for op, _ in seen}  # an op's baseline is timed beside it, renamed or not
    names = {v for op in OP_NAMES for v in variants_of(op) if (op, v) not in seen}
    return sorted(names - {v for _, v in seen})  # a name shared by two ops is first only if neither was timed


def selections(first: list[str]) -> tuple[str, str]:
    """pytest -k expressions of the first pass (tests naming any of `first`) and of the rest (its complement):
    together every test once."""
    if not first:
        return "", "not __nothing_first__"
    expr = " or ".join(first)
    return expr, f"not ({expr})"


def _op_of(classname: str) -> str | None:
    m = re.search(r"test_kernels_(\w+)", classname)
    return FILE_OPS.get(m.group(1)) if m else None


def read_junit(path: Path) -> GateResult:
    """The failed (and errored) tests of a JUnit XML file, each mapped to the variants in its parameter id."""
    from sharpinf.ops.variants import variants_of

    res = GateResult()
    for case in ET.parse(path).getroot().iter("testcase"):
        res.tests += 1
        if case.find("failure") is None and case.find("error") is None:
            continue
        res.failures += 1
        name, cls = case.get("name", ""), case.get("classname", "")
        op = _op_of(cls)
        m = re.search(r"\[(.*)\]$", name)
        params = set(re.split(r"[-,]", m.group(1))) if m else set()
        hit = sorted(params & set(variants_of(op))) if op else []
        if hit:
            res.failed[op] = sorted(set(res.failed.get(op, [])) | set(hit))
        else:
            res.unattributed.append(f"{cls}::{name}")
    return res


def gate_result(paths: list[Path]) -> tuple[GateResult, list[str]]:
    """The gate's result over its passes' XML files, and one line for each file that did not read (a pass
    cut before pytest wrote it)."""
    res, missing = GateResult(), []
    for p in paths:
        try:
            res.merge(read_junit(p))
        except (OSError, ET.ParseError) as exc:
            missing.append(f"{p.name}: {type(exc).__name__}: {exc}")
    return res, missing
