"""link=layer (kernels_cu/layer_dp4a.cu): a decode step's work between two attentions -- the
o-projection, FFN norm and FFN of one layer, the norm, QKV, QK-norm, RoPE and KV append of the next
-- as one cooperative launch, so a decode layer is two launches. Every step gives the dp4a path's
logits bit for bit: decode steps (which it serves) and prefill chunks (which take the separate
launches) alike, across the archs' differences (qwen3's QK-norm, qwen2's QKV bias, gemma3's
post-norms, where only the pre half links, mistral3's queries' temperature) and the cache types. Run under the emulator's race and
init checks, each block on its own thread at every grid barrier, in both thread orders (make
test's reverse pass)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from sharpinf.model import quants
from sharpinf.model.loader import load_model
from sharpinf.model.synth import synthetic_model
from oracles import paths
from sharpinf.ops.layer_dp4a import LinkPost, LinkPre, LinkStep, layer_dp4a
from sharpinf.step.forward import ForwardPass
from asserts import assert_bits

BASE = dict(attention="split", rope_kv="fused")
# what `matmul=layer` was before the FFN and the link were ops of their own: dp4a's linear layers, the
# link (ffn=fused beside it would launch nothing of its own on these models -- the link runs every FFN a
# fused one would serve -- and check_dispatched refuses a variant that does that)
LINKED = dict(matmul="dp4a", link="layer", **BASE)


@pytest.mark.parametrize("arch,qtype,kv_dtype,per_layer,entry", [
    ("qwen3", "Q4_K", "f16", 2, "layer_dp4a_q4_k"),   # QK-norm, YaRN; both halves linked: attention + the link
    # the QKV bias; a q8_0 cache; rows of 512 (a norm's two rounds a thread) and an FFN of 1,024: the row
    # loops' G compiled in (16 for rows of n_embd and q_dim, 32 for n_ff's: SmolLM2's pair), the lanes' fold
    ("qwen2", "Q5_1", "q8_0", 2, "layer_dp4a_q5_1_g16_32"),
    ("gemma3", "Q8_0", "bf16", 9, "layer_dp4a_q8_0"),  # post-norms: the post half declines, the pre half links (11 -> 9)
    # the queries' temperature from position 8 on: the linked steps (positions 10-18) carry it
    ("mistral3", "Q4_0", "f16", 2, "layer_dp4a_q4_0"),
])
def test_the_linked_layers_give_the_dp4a_paths_logits(backend, arch, qtype, kv_dtype, per_layer, entry):
    shape = {"qwen2": {"n_ff": 1024},  # qwen3 with YaRN: the link's RoPE reads the table and its cos/sin factor
             "qwen3": {"qwen3.rope.scaling.type": "yarn", "qwen3.rope.scaling.factor": 4.0,
                       "qwen3.rope.scaling.original_context_length": 256},
             "mistral3": {"mistral3.rope.scaling.original_context_length": 8,
                          "mistral3.attention.temperature_scale": 0.5}}.get(arch, {})
    _linked_equals_dp4a(backend, arch, qtype, kv_dtype, per_layer, {"qwen3": 256, "qwen2": 512}.get(arch, 128),
                        entry, **shape)


def _linked_equals_dp4a(backend, arch, qtype, kv_dtype, per_layer, n_embd, entry=None, **shape):
    model = load_model(synthetic_model(arch, qtype, n_embd=n_embd, **shape))
    dp4a = ForwardPass(model, backend, kernels={"matmul": "dp4a", **BASE})
    linked = dp4a.with_own_buffers(kernels=LINKED)
    assert linked.launches_per_layer() == per_layer
    assert any(f == "layer_dp4a.cu" and entry in (None, e) for f, e in linked.kernels_used(kv_dtype))
    toks = list(range(7, 37))
    nb = paths.blocks_for([len(toks)], 16)
    steps = [5, 1, 1, 3, 8, 1, 11]  # decode-sized steps (linked) between prefill chunks (not)
    got, want = (np.asarray(paths.fresh_runner(fp, kv_dtype, nb, 16, 0).prefill_chunks(toks, steps))
                 for fp in (linked, dp4a))
    assert np.isfinite(want).all()
    assert_bits(got, want, f"{arch} {qtype} {kv_dtype}")


def test_the_link_requires_the_fused_rope_and_links_both_halves_with_it(backend):
    """rope_kv=separate's QK-norm (qk_norm.cu, a block a head) sums a head of 128 in another order than
    the fused kernel the link runs: the link requires rope_kv=fused (refused in one line without it),
    and with it a head of 128 links both halves, every step keeping dp4a's bits."""
    from sharpinf.errors import SharpinfError

    model = load_model(synthetic_model("qwen3", "Q8_0", n_embd=256, head_dim=128))
    dp4a = ForwardPass(model, backend, kernels={"matmul": "dp4a", **BASE})
    with pytest.raises(SharpinfError, match="link=layer requires rope_kv=fused .the choice has rope_kv=separate.$"):
        dp4a.with_own_buffers(kernels={"matmul": "dp4a", "link": "layer", "attention": "split"})
    linked = dp4a.with_own_buffers(kernels=LINKED)
    assert linked.launches_per_layer() == 2
    toks = list(range(7, 37))
    nb = paths.blocks_for([len(toks)], 16)
    got, want = (np.asarray(paths.fresh_runner(fp, "f16", nb, 16, 0).prefill_chunks(toks, [5, 1, 1, 3, 8, 12]))
                 for fp in (linked, dp4a))
    assert_bits(got, want, "qwen3 head_dim 128, rope_kv=fused")


SWEEP = [("llama", "Q4_0", "f32"), ("qwen3", "Q4_1", "f16"), ("qwen2", "Q5_0", "bf16"), ("llama", "Q5_1", "q8_0"),
         ("qwen3", "Q8_0", "q8_0"), ("llama", "Q5_K", "f16"), ("qwen2", "Q6_K", "f32")]


@pytest.mark.tier_all("every other weight type; make test runs three")
@pytest.mark.parametrize("arch,qtype,kv_dtype", SWEEP)
def test_every_weight_type_links_bit_for_bit(backend, arch, qtype, kv_dtype):
    n_embd = 256 if qtype.endswith("_K") else 128
    _linked_equals_dp4a(backend, arch, qtype, kv_dtype, 2, n_embd)


@pytest.mark.tier_all("the _g32_32 entry (one row-loop site for o, down and QKV); make test runs _g16_32")
def test_the_g32_entry_links_bit_for_bit(backend):
    _linked_equals_dp4a(backend, "qwen2", "Q4_1", "f16", 2, 1024, "layer_dp4a_q4_1_g32_32", n_ff=1024)


def test_the_link_takes_the_compiled_g_entry_where_every_row_loop_has_it():
    """_g16_32 / _g32_32 where rows of n_embd -- and, with the post half, the o-projection's of q_dim -- have
    G 16 or 32 and rows of n_ff 32 (the kernel's DP_ASSUME_G returns at once otherwise: a launcher that
    asked for it would compute nothing); else the run-time entry."""
    from sharpinf.ops.layer_dp4a import _entry

    q4 = quants.Q4_K
    assert _entry(q4, True, 576, _step(1, n_embd=576, n_ff=1536)) == "layer_dp4a_q4_k_g16_32"  # SmolLM2
    assert _entry(q4, True, 4096, _step(1, n_embd=4096, n_ff=12288)) == "layer_dp4a_q4_k_g32_32"  # Qwen3-8B
    wide_q = _step(1, n_embd=512, n_ff=1024)
    assert _entry(q4, True, 1024, wide_q) == "layer_dp4a_q4_k"  # q_dim's G 32 beside n_embd's 16
    assert _entry(q4, False, 1024, wide_q) == "layer_dp4a_q4_k_g16_32"  # the pre half alone: no o-projection
    assert _entry(q4, True, 256, _step(1, n_embd=256, n_ff=1024)) == "layer_dp4a_q4_k"  # G 8
    assert _entry(quants.Q8_0, True, 1024, _step(1, n_embd=1024, n_ff=768)) == "layer_dp4a_q8_0"  # no (32, 16)


@pytest.mark.tier_all("gemma3 at head_dim 256 (windows, GeGLU); make test runs gemma3 at 32")
def test_gemma3_head_dim_256_links_its_pre_halves(backend):
    _linked_equals_dp4a(backend, "gemma3", "Q8_0", "f16", 9, 256, n_head=4, n_head_kv=1, head_dim=256)


def _step(n_tokens: int, kv_dtype: str = "f16", **kw) -> LinkStep:
    dims = dict(n_embd=128, n_ff=256, n_head=4, n_head_kv=2, head_dim=32, eps=1e-6, rope_style="neox", act="silu")
    dims.update(kw)
    h, hq = object(), object()  # present: the FFN scratch is not why it declines
    return LinkStep(None, None, None, h, hq, None, None, None, None, kv_dtype, n_tokens, **dims)


class _NoLaunch:
    gpu_shapes = False

    def launch(self, *a, **k):
        raise AssertionError("a declined link launched")


def test_the_link_declines_what_it_does_not_serve():
    """False, launching nothing: a step past one token tile, matrices of two types or of a float
    type, a head the fused RoPE refuses. (The engine then runs the separate launches.)"""
    q4 = quants.Q4_K
    post = LinkPost((q4, q4, q4, q4), *[None] * 6)
    pre = LinkPre(q4, *[None] * 7, None, 1.0)
    be = _NoLaunch()
    assert not layer_dp4a(be, post, pre, _step(9))
    assert not layer_dp4a(be, LinkPost((q4, q4, q4, quants.Q6_K), *[None] * 6), None, _step(1))
    assert not layer_dp4a(be, post, SimpleNamespace(**{**vars(pre), "qtype": quants.Q6_K}), _step(1))
    assert not layer_dp4a(be, None, LinkPre(quants.F16, *[None] * 7, None, 1.0), _step(1))
    assert not layer_dp4a(be, None, pre, _step(1, head_dim=48, kv_dtype="q8_0"))
    with pytest.raises(ValueError, match="neither half"):
        layer_dp4a(be, None, None, _step(1))
