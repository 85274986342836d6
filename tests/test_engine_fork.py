"""Choices (SamplingParams.n > 1): the prompt computed once, its KV blocks shared by reference
count, copied only when a choice first appends into a block another choice still holds
(engine/fork.py, BlockManager.fork / reserve). The oracle: choice i of a request equals a request
of n = 1 with seed choice_seed(seed, i) -- token for token, logprobs and all -- however the
choices are scheduled, preempted or recomputed; and the pool's accounting holds every step."""

from __future__ import annotations

import pytest

from sharpinf.engine.block_manager import BlockManager
from sharpinf.engine.sequence import Sequence
from sharpinf.errors import RequestError
from sharpinf.llm import LLM
from sharpinf.model.synth import synthetic_model
from sharpinf.ops.sampling import choice_seed
from oracles.accounting import check_accounting, ledger
from sharpinf.params import SamplingParams

BS = 16


@pytest.fixture(scope="module")
def model():
    return synthetic_model("llama", "Q8_0", n_embd=128)


def _llm(model, **kw):
    return LLM(model, backend="emu", kernels="simple", block_size=BS, **{"num_blocks": 64, **kw})


def _alone(llm, prompt, p: SamplingParams, n: int):
    """What each choice must be: n requests of one choice, seeded choice_seed(seed, i)."""
    fields = {k: getattr(p, k) for k in p.__dataclass_fields__ if k not in ("n", "seed")}
    seed = 0 if p.seed is None else p.seed  # (no seed: a greedy request, where it does not matter)
    return [llm.generate([prompt], SamplingParams(**fields, seed=choice_seed(seed, i), n=1))[0] for i in range(n)]


@pytest.mark.parametrize("prompt_len,penalty", [(21, 1.0), (32, 1.3)])  # a shared partial block; whole blocks
def test_each_choice_equals_a_request_of_one_with_its_seed(model, prompt_len, penalty):
    llm = _llm(model)
    prompt = list(range(3, 3 + prompt_len))
    p = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, seed=5, n=4, ignore_eos=True, logprobs=2,
                       repetition_penalty=penalty)
    got = llm.generate([prompt], p)[0]
    assert len(got.choices) == 4 and got.token_ids == got.choices[0].token_ids
    want = _alone(llm, prompt, p, 4)
    for i, (g, w) in enumerate(zip(got.choices, want)):
        assert g.token_ids == w.token_ids and g.text == w.text and g.finish_reason == w.finish_reason, i
    assert len({tuple(c.token_ids) for c in got.choices}) > 1, "the choices are seeded apart"
    b = llm.engine.blocks
    full, partial = prompt_len // BS, prompt_len % BS > 0
    assert b.forked_blocks == 3 * (full + partial)  # every prompt block shared with the 3 forked choices
    assert b.copied_blocks == (3 if partial else 0)  # the shared partial block: copied by all but its last holder
    assert b.num_free == b.num_blocks


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_choices_survive_preemption_under_a_tiny_pool(model, async_scheduling):
    """Choices and plain requests through a pool too small for all of them at once: forked
    choices are preempted (they are the youngest), recomputed, and still equal their single runs;
    the accounting oracle holds (each position computed once per admission, every block back).
    With async scheduling the choices fork when their parent's step is collected, a step later."""
    llm = _llm(model, num_blocks=12, max_num_seqs=8, max_num_batched_tokens=32, async_scheduling=async_scheduling)
    eng = llm.engine
    prompts = [list(range(5, 5 + 19)), list(range(40, 40 + 9)), list(range(60, 60 + 30))]
    ps = [SamplingParams(max_tokens=24, temperature=0.8, seed=11, n=3, ignore_eos=True),
          SamplingParams(max_tokens=20, temperature=0.0, n=2, ignore_eos=True),
          SamplingParams(max_tokens=16, temperature=0.7, seed=2, ignore_eos=True)]
    counts = ledger(eng)
    rids = [eng.add_request(pr, p) for pr, p in zip(prompts, ps)]
    while eng.has_unfinished():
        eng.step()
    assert eng.scheduler.preemptions > 0, "the pool must be too small for everything at once"
    seqs = {s.key: s for r in rids for s in (eng.requests[r].choices or [eng.requests[r]])}
    assert len(seqs) == 3 + 2 + 1
    assert check_accounting(eng, counts, seqs) == []
    for prompt, p, r in zip(prompts, ps, rids):
        want = _alone(llm, prompt, p, p.n)
        assert [s.output_ids for s in eng.requests[r].choices or [eng.requests[r]]] == [w.token_ids for w in want]


def test_a_stream_of_choices_and_its_end(model):
    llm = _llm(model)
    p = SamplingParams(max_tokens=6, temperature=1.0, seed=3, n=3, ignore_eos=True)
    deltas = list(llm.stream("hello there", p))
    assert sorted({d.index for d in deltas}) == [0, 1, 2]
    assert [d.all_done for d in deltas].count(True) == 1 and deltas[-1].all_done
    for i in range(3):
        mine = [d for d in deltas if d.index == i]
        assert sum(len(d.new_token_ids) for d in mine) == 6 and mine[-1].finished


def test_n_beyond_max_num_seqs_is_one_clear_error(model):
    llm = _llm(model, max_num_seqs=4)
    with pytest.raises(RequestError, match="max_num_seqs"):
        llm.engine.add_request("hi", SamplingParams(n=5))
    out = llm.generate(["hi"], SamplingParams(n=5))[0]
    assert out.finish_reason == "rejected" and "n = 5" in out.error
    with pytest.raises(RequestError, match="n must be"):
        SamplingParams(n=0)


def test_fork_shares_the_computed_blocks_and_copies_on_first_write():
    """BlockManager alone: a fork takes the blocks of the positions computed so far (not a block the
    parent already took for its next position), and the first write into a shared block gets a
    fresh one -- copied when it holds earlier positions, not when the write starts it."""
    def seq(n):
        return Sequence("r", list(range(n)), SamplingParams(), 0, None)

    for computed in (6, 8):  # the write at `computed` lands in a shared block / starts a new one
        bm = BlockManager(8, 4, enable_prefix_caching=False)
        parent, child = seq(computed), seq(computed)
        assert bm.admit(parent, computed) and bm.reserve(parent, computed + 1)  # and its next position's block
        parent.num_computed = computed
        p = list(parent.block_table)
        bm.fork(parent, child, computed)
        assert child.block_table == p[:2] and child.num_computed == computed
        assert bm.reserve(child, computed + 1)
        fresh = child.block_table[-1]
        assert fresh not in p
        if computed == 6:  # block 1 holds positions 4, 5: copied, then the child's own
            assert child.block_table == [p[0], fresh] and bm.take_copies() == [(p[1], fresh)]
            assert [bm.ref[b] for b in (p[0], p[1], fresh)] == [2, 1, 1]
        else:  # blocks 0 and 1 stay shared; position 8 starts a block of its own (not the parent's p[2])
            assert child.block_table == [p[0], p[1], fresh] and bm.take_copies() == []
            assert [bm.ref[b] for b in (p[0], p[1], p[2], fresh)] == [2, 2, 1, 1]
        bm.release(child)
        bm.release(parent)
        assert bm.num_free == 8 and not any(bm.ref)


def test_choices_with_penalties_bias_and_a_grammar_equal_their_single_runs(model):
    """Each choice has its own slot (generated counts, logit_bias) and its own copy of the grammar's
    matcher from the fork on: still the stream of a request of one with its seed."""
    from sharpinf.params import StructuredOutput

    llm = _llm(model)
    prompt = list(range(9, 9 + 18))
    p = SamplingParams(max_tokens=16, temperature=1.0, seed=21, n=3, presence_penalty=0.8, frequency_penalty=0.4,
                       logit_bias={7: 2.0}, structured=StructuredOutput("json_object"))
    got = llm.generate([prompt], p)[0]
    want = _alone(llm, prompt, p, 3)
    assert [c.token_ids for c in got.choices] == [w.token_ids for w in want]
    assert [c.text for c in got.choices] == [w.text for w in want] and len({c.text for c in got.choices}) > 1
    assert all(c.text.startswith("{") for c in got.choices)  # the grammar held in every choice
