"""What one request may ask of the server, refused before any heavy work.

    body       over max_body_bytes: 413, said from Content-Length or while the body streams in
               (parsing JSON holds the GIL: a 4 MiB body takes ~50 ms, so the cap bounds that stall)
    prompt     more characters than can ever fit the context: 400 context_length_exceeded before
               tokenizing. A token stands for at most `longest` bytes of text (the vocabulary's
               longest token) and a character is at least one byte, so a prompt of more than
               max_model_len * longest characters is more than max_model_len tokens. (A SentencePiece
               vocabulary without byte fallback maps a run of unknown characters to one token: set
               max_prompt_chars by hand for one.) Token ids: more than the context, same answer.
    stop       at most max_stop_strings strings of at most max_stop_chars each: every one is
               searched, and its prefixes held back, at every token

A context error says "This model's maximum context length is N tokens" as OpenAI does, with
code context_length_exceeded: clients (litellm's ContextWindowExceededError) and routers key
their fallbacks on those.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from sharpinf.serve.protocol import ApiError, bad

CONTEXT_CODE = "context_length_exceeded"


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 4 * 2**20
    max_prompt_chars: int | None = None  # None: max_model_len x the vocabulary's longest token in bytes
    max_stop_strings: int = 16  # OpenAI allows 4
    max_stop_chars: int = 512

    def __post_init__(self):
        for name in ("max_body_bytes", "max_stop_strings", "max_stop_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_prompt_chars is not None and self.max_prompt_chars < 1:
            raise ValueError(f"max_prompt_chars must be at least 1, got {self.max_prompt_chars}")


def too_large(what: str, limit: int) -> ApiError:
    return ApiError(413, f"the request body is {what}; this server takes at most {limit} bytes (--max-body-bytes)",
                    "invalid_request_error", None, "request_too_large")


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or a 413 as soon as it is known to pass `limit` (before it is all read)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(f"{int(declared)} bytes", limit)
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            raise too_large(f"over {limit} bytes", limit)
        chunks.append(chunk)
    return b"".join(chunks)


def context_error(max_len: int, detail: str, param: str | None) -> ApiError:
    return ApiError(400, f"This model's maximum context length is {max_len} tokens; {detail}",
                    "invalid_request_error", param, CONTEXT_CODE)


class PromptLimits:
    """The limits of one server over its engine: built once the engine is ready."""

    def __init__(self, limits: Limits, max_model_len: int, longest_token_bytes: int):
        self.limits = limits
        self.max_model_len = max_model_len
        self.max_chars = limits.max_prompt_chars or max_model_len * max(1, longest_token_bytes)

    @classmethod
    def of(cls, limits: Limits, engine) -> "PromptLimits":
        tok = engine.tokenizer
        return cls(limits, engine.max_model_len, max(len(tok.token_bytes(i)) for i in range(tok.n_vocab)))

    def check_stops(self, body: dict) -> None:
        """On the raw body, before SamplingParams sees the strings."""
        stop = body.get("stop")
        stops = stop if isinstance(stop, list) else [stop] if isinstance(stop, str) else []
        lim = self.limits
        if len(stops) > lim.max_stop_strings:
            raise bad(f"'stop': at most {lim.max_stop_strings} stop strings, got {len(stops)}", "stop")
        for s in stops:
            if isinstance(s, str) and len(s) > lim.max_stop_chars:
                raise bad(f"'stop': a stop string has {len(s)} characters; at most {lim.max_stop_chars}", "stop")

    def check_prompt(self, prompt, param: str) -> None:
        """Before tokenizing: text that is surely too long, or too many token ids."""
        if isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
            chars = sum(len(m["role"]) + len(m["content"]) for m in prompt)
        elif isinstance(prompt, str):
            chars = len(prompt)
        else:  # token ids
            self.check_tokens(len(prompt), param)
            return
        if chars > self.max_chars:
            raise context_error(self.max_model_len, f"the prompt has {chars} characters, more than the "
                                f"{self.max_chars} that {self.max_model_len} tokens can hold", param)

    def check_tokens(self, n: int, param: str) -> None:
        """After tokenizing: a prompt must leave room for one token (the engine says the same)."""
        if n >= self.max_model_len:
            raise context_error(self.max_model_len, f"the prompt has {n} tokens, with no room left to generate",
                                param)
