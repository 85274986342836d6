"""Async scheduling (EngineConfig.async_scheduling): step n+1 is scheduled and submitted before
step n's ids are back, its decode tokens fed on the device from step n's sampled ids. The
emulator is synchronous, so these prove exactness, not overlap: the token streams equal the
synchronous engine's, request by request, through every case that can go wrong in flight (a
stop while the next step holds the sequence, max_tokens known ahead, preemption, prefix caching,
chunked prefill, penalties, logprobs, an abort). A unit test shows the double-buffered
staging lets step n+1 be packed before step n's result is taken."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from sharpinf.engine.llm_engine import LLMEngine
from sharpinf.engine.sequence import PENDING
from sharpinf.model.registry import open_model
from sharpinf.model.synth import synthetic_model
from oracles.accounting import check_accounting, ledger
from oracles.scheduler_invariants import watch
from sharpinf.params import SamplingParams
from sharpinf.step.batch import Batch, SeqChunk
from sharpinf.step.buffers import SamplingRows, StepCapacity
from sharpinf.step.forward import ForwardPass
from sharpinf.step.kv_pool import KVPool

CONFIG = dict(num_blocks=8, block_size=4, max_num_batched_tokens=8, max_num_seqs=6)


@functools.cache
def model():
    return synthetic_model("llama", "Q8_0", n_embd=128)


def _prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 400, n).tolist()


@functools.cache
def _stops() -> tuple[int, str]:
    """A stop id and a stop string that the greedy stream of prompt A hits mid-way."""
    eng = LLMEngine(model(), backend="emu", async_scheduling=False, **CONFIG)
    eng.add_request(_prompt(1, 10), SamplingParams(max_tokens=8, ignore_eos=True))
    while eng.has_unfinished():
        eng.step()
    seq = eng.requests["0"]
    return seq.output_ids[3], seq.stop.text[2:5]


def workload() -> tuple[list[tuple[list[int], SamplingParams]], int]:
    """(prompt, params) per request, and the index of the one aborted after its second token."""
    stop_id, stop_text = _stops()
    a = _prompt(1, 10)
    return [
        (a, SamplingParams(max_tokens=8, ignore_eos=True)),
        (_prompt(2, 13), SamplingParams(max_tokens=8, temperature=0.9, top_p=0.9, seed=7, ignore_eos=True)),
        (a[:8] + _prompt(3, 5), SamplingParams(max_tokens=10, temperature=0.7, repetition_penalty=1.3, seed=3,
                                               ignore_eos=True)),  # shares two blocks with a: prefix cache
        (a, SamplingParams(max_tokens=8, stop_token_ids=(stop_id,), ignore_eos=True)),
        (a, SamplingParams(max_tokens=8, stop=(stop_text,), ignore_eos=True)),
        (_prompt(4, 6), SamplingParams(max_tokens=6, temperature=0.8, seed=11, logprobs=3, ignore_eos=True)),
        (_prompt(5, 9), SamplingParams(max_tokens=12, ignore_eos=True)),  # aborted
        (_prompt(6, 20), SamplingParams(max_tokens=7, repetition_penalty=1.5, ignore_eos=True)),  # chunked
    ], 6


def run(async_scheduling: bool, plant=None) -> tuple[dict, LLMEngine, list[str], dict]:
    """Every request's (output ids, finish reason, text, logprobs) and the engine; the scheduler's
    rules are checked at each step and the accounting oracle at the end (its problems returned)."""
    eng = LLMEngine(model(), backend="emu", async_scheduling=async_scheduling, **CONFIG)
    if plant is not None:
        plant(eng)
    watch(eng)
    counts = ledger(eng)
    preempt, eng.pending_at_preemption = eng.scheduler._preempt, []

    def noting(victim):
        eng.pending_at_preemption.append(victim.pending)
        preempt(victim)
    eng.scheduler._preempt = noting
    reqs, aborted = workload()
    rids = [eng.add_request(p, sp) for p, sp in reqs]
    seqs = {r: eng.requests[r] for r in rids}
    logprobs: dict = {r: [] for r in rids}
    emitted = {r: 0 for r in rids}
    while eng.has_unfinished():
        for o in eng.step():
            logprobs[o.request_id] += [(lp.token_id, lp.logprob, lp.top) for lp in o.new_logprobs or []]
            emitted[o.request_id] += len(o.new_token_ids)
        assert not [e for e in eng.blocks.info.values() if PENDING in e.tokens], "a block was cached before its ids were real"
        victim = rids[aborted]
        if emitted[victim] == 2 and not seqs[victim].is_finished:  # after its second token, in both modes
            inflight = eng._inflight
            eng.aborted_in_flight = inflight is not None and any(c.seq.request_id == victim for c in inflight.chunks)
            eng.abort(victim)
    out = {r: (s.output_ids, s.finish_reason, s.stop.text, logprobs[r]) for r, s in seqs.items()}
    return out, eng, check_accounting(eng, counts, seqs), counts


def test_async_scheduling_gives_the_synchronous_engines_tokens():
    sync, _, sync_problems, _ = run(False)
    got, eng, problems, counts = run(True)
    assert not sync_problems and not problems, (sync_problems + problems)[:5]
    for rid in sync:
        assert got[rid] == sync[rid], f"request {rid}: async {got[rid][:2]} != sync {sync[rid][:2]}"
    reasons = [v[1] for v in got.values()]
    assert reasons.count("stop") == 2 and reasons.count("aborted") == 1 and "length" in reasons
    assert got["5"][3] and len(got["5"][3]) == len(got["5"][0])  # logprobs for every token
    # the cases in flight were exercised, not skipped
    assert eng.runner.tokens_fed > 0, "no token was fed on the device"
    assert eng.scheduler.preemptions > 0 and eng.blocks.hit_tokens > 0
    assert any(eng.pending_at_preemption), "no sequence was preempted with its token in flight"
    assert eng.aborted_in_flight, "the abort did not land while its request was in the step in flight"
    stopped = [r for r, v in got.items() if v[1] == "stop"]
    assert any(counts[(r, len(eng.requests[r].tokens) - 1)] for r in stopped), \
        "no stop was seen while the sequence was already in the next step"
    assert eng.blocks.num_free == eng.blocks.num_blocks and eng._inflight is None


def _feed_row_zero(eng: LLMEngine) -> None:
    """The plant: every token fed on the device takes row 0 of the previous step's ids."""
    fp_submit = eng.runner.fp.submit

    def wrong_row(batch, kv, *args, feed_rows=None, **kw):
        if feed_rows is not None:
            feed_rows = np.where(feed_rows >= 0, 0, -1).astype(np.int32)
        return fp_submit(batch, kv, *args, feed_rows=feed_rows, **kw)

    eng.runner.fp.submit = wrong_row


def test_a_wrong_feed_row_is_caught():
    """The negative control: feeding each pending token from the wrong row of the previous step's
    ids changes the streams, and the accounting oracle names the position fed a wrong id."""
    sync, _, _, _ = run(False)
    got, _, problems, _ = run(True, plant=_feed_row_zero)
    assert any(got[r][0] != sync[r][0] for r in sync)
    assert any("was fed id" in p for p in problems), problems[:3]


def test_double_buffered_staging_packs_the_next_step_before_the_last_result(emu, monkeypatch):
    """submit(n+1) waits for no marker step n recorded (it packs into the other staging buffer),
    result(n) waits for step n's own marker only, and the decode token fed on the device from step
    n's sampled id gives the bits of feeding that id from the host."""
    log, ids = [], iter(range(1 << 30))
    monkeypatch.setattr(emu, "marker", lambda: f"m{next(ids)}", raising=False)
    monkeypatch.setattr(emu, "record", lambda m: log.append(("record", m)), raising=False)
    monkeypatch.setattr(emu, "wait", lambda m: log.append(("wait", m)), raising=False)
    fp = ForwardPass(open_model(model()), emu, capacity=StepCapacity(16, 2, 2, 16))
    pool = KVPool(emu, fp.cfg, num_blocks=8, block_size=4)
    prompt = _prompt(1, 6)
    first = Batch.build([SeqChunk(prompt, 0, [0, 1])], 4)
    p1 = fp.submit(first, pool, sampling=SamplingRows.greedy(1))
    recorded_by_1 = {m for op, m in log if op == "record"}
    at = len(log)
    decode = Batch.build([SeqChunk([0], 6, [0, 1])], 4)  # id 0: a placeholder, fed from row 0 of step 1
    p2 = fp.submit(decode, pool, sampling=SamplingRows.greedy(1), feed_rows=np.zeros(1, np.int32))
    waited = {m for op, m in log[at:] if op == "wait"}
    assert not waited & recorded_by_1, f"packing step 2 waited for step 1: {sorted(waited & recorded_by_1)}"
    at = len(log)
    tok = int(p1.result().sampled[0])
    assert log[at:] == [("wait", p1.done)], "result(1) waits for step 1's marker, nothing else"
    fed = p2.result()
    assert int(emu.download(fp.descriptor.d["token_ids"])[0]) == tok, "the embedding writes the fed id back"
    ref = fp.with_own_buffers(StepCapacity(16, 2, 2, 16))
    ref_pool = KVPool(emu, fp.cfg, num_blocks=8, block_size=4)
    ref.forward(first, ref_pool, sampling=SamplingRows.greedy(1))
    want = ref.forward(Batch.build([SeqChunk([tok], 6, [0, 1])], 4), ref_pool, sampling=SamplingRows.greedy(1))
    assert np.array_equal(emu.download(fed.logits).view(np.uint32), emu.download(want.logits).view(np.uint32))
    assert fed.sampled.tolist() == want.sampled.tolist()


def test_a_sequence_preempted_with_its_token_in_flight_waits_for_it():
    """A waiting sequence whose last token is still PENDING (preempted while the step sampling it
    runs) is not re-admitted until the token is real: its history and hashes are rebuilt from ids."""
    from sharpinf.engine.block_manager import BlockManager
    from sharpinf.engine.config import EngineConfig
    from sharpinf.engine.scheduler import Scheduler
    from sharpinf.engine.sequence import Sequence
    from sharpinf.textgen import StopChecker

    sp = SamplingParams(max_tokens=8, ignore_eos=True)
    sch = Scheduler(EngineConfig(block_size=4, max_num_batched_tokens=16), BlockManager(8, 4))
    seq = Sequence("a", [5, 6, 7], sp, 0, StopChecker(sp, None, context_left=100))
    seq.tokens.append(PENDING)
    seq.pending, seq.feed_row = 1, 0
    sch.add(seq)
    assert sch.schedule() == [] and list(sch.waiting) == [seq]
    seq.tokens[-1], seq.pending, seq.feed_row = 9, 0, -1  # the step was collected
    (chunk,) = sch.schedule()
    assert chunk.seq is seq and chunk.n_tokens == 4


def test_a_grammar_runs_every_step_its_mask_sent_once_its_token_is_in():
    """A constrained request under async scheduling is in every step of its decode: step n+1 is
    submitted with its masks to come, and they are computed once step n's token is in (while the
    device runs n+1's body). Its tokens equal the synchronous engine's, a document ending by itself
    while the next step holds it too."""
    pytest.importorskip("llguidance")
    from sharpinf.params import StructuredOutput

    spec = StructuredOutput("regex", "(ab|cd){1,3} [0-9]{3}")  # a document of a bounded length
    params = [SamplingParams(max_tokens=40, temperature=1.0, seed=s, structured=spec) for s in (1, 2)]
    params.append(SamplingParams(max_tokens=12, ignore_eos=True))  # unconstrained, beside them

    def go(async_scheduling: bool):
        eng = LLMEngine(model(), backend="emu", async_scheduling=async_scheduling,
                        **{**CONFIG, "num_blocks": 48, "max_num_batched_tokens": 16})
        rids = [eng.add_request(_prompt(7 + i, 6), p) for i, p in enumerate(params)]
        steps: dict = {r: [] for r in rids}  # the steps each request was submitted in
        submit = eng.runner.submit

        def noting(chunks):
            for c in chunks:
                steps[c.seq.request_id].append(eng.runner.steps_run)
            return submit(chunks)
        eng.runner.submit = noting
        while eng.has_unfinished():
            eng.step()
        return {r: (eng.requests[r].output_ids, eng.requests[r].finish_reason) for r in rids}, steps, eng

    sync, _, _ = go(False)
    got, steps, eng = go(True)
    assert got == sync
    constrained = [r for r, p in zip(got, params) if p.structured is not None]
    assert all(got[r][1] == "stop" for r in constrained)  # the regex completes the document
    for r in constrained:  # one prefill step, then a step for every token: none skipped waiting for its id
        assert steps[r] == list(range(steps[r][0], steps[r][0] + len(steps[r]))), steps[r]
        assert len(steps[r]) > len(got[r][0])  # the step after its last token held it too (its sample discarded)
    assert eng.scheduler.preemptions == 0 and eng._inflight is None
