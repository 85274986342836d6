"""No code outside the registry tests a kernel variant's name or identity: what a variant is, needs and
does is declared in its registry entry (sharpinf/ops/variants.toml) and read through its Variant, so a
new variant is its files, its launcher and one entry. A grep over sharpinf/, oracles/ and bench/ (the
code that dispatches, allocates, checks and times kernels), with its negative controls.

Left out, and why:
  sharpinf/ops/variant.py, variants.py, registry_file.py (and variants.toml, not Python): the registry
      itself -- the one place a variant's declared fields are read and named;
  bench/results/: recorded history, not code.
Docstrings and comments are not code: they may name variants (say which kernels run where)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from sharpinf.ops.variants import OP_NAMES, REGISTRY

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("sharpinf", "oracles", "bench")
REGISTRY_CODE = {"sharpinf/ops/variant.py", "sharpinf/ops/variants.py", "sharpinf/ops/registry_file.py"}


def patterns() -> dict[str, re.Pattern]:
    names = "|".join(sorted((re.escape(n) for op in OP_NAMES for n in REGISTRY[op]), key=len, reverse=True))
    ops = "|".join(OP_NAMES)
    q = "[\"']"
    return {name: re.compile(p) for name, p in {
        "a choice's op read by name (use choice.of(op) and what the Variant declares)": rf"\bchoice\.({ops})\b",
        "an op's variant compared": rf"\.({ops})\s*(==|!=)",
        "an op compared with a literal": rf"\b({ops})\s*(==|!=)\s*{q}",
        "a launcher's identity": r"\blauncher\s*(\bis\b|==|!=)",
        "a variant looked up by a literal name": rf"\bvariant\(\s*{q}({ops}){q}\s*,\s*{q}",
        "a registered variant's name compared": rf"(==|!=)\s*{q}({names}){q}|{q}({names}){q}\s*(==|!=)",
        "a registered variant's name in a literal set": rf"\b(not\s+)?in\s*[\(\[\{{]\s*{q}({names}){q}",
    }.items()}


def code_lines(text: str) -> dict[int, str]:
    """{line: its code}, comments and docstrings blanked (they may name variants; code may not)."""
    docs = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(
                getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            docs |= set(range(body[0].lineno, body[0].end_lineno + 1))
    lines = text.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            r, c = tok.start
            lines[r - 1] = lines[r - 1][:c]
    return {i: line for i, line in enumerate(lines, 1) if i not in docs}


def offences(text: str, where: str = "<text>") -> list[str]:
    pats = patterns()
    return [f"{where}:{i}: {why}: {line.strip()}" for i, line in code_lines(text).items()
            for why, p in pats.items() if p.search(line)]


def scanned_files() -> list[Path]:
    return [f for root in SCANNED for f in sorted((ROOT / root).rglob("*.py"))
            if "results" not in f.relative_to(ROOT).parts and str(f.relative_to(ROOT)) not in REGISTRY_CODE]


def test_no_code_outside_the_registry_tests_a_variants_name_or_identity():
    files = scanned_files()
    assert len(files) > 100 and {"sharpinf/step/kernels.py", "sharpinf/step/buffers.py", "oracles/trace.py",
                                 "oracles/tolerances.py", "bench/suites/kernel_cases.py"} <= {
        str(f.relative_to(ROOT)) for f in files}
    found = [o for f in files for o in offences(f.read_text(), str(f.relative_to(ROOT)))]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("line", [
    'if self.choice.rope_kv != "fused":',  # what step/kernels.py did
    'flash = self.fp.choice.attention == "flash"',  # oracles/trace.py
    'if attention == "flash":',  # oracles/tolerances.py
    'flush = matmul_tuned.reserve(be) if mm.launcher is matmul_tuned.matmul_tuned else None',  # step/buffers.py
    'dp4a = variant("matmul", "dp4a")',  # bench/suites/kernel_variants.py
    'if v.name == "radix":', 'if name in ("split", "flash"):', 'ok = "grouped" != v.name',
    'same = other.choice.matmul == fp.choice.matmul',
])
def test_the_check_catches_a_name_test(line):
    assert offences(f"def f():\n    {line}\n        pass\n" if line.endswith(":") else f"def f():\n    {line}\n")


def test_the_check_leaves_docstrings_comments_and_declared_fields_alone():
    text = '''def f(v, choice, L):
    """choice.attention == "flash" was how it read (a docstring)."""
    q8 = choice.of("matmul").activations == "q8_1"  # rope_kv != "fused" (a comment)
    f16 = v.rounding == "f16_operands"
    return L.moe is not None and v.separate
'''
    assert offences(text) == []


def test_a_planted_name_test_in_a_copy_of_step_kernels_fails(tmp_path):
    """The negative control on a real file: step/kernels.py with the link's old rope_kv test put back."""
    src = (ROOT / "sharpinf/step/kernels.py").read_text()
    assert offences(src) == []
    planted = src.replace("        if len(L.wqkv) != 1:\n", '        if len(L.wqkv) != 1 or self.choice.rope_kv != "fused":\n')
    assert planted != src
    (tmp_path / "kernels.py").write_text(planted)
    found = offences((tmp_path / "kernels.py").read_text(), "kernels.py")
    assert found and all("rope_kv" in o for o in found), found
