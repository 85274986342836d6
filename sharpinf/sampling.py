"""SamplingParams (validated once, at submission) and the host sampler the reference uses.

The order of the filters is the common one (llama.cpp and vLLM agree): repetition
penalty on the raw logits, then temperature, then top-k, top-p and min-p on the
resulting distribution. temperature == 0 means greedy, ties to the lowest id.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from sharpinf.errors import RequestError


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int | None = 64  # None: until a stop or the context limit
    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    repetition_penalty: float = 1.0  # 1: off
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()  # stop strings (not included in the output text)
    ignore_eos: bool = False

    def __post_init__(self):
        def bad(what):
            raise RequestError(f"invalid sampling parameter: {what}")

        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            bad(f"max_tokens must be an integer >= 1 (or None), got {self.max_tokens!r}")
        if not _finite(self.temperature) or self.temperature < 0:
            bad(f"temperature must be >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            bad(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not _finite(self.top_p) or not 0 < self.top_p <= 1:
            bad(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _finite(self.min_p) or not 0 <= self.min_p <= 1:
            bad(f"min_p must be in [0, 1], got {self.min_p!r}")
        if not _finite(self.repetition_penalty) or self.repetition_penalty <= 0:
            bad(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or not 0 <= self.seed < 2**63):
            bad(f"seed must be a non-negative integer, got {self.seed!r}")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            bad(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            bad(f"stop strings must be non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def from_dict(cls, d: dict) -> "SamplingParams":
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise RequestError(f"unknown sampling field(s): {', '.join(sorted(unknown))}")
        return cls(**d)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def apply_repetition_penalty(logits: np.ndarray, seen: list[int], penalty: float) -> np.ndarray:
    """llama.cpp/CTRL rule: divide positive logits of seen tokens by the penalty, multiply negative ones."""
    if penalty == 1.0 or not seen:
        return logits
    out = logits.copy()
    ids = np.unique(np.asarray(seen, dtype=np.int64))
    vals = out[ids]
    out[ids] = np.where(vals > 0, vals / np.float32(penalty), vals * np.float32(penalty))
    return out


def filtered_probs(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """Probabilities after temperature, top-k, top-p and min-p (float64, sums to 1)."""
    z = logits.astype(np.float64) / p.temperature
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")  # descending, ties to the lowest id
    keep = np.ones(len(order), dtype=bool)
    if p.top_k > 0:
        keep[p.top_k :] = False
    if p.top_p < 1.0:
        cum = np.cumsum(probs[order])
        # keep the smallest prefix whose mass reaches top_p (the token crossing it stays)
        keep &= np.concatenate([[True], cum[:-1] < p.top_p])
    if p.min_p > 0.0:
        keep &= probs[order] >= p.min_p * probs[order[0]]
    mask = np.zeros_like(probs, dtype=bool)
    mask[order[keep]] = True
    probs = np.where(mask, probs, 0.0)
    return probs / probs.sum()


@dataclass
class HostSampler:
    """Per-request sampler for the reference backend: seeded, independent of any batch."""

    params: SamplingParams
    rng: np.random.Generator = field(init=False)

    def __post_init__(self):
        self.rng = np.random.default_rng(self.params.seed)

    def __call__(self, logits: np.ndarray, seen: list[int]) -> int:
        logits = apply_repetition_penalty(logits, seen, self.params.repetition_penalty)
        if self.params.greedy:
            return int(np.argmax(logits))
        probs = filtered_probs(logits, self.params)
        return int(self.rng.choice(len(probs), p=probs))
