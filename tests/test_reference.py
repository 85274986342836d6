"""The NumPy reference forward pass against independent truths.

- oracles/naive.py, a naive float64 loop implementation written apart from the
  reference (per token, per head, per rotation pair), on tiny synthetic models of every arch;
- incremental decode (prefill + one token at a time) equals one full pass;
- the dtype stays float32 (NumPy 2 promotion would silently make it float64);
- greedy generation equals argmax of the teacher-forced logits.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from oracles.generation import generate_reference
from sharpinf.ops.moe import router_logits_reference
from oracles.naive import naive_logits
from oracles.reference import Reference
from sharpinf.model.loader import load_model
from sharpinf.model.synth import synthetic_model
from sharpinf.model.tokenizer import Tokenizer
from sharpinf.params import SamplingParams
from asserts import assert_close

ARCH_QTYPES = [("llama", "Q8_0"), ("llama", "F16"), ("qwen2", "Q4_1"), ("qwen3", "Q5_0"), ("qwen3", "Q4_K"),
               ("qwen3moe", "Q5_1")]


@pytest.fixture(scope="module", params=ARCH_QTYPES, ids=lambda p: f"{p[0]}-{p[1]}")
def model(request):
    arch, qtype = request.param
    return load_model(synthetic_model(arch, qtype, tied=(arch != "qwen2")))


def test_reference_equals_naive_float64_loops(model):
    ids = np.random.default_rng(1).integers(0, model.config.n_vocab, 9).tolist()
    got = Reference(model).logits(ids)
    want = naive_logits(model, ids)
    assert got.dtype == np.float32 and got.shape == (9, model.config.n_vocab)
    scale = max(1.0, float(np.abs(want).max()))
    assert np.max(np.abs(got - want)) <= 2e-4 * scale
    assert (np.argmax(got, 1) == np.argmax(want, 1)).all()


def test_reference_rope_table_equals_naive_pair_by_pair_yarn_and_factors():
    """model/rope_scaling.py's folded table against naive.py's ggml rope_yarn, pair by pair, on a
    llama file with Llama 3.1's frequency factors and YaRN at once."""
    m = load_model(synthetic_model("llama", "Q8_0", rope_factors=64, **{
        "llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
        "llama.rope.scaling.original_context_length": 256}))
    ids = np.random.default_rng(2).integers(0, m.config.n_vocab, 12).tolist()
    got, want = Reference(m).logits(ids), naive_logits(m, ids)
    assert np.max(np.abs(got - want)) <= 2e-4 * max(1.0, float(np.abs(want).max()))


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_incremental_decode_equals_full_logits(model, data):
    n = data.draw(st.integers(2, 24), label="tokens")
    split = data.draw(st.integers(1, n - 1), label="prefill")
    ids = data.draw(st.lists(st.integers(0, model.config.n_vocab - 1), min_size=n, max_size=n), label="ids")
    ref = Reference(model)
    full = ref.logits(ids)
    cache = ref.new_cache(n)
    rows = [ref.forward(ids[:split], cache)] + [ref.forward([t], cache) for t in ids[split:]]
    inc = np.concatenate(rows)
    assert inc.dtype == np.float32
    assert_close(inc, full, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(full).max())))


def test_greedy_generate_is_argmax_of_teacher_forced_logits(model):
    ref = Reference(model)
    prompt = [3, 17, 42]
    tok = Tokenizer.from_gguf_metadata(model.metadata)
    out = generate_reference(ref, tok, prompt, SamplingParams(max_tokens=6, ignore_eos=True)).token_ids
    logits = ref.logits(prompt + out)
    want = np.argmax(logits[len(prompt) - 1: -1], axis=1).tolist()
    assert out == want


def test_reference_rejects_bad_input(model):
    ref = Reference(model)
    with pytest.raises(ValueError, match="out of range"):
        ref.logits([model.config.n_vocab])
    with pytest.raises(ValueError, match="no tokens"):
        ref.logits([])


def _layer0_routes(path, n_tokens: int = 24):
    """(ids, weights) the router of layer 0 gives a prompt's tokens (the reference's own route)."""
    ref = Reference(load_model(path))
    ids = np.random.default_rng(3).integers(0, ref.cfg.n_vocab, n_tokens)
    h = ref._norm(ref.token_embd[ids], ref.layers[0].ffn_norm)
    return ref.route(h, ref.layers[0])


def test_synthetic_moe_routing_spreads_tokens_over_the_experts():
    ids, w = _layer0_routes(synthetic_model("qwen3moe", "Q8_0"))
    assert ids.shape == (24, 2) and len(np.unique(ids)) >= 7 and len({tuple(r) for r in ids}) >= 12
    assert (ids[:, 0] != ids[:, 1]).all() and (w[:, 0] >= w[:, 1]).all()
    assert np.allclose(w.sum(axis=1), 1.0, atol=1e-6) and (w[:, 1] > 0.05).mean() > 0.5  # no slot is idle


def test_skewed_and_tied_routing_follow_the_lower_id_rule():
    """skewed: every logit ties, so every token takes experts 0 and 1, half each (one group holds all);
    ties (k = 3): experts 2j and 2j+1 tie, so a pair comes first, lower id first, and the third is the
    lower of the next pair."""
    ids, w = _layer0_routes(synthetic_model("qwen3moe", "Q8_0", routing="skewed"))
    assert (ids == [0, 1]).all() and (w == np.float32(0.5)).all()
    ids, w = _layer0_routes(synthetic_model("qwen3moe", "Q8_0", routing="ties", n_expert_used=3))
    assert (ids[:, 0] % 2 == 0).all() and (ids[:, 1] == ids[:, 0] + 1).all() and (ids[:, 2] % 2 == 0).all()
    assert (w[:, 0] == w[:, 1]).all() and len(np.unique(ids[:, 0])) >= 3


def test_the_route_flip_rule_follows_near_ties_only():
    """kernel-vs-reference's rule (Reference.routes): a kernel choice within route_gap of the
    reference's k-th router logit is followed (and counted); a far one is not -- the logits then
    differ and the oracle fails, as a wrong router must."""
    ref = Reference(load_model(synthetic_model("qwen3moe", "Q8_0")))
    ids = np.random.default_rng(3).integers(0, ref.cfg.n_vocab, 12)
    h = ref._norm(ref.token_embd[ids], ref.layers[0].ffn_norm)
    logits = router_logits_reference(h, ref.layers[0].router)
    own, own_w = ref.route(h, ref.layers[0])
    order = np.argsort(-logits, axis=1, kind="stable")
    near, far = own.copy(), own.copy()
    gaps = logits[0, order[0, 1]] - logits[0, order[0, 2]]
    near[0, 1] = order[0, 2]  # token 0's third-best in place of its second
    far[1, 1] = order[1, -1]  # token 1's worst in place of its second
    for routes, gap, followed in ((near, gaps + 1e-6, True), (near, gaps / 2, False), (far, 0.05, False)):
        ref.routes, ref.route_gap, ref.route_flips = {0: routes}, float(gap), 0
        got, w = ref.route(h, ref.layers[0], 0)
        changed = not np.array_equal(got, own)
        assert changed == followed and ref.route_flips == int(followed)
        if followed:
            assert (got[0] == near[0]).all() and abs(float(w[0].sum()) - 1) < 1e-6 and (got[1:] == own[1:]).all()
    ref.routes = None
