"""What every generator shares: stop rules, finish reasons and the result record.

The reference runner and the engine both feed tokens through a StopChecker, so a
stop token, stop string or length limit ends a request the same way everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sharpinf.errors import RequestError
from sharpinf.model.tokenizer import Tokenizer
from sharpinf.sampling import SamplingParams

FINISH_REASONS = ("stop", "length", "context", "aborted", "rejected")


def check_prompt(prompt_ids: list[int], n_vocab: int, context_length: int) -> None:
    """What makes any prompt impossible, on every path: empty, unknown ids, no room left."""
    if not prompt_ids:
        raise RequestError("empty prompt: give at least one token")
    bad = [t for t in prompt_ids if not 0 <= t < n_vocab]
    if bad:
        raise RequestError(f"token id(s) {bad[:5]} out of range [0, {n_vocab})")
    if len(prompt_ids) >= context_length:
        raise RequestError(f"prompt of {len(prompt_ids)} tokens does not fit the context length {context_length}")


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str  # one of FINISH_REASONS
    metrics: dict = field(default_factory=dict)
    error: str | None = None  # why a request was rejected

    def to_json(self) -> dict:
        out = {"prompt_ids": self.prompt_ids, "token_ids": self.token_ids, "text": self.text,
               "finish_reason": self.finish_reason}
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass
class StopChecker:
    """Feeds generated tokens; says when and why the request ends, and the final text."""

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

    def add(self, token: int) -> bool:
        """Record a token; True when the request is finished."""
        self.tokens.append(token)
        if token in self.stop_ids:
            self.finish_reason = "stop"
        self.text = self.tokenizer.decode(self._visible())
        for s in self.params.stop:
            at = self.text.find(s)
            if at >= 0:
                self.text, self.finish_reason = self.text[:at], "stop"
                break
        max_tokens = self.params.max_tokens
        if self.finish_reason is None and max_tokens is not None and len(self.tokens) >= max_tokens:
            self.finish_reason = "length"
        if self.finish_reason is None and len(self.tokens) >= self.context_left:
            self.finish_reason = "context"
        return self.finish_reason is not None

    def _visible(self) -> list[int]:
        # a stop token ends the turn and is not part of the answer's text
        if self.tokens and self.tokens[-1] in self.stop_ids:
            return self.tokens[:-1]
        return self.tokens
