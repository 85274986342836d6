"""Speculative decoding through the interfaces: `LLM(speculative=...)`, `sharpinf generate
--speculative`, and `sharpinf serve --speculative` (the API unchanged for clients: answers equal a
plain engine's, streamed or whole; /metrics adds the spec_decode counters and rates)."""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

openai = pytest.importorskip("openai")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from sharpinf.cli import app  # noqa: E402
from sharpinf.engine.llm_engine import LLMEngine  # noqa: E402
from sharpinf.llm import LLM  # noqa: E402
from sharpinf.model.synth import synthetic_model  # noqa: E402
from sharpinf.params import SamplingParams  # noqa: E402
from sharpinf.serve.loopback import LoopbackServer  # noqa: E402

CONFIG = dict(num_blocks=64, max_num_seqs=8, max_num_batched_tokens=64)
PROMPT = [11, 12, 13, 14, 15] * 4


def _model():
    return synthetic_model("llama", "Q8_0", n_embd=128)


def test_llm_speculative_equals_plain_and_reports_its_metrics():
    params = [SamplingParams(max_tokens=16, ignore_eos=True), SamplingParams(max_tokens=12, temperature=0.8, seed=4,
                                                                             ignore_eos=True)]
    plain = LLM(_model(), backend="emu", **CONFIG).generate([PROMPT, PROMPT[:7]], params)
    llm = LLM(_model(), backend="emu", speculative={"method": "ngram", "num_speculative_tokens": 3}, **CONFIG)
    spec = llm.generate([PROMPT, PROMPT[:7]], params)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    m = llm.engine.engine_metrics()["speculative"]
    assert m["method"] == "ngram" and m["num_speculative_tokens"] == 3 and m["accepted_tokens"] > 0
    assert 0 < m["target_passes_per_token"] < 1 and m["mean_accepted_length"] > 1


def test_generate_cli_flags():
    runner = CliRunner()
    model = str(_model())
    args = ["generate", model, "--backend", "emu", "--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens", "12",
            "--json"]
    plain = json.loads(runner.invoke(app, args).stdout)
    r = runner.invoke(app, args + ["--speculative", "ngram", "--num-speculative-tokens", "3"])
    assert r.exit_code == 0, r.output
    spec = json.loads(r.stdout)
    assert spec["token_ids"] == plain["token_ids"] and spec["speculative"]["num_speculative_tokens"] == 3
    assert "speculative" not in plain
    auto = [a if a != "emu" else "auto" for a in args] + ["--speculative", "ngram"]  # auto never drops speculation
    assert json.loads(runner.invoke(app, auto).stdout)["speculative"]["draft_tokens"] > 0
    r = runner.invoke(app, args[:-1] + ["--speculative", "ngram"])  # the terminal's stream and its summary line
    assert r.exit_code == 0 and "guesses kept" in r.output, r.output
    for bad, says in ([["--speculative", "medusa"], "choose ngram or draft"],
                      [["--num-speculative-tokens", "3"], "needs --speculative"],
                      [["--speculative", "ngram", "--backend", "reference"], "runs in the engine"]):
        r = runner.invoke(app, args + bad)
        assert r.exit_code != 0 and says in r.output + str(r.exception), (bad, r.output)
    assert "--speculative" in runner.invoke(app, ["serve", "--help"]).output


def test_server_answers_equal_a_plain_engine_and_metrics_count_the_guesses():
    offline = LLM(_model(), backend="emu", **CONFIG)
    want = offline.generate([PROMPT], SamplingParams(max_tokens=14, ignore_eos=True))[0]
    make = lambda: LLMEngine(_model(), backend="emu", speculative="ngram", **CONFIG)  # noqa: E731
    with LoopbackServer(make, "tiny", ready_timeout=120) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
        body = dict(model="tiny", prompt=PROMPT, max_tokens=14, temperature=0, extra_body={"ignore_eos": True})
        whole = client.completions.create(**body)
        streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **body))
        assert whole.choices[0].text == want.text == streamed
        fams = {f.name: f for f in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)}

    def value(name, suffix=""):
        return next(s.value for s in fams[name].samples if s.name == name + suffix)

    assert value("sharpinf_spec_decode_accepted_tokens", "_total") > 0
    assert value("sharpinf_spec_decode_draft_tokens", "_total") >= value("sharpinf_spec_decode_accepted_tokens", "_total")
    assert 0 < value("sharpinf_spec_decode_target_passes_per_token") < 1
    assert 0 < value("sharpinf_spec_decode_acceptance_rate") <= 1
