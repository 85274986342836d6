"""OpenAI's HTTP API, the parts sharpinf serves: request bodies in, response bodies out.

Requests: /v1/completions (prompt: text or token ids) and /v1/chat/completions (messages, run
through the model's chat template). Sampling fields as OpenAI names them (max_tokens or
max_completion_tokens, temperature, top_p, seed, stop, n, logprobs / top_logprobs,
presence_penalty, frequency_penalty, logit_bias, response_format: text, json_object or
json_schema) plus vLLM's extensions top_k, min_p, repetition_penalty, ignore_eos, guided_json,
guided_regex, guided_grammar (Lark). Defaults are OpenAI's
(temperature 1, completions max_tokens 16, chat until the context is full). Unknown fields are
ignored, as OpenAI's own server does; a known field of the wrong type or value is a 400.
Errors have OpenAI's shape: {"error": {"message", "type", "param", "code"}}. Responses: one Head
(id, created, system_fingerprint) for every body and chunk of a request.
"""

from __future__ import annotations

import codecs
import hashlib
import re
import uuid
from dataclasses import dataclass

from sharpinf.engine.logprobs import TokenLogprobs
from sharpinf.errors import RequestError
from sharpinf.params import MAX_LOGPROBS, SamplingParams, StructuredOutput
from sharpinf.serve.reasoning import REASONING_FORMATS, split_reasoning

# engine finish reasons -> OpenAI's ("context": the model's context is full, a length limit too)
FINISH = {"stop": "stop", "length": "length", "context": "length", "aborted": "abort", "rejected": "error"}


class ApiError(Exception):
    """An HTTP error in OpenAI's shape."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", param)


@dataclass
class Parsed:
    prompt: object  # str, list[int], or a chat (list of {"role", "content"})
    params: SamplingParams
    stream: bool
    include_usage: bool
    logprobs: int | None  # alternatives to list per token (None: no logprobs)
    chat: bool
    structured_field: str | None = None  # the request field that set params.structured
    reasoning: bool = False  # "reasoning_format": "auto": the thinking in reasoning_content (serve/reasoning.py)

    def field(self, param: str | None) -> str | None:
        """An engine error's param (a SamplingParams field) -> the request field to name."""
        return self.structured_field if param == "structured" else param


def _field(body: dict, name: str, kinds: tuple, default=None):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds):
        names = " or ".join({int: "an integer", float: "a number", str: "a string", bool: "true or false",
                             list: "a list", dict: "an object"}[k] for k in kinds)
        raise bad(f"'{name}' must be {names}, got {type(v).__name__} {v!r}", name)
    return v


def text_field(s: str, name: str) -> str:
    """s, if it is text a tokenizer can take: JSON may carry lone UTF-16 surrogates ("\\ud800"),
    which are not Unicode scalar values."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(f"'{name}' holds a lone UTF-16 surrogate, not valid Unicode text", name) from None
    return s


def _prompt(body: dict):
    p = body.get("prompt")
    if p is None:
        raise bad("'prompt' is required: a string or a list of token ids", "prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one
    if isinstance(p, str):
        if not p:
            raise bad("'prompt' is empty", "prompt")
        return text_field(p, "prompt")
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        return p
    if isinstance(p, list) and len(p) > 1 and all(isinstance(x, (str, list)) for x in p):
        raise bad("one prompt per request (send several requests: they are batched on the GPU anyway)", "prompt")
    raise bad("'prompt' must be a non-empty string or a non-empty list of token ids", "prompt")


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("'messages' is required: a non-empty list of {\"role\", \"content\"}", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad(f"messages[{i}] must be an object with a 'role' string and 'content'", "messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: the text ones, joined
            if not all(isinstance(c, dict) and c.get("type") == "text" and isinstance(c.get("text"), str)
                       for c in content):
                raise bad(f"messages[{i}].content: only text parts are supported", "messages")
            content = "".join(c["text"] for c in content)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise bad(f"messages[{i}].content must be a string or a list of text parts", "messages")
        out.append({"role": text_field(m["role"], "messages"), "content": text_field(content, "messages")})
    return out


def parse(body, chat: bool) -> Parsed:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    prompt = _messages(body) if chat else _prompt(body)
    n = _field(body, "n", (int,), 1)
    if chat:
        max_tokens = _field(body, "max_completion_tokens", (int,), None)
        max_tokens = _field(body, "max_tokens", (int,), max_tokens)
    else:
        max_tokens = _field(body, "max_tokens", (int,), 16)
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))):
        raise bad("'stop' must be a string or a list of strings", "stop")
    for st in [stop] if isinstance(stop, str) else stop or []:
        text_field(st, "stop")
    _unsupported(body, chat)
    stream = _field(body, "stream", (bool,), False)
    opts = _field(body, "stream_options", (dict,), {}) or {}
    include_usage = _field(opts, "include_usage", (bool,), False)
    if chat:
        want = _field(body, "logprobs", (bool,), False)
        top = _field(body, "top_logprobs", (int,), 0)
        if top and not want:
            raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        logprobs = top if want else None
    else:
        logprobs = _field(body, "logprobs", (int,), None)
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise bad(f"logprobs: at most {MAX_LOGPROBS} alternatives per token, got {logprobs}",
                  "top_logprobs" if chat else "logprobs")
    fields = dict(max_tokens=max_tokens,
                  temperature=_field(body, "temperature", (int, float), 1.0),
                  top_p=_field(body, "top_p", (int, float), 1.0),
                  top_k=_field(body, "top_k", (int,), 0),
                  min_p=_field(body, "min_p", (int, float), 0.0),
                  repetition_penalty=_field(body, "repetition_penalty", (int, float), 1.0),
                  presence_penalty=_field(body, "presence_penalty", (int, float), 0.0),
                  frequency_penalty=_field(body, "frequency_penalty", (int, float), 0.0),
                  logit_bias=_field(body, "logit_bias", (dict,), None),
                  seed=_seed(_field(body, "seed", (int,), None)),
                  stop=stop, ignore_eos=_field(body, "ignore_eos", (bool,), False), logprobs=logprobs, n=n)
    fields["structured"] = _structured(body)
    if fields["top_k"] == -1:  # vLLM's "off"
        fields["top_k"] = 0
    try:
        params = SamplingParams(**fields)
    except RequestError as exc:
        raise bad(str(exc).removeprefix("invalid sampling parameter: "), _openai_name(exc.param, body, chat)) from None
    return Parsed(prompt, params, stream, include_usage, logprobs, chat, _openai_name("structured", body, chat)
                  if params.structured is not None else None, _reasoning(body, chat, stream))


def _reasoning(body: dict, chat: bool, stream: bool) -> bool:
    fmt = _field(body, "reasoning_format", (str,), "none")
    if fmt not in REASONING_FORMATS:
        raise bad(f"'reasoning_format' must be one of {', '.join(REASONING_FORMATS)}, got {fmt!r}", "reasoning_format")
    if fmt != "none" and (stream or not chat):
        raise bad("'reasoning_format': 'auto' is for chat completions without stream (the split is of the whole "
                  "answer)", "reasoning_format")
    return fmt != "none"


def _structured(body: dict) -> StructuredOutput | None:
    """response_format (OpenAI) or one of vLLM's guided_json / guided_regex / guided_grammar."""
    given = [k for k in ("guided_json", "guided_regex", "guided_grammar") if body.get(k) is not None]
    rf = _field(body, "response_format", (dict,), None)
    kind = None if rf is None else rf.get("type", None)
    if kind not in (None, "text", "json_object", "json_schema"):
        raise bad(f"response_format.type must be text, json_object or json_schema, got {kind!r}", "response_format")
    if kind in ("json_object", "json_schema"):
        given.insert(0, "response_format")
    if len(given) > 1:
        raise bad(f"give one of {' and '.join(given)}, not both", given[1])
    if not given:
        return None
    try:
        if kind == "json_object":
            return StructuredOutput("json_object")
        if kind == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict) or "schema" not in js:
                raise bad("response_format.json_schema must be an object with a 'schema'", "response_format")
            return StructuredOutput.json_schema(js["schema"])
        v = body[given[0]]
        if given[0] == "guided_json":
            return StructuredOutput.json_schema(v)
        if not isinstance(v, str):
            raise bad(f"'{given[0]}' must be a string", given[0])
        return StructuredOutput("regex" if given[0] == "guided_regex" else "lark", v)
    except RequestError as exc:
        raise bad(str(exc).removeprefix("invalid sampling parameter: "), given[0]) from None


def _openai_name(field: str | None, body: dict, chat: bool) -> str | None:
    """A SamplingParams field -> the request field that set it."""
    if field == "max_tokens" and chat and "max_tokens" not in body:
        return "max_completion_tokens"
    if field == "logprobs" and chat:
        return "top_logprobs"
    if field == "structured":
        return next((k for k in ("guided_json", "guided_regex", "guided_grammar") if body.get(k) is not None),
                    "response_format")
    return field


def _seed(v: int | None) -> int | None:
    """OpenAI takes any integer seed; the engine's are 63-bit: the same seed always maps the same."""
    return None if v is None else v % 2**63


# fields OpenAI defines that sharpinf does not implement: refused when they would change the answer
_NEUTRAL = {"echo": False, "best_of": 1, "suffix": "", "tools": [], "functions": []}


def _unsupported(body: dict, chat: bool) -> None:
    for name, neutral in _NEUTRAL.items():
        v = body.get(name)
        if v is None or v == neutral:
            continue
        if name == "best_of" and v == body.get("n", 1):  # n of n candidates: every one returned, nothing to rank
            continue
        raise bad(f"'{name}' is not supported by sharpinf (got {v!r})", name)


# -- responses ---------------------------------------------------------------------------------
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def request_id(header: str | None) -> str:
    """The client's x-request-id when it is a plain token (letters, digits, . _ : -, at most 128),
    else a fresh one."""
    return header if header and _REQUEST_ID.fullmatch(header) else uuid.uuid4().hex[:24]


def new_id(chat: bool, base: str) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + base


def system_fingerprint(engine) -> str:
    """What answers a request: sharpinf's version, the backend, the kernel set, the KV dtype and the
    model file (its size, first and last MiB: hashing all of a large file would hold up startup)."""
    from sharpinf import __version__

    h = hashlib.sha256(f"{__version__}|{engine.backend.name}|{engine.fp.choice.name}|{engine.config.kv_dtype}|".encode())
    path = engine.model.path
    size = path.stat().st_size
    with open(path, "rb") as f:
        h.update(f"{size}|".encode() + f.read(2**20))
        f.seek(max(0, size - 2**20))
        h.update(f.read())
    return "fp_" + h.hexdigest()[:12]


@dataclass(frozen=True)
class Head:
    """What every body and chunk of one response repeats: one id, one `created`, one fingerprint."""

    id: str
    model: str
    created: int
    fingerprint: str

    def of(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _token_text(tok, token_id: int) -> str:
    """A token's text; a token that is part of a UTF-8 character (a lone byte) as "bytes:\\xNN",
    so distinct tokens stay distinct keys in top_logprobs (vLLM writes them so too)."""
    raw = tok.token_bytes(token_id)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


class TextOffsets:
    """text_offset: where each token starts in the answer's text, in characters. A token's bytes
    count once the character they end is complete, so a token inside a multi-byte character starts
    where that character does. Fed token by token: a stream's chunks and a whole answer agree."""

    def __init__(self, tok):
        self.tok, self.chars = tok, 0
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")  # holds back a partial character

    def take(self, token_id: int) -> int:
        at = self.chars
        self.chars += len(self._utf8.decode(self.tok.token_bytes(token_id)))
        return at


def completion_logprobs(tok, lps: list[TokenLogprobs], offsets: TextOffsets) -> dict:
    """The legacy completions shape: tokens, token_logprobs, top_logprobs, text_offset."""
    return {"tokens": [_token_text(tok, lp.token_id) for lp in lps], "token_logprobs": [lp.logprob for lp in lps],
            "top_logprobs": [{_token_text(tok, i): v for i, v in lp.top} for lp in lps],
            "text_offset": [offsets.take(lp.token_id) for lp in lps]}


def chat_logprobs(tok, lps: list[TokenLogprobs]) -> dict:
    def entry(i: int, v: float) -> dict:
        return {"token": _token_text(tok, i), "logprob": v, "bytes": list(tok.token_bytes(i))}

    return {"content": [{**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(i, v) for i, v in lp.top]}
                        for lp in lps]}


def choice_body(index: int, text: str, finish: str | None, lp: dict | None, chat: bool, chunk: bool = False,
                first: bool = False, reasoning: bool = False) -> dict:
    """One entry of `choices`: choice `index`'s text (a chat message, or its delta in a stream chunk)."""
    if not chat:
        return {"index": index, "text": text, "logprobs": lp, "finish_reason": finish}
    if chunk:
        delta = ({"role": "assistant", "content": text} if first else {"content": text}) if text or first else {}
        return {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
    message = {"role": "assistant", "content": text}
    if reasoning:
        thinking, message["content"] = split_reasoning(text)
        message["reasoning_content"] = thinking
    return {"index": index, "message": message, "logprobs": lp, "finish_reason": finish}


def completion_body(head: Head, choices: list[dict], use: dict | None, chat: bool, chunk: bool = False) -> dict:
    obj = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    body = {**head.of(obj), "choices": choices}
    if use is not None:
        body["usage"] = use
    return body


def usage_chunk(head: Head, chat: bool, use: dict) -> dict:
    return {**head.of("chat.completion.chunk" if chat else "text_completion"), "choices": [], "usage": use}
