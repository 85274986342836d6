"""The Python API under hostile input: SamplingParams and EngineConfig take what a user means
(one stop string, NumPy scalars) and refuse the rest in one line naming the field; the
reference backend sizes its KV cache by the request, not by the model's declared context."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from sharpinf.engine.config import EngineConfig
from sharpinf.errors import RequestError, SharpinfError
from sharpinf.params import SamplingParams

# -- 2. SamplingParams ----------------------------------------------------------------------------


def test_a_stop_string_is_one_stop_string_not_its_characters():
    assert SamplingParams(stop="abc").stop == ("abc",)
    assert SamplingParams(stop=["abc", "\n\n"]).stop == ("abc", "\n\n")


def test_none_means_no_stops():
    p = SamplingParams(stop=None, stop_token_ids=None)
    assert p.stop == () and p.stop_token_ids == ()


@pytest.mark.parametrize("ids,want", [(5, (5,)), (np.int64(5), (5,)), ([1, np.int32(2)], (1, 2)),
                                      (np.array([3, 4]), (3, 4))])
def test_one_stop_token_id_or_many(ids, want):
    got = SamplingParams(stop_token_ids=ids).stop_token_ids
    assert got == want and all(type(t) is int for t in got)


def test_numpy_scalars_are_taken_as_their_python_values():
    p = SamplingParams(max_tokens=np.int64(5), top_k=np.int32(3), seed=np.uint64(7), temperature=np.float32(0.5),
                       top_p=np.float64(0.9), min_p=np.float16(0), repetition_penalty=np.int64(1),
                       ignore_eos=np.bool_(True))
    assert (p.max_tokens, p.top_k, p.seed, p.temperature, p.top_p, p.min_p, p.repetition_penalty, p.ignore_eos) == \
        (5, 3, 7, 0.5, 0.9, 0.0, 1.0, True)
    assert type(p.max_tokens) is int and type(p.temperature) is float and type(p.ignore_eos) is bool


@pytest.mark.parametrize("field,value,needle", [
    ("max_tokens", True, "max_tokens must be an integer >= 1 (or None), got bool True"),
    ("top_k", False, "top_k must be an integer >= 0, got bool False"),
    ("seed", "7", "seed must be an integer >= 0 and < 2**63 (or None), got str '7'"),
    ("max_tokens", 5.0, "got float 5.0"),
    ("temperature", float("nan"), "temperature must be a finite number >= 0, got nan"),
    ("top_p", float("inf"), "top_p must be a finite number in (0, 1], got inf"),
    ("repetition_penalty", np.float32("nan"), "repetition_penalty must be a finite number"),
    ("temperature", "0.7", "temperature must be a number >= 0, got str '0.7'"),
    ("temperature", 1e300, "(float32)"),  # inf in the sampling kernel
    pytest.param("temperature", 10**400, "temperature must be a finite number >= 0, got inf", id="int-beyond-float"),
    ("repetition_penalty", 1e-300, "(float32)"),  # 0 in the sampling kernel: a division by zero
    ("temperature", True, "got bool True"),
    ("stop", 5, "stop must be one value or a list of them, got int 5"),
    ("stop", ["ok", 3], "stop[1] must be a non-empty string, got int 3"),
    ("stop", ["ok", ""], "stop[1] must be a non-empty string"),
    ("stop_token_ids", "5", "stop_token_ids must be one value or a list of them, got str '5'"),
    ("stop_token_ids", [1, True], "stop_token_ids[1] must be an integer >= 0, got bool True"),
    ("stop_token_ids", [-1], "stop_token_ids[0] must be an integer >= 0, got -1"),
    ("ignore_eos", "false", "ignore_eos must be true or false, got str 'false'"),
])
def test_wrong_types_and_values_are_one_line_request_errors(field, value, needle):
    with pytest.raises(RequestError) as info:
        SamplingParams(**{field: value})
    assert needle in str(info.value) and "\n" not in str(info.value)


# -- 3. EngineConfig ------------------------------------------------------------------------------

@pytest.mark.parametrize("field,value,needle", [
    ("num_blocks", "8", "num_blocks must be an integer or None, got str '8'"),
    ("block_size", None, "block_size must be an integer, got NoneType None"),
    ("max_num_seqs", 4.0, "max_num_seqs must be an integer, got float 4.0"),
    ("max_num_batched_tokens", True, "max_num_batched_tokens must be an integer, got bool True"),
    ("gpu_memory_utilization", "0.5", "gpu_memory_utilization must be a number, got str '0.5'"),
    ("gpu_memory_utilization", float("nan"), "gpu_memory_utilization must be in (0, 1]"),
    ("enforce_eager", "yes", "enforce_eager must be True or False, got str 'yes'"),
    ("kv_dtype", 16, "kv_dtype must be a string"),
    ("backend", 3, "backend must be a string"),
    ("seed", -1, "seed must be >= 0"),
])
def test_engine_config_names_the_field_and_the_type(field, value, needle):
    with pytest.raises(SharpinfError) as info:
        EngineConfig(**{field: value})
    assert needle in str(info.value) and str(info.value).startswith("engine config: ")


def test_engine_config_takes_numpy_scalars_as_python_values():
    c = EngineConfig(num_blocks=np.int64(8), block_size=np.int32(16), max_model_len=np.uint16(512),
                     gpu_memory_utilization=np.float32(0.5), enforce_eager=np.bool_(True))
    assert (c.num_blocks, c.block_size, c.max_model_len, c.gpu_memory_utilization, c.enforce_eager) == \
        (8, 16, 512, 0.5, True)
    assert type(c.num_blocks) is int and type(c.gpu_memory_utilization) is float and type(c.enforce_eager) is bool


# -- 6. the reference backend's KV cache ----------------------------------------------------------

@pytest.fixture(scope="module")
def huge_context():
    """A small model that declares a 2**24-token context: 16 GiB of KV cache if sized by it."""
    from oracles.reference import Reference
    from sharpinf.model.loader import load_model
    from sharpinf.model.synth import synthetic_model
    from sharpinf.model.tokenizer import Tokenizer

    m = load_model(synthetic_model("llama", "Q8_0", n_embd=128, context_length=2**24))
    return Reference(m), Tokenizer.from_gguf_metadata(m.metadata)


@pytest.mark.parametrize("max_tokens", [None, 10**7])
def test_reference_generation_allocates_for_the_request_not_the_declared_context(huge_context, max_tokens):
    from oracles.generation import generate_reference

    ref, tok = huge_context
    every_id = tuple(range(ref.cfg.n_vocab))  # the first token stops the request
    tracemalloc.start()
    try:
        out = generate_reference(ref, tok, [5, 6, 7], SamplingParams(max_tokens=max_tokens, stop_token_ids=every_id))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.finish_reason == "stop" and len(out.token_ids) == 1
    assert peak < 256 * 2**20, f"peak {peak / 2**30:.1f} GiB"


def test_reference_cache_grows_and_gives_the_same_tokens(huge_context, monkeypatch):
    from oracles import generation

    ref, tok = huge_context
    # sampled, with a penalty: greedy repeats one token on this model and would not see a lost position
    params = SamplingParams(max_tokens=12, ignore_eos=True, temperature=1.0, top_k=50, repetition_penalty=1.3,
                            seed=3)
    want = generation.generate_reference(ref, tok, [5, 6, 7], params).token_ids  # room for all 12 up front
    monkeypatch.setattr(generation, "INITIAL_ROOM", 1)  # grow at every other token
    assert generation.generate_reference(ref, tok, [5, 6, 7], params).token_ids == want


def test_reference_cache_beyond_memory_is_one_line(huge_context):
    from oracles.reference import KVCache

    ref, _ = huge_context
    with pytest.raises(RequestError, match="reference: a KV cache of .* positions needs .* GiB"):
        KVCache.empty(ref.cfg, 2**40)  # a petabyte
    cache = ref.new_cache(4)
    with pytest.raises(RequestError, match="GiB"):
        cache.reserve(2**40, limit=2**41)
    assert cache.k.shape[1] == 4  # unchanged by the refused growth
