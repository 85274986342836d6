"""Tokenizer, synthetic vocabulary and chat template tests.

The real-model tests need SmolLM2-135M-Instruct and Gemma 3 270M (GGUF, pulled on first use: the
smollm2_path and gemma3_path fixtures of conftest.py); they skip, saying why, when offline.
Ground-truth ids come from llama.cpp's llama-tokenize (tests/data/smollm2_llamacpp_tokens.json,
tests/data/gemma3_llamacpp_tokens.json).
"""

from __future__ import annotations

import functools
import heapq
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sharpinf.errors import ModelError
from sharpinf.model.chat import ChatTemplateError, render_chat
from sharpinf.model.synth_vocab import (CHATML_TEMPLATE, GEMMA_TEMPLATE, synthetic_spm_tokenizer_metadata,
                                        synthetic_tokenizer_metadata)
from sharpinf.model.tokenizer import Tokenizer, read_tokenizer_metadata

FIXTURE = Path(__file__).parent / "data" / "smollm2_llamacpp_tokens.json"
GEMMA3_FIXTURE = Path(__file__).parent / "data" / "gemma3_llamacpp_tokens.json"
NORMAL, CONTROL, USER_DEFINED, BYTE = 1, 3, 4, 6


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


@pytest.mark.parametrize("maker", ["synthetic_tokenizer_metadata", "synthetic_spm_tokenizer_metadata"])
def test_synth_vocab_deterministic_across_processes(maker):
    code = (
        f"import json,hashlib;from sharpinf.model.synth_vocab import {maker} as s;"
        "print(hashlib.sha256(json.dumps(s(700, 5)).encode()).hexdigest())"
    )
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout for _ in range(2)}
    assert len(runs) == 1
    if maker == "synthetic_tokenizer_metadata":
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


def test_add_eos_token_and_the_eom_id_as_llama_cpp_reads_them():
    """tokenizer.ggml.add_eos_token: an EOS after the text wherever the specials are added (not after a
    chat template's text); tokenizer.ggml.eom_token_id ends generation, as eot_token_id does."""
    meta = {**_synth_meta(), "tokenizer.ggml.add_eos_token": True, "tokenizer.ggml.eom_token_id": 7}
    tok = Tokenizer.from_gguf_metadata(meta)
    plain = Tokenizer.from_gguf_metadata(_synth_meta())
    assert tok.encode("hi") == plain.encode("hi") + [2]
    assert tok.encode("hi", add_bos=False) == plain.encode("hi", add_bos=False)
    assert 7 in tok.eot_ids and 7 not in plain.eot_ids


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
    assert [p for p, _ in tok._model.hf.pre_tokenizer.pre_tokenize_str(text)] == pieces


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


# --- SentencePiece ("llama") vocabularies: llama.cpp's algorithm, as the oracle -----------------


def _llamacpp_spm(meta: dict, text: str) -> list[int]:
    """llama.cpp's llm_tokenizer_spm_session (src/llama-vocab.cpp) on one raw-text fragment, step
    for step: the adjacent pair whose joined text is a vocabulary entry with the highest score
    merges first (ties: the leftmost), until none is left; a leftover character that is no entry
    becomes its UTF-8 bytes' <0xNN> tokens."""
    ids, scores = _spm_index(meta)
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        text = " " + text
    sym = list(text.replace(" ", "\u2581"))  # characters; "" once merged into its left neighbour
    nxt, prv = list(range(1, len(sym))) + [-1], list(range(-1, len(sym) - 1))
    queue: list = []

    def push(left: int, right: int) -> None:
        joined = sym[left] + sym[right] if left >= 0 and right >= 0 else ""
        if joined in ids:
            heapq.heappush(queue, (-scores[ids[joined]], left, right, len(joined)))

    for i in range(1, len(sym)):
        push(i - 1, i)
    while queue:
        _, left, right, size = heapq.heappop(queue)
        if not sym[left] or not sym[right] or len(sym[left]) + len(sym[right]) != size:
            continue  # stale: one side merged since
        sym[left], sym[right] = sym[left] + sym[right], ""
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prv[nxt[right]] = left
        push(prv[left], left)
        push(left, nxt[left])
    out, i = [], 0 if sym else -1
    while i != -1:
        out += [ids[sym[i]]] if sym[i] in ids else [ids[f"<0x{b:02X}>"] for b in sym[i].encode()]
        i = nxt[i]
    return out


_SPM_INDEX: dict[int, tuple] = {}  # id(tokens) -> (tokens, text -> id); holding tokens keeps the id theirs


def _spm_index(meta: dict) -> tuple[dict, list]:
    tokens = meta["tokenizer.ggml.tokens"]
    if id(tokens) not in _SPM_INDEX:
        _SPM_INDEX[id(tokens)] = (tokens, {t: i for i, t in enumerate(tokens)})
    return _SPM_INDEX[id(tokens)][1], meta["tokenizer.ggml.scores"]


def _tiny_meta(pieces: dict[str, float], add_space_prefix: bool = False, user_defined=("<|u|>",), controls=()) -> dict:
    """A hand-made SentencePiece vocabulary: <pad> <eos> <bos> <unk> <start_of_turn> and controls
    (control), user_defined, the 256 byte pieces, then pieces (text -> score)."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", *controls]
    tokens = specials + list(user_defined) + [f"<0x{b:02X}>" for b in range(256)] + list(pieces)
    types = [CONTROL] * len(specials) + [USER_DEFINED] * len(user_defined) + [BYTE] * 256 + [NORMAL] * len(pieces)
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * (len(tokens) - len(pieces)) + [float(s) for s in pieces.values()],
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.add_space_prefix": add_space_prefix,
    }


def _tiny_spm(pieces: dict[str, float], **kw) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(_tiny_meta(pieces, **kw))


def _pieces(tok: Tokenizer, ids: list[int]) -> list[str]:
    return [tok.id_to_piece(i) for i in ids]


ABCD = {"a": -10.0, "b": -10.0, "c": -10.0, "d": -10.0}


@pytest.mark.parametrize(
    "scores, text, want",
    [
        ({"ab": -2.0, "bc": -1.0}, "abc", ["a", "bc"]),  # the highest score merges first
        ({"ab": -1.0, "bc": -2.0}, "abc", ["ab", "c"]),
        ({"ab": -1.0, "bc": -1.0}, "abc", ["ab", "c"]),  # a tie: the leftmost pair
        ({"aa": -1.0}, "aaa", ["aa", "a"]),
        ({"aa": -1.0}, "aaaaa", ["aa", "aa", "a"]),
        # ab first, then cd, then abcd: merges only ever join the pieces already there ...
        ({"ab": -1.0, "bc": -1.5, "cd": -2.0, "abcd": -3.0}, "abcd", ["abcd"]),
        # ... so with bc first, neither "abc" nor "bcd" being a piece, abcd is never reached.
        ({"ab": -1.0, "bc": -0.5, "cd": -2.0, "abcd": -3.0}, "abcd", ["a", "bc", "d"]),
        # "bcd" has the best score but never forms: "bc" is no piece, so no pair ever joins to it
        ({"ab": -1.0, "abc": -5.0, "bcd": -0.5}, "abcd", ["abc", "d"]),
    ],
)
def test_spm_merge_order(scores, text, want):
    tok = _tiny_spm(ABCD | scores)
    assert _pieces(tok, tok.encode(text, add_bos=False)) == want


def test_spm_byte_fallback():
    tok = _tiny_spm(ABCD)
    ids = tok.encode("aé😀", add_bos=False)
    assert _pieces(tok, ids) == ["a", "<0xC3>", "<0xA9>", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    assert [tok.token_type(i) for i in ids[1:]] == [BYTE] * 6 and tok.token_bytes(ids[1]) == b"\xc3"
    assert tok.decode(ids) == "aé😀" and tok.decode(ids[:2]) == "a\ufffd"


def test_spm_space_prefix():
    pieces = {"\u2581": -10.0, "a": -10.0, "\u2581a": -1.0}
    on, off = _tiny_spm(pieces, add_space_prefix=True), _tiny_spm(pieces, add_space_prefix=False)
    assert _pieces(off, off.encode("a a", add_bos=False)) == ["a", "▁a"]
    assert _pieces(on, on.encode("a a", add_bos=False)) == ["▁a", "▁a"]
    # As llama.cpp: the space goes before every raw fragment, i.e. also after each special token.
    assert _pieces(on, on.encode("a<start_of_turn>a", add_bos=False)) == ["▁a", "<start_of_turn>", "▁a"]
    assert _pieces(off, off.encode("a<start_of_turn>a", add_bos=False)) == ["a", "<start_of_turn>", "a"]
    # Decoding drops it from a first text token only (llama.cpp's detokenize does so too).
    assert on.decode(on.encode("a a", add_bos=False)) == "a a" and off.decode(off.encode("a a")[1:]) == "a a"
    assert on.decode(on.encode("a a"), skip_special=True) == " a a"


def test_spm_special_tokens():
    tok = _tiny_spm(ABCD)
    assert _pieces(tok, tok.encode("a<start_of_turn>b<|u|>", add_bos=False)) == ["a", "<start_of_turn>", "b", "<|u|>"]
    # parse_special false: control tokens are text (bytes here), user-defined ones still split out
    plain = tok.encode("<start_of_turn><|u|>", add_bos=False, parse_special=False)
    assert 4 not in plain and plain[-1] == 5 and tok.decode(plain) == "<start_of_turn><|u|>"
    assert tok.decode(tok.encode("a<start_of_turn>b"), skip_special=True) == "ab"
    assert tok.is_special(4) and not tok.is_special(5) and tok.bos_id == 2 and tok.eos_id == 1


def test_spm_merges_into_control_pieces():
    # llama.cpp merges into any vocabulary entry: a control token's text built up by merges is
    # that token (seen with parse_special false; parsing specials, the text is split out first)
    meta = _tiny_meta(ABCD | {"ab": -1.0, "abc": -2.0}, controls=("cd", "abcd"))
    tok = Tokenizer.from_gguf_metadata(meta)
    ids = tok.encode("abcd", add_bos=False, parse_special=False)
    assert _pieces(tok, ids) == ["abcd"] and ids == _llamacpp_spm(meta, "abcd")


def test_special_split_longest_first():
    # llama.cpp splits with the longest special first, not leftmost-longest: "abcd" -> a, <bcd>
    tok = _tiny_spm(ABCD, user_defined=("ab", "bcd"))
    assert _pieces(tok, tok.encode("abcd", add_bos=False)) == ["a", "bcd"]
    assert _pieces(tok, tok.encode("abab", add_bos=False)) == ["ab", "ab"]


def test_spm_defaults_and_errors():
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "a"],
            "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -1.0], "tokenizer.ggml.token_type": [2, 3, 3, 1]}
    tok = Tokenizer.from_gguf_metadata(meta)  # llama.cpp's SPM defaults: unk 0, bos 1, eos 2, BOS on, space prefix on
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_space_prefix) == (1, 2, True, True)
    # no byte pieces, so no byte fallback: an unknown character is <unk>, the dummy "▁" here too
    assert tok.encode("aa") == [1, 0, 3, 3] and tok.encode("ab", add_bos=False) == [0, 3, 0]
    assert tok.decode([3, 3]) == "aa"
    with pytest.raises(ModelError, match="4 tokens but 3 tokenizer.ggml.scores"):
        Tokenizer.from_gguf_metadata(meta | {"tokenizer.ggml.scores": [0.0, 0.0, 0.0]})
    # no scores: all 0, as llama.cpp reads it, so every pair ties and the leftmost merges first
    no_scores = Tokenizer.from_gguf_metadata({k: v for k, v in meta.items() if k != "tokenizer.ggml.scores"}
                                             | {"tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "a", "aa"],
                                                "tokenizer.ggml.token_type": [2, 3, 3, 1, 1]})
    assert no_scores.encode("aaa", add_bos=False) == [0, 4, 3]
    with pytest.raises(ModelError, match="sentencepiece rejects"):
        Tokenizer.from_gguf_metadata(meta | {"tokenizer.ggml.tokens": ["<unk>", "<s>", "a", "a"]})
    with pytest.raises(ModelError, match="unsupported tokenizer.ggml.model 'bert'"):
        Tokenizer.from_gguf_metadata(meta | {"tokenizer.ggml.model": "bert"})


# --- synthetic SentencePiece vocabulary -------------------------------------------------------


@functools.cache
def _spm_meta() -> dict:
    return synthetic_spm_tokenizer_metadata()


@pytest.fixture(scope="module")
def spm_synth() -> Tokenizer:
    return Tokenizer.from_gguf_metadata(_spm_meta())


def test_spm_synth_vocab_shape():
    m = _spm_meta()
    tokens, types, scores = m["tokenizer.ggml.tokens"], m["tokenizer.ggml.token_type"], m["tokenizer.ggml.scores"]
    assert len(tokens) == len(types) == len(scores) == 512 and len(set(tokens)) == 512
    assert tokens[:6] == ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    assert types[:6] == [CONTROL] * 6 and types[6:9] == [USER_DEFINED] * 3 and tokens[6] == "\n"
    assert tokens[9:265] == [f"<0x{b:02X}>" for b in range(256)] and set(types[9:265]) == {BYTE}
    normal = [(t, s) for t, ty, s in zip(tokens, types, scores) if ty == NORMAL]
    assert len(normal) == 512 - 265 and sum(t.startswith("▁") and len(t) > 2 for t, _ in normal) > 20
    assert m["tokenizer.ggml.model"] == "llama" and m["tokenizer.ggml.add_space_prefix"] is False
    assert m["tokenizer.ggml.add_bos_token"] is True
    assert [m[f"tokenizer.ggml.{k}_token_id"] for k in ("bos", "eos", "padding", "unknown")] == [2, 1, 0, 3]
    for n in (266, 300, 3000):
        assert len(set(synthetic_spm_tokenizer_metadata(n_vocab=n)["tokenizer.ggml.tokens"])) == n
    with pytest.raises(ValueError, match="at least 266"):
        synthetic_spm_tokenizer_metadata(n_vocab=265)


def test_spm_synth_tokenizer(spm_synth):
    ids = spm_synth.encode("Hello world")
    assert ids[0] == 2 and 2 not in ids[1:] and spm_synth.decode(ids[1:]) == "Hello world"
    assert spm_synth.eot_ids == {1, 5} and spm_synth.add_space_prefix is False
    assert spm_synth.encode("a\n\nb", add_bos=False)[1] == 7  # "\n\n": user-defined, whole
    ids = spm_synth.encode("<start_of_turn>user\nHi<end_of_turn>\n")
    assert ids[:2] == [2, 4] and ids[-2:] == [5, 6]
    assert spm_synth.decode(ids, skip_special=True) == "user\nHi\n"


# "▁" in the text is read as a space by SentencePiece (llama.cpp too): such texts do not round-trip.
_SPM_TEXT = st.text(alphabet=st.characters(exclude_characters="\u2581", exclude_categories=("Cs",)), max_size=80)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_SPM_TEXT)
def test_spm_synth_round_trip(spm_synth, s):
    assert spm_synth.decode(spm_synth.encode(s, add_bos=False)) == s
    assert spm_synth.decode(spm_synth.encode(s, parse_special=False), skip_special=True) == s  # BOS hidden


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(list("ab 1\n\tth") + ["the", "<start_of_turn>", "<end_of_turn>", "<bos>"]), max_size=20)
       .map("".join))
def test_spm_synth_round_trip_with_specials(spm_synth, s):
    assert spm_synth.decode(spm_synth.encode(s, add_bos=False)) == s


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(st.sampled_from(list("the quick brown fox __ 12\t é日")) | st.characters(exclude_categories=("Cs",)), max_size=60),
       st.booleans())
def test_spm_synth_matches_llamacpp_algorithm(s, space_prefix):
    meta = _spm_meta() | {"tokenizer.ggml.add_space_prefix": space_prefix}
    tok = _spm_synth_tok(space_prefix)
    for frag in tok._split_special.split(s):  # a raw fragment is what llama.cpp's SPM session sees
        if isinstance(frag, str):
            assert tok._model.encode(frag) == _llamacpp_spm(meta, frag), frag


@pytest.mark.parametrize("space_prefix", [False, True])
def test_spm_synth_ties_match_llamacpp_algorithm(space_prefix):
    # "__" is a piece: in "___" both pairs tie, and the leftmost merges
    tok, meta = _spm_synth_tok(space_prefix), _spm_meta() | {"tokenizer.ggml.add_space_prefix": space_prefix}
    for text in ["___", "____", "a_____b", "__init__", "_" * 9, "  ___  "]:
        assert tok._model.encode(text) == _llamacpp_spm(meta, text), text
    assert _pieces(tok, tok.encode("___", add_bos=False)) == (["▁__", "_"] if space_prefix else ["__", "_"])


@functools.cache
def _spm_synth_tok(space_prefix: bool) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(_spm_meta() | {"tokenizer.ggml.add_space_prefix": space_prefix})


def test_spm_synth_apply_chat(spm_synth):
    msgs = [{"role": "system", "content": "Be brief."}] + TWO_MESSAGES
    text = render_chat(GEMMA_TEMPLATE, msgs, add_generation_prompt=True, bos_token="<bos>")
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    ids = spm_synth.apply_chat(msgs)
    assert ids[0] == 2 and ids.count(2) == 1 and ids.count(4) == 3 and ids.count(5) == 2
    assert spm_synth.decode(ids) == text


def test_spm_synth_through_gguf(tmp_path, spm_synth):
    import gguf

    path = tmp_path / "vocab.gguf"
    w = gguf.GGUFWriter(path, "gemma3")
    for key, value in _spm_meta().items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    meta = read_tokenizer_metadata(path)
    assert meta["tokenizer.ggml.tokens"] == _spm_meta()["tokenizer.ggml.tokens"]
    text = "<start_of_turn>user\nThe quick brown fox, 日本.<end_of_turn>\n"
    assert Tokenizer.from_gguf(path).encode(text) == spm_synth.encode(text)


# --- the real Gemma 3 vocabulary (262,144 pieces) ---------------------------------------------


@pytest.fixture(scope="module")
def gemma3(gemma3_path) -> Tokenizer:
    return Tokenizer.from_gguf(gemma3_path)


@functools.cache
def _gemma3_fixture() -> dict:
    return json.loads(GEMMA3_FIXTURE.read_text())


def test_gemma3_metadata(gemma3):
    assert gemma3.model == "llama" and gemma3.n_vocab == 262144
    assert (gemma3.bos_id, gemma3.eos_id, gemma3.add_bos, gemma3.add_space_prefix) == (2, 1, True, False)
    # <eos>, <end_of_turn>, and "</s>": llama.cpp takes it for end of generation and a control token
    assert gemma3.eot_ids == {1, 106, 212} and gemma3.token_type(212) == CONTROL
    assert gemma3.encode("<start_of_turn>user\nHi<end_of_turn>\n") == [2, 105, 2364, 107, 10979, 106, 107]


def test_gemma3_against_llamacpp(gemma3):
    data = _gemma3_fixture()
    assert data["parse_special"] is True and data["add_bos"].startswith("model default (true")
    bad = [(c["text"], got, c["ids"]) for c in data["cases"] if (got := gemma3.encode(c["text"])) != c["ids"]]
    assert not bad, f"{len(bad)}/{len(data['cases'])} differ from {data['generator']}: {bad[:3]}"
    plain = data["no_parse_special_cases"]
    bad = [(c["text"], c["ids"]) for c in plain if gemma3.encode(c["text"], parse_special=False) != c["ids"]]
    assert not bad, f"{len(bad)}/{len(plain)} differ with parse_special false: {bad[:3]}"


def test_gemma3_fixture_round_trip(gemma3):
    for case in _gemma3_fixture()["cases"]:
        if "\u2581" not in case["text"]:  # a literal "▁" comes back as " " (llama.cpp's too)
            assert gemma3.decode(case["ids"][1:]) == case["text"]
    assert gemma3.decode(gemma3.encode("▁x")) == "<bos> x"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_SPM_TEXT)
def test_gemma3_round_trip(gemma3, s):
    assert gemma3.decode(gemma3.encode(s)[1:]) == s
    assert gemma3.decode(gemma3.encode(s, parse_special=False), skip_special=True) == s


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=40))
def test_gemma3_matches_llamacpp_algorithm(gemma3, gemma3_path, s):
    meta = _gemma3_meta(gemma3_path)
    for frag in gemma3._split_special.split(s):
        if isinstance(frag, str):
            assert gemma3._model.encode(frag) == _llamacpp_spm(meta, frag), frag


def test_gemma3_fixture_texts_match_llamacpp_algorithm(gemma3, gemma3_path):
    # the fixture's texts and runs of one character, where equal pairs tie and the leftmost wins
    texts = [c["text"] for c in _gemma3_fixture()["cases"]] + [c * n for c in "ae l0.-=\t😀" for n in (3, 4, 7)]
    for text in texts:
        for frag in gemma3._split_special.split(text):
            if isinstance(frag, str):
                assert gemma3._model.encode(frag) == _llamacpp_spm(_gemma3_meta(gemma3_path), frag), frag


@functools.cache
def _gemma3_meta(path) -> dict:
    return read_tokenizer_metadata(path)


def test_gemma3_byte_fallback(gemma3):
    ids = gemma3.encode("\U0010ffff", add_bos=False)  # a private-use character: no piece, 4 bytes
    assert _pieces(gemma3, ids) == ["<0xF4>", "<0x8F>", "<0xBF>", "<0xBF>"]
    assert [gemma3.token_bytes(i) for i in ids] == [b"\xf4", b"\x8f", b"\xbf", b"\xbf"]
    assert gemma3.decode(ids[:2]) == "\ufffd" and gemma3.decode(ids) == "\U0010ffff"
    assert gemma3.decode_token(gemma3.encode(" world", add_bos=False)[0]) == " world"


def test_gemma3_special_tokens(gemma3):
    text = "<start_of_turn>user\n<b>x</b></s><end_of_turn>"
    ids = gemma3.encode(text, add_bos=False)
    assert ids[0] == 105 and ids[-1] == 106 and 200 in ids and 209 in ids and 212 in ids
    plain = gemma3.encode(text, add_bos=False, parse_special=False)
    # user-defined <b> </b> still whole; control <start_of_turn> and (overridden) </s> are text
    assert 105 not in plain and 106 not in plain and 212 not in plain and 200 in plain and 209 in plain
    assert gemma3.decode(plain) == text
    assert gemma3.decode(ids, skip_special=True) == "user\n<b>x</b>"
    assert gemma3.decode([2, 105]) == "<bos><start_of_turn>" and gemma3.decode([2, 105], skip_special=True) == ""


def test_gemma3_apply_chat(gemma3):
    with pytest.raises(ModelError, match="no tokenizer.chat_template"):  # the base model's GGUF has none
        gemma3.apply_chat(TWO_MESSAGES)
    ids = gemma3.apply_chat(TWO_MESSAGES, template=GEMMA_TEMPLATE)
    assert ids[:4] == [2, 105, 2364, 107] and ids.count(2) == 1  # the template's <bos>, none added on top
    assert ids == gemma3.encode(render_chat(GEMMA_TEMPLATE, TWO_MESSAGES, bos_token="<bos>"), add_bos=False)


def test_phi3s_rstrip_drops_the_whitespace_after_special_tokens_as_llamacpp_does():
    """llama.cpp's one rule keyed on a model's name (tokenizer.py's RSTRIP_NAMES): in a file named phi3 the
    whitespace after each special token is dropped (not after <s>, <unk>, <|endoftext|>), elsewhere kept --
    its ids on both files (bench/llamacpp_rstrip.py's fixture); the rule is seen: the two differ."""
    import json
    from pathlib import Path

    from bench.llamacpp_rstrip import vocab, vocab_sha256

    fx = json.loads((Path(__file__).parent / "data" / "rstrip_llamacpp_tokens.json").read_text())
    meta = vocab()
    assert vocab_sha256(meta) == fx["vocab_sha256"], "the fixture's vocabulary changed: rerun bench/llamacpp_rstrip.py"
    for key, name in fx["names"].items():
        tok = Tokenizer.from_gguf_metadata({**meta, "general.name": name})
        got = [tok.encode(t) for t in fx["texts"]]
        assert got == fx["ids"][key], f"{name}: {[(t, g, w) for t, g, w in zip(fx['texts'], got, fx['ids'][key]) if g != w][:1]}"
    assert fx["ids"]["phi3"] != fx["ids"]["other"]
