"""What every generator shares: stop rules, finish reasons and the result record.

The reference runner and the engine both feed tokens through a StopChecker, so a
stop token, stop string or length limit ends a request the same way everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sharpinf.errors import ContextLengthError, RequestError
from sharpinf.model.tokenizer import Tokenizer
from sharpinf.params import SamplingParams

FINISH_REASONS = ("stop", "length", "context", "aborted", "rejected")


def check_prompt(prompt_ids: list[int], n_vocab: int, context_length: int) -> None:
    """What makes any prompt impossible, on every path: empty, unknown ids, no room left."""
    if not prompt_ids:
        raise RequestError("empty prompt: give at least one token")
    bad = [t for t in prompt_ids if not 0 <= t < n_vocab]
    if bad:
        raise RequestError(f"token id(s) {bad[:5]} out of range [0, {n_vocab})")
    if len(prompt_ids) >= context_length:
        raise ContextLengthError(f"prompt of {len(prompt_ids)} tokens does not fit the context length {context_length}")


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str  # one of FINISH_REASONS
    metrics: dict = field(default_factory=dict)
    error: str | None = None  # why a request was rejected
    choices: list["GenerationResult"] = field(default_factory=list)  # n > 1: every choice (this one is choice 0)

    def to_json(self) -> dict:
        out = {"prompt_ids": self.prompt_ids, "token_ids": self.token_ids, "text": self.text,
               "finish_reason": self.finish_reason}
        if self.error is not None:
            out["error"] = self.error
        if self.choices:
            out["choices"] = [{k: v for k, v in c.to_json().items() if k != "prompt_ids"} for c in self.choices]
        return out


@dataclass
class StopChecker:
    """Feeds generated tokens; says when and why the request ends, and the final text.

    The text grows incrementally (each token's bytes are decoded once), with exactly the
    result of tokenizer.decode(visible tokens): bytes up to the last UTF-8 start byte are
    decoded for good, the few after it again at each token, and an incomplete character
    shows as U+FFFD until its last byte arrives."""

    params: SamplingParams
    tokenizer: Tokenizer
    context_left: int  # positions left in the context after the prompt
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    text: str = ""

    def __post_init__(self):
        self.stop_ids = set(self.params.stop_token_ids)
        if not self.params.ignore_eos:
            self.stop_ids |= set(self.tokenizer.eot_ids)
        self._pending = bytearray()  # bytes from the last UTF-8 start byte on
        self._final = ""  # the decoded text of every byte before _pending (never changes)

    def add(self, token: int) -> bool:
        """Record a token; True when the request is finished."""
        self.tokens.append(token)
        searched_upto = len(self._final)
        if token in self.stop_ids:
            self.finish_reason = "stop"  # a stop token ends the turn and is not part of the text
        else:
            self._append_bytes(self.tokenizer.token_bytes(token))
        self.text = self._final + self._pending.decode("utf-8", errors="replace")
        for s in self.params.stop:
            at = self.text.find(s, max(0, searched_upto - len(s) + 1))  # earlier text was searched before
            if at >= 0:
                self.text, self.finish_reason = self.text[:at], "stop"
                break
        max_tokens = self.params.max_tokens
        if self.finish_reason is None and max_tokens is not None and len(self.tokens) >= max_tokens:
            self.finish_reason = "length"
        if self.finish_reason is None and len(self.tokens) >= self.context_left:
            self.finish_reason = "context"
        return self.finish_reason is not None

    def stable_len(self) -> int:
        """How much of text is final and may be shown: all of it once the request has finished;
        before that, neither an incomplete UTF-8 character at the end (U+FFFD for now) nor an end
        that could still grow into a stop string (which would cut it away)."""
        if self.finish_reason is not None:
            return len(self.text)
        end = len(self.text)
        try:
            self._pending.decode("utf-8")
        except UnicodeDecodeError:
            end = len(self._final)
        hold = 0
        for s in self.params.stop:
            for k in range(min(len(s) - 1, end), hold, -1):  # the longest prefix of s the text ends with
                if self.text.endswith(s[:k], 0, end):
                    hold = k
                    break
        return end - hold

    def _append_bytes(self, b: bytes) -> None:
        pending = self._pending
        pending += b
        # the last byte that starts a character (not 10xxxxxx): what precedes it decodes the same alone
        cut = len(pending) - 1
        while cut > 0 and pending[cut] & 0xC0 == 0x80:
            cut -= 1
        if cut > 0:
            self._final += pending[:cut].decode("utf-8", errors="replace")
            del pending[:cut]
