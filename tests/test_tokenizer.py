"""Tokenizer, synthetic vocabulary and chat template tests.

The real-model tests need SmolLM2-135M-Instruct (GGUF); they skip, saying why, when it is absent.
Ground-truth ids come from llama.cpp's llama-tokenize (tests/data/smollm2_llamacpp_tokens.json).
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sharpinf.errors import ModelError
from sharpinf.model.chat import ChatTemplateError, render_chat
from sharpinf.model.synth_vocab import CHATML_TEMPLATE, synthetic_tokenizer_metadata
from sharpinf.model.tokenizer import Tokenizer

FIXTURE = Path(__file__).parent / "data" / "smollm2_llamacpp_tokens.json"


@functools.cache
def _synth_meta() -> dict:
    return synthetic_tokenizer_metadata()  # trains BPE: once per session, tests take copies


@pytest.fixture(scope="module")
def synth() -> Tokenizer:
    return Tokenizer.from_gguf_metadata(_synth_meta())


@pytest.fixture(scope="module")
def real(smollm2_path) -> Tokenizer:
    return Tokenizer.from_gguf(smollm2_path)


# --- synthetic vocabulary ---------------------------------------------------------------------


def test_synth_vocab_shape():
    m = _synth_meta()
    tokens, types = m["tokenizer.ggml.tokens"], m["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == 512 and len(set(tokens)) == 512
    assert tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] and types[:3] == [3, 3, 3]
    assert m["tokenizer.ggml.model"] == "gpt2" and m["tokenizer.ggml.pre"] == "smollm"
    assert m["tokenizer.ggml.add_bos_token"] is False
    for merge in m["tokenizer.ggml.merges"]:
        left, right = merge.split(" ")
        assert left in tokens and right in tokens and left + right in tokens
    assert len(synthetic_tokenizer_metadata(n_vocab=3000)["tokenizer.ggml.tokens"]) == 3000


def test_synth_vocab_deterministic_across_processes():
    code = (
        "import json,hashlib;from sharpinf.model.synth_vocab import synthetic_tokenizer_metadata as s;"
        "print(hashlib.sha256(json.dumps(s(700, 5)).encode()).hexdigest())"
    )
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout for _ in range(2)}
    assert len(runs) == 1
    assert synthetic_tokenizer_metadata(700, 5) != synthetic_tokenizer_metadata(700, 6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=80))
def test_synth_round_trip(synth, s):
    assert synth.decode(synth.encode(s)) == s


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(list("ab 1\n\t<|>im_start") + ["<|im_start|>", "<|im_end|>"]), max_size=20).map("".join))
def test_synth_round_trip_with_specials(synth, s):
    assert synth.decode(synth.encode(s)) == s


def test_special_tokens_parsed(synth):
    ids = synth.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2 and 1 not in ids[1:-1]
    plain = synth.encode("<|im_start|>", parse_special=False)
    assert 1 not in plain and synth.decode(plain) == "<|im_start|>"
    assert synth.decode(ids, skip_special=True) == "user\nhi"


def test_bos_and_eot(synth):
    assert synth.bos_id == 1 and synth.eos_id == 2 and synth.n_vocab == 512
    assert synth.eot_ids == {0, 2}
    assert synth.encode("hi")[0] != 1  # add_bos_token is False
    assert synth.encode("hi", add_bos=True)[0] == 1


def test_unknown_pre_tokenizer():
    m = dict(_synth_meta(), **{"tokenizer.ggml.pre": "no-such-pre"})
    with pytest.raises(ModelError, match="unsupported tokenizer.ggml.pre 'no-such-pre'"):
        Tokenizer.from_gguf_metadata(m)


@pytest.mark.parametrize(
    "pre, text, pieces",
    [
        ("smollm", "a 123", ["a", "Ġ", "1", "2", "3"]),
        ("smollm", "it's  x\n\n", ["it", "'s", "Ġ", "Ġx", "ĊĊ"]),
        ("gpt2", "a 123", ["a", "Ġ123"]),
        ("llama3", "1234567 ab", ["123", "456", "7", "Ġab"]),
        ("llama3", "I'M  ok\n\n x", ["I", "'M", "Ġ", "Ġok", "ĊĊ", "Ġx"]),
        ("qwen2", "x 123", ["x", "Ġ", "1", "2", "3"]),
    ],
)
def test_pre_tokenizer_splits(pre, text, pieces):
    m = dict(_synth_meta(), **{"tokenizer.ggml.pre": pre})
    tok = Tokenizer.from_gguf_metadata(m)
    assert [p for p, _ in tok._hf_special.pre_tokenizer.pre_tokenize_str(text)] == pieces


# --- chat templates ---------------------------------------------------------------------------

TWO_MESSAGES = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]


def test_render_smollm2_template():
    out = render_chat(CHATML_TEMPLATE, TWO_MESSAGES, add_generation_prompt=True)
    assert out == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>assistant\n"
    )
    with_system = [{"role": "system", "content": "Be brief."}] + TWO_MESSAGES[:1]
    assert render_chat(CHATML_TEMPLATE, with_system, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )


def test_template_helpers():
    tpl = (
        "{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('no bad roles') }}{% endif %}"
        "{% if loop.index > 1 %}{% break %}{% endif %}{{ bos_token }}{{ m.content | tojson }}{% endfor %}"
    )
    assert render_chat(tpl, [{"role": "u", "content": "é"}, {"role": "u", "content": "x"}], bos_token="<s>") == '<s>"é"'
    with pytest.raises(ChatTemplateError, match="no bad roles"):
        render_chat(tpl, [{"role": "bad", "content": ""}])


def test_template_sandbox():
    with pytest.raises(ChatTemplateError, match="unsafe"):
        render_chat("{{ ''.__class__.__mro__[1].__subclasses__() }}", [])
    with pytest.raises(ChatTemplateError, match="unsafe"):
        render_chat("{% set _ = messages.append(1) %}", [{"role": "u", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="parse"):
        render_chat("{% for %}", [])


def test_apply_chat_synth(synth):
    ids = synth.apply_chat(TWO_MESSAGES)
    assert ids[0] == 1 and ids.count(1) == 4 and ids.count(2) == 3
    assert synth.decode(ids) == render_chat(CHATML_TEMPLATE, TWO_MESSAGES)


# --- the real SmolLM2 vocabulary --------------------------------------------------------------


def test_real_metadata(real):
    assert real.n_vocab == 49152 and real.bos_id == 1 and real.eos_id == 2
    assert real.eot_ids == {0, 2} and real.add_bos is False
    assert real.encode("<|im_start|>user\nHi<|im_end|>") == [1, 4093, 198, 26843, 2]


def test_real_against_llamacpp(real):
    if not FIXTURE.is_file():
        pytest.skip(f"no llama.cpp fixture at {FIXTURE}")
    data = json.loads(FIXTURE.read_text())
    bad = [(c["text"], real.encode(c["text"]), c["ids"]) for c in data["cases"] if real.encode(c["text"]) != c["ids"]]
    assert not bad, f"{len(bad)}/{len(data['cases'])} differ from {data['generator']}: {bad[:3]}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=60))
def test_real_round_trip(real, s):
    # SmolLM2 has no token for 21 byte values (0x04, 0xF1, ...); like llama.cpp we drop those bytes.
    assume(all(b in _covered_bytes(real) for b in s.encode("utf-8")))
    assert real.decode(real.encode(s)) == s


def _covered_bytes(tok: Tokenizer) -> set[int]:
    if not hasattr(tok, "_test_covered"):
        tok._test_covered = {t[0] for i in range(tok.n_vocab) if len(t := tok.token_bytes(i)) == 1}
    return tok._test_covered


def test_real_missing_byte_dropped(real):
    assert 0x04 not in _covered_bytes(real)
    assert real.decode(real.encode("a\x04b")) == "ab"


def test_real_partial_utf8(real):
    ids = real.encode("😀")
    assert len(ids) > 1
    assert "\ufffd" in real.decode(ids[:1]) and real.decode(ids) == "😀"


def test_real_apply_chat(real):
    ids = real.apply_chat(TWO_MESSAGES)
    assert ids == real.encode(render_chat(real.chat_template, TWO_MESSAGES))
    assert ids[0] == 1 and ids[1] != 1  # template's own <|im_start|>, no BOS added on top
