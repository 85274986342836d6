"""Structured output: a request's grammar as an allowed-token mask per step (llguidance).

`Grammars` (one per engine) builds llguidance's tokenizer once from sharpinf's own (each id's
bytes; control tokens marked with a leading 0xFF byte, llguidance's convention for special
tokens) and compiles a request's `StructuredOutput` into a `Grammar` (a matcher). Each step,
`fill_masks` -- the one call the model runner makes -- writes the allowed ids of every
constrained row (u32 words, bit id = id allowed, the sampling kernel's layout): before the
step's launch, or, when a constrained row's last token is still in flight (async scheduling),
once the step before it is collected, while the device runs the step's body (the sampling
launch waits for it). The engine advances the matcher with each token it appends, and a grammar
that has finished ends its request ("stop"). llguidance is optional (the `serve` extra): without it a
structured request is a RequestError naming the package.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Sequence as Seq

import numpy as np

from sharpinf.errors import RequestError
from sharpinf.params import StructuredOutput

U32 = np.uint32
# JSON as ", " / ": " separators and no other whitespace (a schema's "x-guidance" may say
# otherwise): a model cannot spend its tokens on blank space inside a document
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise RequestError("structured output needs the llguidance package (pip install 'sharpinf[serve]')",
                           "structured") from None
    return llguidance


@dataclass
class _TokenizerView:
    """What llguidance's TokenizerWrapper reads from a tokenizer."""

    tokens: list[bytes]
    eos_token_id: int
    bos_token_id: int | None
    special_token_ids: list[int]
    encode: Any

    def __call__(self, text: str) -> list[int]:  # literals of a grammar, tokenized as the model would
        return self.encode(text, add_bos=False, parse_special=False)


@dataclass
class Grammar:
    """One request's matcher: its mask for the next token, advanced by each token it gets."""

    matcher: Any

    def fill(self, words: np.ndarray) -> None:
        """words: u32 [ceil(vocab / 32)], contiguous: the allowed ids of the next token."""
        self.matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)

    def advance(self, token: int) -> None:
        self.matcher.consume_token(int(token))

    def copy(self) -> "Grammar":
        """A matcher in the same state, advanced apart from now on (a forked choice's)."""
        return Grammar(self.matcher.deep_copy())

    @property
    def finished(self) -> bool:
        """The grammar is complete (or failed): nothing more may follow."""
        return self.matcher.is_stopped() or self.matcher.is_error()

    @property
    def error(self) -> str | None:
        return self.matcher.get_error() if self.matcher.is_error() else None


class Grammars:
    """Compiles StructuredOutput for one tokenizer and vocabulary size (the model's n_vocab, which
    may exceed the tokenizer's: the extra ids are never allowed)."""

    def __init__(self, tokenizer, n_vocab: int):
        self.tokenizer, self.n_vocab = tokenizer, n_vocab
        self._lltok = None
        self._lock = threading.Lock()  # compile may run on several threads: build the tokenizer once

    def prepare(self) -> None:
        """Build llguidance's tokenizer now (a second or so for a large vocabulary) rather than
        inside the first structured request's step."""
        self._tokenizer()

    def _tokenizer(self):
        with self._lock:
            return self._build_tokenizer()

    def _build_tokenizer(self):
        if self._lltok is None:
            llg = _llguidance()
            tok = self.tokenizer
            if tok.eos_id is None:
                raise RequestError("structured output needs the model's end-of-text token; this tokenizer has none",
                                   "structured")
            n = tok.n_vocab
            pieces = [(b"\xff" if tok.is_special(i) else b"") + tok.token_bytes(i) for i in range(n)]
            pieces += [b""] * (self.n_vocab - n)
            view = _TokenizerView(pieces, tok.eos_id, tok.bos_id, [i for i in range(n) if tok.is_special(i)], tok.encode)
            from llguidance._tokenizer import TokenizerWrapper

            self._lltok = llg.LLTokenizer(TokenizerWrapper(view), n_vocab=self.n_vocab)
        return self._lltok

    def grammar_text(self, spec: StructuredOutput) -> str:
        M = _llguidance().LLMatcher
        if spec.kind == "json_object":
            return M.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
        if spec.kind == "json_schema":
            try:
                return M.grammar_from_json_schema(spec.spec, defaults=JSON_OPTIONS)
            except ValueError as exc:
                raise RequestError(f"invalid JSON schema: {exc}", "structured") from None
        return M.grammar_from_regex(spec.spec) if spec.kind == "regex" else M.grammar_from_lark(spec.spec)

    def compile(self, spec: StructuredOutput) -> Grammar:
        """A fresh matcher; a grammar llguidance rejects is a RequestError with its message."""
        llg, lltok = _llguidance(), self._tokenizer()
        text = self.grammar_text(spec)
        err = llg.LLMatcher.validate_grammar(text, lltok)
        if err:
            raise RequestError(f"invalid {spec.kind.replace('_', ' ')}: {err}", "structured")
        m = llg.LLMatcher(lltok, text, log_level=0)
        if m.is_error():
            raise RequestError(f"invalid {spec.kind.replace('_', ' ')}: {m.get_error()}", "structured")
        return Grammar(m)


def mask_index(grammars: Seq[Grammar | None]) -> np.ndarray | None:
    """mask_idx i32 [R]: row r's mask is masks[mask_idx[r]] (-1: unconstrained), the constrained rows
    in order; None when no row has a grammar."""
    rows = [r for r, g in enumerate(grammars) if g is not None]
    if not rows:
        return None
    idx = np.full(len(grammars), -1, np.int32)
    idx[rows] = np.arange(len(rows), dtype=np.int32)
    return idx


def fill_masks(grammars: Seq[Grammar | None], words: int,
               ended: Seq[bool] | None = None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(mask_idx i32 [R], masks u32 [M, words]) for the rows whose request has a grammar, or
    (None, None) when none has: row r's allowed ids are masks[mask_idx[r]] (-1: unconstrained).
    ended[r]: row r's request ended since its step was submitted (its sample is thrown away): any
    id, and its matcher is not asked."""
    idx = mask_index(grammars)
    if idx is None:
        return None, None
    rows = np.flatnonzero(idx >= 0)
    masks = np.zeros((len(rows), words), U32)
    for m, r in enumerate(rows):
        if ended is not None and ended[r]:
            masks[m] = 0xFFFFFFFF
        else:
            grammars[r].fill(masks[m])
    return idx, masks
