"""The host's gap in a decode step: engine.step() wall time minus the device's time for the step,
with async scheduling off and on (EngineConfig.async_scheduling).

B sequences decode together in an LLMEngine (prompts of `context` tokens, prefilled first). The
wall time of engine.step() is timed over `steps` decode steps. The device time of the same step
is the engine's own last decode Batch submitted back to back (`steps` times, then one wait):
the queue stays full, so this is the device's time per step (at least the kernels'; the host's
submit work only shows where it is the longer of the two). The gap is what the host adds:
scheduling, packing, stop rules and text off the device's critical path should bring it
towards 0 with async scheduling on.
"""

from __future__ import annotations

import time

import numpy as np

from bench.suites.common import BenchContext, random_prompt
from sharpinf.step.buffers import SamplingRows


def _engine(ctx: BenchContext, B: int, context: int, steps: int, block_size: int, kv_dtype: str, asynchronous: bool):
    from sharpinf.engine.llm_engine import LLMEngine

    per_seq = -(-(context + steps + 8) // block_size)
    return LLMEngine(ctx.model, backend=ctx.backend, kernels=ctx.kernels, kv_dtype=kv_dtype, block_size=block_size,
                     num_blocks=B * per_seq + 4, max_num_seqs=B, max_num_batched_tokens=max(256, B),
                     max_model_len=min(ctx.model.config.context_length, context + steps + 16),
                     async_scheduling=asynchronous)


def _device_s(eng, steps: int) -> float:
    """Seconds per step of the engine's last Batch submitted back to back (the device's time)."""
    fp, batch = eng.fp, eng.runner.last_batch
    rows = SamplingRows.greedy(len(batch.logits_rows))
    fp.submit(batch, eng.pool, validate=False, sampling=rows).result()  # warm
    t0 = time.perf_counter()
    pending = [fp.submit(batch, eng.pool, validate=False, sampling=rows) for _ in range(steps)]
    pending[-1].result()
    return (time.perf_counter() - t0) / steps


def measure(ctx: BenchContext, B: int, context: int, steps: int, block_size: int, kv_dtype: str) -> dict:
    """{"batch_size", "device_ms", "sync": {...}, "async": {...}}: each mode's median step wall time
    and its gap over the device's time, in ms."""
    cfg = ctx.model.config
    context = max(1, min(context, cfg.context_length - steps - 16))
    out: dict = {"batch_size": B}
    from sharpinf.params import SamplingParams

    for mode in ("sync", "async"):
        eng = _engine(ctx, B, context, steps, block_size, kv_dtype, mode == "async")
        rng = np.random.default_rng(ctx.seed)
        sp = SamplingParams(max_tokens=steps + 6, ignore_eos=True)
        for _ in range(B):
            eng.add_request(random_prompt(rng, context, cfg.n_vocab), sp)
        while any(not s.output_ids for s in eng.requests.values()):
            eng.step()  # prefill every prompt: from here on each step decodes them all
        eng.step()  # warm: first use of this shape
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            eng.step()
            times.append(time.perf_counter() - t0)
        wall = float(np.median(times))
        for rid in list(eng.requests):
            eng.abort(rid)
        eng.step()  # collect what is still in flight
        if mode == "sync":  # the device's time for this step shape, once (the engine's batch is the same in both modes)
            out["device_ms"] = _device_s(eng, steps) * 1e3
        out[mode] = {"step_ms": wall * 1e3, "host_gap_ms": wall * 1e3 - out["device_ms"]}
        eng.fp.release_plans()
        del eng
    return out
