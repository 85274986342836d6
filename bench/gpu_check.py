"""`make gpu-check`: everything a GPU session should prove and measure, in one command.

    python bench/gpu_check.py [--model smollm2-135m|PATH|smollm2-shape] [--only tests,verify,stream,bench,peers]
                              [--kernels fast,tensor,simple] [--big-model qwen3-8b-shape:Q4_K] [--out bench/results/gpu]
                              [--llamacpp DIR] [--peers-models M1,M2] [--peers-sizes "pp=512 tg=128 npl=1,8,64"]
                              [--suites decode,prefill,throughput,chunking,kernels,host,serve,speculative]

  tests   the GPU tests (pytest -m gpu: every kernel and oracle test's cuda case, graphs included)
  verify  `sharpinf verify MODEL --backend cuda --kernels all` (all oracles for the simple, the
          fast and the tensor-core kernels, graph-vs-eager among them)
  stream  single-stream prefill and decode tokens/s through the engine, eager and with graphs,
          for each kernel set, on MODEL and on the big model (an 8B-class shape, tiled weights)
  bench   `sharpinf bench MODEL --backend cuda` (decode, prefill, throughput, chunking, kernels, serve)
          and the host-cost suite (trace backend); the kernels and prefill suites on the big model too
          (prefill GEMMs at N = 128..2048 with TFLOP/s, prefill attention to 8k, 8 x 128 and 2 x 2048
          prompts packed vs sequential with fast and tensor) and the decode suite on the big model too; the
          summary prints the ratios that matter: decode step time at B = 1, 8, 64 and B = 64 / B = 1, prefill
          tokens/s of one 512- and one 2048-token prompt, 8 x 128 packed vs sequential
  peers   llama.cpp on the same GGUF files in the same run (bench/peers.py): llama-bench pp512 and tg128,
          llama-batched-bench decode at 1, 8 and 64 sequences, beside sharpinf's figures for the same tests
          -> OUT/<gpu>-<date>/peers.json (rows: model, test, sharpinf_tok_s, llamacpp_tok_s, ratio) and a
          table in that folder's README.md, under a PyTorch roofline row (bf16 GEMM TFLOP/s, copy GB/s).
          Models: MODEL (when it is the real SmolLM2 or named), SmolLM2's and the big model's shapes.
          llama.cpp: --llamacpp DIR or SHARPINF_LLAMACPP (a build with bin/llama-bench), else built
          here from .peers/ (copy ../shared/peers/ there; git-ignored, carry it to a GPU machine)

MODEL defaults to the real SmolLM2-135M when it is pulled (or SHARPINF_SMOLLM2_PATH names it),
else the benchmark model of SmolLM2's shape in Q4_1 (sharpinf.model.shapes.SHAPES, tiled random
weights, as `sharpinf bench smollm2-135m-shape:Q4_1` uses), made on the spot. `verify` needs the real model: the oracles' tolerances are measured on trained
weights, and 30 layers of random weights amplify rounding chaotically (a kernel-vs-reference gap
of 0.5 with float kernels), so on the synthetic shape verify's failures say nothing about the
kernels. Writes OUT/<gpu>-<date>.json (every result, the device's facts; a run of some parts
keeps the day's other parts) and the suites' files under OUT/<gpu>-<date>/; prints a summary.
Exit 1 if any part failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("tests", "verify", "stream", "bench", "peers")
BENCH_SUITES = ("decode", "prefill", "throughput", "chunking", "kernels", "host", "serve", "speculative")  # bench's, on MODEL
BIG_SUITES = ("kernels", "prefill", "decode")  # and on the big model
SMOLLM2_SHAPE = "smollm2-135m-shape:Q4_1"  # the peers part's SmolLM2-shaped file (sharpinf.model.shapes.SHAPES)


def pick_model(name: str | None) -> tuple[str, str]:
    """(argument for the CLI, label)."""
    from sharpinf.model.registry import is_pulled, model_path
    from sharpinf.model.shapes import shape_model
    from sharpinf.runtime.paths import cache_dir

    if name and name != "smollm2-shape":
        return name, name
    local = os.environ.get("SHARPINF_SMOLLM2_PATH")
    if name is None and local:
        return local, "smollm2-135m"
    if name is None and is_pulled("smollm2-135m"):
        return str(model_path("smollm2-135m")), "smollm2-135m"
    return str(shape_model("smollm2-135m", "Q4_1", cache_dir("synth"))), "synthetic, SmolLM2's shape (Q4_1)"


def run(cmd: list[str], timeout: int, env: dict | None = None) -> tuple[int, str, str, float]:
    """(exit code, stdout, stderr + stdout for the log, seconds); env: variables to set on top of ours."""
    t = time.perf_counter()
    print("+", " ".join(cmd), flush=True)
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **env} if env else None)
        out, log, rc = p.stdout, p.stderr + p.stdout, p.returncode
    except subprocess.TimeoutExpired as exc:
        out, log, rc = "", f"timed out after {timeout} s\n{exc.stdout or ''}", 124
    return rc, out, log, time.perf_counter() - t


def last_json(out: str):
    """The JSON document a command printed last on stdout, or None."""
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def _kernel_summary(doc: dict) -> dict:
    """Per op, the best GB/s of each variant at N = 1 and its share of the device bandwidth."""
    r = doc.get("results", {})
    best: dict = {}
    for row in r.get("rows", []):
        if row["tokens"] == 1:
            key = f"{row['op']} {row['shape']} {row['variant']}"
            best[key] = {"gb_s": round(row["gb_s"], 1), "pct_of_bandwidth": row["pct_of_bandwidth"] and
                         round(row["pct_of_bandwidth"], 1), "speedup": round(row["speedup"], 2)}
    return {"device_bandwidth_gb_s": r.get("device_bandwidth_gb_s"), "n1": best,
            "ptxas_spills": r.get("ptxas", {}).get("spills")}


def peer_models(spec: str, model: str, label: str, given: bool, big: str) -> list[tuple[str, Path]]:
    """(label, GGUF path) for the peers part: --peers-models, else MODEL when it is the real SmolLM2
    or was named (not the synthetic stand-in), SmolLM2's shape and the big model."""
    from bench.suites.common import resolve_bench_model

    names = [m.strip() for m in spec.split(",") if m.strip()] if spec else \
        ([model] if given or label == "smollm2-135m" else []) + [SMOLLM2_SHAPE] + ([big] if big else [])
    return [(Path(m).name if Path(m).is_file() else m, resolve_bench_model(m)[0]) for m in names]


def _ratios(suites: dict) -> dict:
    """The decode and prefill suites' ratios (decode step at B = 1, 8, 64; prefill tokens/s at 512
    and 2048, packed vs sequential), by suite, and their summary lines."""
    from bench.suites import decode_scaling, prefill_packing

    ratios, lines = {}, []
    for key, doc in suites.items():
        mod = decode_scaling if key.endswith("decode") else prefill_packing if key.endswith("prefill") else None
        if mod is not None:
            ratios[key] = doc["results"]["ratios"]
            lines += [f"{key}: {line}" for line in mod.summary(doc)]
    return {"ratios": ratios, "ratio_lines": lines}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--only", default=",".join(PARTS))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu"))
    ap.add_argument("--backend", default="cuda", help="cuda; emu only to test this script without a GPU")
    ap.add_argument("--kernels", default="fast,tensor,simple",
                    help="kernel sets for stream (verify runs all when fast and simple are both named)")
    ap.add_argument("--suites", default=",".join(BENCH_SUITES),
                    help="bench: the suites to run on MODEL (the big model runs those of kernels, prefill, decode "
                    "among them)")
    ap.add_argument("--big-model", default="qwen3-8b-shape:Q4_K",
                    help="the 8B-class model for stream and the kernels suite: SHAPE-shape:TYPE (a benchmark model "
                         "of that shape, made here), a path or a registered name; '' skips it")
    ap.add_argument("--llamacpp", default=None, help="peers: a llama.cpp build folder with bin/llama-bench and "
                    "bin/llama-batched-bench (default $SHARPINF_LLAMACPP, else built from .peers/); 'committed': "
                    "none run, its figures from the newest committed run on this GPU, llama.cpp commit and file")
    ap.add_argument("--peers-models", default="", help="peers: comma list of models (names, paths, SHAPE-shape:TYPE); "
                    "default MODEL, smollm2-135m-shape:Q4_1 and the big model")
    ap.add_argument("--peers-sizes", default="", help='peers: e.g. "pp=512 tg=128 npl=1,8,64 npp=128 ntg=128 r=5" '
                    "(the defaults; llama.cpp's flag names, r = repeats)")
    ap.add_argument("--dry-run", action="store_true", help="check --only and --peers-sizes and stop (no GPU needed: "
                    "bench/gpu_slot.py's dry run)")
    args = ap.parse_args()
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        print(f"unknown part(s) {bad}: choose from {', '.join(PARTS)}", file=sys.stderr)
        return 2
    import peers

    try:
        sizes = peers.Sizes.parse(args.peers_sizes)
    except peers.PeerError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.dry_run:
        print(f"gpu_check --dry-run: parts {', '.join(parts)}; peers sizes {sizes}")
        return 0

    from sharpinf.errors import SharpinfError
    from sharpinf.runtime.select import get_backend

    try:
        facts = get_backend(args.backend).describe()
    except SharpinfError as exc:
        print(f"gpu-check needs a usable GPU: {exc}", file=sys.stderr)
        return 1
    gpu = facts.get("gpu") or facts["device"]
    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-").lower()
    stamp = f"{slug}-{time.strftime('%Y%m%d')}"
    out_dir = Path(args.out)
    suites_dir = out_dir / stamp
    model, label = pick_model(args.model)
    py = sys.executable
    report: dict = {"gpu": gpu, "device": facts, "model": label, "model_path": model,
                    "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "parts": {}}

    if "tests" in parts:
        import importlib.util

        par = ["-n", str(min(16, os.cpu_count() or 1))] if importlib.util.find_spec("xdist") else []  # pytest-xdist
        rc, out, log, secs = run([py, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"] + par, 3600)
        summary = [l for l in log.splitlines() if re.search(r"\d+ (passed|failed|error)", l)]
        report["parts"]["tests"] = {"ok": rc == 0, "seconds": round(secs, 1), "summary": summary[-1:] or log[-500:],
                                    "failures": [l for l in log.splitlines() if l.startswith("FAILED")][:30]}
    kernel_sets = [k.strip() for k in args.kernels.split(",") if k.strip()]
    # the default sets: `--kernels all` (every registered variant); fewer: each set named
    verify_specs = ["all"] if {"fast", "tensor", "simple"} <= set(kernel_sets) else kernel_sets
    big = args.big_model.strip()
    if "verify" in parts:
        rows, ok, logs, secs = [], True, "", 0.0
        for spec in verify_specs:
            rc, out, log, t = run([py, "-m", "sharpinf", "verify", model, "--backend", args.backend, "--kernels",
                                   spec, "--json"], 3600)
            got = last_json(out) or []
            rows, ok, secs = rows + got, ok and rc == 0 and bool(got), secs + t
            logs += "" if got else log[-2000:]
        report["parts"]["verify"] = {"ok": ok, "seconds": round(secs, 1),
                                     "passed": sum(r["passed"] for r in rows), "total": len(rows), "results": rows,
                                     "log": logs}
    if "stream" in parts:
        runs, t0 = {}, time.perf_counter()
        small = ["--prompt", "32", "--decode", "4", "--repeats", "1"] if args.backend != "cuda" else []
        for m_arg, m_label in [(model, label)] + ([(big, big)] if big else []):
            for k in kernel_sets:
                tmp = suites_dir / f"single_stream_{re.sub(r'[^A-Za-z0-9]+', '-', m_label)}_{k}.json"
                rc, out, log, secs = run([py, "bench/single_stream.py", "--model", m_arg, "--backend", args.backend,
                                          "--kernels", k, "--out", str(tmp)] + small, 3600)
                runs[f"{m_label} / {k}"] = {"ok": rc == 0, "seconds": round(secs, 1),
                                            **(json.loads(tmp.read_text()) if rc == 0 else {"log": log[-2000:]})}
        report["parts"]["stream"] = {"ok": all(r["ok"] for r in runs.values()),
                                     "seconds": round(time.perf_counter() - t0, 1), "runs": runs}
    if "bench" in parts:
        quick = ["--quick"] if args.backend != "cuda" else []
        mine = [s.strip() for s in args.suites.split(",") if s.strip()]
        big_mine = [s for s in BIG_SUITES if s in mine]
        rc, out, log, secs = run([py, "-m", "sharpinf", "bench", model, "--backend", args.backend, "--out", str(suites_dir),
                                  "--suite", ",".join(mine), "--json"] + quick, 3600)
        suites = (last_json(out) or {}).get("suites", {})
        ok, logs = rc == 0 and bool(suites), "" if suites else log[-2000:]
        if big and big_mine:
            big_dir = suites_dir / re.sub(r"[^A-Za-z0-9]+", "-", big)
            rc2, out2, log2, secs2 = run([py, "-m", "sharpinf", "bench", big, "--backend", args.backend, "--out",
                                          str(big_dir), "--suite", ",".join(big_mine), "--json"] + quick,
                                         3600)
            big_suites = (last_json(out2) or {}).get("suites", {})
            ok, secs = ok and rc2 == 0 and bool(big_suites), secs + secs2
            suites.update({f"{big} {k}": v for k, v in big_suites.items()})
            logs += "" if big_suites else log2[-2000:]
        report["parts"]["bench"] = {"ok": ok, "seconds": round(secs, 1), "suites": sorted(suites),
                                    "files": str(suites_dir.relative_to(ROOT) if suites_dir.is_relative_to(ROOT)
                                                 else suites_dir),
                                    "kernels": {k: _kernel_summary(v) for k, v in suites.items() if k.endswith("kernels")},
                                    **_ratios(suites), "log": logs}
    if "peers" in parts:
        t0 = time.perf_counter()
        try:
            models = peer_models(args.peers_models, model, label, args.model not in (None, "smollm2-shape"), big)
            result = peers.part(models, args.backend, kernel_sets[0], sizes, suites_dir, args.llamacpp, run)
        except (peers.PeerError, SharpinfError) as exc:
            result = {"ok": False, "error": f"peers: {exc}", "rows": []}
        report["parts"]["peers"] = {**result, "seconds": round(time.perf_counter() - t0, 1),
                                    "model": ", ".join(dict.fromkeys(r["model"] for r in result["rows"])) or label}

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stamp}.json"
    for r in report["parts"].values():
        r.setdefault("model", label)
    if path.exists():  # a run of some parts (--only) keeps the other parts of the day's report
        try:
            earlier = json.loads(path.read_text())
            report["parts"] = {**earlier.get("parts", {}), **report["parts"]}
        except ValueError:
            pass
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"\n{gpu}")
    for name, r in report["parts"].items():
        extra = ""
        if name == "verify":
            extra = f"{r['passed']}/{r['total']} oracles pass"
        elif name == "stream":
            extra = "; ".join(f"{k}: decode {v['decode_tokens_per_s']} tok/s with graphs, "
                              f"{v['decode_tokens_per_s_eager']} eager, prefill {v['prefill_tokens_per_s']} tok/s"
                              if v["ok"] else f"{k}: FAILED" for k, v in r["runs"].items())
        elif name == "tests":
            extra = " ".join(r["summary"]) if isinstance(r["summary"], list) else ""
        elif name == "peers":
            extra = peers.summary(r)
        print(f"  {name:<7} {'ok  ' if r['ok'] else 'FAIL'} {r['seconds']:>7.1f} s  [{r.get('model')}]  {extra}")
        for line in r.get("ratio_lines", []):
            print(f"          {line}")
    print(f"wrote {path}")
    return 0 if all(r["ok"] for r in report["parts"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
