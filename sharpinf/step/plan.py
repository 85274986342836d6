"""Step shapes as buckets, and the plans and graphs that run them.

A step of N tokens (R rows wanting logits) runs as the plan of the bucket that holds it:
Nb >= N tokens, Rb >= R rows. A plan is the list of prepared launches (sharpinf.runtime.
backend.Launch) over the fixed step buffers: eager mode runs it, a CUDA graph captures it
once and replays it, the trace backend counts it. Two plans make a step: the body (embed
-> layers, keyed by Nb and the attention's launch shapes, which the step's longest context
chooses on a GPU: ops/attention.py's walks_pays) and the head (gather -> norm -> LM head ->
sampling, keyed by Rb), so a ladder of token buckets and a ladder of row buckets need their
sum of graphs (a bucket's body twice where its attention may take either shape), not their
product.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Callable

from sharpinf.runtime.backend import Backend, Graph, Launch


def bucket_ladder(limit: int) -> list[int]:
    """1, 2, 4, 8, then steps of about an eighth (8 up to 128, 16 up to 256, ...), ending at
    limit: a step is padded by at most ~12% (and by at most 7 tokens up to 128)."""
    out, n = [], 1
    while n < limit:
        out.append(n)
        n = n * 2 if n < 8 else n + max(8, 1 << (n.bit_length() - 4))
    out.append(limit)
    return out


def bucket_for(n: int, ladder: list[int]) -> int:
    """The smallest bucket >= n (n beyond the ladder: n itself)."""
    i = bisect.bisect_left(ladder, n)
    return ladder[i] if i < len(ladder) else n


PlanKey = tuple  # ("body", Nb, attention shapes) or ("head", Rb, samples)


@dataclass
class PlanCache:
    """Plans (and their graphs) for one set of step buffers and one KV pool."""

    backend: Backend
    plans: dict[PlanKey, list[Launch]] = field(default_factory=dict)
    graphs: dict[PlanKey, Graph] = field(default_factory=dict)
    replays: int = 0  # plans run from a graph

    def plan(self, key: PlanKey, emit: Callable[[], Any]) -> list[Launch]:
        """The plan for key, recorded on first use by running emit() under backend.recording()."""
        p = self.plans.get(key)
        if p is None:
            with self.backend.recording() as p:
                emit()
            self.plans[key] = p
        return p

    def run(self, key: PlanKey, emit: Callable[[], Any], use_graph: bool) -> None:
        g = self.graphs.get(key) if use_graph else None
        if g is not None:
            g.replay()
            self.replays += 1
        else:
            self.backend.run(self.plan(key, emit))

    def capture(self, key: PlanKey, emit: Callable[[], Any]) -> None:
        p = self.plan(key, emit)
        with self.backend.capture() as g:
            self.backend.run(p)
        self.graphs[key] = g

    def clear(self) -> None:
        self.plans.clear()
        self.graphs.clear()
