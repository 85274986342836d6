"""Graph-vs-eager: a step replayed from a captured graph (padded to its bucket) gives the bits
the same step gives launched eagerly at its exact shape -- prefill, chunked, decode and mixed
steps, sampling with penalties, on every backend (the emulator's graphs are its recorded
launches). Hypothesis draws the sequences, chunk schedules, block sizes and KV dtypes."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oracles.graph_oracle import Schedule, oracle_graph_vs_eager, standard_schedule
from sharpinf.forward import ForwardPass
from sharpinf.model.loader import load_model
from sharpinf.model.synth import synthetic_model


@functools.cache
def _fp(arch: str, qtype: str, backend, kernels: str = "fast"):
    n_embd = 256 if qtype.endswith("_K") else 128
    return ForwardPass(load_model(synthetic_model(arch, qtype, n_embd=n_embd)), backend, kernels=kernels)


@st.composite
def schedules(draw) -> Schedule:
    S = draw(st.integers(1, 4), label="sequences")
    prompts = [draw(st.integers(1, 40), label="prompt") for _ in range(S)]
    decodes = [draw(st.integers(0, 4), label="decodes") for _ in range(S)]
    rng = np.random.default_rng(draw(st.integers(0, 2**16), label="seed"))
    tokens = [rng.integers(0, 512, p + d).tolist() for p, d in zip(prompts, decodes)]
    fed, steps = [0] * S, []
    while any(f < len(t) for f, t in zip(fed, tokens)):
        step = []
        for s in range(S):
            left = len(tokens[s]) - fed[s]
            if left <= 0 or (steps and not draw(st.booleans(), label="runs")):
                continue
            n = 1 if fed[s] >= prompts[s] else draw(st.integers(1, prompts[s] - fed[s]), label="chunk")
            step.append((s, n))
            fed[s] += n
        if step:
            steps.append(step)
    temps = st.sampled_from([0.0, 0.7, 1.5])
    params = [(draw(temps), draw(st.sampled_from([1.0, 0.9])), draw(st.sampled_from([0.0, 0.05])),
               draw(st.sampled_from([1.0, 1.3, 0.8])), draw(st.sampled_from([0, 5]))) for _ in range(S)]
    return Schedule(tokens, steps, params)


@pytest.mark.parametrize("kernels", ["simple", "fast"])
@settings(max_examples=15, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])
@given(sched=schedules(), block_size=st.sampled_from([4, 16]), kv=st.sampled_from(["f16", "q8_0"]),
       model=st.sampled_from([("llama", "Q8_0"), ("qwen3", "Q4_K"), ("qwen2", "Q4_1")]))
def test_graph_replay_is_bit_identical_to_eager(backend, kernels, sched, block_size, kv, model):
    r = oracle_graph_vs_eager(_fp(*model, backend, kernels), sched, kv_dtype=kv, block_size=block_size)
    assert r.passed, f"{r.case}: {r.detail}"


def test_standard_schedule_replays_every_plan_from_a_graph(backend):
    fp = _fp("llama", "Q8_0", backend)
    r = oracle_graph_vs_eager(fp, standard_schedule(fp.cfg.n_vocab), block_size=4)
    assert r.passed, r.detail
    assert "prefill" in r.case and "decode" in r.case and "mixed" in r.case


def test_a_wrong_graph_is_caught(emu, monkeypatch):
    """The oracle can fail: graphs captured with the padding tokens writing slot 0 of block 0
    (a real sequence's first K/V) instead of the scratch block corrupt later steps."""
    from sharpinf.step_buffers import StepDescriptor

    real_pack = StepDescriptor.pack

    def bad_pack(self, batch, n_tokens, n_rows, sampling):
        nbytes = real_pack(self, batch, n_tokens, n_rows, sampling)
        self.h["slot_mapping"][batch.n_tokens : n_tokens] = 0
        return nbytes

    monkeypatch.setattr(StepDescriptor, "pack", bad_pack)
    fp = _fp("llama", "Q8_0", emu)
    r = oracle_graph_vs_eager(fp, standard_schedule(fp.cfg.n_vocab), block_size=4)
    assert not r.passed and "differ" in r.detail


def test_replay_after_a_buffer_is_replaced_fails_loudly(emu):
    """The emulator's graphs check every recorded buffer: a plan whose buffer was swapped after
    capture (the silent stale-pointer bug on a GPU) raises."""
    from oracles.paged_runner import PagedRunner
    from sharpinf.errors import BackendError
    from sharpinf.kv_pool import KVPool
    from sharpinf.step_buffers import StepCapacity

    fp = _fp("llama", "Q8_0", emu).with_own_buffers(StepCapacity(8, 2, 2, 10))
    pool = KVPool(emu, fp.cfg, num_blocks=8, block_size=4)
    fp.capture_graphs(pool)
    run = PagedRunner(fp, pool)
    sid = run.new_seq()
    run.step([(sid, [1, 2, 3])])
    fp.ws.x = emu.empty(fp.ws.x.shape, np.float32)  # the bug: a new buffer after capture
    with pytest.raises(BackendError, match="reallocated after capture"):
        run.step([(sid, [4])])
