"""SpeculativeConfig: how speculative decoding is asked for (engine/speculative.py does it).

Apart from the Speculator so that the engine's config can hold it while the draft proposer
(engine/draft.py), which the Speculator builds, uses the engine's config, scheduler and runner.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from sharpinf.errors import SharpinfError
from sharpinf.params import as_int

METHODS = ("ngram", "draft")


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's speculative_config, in its names: method "ngram" (prompt lookup) or "draft" (model)."""

    method: str
    num_speculative_tokens: int = 4  # k: guesses verified per step and sequence
    model: str | None = None  # draft: a registered name or a .gguf with the target's vocabulary
    prompt_lookup_max: int = 4  # ngram: the longest suffix looked up in the sequence's own tokens
    prompt_lookup_min: int = 1  # ngram: the shortest

    def __post_init__(self):
        def bad(msg):
            raise SharpinfError(f"speculative: {msg}")

        if self.method not in METHODS:
            bad(f"method {self.method!r}: choose ngram or draft")
        for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"):
            v = as_int(getattr(self, name))
            if v is None or v < 1:
                bad(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
            object.__setattr__(self, name, v)
        if self.prompt_lookup_min > self.prompt_lookup_max:
            bad(f"prompt_lookup_min {self.prompt_lookup_min} > prompt_lookup_max {self.prompt_lookup_max}")
        if (self.method == "draft") != (self.model is not None):
            bad("a draft model is given with method draft, and only then (draft:MODEL)")

    @classmethod
    def parse(cls, spec, k: int | None = None) -> "SpeculativeConfig | None":
        """None, "ngram", "draft:MODEL", a dict of these fields, or a SpeculativeConfig; k (the CLI's
        --num-speculative-tokens) overrides the count."""
        if spec is None or spec == "" or spec is False:
            if k is not None:
                raise SharpinfError("speculative: --num-speculative-tokens needs --speculative ngram|draft:MODEL")
            return None
        if isinstance(spec, cls):
            out = spec
        elif isinstance(spec, str):
            method, _, model = spec.partition(":")
            if method == "draft" and not model:
                raise SharpinfError("speculative: draft needs its model, as draft:MODEL (a name or a .gguf)")
            if method == "ngram" and model:
                raise SharpinfError(f"speculative: {spec!r}: ngram takes no model")
            out = cls(method, model=model or None)
        elif isinstance(spec, dict):
            names = {f.name for f in fields(cls)}
            unknown = sorted(set(spec) - names)
            if unknown:
                raise SharpinfError(f"speculative: unknown field(s) {', '.join(unknown)}; the fields are "
                                    f"{', '.join(f.name for f in fields(cls))}")
            if "method" not in spec:
                raise SharpinfError("speculative: the dict needs a method (ngram or draft)")
            out = cls(**spec)
        else:
            raise SharpinfError(f"speculative must be None, 'ngram', 'draft:MODEL' or a dict, got {type(spec).__name__}")
        return out if k is None else cls(**{**out.__dict__, "num_speculative_tokens": k})

    def to_json(self) -> dict:
        out = dict(self.__dict__)
        if out["model"] is not None and not isinstance(out["model"], str):  # a Path or a LoadedModel
            out["model"] = str(getattr(out["model"], "path", out["model"]))
        return out
