"""The op-by-op trace (oracles/trace.py): with a bug planted in one kernel it names that op, layer
and kernel; with a division by zero planted it names where the first non-finite value appeared;
the unplanted kernels trace clean (the negative control every planted test stands on), mistral3's
queries' temperature included.

A plant is a copy of one kernels_cu/ file with one line changed, read by an emulator of its own
(PlantedEmu); every other file is the real one, already built. The emulator's build cache keys on
a source's path and text, so each plant costs one g++ build of one file, once per test session.
Where a kernel argument allows it the plant fires in one layer only: on the synthetic gemma3,
layers 0-4 slide over an 8-key window with RoPE base 10^4 and layer 5 is global with base 10^6.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from oracles.trace import trace_step
from sharpinf.step.forward import ForwardPass
from sharpinf.model.loader import load_model
from sharpinf.model.synth import synthetic_model
from sharpinf.runtime import paths
from sharpinf.runtime.emu_backend import EmuBackend

TOKENS = np.random.default_rng(5).integers(0, 512, 20).tolist()  # 20 tokens: 5 KV blocks of 4, past the window
BLOCK = 4


class PlantedEmu(EmuBackend):
    """The emulator with some kernels_cu/ files read from planted copies, the rest the real ones."""

    def __init__(self, planted: dict):
        super().__init__()
        self.planted = planted

    def _source(self, filename: str):
        return self.planted.get(filename) or super()._source(filename)


@pytest.fixture(scope="module")
def plant(tmp_path_factory):
    """plant(file, old, new) -> a backend running kernels_cu/<file> with the line `old` replaced."""
    folder = tmp_path_factory.mktemp("planted")
    made: dict = {}

    def make(file: str, old: str, new: str, via: str | None = None) -> PlantedEmu:
        """`via`: the kernel file that includes `file` (a header), run with the planted header beside it."""
        if (file, old, new, via) not in made:
            text = (paths.kernels_dir() / file).read_text()
            assert text.count(old) == 1, f"the line to plant is not in kernels_cu/{file} exactly once: {old!r}"
            out = folder / f"{len(made)}" / file
            out.parent.mkdir()
            out.write_text(text.replace(old, new))
            if via is not None:  # its own folder is searched first for the header
                (out.parent / via).write_text((paths.kernels_dir() / via).read_text())
            made[(file, old, new, via)] = out.parent / via if via else out
        return PlantedEmu({via or file: made[(file, old, new, via)]})

    return make


@pytest.fixture(scope="module")
def llama():
    return load_model(synthetic_model("llama", "Q8_0", n_embd=128))  # 2 layers, GQA 4:2, head_dim 32


@pytest.fixture(scope="module")
def gemma():
    return load_model(synthetic_model("gemma3", "Q8_0", n_embd=128, n_layer=6, n_head_kv=1, sliding_window=8))


@pytest.fixture(scope="module")
def moe():
    return load_model(synthetic_model("qwen3moe", "Q8_0", n_embd=128))  # 8 experts, 2 a token


@pytest.fixture(scope="module")
def mistral3():  # the queries' temperature from position 8 on: TOKENS' last 12 carry it
    return load_model(synthetic_model("mistral3", "Q8_0", n_embd=128, **{
        "mistral3.rope.scaling.original_context_length": 8, "mistral3.attention.temperature_scale": 0.5}))


@pytest.fixture(scope="module")
def oss():
    return load_model(synthetic_model("gpt-oss", "Q8_0", expert_qtype="Q8_0", n_layer=1))  # 8 experts, 2 a token


def trace(model, be, kernels="simple", kv_dtype="f16"):
    return trace_step(ForwardPass(model, be, kernels=kernels), TOKENS, kv_dtype=kv_dtype, block_size=BLOCK)


def first(rep):
    fd = rep.first_divergence
    assert fd is not None, f"the plant was not found: {rep.describe()}"
    return fd


# -- the negative control -------------------------------------------------------------------------
@pytest.mark.parametrize("kernels", ["simple", "fast"])
def test_unplanted_kernels_trace_clean(emu, llama, gemma, kernels):
    for model, kv in ((llama, "q8_0"), (gemma, "f16")):
        rep = trace(model, emu, kernels, kv)
        assert rep.passed and rep.first_nonfinite is None, rep.describe()
        per_layer = [r.op for r in rep.records if r.layer == 0]
        assert per_layer[:5] == ["attn_norm", "qkv", "rope", "kv_append", "attention"]
        assert [r.op for r in rep.records if r.layer is None] == ["embedding", "output_norm", "lm_head"]
        assert {r.layer for r in rep.records} == {None, *range(model.config.n_layer)}
        assert all(r.kernels for r in rep.records), "every op names the kernels that wrote it"
        assert "within their bounds" in rep.describe()
    if kernels == "fast":  # the q8_1 copies are checked, and the fused residual adds
        assert {"attn_q8", "ffn_q8"} <= {r.op for r in rep.records}
        assert next(r for r in rep.records if r.op == "attention").kernels[0].startswith("attention_split.cu:")


@pytest.mark.parametrize("kernels", ["simple", "fast"])
def test_an_moe_layer_traces_clean_part_by_part(emu, moe, kernels):
    rep = trace(moe, emu, kernels)
    assert rep.passed and rep.first_nonfinite is None, rep.describe()
    ops = [r.op for r in rep.records if r.layer == 1]
    q8 = ["moe_q8"] if kernels == "fast" else []
    assert ops[ops.index("ffn_norm"):] == ["ffn_norm", "moe_route", "moe_weights", "moe_gate_up", *q8, "moe_down",
                                           "moe_combine"]
    assert all(r.kernels for r in rep.records), "every op names the kernels that wrote it"
    sort = "moe_dp4a.cu:moe_sort" if kernels == "fast" else None
    assert sort is None or sort in next(r for r in rep.records if r.op == "moe_gate_up").kernels


# -- planted bugs -------------------------------------------------------------------------------------
def test_matmul_that_drops_a_lane_is_named_at_the_o_projection(llama, plant):
    # lane 0's partial sum dropped, on square matrices only: Wqkv (256 x 128) is right, Wo (128 x 128) wrong
    be = plant("matmul.cu", "float v = mm_tree_sum(pb[lane]);",
               "float v = mm_tree_sum(pb[lane]) - (n_out == n_in ? pb[lane][0] : 0.0f);")
    rep = trace(llama, be)
    fd = first(rep)
    assert (fd.layer, fd.op, fd.kernels) == (0, "o_proj", ["matmul.cu:matmul_q8_0"])
    assert fd.finite and fd.err > 1e3 * fd.bound
    assert next(r for r in rep.records if r.op == "qkv").passed
    assert "layer 0 o_proj (matmul.cu:matmul_q8_0)" in rep.describe()


def test_norm_off_by_one_is_named(llama, plant):
    be = plant("rmsnorm.cu", "rsqrtf(ss / (float)n + eps)", "rsqrtf(ss / (float)(n - 1) + eps)")
    fd = first(trace(llama, be))
    assert (fd.layer, fd.op, fd.kernels) == (0, "attn_norm", ["rmsnorm.cu:rmsnorm_f32"])


def test_q8_1_norm_off_by_one_is_named_in_steps(llama, plant):
    # the fast set's norm writes q8_1: a 0.4% scale error is under one rounding step per value, yet
    # it moves every large value half a step past where rounding can put it
    be = plant("q8_1_rows.cuh", "rsqrtf(total / (float)n + eps)", "rsqrtf(total / (float)(n - 1) + eps)",
               via="rmsnorm_q8_1.cu")
    rep = trace(llama, be, kernels="fast")
    fd = first(rep)
    assert (fd.layer, fd.op, fd.kernels) == (0, "attn_norm", ["rmsnorm_q8_1.cu:rmsnorm_q8_1"])
    assert "q8_1 steps" in fd.metric


def test_rope_sin_sign_on_the_global_layer_is_named(gemma, plant):
    call = "rope_cos_sin(freqs, i, positions[t], mscale, &c, &s);"
    be = plant("rope.cu", call, call + " if (freqs[half - 1] < 1e-5) s = -s;")  # 1e6, the global layer's base
    rep = trace(gemma, be)
    fd = first(rep)
    assert (fd.layer, fd.op) == (5, "rope") and "rope.cu:rope_neox" in fd.kernels
    assert fd.where[0] > 0, "position 0 has angle 0: no sign to flip"
    assert all(r.passed for r in rep.records if r.op == "rope" and r.layer != 5)


@pytest.mark.parametrize("kernels", ["simple", "fast"])
def test_the_queries_temperature_traces_clean_and_a_rope_that_misplaces_it_is_named(emu, mistral3, plant, kernels):
    """mistral3's rope op is held to Q times the temperature, K without: clean as it is; the simple set's
    rope.cu without the factor, or the fused kernel's factor on K too, is named at layer 0's rope from
    position 8 on (the positions before it are right either way: the factor is 1 there)."""
    assert trace(mistral3, emu, kernels).passed
    if kernels == "simple":
        be = plant("rope.cu", "const float temp = attn_temp(positions[t], temp_scale, temp_floor);",
                   "const float temp = 1.0f;")
        entry = "rope.cu:rope_norm"
    else:
        be = plant("rope_kv_token.cuh", "t = h < n_heads ? q_temp : 1.0f;", "t = q_temp;", via="rope_kv.cu")
        entry = "rope_kv.cu:rope_kv_f16"
    fd = first(trace(mistral3, be, kernels))
    assert (fd.layer, fd.op) == (0, "rope") and entry in fd.kernels and fd.where[0] >= 8, (fd.where, fd.column)
    assert ("K head" in fd.column) == (kernels == "fast"), fd.column


def test_attention_skipping_key_0_on_the_global_layer_is_named(gemma, plant):
    be = plant("attention.cu", "max(0, qi.pos - sliding_window + 1) : 0;",
               "max(0, qi.pos - sliding_window + 1) : min(1, qi.pos);")  # global layers skip key 0
    rep = trace(gemma, be)
    fd = first(rep)
    assert (fd.layer, fd.op, fd.kernels) == (5, "attention", ["attention.cu:attention_f16_d32"])
    assert fd.where[0] >= 1 and rep.first_nonfinite is None
    assert fd.column.startswith("column ") and "head" in fd.column


@pytest.mark.parametrize("kernels", ["simple", "fast"])
def test_a_gpt_oss_moe_traces_clean_part_by_part(emu, oss, kernels):
    """The biased router's top k by logit and their softmax, the experts' biases, the clamped SwiGLU: each
    part within its bound on the kernel path's own input (and the rest of the step: sinks, output bias)."""
    rep = trace(oss, emu, kernels)
    moe = [r.op for r in rep.records if r.op.startswith("moe_")]
    q8 = ["moe_q8"] if kernels == "fast" else []
    assert moe == ["moe_route", "moe_weights", "moe_gate_up", *q8, "moe_down", "moe_combine"]
    assert rep.passed and rep.first_nonfinite is None, rep.describe()


def test_the_plain_swiglu_where_gpt_oss_clamps_is_named_at_the_gate_up(emu, oss, plant):
    old = "if (NMAT == 2) out = gated_act(act, v, u);"
    rep = trace(oss, plant("moe_ffn.cu", old, old.replace("(act,", "(ACT_SILU,")))
    bad = [(r.op, r.kernels) for r in rep.records if r.op.startswith("moe_") and not r.passed]
    assert bad == [("moe_gate_up", ["moe_ffn.cu:moe_gate_up_q8_0"])], rep.describe()


def test_a_router_dot_one_value_short_is_named_at_the_route(moe, plant):
    be = plant("moe_router.cuh", "for (int i = lane; i < n_in; i += 32) acc",
               "for (int i = lane; i < n_in - 1; i += 32) acc", via="moe_route.cu")
    rep = trace(moe, be)
    fd = first(rep)
    assert (fd.layer, fd.kernels) == (0, ["moe_route.cu:moe_route_f32"]) and fd.op in ("moe_route", "moe_weights")
    assert fd.column.startswith("rank ") and "expert" in fd.column


def test_an_exact_tie_settled_against_the_lower_id_rule_is_named(emu, plant):
    # pairwise-equal router rows: every expert ties exactly with its neighbour, and the rule decides
    ties = load_model(synthetic_model("qwen3moe", "Q8_0", n_embd=128, routing="ties", n_expert_used=3))
    assert trace(ties, emu).passed
    rep = trace(ties, plant("moe_route.cu", "(best < 0 || p[e] > p[best])", "(best < 0 || p[e] >= p[best])"))
    fd = first(rep)
    assert (fd.layer, fd.op) == (0, "moe_route") and "settled against the lower-id rule" in fd.detail, rep.describe()


def test_one_experts_gate_up_off_by_a_tenth_of_a_percent_is_named_with_its_expert(moe, plant):
    old = "if (NMAT == 2) out = gated_act(act, v, u);"
    be = plant("moe_ffn.cu", old, old[:-1] + " * (ids[p] == 3 ? 1.001f : 1.f);")
    rep = trace(moe, be)
    fd = first(rep)
    assert (fd.layer, fd.op, fd.kernels) == (0, "moe_gate_up", ["moe_ffn.cu:moe_gate_up_q8_0"])
    assert ", expert 3, column " in fd.column and fd.err > 10 * fd.bound
    assert all(r.passed for r in rep.records if r.layer == 0 and r.op in ("moe_route", "moe_weights"))


def test_a_combine_that_drops_rank_1_is_named(moe, plant):
    be = plant("moe_ffn.cu", "for (int r = 0; r < k; ++r) {", "for (int r = 0; r < k; r += 2) {")
    rep = trace(moe, be)
    fd = first(rep)
    assert (fd.layer, fd.op, fd.kernels) == (0, "moe_combine", ["moe_ffn.cu:moe_combine"])
    assert all(r.passed for r in rep.records if r.layer == 0 and r.op.startswith("moe_") and r.op != "moe_combine")


def test_division_by_zero_is_traced_to_its_origin(llama, plant):
    # silu(g) * u / 0 where the gate is large: inf (or NaN) from finite inputs
    be = plant("elementwise.cu", "return gated_act(ACT_SILU, g, u); }",
               "return gated_act(ACT_SILU, g, u) / (g > 2.0f ? 0.0f : 1.0f); }")
    rep = trace(llama, be)
    fn = rep.first_nonfinite
    assert fn is not None, rep.describe()
    assert (fn.layer, fn.op) == (0, "gate_up") and "elementwise.cu:silu_gate_f32" in fn.kernels
    assert fn.inputs_finite and not np.isfinite(fn.got) and np.isfinite(fn.want)
    assert rep.first_divergence is fn, "a non-finite value never passes"
    assert "from a finite input" in rep.describe()
    json.dumps(rep.to_json())  # inf stays out of the JSON


# -- the command line ---------------------------------------------------------------------------------
def test_verify_trace_only_names_the_planted_op(llama, plant, monkeypatch):
    from typer.testing import CliRunner

    from sharpinf.cli import app, verify_cmd

    be = plant("rmsnorm.cu", "rsqrtf(ss / (float)n + eps)", "rsqrtf(ss / (float)(n - 1) + eps)")  # built above
    monkeypatch.setattr(verify_cmd, "backend_named", lambda name: be)
    res = CliRunner().invoke(app, ["verify", str(llama.path), "--kernels", "simple", "--trace-only", "--json"])
    assert res.exit_code == 1, res.output
    (row,) = json.loads(res.stdout)
    assert row["oracle"] == "op-trace" and not row["passed"]
    assert row["trace"]["first_divergence"]["op"] == "attn_norm" and row["trace"]["first_divergence"]["layer"] == 0
    assert "first divergence: layer 0 attn_norm (rmsnorm.cu:rmsnorm_f32)" in row["detail"]
    res = CliRunner().invoke(app, ["verify", str(llama.path), "--kernels", "simple", "--trace-only"])
    assert res.exit_code == 1
    assert "the first op out of its bound is layer 0 attn_norm (rmsnorm.cu:rmsnorm_f32)" in " ".join(res.stdout.split())
    res = CliRunner().invoke(app, ["verify", str(llama.path), "--backend", "reference", "--trace"])
    assert "use --backend emu, cuda or auto" in str(res.exception)
