"""The figures of a GPU run's folder, keyed by what they measure (model, op, shape, variant, N; not by file
name, which changed between runs), so that each can stand beside the previous run's: peers.json rows, the
kernels, decode, prefill and speculative suites' JSON and the rows a cut suite left (.rows.jsonl),
single_stream files."""

from __future__ import annotations

import json
import re
from pathlib import Path

# bench.suites is imported where it is used: it imports sharpinf, which needs the carried gguf (gpu_slot.py)

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "gpu"
Figure = tuple[float, str]  # (value, unit)


def _kernels(label: str, rows: list[dict], out: dict) -> None:
    for r in rows:
        if r.get("us") is not None:
            out[f"kernels {label} {r.get('phase', 'decode')} {r['op']} {r['shape']} {r['variant']} N={r['tokens']}"] = \
                (r["us"], "us")


def _decode(label: str, kernels: str, context, rows: list[dict], out: dict) -> None:
    for r in rows:
        out[f"decode {label} {kernels} ctx={context} B={r['batch_size']}"] = (r["step_s"] * 1e3, "ms a step")


def _prefill(label: str, configs: list[dict], out: dict) -> None:
    for c in configs:
        out[f"prefill {label} {c['prompts']}x{c['prompt_len']} packed"] = (c["packed"]["tok_per_s"], "tok/s")
        out[f"prefill {label} {c['prompts']}x{c['prompt_len']} packed / sequential"] = (c["speedup"], "x")


def _speculative(label: str, rows: list[dict], out: dict) -> None:
    for r in rows:
        if r.get("part") == "step":
            out[f"speculative {label} step B={r['batch_size']} t={r['tokens_per_seq']} / t=1"] = (r["x_vs_1"], "x")
        elif r.get("part") in ("ngram", "draft"):
            run = f"speculative {label} {r.get('pair', 'ngram')} streams={r['streams']}"
            out[f"{run} tok/s"] = (r["speculative"]["output_tok_per_s"], "tok/s")
            out[f"{run} / plain"] = (r["speedup"], "x")
            out[f"{run} target passes a token"] = (r["speculative"]["target_passes_per_token"], "")


def _doc(doc, out: dict, where: str) -> None:
    if isinstance(doc, list):  # peers.json
        for r in doc:
            if isinstance(r, dict) and "test" in r:
                for who in ("sharpinf", "llamacpp"):
                    if r.get(f"{who}_tok_s") is not None:
                        out[f"peers {r['model']} {r['test']} {who}"] = (r[f"{who}_tok_s"], "tok/s")
        return
    if not isinstance(doc, dict):
        return
    if doc.get("bench") == "single_stream" and doc.get("decode_tokens_per_s") is not None:
        pdl = doc.get("describe", {}).get("pdl", "off")
        out[f"single_stream {doc['model']} {doc['kernels']} prompt={doc['prompt_tokens']} pdl={pdl}"] = \
            (doc["decode_tokens_per_s"], "tok/s")
        return
    label, res = where, doc.get("results", {})
    if doc.get("suite") == "kernels":
        _kernels(label, res.get("rows", []), out)
    elif doc.get("suite") == "decode":
        _decode(label, doc.get("kernels", "?"), doc.get("config", {}).get("context"), res.get("rows", []), out)
    elif doc.get("suite") == "prefill":
        _prefill(label, res.get("configs", []), out)
    elif doc.get("suite") == "speculative":
        _speculative(label, [r for part in ("step", "ngram", "draft") for r in res.get(part, [])], out)


def source(f: Path, suite: str) -> str:
    """What a suite's file is of: its folder (<name>/kernels.json) or its name (<name>-kernels.json, the
    runs before 2026-12), so the same run keys the same in both layouts; a probe's folder names its probe."""
    from bench.suites.common import ROWS_SUFFIX

    stem = f.name.removesuffix(ROWS_SUFFIX).removesuffix(".json")
    return f.parent.name if stem == suite else stem.removesuffix(f"-{suite}")


def figures(run_dir: Path) -> dict[str, Figure]:
    """Every figure under run_dir, in file order; a cut suite's rows marked with its key's ' (cut)'."""
    from bench.suites.common import ROWS_SUFFIX, read_rows

    out: dict[str, Figure] = {}
    if not run_dir.is_dir():
        return out
    for f in sorted(run_dir.rglob("*.json")):
        try:
            doc = json.loads(f.read_text())
            _doc(doc, out, source(f, doc.get("suite", "")) if isinstance(doc, dict) else "")
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a result file (a state, a half-written one): nothing to compare
    for f in sorted(run_dir.rglob(f"*{ROWS_SUFFIX}")):
        head, rows = read_rows(f)
        label = source(f, head.get("suite", ""))
        part: dict[str, Figure] = {}
        if head.get("suite") == "kernels":
            _kernels(label, rows, part)
        elif head.get("suite") == "decode":
            _decode(label, head.get("kernels", "?"), "?", rows, part)
        elif head.get("suite") == "speculative":
            _speculative(label, rows, part)
        out.update({f"{k} (cut)": v for k, v in part.items()})
    return out


def previous_run(gpu_slug: str, name: str, results: Path = RESULTS) -> Path | None:
    """The newest committed run of the same GPU model before `name` (<gpu>-<date>)."""
    runs = sorted(d for d in results.glob(f"{gpu_slug}-*") if d.is_dir()
                  and re.fullmatch(rf"{re.escape(gpu_slug)}-\d{{8}}", d.name) and d.name < name)
    return runs[-1] if runs else None


def beside(now: dict[str, Figure], before: dict[str, Figure]) -> list[str]:
    """Markdown rows: each figure of this run, the previous run's for the same thing, and their ratio."""
    rows = ["| figure | this run | previous | this / previous |", "| --- | ---: | ---: | ---: |"]
    for k, (v, unit) in now.items():
        p = before.get(k.removesuffix(" (cut)"))
        ratio = f"{v / p[0]:.2f}x" if p and p[0] else "-"
        rows.append(f"| {k} | {v:,.2f} {unit} | {f'{p[0]:,.2f}' if p else '-'} | {ratio} |")
    return rows
