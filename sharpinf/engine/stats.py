"""The engine's counters: the last step's host times and the run's totals (`engine_metrics()`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class StepTimes:
    """Host seconds of the last step: scheduling and submitting (batch, upload, launches or graph
    replays; with async scheduling, of the next step); the wait for the collected step's ids and
    the model runner's collect; the tokens' bookkeeping (stop rules, text)."""

    schedule_s: float
    run_s: float
    finish_s: float


@dataclass
class EngineMetrics:
    started: float = field(default_factory=time.perf_counter)
    steps: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    tokens_computed: int = 0  # prompt and fed tokens the forward pass computed (prefix hits not, recomputation too)
    finished: int = 0
    rejected: int = 0

    def to_json(self, engine: "LLMEngine") -> dict:
        elapsed = time.perf_counter() - self.started
        return {
            "steps": self.steps,
            "elapsed_s": elapsed,
            "generated_tokens": self.generated_tokens,
            "prompt_tokens": self.prompt_tokens,
            "tokens_computed": self.tokens_computed,
            "throughput_tok_per_s": self.generated_tokens / elapsed if elapsed > 0 else 0.0,
            "preemptions": engine.scheduler.preemptions,
            "kv_usage": engine.blocks.usage,
            "prefix_cache_hit_rate": engine.blocks.hit_rate,
            "finished": self.finished,
            "rejected": self.rejected,
            "running": len(engine.scheduler.running),
            "waiting": len(engine.scheduler.waiting),
            "cuda_graphs": engine.graph_report,  # {"graphs", "seconds", "bytes"}; None when eager
            "kernels_compiled": engine.fp.compile_report,
            "workspace_bytes": engine.fp.workspace_bytes(),
            "speculative": None if engine.spec is None else engine.spec.to_json(),
        }
