"""The attention's launch shape of a step: part of its body plan's key.

On a GPU the attention variant's rule (its `shape`: ops/attention.py's walks_pays) walks a window's
KV in one pass or splits it over blocks by the step's size and its longest context, so a body plan
is keyed by (Nb, the shape of each window) and a bucket may need a graph for each shape tuple it
takes. A variant with one shape gives () everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sharpinf.step.batch import Batch
from sharpinf.step.buffers import StepDescriptor
from sharpinf.step.kernels import StepKernels

KV_SHAPE_KEYS = 32  # a step's longest context, rounded up to this, picks the attention's launch shape (its
                    # smallest partition: the rule counts partitions, so the rounding changes no choice)

Shapes = tuple[str, ...]


def _round_keys(keys: int) -> int:
    return -(-max(1, keys) // KV_SHAPE_KEYS) * KV_SHAPE_KEYS


@dataclass
class AttentionShapes:
    """The launch shapes of one StepKernels' attention, asked once per (bucket, KV dtype, sequences,
    KV_SHAPE_KEYS keys) and remembered until clear() ($SHARPINF_ATTENTION_MODE may have changed)."""

    kernels: StepKernels
    context_length: int
    memo: dict[tuple[int, str, int], dict[int, Shapes]] = field(default_factory=dict)

    def clear(self) -> None:
        self.memo = {}

    def for_step(self, batch: Batch, N: int, kv_dtype: str, d: StepDescriptor) -> Shapes:
        """The shapes for `batch` run as a step of N tokens (its bucket): by its longest context."""
        return self.at(N, kv_dtype, d, int(batch.context_lens.max(initial=1)))

    def at(self, N: int, kv_dtype: str, d: StepDescriptor, keys: int) -> Shapes:
        """The shapes for a step of N tokens (its bucket) whose longest context is `keys` keys."""
        keys = _round_keys(keys)
        memo = self.memo.setdefault((N, kv_dtype, d.cap.seqs), {})
        if keys not in memo:
            memo[keys] = self.kernels.attention_shapes(kv_dtype, N, d.cap.seqs + 1, keys)
        return memo[keys]

    def of_bucket(self, N: int, kv_dtype: str, d: StepDescriptor) -> list[Shapes]:
        """Every shape tuple a step of bucket N takes at some context up to the longest the descriptor's
        block tables hold: the bodies capture_graphs captures. Each window's shape flips at most once
        as the context grows (walk, then split: walks_pays), so where two contexts give the same tuple
        every context between them does, and bisection finds each flip."""
        longest = _round_keys(min(self.context_length, d.width * d.block_size))
        at = lambda keys: self.at(N, kv_dtype, d, keys)  # noqa: E731
        found = {at(KV_SHAPE_KEYS), at(longest)}

        def between(lo: int, hi: int) -> None:  # contexts lo < hi (multiples of KV_SHAPE_KEYS), tuples differ
            if hi - lo <= KV_SHAPE_KEYS:
                return
            mid = (lo + hi) // 2 // KV_SHAPE_KEYS * KV_SHAPE_KEYS
            found.add(at(mid))
            for a, b in ((lo, mid), (mid, hi)):
                if at(a) != at(b):
                    between(a, b)
        if at(KV_SHAPE_KEYS) != at(longest):
            between(KV_SHAPE_KEYS, longest)
        return sorted(found)
