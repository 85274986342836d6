"""SamplingParams: what a request asks of the sampler, validated once, at submission.

The rule that applies them, on every backend, is in sharpinf/ops/sampling.py. The order is
vLLM's: an allowed-token mask (structured output), logit_bias, the repetition penalty, presence
and frequency penalties (over the request's generated tokens, OpenAI's formula), then
temperature, then top-k, top-p and min-p on the resulting distribution. temperature == 0 means
greedy, ties to the lowest id.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from sharpinf.errors import RequestError

MAX_LOGPROBS = 20  # the most alternatives a token's logprobs may list (OpenAI's limit too)
MAX_N = 128  # the most choices one request may ask for (OpenAI's limit too)
MAX_LOGIT_BIAS = 300  # logit_bias entries (OpenAI's limit)


STRUCTURED_KINDS = ("json_object", "json_schema", "regex", "lark")


@dataclass(frozen=True)
class StructuredOutput:
    """Output constrained by a grammar (engine/grammar.py compiles it with llguidance):
    json_object (any JSON object; spec unused), json_schema (spec: the schema as JSON text),
    regex (spec: the pattern), lark (spec: a Lark grammar)."""

    kind: str
    spec: str = ""

    def __post_init__(self):
        if self.kind not in STRUCTURED_KINDS:
            _bad(f"structured output kind must be one of {', '.join(STRUCTURED_KINDS)}, got {_shown(self.kind)}",
                 "structured")
        if not isinstance(self.spec, str) or (self.kind != "json_object" and not self.spec):
            _bad(f"structured output {self.kind} needs its {self.kind} as a non-empty string, got {_shown(self.spec)}",
                 "structured")

    @classmethod
    def json_schema(cls, schema) -> "StructuredOutput":
        """From a schema given as a dict (or JSON text), stored as JSON text."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                _bad(f"the JSON schema is not valid JSON: {exc}", "structured")
        if not isinstance(schema, (dict, bool)):
            _bad(f"a JSON schema must be an object, got {_shown(schema)}", "structured")
        return cls("json_schema", json.dumps(schema))  # key order kept: properties come out in it


@dataclass(frozen=True)
class SamplingParams:
    """Validated and normalized at construction: NumPy scalars become Python ones, a single
    stop string or stop id becomes a one-element tuple, None means no stops. Anything else
    of the wrong type or value is a one-line RequestError."""

    max_tokens: int | None = 64  # None: until a stop or the context limit
    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    repetition_penalty: float = 1.0  # 1: off
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()  # also: one id, or None
    stop: tuple[str, ...] = ()  # stop strings (not included in the output text); also: one string, or None
    ignore_eos: bool = False
    logprobs: int | None = None  # None: off; k >= 0: each new token's log-probability and the k most likely (k <= 20)
    n: int = 1  # choices: n sequences from one prompt, computed once (its KV blocks shared), seeded apart
    presence_penalty: float = 0.0  # in [-2, 2]: subtracted once from each id already generated
    frequency_penalty: float = 0.0  # in [-2, 2]: times how often the id was generated
    logit_bias: tuple[tuple[int, float], ...] = ()  # also a dict {id: bias}; bias in [-100, 100], <= 300 ids
    structured: StructuredOutput | None = None  # the output must match this grammar (finished grammar: "stop")

    def __post_init__(self):
        def put(name, value):
            object.__setattr__(self, name, value)

        put("max_tokens", _int("max_tokens", self.max_tokens, 1, optional=True))
        put("temperature", _number("temperature", self.temperature, lambda x: x >= 0, ">= 0"))
        put("top_k", _int("top_k", self.top_k, 0))
        put("top_p", _number("top_p", self.top_p, lambda x: 0 < x <= 1, "in (0, 1]"))
        put("min_p", _number("min_p", self.min_p, lambda x: 0 <= x <= 1, "in [0, 1]"))
        put("repetition_penalty", _number("repetition_penalty", self.repetition_penalty, lambda x: x > 0, "> 0"))
        put("seed", _int("seed", self.seed, 0, optional=True, below=2**63))
        ids = _one_or_many("stop_token_ids", self.stop_token_ids, lambda v: as_int(v) is not None)
        put("stop_token_ids", tuple(_int(f"stop_token_ids[{i}]", t, 0) for i, t in enumerate(ids)))
        stops = _one_or_many("stop", self.stop, lambda v: isinstance(v, str))
        put("stop", tuple(_stop_string(i, s) for i, s in enumerate(stops)))
        if not isinstance(self.ignore_eos, (bool, np.bool_)):
            _bad(f"ignore_eos must be true or false, got {_shown(self.ignore_eos)}", "ignore_eos")
        put("ignore_eos", bool(self.ignore_eos))
        put("logprobs", _int("logprobs", self.logprobs, 0, optional=True, below=MAX_LOGPROBS + 1))
        put("n", _int("n", self.n, 1, below=MAX_N + 1))
        for name in ("presence_penalty", "frequency_penalty"):
            put(name, _number(name, getattr(self, name), lambda x: -2 <= x <= 2, "in [-2, 2]"))
        put("logit_bias", _logit_bias(self.logit_bias))
        put("structured", _structured(self.structured))

    @classmethod
    def from_dict(cls, d: dict) -> "SamplingParams":
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise RequestError(f"unknown sampling field(s): {', '.join(sorted(unknown))}")
        return cls(**d)


# -- validation: a Python or NumPy scalar of the right kind, or one clear line ----------------------

def _bad(what: str, field: str):
    raise RequestError(f"invalid sampling parameter: {what}", field)


def _shown(v) -> str:
    """`str '5'`, `bool True`: the type too, since '5' and 5 print alike in many places."""
    return f"{type(v).__name__} {v!r}"


def as_int(v) -> int | None:
    """A Python int for an int or NumPy integer; None for anything else (bools included: True is no count)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        return None
    return int(v)


def as_float(v) -> float | None:
    """A Python float for a Python or NumPy int or float; None for anything else (bools, strings)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        return None
    try:
        return float(v)
    except OverflowError:  # an int beyond any float: infinite for the checks that follow
        return math.inf if v > 0 else -math.inf


def _int(name: str, v, lo: int, optional: bool = False, below: int | None = None) -> int | None:
    """below, when given: a power of two (shown as 2**k) or a small bound (shown as a range)."""
    if v is None and optional:
        return None
    field = name.partition("[")[0]  # stop_token_ids[2] -> stop_token_ids
    n = as_int(v)
    pow2 = below is not None and not below & (below - 1)
    rule = (f">= {lo}" + (f" and < 2**{below.bit_length() - 1}" if pow2 else f" and <= {below - 1}" if below else "")
            + (" (or None)" if optional else ""))
    if n is None:
        _bad(f"{name} must be an integer {rule}, got {_shown(v)}", field)
    if n < lo or (below is not None and n >= below):
        if below is not None and below & (below - 1):  # not a power of two: say the bound plainly
            _bad(f"{name} must be an integer from {lo} to {below - 1}, got {n}", field)
        _bad(f"{name} must be an integer {rule}, got {n}", field)
    return n


_F32_TINY, _F32_MAX = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)  # Python floats: no casts


def _number(name: str, v, ok, rule: str) -> float:
    field = name.partition("[")[0]  # logit_bias[5] -> logit_bias
    x = as_float(v)
    if x is None:
        _bad(f"{name} must be a number {rule}, got {_shown(v)}", field)
    if not math.isfinite(x):
        _bad(f"{name} must be a finite number {rule}, got {x}", field)
    if x != 0 and not _F32_TINY <= abs(x) <= _F32_MAX:  # the sampling kernel would see 0 or inf
        _bad(f"{name} must be 0 or of size {_F32_TINY:.3g} to {_F32_MAX:.3g} (float32), got {x}", field)
    if not ok(x):
        _bad(f"{name} must be {rule}, got {x}", field)
    return x


def _one_or_many(name: str, v, is_one) -> tuple:
    """None -> (); one item -> (item,); a list, tuple, set or array -> its items. A str is one stop
    string, never its characters."""
    if v is None:
        return ()
    if is_one(v):
        return (v,)
    if isinstance(v, (list, tuple, set, frozenset, np.ndarray)):
        return tuple(v.tolist() if isinstance(v, np.ndarray) else v)
    _bad(f"{name} must be one value or a list of them, got {_shown(v)}", name)


def _stop_string(i: int, s) -> str:
    if not isinstance(s, str) or not s:
        _bad(f"stop[{i}] must be a non-empty string, got {_shown(s)}", "stop")
    return s


def _logit_bias(v) -> tuple[tuple[int, float], ...]:
    """{id: bias} (ids as ints or decimal strings, as JSON has them) or (id, bias) pairs -> sorted pairs."""
    if v is None:
        return ()
    if isinstance(v, dict):
        items = list(v.items())
    elif isinstance(v, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in v):
        items = list(v)
    else:
        _bad(f"logit_bias must be a map of token id to bias, got {_shown(v)}", "logit_bias")
    if len(items) > MAX_LOGIT_BIAS:
        _bad(f"logit_bias may hold at most {MAX_LOGIT_BIAS} token ids, got {len(items)}", "logit_bias")
    out: dict[int, float] = {}
    for k, b in items:
        i = as_int(k)
        if i is None and isinstance(k, str) and k.strip().isdigit():
            i = int(k)
        if i is None or i < 0:
            _bad(f"logit_bias keys must be token ids (integers >= 0), got {_shown(k)}", "logit_bias")
        if i in out:
            _bad(f"logit_bias names token id {i} twice", "logit_bias")
        out[i] = _number(f"logit_bias[{i}]", b, lambda x: -100 <= x <= 100, "in [-100, 100]")
    return tuple(sorted(out.items()))


def _structured(v) -> StructuredOutput | None:
    """A StructuredOutput, or the dict {"kind": ..., "spec": ...} a JSON file holds (a json_schema
    spec may be the schema itself)."""
    if v is None or isinstance(v, StructuredOutput):
        return v
    if isinstance(v, dict) and set(v) <= {"kind", "spec"} and "kind" in v:
        if v["kind"] == "json_schema":
            return StructuredOutput.json_schema(v.get("spec"))
        return StructuredOutput(v["kind"], v.get("spec", ""))
    _bad(f'structured must be a StructuredOutput or {{"kind": ..., "spec": ...}}, got {_shown(v)}', "structured")
