"""The carry folder (bench/prepare_gpu_slot.sh makes it; the device tool's `carry` takes it to the bare box):
wheels/ (gguf and the test packages the box may lack), llama-cuda-sm90.tar.xz (llama.cpp's CUDA build, when
bench/pack_llamacpp_cuda.sh made one), smol-a/ and smol-b/ (the real SmolLM2's halves, each carried by a call
of its own before the main one). The size rule: what one call carries plus the working tree that travels
with it stays under the device tool's 64 MiB.

    python -m bench.slot.carry --check DIR    the size rule and one wheel a package; exit 1 naming what breaks"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 64 << 20  # the device tool: the working tree that travels, carried paths included
HALVES = ("smol-a", "smol-b")  # each travels in a call of its own
NEEDS = ("numpy", "gguf", "typer", "rich", "pytest", "hypothesis")  # what the runbook's commands import


def size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def tree_bytes(root: Path = ROOT) -> int:
    """Tracked and untracked-not-ignored files: what travels with every call."""
    try:
        names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                               capture_output=True, check=True).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        return 0
    return sum((root / n.decode()).stat().st_size for n in names if n and (root / n.decode()).is_file())


def wheel_dist(name: str) -> str:
    """A wheel file's distribution, normalized (pytest_xdist-3.6.1-py3-none-any.whl -> pytest-xdist)."""
    return re.sub(r"[-_.]+", "-", name.split("-")[0]).lower()


def check(carry: Path, tree: int) -> list[str]:
    """One line for each way the carry folder breaks the rules (empty: it holds)."""
    problems = []
    main = [p for p in carry.iterdir() if p.name not in HALVES] if carry.is_dir() else []
    if not carry.is_dir():
        return [f"{carry}: no such folder (bench/prepare_gpu_slot.sh makes it)"]
    total = tree + sum(size(p) for p in main)
    if total > LIMIT:
        problems.append(f"{carry}: {total / 2**20:.1f} MiB with the working tree ({tree / 2**20:.1f} MiB), over "
                        f"the {LIMIT >> 20} MiB one call carries")
    for h in HALVES:
        if (carry / h).exists() and tree + size(carry / h) > LIMIT:
            problems.append(f"{carry / h}: {(tree + size(carry / h)) / 2**20:.1f} MiB with the working tree, over "
                            f"{LIMIT >> 20} MiB")
    wheels = sorted((carry / "wheels").glob("*.whl"))
    dists = [wheel_dist(w.name) for w in wheels]
    twice = sorted({d for d in dists if dists.count(d) > 1})
    if twice:
        problems.append(f"two wheels of {', '.join(twice)}: pip installs one version of each")
    if "gguf" not in dists:
        problems.append(f"{carry / 'wheels'}: no gguf wheel (the box has none)")
    return problems


def missing() -> list[str]:
    """The distributions of NEEDS this interpreter lacks."""
    out = []
    for d in NEEDS:
        try:
            importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            out.append(d)
    return out


def install(carry: Path, target: Path) -> tuple[list[str], str]:
    """pip install (no index) into target the carried wheels of the distributions not installed here -- the
    box's own are kept, never a second version beside them. (installed, one line of trouble or '')."""
    have = set()
    for w in sorted((carry / "wheels").glob("*.whl")):
        try:
            importlib.metadata.version(wheel_dist(w.name))
            have.add(w)
        except importlib.metadata.PackageNotFoundError:
            pass
    todo = [w for w in sorted((carry / "wheels").glob("*.whl")) if w not in have]
    if not todo:
        return [], ""
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--upgrade", "--target", str(target)] + [str(w) for w in todo],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return [], f"pip install from {carry}: exit {p.returncode}: {(p.stderr or p.stdout).strip()[-300:]}"
    return [wheel_dist(w.name) for w in todo], ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", type=Path, required=True, metavar="DIR")
    args = ap.parse_args()
    tree = tree_bytes()
    problems = check(args.check, tree)
    for line in problems:
        print(f"carry: {line}", file=sys.stderr)
    if not problems:
        main_mib = (tree + sum(size(p) for p in args.check.iterdir() if p.name not in HALVES)) / 2**20
        print(f"carry: {args.check} holds: {main_mib:.1f} MiB with the working tree (limit {LIMIT >> 20} MiB); "
              f"wheels: {', '.join(sorted(wheel_dist(w.name) for w in (args.check / 'wheels').glob('*.whl')))}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
