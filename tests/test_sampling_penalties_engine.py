"""presence/frequency penalties and logit_bias through the engine: the stream is the reference's
(oracles/generation.py samples with sample_reference over the request's generated ids), and a
preempted request rebuilds its device counts so its stream does not change."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sharpinf.errors import RequestError
from sharpinf.llm import LLM
from sharpinf.model.loader import load_model
from sharpinf.model.synth import synthetic_model
from sharpinf.model.tokenizer import Tokenizer
from oracles.generation import generate_reference
from oracles.reference import Reference
from sharpinf.params import SamplingParams

PROMPT = [5, 6, 7, 8, 9]
PENALTIES = [dict(presence_penalty=2.0, frequency_penalty=1.5),  # greedy: counts alone steer it
             dict(temperature=1.0, seed=3, frequency_penalty=2.0, logit_bias={11: 5.0, 12: -100}),
             dict(temperature=0.8, seed=4, top_k=30, presence_penalty=-1.0, repetition_penalty=1.2),
             dict(temperature=3.0, seed=6, presence_penalty=2.0, frequency_penalty=2.0),  # flat: every count counts
             dict(presence_penalty=-2.0, frequency_penalty=-2.0),  # negative: each generated id pulls harder
             dict(temperature=1.0, seed=5, frequency_penalty=1.0, logit_bias={11: 100})]  # 100 - 20 still wins


@pytest.fixture(scope="module")
def model():
    return load_model(synthetic_model("llama", "F32"))


def _params(**kw) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 20, "ignore_eos": True, **kw})


def test_penalties_match_the_reference(model):
    params = [_params(**p) for p in PENALTIES]
    llm = LLM(model, backend="emu", kernels="simple", kv_dtype="fp32", num_blocks=16)
    got = [o.token_ids for o in llm.generate([PROMPT] * len(params), params)]
    ref, tok = Reference(model), Tokenizer.from_gguf_metadata(model.metadata)
    assert got == [generate_reference(ref, tok, PROMPT, p).token_ids for p in params]
    assert 12 not in got[1] and got[5] == [11] * 20
    # negative control: the same requests without penalties and bias give other streams
    plain = [_params(**{k: v for k, v in p.items() if k in ("temperature", "seed", "top_k")}) for p in PENALTIES]
    assert all(a != b for a, b in zip(got, (o.token_ids for o in llm.generate([PROMPT] * len(plain), plain))))
    # the device counts of a finished request's slot are exactly its generated ids' (prompt ids not counted)
    one = LLM(model, backend="emu", kernels="simple", kv_dtype="fp32", num_blocks=16)
    out = one.generate([PROMPT], [_params(**PENALTIES[3])])[0].token_ids
    V = model.config.n_vocab
    counts = one.engine.backend.download(one.engine.fp.slots.counts)[0].view(np.uint16)[:V]
    assert counts.tolist() == np.bincount(out, minlength=V).tolist() and len(set(out)) < len(out)
    fp = one.engine.fp  # per slot: u16 counts (2 bytes an id), the bias row, the history bits; all counted
    assert fp.slots.counts.nbytes == fp.capacity.rows * ((V + 1) // 2) * 4
    assert fp.workspace_bytes() >= fp.ws.nbytes + fp.slots.counts.nbytes + fp.slots.bias.nbytes + fp.slots.seen_bits.nbytes
    with pytest.raises(RequestError, match="logit_bias names token id"):
        llm.engine.add_request(PROMPT, _params(logit_bias={model.config.n_vocab: 1.0}))


def test_preempted_requests_keep_their_counts(model, monkeypatch):
    """A tight pool preempts; each request recomputes with a fresh slot whose counts the host
    rebuilds from its generated ids (count_n), some through the step-less history flush (more ids
    than a step's buffer holds): the streams equal a roomy pool's."""
    from sharpinf.step.slots import SlotState

    flushes, flush = [0], SlotState.flush_history

    def counted(self, *a):
        flushes[0] += 1
        return flush(self, *a)

    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 200, int(rng.integers(4, 12))).tolist() for _ in range(10)]
    params = [_params(max_tokens=14, frequency_penalty=2.0, presence_penalty=0.5,
                      temperature=float(i % 2), seed=i) for i in range(10)]
    roomy = LLM(model, backend="emu", kernels="simple", kv_dtype="fp32", num_blocks=128, block_size=4)
    want = [o.token_ids for o in roomy.generate(prompts, params)]
    monkeypatch.setattr(SlotState, "flush_history", counted)
    tight = LLM(model, backend="emu", kernels="simple", kv_dtype="fp32", num_blocks=12, block_size=4, max_num_seqs=4,
                max_num_batched_tokens=8)
    got = [o.token_ids for o in tight.generate(prompts, params)]
    assert tight.metrics()["preemptions"] > 0 and flushes[0] > 0
    assert got == want


def test_structured_output_matches_the_reference(model):
    """The engine's masked draws are the reference's (sample_reference with the matcher's mask),
    token for token, and the grammar decides: without it the streams differ."""
    pytest.importorskip("llguidance")
    from sharpinf.params import StructuredOutput

    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}, "s": {"type": "string", "maxLength": 5}},
              "required": ["n", "s"], "additionalProperties": False}
    specs = [StructuredOutput.json_schema(schema), StructuredOutput("regex", "(ab|cd)+ [0-9]{3}")]
    params = [_params(max_tokens=60, ignore_eos=False, temperature=1.0, seed=s, structured=sp, frequency_penalty=0.5)
              for sp in specs for s in (1, 2)]
    llm = LLM(model, backend="emu", kernels="simple", kv_dtype="fp32", num_blocks=16)
    got = llm.generate([PROMPT] * len(params), params)
    ref, tok = Reference(model), Tokenizer.from_gguf_metadata(model.metadata)
    want = [generate_reference(ref, tok, PROMPT, p) for p in params]
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert [g.finish_reason for g in got] == [w.finish_reason for w in want]
    for g in got[:2]:  # the JSON documents end by themselves; "(ab|cd)+" may run to max_tokens
        assert g.finish_reason == "stop" and set(json.loads(g.text)) == {"n", "s"}
    plain = llm.generate([PROMPT] * len(params), [_params(max_tokens=60, temperature=1.0, seed=p.seed) for p in params])
    assert all(a.token_ids != b.token_ids for a, b in zip(got, plain))


def test_cli_generate_structured_on_emu_and_reference(tmp_path):
    """`sharpinf generate --json-schema FILE --presence-penalty`: the same valid JSON on both backends."""
    pytest.importorskip("llguidance")
    from typer.testing import CliRunner

    import sharpinf.cli.text_cmds  # noqa: F401  (registers `generate`)
    from sharpinf.cli import app

    schema = {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"enum": ["x", "y"]}},
              "required": ["a", "b"], "additionalProperties": False}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    path = str(synthetic_model("llama", "F32"))
    outs = []
    for be in ("emu", "reference"):
        res = CliRunner().invoke(app, ["generate", path, "--prompt", "a pet", "--backend", be, "--temperature", "1",
                                       "--seed", "3", "--max-tokens", "40", "--presence-penalty", "1",
                                       "--json-schema", str(tmp_path / "s.json"), "--json"])
        assert res.exit_code == 0, res.output
        outs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    assert outs[0] == outs[1] and outs[0]["finish_reason"] == "stop"
    assert set(json.loads(outs[0]["text"])) == {"a", "b"}
