"""The per-slot sampling state on the device: what a penalised or biased request keeps across steps.

A request that needs one (ops/sampling.py's needs_slot) holds a slot while it runs; per slot
(capacity.rows of them):

    seen_bits   u32 [rows, ceil(V/32)]   the ids its repetition penalty applies to, a bit each
    counts      u32 [rows, ceil(V/2)]    its generated ids' counts, two u16 a word (V * 2 bytes:
                                         98 KiB for V = 49152)
    bias        i32 [rows, BIAS_STRIDE]  its logit_bias row (ops/sampling.py's bias_row: 2.4 KiB)

The sampling kernel reads them and adds each sampled id itself, so the host sends only the ids a
slot has not seen yet (SamplingRows.add_ids). The state outlives the step buffers: when the
capacity grows it moves into the larger arrays, its slots still held.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sharpinf.ops.sampling import BIAS_STRIDE, count_words, history_words, seen_update
from sharpinf.runtime.backend import Backend
from sharpinf.step.buffers import SamplingRows


@dataclass
class SlotState:
    backend: Backend
    vocab: int
    seen_bits: Any  # device u32 [rows, history_words(vocab)]
    counts: Any  # device u32 [rows, count_words(vocab)]
    bias: Any  # device i32 [rows, BIAS_STRIDE]

    @classmethod
    def alloc(cls, be: Backend, vocab: int, rows: int, before: "SlotState | None" = None) -> "SlotState":
        """Zeroed state for `rows` slots; with `before` (the state of a smaller capacity) its slots moved over."""
        new = cls(be, vocab, be.zeros((rows, history_words(vocab)), np.uint32),
                  be.zeros((rows, count_words(vocab)), np.uint32), be.zeros((rows, BIAS_STRIDE), np.int32))
        if before is not None:
            for now, prev in zip(new.arrays, before.arrays):
                now[: prev.shape[0]] = prev
        return new

    @property
    def arrays(self) -> tuple[Any, Any, Any]:
        return self.seen_bits, self.counts, self.bias

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays)

    def set_bias(self, slot: int, row: np.ndarray) -> None:
        """Slot `slot`'s logit_bias row, sent when a request takes the slot (before its step's launch
        on the same stream)."""
        self.backend.copy_to_device(np.ascontiguousarray(row, np.int32), self.bias[slot])

    def flush_history(self, s: SamplingRows, R: int) -> SamplingRows:
        """More new history ids than the step's buffer holds (a long prompt's first sample): set them
        now with their own upload and launch; returns the rows the step runs with, adding none."""
        be = self.backend
        count_n = np.zeros(R, np.int32) if s.count_n is None else s.count_n
        seen_update(be, R, self.vocab, self.seen_bits, be.upload(s.slots), be.upload(s.clear),
                    be.upload(s.add_off), be.upload(np.concatenate([s.add_ids, np.full(1, -1, np.int32)])),
                    self.counts, be.upload(count_n))
        return SamplingRows(s.params, s.top_k, s.seeds, s.steps, s.slots, np.zeros(R, np.int32),
                            np.zeros(R + 1, np.int32), np.zeros(0, np.int32), None, s.mask_idx, s.masks)
