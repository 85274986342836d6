"""Nothing lost, one clear error: the engine under hostile and concurrent use (issue 11).

Each test names the failure it guards against; the scheduler's rules and the accounting
oracle are checked at every step of randomized workloads (oracles/scheduler_invariants.py,
oracles/accounting.py)."""

from __future__ import annotations

import functools
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oracles.accounting import check_accounting, ledger
from oracles.engine_oracles import LoneRun, agrees, run_alone
from oracles.scheduler_invariants import watch
from sharpinf.errors import EngineStuck, RequestError
from sharpinf.llm import LLM
from sharpinf.model.synth import synthetic_model
from sharpinf.params import SamplingParams

GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)


@functools.cache
def model():
    return synthetic_model("llama", "Q8_0", n_embd=128)


def make_llm(**cfg) -> LLM:
    return LLM(model(), backend="emu", **cfg)


_lone: dict = {}


def lone(llm: LLM, prompt: list[int], sp: SamplingParams = GREEDY) -> LoneRun:
    key = (tuple(prompt), sp)
    if key not in _lone:
        _lone[key] = run_alone(llm.engine.fp.with_own_buffers(), llm.tokenizer, prompt, sp, 4)
    return _lone[key]


def assert_alone(llm: LLM, prompt, tokens, sp=GREEDY) -> None:
    ok, note = agrees(tokens, lone(llm, list(prompt), sp))
    assert ok, note


# -- 1. admission with a prefix-cache hit ---------------------------------------------------------
@pytest.mark.parametrize("chunked", [True, False])
def test_a_prefix_hit_admits_a_request_that_fits(chunked):
    """A pool of 4 blocks of 16; a 40-token prompt, then a 50-token one sharing its first 40 tokens
    with max_tokens 14 (64 tokens: exactly the pool). Admission used to count the cached blocks
    twice, the step raised "no progress" and the LLM stayed broken."""
    llm = make_llm(num_blocks=4, block_size=16, enable_chunked_prefill=chunked)
    rng = np.random.default_rng(0)
    a = rng.integers(3, 500, 40).tolist()
    b = a + rng.integers(3, 500, 10).tolist()
    assert llm.generate([a], SamplingParams(max_tokens=4, ignore_eos=True))[0].finish_reason == "length"
    out = llm.generate([b], SamplingParams(max_tokens=14, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 14
    assert out.metrics["cached_prompt_tokens"] == 32  # two full blocks of a, served from the cache
    assert llm.generate([a], SamplingParams(max_tokens=2))[0].finish_reason in ("length", "stop")  # still usable


def test_an_unschedulable_request_is_rejected_with_its_reason(monkeypatch):
    """Should a request that can never fit reach the queue, it is rejected with the reason and the
    others run; the engine never raises a generic "no progress"."""
    llm = make_llm(num_blocks=4, block_size=4)
    monkeypatch.setattr(llm.engine, "check", lambda ids, params: None)  # a gap in the submission checks
    outs = llm.generate([[5] * 30, [6] * 5], SamplingParams(max_tokens=3, ignore_eos=True))
    assert outs[0].finish_reason == "rejected" and "needs 8 KV blocks" in outs[0].error
    assert outs[1].finish_reason == "length" and len(outs[1].token_ids) == 3
    assert llm.metrics()["rejected"] == 1


# -- 1b. a lost or stalled request fails fast, never hangs -------------------------------------------
def _drop_second_add(sch):
    add = sch.add
    sch.add = lambda seq: None if seq.request_id == "1" else add(seq)  # queued by the engine, never by the scheduler


def _drop_running_after_a_step(sch):
    schedule = sch.schedule

    def dropping():
        if sch.step_index == 2:
            sch.running.pop()  # silently: not finished, not preempted, its blocks still held
        return schedule()
    sch.schedule = dropping


def _never_mark_finished(sch):
    finish = sch.finish

    def forgetful(seq):
        status = seq.status
        finish(seq)
        seq.status = status  # the engine thinks it ended it; the request never reads as finished
    sch.finish = forgetful


def _thrash(sch):
    schedule = sch.schedule

    def thrashing():
        for s in list(sch.running):  # everyone preempted before every step: work done, nothing sampled
            sch._preempt(s)
        return schedule()
    sch.schedule = thrashing


@pytest.mark.timeout(60)
@pytest.mark.parametrize("plant,match", [
    (_drop_second_add, r"lost track of requests: 1 request\(s\) neither finished, waiting nor running: 1 \(waiting"),
    (_drop_running_after_a_step, r"lost track of requests: 1 request\(s\) .*\(running, \d+/\d+ computed"),
    (_never_mark_finished, r"nothing left to run but 2 awaited request\(s\) never finished: 0 \(running, "
                           r"0/18 computed, 6 generated"),
    (_thrash, r"65 steps without a sampled token .* needs at most 32\) with 2 pending: 0 \(running, 4/12 computed, "
              r"0 generated, 6[45] preemptions\)"),  # 65: async scheduling has scheduled one step ahead
], ids=["never-queued", "dropped-running", "never-finished", "thrash"])
def test_a_lost_or_stalled_request_raises_instead_of_hanging(plant, match):
    """A scheduler bug that loses a request (never queued, dropped while running), never marks it
    finished, or thrashes without progress: LLM.generate raises EngineStuck naming the request and
    its state within the watchdog's bound (2 x token_limit quiet steps), and the LLM stays usable."""
    llm = make_llm(num_blocks=8, block_size=4, max_num_batched_tokens=4, enable_prefix_caching=False)
    plant(llm.engine.scheduler)
    prompts = [list(range(3, 15)), list(range(20, 32))]
    with pytest.raises(EngineStuck, match=match):
        llm.generate(prompts, GREEDY)
    eng = llm.engine
    assert eng.watchdog.limit == 64 and eng.watchdog.quiet <= 65
    assert not eng.live and not eng.requests and eng.blocks.num_free == 8  # generate ended its requests
    eng.scheduler = type(eng.scheduler)(eng.config, eng.blocks, on_release=eng.runner.release)  # the bug gone
    out = llm.generate(prompts, GREEDY)
    assert [o.finish_reason for o in out] == ["length", "length"], [o.error for o in out]


@pytest.mark.timeout(60)
def test_a_lost_request_fails_a_stream_and_an_engine_loop():
    """The same guard under LLM.stream and under a bare engine loop (the oracles' kind): a request
    the scheduler dropped ends both with EngineStuck, not a wait that never returns."""
    llm = make_llm(num_blocks=8, block_size=4, max_num_batched_tokens=4)
    _drop_running_after_a_step(llm.engine.scheduler)
    with pytest.raises(EngineStuck, match=r"neither finished, waiting nor running: 0 \(running"):
        list(llm.stream(list(range(3, 15)), GREEDY))
    eng = make_llm(num_blocks=8, block_size=4).engine
    _drop_second_add(eng.scheduler)
    eng.add_request([5, 6, 7], GREEDY)
    eng.add_request([8, 9], GREEDY)
    with pytest.raises(EngineStuck, match=r"1 \(waiting, 0/2 computed"):
        while eng.has_unfinished():
            eng.step()


# -- 2. streams ------------------------------------------------------------------------------------
def test_interleaved_streams_each_get_every_token_and_their_finish():
    llm = make_llm(num_blocks=32, block_size=4, max_num_batched_tokens=16)
    prompts = [[11, 12, 13, 14, 15], [21, 22, 23], [31] * 9]
    sps = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (7, 3, 5)]
    streams = [llm.stream(p, sp) for p, sp in zip(prompts, sps)]
    got: list[list] = [[] for _ in streams]
    live = set(range(len(streams)))
    while live:
        for i in sorted(live):  # advanced in turn: every step serves all three
            try:
                got[i].append(next(streams[i]))
            except StopIteration:
                live.discard(i)
    for deltas, p, sp in zip(got, prompts, sps):
        tokens = [t for d in deltas for t in d.new_token_ids]
        assert len(tokens) == sp.max_tokens and deltas[-1].finished and deltas[-1].finish_reason == "length"
        assert not any(d.finished for d in deltas[:-1])
        assert_alone(llm, p, tokens, sp)
    assert llm.engine.blocks.num_free == llm.engine.blocks.num_blocks


# -- 3. threads ------------------------------------------------------------------------------------
def test_one_llm_shared_by_threads():
    """Six threads generate and stream at once on a pool that forces preemption: each gets its
    own requests' tokens, as alone, and every block comes back."""
    llm = make_llm(num_blocks=12, block_size=4, max_num_batched_tokens=16, max_num_seqs=4)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 500, int(rng.integers(3, 20))).tolist() for _ in range(12)]
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def work(t: int):
        try:
            mine = list(range(t, 12, 6))
            if t % 2:
                for i in mine:
                    results[i] = [tok for d in llm.stream(prompts[i], GREEDY) for tok in d.new_token_ids]
            else:
                for i, out in zip(mine, llm.generate([prompts[i] for i in mine], GREEDY)):
                    results[i] = out.token_ids
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not errors, errors
    assert sorted(results) == list(range(12))
    for i, p in enumerate(prompts):
        assert_alone(llm, p, results[i])
    b = llm.engine.blocks
    assert b.num_free == b.num_blocks and not any(b.ref) and not llm.engine.requests


# -- 4. per-request outcomes, prompts of any shape --------------------------------------------------
def test_bad_requests_are_rejected_counted_and_the_rest_run():
    llm = make_llm(num_blocks=32, block_size=4)
    outs = llm.generate([[1, 2, 3], [], [1, 99999], np.array([4, 5, 6])], GREEDY)
    assert [o.finish_reason for o in outs] == ["length", "rejected", "rejected", "length"]
    assert "empty prompt" in outs[1].error and "out of range" in outs[2].error
    assert llm.metrics()["rejected"] == 2 and llm.metrics()["finished"] == 2


def test_numpy_prompts_and_none():
    llm = make_llm(num_blocks=32, block_size=4)
    one = llm.generate(np.array([4, 5, 6], np.int64), GREEDY)
    assert len(one) == 1 and one[0].prompt_ids == [4, 5, 6]
    two = llm.generate(np.array([[4, 5], [6, 7]], np.int32), GREEDY)
    assert [o.prompt_ids for o in two] == [[4, 5], [6, 7]]
    with pytest.raises(RequestError, match="prompts is None"):
        llm.generate(None)


# -- 5. the scheduler's rules and the accounting, under random load ---------------------------------
@st.composite
def workloads(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**16), label="seed"))
    shared = rng.integers(3, 500, 24).tolist()  # a prefix some prompts share
    n = draw(st.integers(2, 12), label="requests")
    prompts = []
    for _ in range(n):
        own = rng.integers(3, 500, int(rng.integers(1, 30))).tolist()
        prompts.append(shared[: int(rng.integers(0, 25))] + own if rng.random() < 0.5 else own)
    return dict(
        prompts=prompts,
        max_tokens=[int(rng.integers(1, 8)) for _ in range(n)],
        arrivals=sorted(int(rng.integers(0, 10)) for _ in range(n)),
        aborts={i: int(rng.integers(1, 6)) for i in range(n) if rng.random() < 0.2},
        budget=draw(st.sampled_from([4, 9, 16, 64]), label="budget"),
        block_size=draw(st.sampled_from([4, 16]), label="block size"),
        spare=draw(st.integers(0, 24), label="spare blocks"),
        max_seqs=draw(st.integers(1, 6), label="max seqs"),
        chunked=draw(st.booleans(), label="chunked"),
        caching=draw(st.booleans(), label="prefix caching"),
    )


@settings(max_examples=int(__import__('os').environ.get('SOAK_EXAMPLES', 12)), suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(w=workloads())
def test_scheduler_rules_and_accounting_hold_under_random_load(w):
    bs = w["block_size"]
    need = max(-(-(len(p) + m) // bs) for p, m in zip(w["prompts"], w["max_tokens"]))
    llm = make_llm(num_blocks=need + w["spare"], block_size=bs, max_num_batched_tokens=w["budget"],
                   max_num_seqs=w["max_seqs"], enable_chunked_prefill=w["chunked"], enable_prefix_caching=w["caching"])
    eng = llm.engine
    steps = watch(eng)
    counts = ledger(eng)
    seqs, rids, at, step = {}, {}, 0, 0
    order = list(range(len(w["prompts"])))
    while at < len(order) or eng.has_unfinished():
        while at < len(order) and w["arrivals"][at] <= step:
            rid = eng.add_request(w["prompts"][at], SamplingParams(max_tokens=w["max_tokens"][at], ignore_eos=True))
            seqs[rid], rids[at] = eng.requests[rid], rid
            at += 1
        for i, when in w["aborts"].items():
            if i in rids and when == step:
                eng.abort(rids[i])
        eng.step()
        step += 1
    assert sum(steps) > 0  # the checker saw the run (idle steps, before arrivals, schedule nothing)
    problems = check_accounting(eng, counts, seqs)
    assert not problems, problems[:5]
    for i, rid in rids.items():
        s = seqs[rid]
        if s.finish_reason == "length":
            assert_alone(llm, w["prompts"][i], s.output_ids, SamplingParams(max_tokens=w["max_tokens"][i], ignore_eos=True))
        else:
            assert s.finish_reason == "aborted" and i in w["aborts"]


def _feed_one_earlier_token(runner):
    """The plant: each chunk after a sequence's first also re-feeds the token before it (its right
    id and position) where the step has room, so the step recomputes K/V the cache already holds.
    Outputs stay the same."""
    run = runner.submit

    def overfeeding(chunks):
        room = runner.fp.capacity.tokens - sum(c.n_tokens for c in chunks)
        moved = [c for c in chunks if c.seq.num_computed > 0][: max(room, 0)]
        for c in moved:
            c.seq.num_computed, c.n_tokens = c.seq.num_computed - 1, c.n_tokens + 1
        try:
            return run(chunks)
        finally:
            for c in moved:
                c.seq.num_computed, c.n_tokens = c.seq.num_computed + 1, c.n_tokens - 1
    runner.submit = overfeeding


@pytest.mark.parametrize("plant", [None, _feed_one_earlier_token], ids=["plain", "planted-refeed"])
def test_accounting_counts_what_the_forward_pass_is_given(plant):
    """No preemption, no prefix cache: the forward pass is given exactly prompt + generated - 1
    tokens per request (chunked prefill, then decodes), each position once, and the run's total is
    their sum. A runner that quietly re-feeds an earlier token is caught by the ledger, which reads
    the Batch itself, though every output is still right."""
    llm = make_llm(num_blocks=32, block_size=4, max_num_batched_tokens=8, enable_prefix_caching=False)
    eng = llm.engine
    if plant is not None:
        plant(eng.runner)
    counts = ledger(eng)  # wraps the (planted) runner: it sees the batches that runner builds
    prompts = [list(range(3, 8)), list(range(40, 53)), list(range(90, 111))]
    rids = [eng.add_request(p, GREEDY) for p in prompts]
    seqs = {r: eng.requests[r] for r in rids}
    while eng.has_unfinished():
        eng.step()
    for p, r in zip(prompts, rids):
        assert_alone(llm, p, seqs[r].output_ids)
    problems = check_accounting(eng, counts, seqs)
    if plant is not None:
        assert any("computed 2 times" in m for m in problems), problems[:5]
        return
    assert not problems, problems[:5]
    for p, r in zip(prompts, rids):
        got = sum(n for (rid, _), n in counts.items() if rid == r)
        assert got == len(p) + GREEDY.max_tokens - 1, f"request {r}: {got} tokens computed"
    assert sum(counts.values()) == counts.tokens == sum(len(p) + GREEDY.max_tokens - 1 for p in prompts)


def test_an_unknown_engine_option_is_one_line():
    from sharpinf.errors import SharpinfError

    with pytest.raises(SharpinfError, match="unknown engine option.*bogus.*max_num_seqs"):
        make_llm(bogus=1)
