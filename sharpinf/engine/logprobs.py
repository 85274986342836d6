"""Logprobs of a sampled token, from its logits row copied back to the host: the model's
distribution, log-softmaxed in float64, before penalty, temperature and filters."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class TokenLogprobs:
    """A sampled token's log-probability under the model, and the k most likely ids with theirs."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (id, logprob), most likely first, ties by lowest id

    @classmethod
    def of(cls, logits: np.ndarray, token_id: int, k: int) -> "TokenLogprobs":
        x = logits.astype(np.float64)
        m = x.max()
        lp = x - (m + np.log(np.exp(x - m).sum()))
        top = []
        if k:  # the k largest (argpartition: no full sort of a 150k vocabulary), then ordered, ties by id
            cand = np.argpartition(-lp, min(k, len(lp) - 1))[: k + 1] if k < len(lp) else np.arange(len(lp))
            kth = np.sort(lp[cand])[::-1][min(k, len(cand)) - 1]
            cand = np.flatnonzero(lp >= kth)  # every id tied with the k-th too, so ties go by the lowest id
            top = cand[np.lexsort((cand, -lp[cand]))][:k]
        return cls(int(token_id), float(lp[token_id]), [(int(i), float(lp[i])) for i in top])
