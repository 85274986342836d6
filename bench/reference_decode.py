"""Reference (NumPy) decode speed on SmolLM2-135M: the bar is >= 30 tokens/s on 2 cores.

    python bench/reference_decode.py [--model smollm2-135m] [--tokens 64] [--repeats 3]

Prefills a short chat prompt, then decodes greedily; reports the median decode rate
over the repeats and writes bench/results/reference_decode.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

from oracles.reference import Reference
from sharpinf.model.loader import load_model
from sharpinf.model.registry import resolve_model
from sharpinf.model.tokenizer import Tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "reference_decode.json"))
    args = ap.parse_args()

    model = load_model(resolve_model(args.model))
    t0 = time.perf_counter()
    ref = Reference(model)
    load_s = time.perf_counter() - t0
    tok = Tokenizer.from_gguf_metadata(model.metadata)
    prompt = tok.apply_chat([{"role": "user", "content": "Write a short story about a robot who learns to paint."}])

    rates, prefill_rates = [], []
    for _ in range(args.repeats):
        cache = ref.new_cache(len(prompt) + args.tokens + 1)
        t = time.perf_counter()
        last = ref.forward(prompt, cache)[-1]
        prefill_rates.append(len(prompt) / (time.perf_counter() - t))
        t = time.perf_counter()
        for _ in range(args.tokens):
            last = ref.forward([int(last.argmax())], cache)[-1]
        rates.append(args.tokens / (time.perf_counter() - t))

    result = {
        "bench": "reference_decode",
        "model": Path(model.path).name,
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "prompt_tokens": len(prompt),
        "decode_tokens": args.tokens,
        "decode_tokens_per_s_median": round(statistics.median(rates), 2),
        "decode_tokens_per_s_all": [round(r, 2) for r in rates],
        "prefill_tokens_per_s_median": round(statistics.median(prefill_rates), 1),
        "weights_dequantize_s": round(load_s, 2),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
