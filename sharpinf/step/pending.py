"""A submitted step and what it brings back: the handle ForwardPass.submit returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from sharpinf.runtime.backend import Backend


@dataclass
class StepOutput:
    logits: Any  # device float32 [R, vocab], R = len(batch.logits_rows): a workspace view, valid until the next step
    sampled: np.ndarray | None  # host int32 [R]: the chosen ids, when the step sampled


@dataclass(eq=False)
class PendingStep:
    """A submitted step: its work is queued on the device; result() waits for its end marker only
    (recorded after the copy of its sampled ids), never for steps submitted after it."""

    backend: Backend
    logits: Any  # device float32 [R, vocab]: a workspace view, valid until the next step's head runs
    host_ids: np.ndarray | None  # pinned int32 [R] the sampled ids arrive in; None: the step samples nothing
    done: Any  # the backend's marker after the step's last queued work
    logits_host: np.ndarray | None = None  # float32 [len(copy_rows), vocab], valid once result() returned
    sampled: np.ndarray | None = None  # the ids, once result() has taken them

    taken: bool = False  # result() has waited (its buffers may be used again)
    # submitted with masks_later: (rows padded, staging buffer) until ForwardPass.sample() queues its sampling
    deferred: tuple[int, int] | None = None

    def copy_logits(self, logits: Any, rows: Sequence[int], vocab: int) -> None:
        """Queue the copy of `rows` of the step's logits (device [*, vocab]) into logits_host (pinned)."""
        be = self.backend
        self.logits_host = be.host_buffer(len(rows) * vocab * 4).view(np.float32).reshape(-1, vocab)
        for i, r in enumerate(rows):
            be.copy_to_host(logits[r], self.logits_host[i])

    def finish(self, sampled: Any) -> None:
        """Queue the copy of the sampled ids (device int32 [>= R]) back, where the step samples, then
        the end marker result() waits for."""
        if self.host_ids is not None:
            self.backend.copy_to_host(sampled[: len(self.host_ids)], self.host_ids)
        self.backend.record(self.done)

    def result(self) -> StepOutput:
        """Wait for this step's ids (and copied logits rows); the StepOutput forward() returns. A step
        that brings nothing back (no sampling, no copied rows) waits for nothing, as forward() never did."""
        if self.deferred is not None:
            raise RuntimeError("a step submitted with masks_later has no ids until ForwardPass.sample() queues "
                               "its sampling")
        if not self.taken:
            self.taken = True
            if self.host_ids is not None or self.logits_host is not None:
                self.backend.wait(self.done)
            if self.host_ids is not None:
                self.sampled = self.host_ids.copy()
        return StepOutput(self.logits, self.sampled)
