"""The NumPy reference against an outside implementation: llama.cpp's log-probabilities and greedy
tokens on 2-layer synthetic float32 models -- a mixture of experts (qwen3moe: routing, top-k,
renormalised weights, the experts' sum), a dense qwen3, a Mixtral-style llama (llama's attention
with qwen3moe's experts), a Llama 3.1-style llama (rope_freqs.weight's frequency factors), a
qwen3 with YaRN (ramp and cos/sin factor), smollm3, phi3 (fused, LongRoPE), a gemma2 (softcaps,
windows), a mistral3 (YaRN with the file's betas and log multiplier, the queries' temperature) and a
gpt-oss (sinks, biases, windows, YaRN, the biased top-k-softmax router, the clamped SwiGLU)
-- recorded once by
bench/llamacpp_agreement.py (tests/data/llamacpp_agreement.json), so CI needs no llama.cpp."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from sharpinf.model.loader import load_model
from sharpinf.model.synth import synthetic_model
from sharpinf.model.tokenizer import Tokenizer
from oracles.generation import generate_reference
from oracles.reference import Reference
from oracles.tolerances import LLAMACPP_LOGPROB
from sharpinf.params import SamplingParams

FIXTURE = json.loads((Path(__file__).parent / "data" / "llamacpp_agreement.json").read_text())


@pytest.fixture(scope="module", params=sorted(FIXTURE["models"]))
def case(request):
    rec = FIXTURE["models"][request.param]
    kw = dict(rec["synth"])
    path = synthetic_model(kw.pop("arch"), kw.pop("qtype"), **kw)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == rec["sha256"], (
        f"{request.param}: the synthetic generator now writes other bytes; rerun bench/llamacpp_agreement.py "
        "(it needs llama.cpp's CPU build) to record llama.cpp's answers on the new file")
    model = load_model(path)
    return request.param, rec, model


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def test_log_probabilities_equal_llamacpps(case):
    name, rec, model = case
    ref = Reference(model)
    worst, rows = 0.0, 0
    for chunk in rec["chunks"]:
        lp = _log_softmax(ref.logits(chunk["tokens"]))[chunk["first_scored"] :]
        for r, top in enumerate(chunk["top"]):
            ids = [i for i, _ in top]
            assert int(np.argmax(lp[r])) == ids[0], f"{name}: position {chunk['first_scored'] + r}: argmax differs"
            worst = max(worst, float(np.abs(lp[r][ids] - [v for _, v in top]).max()))
            rows += 1
    assert rows >= 45 and worst <= LLAMACPP_LOGPROB, f"{name}: max |dlogprob| {worst:.3g} over {rows} rows"


def test_greedy_continuation_equals_llamacpps(case):
    name, rec, model = case
    g = rec["greedy"]
    tok = Tokenizer.from_gguf_metadata(model.metadata)
    ids = tok.encode(g["prompt"])
    out = generate_reference(Reference(model), tok, ids, SamplingParams(max_tokens=g["n"], temperature=0.0,
                                                                        ignore_eos=True))
    # llama-completion prints a control token as nothing (common_token_to_piece without --special)
    got = b"".join(b"" if tok.is_special(t) else tok.token_bytes(t) for t in out.token_ids)
    assert got == bytes.fromhex(g["continuation_hex"]), f"{name}: {got!r} vs llama.cpp's {bytes.fromhex(g['continuation_hex'])!r}"
