"""The sampling rule in NumPy: the twin of kernels_cu/sampling.cu that every sample variant is checked against.

`sample_reference` applies the kernel's exact rule (ops/sampling.py's header) to one row: masses in
the same 40-bit fixed point, exact integer sums, the same counter-based uniform (ops/sampling.py's
uniform_u24). The kernel's choice is checked against it token for token (up to expf's rounding when
a cut lands within an ulp: `sample_reference_detail`'s margin), and the reference backend samples
with it, so a seed gives the same tokens on reference, emu and cuda.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from sharpinf.ops.sampling import COUNT_MAX, uniform_u24
from sharpinf.params import SamplingParams

F32 = np.float32


def apply_repetition_penalty(logits: np.ndarray, seen: list[int], penalty: float) -> np.ndarray:
    """llama.cpp/CTRL rule: divide positive logits of seen tokens by the penalty, multiply negative ones."""
    if penalty == 1.0 or not seen:
        return logits
    out = logits.copy()
    ids = np.unique(np.asarray(seen, dtype=np.int64))
    vals = out[ids]
    out[ids] = np.where(vals > 0, vals / np.float32(penalty), vals * np.float32(penalty))
    return out


def apply_mask(z: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """(z with -inf where mask disallows, the bool allowed [V]) -- or (z, None) without a mask."""
    if mask is None:
        return z, None
    V = z.size
    bits = np.unpackbits(np.asarray(mask).view(np.uint32).reshape(-1).view(np.uint8), bitorder="little")[:V]
    allowed = bits.astype(bool)  # little-endian words: byte 0 holds ids 0..7, bit i = id i
    return np.where(allowed, z, F32(-np.inf)).astype(F32), allowed


def apply_logit_bias(z: np.ndarray, bias) -> np.ndarray:
    """z[id] += bias (float32) for each (id, bias) in range."""
    if not bias:
        return z
    z = z.copy()
    for i, b in bias:
        if 0 <= i < z.size:
            z[i] = F32(z[i] + F32(b))
    return z


def generated_counts(generated: Sequence[int], V: int) -> np.ndarray:
    """int64 [V]: each id's count over the generated ids, saturating at COUNT_MAX as on the device."""
    g = np.asarray([int(i) for i in generated if 0 <= int(i) < V], np.int64)
    return np.minimum(np.bincount(g, minlength=V), COUNT_MAX)


def apply_presence_frequency(z: np.ndarray, counts: np.ndarray, presence: float, frequency: float) -> np.ndarray:
    """OpenAI's rule, rounded as the kernel: where c > 0, z = (z - c * frequency) - presence in float32."""
    if presence == 0.0 and frequency == 0.0:
        return z
    c = counts.astype(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        pen = (z - c * F32(frequency)) - F32(presence)
    return np.where(counts > 0, pen, z).astype(F32)


def sort_key(z: np.ndarray) -> np.ndarray:
    """The kernel's order-preserving uint32 key of float32 values (-0 counts as +0)."""
    b = np.asarray(z, F32).view(np.uint32).copy()
    b[b == 0x80000000] = 0
    neg = (b & np.uint32(0x80000000)) != 0
    return np.where(neg, ~b, b | np.uint32(0x80000000)).astype(np.uint32)


Q_SCALE = 2**40  # weights in 40-bit fixed point: masses are exact integer sums (the kernel's rule 3)


def weights(z: np.ndarray, zmax, temperature: float) -> np.ndarray:
    """float32 w = exp((z - zmax) / T): the kernel's expression, (z - zmax) / T rounded in float32,
    then exp correctly rounded to float32 (CUDA's expf is within 2 ulp of it)."""
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        d = (np.asarray(z, F32) - F32(zmax)) / F32(temperature)
        return np.exp(d.astype(np.float64)).astype(F32)


def fixed_point(w: np.ndarray) -> np.ndarray:
    """uint64 floor(w * 2^40) of float32 weights in [0, 1] (exact: a float32 has 24 bits)."""
    return np.floor(np.asarray(w, np.float64) * Q_SCALE).astype(np.uint64)


def top_p_target(top_p, total: int) -> int:
    """top-p's threshold on the mass ranked before a token: max(1, trunc(top_p * Q)) in double."""
    return max(1, int(float(total) * float(F32(top_p))))


def pick_target(u24: int, kept: int) -> int:
    """floor(u24 * K / 2^24), as the kernel computes it without a 128-bit product."""
    return (kept >> 24) * u24 + (((kept & 0xFFFFFF) * u24) >> 24)


def sample_reference_detail(logits: np.ndarray, params: SamplingParams, seed: int, step: int,
                            seen: Sequence[int] = (), generated: Sequence[int] = (),
                            mask: np.ndarray | None = None) -> tuple[int, float]:
    """(token, margin): margin is the smallest relative distance of any float decision the
    kernel takes (top-p cut, min-p cut, the final u * total crossing) to its threshold; where
    it is below ~1e-5 the kernel's float32 rounding may legitimately choose differently."""
    z = np.asarray(logits, F32).reshape(-1)
    V = z.size
    if V == 0:
        return -1, np.inf
    z, allowed = apply_mask(z, mask)
    if allowed is not None and not allowed.any():
        return -1, np.inf
    z = apply_logit_bias(z, params.logit_bias)
    ids = [int(i) for i in seen if 0 <= int(i) < V]
    z = apply_repetition_penalty(z, ids, params.repetition_penalty).astype(F32)
    z = apply_presence_frequency(z, generated_counts(generated, V), params.presence_penalty, params.frequency_penalty)
    if allowed is None:
        greedy = int(np.argmax(z))  # ties (and NaN) to the lowest id
    else:  # a disallowed id is never chosen, even when every allowed one is -inf
        ok = np.flatnonzero(allowed)
        greedy = int(ok[np.argmax(z[ok])])
    if params.temperature == 0.0:
        return greedy, np.inf
    zmax = z[greedy]  # the row maximum (NaN if any), as the kernel takes it
    if not np.isfinite(zmax):
        return greedy, np.inf
    w = weights(z, zmax, params.temperature)
    q = fixed_point(w)
    Q = int(q.sum(dtype=np.uint64))
    margin = np.inf
    order = np.argsort(~sort_key(z), kind="stable")  # z descending, ties by lowest id
    qs = q[order]  # uint64 sums are exact: vocab * 2^40 < 2^64
    # Margins only count decisions that matter: a cut inside positions another filter removes
    # anyway cannot change the choice. A weight the device's expf rounds the other way moves a
    # mass by ~2^-23 of that weight: a decision closer than that to its threshold may differ.
    keep = np.ones(V, bool)
    if 0 < params.top_k < V:
        keep[params.top_k:] = False
    top_p = F32(params.top_p)
    if top_p < 1:
        P = top_p_target(top_p, Q)
        before = np.concatenate([np.zeros(1, np.uint64), np.cumsum(qs, dtype=np.uint64)[:-1]])
        relevant = keep.copy()
        relevant[0] = False  # the first-ranked token always stays: no decision to round
        if relevant.any():
            margin = min(margin, float(np.abs(before[relevant].astype(np.float64) - float(P)).min()) / Q)
        keep &= before < np.uint64(P)
    min_p = F32(params.min_p)
    if min_p > 0:
        ws = w[order]
        relevant = keep & (z[order] != zmax)  # weight exactly 1 on both sides: no rounding
        if relevant.any():
            margin = min(margin, float(np.abs(ws[relevant].astype(np.float64) - np.float64(min_p)).min()) / min_p)
        keep &= ws >= min_p
    kept = np.zeros(V, bool)
    kept[order[keep]] = True
    c = np.cumsum(np.where(kept, q, np.uint64(0)), dtype=np.uint64)
    K = int(c[-1])
    if K == 0:  # nothing kept (min_p > 1)
        return greedy, np.inf
    target = pick_target(uniform_u24(seed, step), K)
    i = int(np.searchsorted(c, np.uint64(target), side="right"))  # the first c > target (< V: target < K)
    lo = int(c[i - 1]) if i > 0 else 0
    margin = min(margin, (target - lo) / K, (int(c[i]) - target) / K)
    return i, float(margin)


def sample_reference(logits: np.ndarray, params: SamplingParams, seed: int, step: int,
                     seen: Sequence[int] = (), generated: Sequence[int] = (), mask: np.ndarray | None = None) -> int:
    """The token the kernel picks for one row, by the same rule and the same uniform: step is the
    number of tokens the request has generated, seen its prompt + generated ids (as the engine's),
    generated the ids presence/frequency count, mask the allowed-token bits (-1: none allowed)."""
    return sample_reference_detail(logits, params, seed, step, seen, generated, mask)[0]
