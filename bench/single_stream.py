"""Single-stream decode and prefill tokens/s through the ForwardPass, with the device's name.

    python bench/single_stream.py [--model smollm2-135m|PATH|synth] [--backend cuda|emu] [--prompt 512] [--decode 128]

One sequence: a prefill of --prompt tokens in one packed step, then --decode steps of one
token each (the decode path of the engine, without scheduling). Writes
bench/results/single_stream_<backend>.json. Meant for a GPU session; runs on the emulator
with a synthetic model for testing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from sharpinf.batch import Batch, SeqChunk
from sharpinf.forward import ForwardPass
from sharpinf.kv_pool import KVPool
from sharpinf.model.loader import load_model
from sharpinf.model.registry import resolve_model
from sharpinf.runtime.select import get_backend


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kv-dtype", default="f16")
    args = ap.parse_args()

    if args.model == "synth":
        from sharpinf.model.synth import synthetic_model

        path = synthetic_model("llama", "Q8_0", n_embd=128)
    else:
        path = resolve_model(args.model)
    model = load_model(path)
    be = get_backend(args.backend)
    fp = ForwardPass(model, be)
    bs, total = 16, args.prompt + args.decode
    n_blocks = -(-total // bs)
    pool = KVPool(be, model.config, num_blocks=n_blocks, block_size=bs, kv_dtype=args.kv_dtype)
    table = list(range(n_blocks))
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, model.config.n_vocab, args.prompt).tolist()

    prefill_s, decode_s = [], []
    for _ in range(args.repeats):
        be.synchronize()
        t = time.perf_counter()
        tok = int(fp.greedy(Batch.build([SeqChunk(prompt, 0, table)], bs), pool)[0])
        prefill_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        for i in range(args.decode):
            # a real stream needs the token back each step
            tok = int(fp.greedy(Batch.build([SeqChunk([tok], args.prompt + i, table)], bs), pool)[0])
        decode_s.append(time.perf_counter() - t)

    desc = be.describe()
    result = {
        "bench": "single_stream",
        "backend": be.name,
        "device": desc.get("gpu") or desc.get("cpu") or "cpu (emulator)",
        "model": Path(path).name,
        "kv_dtype": args.kv_dtype,
        "prompt_tokens": args.prompt,
        "decode_tokens": args.decode,
        "prefill_tokens_per_s": round(args.prompt / statistics.median(prefill_s), 1),
        "decode_tokens_per_s": round(args.decode / statistics.median(decode_s), 2),
        "describe": desc,
    }
    out_path = Path(__file__).parent / "results" / f"single_stream_{be.name}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "describe"}, indent=2))


if __name__ == "__main__":
    main()
