"""EngineConfig: every knob of the engine, validated once."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sharpinf.engine.spec_config import SpeculativeConfig
from sharpinf.errors import SharpinfError
from sharpinf.step.buffers import StepCapacity
from sharpinf.step.kv_pool import kv_dtype_name
from sharpinf.ops.variants import check_kernels
from sharpinf.params import as_float, as_int


@dataclass
class EngineConfig:
    backend: str | None = None  # cuda, emu, auto (None: $SHARPINF_BACKEND or auto)
    block_size: int = 16
    kv_dtype: str = "f16"
    # KV pool: on CUDA sized from free memory (gpu_memory_utilization); num_blocks overrides it.
    # On the emulator num_blocks comes from here (default 256 blocks = 4096 tokens).
    num_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    max_num_batched_tokens: int = 512  # per-step token budget (decodes first, then prefill chunks)
    max_num_seqs: int = 64  # sequences running at once
    max_model_len: int | None = None  # longest prompt + output of a request (default: the model's context)
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True  # off: a prompt is admitted only when it fits one step whole
    enforce_eager: bool = False  # True: run each step's launches one by one, no CUDA graphs
    kernels: str | dict = "auto"  # kernel variants: auto (fast on a GPU, simple on the emulator), fast, simple,
    #                               "op=variant,..." or {op: variant} (sharpinf/ops/variants.py)
    seed: int = 0  # for requests that give no seed
    # schedule and submit step n+1 before collecting step n, so the host's work (scheduling, packing,
    # stop rules, text) overlaps the device's; the tokens are the same either way (vLLM's name)
    # (None: on, unless speculative decoding is: its guesses need the last step's token on the host)
    async_scheduling: bool | None = None
    # speculative decoding (engine/speculative.py): "ngram", "draft:MODEL", a dict of SpeculativeConfig's
    # fields (vLLM's speculative_config), or None
    speculative: object = None

    def __post_init__(self):
        self.speculative = SpeculativeConfig.parse(self.speculative)
        if self.async_scheduling is None:
            self.async_scheduling = self.speculative is None
        elif self.async_scheduling and self.speculative is not None:
            raise SharpinfError("engine config: speculative decoding runs with async_scheduling off (a step's "
                                "guesses follow the last step's token, on the host): leave async_scheduling unset")
        self._check_types()
        self.kv_dtype = kv_dtype_name(self.kv_dtype)
        check_kernels(self.kernels)  # one line naming a bad op or variant, before anything loads
        checks = [
            (self.block_size >= 1, f"block_size must be >= 1, got {self.block_size}"),
            (self.num_blocks is None or self.num_blocks >= 1, f"num_blocks must be >= 1, got {self.num_blocks}"),
            (0 < self.gpu_memory_utilization <= 1, f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"),
            (self.max_num_batched_tokens >= 1, f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"),
            (self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}"),
            (self.max_model_len is None or self.max_model_len >= 2, f"max_model_len must be >= 2, got {self.max_model_len}"),
            (self.seed >= 0, f"seed must be >= 0, got {self.seed}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise SharpinfError(f"engine config: {msg}")

    def _check_types(self) -> None:
        """Each field its type, or one line naming it; NumPy scalars become Python ones."""
        def bad(name, want):
            v = getattr(self, name)
            raise SharpinfError(f"engine config: {name} must be {want}, got {type(v).__name__} {v!r}")

        for name in ("block_size", "num_blocks", "max_num_batched_tokens", "max_num_seqs", "max_model_len", "seed"):
            v = getattr(self, name)
            if v is None and name in _OPTIONAL:
                continue
            if as_int(v) is None:
                bad(name, "an integer" + (" or None" if name in _OPTIONAL else ""))
            setattr(self, name, as_int(v))
        if as_float(self.gpu_memory_utilization) is None:
            bad("gpu_memory_utilization", "a number")
        self.gpu_memory_utilization = as_float(self.gpu_memory_utilization)
        for name in ("enable_prefix_caching", "enable_chunked_prefill", "enforce_eager", "async_scheduling"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                bad(name, "True or False")
            setattr(self, name, bool(getattr(self, name)))
        if not isinstance(self.kv_dtype, str):
            bad("kv_dtype", "a string (fp16, bf16, fp32 or q8_0)")
        if self.backend is not None and not isinstance(self.backend, str):
            bad("backend", "a string (cuda, emu, auto) or None")


_OPTIONAL = ("num_blocks", "max_model_len")


def run_context(cfg, asked: int | None) -> int:
    """max_model_len: what was asked, within the file's context (else the file's context)."""
    return min(cfg.context_length, asked or cfg.context_length)


def step_capacity(ec: EngineConfig, max_model_len: int) -> StepCapacity:
    """The largest step the scheduler can make: the token budget (a whole prompt when chunked
    prefill is off: set max_model_len to keep that workspace small), max_num_seqs sequences,
    each wanting one row of logits (speculating: one for its last token and each guess)."""
    tokens = ec.max_num_batched_tokens
    if not ec.enable_chunked_prefill:  # an unchunked prompt runs whole, beside the decodes
        tokens = max(tokens, max_model_len + ec.max_num_seqs)
    rows = ec.max_num_seqs * (1 + (ec.speculative.num_speculative_tokens if ec.speculative else 0))
    return StepCapacity(tokens=tokens, seqs=ec.max_num_seqs, rows=min(rows, max(tokens, ec.max_num_seqs)),
                        history=tokens + ec.max_num_seqs)
