"""gpt-oss through the kernels: sinks, windows, the output bias, the biased top-k-softmax router and the
clamped SwiGLU of MXFP4 experts in one packed, paged pass -- the five path oracles (oracles/paths.py) for
every kernel set, graph replay equal to eager, and the engine's greedy tokens equal to the reference's.

The synthetic file: 2 layers (layer 0 windowed over 8 keys, layer 1 global), 8 experts of which 2 a
token, n_embd 128 (head_dim 32: the q8_0 cache's rows), every other matrix Q8_0."""

from __future__ import annotations

import numpy as np
import pytest

from oracles import paths
from oracles.generation import generate_reference
from oracles.reference import Reference
from sharpinf.model.loader import load_model
from sharpinf.model.synth import synthetic_model
from sharpinf.model.tokenizer import Tokenizer
from sharpinf.params import SamplingParams
from sharpinf.step.forward import ForwardPass

WINDOW = 8
_FP: dict = {}


def _model():
    return load_model(synthetic_model("gpt-oss", "Q8_0", n_embd=128, sliding_window=WINDOW))


def forward_pass(backend, kernels: str) -> ForwardPass:
    if backend.name not in _FP:
        _FP[backend.name] = ForwardPass(_model(), backend)
    key = (backend.name, kernels)
    if key not in _FP:
        _FP[key] = _FP[backend.name].with_own_buffers(kernels=kernels)
    return _FP[key]


def tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 512, n).tolist()


def check(result) -> None:
    assert result.passed, f"{result.oracle} failed: {result}"


ALL = pytest.mark.tier_all("each set once, its KV dtype alternating; the tensor set's flash takes the sinks "
                           "and its moe=mmq the biases with fast's bits in their kernel tests")


@pytest.mark.parametrize("kernels,kv", [("simple", "f16"), ("fast", "q8_0"), pytest.param("simple", "q8_0", marks=ALL),
                                        pytest.param("fast", "f16", marks=ALL), pytest.param("tensor", "f16", marks=ALL)])
def test_the_path_oracles(backend, kernels, kv):
    """kernel-vs-reference, then packed, chunked, batched decode and placement, bit for bit; prompts
    longer than the window, so chunks straddle its edge and decodes run past it."""
    fp = forward_pass(backend, kernels)
    bs = 4 if kv == "f16" else 16
    check(paths.oracle_kernel_vs_reference(fp, tokens(21, 1), kv, bs, seed=1))
    lens = [3, 17, 11]
    check(paths.oracle_packed_vs_sequential(fp, [tokens(n, 100 + i) for i, n in enumerate(lens)], kv, bs, seed=2))
    check(paths.oracle_chunked_vs_whole(fp, tokens(26, 26), kv, bs, seed=3))
    check(paths.oracle_batched_decode(fp, [tokens(n, 200 + i) for i, n in enumerate(lens)],
                                      [tokens(2, 300 + i) for i in range(len(lens))], kv, bs, seed=4))
    r = paths.oracle_placement(fp, tokens(19, 5), kv, bs, seed=5)
    check(r)
    assert r.max_abs_dlogit == 0.0


def test_graph_replay_is_bit_identical_to_eager(backend):
    from oracles.graph_oracle import oracle_graph_vs_eager, standard_schedule

    fp = forward_pass(backend, "fast")
    check(oracle_graph_vs_eager(fp, standard_schedule(fp.cfg.n_vocab), block_size=4))


def test_the_engine_generates_the_references_greedy_tokens_alone_and_batched(backend):
    from sharpinf.llm import LLM

    model = _model()
    prompts, greedy = [tokens(5, 7), tokens(23, 8), tokens(3, 9)], SamplingParams(max_tokens=6, temperature=0.0)
    ref, tok = Reference(model), Tokenizer.from_gguf_metadata(model.metadata)
    want = [generate_reference(ref, tok, p, greedy).token_ids for p in prompts]
    llm = LLM(str(model.path), backend=backend.name, kernels="simple", num_blocks=48, block_size=4,
              max_num_batched_tokens=16)
    assert [r.token_ids for r in llm.generate(prompts, greedy)] == want and all(len(t) == 6 for t in want)
