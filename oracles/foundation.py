"""The oracles of the foundation: the reference against independent truths.

- reference-vs-naive: oracles/reference.py against oracles/naive.py (float64 loops)
  on tiny synthetic models of every arch, and on a few tokens of the given model;
- incremental-vs-full: prefill + one-token decodes equal one teacher-forced pass;
- tokenizer-roundtrip: decode(encode(text)) == text on varied text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from oracles.compare import OracleResult, compare_logits
from oracles.naive import naive_logits
from oracles.reference import Reference
from oracles.tolerances import INCREMENTAL_VS_FULL, REFERENCE_VS_NAIVE


@dataclass
class OracleCase:
    """One named check that verify runs (with a progress bar) and tests call."""

    oracle: str
    case: str
    run: Callable[[], OracleResult]


def reference_vs_naive(model, ids: list[int], case: str) -> OracleResult:
    got = Reference(model).logits(ids)
    want = naive_logits(model, ids)
    return compare_logits("reference-vs-naive", case, got, want, REFERENCE_VS_NAIVE)


def incremental_vs_full(ref: Reference, ids: list[int], case: str, split: int) -> OracleResult:
    full = ref.logits(ids)
    cache = ref.new_cache(len(ids))
    rows = [ref.forward(ids[:split], cache)]
    rows += [ref.forward([t], cache) for t in ids[split:]]
    return compare_logits("incremental-vs-full", case, np.concatenate(rows), full, INCREMENTAL_VS_FULL)


ROUNDTRIP_TEXTS = (
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "Numbers: 12345, 3.14159, 2026-11-21 and 1e-5.",
    "def f(x):\n    return x ** 2  # square\n\n\ttabs\tand  spaces",
    "Unicode: héllo wörld, 日本語のテキスト, emoji 🎉🚀, Ελληνικά.",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n",
    "   leading spaces and trailing   \n\n",
)


def tokenizer_roundtrip(tok, case: str) -> OracleResult:
    bad = [t for t in ROUNDTRIP_TEXTS if tok.decode(tok.encode(t, add_bos=False)) != t]
    return OracleResult("tokenizer-roundtrip", case, None, None, None, not bad,
                        f"{len(bad)} of {len(ROUNDTRIP_TEXTS)} texts differ: {bad[0]!r}" if bad else "")


def synthetic_models() -> list[tuple[str, str]]:
    return [("llama", "Q8_0"), ("qwen2", "Q4_1"), ("qwen3", "Q4_K"), ("gemma3", "Q5_0"), ("qwen3moe", "Q6_K"),
            ("smollm3", "Q5_1"), ("phi3", "Q4_0"), ("mistral3", "Q8_0"), ("gemma2", "Q5_1"), ("gpt-oss", "Q8_0")]


# gemma3 with both kinds of layer (5 windowed, 1 global) and a window shorter than the prompts
SYNTH_SHAPES = {"gemma3": dict(n_layer=6, n_head_kv=1, sliding_window=4),
               "smollm3": dict(n_layer=4),  # layer 3 without RoPE
               "gemma2": dict(sliding_window=4),  # windows on every other layer, softcapped scores
               "gpt-oss": dict(sliding_window=4),  # sinks, windows on every other layer, MXFP4 experts
               # YaRN with the file's betas, and the queries' temperature from position 4 on
               "mistral3": {"mistral3.rope.scaling.type": "yarn", "mistral3.rope.scaling.factor": 4.0,
                            "mistral3.rope.scaling.original_context_length": 4,
                            "mistral3.rope.scaling.yarn_beta_fast": 1.0, "mistral3.rope.scaling.yarn_beta_slow": 0.25,
                            "mistral3.attention.temperature_scale": 0.5}}


def _synthetic(arch: str, qtype: str):
    from sharpinf.model.loader import load_model
    from sharpinf.model.synth import synthetic_model

    return load_model(synthetic_model(arch, qtype, **SYNTH_SHAPES.get(arch, {})))


def foundation_cases(model=None, tokenizer=None) -> list[OracleCase]:
    """Synthetic-model checks always; the given model's checks when one is passed."""
    from sharpinf.model.tokenizer import Tokenizer

    rng = np.random.default_rng(0)
    cases = []
    for arch, qtype in synthetic_models():
        def run_synth(arch=arch, qtype=qtype):
            m = _synthetic(arch, qtype)
            ids = rng.integers(0, m.config.n_vocab, size=7).tolist()
            return reference_vs_naive(m, ids, f"synthetic {arch}/{qtype}, 7 tokens")

        def run_incr(arch=arch, qtype=qtype):
            m = _synthetic(arch, qtype)
            ids = rng.integers(0, m.config.n_vocab, size=12).tolist()
            return incremental_vs_full(Reference(m), ids, f"synthetic {arch}/{qtype}, 12 tokens", split=5)

        def run_tok(arch=arch, qtype=qtype):
            m = _synthetic(arch, qtype)
            return tokenizer_roundtrip(Tokenizer.from_gguf_metadata(m.metadata), f"synthetic {arch} vocab")

        cases += [OracleCase("reference-vs-naive", f"synthetic {arch}/{qtype}", run_synth),
                  OracleCase("incremental-vs-full", f"synthetic {arch}/{qtype}", run_incr)]
        if arch == "llama":
            cases.append(OracleCase("tokenizer-roundtrip", "synthetic vocab", run_tok))
    if model is not None:
        name = model.path.name
        tok = tokenizer
        ids = tok.encode("The capital of France is") if tok else list(range(1, 6))
        cases.append(OracleCase("reference-vs-naive", f"{name}, {len(ids[:4])} tokens",
                                lambda: reference_vs_naive(model, ids[:4], f"{name}, {len(ids[:4])} tokens")))
        ids2 = tok.encode("One, two, three, four, five, six, seven") if tok else list(range(1, 12))
        cases.append(OracleCase("incremental-vs-full", f"{name}, {len(ids2)} tokens",
                                lambda: incremental_vs_full(Reference(model), ids2, f"{name}, {len(ids2)} tokens", 3)))
        if tok is not None:
            cases.append(OracleCase("tokenizer-roundtrip", name, lambda: tokenizer_roundtrip(tok, name)))
    return cases
