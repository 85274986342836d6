"""llama.cpp's figures from the committed runs: a GPU slot without a llama.cpp build at hand takes them from
the newest committed run on the same GPU model, with the same llama.cpp commit, on the same file -- the
rows of bench/results/gpu/<gpu>-<date>/peers.json record the file's sha256, the commit and where each
llama.cpp figure came from (bench/peers.py writes them)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "gpu"  # the committed runs, <gpu>-<date>/peers.json


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 23), b""):
            h.update(block)
    return h.hexdigest()


def committed_figures(gpu_slug: str, commit: str, sha256: str, results: Path = RESULTS) -> tuple[dict, str] | None:
    """({test: llama.cpp tok/s}, the peers.json they came from) of the newest committed run on this GPU model
    (<gpu_slug>-<date>/) whose rows name the same llama.cpp commit and file; None when no run does (runs
    from before the rows recorded the file's sha256 never match: nothing says they timed the same file)."""
    runs = [f for f in results.glob(f"{gpu_slug}-*/peers.json") if re.fullmatch(rf"{re.escape(gpu_slug)}-\d{{8}}",
                                                                                  f.parent.name)]
    for f in sorted(runs, key=lambda f: f.parent.name, reverse=True):  # <gpu>-YYYYMMDD: the newest first
        try:
            rows = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        got = {r["test"]: (r["llamacpp_tok_s"], r.get("llamacpp_from")) for r in rows if isinstance(r, dict)
               and r.get("sha256") == sha256 and r.get("llamacpp_commit") == commit and r.get("llamacpp_tok_s")}
        if got:
            where = f.relative_to(ROOT) if f.is_relative_to(ROOT) else f
            sources = {src for _, src in got.values() if src not in (None, "run")}  # figures carried forward
            return {t: v for t, (v, _) in got.items()}, str(next(iter(sources)) if len(sources) == 1 else where)
    return None
