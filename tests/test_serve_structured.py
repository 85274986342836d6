"""`sharpinf serve` with presence/frequency penalties, logit_bias and structured output
(response_format json_object / json_schema, vLLM's guided_regex / guided_grammar), through the
official `openai` client, on a tiny synthetic model (random text; its byte-level vocabulary
spells any JSON, so only the grammar makes the answers valid)."""

from __future__ import annotations

import json
import re

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from sharpinf.engine.llm_engine import LLMEngine  # noqa: E402
from sharpinf.llm import LLM  # noqa: E402
from sharpinf.model.synth import synthetic_model  # noqa: E402
from sharpinf.params import SamplingParams  # noqa: E402
from sharpinf.serve.loopback import LoopbackServer  # noqa: E402

NAME = "tiny"
CONFIG = dict(num_blocks=96, max_num_seqs=8, max_num_batched_tokens=128)
SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "ok": {"type": "boolean"}, "kind": {"enum": ["cat", "dog"]}},
          "required": ["name", "age", "ok", "kind"], "additionalProperties": False}
SEEDS = range(4)


def _model():
    return synthetic_model("llama", "Q8_0", n_embd=128)


@pytest.fixture(scope="module")
def server():
    with LoopbackServer(lambda: LLMEngine(_model(), backend="emu", **CONFIG), NAME, ready_timeout=120) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def offline():
    return LLM(_model(), backend="emu", **CONFIG)


def _chat(client, **kw):
    return client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "a pet, as JSON"}],
                                          **{"max_tokens": 80, "temperature": 1.0, **kw})


# -- penalties and logit_bias ---------------------------------------------------------------------
def test_penalties_equal_offline_generation(client, offline):
    kw = dict(temperature=1.0, seed=7, presence_penalty=1.5, frequency_penalty=2.0)
    got = client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=16, **kw)
    want = offline.generate(["Once upon a time"], SamplingParams(max_tokens=16, **kw))[0]
    assert got.choices[0].text == want.text
    plain = client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=16, temperature=1.0, seed=7)
    assert plain.choices[0].text != want.text  # negative control: the penalties changed the answer


def test_logit_bias_forces_and_forbids(client, offline):
    tok = offline.engine.tokenizer
    x = tok.encode("a", add_bos=False)[0]
    r = client.completions.create(model=NAME, prompt="hello", max_tokens=6, temperature=1.0, seed=1,
                                  logit_bias={str(x): 100})
    assert r.choices[0].text == "a" * 6
    greedy = client.completions.create(model=NAME, prompt="hello", max_tokens=1, temperature=0)
    first = tok.encode(greedy.choices[0].text, add_bos=False)[0]
    banned = client.completions.create(model=NAME, prompt="hello", max_tokens=1, temperature=0,
                                       logit_bias={str(first): -100})
    assert banned.choices[0].text != greedy.choices[0].text


@pytest.mark.parametrize("body,param", [({"logit_bias": {"999999": 1}}, "logit_bias"),
                                        ({"logit_bias": {"5": 101}}, "logit_bias"),
                                        ({"logit_bias": {"x": 1}}, "logit_bias"),
                                        ({"frequency_penalty": -3}, "frequency_penalty"),
                                        ({"response_format": {"type": "xml"}}, "response_format"),
                                        ({"response_format": {"type": "json_schema", "json_schema": {
                                            "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "wat"}}}}}},
                                         "response_format"),
                                        ({"guided_regex": "a(b"}, "guided_regex"),
                                        ({"guided_json": {"type": "object"}, "guided_regex": "a"}, "guided_regex")])
def test_bad_fields_are_400_naming_the_field(server, body, param):
    r = httpx.post(server.url + "/v1/completions", json={"model": NAME, "prompt": "hi", "max_tokens": 2, **body},
                   timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"]
    if "wat" in json.dumps(body):
        assert "wat" in err["message"]  # llguidance's own words


# -- structured output ----------------------------------------------------------------------------------
def test_json_schema_answers_always_validate(client):
    rf = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA, "strict": True}}
    for seed in SEEDS:
        c = _chat(client, seed=seed, response_format=rf).choices[0]
        assert c.finish_reason == "stop", c
        jsonschema.validate(json.loads(c.message.content), SCHEMA)
    # negative control: the same requests unconstrained are not JSON at all
    for seed in SEEDS:
        with pytest.raises(ValueError):
            json.loads(_chat(client, seed=seed).choices[0].message.content)


def test_json_object_and_a_stream(client):
    for seed in SEEDS[:2]:
        c = _chat(client, seed=seed, max_tokens=200, response_format={"type": "json_object"}).choices[0]
        if c.finish_reason == "stop":  # a random model may still be writing when max_tokens ends it
            assert isinstance(json.loads(c.message.content), dict)
        else:
            assert c.message.content.startswith("{")
    rf = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA}}
    parts = [ch.choices[0].delta.content or "" for ch in _chat(client, seed=9, response_format=rf, stream=True)]
    jsonschema.validate(json.loads("".join(parts)), SCHEMA)


def test_guided_regex_and_lark(client):
    for seed in SEEDS:
        r = client.completions.create(model=NAME, prompt="hi", max_tokens=30, temperature=1.0, seed=seed,
                                      extra_body={"guided_regex": "(yes|no), [0-9]{2}"})
        assert re.fullmatch(r"(yes|no), [0-9]{2}", r.choices[0].text) and r.choices[0].finish_reason == "stop"
    lark = 'start: "(" item (" " item)* ")"\nitem: /[a-c]/'
    r = client.completions.create(model=NAME, prompt="hi", max_tokens=30, temperature=1.0, seed=3,
                                  extra_body={"guided_grammar": lark})
    text = r.choices[0].text
    assert re.fullmatch(r"\([a-c]( [a-c])*\)", text) or (r.choices[0].finish_reason == "length" and text[:1] == "(")


def test_llm_api_structured_output(offline):
    from sharpinf.params import StructuredOutput

    # ignore_eos: the grammar's own end stops the request (the end-of-text token is never drawn)
    p = [SamplingParams(max_tokens=80, temperature=1.0, seed=s, structured=StructuredOutput.json_schema(SCHEMA),
                        ignore_eos=s % 2 == 1) for s in SEEDS]
    for out in offline.generate(["a pet"] * len(p), p):
        assert out.finish_reason == "stop"
        jsonschema.validate(json.loads(out.text), SCHEMA)


def test_a_mask_that_allows_nothing_ends_the_request(offline):
    """The kernel answers -1 for a row whose mask allows no id; the engine ends that request
    ("stop", with the reason) and the others run on."""
    from sharpinf.params import StructuredOutput

    class Nothing:  # a grammar in a dead state
        error, finished = "dead", False

        def fill(self, words):
            words[:] = 0

    eng = offline.engine
    dead = eng.add_request("hi", SamplingParams(max_tokens=5, structured=StructuredOutput("regex", "a+")))
    alive = eng.add_request("hi", SamplingParams(max_tokens=5, ignore_eos=True))
    eng.requests[dead].grammar = Nothing()
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    end = {o.request_id: o for o in outs if o.finished}
    assert end[dead].finish_reason == "stop" and "no token is allowed next (dead)" in end[dead].error
    assert end[dead].token_ids == [] and len(end[alive].token_ids) == 5
