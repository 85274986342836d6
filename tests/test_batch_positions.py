"""A request's output does not depend on where it sits in a mixed batch.

Every per-request feature the runner maps onto rows of a step -- structured output (its mask row),
penalties and logit_bias (their device slot), stop strings, n > 1 (its extra rows) and seeded
sampling (its seed and step) -- is tested with the special request first, in the middle and last of
a batch beside plain greedy ones. Each request must get exactly what it gets alone (batch
invariance: its logits are bit-identical, so its tokens and text are too). A row-mapping bug -- a
mask filled from the m-th row's grammar instead of the m-th constrained row's, a slot or seed taken
from the wrong row -- shows up at some position, where a test that always puts the special
request first cannot see it. Both schedulers run it: async scheduling fills masks later, in
ModelRunner.finish, by another code path.
"""

from __future__ import annotations

import functools

import pytest

from sharpinf.llm import LLM
from sharpinf.model.synth import synthetic_model
from sharpinf.params import SamplingParams, StructuredOutput

PLAIN = [list(range(40, 52)), list(range(90, 97)), list(range(7, 30))]  # greedy neighbours, other lengths
SPECIAL_PROMPT = list(range(200, 218))
MAX = 8


@functools.cache
def _model():
    return synthetic_model("llama", "Q8_0", n_embd=128)


@functools.cache
def _llm(async_scheduling: bool) -> LLM:
    return LLM(_model(), backend="emu", kernels="simple", block_size=16, num_blocks=96, max_num_seqs=8,
               async_scheduling=async_scheduling)


def _stop_string() -> str:
    """A piece of text the special prompt's greedy answer prints after its first token: the stop
    string then ends it mid-answer, wherever the request sits."""
    text = _llm(False).generate([SPECIAL_PROMPT], SamplingParams(max_tokens=MAX, ignore_eos=True))[0].text
    piece = text[len(text) // 2 : len(text) // 2 + 2]
    assert piece.strip(), f"the synthetic answer {text!r} has no printable middle to stop on"
    return piece


def _special(kind: str) -> SamplingParams:
    if kind == "structured":
        return SamplingParams(max_tokens=MAX, structured=StructuredOutput("regex", "[a-z]{2,6}[0-9]{1,3}"))
    if kind == "penalties":
        return SamplingParams(max_tokens=MAX, repetition_penalty=1.5, presence_penalty=0.7, frequency_penalty=0.4,
                              ignore_eos=True)
    if kind == "logit_bias":  # forces one id, forbids another: visible in every token
        return SamplingParams(max_tokens=MAX, logit_bias={300: 8.0, 301: -100.0}, ignore_eos=True)
    if kind == "stop":
        return SamplingParams(max_tokens=MAX, stop=[_stop_string()], ignore_eos=True)
    if kind == "n":
        return SamplingParams(max_tokens=MAX, n=3, temperature=1.0, seed=11, ignore_eos=True)
    if kind == "seed":
        return SamplingParams(max_tokens=MAX, temperature=0.9, top_k=40, top_p=0.95, seed=7, ignore_eos=True)
    raise ValueError(kind)


KINDS = ("structured", "penalties", "logit_bias", "stop", "n", "seed")
GREEDY = SamplingParams(max_tokens=MAX, ignore_eos=True)
DIGITS = SamplingParams(max_tokens=MAX, structured=StructuredOutput("regex", "[0-9]{4,9}"))


def _neighbours(kind: str) -> list[SamplingParams]:
    """The plain requests beside the special one; beside a grammar, one neighbour has a grammar of
    its own (a mask taken from the wrong constrained row then breaks one of the two)."""
    return [GREEDY, DIGITS if kind == "structured" else GREEDY, GREEDY]


def _answer(r) -> list:
    return [(c.token_ids, c.text, c.finish_reason) for c in (r.choices or [r])]


@functools.cache
def _alone(params: SamplingParams, prompt: tuple) -> list:
    """What the request gets with nothing beside it."""
    return _answer(_llm(False).generate([list(prompt)], params)[0])


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("at", [0, 1, 3], ids=["first", "middle", "last"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_special_request_gets_its_lone_answer_anywhere_in_a_mixed_batch(kind, at, async_scheduling):
    prompts = [list(p) for p in PLAIN]
    params = _neighbours(kind)
    prompts.insert(at, SPECIAL_PROMPT)
    params.insert(at, _special(kind))
    got = _llm(async_scheduling).generate(prompts, params)
    for i, (p, sp, r) in enumerate(zip(prompts, params, got)):
        assert _answer(r) == _alone(sp, tuple(p)), f"request {i} ({kind if i == at else 'neighbour'}) at position {i}"
    if kind == "structured":  # each constraint held where it was asked for
        assert all(c[1] and c[1][0].isalpha() for c in _answer(got[at]))
        assert all(c[1].isdigit() for c in _answer(got[2 if at < 2 else 1]))
