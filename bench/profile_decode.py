"""Where a decode step's GPU time goes, kernel by kernel (needs a GPU and PyTorch for its profiler).

    python bench/profile_decode.py [--model smollm2-135m|PATH|SHAPE-shape:TYPE] [--kernels fast|simple]
                                   [--context 512] [--steps 32] [--eager] [--out FILE]

One request prefilled to --context tokens, then --steps decode steps through the engine (graphs
unless --eager), profiled with torch.profiler: CUPTI records every kernel on the device, CuPy's
launches included. Prints per kernel: launches per step, mean microseconds, microseconds per
step and share; then the step's wall time against the summed kernel time (the gap is launch
latency between kernels and host work). CUPTI adds little to kernel durations; graphs make the
gaps what a user gets.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-shape:Q4_1")
    ap.add_argument("--kernels", default="fast")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from sharpinf.engine.llm_engine import LLMEngine
    from sharpinf.model.loader import load_model
    from bench.suites.common import resolve_bench_model
    from sharpinf.runtime.select import get_backend
    from sharpinf.params import SamplingParams

    path, _ = resolve_bench_model(args.model)
    model = load_model(path)
    be = get_backend("cuda")
    sp = SamplingParams(max_tokens=args.steps * 3 + 8, ignore_eos=True)
    n = args.context + sp.max_tokens
    eng = LLMEngine(model, backend=be, max_num_seqs=1, max_num_batched_tokens=max(args.context, 16),
                    enforce_eager=args.eager, kernels=args.kernels, enable_prefix_caching=False,
                    num_blocks=-(-n // 16) + 2)
    prompt = np.random.default_rng(0).integers(16, model.config.n_vocab, args.context).tolist()
    eng.add_request(prompt, sp)
    for _ in range(args.steps + 1):  # prefill, then warm decode steps (every plan used once)
        eng.step()
    be.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            eng.step()
        be.synchronize()
        wall = time.perf_counter() - t0
    torch.cuda.synchronize()

    per = defaultdict(lambda: [0, 0.0])  # name -> [launches, total us]
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time > 0:
            per[ev.name][0] += 1
            per[ev.name][1] += ev.device_time
    total = sum(us for _, us in per.values())
    rows = sorted(({"kernel": k, "per_step": c / args.steps, "us_mean": us / c, "us_per_step": us / args.steps,
                    "share": us / total} for k, (c, us) in per.items()), key=lambda r: -r["us_per_step"])
    step_us = wall / args.steps * 1e6
    print(f"{Path(path).name}, kernels {args.kernels}, {'eager' if args.eager else 'graphs'}, "
          f"context {args.context}, {args.steps} decode steps on {be.describe().get('gpu')}")
    print(f"{'kernel':<34}{'per step':>9}{'us mean':>10}{'us/step':>10}{'share':>8}")
    for r in rows:
        print(f"{r['kernel'][:33]:<34}{r['per_step']:>9.1f}{r['us_mean']:>10.2f}{r['us_per_step']:>10.1f}"
              f"{100 * r['share']:>7.1f}%")
    print(f"step wall {step_us:.1f} us ({1e6 / step_us:.0f} tokens/s); kernels {total / args.steps:.1f} us "
          f"({100 * total / args.steps / step_us:.0f}% of the wall)")
    doc = {"model": Path(path).name, "kernels": args.kernels, "graphs": not args.eager, "context": args.context,
           "steps": args.steps, "gpu": be.describe().get("gpu"), "step_wall_us": step_us,
           "kernel_us_per_step": total / args.steps, "rows": rows}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
