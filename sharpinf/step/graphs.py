"""Graph capture: every plan a frozen capacity can run, captured once over one KV pool.

A body for each token bucket and each attention shape tuple it can take (step/shapes.py), and a
sampling head for each row bucket. They are captured over a descriptor of padding only, so the
warm-up run and the captures touch nothing but the pool's scratch block.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from sharpinf.progress import note, progress_bar
from sharpinf.step.buffers import StepDescriptor
from sharpinf.step.launches import StepLaunches
from sharpinf.step.plan import PlanCache, PlanKey
from sharpinf.step.shapes import AttentionShapes


def idle_step(d: StepDescriptor) -> None:
    """Make `d` a step of padding only (every token in the padding sequence): running any plan over
    it touches nothing but the scratch block."""
    d.be.synchronize()  # nothing may still be copying out of the staging buffer
    h = d.h
    for k in ("token_ids", "positions", "logits_rows", "params", "top_k", "steps", "clear", "count_n", "add_off",
              "seeds"):
        h[k][...] = 0
    h["slot_mapping"][:] = d.scratch_block * d.block_size
    h["cu_seqlens"][:-1] = 0
    h["cu_seqlens"][-1] = d.cap.tokens
    h["slots"][:] = -1
    h["mask_idx"][:] = -1
    h["feed_rows"][:] = -1
    d.upload(d.nbytes)


def capture_buckets(plans: PlanCache, launches: StepLaunches, shapes: AttentionShapes, token_ladder: list[int],
                    row_ladder: list[int], kv, d: StepDescriptor) -> dict:
    """Capture the graph of every bucket's body and sampling head over `kv` and `d` (bound to it) into
    `plans`. Returns {"graphs", "seconds", "bytes"}."""
    be = plans.backend
    idle_step(d)
    keys: list[tuple[PlanKey, Callable[[], Any]]] = [
        (("body", n, sh), (lambda n=n, sh=sh: launches.body(n, kv, d, sh)))
        for n in token_ladder for sh in shapes.of_bucket(n, kv.kv_dtype, d)]
    keys += [(("head", r, True), (lambda r=r: launches.head(r, True, d))) for r in row_ladder]
    bytes_before = be.graph_memory() or 0
    t0 = time.perf_counter()
    bodies = sum(k[0] == "body" for k, _ in keys)
    for key, emit in keys[:1] + keys[bodies:][:1]:  # load every kernel once, outside capture
        be.run(plans.plan(key, emit))
    with progress_bar("capturing graphs", len(keys)) as advance:
        for key, emit in keys:
            advance(f"{key[0]} {key[1]}")
            plans.capture(key, emit)
    be.synchronize()
    secs = time.perf_counter() - t0
    nbytes = (be.graph_memory() or 0) - bytes_before
    note(f"captured {len(keys)} graphs in {secs:.1f} s")
    return {"graphs": len(keys), "seconds": round(secs, 3), "bytes": nbytes}
