"""A qwen3moe model end to end: LLM.generate on the emulator, in both kernel sets, gives the reference's
greedy tokens, and a batch of requests gives each the tokens it gets alone (batch invariance through
the router and the experts, in an engine that packs, chunks and decodes them together)."""

from __future__ import annotations

import pytest

from sharpinf.llm import LLM
from sharpinf.model.synth import synthetic_model
from sharpinf.model.tokenizer import Tokenizer
from oracles.generation import generate_reference
from oracles.reference import Reference
from sharpinf.params import SamplingParams

PROMPTS = [[5, 6, 7, 8], list(range(20, 47)), [300, 2, 9]]
GREEDY = SamplingParams(max_tokens=6, temperature=0.0)


@pytest.fixture(scope="module")
def model():
    return synthetic_model("qwen3moe", "Q4_0", n_embd=128)


@pytest.mark.parametrize("kernels", ["simple", "fast"])
def test_llm_generates_the_references_greedy_tokens_alone_and_batched(model, kernels):
    llm = LLM(model, backend="emu", kernels=kernels, num_blocks=48, block_size=4, max_num_batched_tokens=16)
    ref, tok = Reference.from_path(model), Tokenizer.from_gguf(model)
    want = [generate_reference(ref, tok, p, GREEDY).token_ids for p in PROMPTS]
    alone = [llm.generate(p, GREEDY)[0].token_ids for p in PROMPTS]
    batched = [r.token_ids for r in llm.generate(PROMPTS, GREEDY)]
    assert alone == want and batched == want and all(len(t) == 6 for t in want)
