"""gpt-oss (llama.cpp's openai-moe graph) in the loader and the NumPy reference: every tensor and key read,
the reference equal to llama.cpp's (tests/test_llamacpp_agreement.py's gpt-oss-f32 fixture) -- and each of
the arch's parts shown to matter: without the sinks, the clamp, or any of the biases the same file's
log-probabilities leave llama.cpp's bound (the negative controls of that fixture)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import sharpinf.ops.basic as basic
from oracles.reference import Reference
from oracles.tolerances import LLAMACPP_LOGPROB
from sharpinf.errors import ModelError
from sharpinf.model.loader import inspect_model, load_model
from sharpinf.model.synth import synthetic_model

FIXTURE = json.loads((Path(__file__).parent / "data" / "llamacpp_agreement.json").read_text())["models"]["gpt-oss-f32"]


@pytest.fixture(scope="module")
def oss():
    kw = dict(FIXTURE["synth"])
    return load_model(synthetic_model(kw.pop("arch"), kw.pop("qtype"), **kw))


def _worst(ref: Reference) -> float:
    """The largest |log-prob - llama.cpp's| over the fixture's scored rows (inf where an argmax differs)."""
    worst = 0.0
    for chunk in FIXTURE["chunks"]:
        x = ref.logits(chunk["tokens"]).astype(np.float64)[chunk["first_scored"]:]
        lp = x - x.max(-1, keepdims=True)
        lp -= np.log(np.exp(lp).sum(-1, keepdims=True))
        for r, top in enumerate(chunk["top"]):
            ids = [i for i, _ in top]
            if int(np.argmax(lp[r])) != ids[0]:
                return float("inf")
            worst = max(worst, float(np.abs(lp[r][ids] - [v for _, v in top]).max()))
    return worst


def test_every_tensor_and_key_is_read(oss):
    r = inspect_model(oss.path)
    assert r.error is None and r.refused is None
    c = oss.config
    assert (c.has_attn_sinks, c.has_attn_out_bias, c.has_moe_bias, c.moe_gating, c.ffn_act) == (
        True, True, True, "topk_softmax", "swiglu_oai")
    assert c.layer_window == (16, 0) and c.rope_scaling.kind == "yarn" and not c.tied_output
    # the file's post_attention_norm is the FFN's input norm: read under the usual name
    assert "blk.0.ffn_norm.weight" in oss.tensors and "blk.0.post_attention_norm.weight" not in oss.tensors


def test_a_tensor_or_key_it_would_not_apply_is_refused(tmp_path):
    from sharpinf.model.synth import write_synthetic_model

    p = write_synthetic_model(tmp_path / "x.gguf", "gpt-oss", "F32", n_layer=1, expert_qtype="F32",
                              extra_tensors={"blk.0.ffn_norm.weight": np.ones(64, np.float32)})
    with pytest.raises(ModelError, match=r"tensor blk\.0\.ffn_norm\.weight \(not read by sharpinf's gpt-oss graph\)"):
        load_model(p)
    p = write_synthetic_model(tmp_path / "y.gguf", "gpt-oss", "F32", n_layer=1, expert_qtype="F32",
                              **{"gpt-oss.attention.sliding_window": 0})
    with pytest.raises(ModelError, match=r"attention\.sliding_window = 0"):
        load_model(p)


def test_the_reference_equals_llamacpp_and_each_part_matters(oss, monkeypatch):
    assert _worst(Reference(oss)) <= LLAMACPP_LOGPROB
    for part in ("sinks", "wo_b", "router_b", "exps_gate_up_b", "exps_down_b"):
        ref = Reference(oss)
        for L in ref.layers:
            setattr(L, part, None)
        assert _worst(ref) > 10 * LLAMACPP_LOGPROB, f"the reference without {part} still agrees"
    monkeypatch.setattr(basic, "SWIGLU_OAI_LIMIT", float("inf"))  # the SwiGLU unclamped
    assert _worst(Reference(oss)) > 10 * LLAMACPP_LOGPROB


# A chat template in the harmony format gpt-oss's files carry, written here (not the file's own text) with
# the constructs that one leans on: a recursive macro over a JSON schema, namespace() state, a look-ahead
# slice of the messages, strftime_now, tojson, `in` tests on message keys and raise_exception.
HARMONY = """{%- macro ts(spec) -%}
{%- if spec.type == "array" -%}{{ ts(spec["items"]) }}[]
{%- elif spec.type == "object" -%}{ {%- for k, v in spec.properties.items() -%}{{ k }}: {{ ts(v) }}{{ ", " if not loop.last }}{%- endfor -%} }
{%- else -%}{{ spec.type }}{%- endif -%}
{%- endmacro -%}
<|start|>system<|message|>Knowledge cutoff: 2024-06
Current date: {{ strftime_now("%Y-%m-%d") }}
Reasoning: {{ reasoning_effort | default("medium") }}<|end|>
{%- if tools -%}<|start|>developer<|message|>{%- for t in tools -%}type {{ t.function.name }} = (_: {{ ts(t.function.parameters) }}) => any;{%- endfor -%}<|end|>{%- endif -%}
{%- set last = namespace(tool=none) -%}
{%- for m in messages -%}
{%- if m.role == "assistant" -%}
{%- if "<|channel|>" in (m.content or "") -%}{{ raise_exception("put the analysis in thinking, not content") }}{%- endif -%}
{%- set later = namespace(final=false) -%}
{%- for f in messages[loop.index:] -%}{%- if f.role == "assistant" and "tool_calls" not in f -%}{%- set later.final = true -%}{%- endif -%}{%- endfor -%}
{%- if "thinking" in m and not later.final -%}<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>{%- endif -%}
{%- if "tool_calls" in m -%}{%- set last.tool = m.tool_calls[0].function.name -%}<|start|>assistant to=functions.{{ last.tool }}<|channel|>commentary json<|message|>{{ m.tool_calls[0].function.arguments | tojson }}<|call|>
{%- else -%}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>{%- endif -%}
{%- elif m.role == "tool" -%}<|start|>functions.{{ last.tool }} to=assistant<|channel|>commentary<|message|>{{ m.content | tojson }}<|end|>
{%- else -%}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"""


def test_a_harmony_chat_template_renders_in_the_sandbox():
    from datetime import date

    from sharpinf.model.chat import ChatTemplateError
    from sharpinf.model.chat import render_chat

    tools = [{"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "array", "items": {"type": "number"}}}}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "thinking": "Call the tool.", "tool_calls": [
                {"function": {"name": "weather", "arguments": {"city": "Paris", "days": [1]}}}]},
            {"role": "tool", "content": {"temp": 21}},
            {"role": "assistant", "content": "21 degrees."},
            {"role": "user", "content": "Thanks"}]
    out = render_chat(HARMONY, msgs, tools=tools, reasoning_effort="low")
    assert out.startswith(f"<|start|>system<|message|>Knowledge cutoff: 2024-06\nCurrent date: {date.today():%Y-%m-%d}\n"
                          "Reasoning: low<|end|>")
    assert "type weather = (_: {city: string, days: number[]}) => any;" in out
    assert ('<|start|>assistant to=functions.weather<|channel|>commentary json<|message|>{"city": "Paris", "days": [1]}'
            '<|call|><|start|>functions.weather to=assistant<|channel|>commentary<|message|>{"temp": 21}<|end|>') in out
    assert "Call the tool." not in out  # a later final answer drops the analysis, as harmony does
    assert out.endswith("<|start|>assistant<|channel|>final<|message|>21 degrees.<|end|>"
                        "<|start|>user<|message|>Thanks<|end|><|start|>assistant")
    with pytest.raises(ChatTemplateError, match="put the analysis in thinking"):
        render_chat(HARMONY, [{"role": "assistant", "content": "<|channel|>final<|message|>x"}])
