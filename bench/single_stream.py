"""Single-stream decode and prefill tokens/s through the engine, eager and with CUDA graphs.

    python bench/single_stream.py [--model smollm2-135m|PATH|synth|SHAPE-shape:TYPE] [--backend cuda|emu]
                                  [--kernels fast|tensor|tuned|simple|op=variant,...] [--prompt 512] [--decode 128]
                                  [--repeats 3] [--out FILE]

SHAPE-shape:TYPE (e.g. qwen3-8b-shape:Q4_K, smollm2-135m-shape:Q4_1) is a benchmark model of a
real model's shape in TYPE, tiled random weights, made on the spot (sharpinf/model/synth.py SHAPES).

One request at a time through LLMEngine (what a user of `LLM.generate` gets): a prompt of
--prompt tokens prefilled in one step, then --decode tokens one step each, with the host's
whole share counted (schedule, upload, launches or graph replay, sampling, the token coming
back every step). Prefill tokens/s = prompt / time to first token; decode tokens/s = tokens
after the first / the time between the first and the last. Median of --repeats requests;
written to --out (default bench/results/single_stream_<backend>.json) and printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from bench.suites.common import resolve_bench_model
from sharpinf.llm import LLM
from sharpinf.model.loader import load_model
from sharpinf.runtime.select import get_backend
from sharpinf.params import SamplingParams


def measure(llm: LLM, prompt: list[int], decode: int, repeats: int) -> dict:
    sp = SamplingParams(max_tokens=decode, ignore_eos=True)
    llm.generate([prompt], sp)  # warm: first use of each plan, lazily compiled kernels
    prefill, dec = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = llm.generate([prompt], sp)[0]
        ttft = out.metrics["ttft_s"]
        prefill.append(ttft)
        itl = out.metrics["mean_itl_s"]
        dec.append(itl if itl else (time.perf_counter() - t0 - ttft) / max(1, decode - 1))
    return {"prefill_tokens_per_s": round(len(prompt) / statistics.median(prefill), 1),
            "decode_tokens_per_s": round(1.0 / statistics.median(dec), 2),
            "decode_ms_per_token": round(statistics.median(dec) * 1e3, 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kv-dtype", default="f16")
    ap.add_argument("--kernels", default="auto", help="kernel variants (sharpinf/ops/variants.py; auto: fast on a GPU)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    path, _ = resolve_bench_model(args.model)
    model = load_model(path)
    be = get_backend(args.backend)
    prompt = np.random.default_rng(0).integers(16, model.config.n_vocab, args.prompt).tolist()
    modes = {}
    for mode in ("eager", "graph"):
        llm = LLM(model, backend=be, max_num_seqs=1, max_num_batched_tokens=max(args.prompt, 16),
                  kv_dtype=args.kv_dtype, enforce_eager=mode == "eager", kernels=args.kernels,
                  enable_prefix_caching=False,  # every repeat prefills the whole prompt
                  num_blocks=-(-(args.prompt + args.decode) // 16) + 2)
        modes[mode] = measure(llm, prompt, args.decode, args.repeats)
        graphs = llm.metrics()["cuda_graphs"]
        if graphs:  # the estimate the KV budget reserved vs what the driver took
            modes[mode]["graphs"] = {**graphs, "reserved_bytes": llm.engine.budget.graph_reserve_bytes}
        del llm
    desc = be.describe()
    result = {
        "bench": "single_stream",
        "backend": be.name,
        "device": desc.get("gpu") or desc.get("device") or "cpu (emulator)",
        "model": Path(path).name,
        "kv_dtype": args.kv_dtype,
        "kernels": args.kernels,
        "prompt_tokens": args.prompt,
        "decode_tokens": args.decode,
        "prefill_tokens_per_s": modes["graph"]["prefill_tokens_per_s"],
        "decode_tokens_per_s": modes["graph"]["decode_tokens_per_s"],
        "decode_tokens_per_s_eager": modes["eager"]["decode_tokens_per_s"],
        "modes": modes,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "describe": desc,
    }
    out_path = Path(args.out) if args.out else Path(__file__).parent / "results" / f"single_stream_{be.name}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "describe"}, indent=2))


if __name__ == "__main__":
    main()
