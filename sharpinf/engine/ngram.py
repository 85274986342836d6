"""The n-gram proposer (prompt lookup): a sequence's own tokens guess what follows them.

The last n tokens (n from prompt_lookup_max down to prompt_lookup_min) are looked up in the
sequence's earlier tokens, prompt and output alike; at the most recent earlier match that k tokens
follow (else the first match), the up to k tokens that followed it are the guesses. Editing a code block, quoting a document, repeating a
list: the output copies its context, and the guesses are kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from sharpinf.engine.sequence import Sequence


def lookup(tokens: np.ndarray, k: int, n_max: int, n_min: int) -> list[int]:
    """Up to k guesses for what follows `tokens` (int array), [] when no suffix recurs."""
    L = len(tokens)
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        # windows starting at 0 .. L-n-1: each has at least one token after it
        hits = np.flatnonzero((sliding_window_view(tokens[: L - 1], n) == tokens[L - n :]).all(axis=1))
        if len(hits):
            # the most recent match with k tokens after it (else the first: the most after it)
            full = hits[hits + n + k <= L]
            start = int(full[-1] if len(full) else hits[0]) + n
            return tokens[start : start + k].tolist()
    return []


@dataclass
class NgramProposer:
    n_max: int = 4
    n_min: int = 1

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        return [lookup(np.asarray(s.tokens, np.int64), k, self.n_max, self.n_min) if k > 0 else []
                for s, k in zip(seqs, ks)]

    def release(self, seq: Sequence) -> None:
        """Nothing is held per sequence."""
