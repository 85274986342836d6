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
import sys
import time
from pathlib import Path

import numpy as np

from bench.suites.common import resolve_bench_model, write_json
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


def _result(args, be, desc: dict, path: Path, modes: dict) -> dict:
    """The file's document from the modes measured so far (`partial` until both are)."""
    graph, eager = modes.get("graph", {}), modes.get("eager", {})
    return {
        "bench": "single_stream",
        "backend": be.name,
        "device": desc.get("gpu") or desc.get("device") or "cpu (emulator)",
        "model": Path(path).name,
        "kv_dtype": args.kv_dtype,
        "kernels": args.kernels,
        "prompt_tokens": args.prompt,
        "decode_tokens": args.decode,
        "prefill_tokens_per_s": graph.get("prefill_tokens_per_s"),
        "decode_tokens_per_s": graph.get("decode_tokens_per_s"),
        "decode_tokens_per_s_eager": eager.get("decode_tokens_per_s"),
        "modes": modes,
        **({"partial": True} if len(modes) < 2 else {}),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "describe": desc,
    }


def _dry_run(args) -> int:
    """0 when the command line holds: sizes >= 1, --kernels a choice, the model a shape, name or file."""
    from sharpinf.errors import SharpinfError
    from sharpinf.ops.variants import check_kernels

    try:
        if min(args.prompt, args.decode, args.repeats) < 1:
            raise SharpinfError(f"--prompt, --decode and --repeats must be >= 1, got {args.prompt}, {args.decode}, "
                                f"{args.repeats}")
        check_kernels(args.kernels)
        _check_model_name(args.model)
    except SharpinfError as exc:
        print(f"single_stream --dry-run: {exc}", file=sys.stderr)
        return 2
    print(f"single_stream --dry-run: {args.model}, kernels {args.kernels}, prompt {args.prompt}, decode {args.decode}")
    return 0


def _check_model_name(model: str) -> None:
    from bench.suites.common import SHAPE_MARK, SYNTH_NAME, parse_shape
    from sharpinf.errors import SharpinfError

    if SHAPE_MARK in model:
        from sharpinf.model.shapes import check_shape_type

        try:
            check_shape_type(*parse_shape(model))
        except ValueError as exc:
            raise SharpinfError(f"{model}: {exc}") from None
    elif model != SYNTH_NAME:
        from sharpinf.model.registry import REGISTRY, unknown_model

        if model not in REGISTRY and not Path(model).expanduser().is_file():
            raise unknown_model(model)


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
    ap.add_argument("--dry-run", action="store_true", help="check the model's name, --kernels and the sizes, load "
                    "nothing (bench/gpu_slot.py's dry run)")
    args = ap.parse_args()
    if args.dry_run:
        raise SystemExit(_dry_run(args))

    path, _ = resolve_bench_model(args.model)
    model = load_model(path)
    be = get_backend(args.backend)
    prompt = np.random.default_rng(0).integers(16, model.config.n_vocab, args.prompt).tolist()
    desc = be.describe()
    out_path = Path(args.out) if args.out else Path(__file__).parent / "results" / f"single_stream_{be.name}.json"
    modes = {}
    for mode in ("graph", "eager"):  # graphs first: the figure a cut run should keep
        llm = LLM(model, backend=be, max_num_seqs=1, max_num_batched_tokens=max(args.prompt, 16),
                  kv_dtype=args.kv_dtype, enforce_eager=mode == "eager", kernels=args.kernels,
                  enable_prefix_caching=False,  # every repeat prefills the whole prompt
                  num_blocks=-(-(args.prompt + args.decode) // 16) + 2)
        modes[mode] = measure(llm, prompt, args.decode, args.repeats)
        graphs = llm.metrics()["cuda_graphs"]
        if graphs:  # the estimate the KV budget reserved vs what the driver took
            modes[mode]["graphs"] = {**graphs, "reserved_bytes": llm.engine.budget.graph_reserve_bytes}
        del llm
        result = _result(args, be, desc, path, modes)
        write_json(out_path, result)  # after each mode: a run cut in the second keeps the first
    print(json.dumps({k: v for k, v in result.items() if k != "describe"}, indent=2))


if __name__ == "__main__":
    main()
