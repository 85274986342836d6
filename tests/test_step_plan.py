"""The step machinery: buckets, the one-copy descriptor and its padding, capacity, the
device-side penalty history (kept across steps, flushed when it overflows), the trace
backend, and compile-ahead naming only the kernels a model uses."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracles.paged_runner import PagedRunner
from sharpinf.step.batch import Batch, SeqChunk
from sharpinf.errors import BackendError
from sharpinf.step.forward import ForwardPass
from sharpinf.step.kv_pool import KVPool
from sharpinf.model.loader import load_model
from sharpinf.model.synth import synthetic_model
from sharpinf.ops.sampling_reference import apply_repetition_penalty
from sharpinf.params import SamplingParams
from sharpinf.step.buffers import SamplingRows, StepCapacity, StepDescriptor
from sharpinf.step.plan import bucket_for, bucket_ladder
from sharpinf.step.shapes import KV_SHAPE_KEYS


@functools.cache
def _model(arch="llama", qtype="Q8_0"):
    return load_model(synthetic_model(arch, qtype, n_embd=128))


# -- buckets ---------------------------------------------------------------------------------
@given(limit=st.integers(1, 5000))
def test_bucket_ladder_covers_every_size_with_little_padding(limit):
    ladder = bucket_ladder(limit)
    if limit <= 8:
        assert ladder == [b for b in (1, 2, 4, 8) if b < limit] + [limit]
    else:
        assert ladder[:4] == [1, 2, 4, 8]
    assert ladder == sorted(set(ladder)) and ladder[-1] == limit
    for n in range(1, limit + 1, max(1, limit // 300)):
        b = bucket_for(n, ladder)
        assert n <= b <= limit
        assert b - n <= max(7, n // 8 + 1), (n, b)


def test_ladder_sizes_stay_small():
    assert len(bucket_ladder(512)) <= 40 and len(bucket_ladder(8192)) <= 72
    assert bucket_for(3, bucket_ladder(64)) == 4 and bucket_for(9, bucket_ladder(64)) == 16


# -- the descriptor --------------------------------------------------------------------------
def test_descriptor_pads_into_the_scratch_block(emu):
    cap = StepCapacity(tokens=16, seqs=4, rows=4, history=8)
    d = StepDescriptor(emu, cap, width=6, block_size=4, scratch_block=9)
    batch = Batch.build([SeqChunk([5, 6, 7], 0, [2]), SeqChunk([8], 4, [3, 1])], 4)
    nbytes = d.pack(batch, 8, 2, SamplingRows.greedy(2))
    h = d.h
    assert h["token_ids"][:8].tolist() == [5, 6, 7, 8, 0, 0, 0, 0]
    assert h["positions"][:8].tolist() == [0, 1, 2, 4, 0, 0, 0, 0]
    assert h["slot_mapping"][:8].tolist() == [8, 9, 10, 4, 36, 36, 36, 36]  # pads: scratch block 9, slot 0
    # two real sequences, two empty ones, then the padding sequence (index 4) holding tokens 4..7
    assert h["cu_seqlens"].tolist() == [0, 3, 4, 4, 4, 8]
    assert d.tables[4, 0] == 9 and d.tables[:2, :2].tolist() == [[2, -1], [3, 1]]
    assert nbytes == d.fields["block_tables"].offset + 2 * 6 * 4  # the copy stops after the live rows
    d.upload(nbytes)
    assert np.array_equal(d.device[:nbytes], d.host[:nbytes])


# -- capacity ----------------------------------------------------------------------------------
def test_capacity_grows_until_frozen(emu):
    fp = ForwardPass(_model(), emu, capacity=StepCapacity(4, 1, 1, 4))
    pool = KVPool(emu, fp.cfg, num_blocks=16, block_size=4)
    run = PagedRunner(fp, pool)
    run.step([(run.new_seq(), list(range(10))), (run.new_seq(), [3, 4])], all_logits=True)
    assert fp.capacity.tokens >= 12 and fp.capacity.seqs >= 2 and fp.capacity.rows >= 12
    fp.freeze()
    with pytest.raises(BackendError, match="exceeds the frozen capacity"):
        run.step([(run.new_seq(), list(range(40)))], all_logits=True)


# -- the penalty history on the device ----------------------------------------------------------
def _penalised_greedy(fp, prompt, steps, penalty=1.5):
    """Greedy with a repetition penalty, one sequence: the device's tokens and the host's."""
    pool = KVPool(fp.backend, fp.cfg, num_blocks=32, block_size=4)
    run = PagedRunner(fp, pool)
    sid, toks, synced, got, want = run.new_seq(), list(prompt), 0, [], []
    feed = list(prompt)
    for i in range(steps):
        params = np.array([[0.0, 1.0, 0.0, penalty, 0.0, 0.0]], np.float32)
        adds = toks[synced:]
        rows = SamplingRows(params, np.zeros(1, np.int32), np.zeros(1, np.uint64), np.array([i], np.int32),
                            np.zeros(1, np.int32), np.array([int(synced == 0)], np.int32),
                            np.array([0, len(adds)], np.int32), np.array(adds, np.int32))
        synced = len(toks)
        logits = run.step([(sid, feed)], sampling=rows)[0][-1]
        want.append(int(np.argmax(apply_repetition_penalty(logits, toks, penalty))))
        got.append(int(run.last_sampled[0]))
        toks.append(got[-1])
        feed = [got[-1]]
    return got, want


def test_penalty_history_lives_on_the_device_across_steps(emu):
    fp = ForwardPass(_model(), emu, capacity=StepCapacity(64, 2, 2, 64))
    prompt = [7, 7, 9, 11, 7, 300, 9, 42] * 3
    got, want = _penalised_greedy(fp, prompt, 10)
    assert got == want


def test_history_overflow_is_flushed_with_its_own_launch(emu):
    """More new ids than the step's history buffer (a long prompt's first sample): set before the step."""
    small = ForwardPass(_model(), emu, capacity=StepCapacity(64, 2, 2, 4))
    prompt = [7, 7, 9, 11, 7, 300, 9, 42] * 3
    got, want = _penalised_greedy(small, prompt, 6)
    assert got == want
    roomy = ForwardPass(_model(), emu, capacity=StepCapacity(64, 2, 2, 64))
    assert got == _penalised_greedy(roomy, prompt, 6)[0]
    # the first step both overflows the history and grows the buffers: the history moves over
    growing = ForwardPass(_model(), emu, capacity=StepCapacity(4, 1, 1, 4))
    assert _penalised_greedy(growing, prompt, 6)[0] == got


def test_engine_penalty_tokens_match_the_host_rule():
    """Through the engine (slots handed out and taken back, prefix cache, preemption): each greedy
    token is the argmax of its penalised logits over prompt + generated so far."""
    from sharpinf.llm import LLM

    llm = LLM(synthetic_model("llama", "Q8_0", n_embd=128), backend="emu", num_blocks=14, block_size=4,
              max_num_batched_tokens=16, max_num_seqs=3)
    rng = np.random.default_rng(4)
    prompts = [rng.integers(3, 60, 12).tolist() for _ in range(4)]
    sp = SamplingParams(max_tokens=8, repetition_penalty=1.8, ignore_eos=True)
    outs = llm.generate(prompts, [sp] * 4)
    fp = llm.engine.fp.with_own_buffers()
    for p, o in zip(prompts, outs):
        pool = KVPool(fp.backend, fp.cfg, num_blocks=8, block_size=4)
        run = PagedRunner(fp, pool)
        logits = run.prefill_chunks(p + o.token_ids, [len(p) + len(o.token_ids)])
        for i, tok in enumerate(o.token_ids):
            seen = p + o.token_ids[:i]
            assert tok == int(np.argmax(apply_repetition_penalty(logits[len(p) - 1 + i], seen, 1.8))), (i, o.token_ids)
    assert llm.metrics()["preemptions"] > 0


# -- compile ahead ---------------------------------------------------------------------------------
def test_kernels_used_names_only_this_models_entry_points(emu):
    fp = ForwardPass(load_model(synthetic_model("qwen3", "Q4_K", n_embd=256)), emu, compile_ahead=False,
                     kernels="simple")
    used = fp.kernels_used("q8_0")
    assert used == [("embedding.cu", "embed_q4_k"), ("rmsnorm.cu", "rmsnorm_f32"), ("matmul.cu", "matmul_q4_k"),
                    ("qk_norm.cu", "qk_norm_f32"), ("rope.cu", "rope_neox"), ("kv_cache.cu", "kv_append_q8_0"),
                    ("attention.cu", "attention_q8_0_d64"), ("elementwise.cu", "add_f32"),
                    ("elementwise.cu", "silu_gate_f32"), ("gather.cu", "gather_rows_f32"), ("sampling.cu", "sample_rows"),
                    ("sampling.cu", "seen_update")]
    # no argmax: the sampling kernel picks greedy tokens too, so nothing is launched for nothing
    fast = fp.with_own_buffers(kernels="fast").kernels_used("q8_0")
    assert fast == [("embedding.cu", "embed_q4_k"), ("rmsnorm_q8_1.cu", "rmsnorm_q8_1"),
                    ("matmul_dp4a.cu", "matmul_dp4a_q4_k"), ("rope_kv.cu", "rope_kv_q8_0"),
                    ("attention_split.cu", "attention_split_q8_0_d64"), ("gate_up_dp4a.cu", "gate_up_dp4a_q4_k"),
                    ("rmsnorm_q8_1.cu", "quantize_q8_1"), ("gather.cu", "gather_rows_f32"), ("sampling.cu", "sample_rows"),
                    # split attention walks a step whose blocks fill the device (the emulator: 4 blocks; 16 tokens)
                    ("attention_split.cu", "attention_split_walk_q8_0_d64"),
                    # fast's matmul (best) takes mmq from 64 tokens: the capacity's step collects it
                    ("matmul_mmq.cu", "matmul_mmq_q4_k"), ("gate_up_mmq.cu", "gate_up_mmq_q4_k"),
                    ("sampling.cu", "seen_update")]


# -- the trace backend ---------------------------------------------------------------------------
def test_trace_backend_checks_and_counts_without_running():
    from sharpinf.runtime.trace_backend import TraceBackend

    tb = TraceBackend()
    k = tb.kernel("elementwise.cu", "add_f32")
    a, b = tb.upload(np.ones(8, np.float32)), tb.upload(np.ones(8, np.float32))
    out = tb.empty((8,), np.float32)
    tb.launch(k, 1, 32, (a, b, out, np.int32(8)))
    assert tb.counts.launches == 1 and (out == 0).all()  # counted, not run
    with pytest.raises(BackendError, match="pass np.int32"):
        tb.launch(k, 1, 32, (a, b, out, 8))
    plan = [tb.prepare(k, 1, 32, (a, b, out, np.int32(8)))] * 3
    with tb.capture() as g:
        tb.run(plan)
    tb.counts.reset()
    g.replay()
    assert tb.counts.graph_replays == 1 and tb.counts.graph_launches == 3 and tb.counts.launches == 0


@settings(max_examples=60)
@given(pieces=st.lists(st.binary(max_size=4), min_size=1, max_size=25))
def test_incremental_text_equals_whole_decode(pieces):
    """The stop checker's text grows a token at a time and always equals decoding all of it."""
    from sharpinf.textgen import StopChecker

    class Tok:
        eot_ids: list[int] = []

        def token_bytes(self, i):
            return pieces[i]

    sc = StopChecker(SamplingParams(max_tokens=None), Tok(), 10**9)
    for i in range(len(pieces)):
        sc.add(i)
        assert sc.text == b"".join(pieces[: i + 1]).decode("utf-8", errors="replace")


def test_history_survives_the_buffers_growing(emu):
    """A penalised sequence's seen ids stay in its slot when a later step grows the step buffers."""
    fp = ForwardPass(_model(), emu, capacity=StepCapacity(4, 1, 1, 8))
    run = PagedRunner(fp, KVPool(emu, fp.cfg, num_blocks=16, block_size=4))
    a, b = run.new_seq(), run.new_seq()

    def rows(slots, clear, adds):
        R = len(slots)
        params = np.array([[0.0, 1.0, 0.0, 1.5 if s >= 0 else 1.0, 0.0, 0.0] for s in slots], np.float32)
        return SamplingRows(params, np.zeros(R, np.int32), np.zeros(R, np.uint64), np.zeros(R, np.int32),
                            np.array(slots, np.int32), np.array(clear, np.int32),
                            np.concatenate([[0], np.cumsum([len(x) for x in adds])]).astype(np.int32),
                            np.array([t for x in adds for t in x], np.int32))

    run.step([(a, [7, 9, 11])], sampling=rows([0], [1], [[7, 9, 11]]))
    first = int(run.last_sampled[0])
    run.step([(a, [first]), (b, list(range(20, 30)))], sampling=rows([0, -1], [0, 0], [[first], []]))
    second = int(run.last_sampled[0])
    assert fp.capacity.tokens >= 11  # it grew
    bits = emu.download(fp.slots.seen_bits)[0]
    seen = {w * 32 + i for w in range(len(bits)) for i in range(32) if bits[w] >> i & 1}
    assert seen == {7, 9, 11, first, second}  # the ids fed, and the ones the kernel sampled into the slot


def test_a_steps_longest_context_chooses_its_attention_launch_shape(emu, monkeypatch):
    """On a GPU the split frame walks or splits by the step's longest context (ops/attention.py's
    walk_pays), so the body's plan and graph are keyed by the shapes chosen. The emulator stands in for
    a GPU of 2 SMs here (4 resident blocks): a 1-token step of this model's 2 KV heads walks up to 64
    keys and splits beyond; both graphs of that bucket are captured. The logits are the bits of the
    same run with the walk forced."""
    monkeypatch.delenv("SHARPINF_ATTENTION_MODE", raising=False)
    monkeypatch.setattr(emu, "multiprocessors", 2)
    rng = np.random.default_rng(3)
    short, long = rng.integers(3, 60, 30).tolist(), rng.integers(3, 60, 70).tolist()

    def run():
        fp = ForwardPass(_model(), emu, kernels="fast", capacity=StepCapacity(72, 2, 2, 8))
        runner = PagedRunner(fp, KVPool(emu, fp.cfg, num_blocks=40, block_size=4))
        a, b = runner.new_seq(), runner.new_seq()
        out = [runner.step([(a, short)]), runner.step([(b, long)]), runner.step([(a, [5])]), runner.step([(b, [7])])]
        return fp, out

    fp, auto = run()
    assert {k for k in fp.plans if k[0] == "body" and k[1] == 1} == {("body", 1, ("walk",)), ("body", 1, ("split",))}
    monkeypatch.setenv("SHARPINF_ATTENTION_MODE", "walk")
    walked, forced = run()
    assert {k[2] for k in walked.plans if k[0] == "body"} == {("walk",)}
    for x, y in zip(auto, forced):
        np.testing.assert_array_equal(x[0].view(np.uint32), y[0].view(np.uint32))
    monkeypatch.delenv("SHARPINF_ATTENTION_MODE")
    fp.release_plans()
    fp.freeze()
    fp.capture_graphs(KVPool(emu, fp.cfg, num_blocks=40, block_size=4))
    assert {k for k in fp.graphs if k[0] == "body" and k[1] == 1} == {("body", 1, ("walk",)), ("body", 1, ("split",))}


@pytest.mark.parametrize("kernels", ["fast", "tensor"])
def test_capture_finds_every_shape_tuple_a_bucket_takes(emu, monkeypatch, kernels):
    """capture_graphs' bodies: the shape tuples of each bucket found by bisection over the contexts
    (each window's shape flips once, walks_pays) are those of every context, one by one -- gemma3's
    local and global layers, several occupancies of a pretended GPU."""
    monkeypatch.delenv("SHARPINF_ATTENTION_MODE", raising=False)
    monkeypatch.setattr(emu, "multiprocessors", 2)
    model = load_model(synthetic_model("gemma3", "Q8_0", n_embd=128, n_layer=6, sliding_window=100))
    several = 0
    for slots in (1, 3, 6, 40):
        monkeypatch.setattr(emu, "resident_blocks", lambda k, threads, shared=0, slots=slots: slots)
        fp = ForwardPass(model, emu, kernels=kernels, capacity=StepCapacity(64, 8, 8, 8), compile_ahead=False)
        d = fp._bind(KVPool(emu, fp.cfg, num_blocks=300, block_size=4), 1)
        longest = min(fp.cfg.context_length, d.width * d.block_size)
        for n in fp.token_ladder:
            every = {fp.shapes.at(n, "f16", d, k) for k in range(KV_SHAPE_KEYS, longest + 1, KV_SHAPE_KEYS)}
            assert fp.shapes.of_bucket(n, "f16", d) == sorted(every), (slots, n)
            several += len(every) > 1
    assert several  # some bucket takes both shapes (else this shows nothing)


def test_capture_bisection_finds_flips_a_context_apart(emu, monkeypatch):
    """Two windows whose shapes flip one context step apart (96 and 128 keys) and a third far off: the
    bisection finds all four tuples (contexts doubling from 32 would miss the one at 96)."""
    fp = ForwardPass(_model(), emu, kernels="fast", capacity=StepCapacity(8, 2, 2, 8), compile_ahead=False)
    d = fp._bind(KVPool(emu, fp.cfg, num_blocks=256, block_size=4), 1)
    flips = (96, 128, 800)
    monkeypatch.setattr(fp.shapes, "at", lambda n, kv_dtype, d, keys: tuple(
        "walk" if keys < at else "split" for at in flips))
    assert d.width * d.block_size >= 1000 and fp.cfg.context_length >= 1000
    assert fp.shapes.of_bucket(1, "f16", d) == sorted({("walk",) * 3, ("split", "walk", "walk"),
                                                        ("split", "split", "walk"), ("split",) * 3})
