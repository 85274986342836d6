"""`sharpinf serve` against the official `openai` client: a real server on 127.0.0.1 (a free port,
started and stopped here) over a tiny synthetic model on the emulator."""

from __future__ import annotations

import asyncio
import json
import math
import random
import threading
import time

import httpx
import pytest

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from sharpinf.engine.llm_engine import LLMEngine  # noqa: E402
from sharpinf.llm import LLM  # noqa: E402
from sharpinf.model.synth import synthetic_model  # noqa: E402
from sharpinf.params import SamplingParams  # noqa: E402
from sharpinf.serve.loopback import LoopbackServer  # noqa: E402

NAME = "tiny"
CONFIG = dict(num_blocks=96, max_num_seqs=16, max_num_batched_tokens=128, enable_prefix_caching=True)


def _model():
    return synthetic_model("llama", "Q8_0", n_embd=128)


class Server(LoopbackServer):
    def __init__(self):
        super().__init__(lambda: LLMEngine(_model(), backend="emu", **CONFIG), NAME, ready_timeout=120)


@pytest.fixture(scope="module")
def server():
    with Server() as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def offline():
    return LLM(_model(), backend="emu", **CONFIG)


def _greedy(offline, prompt, max_tokens, **kw):
    return offline.generate([prompt], SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw))[0]


PROMPTS = ["The quick brown fox", "Once upon a time", "1 2 3 4", "hello world, said the"]


# -- answers equal offline generation --------------------------------------------------------------
@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_completion_equals_offline_generation(client, offline, prompt):
    want = _greedy(offline, prompt, 12)
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=12, temperature=0)
    assert r.choices[0].text == want.text
    assert r.choices[0].finish_reason == {"context": "length"}.get(want.finish_reason, want.finish_reason)
    assert r.usage.prompt_tokens == len(want.prompt_ids) and r.usage.completion_tokens == len(want.token_ids)
    chunks = list(client.completions.create(model=NAME, prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want.text
    assert chunks[-1].usage.completion_tokens == len(want.token_ids)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] is not None


def test_n_choices_equal_offline_choices_whole_and_streamed(client, offline):
    """n = 4: the prompt computed once, four choices seeded apart, equal to offline generation's."""
    want = offline.generate([PROMPTS[1]], SamplingParams(max_tokens=8, temperature=1.0, seed=7, n=4))[0].choices
    r = client.completions.create(model=NAME, prompt=PROMPTS[1], max_tokens=8, temperature=1.0, seed=7, n=4)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == [w.text for w in want] and len({w.text for w in want}) > 1
    assert r.usage.completion_tokens == sum(len(w.token_ids) for w in want)
    chunks = list(client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                                 temperature=1.0, seed=3, n=3, stream=True,
                                                 stream_options={"include_usage": True}))
    whole = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                           temperature=1.0, seed=3, n=3)
    for c in whole.choices:
        mine = [ch.choices[0] for ch in chunks if ch.choices and ch.choices[0].index == c.index]
        assert "".join(m.delta.content or "" for m in mine) == c.message.content
        assert mine[0].delta.role == "assistant" and mine[-1].finish_reason == c.finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_token_id_prompt_equals_text_prompt(client, offline):
    ids = offline.tokenizer.encode(PROMPTS[2])
    a = client.completions.create(model=NAME, prompt=ids, max_tokens=8, temperature=0)
    b = client.completions.create(model=NAME, prompt=PROMPTS[2], max_tokens=8, temperature=0)
    assert a.choices[0].text == b.choices[0].text == _greedy(offline, ids, 8).text


def test_chat_equals_offline_chat(client, offline):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    want = _greedy(offline, msgs, 10)
    r = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=10, temperature=0)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want.text
    stream = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=10, temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text


def test_async_client_streams_concurrent_chats_equal_to_offline(server, offline):
    """openai.AsyncOpenAI (what async apps and agent frameworks use): concurrent streamed chats,
    each its own offline answer."""
    convs = [[{"role": "user", "content": f"Name a colour, {n}."}] for n in ("one", "two", "three")]
    want = [_greedy(offline, m, 8).text for m in convs]

    async def main():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)

        async def one(msgs):
            stream = await client.chat.completions.create(model=NAME, messages=msgs, max_tokens=8, temperature=0,
                                                          stream=True)
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        try:
            return await asyncio.gather(*(one(m) for m in convs))
        finally:
            await client.close()

    assert asyncio.run(main()) == want


def test_best_of_equal_to_n_is_n_choices(client):
    kw = dict(model=NAME, prompt=PROMPTS[2], max_tokens=4, temperature=1.0, seed=5, n=2)
    assert ([c.text for c in client.completions.create(**kw, best_of=2).choices]
            == [c.text for c in client.completions.create(**kw).choices])


def test_seeded_sampling_is_reproducible(client):
    kw = dict(model=NAME, prompt=PROMPTS[1], max_tokens=10, temperature=1.0, top_p=0.9, seed=7)
    assert client.completions.create(**kw).choices[0].text == client.completions.create(**kw).choices[0].text


def test_stop_strings(client, offline):
    free = _greedy(offline, PROMPTS[0], 16).text
    assert len(free) > 4
    stop = free[2:4]
    r = client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=16, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == free[: free.index(stop)]


def test_logprobs(client):
    r = client.completions.create(model=NAME, prompt=PROMPTS[3], max_tokens=5, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    for tok, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) <= 3 and chosen <= 0
        assert math.isclose(chosen, max(top.values()), abs_tol=1e-9)  # greedy: the chosen is the most likely
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-9
    c = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                       temperature=0, logprobs=True, top_logprobs=2)
    content = c.choices[0].logprobs.content
    assert len(content) == c.usage.completion_tokens and all(len(e.top_logprobs) == 2 for e in content)


def test_reasoning_format_auto_splits_the_thinking_off_only_when_asked(client, offline):
    """"reasoning_format": "auto" (llama.cpp server's field) puts a reasoning model's thinking in
    reasoning_content; the default keeps the text as generated in content; a stream cannot ask."""
    from sharpinf.serve.reasoning import split_reasoning

    msgs = [{"role": "user", "content": "Name a colour."}]
    want = _greedy(offline, msgs, 10).text
    r = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=10, temperature=0,
                                       extra_body={"reasoning_format": "auto"})
    assert (getattr(r.choices[0].message, "reasoning_content", None), r.choices[0].message.content) == \
        split_reasoning(want)
    for body, stream in (({"reasoning_format": "auto"}, True), ({"reasoning_format": "deepseek-ish"}, False)):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=NAME, messages=msgs, max_tokens=4, stream=stream, extra_body=body)
        assert e.value.body["param"] == "reasoning_format"
    harmony = ("<|channel|>analysis<|message|>The user wants a colour.<|end|><|start|>assistant<|channel|>final"
               "<|message|>Blue.")
    assert split_reasoning(harmony) == ("The user wants a colour.", "Blue.")
    assert split_reasoning("<think>\nA colour.\n</think>\n\nBlue.") == ("A colour.", "Blue.")
    assert split_reasoning("Blue.") == (None, "Blue.")
    call = "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|call|>"
    assert split_reasoning("<|channel|>analysis<|message|>Look it up.<|end|>" + call) == ("Look it up.", call)


# -- errors in OpenAI's shape -------------------------------------------------------------------------
@pytest.mark.parametrize("kw,param", [(dict(temperature=-1), "temperature"), (dict(max_tokens=0), "max_tokens"),
                                      (dict(n=0), "n"), (dict(n=17), "n"), (dict(extra_body={"top_p": "high"}), "top_p"),
                                      (dict(logprobs=50), "logprobs"), (dict(extra_body={"top_k": -2}), "top_k"),
                                      (dict(extra_body={"min_p": 2}), "min_p")])
def test_bad_parameters_are_400(client, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=NAME, prompt="hi", **{"max_tokens": 4, **kw})
    err = e.value.body
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["param"] == param


def test_a_chat_sampling_error_names_the_field_the_client_sent(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=0)
    assert e.value.body["param"] == "max_completion_tokens"


def test_sampling_errors_carry_their_field():
    from sharpinf.errors import RequestError

    for kw, field in ((dict(top_p=0), "top_p"), (dict(stop_token_ids=[1, -1]), "stop_token_ids"), (dict(stop=[""]), "stop"),
                      (dict(seed=-1), "seed"), (dict(ignore_eos="no"), "ignore_eos")):
        with pytest.raises(RequestError) as e:
            SamplingParams(**kw)
        assert e.value.param == field, kw


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-5", prompt="hi", max_tokens=4)
    assert e.value.body["code"] == "model_not_found"


def test_a_request_that_can_never_fit_is_400_with_the_reason(client, server):
    n_ctx = server.loop.engine.max_model_len
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=NAME, prompt=[5] * 20, max_tokens=n_ctx)
    assert "context length" in e.value.body["message"] or "KV blocks" in e.value.body["message"]


def test_malformed_bodies(server):
    r = httpx.post(server.url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": NAME, "messages": "hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = httpx.get(server.url + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()


# -- disconnects, tokenizer, models, metrics ----------------------------------------------------------
def _generated(server) -> int:
    return server.loop.query(lambda e: e.metrics.generated_tokens)


def test_a_client_that_disconnects_aborts_its_request(server):
    """Each request asks for 400 tokens; gone after the first, it must stop within a few steps."""
    before = _generated(server)
    with httpx.Client(timeout=60) as h:
        with h.stream("POST", server.url + "/v1/completions",
                      json={"model": NAME, "prompt": "count", "max_tokens": 400, "temperature": 0, "ignore_eos": True,
                            "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    break  # one token came: leave
    assert server.idle(), "the aborted request still holds the engine"
    with httpx.Client(timeout=60) as h:  # a non-streaming request whose client times out
        with pytest.raises(httpx.ReadTimeout):
            h.post(server.url + "/v1/completions", timeout=0.5,
                   json={"model": NAME, "prompt": "count", "max_tokens": 400, "temperature": 0, "ignore_eos": True})
    assert server.idle(), "the abandoned request still holds the engine"
    assert _generated(server) - before < 2 * 100, "the requests ran on after their clients left"


def test_tokenize_detokenize_models(server, offline):
    r = httpx.post(server.url + "/tokenize", json={"model": NAME, "prompt": "hello world"}).json()
    assert r["tokens"] == offline.tokenizer.encode("hello world") and r["count"] == len(r["tokens"])
    assert httpx.post(server.url + "/detokenize", json={"tokens": r["tokens"]}).json()["prompt"] == "hello world"
    assert httpx.post(server.url + "/detokenize", json={"tokens": [-1]}).status_code == 400
    models = httpx.get(server.url + "/v1/models").json()
    assert models["data"][0]["id"] == NAME and models["data"][0]["max_model_len"] > 0


def test_metrics_parse(client, server):
    client.completions.create(model=NAME, prompt="hi", max_tokens=3, temperature=0)
    text = httpx.get(server.url + "/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("sharpinf_requests", "sharpinf_time_to_first_token_seconds", "sharpinf_inter_token_latency_seconds",
                 "sharpinf_running_sequences", "sharpinf_waiting_sequences", "sharpinf_kv_cache_usage_ratio",
                 "sharpinf_preemptions", "sharpinf_prefix_cache_hit_rate", "sharpinf_generation_tokens",
                 "sharpinf_prompt_tokens", "sharpinf_tokens_computed", "sharpinf_throughput_tokens_per_second"):
        assert name in fams, name
    computed = next(s.value for s in fams["sharpinf_tokens_computed"].samples if s.name == "sharpinf_tokens_computed_total")
    assert computed >= 1  # the prompt and fed tokens of the request above
    ok = [s.value for s in fams["sharpinf_requests"].samples if s.name == "sharpinf_requests_total"
          and s.labels.get("outcome") == "ok"]
    assert ok and ok[0] >= 1
    assert any(s.value >= 1 for s in fams["sharpinf_time_to_first_token_seconds"].samples
               if s.name.endswith("_count"))


def test_health_is_503_while_loading():
    from sharpinf.serve.app import create_app
    from sharpinf.serve.engine_loop import EngineLoop
    from fastapi.testclient import TestClient

    gate = threading.Event()
    loop = EngineLoop(lambda: gate.wait(30) and None)  # never ready while the gate is shut
    loop.start()
    try:
        c = TestClient(create_app(loop, NAME))
        assert c.get("/health").status_code == 503
        r = c.post("/v1/completions", json={"model": NAME, "prompt": "hi"})
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
    finally:
        gate.set()
        loop.stop()


# -- a bounded load test ------------------------------------------------------------------------------
def test_load_with_malformed_requests_and_disconnects(server, offline):
    """240 requests at concurrency 16: ~5% malformed (each a 4xx), ~5% disconnecting mid-stream;
    every good answer equals offline greedy generation, no 5xx, every block free at the end."""
    rng = random.Random(0)
    words = "the a of to in and is it that on was he for with as his they at be this from".split()
    jobs = []
    for i in range(240):
        kind = rng.choices(["good", "bad", "gone"], [0.9, 0.05, 0.05])[0]
        prompt = " ".join(rng.choice(words) for _ in range(rng.randint(1, 12)))
        jobs.append((kind, prompt, rng.randint(1, 10), rng.random() < 0.5))
    good = [(p, n) for k, p, n, _ in jobs if k == "good"]
    want = {(p, n): out.text for (p, n), out in zip(good, offline.generate(
        [p for p, _ in good], [SamplingParams(max_tokens=n, temperature=0.0) for _, n in good]))}
    bad_bodies = [b"{", json.dumps({"model": NAME, "prompt": "x", "max_tokens": -3}).encode(),
                  json.dumps({"model": NAME, "prompt": "x", "temperature": "hot"}).encode(),
                  json.dumps({"model": NAME}).encode()]
    results = []

    async def one(h: httpx.AsyncClient, job, sem):
        kind, prompt, n, stream = job
        async with sem:
            if kind == "bad":
                r = await h.post("/v1/completions", content=rng.choice(bad_bodies),
                                 headers={"content-type": "application/json"})
                results.append((job, r.status_code, None))
                return
            body = {"model": NAME, "prompt": prompt, "max_tokens": n if kind == "good" else 300, "temperature": 0,
                    "stream": stream or kind == "gone", "ignore_eos": kind == "gone"}
            if not body["stream"]:
                r = await h.post("/v1/completions", json=body)
                results.append((job, r.status_code, r.json()["choices"][0]["text"] if r.status_code == 200 else None))
                return
            text, status = [], None
            async with h.stream("POST", "/v1/completions", json=body) as r:
                status = r.status_code
                async for line in r.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    text.append(json.loads(line[6:])["choices"][0]["text"])
                    if kind == "gone":
                        break  # leave mid-stream
            results.append((job, status, "".join(text)))

    async def main():
        sem = asyncio.Semaphore(16)
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as h:
            await asyncio.gather(*(one(h, j, sem) for j in jobs))

    before = _generated(server)
    asyncio.run(main())
    assert len(results) == len(jobs)
    assert not [r for r in results if r[1] >= 500], "no 5xx"
    for (kind, prompt, n, _), status, text in results:
        if kind == "bad":
            assert 400 <= status < 500
        elif kind == "good":
            assert status == 200 and text == want[(prompt, n)], (prompt, n)
    assert server.idle(), "every request ended and every KV block is free"
    gone = sum(k == "gone" for k, *_ in jobs)
    assert _generated(server) - before < sum(n for _, n in good) + 60 * gone, "disconnected requests ran on (300 tokens each)"


# -- units under the server ---------------------------------------------------------------------------
def test_token_logprobs_are_the_model_distribution():
    import numpy as np

    from sharpinf.engine.logprobs import TokenLogprobs

    x = np.array([1.0, 3.0, 3.0, -2.0, 0.5], np.float32)
    lp = TokenLogprobs.of(x, 4, 3)
    ref = x.astype(np.float64) - np.log(np.exp(x.astype(np.float64)).sum())
    assert math.isclose(lp.logprob, ref[4], rel_tol=1e-12)
    assert [i for i, _ in lp.top] == [1, 2, 0]  # most likely first, ties by the lowest id
    assert all(math.isclose(v, ref[i], rel_tol=1e-12) for i, v in lp.top)
    assert TokenLogprobs.of(x, 0, 0).top == []


@pytest.mark.parametrize("bad", [-1, 21, 2.5, "3", True])
def test_sampling_logprobs_is_validated(bad):
    from sharpinf.errors import RequestError

    with pytest.raises(RequestError, match="logprobs"):
        SamplingParams(logprobs=bad)


def test_protocol_maps_openai_fields():
    from sharpinf.serve import protocol as P

    c = P.parse({"prompt": ["hi"], "max_tokens": 5, "temperature": 0, "stop": "x", "top_k": -1, "logprobs": 2}, chat=False)
    assert c.prompt == "hi" and c.params.max_tokens == 5 and c.params.stop == ("x",) and c.params.top_k == 0
    assert c.logprobs == 2 and c.params.logprobs == 2 and not c.stream
    d = P.parse({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                 "max_completion_tokens": 7, "stream": True, "stream_options": {"include_usage": True}}, chat=True)
    assert d.prompt == [{"role": "user", "content": "ab"}] and d.params.max_tokens == 7 and d.include_usage
    assert d.params.temperature == 1.0 and d.logprobs is None  # OpenAI's defaults
    for body, chat in (({"prompt": ["a", "b"]}, False), ({"prompt": []}, False), ({"messages": []}, True),
                       ({"prompt": "a", "stream": "yes"}, False), ({"messages": [{"role": "user"}], "top_logprobs": 2}, True)):
        with pytest.raises(P.ApiError) as e:
            P.parse(body, chat)
        assert e.value.status == 400 and e.value.body()["error"]["message"]


# -- what a hostile review found ------------------------------------------------------------------------
def test_a_short_request_joins_a_running_batch(server):
    """Continuous batching over HTTP: a 2-token request sent while a 300-token one decodes finishes
    first (handlers never wait for the engine to run dry)."""
    done = []

    def long():
        httpx.post(server.url + "/v1/completions", timeout=120,
                   json={"model": NAME, "prompt": "x", "max_tokens": 300, "temperature": 0, "ignore_eos": True})
        done.append("long")

    th = threading.Thread(target=long)
    th.start()
    deadline = time.time() + 30
    while server.loop.query(lambda e: e.has_unfinished()) is False and time.time() < deadline:
        time.sleep(0.01)
    r = httpx.post(server.url + "/v1/completions", timeout=120,
                   json={"model": NAME, "prompt": "y", "max_tokens": 2, "temperature": 0, "ignore_eos": True})
    done.append("short")
    th.join()
    assert r.status_code == 200 and done == ["short", "long"]


def test_streamed_text_equals_the_whole_answer_with_stop_strings(client, offline):
    """Streams give only final text: what may still become a stop string, or an incomplete UTF-8
    character, is held back until it is decided."""
    free = _greedy(offline, PROMPTS[1], 24).text
    stops = [free[i:i + 3] for i in range(1, len(free) - 3, 4)] + [free[5:7] + "\u00e9\u00e9", "zz"]
    for seed, stop in enumerate(stops):
        kw = dict(model=NAME, prompt=PROMPTS[1], max_tokens=24, temperature=0.9, seed=seed, stop=[stop])
        whole = client.completions.create(**kw).choices[0].text
        streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices)
        assert streamed == whole, (stop, whole, streamed)


def test_stable_text_holds_back_stop_prefixes_and_partial_characters():
    from sharpinf.textgen import StopChecker

    class Tok:  # one byte per token
        eot_ids = ()

        def token_bytes(self, t):
            return bytes([t])

    sc = StopChecker(SamplingParams(max_tokens=50, stop=["cab"]), Tok(), context_left=100)
    shown = []
    for b in b"xyca" + "\u00e9".encode() + b"cab":
        sc.add(b)
        shown.append(sc.text[: sc.stable_len()])
    assert shown[:5] == ["x", "xy", "xy", "xy", "xy"]  # "c", "ca" may start "cab"; then half of é is pending
    assert shown[5] == "xyca\u00e9"  # é complete: "ca" can no longer become "cab"
    assert sc.finish_reason == "stop" and sc.text == "xyca\u00e9" and shown[-1] == sc.text


def test_chat_without_max_tokens_runs_to_the_pool_limit(server):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=120,
                   json={"model": NAME, "messages": [{"role": "user", "content": "go"}], "temperature": 0})
    assert r.status_code == 200, r.text
    limit = server.loop.query(lambda e: e.token_limit())
    u = r.json()["usage"]
    assert u["prompt_tokens"] + u["completion_tokens"] <= limit


@pytest.mark.parametrize("body,param", [
    (b'{"model": "tiny", "prompt": "\\ud800 hi"}', "prompt"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "\\udfff"}]}', "messages"),
    (b"[" * 100000, None),
    (b'{"model": 5, "prompt": "hi"}', "model"),
    (b'{"model": "tiny", "prompt": "hi", "echo": true}', "echo"),
    (b'{"model": "tiny", "prompt": "hi", "best_of": 3, "n": 2}', "best_of"),  # only best_of == n: nothing to rank
    (b'{"model": "tiny", "prompt": "hi", "presence_penalty": 2.5}', "presence_penalty"),
    (b'{"model": "tiny", "prompt": "hi", "stream": true, "stream_options": {"include_usage": "false"}}', "include_usage"),
    (b'{"model": "tiny", "prompt": "hi", "stop": ' + json.dumps(["s%d" % i for i in range(40)]).encode() + b"}", "stop"),
])
def test_hostile_bodies_are_4xx(server, body, param):
    path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
    r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if param:
        assert err["param"] == param


def test_a_chat_template_that_refuses_is_400(server):
    """The template's raise_exception (roles must alternate, ...) and its absence are the client's 400s."""
    import sharpinf.serve.app  # noqa: F401

    from sharpinf.model.chat import ChatTemplateError

    def refuse(*_a, **_k):
        raise ChatTemplateError("roles must alternate user/assistant")

    tok = server.loop.engine.tokenizer
    orig = tok.apply_chat
    tok.apply_chat = refuse
    try:
        r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                       json={"model": NAME, "messages": [{"role": "user", "content": "a"}]})
        t = httpx.post(server.url + "/tokenize", timeout=60,
                       json={"model": NAME, "messages": [{"role": "user", "content": "a"}]})
    finally:
        tok.apply_chat = orig
    assert r.status_code == t.status_code == 400 and "alternate" in r.json()["error"]["message"]


def test_negative_seeds_are_accepted(client):
    kw = dict(model=NAME, prompt="hi", max_tokens=4, temperature=1.0, seed=-5)
    assert client.completions.create(**kw).choices[0].text == client.completions.create(**kw).choices[0].text


# -- what a vLLM user expects beyond the basics -------------------------------------------------------
def test_retrieve_a_model(client):
    listed = client.models.list().data[0]
    assert client.models.retrieve(NAME) == listed
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-5")
    assert e.value.body["code"] == "model_not_found" and e.value.body["type"] == "invalid_request_error"


def test_cors_preflight_and_responses_allow_any_origin_by_default(server):
    origin = "http://page.example"
    pre = httpx.options(server.url + "/v1/chat/completions", headers={
        "origin": origin, "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] in ("*", origin)
    assert "POST" in pre.headers["access-control-allow-methods"]
    r = httpx.get(server.url + "/v1/models", headers={"origin": origin})
    assert r.headers["access-control-allow-origin"] == "*"
    assert "x-request-id" in r.headers["access-control-expose-headers"]  # a page may read it


def _not_ready_app(name=NAME, **kw):
    """An app whose engine never loads: enough for what needs no model (CORS, the model card)."""
    from fastapi.testclient import TestClient

    from sharpinf.serve.app import create_app
    from sharpinf.serve.engine_loop import EngineLoop

    gate = threading.Event()
    loop = EngineLoop(lambda: gate.wait(30) and None)
    loop.start()
    return TestClient(create_app(loop, name, **kw)), lambda: (gate.set(), loop.stop())


def test_allowed_origins_and_a_model_name_with_a_slash():
    c, stop = _not_ready_app("org/tiny", allowed_origins=["https://app.example"])
    try:
        ask = {"access-control-request-method": "POST"}
        assert c.options("/v1/completions", headers={"origin": "https://app.example", **ask}).status_code == 200
        assert c.options("/v1/completions", headers={"origin": "https://evil.example", **ask}).status_code == 400
        assert "access-control-allow-origin" not in c.get("/health", headers={"origin": "https://evil.example"}).headers
        assert c.get("/v1/models/org/tiny").json()["id"] == "org/tiny"
        assert c.get("/v1/models/org/other").status_code == 404
    finally:
        stop()


def test_created_is_one_timestamp_per_request(client, monkeypatch):
    """Even when the clock moves between chunks (here: 1000 s at each reading)."""
    real, reads = time.time, [0]

    def jumpy():
        reads[0] += 1
        return real() + 1000 * reads[0]

    monkeypatch.setattr(time, "time", jumpy)
    chunks = list(client.completions.create(model=NAME, prompt="count", max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    monkeypatch.undo()
    assert len(chunks) >= 3 and len({c.created for c in chunks}) == 1


def test_stream_text_offsets_equal_the_whole_answers_from_a_partial_first_byte(client):
    """The greedy answer to this prompt starts with a lone UTF-8 lead byte: no character yet."""
    kw = dict(model=NAME, prompt="hello world, said the", max_tokens=6, temperature=0, logprobs=1)
    whole = client.completions.create(**kw).choices[0].logprobs
    assert whole.tokens[0].startswith("bytes:\\x") and int(whole.tokens[0][8:], 16) >= 0xC0, whole.tokens
    streamed = [o for c in client.completions.create(stream=True, **kw) if c.choices and c.choices[0].logprobs
                for o in c.choices[0].logprobs.text_offset]
    assert streamed == whole.text_offset
    assert whole.text_offset[:2] == [0, 0]  # the second byte is where the first (incomplete) character is
    assert whole.text_offset == sorted(whole.text_offset)


def test_system_fingerprint_is_one_per_server(client):
    a = client.completions.create(model=NAME, prompt="hi", max_tokens=2, temperature=0)
    b = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    chunks = list(client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                                 stream=True, stream_options={"include_usage": True}))
    prints = {a.system_fingerprint, b.system_fingerprint} | {c.system_fingerprint for c in chunks}
    assert len(prints) == 1 and prints.pop().startswith("fp_")


def test_x_request_id_is_echoed_and_names_the_response(client, server):
    raw = client.completions.with_raw_response.create(model=NAME, prompt="hi", max_tokens=2,
                                                      extra_headers={"x-request-id": "trace-42"})
    assert raw.headers["x-request-id"] == "trace-42" and raw.parse().id == "cmpl-trace-42"
    body = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers={"x-request-id": "s-1"}) as r:
        first = next(line for line in r.iter_lines() if line.startswith("data: {"))
        assert r.headers["x-request-id"] == "s-1" and json.loads(first[6:])["id"] == "chatcmpl-s-1"
    r = httpx.post(server.url + "/v1/completions", json={"model": NAME, "prompt": "hi", "max_tokens": 2})
    assert r.json()["id"] == "cmpl-" + r.headers["x-request-id"]  # none given: a fresh one, in both
    odd = "not a plain token!"
    r = httpx.post(server.url + "/v1/completions", json={"model": NAME, "prompt": "hi", "max_tokens": 2},
                   headers={"x-request-id": odd})
    assert r.headers["x-request-id"] == odd and odd not in r.json()["id"]  # echoed, not used as the id
    assert httpx.get(server.url + "/nothing", headers={"x-request-id": "e-1"}).headers["x-request-id"] == "e-1"


@pytest.mark.parametrize("key", ["preemptions", "tokens_computed"])
def test_engine_totals_are_counters_of_the_engines_deltas(key):
    from sharpinf.serve.metrics import ServerMetrics

    state = {key: 0}
    m = ServerMetrics(lambda: state)

    def scraped():
        fam = {f.name: f for f in text_string_to_metric_families(m.exposition().decode())}[f"sharpinf_{key}"]
        assert fam.type == "counter"
        return next(s.value for s in fam.samples if s.name == f"sharpinf_{key}_total")

    assert scraped() == 0
    state[key] = 3
    assert scraped() == 3 and scraped() == 3  # a scrape adds only what grew since the last
    state[key] = 5
    assert scraped() == 5


def test_serve_help_states_the_cors_default():
    from typer.testing import CliRunner

    from sharpinf.cli import app

    res = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "--allowed-origins" in res.output and "any origin, as vLLM allows" in " ".join(res.output.split())
    res = CliRunner().invoke(app, ["serve", "tiny", "--allowed-origins", " , "])
    assert res.exit_code != 0 and "at least one origin" in str(res.exception)  # before any model loads
