"""The layout a newcomer can hold in their head, held by tests (no compile, no model):

- the import graph of sharpinf/, oracles/ and bench/suites/ has no circle, counting the imports
  inside functions too (a function-local import is still a tie);
- the truth stands apart: oracles/ sits at the top of the repository beside sharpinf/, and inside
  sharpinf/ only the CLI's commands that need the truth import it (verify, the reference backend of
  generate and score) -- nothing below the CLI imports oracles/ or bench/;
- no Python file is over ~400 lines, except the few that are one algorithm, each named with why;
- ARCHITECTURE.md opens with one request's path as a call outline of at most 10 files, every file
  in it exists and every function it names is defined there.
Each rule's checker is also fed a planted violation (negative controls).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("sharpinf", "oracles", "bench/suites")
MAX_LINES = 400
ONE_ALGORITHM = {  # over MAX_LINES, and why that is one piece
    "sharpinf/model/quants.py": "the block layouts and dequantizers of every GGUF type, one table",
    "bench/sass_mix.py": "one tool: SASS decode, pipe pricing, stall and round counts",
}
# inside sharpinf/, who may import the harness: the commands that need the truth
MAY_IMPORT_ORACLES = {"sharpinf.cli.verify_cmd", "sharpinf.cli.text_cmds"}
MAY_IMPORT_BENCH = {"sharpinf.cli.bench_cmd"}


def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = REPO) -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in (root / pkg).rglob("*.py"):
            out[module_name(p, root)] = p
    return out


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports_of(name: str, source: str, known: set[str], is_package: bool = False) -> set[str]:
    """The known modules `source` imports, anywhere in it (functions included, TYPE_CHECKING blocks
    not: they never run). `from a import b` counts as importing a.b when that is a module."""
    out: set[str] = set()

    def visit(node):
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, ast.If) and _type_checking(ch):
                continue
            if isinstance(ch, ast.Import):
                out.update(a.name for a in ch.names)
            elif isinstance(ch, ast.ImportFrom):
                base = ch.module or ""
                if ch.level:
                    pkg = name.split(".") if is_package else name.split(".")[:-1]
                    pkg = pkg[: len(pkg) - ch.level + 1]
                    base = ".".join(pkg + ([base] if base else []))
                out.add(base)
                out.update(f"{base}.{a.name}" for a in ch.names)
            visit(ch)
    visit(ast.parse(source))
    return {m for m in out if m in known and m != name}


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    known = set(mods)
    return {m: imports_of(m, p.read_text(), known, p.name == "__init__.py") for m, p in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def harness_imports_below_the_cli(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for m, deps in sorted(graph.items()):
        if not m.startswith("sharpinf"):
            continue
        for d in sorted(deps):
            if d.split(".")[0] == "oracles" and m not in MAY_IMPORT_ORACLES:
                bad.append(f"{m} imports {d}")
            if d.split(".")[0] == "bench" and m not in MAY_IMPORT_BENCH:
                bad.append(f"{m} imports {d}")
    return bad


def test_the_import_graph_has_no_circle():
    graph = import_graph(modules())
    assert len(graph) > 100
    assert cycles(graph) == []


def test_a_circle_through_a_function_local_import_is_found(tmp_path):
    (tmp_path / "sharpinf").mkdir()
    (tmp_path / "sharpinf" / "__init__.py").write_text("")
    (tmp_path / "sharpinf" / "a.py").write_text("from sharpinf.b import f\n")
    (tmp_path / "sharpinf" / "b.py").write_text("def f():\n    from sharpinf import a\n    return a\n")
    (tmp_path / "sharpinf" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                "    from sharpinf import a\n")
    graph = import_graph({module_name(p, tmp_path): p for p in (tmp_path / "sharpinf").glob("*.py")})
    assert cycles(graph) == [["sharpinf.a", "sharpinf.b"]]
    assert "sharpinf.a" not in graph["sharpinf.c"]  # a TYPE_CHECKING import never runs


def test_the_truth_stands_apart():
    assert (REPO / "oracles" / "reference.py").is_file() and not (REPO / "sharpinf" / "oracles").exists()
    assert (REPO / "bench" / "suites" / "__init__.py").is_file() and not (REPO / "sharpinf" / "bench").exists()
    graph = import_graph(modules())
    assert harness_imports_below_the_cli(graph) == []
    assert any(d.startswith("oracles") for m in MAY_IMPORT_ORACLES for d in graph[m])  # the allowance is used
    packaged = (REPO / "pyproject.toml").read_text()
    assert '"oracles"' in packaged and '"bench.suites"' in packaged  # installed with the package


def test_an_import_of_the_truth_below_the_cli_is_refused():
    graph = {"sharpinf.step.forward": {"oracles.reference"}, "sharpinf.cli.verify_cmd": {"oracles.paths"},
             "sharpinf.engine.llm_engine": {"bench.suites.common"}}
    assert harness_imports_below_the_cli(graph) == ["sharpinf.engine.llm_engine imports bench.suites.common",
                                                    "sharpinf.step.forward imports oracles.reference"]


def long_files(root: Path = REPO) -> list[str]:
    out = []
    for p in sorted([*(root / "sharpinf").rglob("*.py"), *(root / "oracles").rglob("*.py"), *(root / "bench").rglob("*.py")]):
        rel = p.relative_to(root).as_posix()
        n = len(p.read_text().splitlines())
        if n > MAX_LINES and rel not in ONE_ALGORITHM:
            out.append(f"{rel}: {n} lines")
    return out


def test_no_python_file_is_over_400_lines_but_one_algorithm():
    assert long_files() == []
    for rel in ONE_ALGORITHM:  # an exception that no longer needs to be one is taken out
        assert len((REPO / rel).read_text().splitlines()) > MAX_LINES, f"{rel} is short now: drop it from ONE_ALGORITHM"


def test_a_long_file_is_named(tmp_path):
    (tmp_path / "sharpinf").mkdir()
    (tmp_path / "sharpinf" / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "sharpinf" / "small.py").write_text("x = 1\n" * MAX_LINES)
    assert long_files(tmp_path) == [f"sharpinf/big.py: {MAX_LINES + 1} lines"]


# -- the request path ----------------------------------------------------------------------------
# `[name = ]call(args)   ...   path`: the call is the first name followed by its arguments (an entry's
# template arguments allowed), the file the last word of the line
OUTLINE = re.compile(r"^(?:[\w, ]+=\s*)?(?:[\w.]*\.)?(\w+)(?:<[^>]*>)?\(.*?\).*\s([\w/]+\.(?:py|cu))\s*$")


def request_path(text: str) -> list[tuple[str, str]]:
    """(function, file) of each line of ARCHITECTURE.md's first code block: `call(...)   file`."""
    block = text.split("```", 2)[1]
    out = []
    for line in block.splitlines()[1:]:
        m = OUTLINE.match(line.strip())
        if m:
            out.append((m.group(1), m.group(2)))
    return out


def defines(path: Path, name: str) -> bool:
    text = path.read_text()
    if path.suffix == ".cu":
        return re.search(rf"\b{name}\b", text) is not None  # an entry's family name (its types appended)
    tree = ast.parse(text)
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name
               for n in ast.walk(tree))


def check_request_path(text: str, root: Path = REPO) -> list[str]:
    steps = request_path(text)
    files = list(dict.fromkeys(f for _, f in steps))
    problems = [] if 3 <= len(files) <= 10 else [f"the request path names {len(files)} files (at most 10)"]
    for fn, f in steps:
        if not (root / f).is_file():
            problems.append(f"{f}: no such file")
        elif not defines(root / f, fn):
            problems.append(f"{f} defines no {fn}")
    return problems


def test_architecture_opens_with_the_request_path_and_it_is_true():
    text = (REPO / "ARCHITECTURE.md").read_text()
    assert text.index("```") < text.index("\n## "), "the outline comes first"
    steps = request_path(text)
    assert len(steps) >= 8, steps
    assert check_request_path(text) == []


def test_a_request_path_that_drifts_is_named():
    text = (REPO / "ARCHITECTURE.md").read_text()
    fn, f = request_path(text)[2]
    assert check_request_path(text.replace(f"{fn}(", f"{fn}_renamed(", 1)) == [f"{f} defines no {fn}_renamed"]
    eleven = "x\n```\n" + "".join(f"a{i}()   sharpinf/f{i}.py\n" for i in range(11)) + "```\n"
    assert check_request_path(eleven)[0] == "the request path names 11 files (at most 10)"
