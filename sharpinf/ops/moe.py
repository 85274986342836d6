"""The mixture-of-experts FFN (qwen3moe): the NumPy twins of its kernels.

    logits = h W_inp^T                     [T, n_expert], float32, one dot per (token, expert)
    p      = softmax(logits)               over all experts (llama.cpp's build_moe_ffn: softmax, then top-k)
    ids    = the k largest p, best first   ties: the lower expert id wins (and ranks first)
    w      = p[ids] / max(sum p[ids], 2^-14)   the sum in rank order; llama.cpp clamps it at the
                                               smallest normal f16 (qwen3moe always renormalises)
    y_r    = (act(h Wg[ids_r]^T) * (h Wu[ids_r]^T)) Wd[ids_r]^T    each chosen expert's SwiGLU FFN
    x     += ((w_0 y_0 + w_1 y_1) + w_2 y_2) + ...                  in rank order, never arrival order

The rank-order sum is what makes the result one number per token whatever the batch: which
expert a token's slot r holds depends only on that token's router logits.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
WEIGHT_SUM_FLOOR = F32(6.103515625e-5)  # llama.cpp: ggml_clamp(weights_sum, 6.103515625e-5, INFINITY)


def router_logits_reference(h: np.ndarray, w_inp: np.ndarray) -> np.ndarray:
    """[T, n_expert] float32: each logit its own dot (not BLAS), so two equal router rows give
    bit-equal logits and a tie stays a tie, as in the kernel."""
    h, w_inp = np.asarray(h, F32), np.asarray(w_inp, F32)
    return np.stack([(h * w_inp[e]).sum(axis=-1, dtype=F32) for e in range(w_inp.shape[0])], axis=-1)


def route_reference(logits: np.ndarray, k: int, renormalise: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32 [T, k] best first, weights float32 [T, k]) from router logits [T, n_expert]."""
    logits = np.asarray(logits, F32)
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p = (p / p.sum(axis=-1, keepdims=True, dtype=F32)).astype(F32)
    # a stable sort of -p keeps equal probabilities in id order: the lower id wins a tie
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :k].astype(np.int32)
    w = np.take_along_axis(p, ids, axis=-1)
    if renormalise:
        total = w[:, 0].copy()
        for r in range(1, k):  # rank order, as the kernel adds them
            total = total + w[:, r]
        w = (w / np.maximum(total, WEIGHT_SUM_FLOOR)[:, None]).astype(F32)
    return ids, w


def combine_reference(y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """sum_r weights[:, r] * y[:, r] in rank order: y [T, k, d], weights [T, k] -> [T, d] float32."""
    out = (y[:, 0] * weights[:, :1]).astype(F32)
    for r in range(1, y.shape[1]):
        out = (out + y[:, r] * weights[:, r : r + 1]).astype(F32)
    return out
