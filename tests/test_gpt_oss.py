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
from sharpinf.step.weights import check_kernels_run

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


def test_the_kernels_refuse_it_in_one_line(oss):
    with pytest.raises(ModelError, match=r"the kernels do not run gpt-oss's attention sinks.* MoE yet; "
                                         r"the NumPy reference does \(--backend reference\)"):
        check_kernels_run(load_model(synthetic_model("gpt-oss", "Q8_0")))
    check_kernels_run(load_model(synthetic_model("llama", "MXFP4")))  # its experts' type runs (quants.BASE_ONLY)
