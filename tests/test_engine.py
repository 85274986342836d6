"""Engine behaviour a user relies on: clear rejections, nothing lost, streaming, abort, metrics."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sharpinf.engine.block_manager import BlockManager
from sharpinf.engine.config import EngineConfig
from sharpinf.errors import RequestError, SharpinfError
from sharpinf.llm import LLM
from sharpinf.model.synth import synthetic_model
from sharpinf.params import SamplingParams


@pytest.fixture(scope="module")
def llm():
    return LLM(synthetic_model("llama", "Q8_0", n_embd=128), backend="emu", num_blocks=32, block_size=4,
               max_num_batched_tokens=16)


@pytest.mark.parametrize("prompt,params,match", [
    ([], SamplingParams(), "empty prompt"),
    ([1, 2, 99999], SamplingParams(), "out of range"),
    ([7] * 1100, SamplingParams(max_tokens=1), "context length"),
    ([5] * 10, SamplingParams(max_tokens=1020), "exceeds the context length"),
    ([5] * 10, SamplingParams(max_tokens=200), "could never run"),
    ({"role": "user"}, SamplingParams(), "a prompt is"),
])
def test_impossible_requests_are_rejected_at_submission(llm, prompt, params, match):
    with pytest.raises(RequestError, match=match):
        llm.engine.add_request(prompt, params)


@pytest.mark.parametrize("kwargs,match", [
    (dict(temperature=-1.0), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_k=-2), "top_k"),
    (dict(min_p=1.5), "min_p"), (dict(max_tokens=0), "max_tokens"), (dict(repetition_penalty=0.0), "repetition"),
    (dict(seed=-1), "seed"), (dict(stop=("",)), "stop"), (dict(temperature=float("nan")), "temperature"),
])
def test_bad_sampling_parameters_are_rejected(kwargs, match):
    with pytest.raises(RequestError, match=match):
        SamplingParams(**kwargs)


def test_one_bad_request_does_not_stop_the_others(llm):
    prompts = [[5, 6, 7], [], [8, 9], [9] * 2000]
    outs = llm.generate(prompts, SamplingParams(max_tokens=3, ignore_eos=True))
    assert [o.finish_reason for o in outs] == ["length", "rejected", "length", "rejected"]
    assert "empty prompt" in outs[1].error and len(outs[0].token_ids) == 3


def test_stream_yields_deltas_that_add_up(llm):
    deltas = list(llm.stream([10, 11, 12], SamplingParams(max_tokens=5, ignore_eos=True)))
    assert len(deltas) == 5 and deltas[-1].finished and deltas[-1].finish_reason == "length"
    assert [d.new_token_ids[0] for d in deltas] == deltas[-1].token_ids
    assert "".join(d.new_text for d in deltas) == deltas[-1].text


def test_abort_finishes_a_request_and_frees_its_blocks(llm):
    eng = llm.engine
    rid = eng.add_request([20, 21, 22, 23, 24], SamplingParams(max_tokens=50, ignore_eos=True))
    eng.step()
    eng.abort(rid)
    assert eng.requests[rid].finish_reason == "aborted"
    assert not eng.has_unfinished() and eng.blocks.num_free == eng.blocks.num_blocks
    eng.requests.pop(rid)


def test_stop_token_and_stop_string(llm):
    base = llm.generate([[30, 31, 32]], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    stop_id = base.token_ids[3]
    out = llm.generate([[30, 31, 32]], SamplingParams(max_tokens=8, stop_token_ids=(stop_id,), ignore_eos=True))[0]
    assert out.finish_reason == "stop" and out.token_ids == base.token_ids[: base.token_ids.index(stop_id) + 1]
    piece = base.text[2:5] if len(base.text) >= 5 else None
    if piece:
        out = llm.generate([[30, 31, 32]], SamplingParams(max_tokens=8, stop=(piece,), ignore_eos=True))[0]
        assert out.finish_reason == "stop" and piece not in out.text


def test_metrics_are_reported(llm):
    outs = llm.generate([[40, 41], [42, 43, 44]], SamplingParams(max_tokens=4, ignore_eos=True))
    m = llm.metrics()
    for key in ("throughput_tok_per_s", "preemptions", "kv_usage", "prefix_cache_hit_rate", "steps"):
        assert key in m
    assert outs[0].metrics["ttft_s"] > 0 and outs[0].metrics["mean_itl_s"] is not None


class _Tok:
    eot_ids = ()

    def decode(self, ids):
        return ""


def seq(tokens):
    """A bare engine Sequence of `tokens` (one token to generate), for block-manager tests."""
    from sharpinf.engine.sequence import Sequence
    from sharpinf.textgen import StopChecker

    p = SamplingParams(max_tokens=1)
    return Sequence("r", tokens, p, 0, StopChecker(p, _Tok(), 100))


def test_slide_then_release_frees_each_block_once():
    """BlockManager.slide (every layer windowed) frees the leading blocks before the next query's
    window, leaving SLID in the table; release (finish or preemption) skips them; a block shared
    through the prefix cache stays held by its other owner."""
    from sharpinf.engine.block_manager import SLID
    bm = BlockManager(num_blocks=12, block_size=4, window=6)
    a, b = seq(list(range(3, 23))), seq(list(range(3, 23)))
    assert bm.admit(a, 20)
    a.num_computed = 20
    bm.register_full_blocks(a)
    bm.slide(a)  # the next query (position 20) sees 15..20: blocks 0..2 (positions 0..11) are gone
    assert a.block_table[:3] == [SLID] * 3 and SLID not in a.block_table[3:] and bm.slid == 3
    assert bm.num_free == 12 - 2 and a.slid_blocks == 3
    bm.slide(a)  # again: nothing more
    assert bm.slid == 3
    assert bm.admit(b, 4) and b.num_computed == 16  # the cached prefix, blocks 0..3 (0..2 revived)
    assert bm.ref[a.block_table[3]] == 2
    bm.release(a)  # finish or preemption: SLID entries skipped
    assert bm.ref[b.block_table[3]] == 1 and a.block_table == [] and a.slid_blocks == 0
    bm.release(b)
    assert bm.num_free == 12 and not any(bm.ref)
    plain = BlockManager(num_blocks=12, block_size=4)  # a model with a global layer: nothing slides
    c = seq(list(range(3, 23)))
    assert plain.admit(c, 20)
    c.num_computed = 20
    plain.slide(c)
    assert SLID not in c.block_table and plain.num_free == 7


def test_prefix_cache_serves_shared_blocks_and_keeps_last_token_computed():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = seq(list(range(8)))
    assert bm.admit(a, 8)
    a.num_computed = 8
    bm.register_full_blocks(a)
    b = seq(list(range(8)))  # fully cached prompt: still computes its last token
    assert bm.admit(b, 1)
    assert b.num_computed == 4 and b.block_table[0] == a.block_table[0]
    bm.release(a)
    bm.release(b)
    assert bm.num_free == 8


def test_engine_config_validation():
    with pytest.raises(SharpinfError, match="block_size"):
        EngineConfig(block_size=0)
    with pytest.raises(SharpinfError, match="KV dtype"):
        EngineConfig(kv_dtype="int3")
    with pytest.raises(SharpinfError, match="max_model_len"):
        EngineConfig(max_model_len=1)


def test_max_model_len_bounds_requests_and_the_unchunked_step():
    """Without chunked prefill a prompt runs whole: the step buffers hold the longest admitted
    request (max_model_len + the decodes beside it), not the model's whole context."""
    llm = LLM(synthetic_model("llama", "Q8_0", n_embd=128), backend="emu", num_blocks=64, block_size=4,
              max_num_batched_tokens=16, max_num_seqs=4, enable_chunked_prefill=False, max_model_len=48)
    assert llm.engine.fp.capacity.tokens == 48 + 4
    outs = llm.generate([[5] * 40, [6] * 50], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(outs[0].token_ids) == 4
    assert outs[1].finish_reason == "rejected" and "context length 48" in outs[1].error


def test_generate_batch_file_json_in_input_order(tmp_path, capsys):
    from sharpinf.cli import main

    path = tmp_path / "reqs.jsonl"
    lines = [{"prompt_ids": [5, 6, 7], "max_tokens": 3}, {"prompt": "hello world", "max_tokens": 2},
             {"prompt_ids": [], "max_tokens": 2}, {"chat": "hi", "max_tokens": 2, "temperature": -1}]
    path.write_text("\n".join(json.dumps(x) for x in lines))
    model = synthetic_model("llama", "Q8_0", n_embd=128)
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", str(model), "--backend", "emu", "--batch", str(path), "--json", "--num-blocks", "64"])
    assert exit_info.value.code == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["finish_reason"] for r in rows] == ["length", "length", "rejected", "rejected"]
    assert rows[0]["prompt_ids"] == [5, 6, 7] and len(rows[0]["token_ids"]) == 3
