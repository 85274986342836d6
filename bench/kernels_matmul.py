"""Quantized matmul micro-benchmark: time per launch of kernels_cu/matmul.cu on the current backend.

    python bench/kernels_matmul.py [--backend auto|cuda|emu] [--types Q8_0,Q4_0,F16]
                                   [--tokens 1,8,64] [--iters N] [--out FILE]

Shapes are SmolLM2-135M's (n_out x n_in): attention 576x576, MLP up 1536x576, MLP down
576x1536, LM head 49152x576. A type whose block does not divide n_in (the K-quants at
n_in = 576) is skipped for that shape. Reports the median time per launch and the weight
bandwidth (row bytes * n_out / time); writes JSON to bench/results/kernels_matmul_<backend>.json.
On the emulator one launch is timed per case (the whole run takes about half a minute);
the numbers that matter come from a GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from sharpinf.model import quants
from sharpinf.ops.matmul import matmul
from sharpinf.runtime.select import get_backend

SHAPES = [("attn", 576, 576), ("mlp_up", 1536, 576), ("mlp_down", 576, 1536), ("lm_head", 49152, 576)]


def _time_launches(be, fn, iters: int) -> float:
    fn()  # warm-up (compile, caches)
    be.synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        be.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--types", default="Q8_0,Q4_0,Q4_K,Q6_K,F16")
    ap.add_argument("--tokens", default="1,8,64")
    ap.add_argument("--iters", type=int, default=None, help="timed launches per case (default 50 on cuda, 1 on emu)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    be = get_backend(args.backend)
    emu = be.name == "emu"
    iters = args.iters or (1 if emu else 50)
    qtypes = [quants.qtype_from_name(t) for t in args.types.split(",")]
    token_counts = [int(n) for n in args.tokens.split(",")]
    rng = np.random.default_rng(0)
    rows = []
    print(f"backend {be.name}, {iters} timed launch(es) per case")
    print(f"{'type':6} {'shape':>16} {'N':>4} {'us/launch':>11} {'GB/s (W)':>9}")
    for qtype in qtypes:
        for label, n_out, n_in in SHAPES:
            if n_in % quants.BLOCK_ELEMS[qtype]:
                continue
            raw = quants.quantize((rng.standard_normal((n_out, n_in)) * 0.05).astype(np.float32), qtype)
            w_dev = be.upload(raw)
            for n in token_counts:
                x_dev = be.upload(rng.standard_normal((n, n_in)).astype(np.float32))
                y_dev = be.empty((n, n_out), np.float32)
                sec = _time_launches(be, lambda: matmul(be, w_dev, qtype, x_dev, y_dev, n, n_out, n_in), iters)
                gbs = raw.nbytes / sec / 1e9
                name = quants.qtype_name(qtype)
                print(f"{name:6} {f'{n_out}x{n_in}':>16} {n:>4} {sec * 1e6:>11.1f} {gbs:>9.2f}", flush=True)
                rows.append({"type": name, "shape": label, "n_out": n_out, "n_in": n_in, "n_tokens": n,
                             "seconds": sec, "weight_bytes": int(raw.nbytes), "weight_gbps": gbs})
    out = Path(args.out or Path(__file__).parent / "results" / f"kernels_matmul_{be.name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"backend": be.name, "describe": _describe(be), "host": platform.node(),
                               "iters": iters, "results": rows}, indent=1, default=str))
    print(f"wrote {out}")


def _describe(be) -> dict:
    try:
        return be.describe()
    except Exception as exc:  # informative only
        return {"error": str(exc)}


if __name__ == "__main__":
    main()
