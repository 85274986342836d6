"""Every tokenizer.ggml.pre sharpinf names (model/pretokenizers.py) gives llama.cpp's ids: one
synthetic vocabulary whose merges cross every boundary a pre-tokenizer may draw, so a wrong split
shows as other ids, on texts of code, CJK, emoji, digits, whitespace runs, cases, marks and scripts,
recorded through llama-tokenize by bench/llamacpp_pretokenizers.py
(tests/data/pretokenizer_llamacpp_tokens.json)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from sharpinf.errors import ModelError
from sharpinf.model.pretokenizers import PRE_TOKENIZERS
from sharpinf.model.tokenizer import Tokenizer

from bench.llamacpp_pretokenizers import NOT_LLAMACPP, crossing_vocab, vocab_sha256

FIXTURE = json.loads((Path(__file__).parent / "data" / "pretokenizer_llamacpp_tokens.json").read_text())


@functools.cache
def _vocab() -> dict:
    meta = crossing_vocab()
    assert vocab_sha256(meta) == FIXTURE["vocab"]["sha256"], (
        "the crossing vocabulary changed; rerun bench/llamacpp_pretokenizers.py (it needs llama-tokenize)")
    return meta


def test_every_name_has_llamacpps_ids():
    assert set(FIXTURE["ids"]) == set(PRE_TOKENIZERS) - NOT_LLAMACPP, "a name without a recording, or one dropped"


@pytest.mark.parametrize("pre", sorted(FIXTURE["ids"]))
def test_ids_equal_llamacpps(pre):
    tok = Tokenizer.from_gguf_metadata({**_vocab(), "tokenizer.ggml.pre": pre})
    bad = [(t, got, want) for t, want in zip(FIXTURE["texts"], FIXTURE["ids"][pre])
           if (got := tok.encode(t, add_bos=False)) != want]
    assert not bad, f"{pre}: {len(bad)} of {len(FIXTURE['texts'])} texts differ, first {bad[0]}"


def test_the_fixture_tells_the_names_apart():
    """Negative control: the vocabulary makes splits visible -- names with other regexes give other
    ids, so a name wired to the wrong regexes would fail above."""
    by_ids: dict[str, set[tuple[str, ...]]] = {}
    for pre, ids in FIXTURE["ids"].items():
        by_ids.setdefault(json.dumps(ids), set()).add(PRE_TOKENIZERS[pre].regexes)
    assert all(len(regexes) == 1 for regexes in by_ids.values()), "two regex sets gave the same ids"


def test_llama3_style_names_add_bos_by_default_others_not():
    """llama.cpp's default where the file has no add_bos_token: llama3's family and tekken add BOS."""
    meta = {k: v for k, v in _vocab().items() if k != "tokenizer.ggml.add_bos_token"}
    for pre in ("llama-bpe", "tekken", "qwen2", "deepseek-r1-qwen", "gpt-4o"):
        tok = Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.pre": pre})
        assert (tok.encode("hi")[:1] == [meta["tokenizer.ggml.bos_token_id"]]) == PRE_TOKENIZERS[pre].add_bos
    assert PRE_TOKENIZERS["tekken"].add_bos and not PRE_TOKENIZERS["qwen2"].add_bos


def test_an_unknown_name_is_refused_naming_it():
    with pytest.raises(ModelError, match="unsupported tokenizer.ggml.pre 'jais'"):
        Tokenizer.from_gguf_metadata({**_vocab(), "tokenizer.ggml.pre": "jais"})
