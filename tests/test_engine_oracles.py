"""The engine's oracles (f)-(i) on the emulator with a tiny synthetic model (llama; each also on a
tiny qwen3moe, whose routing must not depend on what else a step holds).

(f) continuous batching gives each request what it would get alone (hypothesis draws
    arrivals, prompt lengths, max_tokens, token budgets and pool sizes);
(g) a pool of ~5% of the demand with 200 requests: all finish, none lost, same outputs;
(h) prefix caching changes nothing but the work done;
(i) a seeded sampled request gets the same tokens alone and in a busy batch.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from oracles.engine_oracles import (
    oracle_engine_vs_single_user,
    oracle_prefix_caching,
    oracle_preemption,
    oracle_seeded_sampling,
)
from sharpinf.llm import LLM
from sharpinf.model.synth import synthetic_model
from sharpinf.params import SamplingParams

MODEL = dict(arch="llama", qtype="Q8_0", n_embd=128)


# gemma3: 5 windowed layers and a global one, a window of 8 keys -- shorter than most prompts here,
# so chunks straddle its edge, decodes run past it and preempted requests recompute across it
GEMMA = dict(n_layer=6, n_head_kv=1, sliding_window=8)


# every layer windowed (2 layers, both local): blocks every window has left are freed as the
# sequences move on (BlockManager.slide)
GEMMA_LOCAL = dict(n_layer=2, n_head_kv=1, sliding_window=8)


@functools.cache
def model_path(arch="llama", qtype="Q8_0"):
    if arch == "gemma3-local":
        return synthetic_model("gemma3", qtype, n_embd=128, **GEMMA_LOCAL)
    return synthetic_model(arch, qtype, n_embd=128, **(GEMMA if arch == "gemma3" else {}))


def make_llm(arch="llama", qtype="Q8_0", **cfg) -> LLM:
    return LLM(model_path(arch, qtype), backend="emu", **cfg)


@settings(max_examples=6, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_f_engine_equals_single_user_under_random_load(data):
    n = data.draw(st.integers(1, 8), label="requests")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    prompts = [rng.integers(3, 500, int(rng.integers(1, 80))).tolist() for _ in range(n)]
    params = [SamplingParams(max_tokens=int(rng.integers(1, 10))) for _ in range(n)]
    arrivals = data.draw(st.lists(st.integers(0, 12), min_size=n, max_size=n), label="arrival steps")
    budget = data.draw(st.sampled_from([1, 7, 16, 64, 512]), label="token budget")
    block_size = data.draw(st.sampled_from([4, 16]), label="block size")
    need = max(-(-(len(p) + sp.max_tokens) // block_size) for p, sp in zip(prompts, params))
    pool = need + data.draw(st.integers(0, 40), label="spare blocks")
    llm = make_llm(num_blocks=pool, block_size=block_size, max_num_batched_tokens=budget,
                   max_num_seqs=data.draw(st.integers(1, 8), label="max seqs"))
    r = oracle_engine_vs_single_user(llm, prompts, params, arrivals)
    assert r.passed, r.detail


@pytest.mark.parametrize("kernels", ["simple", "fast"])
@pytest.mark.parametrize("arch,qtype", [("qwen2", "Q4_1"), ("qwen3", "Q5_0"), ("gemma3", "Q8_0"), ("qwen3moe", "Q4_0")])
def test_f_engine_equals_single_user_other_archs(arch, qtype, kernels):
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 500, int(rng.integers(1, 50))).tolist() for _ in range(6)]
    params = [SamplingParams(max_tokens=6) for _ in prompts]
    llm = make_llm(arch, qtype, num_blocks=40, block_size=4, max_num_batched_tokens=24, max_num_seqs=4,
                   kernels=kernels)
    r = oracle_engine_vs_single_user(llm, prompts, params, arrivals=[0, 0, 1, 3, 3, 6])
    assert r.passed, r.detail


def test_g_preemption_with_pool_at_5_percent_of_demand():
    rng = np.random.default_rng(1)
    base = [rng.integers(3, 500, int(rng.integers(4, 40))).tolist() for _ in range(20)]
    prompts = [base[i % 20] for i in range(200)]
    params = [SamplingParams(max_tokens=int(rng.integers(2, 16)), ignore_eos=True) for _ in prompts]
    bs = 4
    demand = sum(len(p) + sp.max_tokens for p, sp in zip(prompts, params))
    biggest = max(-(-(len(p) + sp.max_tokens) // bs) for p, sp in zip(prompts, params))
    blocks = max(int(0.05 * demand / bs), biggest)
    assert blocks * bs <= 0.06 * demand
    llm = make_llm(num_blocks=blocks, block_size=bs, max_num_batched_tokens=64, max_num_seqs=32,
                   enable_prefix_caching=False)
    r = oracle_preemption(llm, prompts, params)
    assert r.passed, r.detail
    m = llm.metrics()
    assert m["finished"] == 200 and m["preemptions"] > 0


@pytest.mark.parametrize("kernels", ["simple", "fast"])
def test_g_preemption_past_the_sliding_window(kernels):
    """gemma3: 40 requests longer than the window in a pool far too small; the preempted ones
    recompute their prompt and generated tokens across the window's edge and still equal alone."""
    rng = np.random.default_rng(4)
    base = [rng.integers(3, 500, int(rng.integers(10, 30))).tolist() for _ in range(8)]
    prompts = [base[i % 8] for i in range(40)]
    params = [SamplingParams(max_tokens=int(rng.integers(4, 14)), ignore_eos=True) for _ in prompts]
    llm = make_llm("gemma3", "Q8_0", num_blocks=24, block_size=4, max_num_batched_tokens=32, max_num_seqs=8,
                   enable_prefix_caching=False, kernels=kernels)
    r = oracle_preemption(llm, prompts, params)
    assert r.passed, r.detail
    assert llm.metrics()["finished"] == 40


@pytest.mark.parametrize("kernels", ["simple", "fast", "tensor"])
def test_sliding_windows_free_blocks_and_change_nothing(kernels):
    """A model whose every layer slides: blocks the windows have left go back to the pool while
    their sequences run (fed in chunks, decoded, some prompts served from the prefix cache), and
    every request still gets the tokens it gets alone. With a global layer (the 6-layer gemma3)
    nothing slides."""
    rng = np.random.default_rng(8)
    system = rng.integers(3, 500, 21).tolist()
    prompts = [system + rng.integers(3, 500, int(rng.integers(5, 40))).tolist() for _ in range(10)]
    params = [SamplingParams(max_tokens=int(rng.integers(8, 20)), ignore_eos=True) for _ in prompts]
    llm = make_llm("gemma3-local", "Q8_0", num_blocks=26, block_size=4, max_num_batched_tokens=16, max_num_seqs=6,
                   kernels=kernels)
    assert llm.engine.blocks.window == 8
    r = oracle_engine_vs_single_user(llm, prompts, params, arrivals=[0, 0, 0, 1, 2, 2, 5, 9, 9, 12])
    assert r.passed, r.detail
    blocks = llm.engine.blocks
    assert llm.metrics()["finished"] == 10 and blocks.slid > 50 and blocks.hit_tokens > 0
    assert blocks.num_free == 26 and not any(blocks.ref)
    assert make_llm("gemma3", "Q8_0", num_blocks=40, block_size=4).engine.blocks.window == 0


def test_preempted_long_prompt_over_budget_still_progresses():
    """A recompute larger than the token budget is chunked, never thrashed: everyone finishes."""
    prompts = [list(range(3, 3 + 60)), list(range(100, 110)), list(range(200, 212))]
    params = [SamplingParams(max_tokens=20, ignore_eos=True) for _ in prompts]
    llm = make_llm(num_blocks=22, block_size=4, max_num_batched_tokens=8, max_num_seqs=3, enable_prefix_caching=False)
    outs = llm.generate(prompts, params)
    assert [len(o.token_ids) for o in outs] == [20, 20, 20]
    assert llm.metrics()["preemptions"] > 0
    dog = llm.engine.watchdog  # the longest run of steps without a sampled token stays in its derived bound
    assert 0 < dog.longest <= dog.bound == 88, (dog.longest, dog.bound)


@pytest.mark.parametrize("kernels", ["simple", "fast"])
def test_g_preemption_moe(kernels):
    """qwen3moe: 24 requests in a pool at 9% of their demand; the preempted ones recompute through the router
    and the experts (a token's routing is its own: packing and recompute change no expert choice)."""
    rng = np.random.default_rng(6)
    base = [rng.integers(3, 500, int(rng.integers(4, 24))).tolist() for _ in range(6)]
    prompts = [base[i % 6] for i in range(24)]
    params = [SamplingParams(max_tokens=int(rng.integers(2, 10)), ignore_eos=True) for _ in prompts]
    llm = make_llm("qwen3moe", "Q4_0", num_blocks=12, block_size=4, max_num_batched_tokens=32, max_num_seqs=8,
                   enable_prefix_caching=False, kernels=kernels)
    r = oracle_preemption(llm, prompts, params)
    assert r.passed, r.detail
    m = llm.metrics()
    assert m["finished"] == 24 and m["preemptions"] > 0, m


@pytest.mark.parametrize("arch,qtype", [("llama", "Q8_0"), ("qwen3moe", "Q4_0")])
def test_h_prefix_caching_changes_outputs_not(arch, qtype):
    rng = np.random.default_rng(5)
    system = rng.integers(3, 500, 37).tolist()
    prompts = [system + rng.integers(3, 500, int(rng.integers(1, 20))).tolist() for _ in range(8)] + [system]
    params = [SamplingParams(max_tokens=5) for _ in prompts]
    cfg = dict(num_blocks=64, block_size=4, max_num_batched_tokens=48, max_num_seqs=4)
    r = oracle_prefix_caching(make_llm(arch, qtype, **cfg, enable_prefix_caching=True),
                              make_llm(arch, qtype, **cfg, enable_prefix_caching=False), prompts, params)
    assert r.passed, r.detail


# -- prefix caching: exactly what hits, hits on hits, turns ----------------------------------------------
# block_size 4; a request's prompt is served from the cache block by block while the chained hash
# (the block's tokens and everything before them) matches, leaving its last token to compute. Each
# case runs with the cache on and off: the same greedy tokens, and exactly the cached prompt tokens
# the chain allows (a hash that ignores the parent hits wrongly; one that breaks the chain never hits).
ANSWER = SamplingParams(max_tokens=5, ignore_eos=True)


def _one_by_one(prompts, caching: bool) -> tuple[list[int], list[list[int]]]:
    """Each prompt alone after the previous finished: (cached prompt tokens, output tokens) of each."""
    llm = make_llm(num_blocks=64, block_size=4, max_num_batched_tokens=16, enable_prefix_caching=caching)
    outs = [llm.generate([p], ANSWER)[0] for p in prompts]
    assert all(o.finish_reason == "length" for o in outs), [o.error for o in outs]
    return [o.metrics["cached_prompt_tokens"] for o in outs], [o.token_ids for o in outs]


def _blocks(rng, n: int) -> list[list[int]]:
    return [rng.integers(3, 500, 4).tolist() for _ in range(n)]


def _assert_hits(prompts, want: list[int]) -> None:
    cached, tokens = _one_by_one(prompts, True)
    plain_cached, plain = _one_by_one(prompts, False)
    assert plain_cached == [0] * len(prompts), plain_cached
    assert cached == want, f"cached prompt tokens {cached}, want {want}"
    assert tokens == plain, "prefix caching changed the greedy tokens"


def test_prefix_cache_same_blocks_after_other_context_never_hit():
    """The same two blocks R after P+X, after P+Y, and with nothing before them: only P (and, for a
    request repeating P+Y+R, all of it) may be served; R's K/V after X is not R's K/V after Y."""
    p, x, y, r1, r2 = _blocks(np.random.default_rng(21), 5)
    tail, other = [7, 8], [9, 10]
    prompts = [p + x + r1 + r2 + tail,  # A: nothing cached yet
               p + y + r1 + r2 + tail,  # B: P only (R follows Y here, X in A)
               r1 + r2 + tail,          # C: R at the start: its cached copies all follow something
               p + y + r1 + r2 + other]  # D: B's own chain, 4 blocks
    _assert_hits(prompts, [0, 4, 0, 16])


def test_prefix_cache_hits_on_blocks_registered_after_a_hit():
    """Hits after hits: B is served A's 3 shared blocks and computes 2 more; C = B's prompt + more
    is served all 5 (B's new blocks chain on the blocks it was served)."""
    s1, s2, s3, b1, b2 = _blocks(np.random.default_rng(22), 5)
    a = s1 + s2 + s3 + [11, 12]
    b = s1 + s2 + s3 + b1 + b2
    c = b + [13, 14, 15]
    _assert_hits([a, b, c], [0, 12, 20])


def test_prefix_cache_multi_turn_conversation():
    """Turn k+1's prompt = turn k's prompt + its answer + new user tokens: it is served every full
    block of what turn k fed (its prompt and all but the last answer token), exactly."""
    rng = np.random.default_rng(23)
    users = [rng.integers(3, 500, n).tolist() for n in (10, 5, 3)]
    runs = {}
    for caching in (True, False):
        llm = make_llm(num_blocks=64, block_size=4, max_num_batched_tokens=16, enable_prefix_caching=caching)
        prompt, cached, answers = [], [], []
        for u in users:
            prompt = prompt + u
            out = llm.generate([prompt], ANSWER)[0]
            cached.append(out.metrics["cached_prompt_tokens"])
            answers.append(out.token_ids)
            prompt = prompt + out.token_ids
        runs[caching] = cached, answers
    assert runs[True][1] == runs[False][1], "prefix caching changed the answers"
    assert runs[False][0] == [0, 0, 0]
    # turn 2: (10 + 5 - 1) // 4 = 3 blocks; turn 3: (10 + 5 + 5 + 5 - 1) // 4 = 6 blocks
    assert runs[True][0] == [0, 12, 24], f"cached prompt tokens per turn {runs[True][0]}, want [0, 12, 24]"


@pytest.mark.parametrize("arch,qtype", [("llama", "Q8_0"), ("qwen3moe", "Q4_0")])
def test_i_seeded_sampling_alone_equals_busy_batch(arch, qtype):
    rng = np.random.default_rng(9)
    llm = make_llm(arch, qtype, num_blocks=64, block_size=4, max_num_batched_tokens=32)
    prompt = rng.integers(3, 500, 12).tolist()
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, top_k=50, seed=1234, ignore_eos=True)
    busy = [rng.integers(3, 500, int(rng.integers(1, 30))).tolist() for _ in range(5)]
    busy_params = [SamplingParams(max_tokens=8, temperature=1.3, seed=i, min_p=0.05) for i in range(5)]
    r = oracle_seeded_sampling(llm, prompt, params, busy, busy_params)
    assert r.passed, r.detail
