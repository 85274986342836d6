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
from sharpinf.step.forward import ForwardPass
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


@pytest.mark.parametrize("fused", ["ffn=fused", "link=layer"])
def test_cooperative_launches_replay_from_a_graph(backend, fused):
    """ffn=fused and link=layer: their decode steps' cooperative launches (grid barriers) in a
    captured graph give eager's bits (on a GPU: a cooperative kernel node)."""
    fp = _fp("qwen3", "Q4_K", backend, f"matmul=dp4a,{fused},attention=split,rope_kv=fused")
    r = oracle_graph_vs_eager(fp, standard_schedule(fp.cfg.n_vocab), block_size=4)
    assert r.passed, r.detail
    assert "decode" in r.case


def test_a_wrong_graph_is_caught(emu, monkeypatch):
    """The oracle can fail: graphs captured with the padding tokens writing slot 0 of block 0
    (a real sequence's first K/V) instead of the scratch block corrupt later steps."""
    from sharpinf.step.buffers import StepDescriptor

    real_pack = StepDescriptor.pack

    def bad_pack(self, batch, n_tokens, n_rows, sampling, *feed):
        nbytes = real_pack(self, batch, n_tokens, n_rows, sampling, *feed)
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
    from sharpinf.step.kv_pool import KVPool
    from sharpinf.step.buffers import StepCapacity

    fp = _fp("llama", "Q8_0", emu).with_own_buffers(StepCapacity(8, 2, 2, 10))
    pool = KVPool(emu, fp.cfg, num_blocks=8, block_size=4)
    fp.capture_graphs(pool)
    run = PagedRunner(fp, pool)
    sid = run.new_seq()
    run.step([(sid, [1, 2, 3])])
    fp.ws.x = emu.empty(fp.ws.x.shape, np.float32)  # the bug: a new buffer after capture
    with pytest.raises(BackendError, match="reallocated after capture"):
        run.step([(sid, [4])])


# -- padded rows and tokens never touch a real row's state ------------------------------------------
def _padding_schedule(n_vocab: int) -> Schedule:
    """Six sequences, five with a repetition-penalty history (slot = sequence), in steps of 6, 3, 5,
    1, 2, 3 and 6 rows: most steps are padded to a bucket of 4 or 8 rows, and a padded row's index
    was a real row with a fresh (cleared) slot the step before. Penalties far from 1 make the
    greedy choice follow the history, so a corrupted one changes the sampled ids."""
    rng = np.random.default_rng(31)
    prompts = [9, 5, 12, 3, 7, 6]
    tokens = [rng.integers(0, n_vocab, p + 6).tolist() for p in prompts]
    steps = [[(s, p) for s, p in enumerate(prompts)], [(0, 1), (1, 1), (2, 1)], [(s, 1) for s in range(5)],
             [(0, 1)], [(1, 1), (2, 1)], [(0, 1), (1, 1), (2, 1)], [(s, 1) for s in range(6)]]
    params = [(0.0, 1.0, 0.0, 0.3, 0), (0.0, 1.0, 0.0, 1.5, 0), (0.0, 1.0, 0.0, 0.3, 0), (0.0, 1.0, 0.0, 0.5, 0),
              (0.9, 1.0, 0.0, 0.3, 5), (0.0, 1.0, 0.0, 1.0, 0)]
    return Schedule(tokens, steps, params)


def _history(bits: np.ndarray) -> set[int]:
    """The ids whose bit is set in one history slot (u32 words, bit id & 31 of word id >> 5)."""
    return set(np.flatnonzero((bits[:, None] >> np.arange(32, dtype=np.uint32)) & 1).tolist())


def test_padded_rows_never_touch_a_real_rows_history(backend):
    """R real sampling rows in a bucket of Rb > R rows (and padded tokens): logits and sampled ids
    bit-identical to the unpadded run, and after every step each real slot's history holds exactly
    the ids its sequence was fed and the ids its rows sampled (the kernel sets those itself), in both
    runs (a padded row given a real slot, or a clear, wipes it)."""
    from oracles.graph_oracle import _Driver
    from sharpinf.step.buffers import StepCapacity
    from sharpinf.step.plan import bucket_for

    fp = _fp("llama", "Q8_0", backend, "simple")
    sched = _padding_schedule(fp.cfg.n_vocab)
    cap = StepCapacity(tokens=48, seqs=8, rows=8, history=64)
    padded, exact = fp.with_own_buffers(cap), fp.with_own_buffers(cap)
    exact.exact_shapes = True  # no padding: each step at its own shape
    p, e = _Driver(padded, sched, "f16", 4, 0), _Driver(exact, sched, "f16", 4, 0)
    slots = [s for s, prm in enumerate(sched.params) if prm[3] != 1.0]
    sampled_into: dict[int, set[int]] = {s: set() for s in slots}
    padded_steps = 0
    for i, st in enumerate(sched.steps):
        lp, sp = p.step(st)
        le, se = e.step(st)
        for r, (s, _) in enumerate(st):
            if s in sampled_into:
                sampled_into[s].add(int(sp[r]))
        R, Rb = len(st), bucket_for(len(st), padded.row_ladder)
        padded_steps += Rb > R
        where = f"step {i} ({R} rows padded to {Rb})"
        assert np.isfinite(lp).all() and np.isfinite(le).all(), f"{where}: non-finite logits"
        assert np.array_equal(lp.view(np.uint32), le.view(np.uint32)), f"{where}: logits differ from unpadded"
        assert np.array_equal(sp, se), f"{where}: sampled {sp.tolist()} vs unpadded {se.tolist()}"
        bits_p, bits_e = backend.download(padded.slots.seen_bits), backend.download(exact.slots.seen_bits)
        assert np.array_equal(bits_p[slots], bits_e[slots]), f"{where}: real slots' history differs from unpadded"
        counts_p, counts_e = backend.download(padded.slots.counts), backend.download(exact.slots.counts)
        assert np.array_equal(counts_p[slots], counts_e[slots]), f"{where}: real slots' counts differ from unpadded"
        for s in slots:
            want = set(sched.tokens[s][: p.synced[s]]) | sampled_into[s]
            assert _history(bits_p[s]) == want, f"{where}: padded run's slot {s} history is not the ids it was fed"
            assert _history(bits_e[s]) == want, f"{where}: unpadded run's slot {s} history is not the ids it was fed"
    assert padded_steps >= 4 and padded.graph_replays == 0 == exact.graph_replays
    assert backend.download(padded.slots.counts)[slots].view(np.uint16).sum() > 0, "no slot counted a sampled id"


def test_pack_pads_with_rows_and_tokens_that_touch_nothing(emu):
    """StepDescriptor.pack over a staging buffer full of junk (what earlier, larger steps left):
    padded tokens feed id 0 at position 0 into the scratch block's slot 0, in the padding sequence
    (the empty ones between own no token); padded rows read row 0, greedily, with no history slot
    and no new history ids -- nothing a kernel could turn into a write to a real row's state."""
    from sharpinf.step.batch import Batch, SeqChunk
    from sharpinf.step.buffers import SamplingRows, StepCapacity, StepDescriptor

    cap = StepCapacity(tokens=16, seqs=4, rows=4, history=16)
    d = StepDescriptor(emu, cap, width=4, block_size=4, scratch_block=7)
    tables = d.fields["block_tables"].offset
    d.host[:tables] = 0x5A  # junk in every field up to the block tables
    d.tables[: cap.seqs] = 0x5A5A5A5A  # and in every table but the padding sequence's (set once, never sent again)
    batch = Batch.build([SeqChunk([5, 6, 7], 0, [2]), SeqChunk([8, 9], 4, [3, 1])], 4)
    rows = SamplingRows(np.full((2, 6), 0.5, np.float32), np.array([3, 4], np.int32), np.array([11, 12], np.uint64),
                        np.array([0, 1], np.int32), np.array([1, 0], np.int32), np.array([1, 1], np.int32),
                        np.array([0, 3, 5], np.int32), np.array([5, 6, 7, 8, 9], np.int32))
    N, S, R, Nb, Rb = 5, 2, 2, 8, 4
    d.pack(batch, Nb, Rb, rows)
    h = d.h
    assert h["token_ids"][N:Nb].tolist() == [0] * 3 and h["positions"][N:Nb].tolist() == [0] * 3
    assert h["slot_mapping"][N:Nb].tolist() == [7 * 4] * 3, "padded tokens must write only the scratch block"
    assert h["cu_seqlens"][: S + 1].tolist() == [0, 3, 5]
    assert h["cu_seqlens"][S + 1 : d.pad_seq + 1].tolist() == [N] * (d.pad_seq - S), "empty sequences own no token"
    assert h["cu_seqlens"][d.pad_seq + 1] == Nb and (d.tables[d.pad_seq] == 7).all()
    assert (emu.download(d.d["block_tables"]).reshape(-1, 4)[d.pad_seq] == 7).all(), "the padding table is the scratch block"
    assert h["logits_rows"][R:Rb].tolist() == [0] * 2
    assert h["slots"][:R].tolist() == [1, 0] and h["slots"][R:Rb].tolist() == [-1] * 2, "a padded row holds no slot"
    assert h["add_off"][: R + 1].tolist() == [0, 3, 5] and h["add_off"][R + 1 : Rb + 1].tolist() == [5] * 2, \
        "a padded row adds no history ids"
    assert (h["params"][R:Rb] == 0).all(), "padded rows are greedy with no penalty"
    # clear, top_k, steps and seeds of a padded row keep what was there: with slot -1 and temperature 0
    # the sampling kernel reads them for nothing but that row's own output, which nobody reads
